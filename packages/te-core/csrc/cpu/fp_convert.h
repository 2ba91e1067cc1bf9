// Software element conversions for the CPU reference backend, bit-exact with CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...), __float2bfloat16_rn and __float2half_rn.
//
// Narrowing rounds to nearest, ties to even. FP8 saturates finite values and +-inf to +-max; fp16
// overflows to +-inf. A NaN becomes the positive canonical NaN of the target (E4M3 and E5M2 0x7F,
// fp16 and bf16 0x7FFF): CUDA drops the sign and payload of a NaN, so we do too. Widening is exact;
// an FP8 or fp16 NaN widens to CUDA's canonical fp32 NaN 0x7FFFFFFF.
//
// The rounding is done by exact fp32 arithmetic rather than by copying CUDA's bit tricks, so the
// two are independent implementations of the same rule: scaling by a power of two is exact, and
// adding then subtracting 2^23 rounds a value below 2^23 to an integer in the current rounding
// mode (nearest-even; te never changes it). Requires IEEE fp32 arithmetic without excess precision
// (SSE on x86-64, not x87) and without -ffast-math.
#pragma once

#include <cstdint>

#include "common/scaling.h"
#include "te/tensor.h"

namespace te {
namespace cpu {

inline float pow2f(int k) { return bits_float(static_cast<uint32_t>(127 + k) << 23); }

// Magnitude code of a >= 0 (finite, below the format's overflow point) rounded to nearest even in
// a binary format with `mant_bits` fraction bits and exponent bias `bias`. The codes of such a
// format are monotonic in value, so a round-up that carries into the next binade (or from the
// largest subnormal into the smallest normal) lands on the right code.
inline uint32_t round_magnitude(float a, int mant_bits, int bias) {
  const int emin = 1 - bias;  // exponent of the smallest normal; subnormals share its quantum
  int e = static_cast<int>(float_bits(a) >> 23) - 127;
  if (e < emin) e = emin;
  const float y = a * pow2f(mant_bits - e);  // exact, and below 2^(mant_bits + 1)
  const float q = (y + 8388608.0f) - 8388608.0f;
  return (static_cast<uint32_t>(e - emin) << mant_bits) + static_cast<uint32_t>(q);
}

inline float decode_magnitude(uint32_t code, int mant_bits, int bias) {
  const uint32_t e = code >> mant_bits;
  const uint32_t m = code & ((1u << mant_bits) - 1u);
  if (e == 0) return static_cast<float>(m) * pow2f(1 - bias - mant_bits);
  return static_cast<float>(m | (1u << mant_bits)) * pow2f(static_cast<int>(e) - bias - mant_bits);
}

constexpr uint32_t kCanonicalNanF32 = 0x7fffffffu;

inline uint8_t float_to_fp8(float x, int32_t fp8_dtype) {
  const uint32_t bits = float_bits(x);
  const float a = bits_float(bits & 0x7fffffffu);
  if (a != a) return 0x7f;
  const bool e4m3 = fp8_dtype == TE_DTYPE_FLOAT8_E4M3;
  const uint32_t sign = (bits >> 24) & 0x80u;
  // Every finite a below fp8_max rounds to at most the largest finite code, so one compare
  // saturates both large finite values and inf.
  if (a >= fp8_max(fp8_dtype)) return static_cast<uint8_t>(sign | (e4m3 ? 0x7eu : 0x7bu));
  return static_cast<uint8_t>(sign | round_magnitude(a, e4m3 ? 3 : 2, e4m3 ? 7 : 15));
}

inline float fp8_to_float(uint8_t v, int32_t fp8_dtype) {
  const uint32_t code = v & 0x7fu;
  const float sign = (v & 0x80u) ? -1.0f : 1.0f;
  if (fp8_dtype == TE_DTYPE_FLOAT8_E4M3) {
    if (code == 0x7fu) return bits_float(kCanonicalNanF32);
    return sign * decode_magnitude(code, 3, 7);
  }
  if (code == 0x7cu) return sign * bits_float(0x7f800000u);
  if (code > 0x7cu) return bits_float(kCanonicalNanF32);
  return sign * decode_magnitude(code, 2, 15);
}

inline uint16_t float_to_half(float x) {
  const uint32_t bits = float_bits(x);
  const float a = bits_float(bits & 0x7fffffffu);
  if (a != a) return 0x7fff;
  const uint32_t sign = (bits >> 16) & 0x8000u;
  // 65520 is halfway between the largest half (65504) and 2^16; the tie goes to the even 2^16.
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | round_magnitude(a, 10, 15));
}

inline float half_to_float(uint16_t v) {
  const uint32_t code = v & 0x7fffu;
  const float sign = (v & 0x8000u) ? -1.0f : 1.0f;
  if (code == 0x7c00u) return sign * bits_float(0x7f800000u);
  if (code > 0x7c00u) return bits_float(kCanonicalNanF32);
  return sign * decode_magnitude(code, 10, 15);
}

// bf16 is the top half of fp32, so rounding is an integer add on the bits: below the halfway
// point nothing carries into bit 16, above it one does, and at a tie the +lsb breaks it to even.
// A carry out of the largest finite value correctly gives inf.
inline uint16_t float_to_bf16(float x) {
  const uint32_t bits = float_bits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

inline float bf16_to_float(uint16_t v) { return bits_float(static_cast<uint32_t>(v) << 16); }

// Element i of a fp32, fp16 or bf16 buffer.
inline float load_as_float(const void* p, int32_t dtype, int64_t i) {
  if (dtype == TE_DTYPE_FLOAT32) return static_cast<const float*>(p)[i];
  const uint16_t v = static_cast<const uint16_t*>(p)[i];
  return dtype == TE_DTYPE_FLOAT16 ? half_to_float(v) : bf16_to_float(v);
}

// Stores v, rounded to nearest even, as element i of a fp32, fp16 or bf16 buffer.
inline void store_from_float(void* p, int32_t dtype, int64_t i, float v) {
  if (dtype == TE_DTYPE_FLOAT32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = dtype == TE_DTYPE_FLOAT16 ? float_to_half(v) : float_to_bf16(v);
  }
}

}  // namespace cpu
}  // namespace te
