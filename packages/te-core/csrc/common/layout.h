// Shapes of the parts of a quantized tensor (the table in te/tensor.h), the one place they are
// computed: te_quantized_shape() exposes them, te_quantize/te_dequantize validate against them.
#pragma once

#include <cstdint>
#include <vector>

namespace te {

constexpr int64_t kBlockSize = 128;  // Float8BlockScaling's 1x128 and 128x128
constexpr int64_t kScaleAlign = 4;   // fp32 scale rows padded to 16 bytes for cuBLASLt

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// `shape` is the high-precision source's shape. Throws for unknown or unimplemented modes/parts.
std::vector<int64_t> quantized_shape(int32_t scaling_mode, int32_t part, const int64_t* shape,
                                     int32_t ndim);

}  // namespace te
