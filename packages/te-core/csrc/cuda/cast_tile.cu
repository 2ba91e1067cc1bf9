// The plain-input instantiations of the 128x128 tile kernel (cast_tile.cuh), compiled once and
// shared by te_quantize (quantize_per_tensor.cu, quantize_block.cu) and te_dbias_quantize.
#include "cuda/cast_tile.cuh"

namespace te {
namespace cuda {
namespace tile {

void launch_input(int mode, const Params& p, const void* input, int32_t in_dtype,
                  int32_t out_dtype, cudaStream_t stream) {
  dispatch_source(in_dtype, [&](auto tag) {
    using T = decltype(tag);
    InputLoader<T> ld{};
    ld.in = static_cast<const T*>(input);
    ld.cols = p.cols;
    ld.vec = aligned(input, 16) && (p.cols * static_cast<int64_t>(sizeof(T))) % 16 == 0;
    switch (mode) {
      case kPerTensor: launch_loader<kPerTensor>(p, ld, out_dtype, stream); break;
      case kBlock1D: launch_loader<kBlock1D>(p, ld, out_dtype, stream); break;
      case kBlock2D: launch_loader<kBlock2D>(p, ld, out_dtype, stream); break;
      default: fail(TE_ERROR_INTERNAL, "tile::launch_input: unexpected mode ", mode);
    }
  });
}

}  // namespace tile
}  // namespace cuda
}  // namespace te
