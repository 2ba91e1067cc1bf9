// Device element conversions for MXFP8 / NVFP4, bit-exact with the CPU reference (cpu/mx_convert.h
// and cpu/fp_convert.h), and the 32 x 128 source tile the quantize kernels share.
//
// E2M1 round-to-nearest-even is written as threshold compares (a tie goes to the even code: 0.25
// -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), an implementation
// independent of the CPU's exact-arithmetic rounding; CUDA's __nv_cvt_float_to_fp4 is not used so
// that NaN (-> 0x7) and the sign of zero follow te's rule on every architecture.
#pragma once

#include "common/mx_scaling.h"
#include "cuda/cuda_utils.cuh"

namespace te {
namespace cuda {
namespace mx {

__device__ __forceinline__ uint32_t e2m1_rn(float v) {
  const float a = fabsf(v);
  if (a != a) return 0x7u;
  const uint32_t m = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                     (a >= 3.5f) + (a > 5.0f);
  return ((__float_as_uint(v) >> 28) & 0x8u) | m;
}

__device__ __forceinline__ uint32_t e2m1_sr(float v, uint32_t u) {
  const float a = fabsf(v);
  if (a != a) return 0x7u;
  return ((__float_as_uint(v) >> 28) & 0x8u) | e2m1_stochastic_code(a, u);
}

__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const uint32_t e = (code >> 1) & 0x3u, m = code & 0x1u;
  // 0, 0.5 for e = 0; (1 + m / 2) * 2^(e - 1) otherwise: exact powers and halves.
  const float mag = e == 0u ? 0.5f * static_cast<float>(m)
                            : __uint_as_float((126u + e) << 23) * (1.0f + 0.5f * static_cast<float>(m));
  return (code & 0x8u) ? -mag : mag;
}

template <int kFmt>
__device__ __forceinline__ uint32_t fp8_rn(float v) {
  constexpr __nv_fp8_interpretation_t kInterp = kFmt == TE_DTYPE_FLOAT8_E4M3 ? __NV_E4M3 : __NV_E5M2;
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, kInterp));
}

// ---- the source tile ------------------------------------------------------------------------

constexpr int kTileRows = 32;
constexpr int kTileCols = 128;

// 32 x 128 source values as fp32, element (r, c) at r * kStride + c + c / kBlock. The one-word
// skew per block and the stride make both walks free of bank conflicts: a thread per block along
// the rows (kBlock 32: lanes over 8 rows x 4 blocks; 16: 4 rows x 8 blocks) and a thread per
// column down the rows.
template <int kBlock>
struct Tile {
  static constexpr int kStride = kBlock == 16 ? 136 : 132;
  float v[kTileRows * kStride];
  __device__ __forceinline__ float& at(int r, int c) { return v[r * kStride + c + c / kBlock]; }
};

// Loads the tile at (r0, c0) of input [rows, cols]; elements outside the matrix are +0, which
// raises no amax and is never stored. Chunks of 8 along a row, 16-byte loads where `vec`.
template <typename T, int kBlock, int kThreads>
__device__ __forceinline__ void load_tile(Tile<kBlock>& tile, const T* __restrict__ in, int64_t rows,
                                          int64_t cols, int64_t r0, int64_t c0, bool vec) {
  constexpr int kChunks = kTileRows * kTileCols / 8;
  for (int q = threadIdx.x; q < kChunks; q += kThreads) {
    const int r = q / (kTileCols / 8), c = (q % (kTileCols / 8)) * 8;
    const int64_t gr = r0 + r, gc = c0 + c;
    Raw8<T> x;
    if (gr < rows && gc < cols) {
      const T* src = in + gr * cols + gc;
      if (vec && gc + 8 <= cols) {
        x.load_vec(src);
      } else {
        x.load_scalar(src, static_cast<int>(cols - gc < 8 ? cols - gc : 8));
      }
    } else {
#pragma unroll
      for (int w = 0; w < Raw8<T>::kWords; ++w) x.w[w] = 0;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) tile.at(r, c + k) = x.get(k);
  }
}

// max |v| over n values as fp32 bits (an integer max of the sign-cleared bits orders like the
// values and puts NaN above inf: cuda_utils.cuh).
template <int kN>
__device__ __forceinline__ uint32_t amax_bits(const float (&v)[kN]) {
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < kN; ++k) m = max(m, abs_bits(v[k]));
  return m;
}

}  // namespace mx
}  // namespace cuda
}  // namespace te
