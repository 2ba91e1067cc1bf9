// out[r][c] = round_to_out_dtype(float(q) * scale_inv), one fp32 multiply, for per-tensor, 1-D and
// 2-D block scaling, from the row-wise copy [rows, cols] or the transposed column-wise copy
// [cols, rows]; the output is always the source's [rows, cols]. Block scale_inv positions follow
// te/tensor.h's table (the same as quantize_block.cpp's). Walks square tiles so reading the
// transposed copy stays cache-friendly.
#include <cstdint>

#include "common/kernels.h"
#include "cpu/fp_convert.h"
#include "te/tensor.h"

namespace te {
namespace cpu {
namespace {

constexpr int64_t kTile = 32;
constexpr int64_t kBlock = 128;

// scale_inv of source element (r, c), in the layout of the copy being read.
float scale_inv_at(const DequantizeArgs& args, int64_t r, int64_t c) {
  switch (args.scaling_mode) {
    case TE_SCALING_BLOCK_1D:
      return args.transposed ? args.scale_inv[(r / kBlock) * args.scale_ld + c]
                             : args.scale_inv[(c / kBlock) * args.scale_ld + r];
    case TE_SCALING_BLOCK_2D:
      return args.transposed ? args.scale_inv[(c / kBlock) * args.scale_ld + r / kBlock]
                             : args.scale_inv[(r / kBlock) * args.scale_ld + c / kBlock];
    default:  // TE_SCALING_PER_TENSOR
      return args.scale_inv[0];
  }
}

}  // namespace

void dequantize(const DequantizeArgs& args, void* /*stream*/) {
  const int64_t rows = args.rows, cols = args.cols;
  const auto* data = static_cast<const uint8_t*>(args.data);
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = r0 + kTile < rows ? r0 + kTile : rows;
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = c0 + kTile < cols ? c0 + kTile : cols;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const uint8_t q = args.transposed ? data[c * rows + r] : data[r * cols + c];
          store_from_float(args.output, args.out_dtype, r * cols + c,
                           fp8_to_float(q, args.data_dtype) * scale_inv_at(args, r, c));
        }
      }
    }
  }
}

}  // namespace cpu
}  // namespace te
