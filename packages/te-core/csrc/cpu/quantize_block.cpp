// Float8BlockScaling quantization (NUMERICS.md): 1x128 blocks (block_dim 1) or 128x128 tiles
// (block_dim 2), each with its own fp32 scale from the amax of its valid elements (edge blocks are
// partial): scale = compute_scale_from_amax(block_amax, fp8_max, pow2, eps),
// q = convert(x * scale), scale_inv = 1 / scale. Scale layouts are te/tensor.h's table; padding
// is never written.
//
//   1-D row-wise:    block (r, c / 128), scale_inv[(c / 128) * rowwise_scale_ld + r]
//   1-D column-wise: block (r / 128, c), one per 128 rows of a source column, i.e. along a row of
//                    the transposed copy; scale_inv[(r / 128) * columnwise_scale_ld + c]
//   2-D:             tile (r / 128, c / 128) = (ti, tj); row-wise scale_inv[ti * ld + tj], and the
//                    column-wise copy is the transpose of the same q with the same scale, stored
//                    at [tj * ld + ti]
//
// Each block is quantized as a rectangle of the source. A 128x1 column block reads a column with a
// stride, but consecutive columns reuse the same 128 cache lines, so walking blocks in column
// order within a band of 128 rows stays in L1.
#include <cmath>
#include <cstdint>

#include "common/kernels.h"
#include "common/scaling.h"
#include "cpu/fp_convert.h"

namespace te {
namespace cpu {
namespace {

constexpr int64_t kBlock = 128;

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Quantizes source rows [r0, r1) x columns [c0, c1) with one scale into the given copies
// (nullptr: skip) and returns its scale_inv.
float quantize_rect(const BlockQuantizeArgs& args, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                    uint8_t* rowwise, uint8_t* columnwise) {
  float block_amax = 0.0f;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c)
      block_amax = nan_max(block_amax,
                           std::fabs(load_as_float(args.input, args.in_dtype, r * args.cols + c)));
  const float scale = compute_scale_from_amax(block_amax, fp8_max(args.out_dtype),
                                              args.force_pow2_scales, args.amax_epsilon);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      const uint8_t q = float_to_fp8(
          load_as_float(args.input, args.in_dtype, r * args.cols + c) * scale, args.out_dtype);
      if (rowwise) rowwise[r * args.cols + c] = q;
      if (columnwise) columnwise[c * args.rows + r] = q;
    }
  }
  return 1.0f / scale;
}

}  // namespace

void quantize_block(const BlockQuantizeArgs& args, void* /*stream*/) {
  const int64_t rows = args.rows, cols = args.cols;
  auto* rowwise = static_cast<uint8_t*>(args.rowwise);
  auto* columnwise = static_cast<uint8_t*>(args.columnwise);

  if (args.block_dim == 2) {
    for (int64_t ti = 0; ti * kBlock < rows; ++ti) {
      for (int64_t tj = 0; tj * kBlock < cols; ++tj) {
        const float scale_inv =
            quantize_rect(args, ti * kBlock, min64((ti + 1) * kBlock, rows), tj * kBlock,
                          min64((tj + 1) * kBlock, cols), rowwise, columnwise);
        if (rowwise) args.rowwise_scale_inv[ti * args.rowwise_scale_ld + tj] = scale_inv;
        if (columnwise) args.columnwise_scale_inv[tj * args.columnwise_scale_ld + ti] = scale_inv;
      }
    }
    return;
  }

  // 1-D: the two copies have different blocks, so each is its own pass.
  if (rowwise) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j * kBlock < cols; ++j) {
        args.rowwise_scale_inv[j * args.rowwise_scale_ld + r] = quantize_rect(
            args, r, r + 1, j * kBlock, min64((j + 1) * kBlock, cols), rowwise, nullptr);
      }
    }
  }
  if (columnwise) {
    for (int64_t j = 0; j * kBlock < rows; ++j) {
      for (int64_t c = 0; c < cols; ++c) {
        args.columnwise_scale_inv[j * args.columnwise_scale_ld + c] = quantize_rect(
            args, j * kBlock, min64((j + 1) * kBlock, rows), c, c + 1, nullptr, columnwise);
      }
    }
  }
}

}  // namespace cpu
}  // namespace te
