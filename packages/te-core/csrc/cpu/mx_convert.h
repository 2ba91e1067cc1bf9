// E2M1 and the MXFP8/NVFP4 element decode for the CPU reference backend. The E2M1 rounding is the
// same exact-arithmetic rounding as fp_convert.h's FP8 (round_magnitude with 1 mantissa bit and
// bias 1), an implementation independent of the CUDA backend's threshold compares; the tests hold
// the two to each other and to the numpy oracle.
#pragma once

#include <cstdint>

#include "common/mx_scaling.h"
#include "cpu/fp_convert.h"
#include "te/tensor.h"

namespace te {
namespace cpu {

// fp32 -> E2M1 code: round to nearest even, saturating to +-6, the sign kept (-0 -> 0x8), NaN ->
// 0x7 (NUMERICS.md: E2M1 has no NaN; the NaN shows in the block scale and the amax instead).
inline uint32_t float_to_e2m1(float x) {
  const uint32_t bits = float_bits(x);
  const float a = bits_float(bits & 0x7fffffffu);
  if (a != a) return 0x7u;
  const uint32_t sign = (bits >> 28) & 0x8u;
  if (a >= kE2M1Max) return sign | 0x7u;
  return sign | round_magnitude(a, 1, 1);
}

// Stochastic rounding with the random word u (common/mx_scaling.h), the same sign and NaN rules.
inline uint32_t float_to_e2m1_stochastic(float x, uint32_t u) {
  const uint32_t bits = float_bits(x);
  const float a = bits_float(bits & 0x7fffffffu);
  if (a != a) return 0x7u;
  return ((bits >> 28) & 0x8u) | e2m1_stochastic_code(a, u);
}

inline float e2m1_to_float(uint32_t code) {
  const float m = decode_magnitude(code & 0x7u, 1, 1);
  return (code & 0x8u) ? -m : m;
}

// Nibble i of a packed E2M1 buffer (the low nibble for even i).
inline uint32_t e2m1_at(const uint8_t* data, int64_t i) {
  return (data[i >> 1] >> (4 * (i & 1))) & 0xfu;
}

// Writes nibble i; an even i must be written before i + 1 (it sets the whole byte).
inline void set_e2m1(uint8_t* data, int64_t i, uint32_t code) {
  if ((i & 1) == 0) {
    data[i >> 1] = static_cast<uint8_t>(code);
  } else {
    data[i >> 1] = static_cast<uint8_t>(data[i >> 1] | (code << 4));
  }
}

// Stored element (r, c) of an MXFP8 or NVFP4 copy [R, C] in fp32: MXFP8 float(q) * 2^(e-127),
// NVFP4 (q * s_block) * s_global.
struct MxCopy {
  int32_t mode;              // TE_SCALING_MXFP8_1D or TE_SCALING_NVFP4_1D
  const uint8_t* data;
  int32_t dtype;             // FP8 or E2M1
  const uint8_t* scale_inv;
  int64_t scale_ld;
  int64_t cols;              // C
  float s_global;            // NVFP4

  float at(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    if (mode == TE_SCALING_MXFP8_1D) {
      return fp8_to_float(data[i], dtype) * e8m0_value(scale_inv[r * scale_ld + c / 32]);
    }
    const float s_block = fp8_to_float(scale_inv[r * scale_ld + c / 16], TE_DTYPE_FLOAT8_E4M3);
    return (e2m1_to_float(e2m1_at(data, i)) * s_block) * s_global;
  }
};

}  // namespace cpu
}  // namespace te
