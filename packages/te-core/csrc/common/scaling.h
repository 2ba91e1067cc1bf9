// The scale rules of NUMERICS.md, shared by both backends so the formula exists once. Plain fp32
// arithmetic (IEEE division, no fused multiply-add), so host and device give the same bits.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "te/tensor.h"

#if defined(__CUDACC__)
#define TE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TE_HOST_DEVICE inline
#endif

namespace te {

TE_HOST_DEVICE float fp8_max(int32_t fp8_dtype) {
  return fp8_dtype == TE_DTYPE_FLOAT8_E5M2 ? 57344.0f : 448.0f;
}

TE_HOST_DEVICE uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

TE_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

TE_HOST_DEVICE bool is_finite_nonzero(float x) {
  const uint32_t abs_bits = float_bits(x) & 0x7fffffffu;
  return abs_bits != 0u && abs_bits < 0x7f800000u;
}

// Current and block scaling: amax = max(amax, epsilon) (NaN stays NaN); 0, inf or NaN -> 1;
// else fp8_max / amax, inf -> FLT_MAX; pow2 clears the mantissa (rounds down).
TE_HOST_DEVICE float compute_scale_from_amax(float amax, float fp8_max, bool force_pow2,
                                             float epsilon) {
  if (amax == amax && amax < epsilon) amax = epsilon;
  float scale = 1.0f;
  if (is_finite_nonzero(amax)) {
    scale = fp8_max / amax;
    if (float_bits(scale) == 0x7f800000u) scale = FLT_MAX;
  }
  if (force_pow2) scale = bits_float(float_bits(scale) & 0xff800000u);
  return scale;
}

// Delayed scaling: like the rule above but the old scale survives an unusable amax.
TE_HOST_DEVICE float delayed_scale_from_amax(float amax, float scaled_max, float old_scale) {
  if (!is_finite_nonzero(amax)) return old_scale;
  const float scale = scaled_max / amax;
  return float_bits(scale) == 0x7f800000u ? FLT_MAX : scale;
}

// Max that propagates NaN from either side (fmaxf would drop it).
TE_HOST_DEVICE float nan_max(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}

}  // namespace te
