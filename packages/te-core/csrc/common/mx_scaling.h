// The MXFP8 and NVFP4 rules of NUMERICS.md that both backends share, so each formula exists once:
// the E8M0 scale, NVFP4's global scale, the Philox4x32-10 stream behind stochastic rounding, the
// stochastic E2M1 rounding itself, and the 16-point Hadamard transform. Plain IEEE fp32 (no fused
// multiply-add: nothing here multiplies and adds in one expression), integer arithmetic
// otherwise, so host and device give the same bits. The round-to-nearest E2M1 and the E4M3
// conversions are not here: each backend has its own (cpu/mx_convert.h, cuda/mx_convert.cuh),
// and the tests hold them to each other.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/scaling.h"

namespace te {

constexpr float kE2M1Max = 6.0f;
constexpr float kNvfp4EncodeNumerator = 2688.0f;  // E4M3 max * E2M1 max = 448 * 6
constexpr uint32_t kE8M0Nan = 0xFFu;
// Hadamard sign vector s = [1,1,1,-1,1,-1,-1,-1,-1,-1,-1,1,-1,1,-1,-1]: bit i set where s_i = -1.
constexpr uint32_t kRhtSignMask = 0xD7E8u;

TE_HOST_DEVICE float canonical_nan() { return bits_float(0x7fffffffu); }

TE_HOST_DEVICE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

TE_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// ---- MXFP8 ---------------------------------------------------------------------------------

// The E8M0 byte of amax / fp8_max rounded up: the quotient's 8 exponent bits, plus one when any
// of its 23 mantissa bits is set, capped at 0xFE; amax 0 gives 0x00 and NaN 0xFF. An infinite
// amax caps at 0xFE (2^127), so the block's inf saturates rather than becoming NaN.
TE_HOST_DEVICE uint32_t e8m0_from_amax(float amax, float fp8_max) {
  if (amax != amax) return kE8M0Nan;
  const uint32_t b = float_bits(div_rn(amax, fp8_max));
  uint32_t e = (b >> 23) & 0xffu;
  if ((b & 0x7fffffu) != 0u) ++e;
  return e > 0xfeu ? 0xfeu : e;
}

// 2^(e - 127), the decode scale (scale_inv) of an E8M0 byte; 0xFF is NaN. e = 0 is 2^-127, an
// fp32 subnormal.
TE_HOST_DEVICE float e8m0_value(uint32_t e) {
  if (e == kE8M0Nan) return canonical_nan();
  return e == 0u ? bits_float(0x00400000u) : bits_float(e << 23);
}

// 2^(127 - e) = 1 / e8m0_value(e), exactly: x * e8m0_encode_factor(e) == x / e8m0_value(e) bit
// for bit (both are the correctly rounded value of the same real).
TE_HOST_DEVICE float e8m0_encode_factor(uint32_t e) {
  if (e == kE8M0Nan) return canonical_nan();
  const uint32_t inv = 254u - e;
  return inv == 0u ? bits_float(0x00400000u) : bits_float(inv << 23);
}

// ---- NVFP4 ---------------------------------------------------------------------------------

// S_enc = 2688 / global_amax in fp32; amax 0, negative or inf -> 1 (an inf amax would give 0 and
// wipe every finite block); an overflowing quotient -> FLT_MAX; NaN stays NaN, so the whole copy
// decodes to NaN and the amax reports it.
TE_HOST_DEVICE float nvfp4_encode_scale(float amax) {
  if (amax != amax) return amax;
  if (!(amax > 0.0f) || float_bits(amax) == 0x7f800000u) return 1.0f;
  const float s = div_rn(kNvfp4EncodeNumerator, amax);
  return float_bits(s) == 0x7f800000u ? FLT_MAX : s;
}

// s_global = 1 / S_enc, the global decode scale.
TE_HOST_DEVICE float nvfp4_decode_scale(float amax) { return div_rn(1.0f, nvfp4_encode_scale(amax)); }

// The fp32 value whose E4M3 conversion is the stored block scale: (block_amax / 6) * S_enc.
TE_HOST_DEVICE float nvfp4_block_scale_value(float block_amax, float s_enc) {
  return mul_rn(div_rn(block_amax, kE2M1Max), s_enc);
}

// The per-block encode factor enc = S_enc / s_block (s_block the decoded E4M3 scale): 0 for a
// zero scale (the block is zeros, or negligible next to the global amax), capped at FLT_MAX so a
// zero element never meets an infinite factor; NaN stays NaN.
TE_HOST_DEVICE float nvfp4_block_encode(float s_enc, float s_block) {
  if (s_block == 0.0f) return 0.0f;
  const float e = div_rn(s_enc, s_block);
  return e > FLT_MAX ? FLT_MAX : e;
}

// Stochastic rounding of a magnitude a (>= 0, not NaN) to an E2M1 magnitude code 0..7 with the
// random word u: lo <= a < hi neighbouring E2M1 values, frac = (a - lo) / (hi - lo) (exact: a - lo
// is exact within a binade and the step is a power of two), up iff u < frac * 2^32 (compared
// exactly in double). a >= 6 gives 6.
TE_HOST_DEVICE uint32_t e2m1_stochastic_code(float a, uint32_t u) {
  if (a >= kE2M1Max) return 7u;
  const bool low = a < 2.0f, mid = !low && a < 4.0f;
  const float base = low ? 0.0f : (mid ? 2.0f : 4.0f);
  const float step = low ? 0.5f : (mid ? 1.0f : 2.0f);
  const uint32_t base_code = low ? 0u : (mid ? 4u : 6u);
  const float t = div_rn(a - base, step);
  const float k = floorf(t);
  const float frac = t - k;
  const bool up = static_cast<double>(u) < static_cast<double>(frac) * 4294967296.0;
  return base_code + static_cast<uint32_t>(k) + (up ? 1u : 0u);
}

// ---- Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3") ----------

// Word w of the stream (seed, offset): lane w % 4 of the block with counter {lo32(w / 4),
// hi32(w / 4), lo32(offset), hi32(offset)} and key {lo32(seed), hi32(seed)}.
TE_HOST_DEVICE void philox4x32_10(uint32_t (&c)[4], uint32_t k0, uint32_t k1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

TE_HOST_DEVICE uint32_t philox_word(uint64_t seed, uint64_t offset, uint64_t w) {
  const uint64_t block = w >> 2;
  uint32_t c[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                   static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)};
  philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return c[w & 3u];
}

// ---- the 16-point random Hadamard transform ----------------------------------------------------

// The radix-2 butterfly with strides 1, 2, 4, 8: (v[i], v[i + h]) -> (v[i] + v[i + h],
// v[i] - v[i + h]) for i with bit h clear. It computes v * H16 (Sylvester, symmetric) in a fixed
// order of fp32 adds, which every backend repeats exactly.
TE_HOST_DEVICE void hadamard16_butterfly(float (&v)[16]) {
  for (int h = 1; h < 16; h <<= 1) {
    for (int i = 0; i < 16; ++i) {
      if ((i & h) == 0) {
        const float a = v[i], b = v[i + h];
        v[i] = a + b;
        v[i + h] = a - b;
      }
    }
  }
}

TE_HOST_DEVICE float rht_sign(float x, int i) { return ((kRhtSignMask >> i) & 1u) ? -x : x; }

// y = x * (1/4) diag(s) H16: signs, butterfly, then * 1/4 (exact but for subnormals).
TE_HOST_DEVICE void rht_forward(float (&v)[16]) {
  for (int i = 0; i < 16; ++i) v[i] = rht_sign(v[i], i);
  hadamard16_butterfly(v);
  for (int i = 0; i < 16; ++i) v[i] = mul_rn(v[i], 0.25f);
}

// The inverse (the transpose of an orthogonal matrix): x = y * (1/4) H16 diag(s).
TE_HOST_DEVICE void rht_inverse(float (&v)[16]) {
  hadamard16_butterfly(v);
  for (int i = 0; i < 16; ++i) v[i] = rht_sign(mul_rn(v[i], 0.25f), i);
}

}  // namespace te
