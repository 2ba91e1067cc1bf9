// Float8BlockScaling quantization (NUMERICS.md): 1x128 blocks (block_dim 1) with an optional
// column-wise copy whose blocks are 128x1 source columns, or 128x128 tiles (block_dim 2) whose
// column-wise copy is the transposed tile with the same scale. Each block's scale is
// compute_scale_from_amax over its valid elements; scale_inv = 1 / scale (IEEE division).
//
// Scale layouts (te/tensor.h; kernels.h BlockQuantizeArgs); padding is never written:
//   1-D row-wise    scale_inv[(c / 128) * rowwise_scale_ld + r]
//   1-D column-wise scale_inv[(r / 128) * columnwise_scale_ld + c]
//   2-D row-wise    scale_inv[ti * rowwise_scale_ld + tj], column-wise [tj * columnwise_scale_ld + ti]
//
// One pass over the input for every combination: a CTA owns one 128x128 tile (cast_tile.cuh), so
// in 1-D mode the tile holds 128 complete row blocks and 128 complete column blocks, and both
// copies and both sets of scales come from one read. Per tile in 1-D: row amaxes by a 3-step
// shuffle, column amaxes by 2 shuffles plus an 8-warp reduction in shared memory.
#include "common/kernels.h"
#include "cuda/cast_tile.cuh"
#include "cuda/cuda_utils.cuh"

namespace te {
namespace cuda {

void quantize_block(const BlockQuantizeArgs& a, void* stream) {
  if (a.rows == 0 || a.cols == 0) return;
  if (a.rowwise == nullptr && a.columnwise == nullptr) return;
  tile::launch_input(a.block_dim == 2 ? tile::kBlock2D : tile::kBlock1D, tile::block_params(a),
                     a.input, a.in_dtype, a.out_dtype, as_stream(stream));
}

}  // namespace cuda
}  // namespace te
