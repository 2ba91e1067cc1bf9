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
      case kPerTensor: launch_loader<kPerTensor, true>(p, ld, out_dtype, stream); break;
      case kBlock1D: launch_loader<kBlock1D, true>(p, ld, out_dtype, stream); break;
      case kBlock2D: launch_loader<kBlock2D, true>(p, ld, out_dtype, stream); break;
      default: fail(TE_ERROR_INTERNAL, "tile::launch_input: unexpected mode ", mode);
    }
  });
}

namespace {

template <int kMode, typename T, int kFmt>
bool coop(Params& p, const InputLoader<T>& ld, unsigned grid, cudaStream_t stream) {
  const auto kernel = cast_tile_kernel<InputLoader<T>, kFmt, kMode, true>;
  static const int64_t capacity =
      static_cast<int64_t>(blocks_per_sm(kernel, kThreads, 0)) * sm_count();
  if (grid > capacity) return false;
  void* args[] = {&p, const_cast<InputLoader<T>*>(&ld)};
  check_cuda(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(grid),
                                         dim3(kThreads), args, 0, stream),
             "cast_tile_kernel: cudaLaunchCooperativeKernel");
  return true;
}

}  // namespace

bool launch_input_coop(int mode, Params p, const void* input, int32_t in_dtype, int32_t out_dtype,
                       cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return false;
  const unsigned grid = prepare_fp8(p);
  p.reverse = false;
  bool launched = false;
  dispatch_source(in_dtype, [&](auto tag) {
    using T = decltype(tag);
    InputLoader<T> ld{};
    ld.in = static_cast<const T*>(input);
    ld.cols = p.cols;
    ld.vec = aligned(input, 16) && (p.cols * static_cast<int64_t>(sizeof(T))) % 16 == 0;
    dispatch_fp8(out_dtype, [&](auto fmt) {
      constexpr int kFmt = decltype(fmt)::value;
      switch (mode) {
        case kPerTensor: launched = coop<kPerTensor, T, kFmt>(p, ld, grid, stream); break;
        case kBlock1D: launched = coop<kBlock1D, T, kFmt>(p, ld, grid, stream); break;
        case kBlock2D: launched = coop<kBlock2D, T, kFmt>(p, ld, grid, stream); break;
        default: fail(TE_ERROR_INTERNAL, "tile::launch_input_coop: unexpected mode ", mode);
      }
    });
  });
  return launched;
}

}  // namespace tile
}  // namespace cuda
}  // namespace te
