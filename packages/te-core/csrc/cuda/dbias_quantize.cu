// te_dbias_quantize on CUDA: the gradient quantized exactly as te_quantize quantizes it (the same
// tile kernels, compiled once in cast_tile.cu, reading the same input) while the same read gives
// the bias gradient's column partials; cuda/fused_output.cuh has the passes and the fixed-order
// sum. Every output mode goes through the tile kernel, since only it sees whole columns.
#include "common/kernels.h"
#include "cuda/cast_tile.cuh"
#include "cuda/cuda_utils.cuh"
#include "cuda/fused_output.cuh"

namespace te {
namespace cuda {

void dbias_quantize(const DbiasQuantizeArgs& a, void* stream) {
  dispatch_source(a.in_dtype, [&](auto tag) {
    using T = decltype(tag);
    tile::InputLoader<T> ld{};
    ld.in = static_cast<const T*>(a.input);
    ld.cols = a.cols;
    fused::write<true>(a.out, ld, a.rows, a.cols, fused::Dbias{a.dbias, a.dbias_dtype},
                 as_stream(stream));
  });
}

}  // namespace cuda
}  // namespace te
