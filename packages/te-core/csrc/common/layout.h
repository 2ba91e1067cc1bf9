// Shapes of the parts of a quantized tensor (the table in te/tensor.h), the one place they are
// computed: te_quantized_shape() exposes them, te_quantize/te_dequantize validate against them.
#pragma once

#include <cstdint>
#include <vector>

#include "te/tensor.h"

namespace te {

constexpr int64_t kBlockSize = 128;  // Float8BlockScaling's 1x128 and 128x128
constexpr int64_t kScaleAlign = 4;   // fp32 scale rows padded to 16 bytes for cuBLASLt
constexpr int64_t kMxfp8Block = 32;  // MXFP8: 1x32 / 32x1 blocks (32x32 tiles in 2-D)
constexpr int64_t kNvfp4Block = 16;  // NVFP4: 1x16 / 16x1 blocks (16x16 tiles in 2-D)
// MXFP8/NVFP4 scale tables are padded to whole 128 x 4 tiles (Blackwell's scale layout unit).
constexpr int64_t kMxScaleRowAlign = 128;
constexpr int64_t kMxScaleColAlign = 4;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

inline bool is_mx_mode(int32_t mode) {
  return mode == TE_SCALING_MXFP8_1D || mode == TE_SCALING_NVFP4_1D;
}
// Elements per block of an MXFP8/NVFP4 copy.
inline int64_t mx_block(int32_t mode) {
  return mode == TE_SCALING_NVFP4_1D ? kNvfp4Block : kMxfp8Block;
}
// The dtype of an MXFP8/NVFP4 scale table: E8M0 or E4M3.
inline int32_t mx_scale_dtype(int32_t mode) {
  return mode == TE_SCALING_NVFP4_1D ? TE_DTYPE_FLOAT8_E4M3 : TE_DTYPE_FLOAT8_E8M0;
}

// `shape` is the high-precision source's shape. Throws for unknown modes or parts.
std::vector<int64_t> quantized_shape(int32_t scaling_mode, int32_t part, const int64_t* shape,
                                     int32_t ndim);

}  // namespace te
