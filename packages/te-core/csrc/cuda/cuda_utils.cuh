// Device helpers shared by the CUDA kernels: error checks, raw 8-element vectors of fp32/fp16/bf16
// read as float, FP8 conversion, and NaN-propagating max reductions.
//
// Amax trick: for |x| (sign cleared) the fp32 bit pattern, read as an integer, orders like the
// value, and every NaN pattern lies above +inf, so an integer max of the bits is a max that
// propagates NaN (te::nan_max semantics). The global accumulation is a *signed* atomicMax on the
// bits: a non-negative value then also beats a negative value already stored (-0.0f from a user's
// buffer would otherwise win as 0x80000000).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/error.h"
#include "common/scaling.h"
#include "te/tensor.h"

namespace te {
namespace cuda {

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fail(TE_ERROR_CUDA, what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
  }
}

// After a launch: reports a launch-configuration error with the kernel's name.
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

// Makes this thread's stream-capture mode relaxed while it lives: one-time allocations
// (cudaMalloc, cudaMemPoolCreate) made by the first call on a stream that is capturing a CUDA
// graph are refused in the default (global) mode. torch's caching allocator does the same.
class RelaxedCapture {
 public:
  RelaxedCapture() {
    check_cuda(cudaThreadExchangeStreamCaptureMode(&mode_), "cudaThreadExchangeStreamCaptureMode");
  }
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Multiprocessor count of the current device (cached per device ordinal; device.cu).
int sm_count();

// Peak DRAM bandwidth of the current device divided by its SM count, in MB/s (the memory clock
// x bus width x 2 for double data rate; cached per device ordinal; device.cu): what the same
// kernel's latency has to hide on each SM. H100 SXM ~25,000, H200 ~37,000.
int dram_mbps_per_sm();

// Resident blocks per SM of `kernel` at `threads` threads (queried once per kernel instance).
template <typename Kernel>
int blocks_per_sm(Kernel kernel, int threads, int fallback) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0) != cudaSuccess ||
      n <= 0) {
    (void)cudaGetLastError();
    n = fallback;
  }
  return n;
}

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline bool aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes)) == 0;
}

// ---------------------------------------------------------------------------------------------
// Raw 8-element vectors. Words are kept as loaded (packed 16-bit types stay packed, halving the
// registers a tile needs) and widened to float on use; widening is exact.

template <typename T>
struct Raw8 {
  static constexpr int kWords = 2 * static_cast<int>(sizeof(T));  // fp32: 8, 16-bit: 4
  uint32_t w[kWords];

  // 16-byte aligned p, all 8 elements valid.
  __device__ __forceinline__ void load_vec(const T* p) {
    const uint4* v = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      const uint4 u = __ldg(v + i);
      w[4 * i + 0] = u.x;
      w[4 * i + 1] = u.y;
      w[4 * i + 2] = u.z;
      w[4 * i + 3] = u.w;
    }
  }

  // Elements [0, valid) from p (element-aligned only); the rest are +0, which no max sees.
  __device__ __forceinline__ void load_scalar(const T* p, int valid) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0;
    if constexpr (sizeof(T) == 4) {
      const uint32_t* q = reinterpret_cast<const uint32_t*>(p);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (k < valid) w[k] = __ldg(q + k);
    } else {
      const unsigned short* q = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (k < valid) w[k / 2] |= static_cast<uint32_t>(__ldg(q + k)) << (16 * (k & 1));
    }
  }

  __device__ __forceinline__ float get(int k) const {
    if constexpr (std::is_same_v<T, float>) {
      return __uint_as_float(w[k]);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return __uint_as_float((k & 1) ? (w[k / 2] & 0xffff0000u) : (w[k / 2] << 16));
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(w[k / 2] >> (16 * (k & 1)))));
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Amax in bits.

__device__ __forceinline__ uint32_t abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

// The CPU reference widens a fp16/bf16 NaN to the canonical 0x7FFFFFFF before its max; fp32 NaNs
// keep their payload (sign cleared). Applied once to a reduced maximum.
template <typename T>
__device__ __forceinline__ uint32_t canonical_amax_bits(uint32_t m) {
  if constexpr (!std::is_same_v<T, float>) {
    if (m > 0x7f800000u) m = 0x7fffffffu;
  }
  return m;
}

__device__ __forceinline__ uint32_t warp_max(uint32_t v) { return __reduce_max_sync(0xffffffffu, v); }

// Max over the block; every thread gets the result. `scratch` holds one word per warp.
template <int kThreads>
__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t* scratch) {
  constexpr int kWarps = kThreads / 32;
  v = warp_max(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may be reused
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  uint32_t m = lane < kWarps ? scratch[lane] : 0u;
  return warp_max(m);
}

// Max-accumulates into *amax (NaN propagates; see the top of this file).
__device__ __forceinline__ void atomic_max_amax(float* amax, uint32_t bits) {
  atomicMax(reinterpret_cast<int*>(amax), static_cast<int>(bits));
}

// ---------------------------------------------------------------------------------------------
// FP8 conversion: round to nearest even, saturating finite values and inf, NaN -> NaN.
// kFmt is TE_DTYPE_FLOAT8_E4M3 or TE_DTYPE_FLOAT8_E5M2.

template <int kFmt>
__device__ __forceinline__ uint32_t fp8x2(float a, float b) {
  constexpr __nv_fp8_interpretation_t kInterp = kFmt == TE_DTYPE_FLOAT8_E4M3 ? __NV_E4M3 : __NV_E5M2;
  // a lands in the low byte (the header swaps operands for cvt's {hi, lo} order).
  return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kInterp));
}

// x * scale as one rounded fp32 multiply (never contracted into an FMA).
__device__ __forceinline__ float scaled(float x, float scale) { return __fmul_rn(x, scale); }

// Quantizes 8 elements with one scale; byte k of the result is element k.
template <int kFmt, typename T>
__device__ __forceinline__ uint2 quantize8(const Raw8<T>& v, float scale) {
  const uint32_t b0 = fp8x2<kFmt>(scaled(v.get(0), scale), scaled(v.get(1), scale));
  const uint32_t b1 = fp8x2<kFmt>(scaled(v.get(2), scale), scaled(v.get(3), scale));
  const uint32_t b2 = fp8x2<kFmt>(scaled(v.get(4), scale), scaled(v.get(5), scale));
  const uint32_t b3 = fp8x2<kFmt>(scaled(v.get(6), scale), scaled(v.get(7), scale));
  return make_uint2(b0 | (b1 << 16), b2 | (b3 << 16));
}

// Quantizes 8 elements, element k with scale[k].
template <int kFmt, typename T>
__device__ __forceinline__ uint2 quantize8(const Raw8<T>& v, const float (&scale)[8]) {
  uint32_t b[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    b[i] = fp8x2<kFmt>(scaled(v.get(2 * i), scale[2 * i]), scaled(v.get(2 * i + 1), scale[2 * i + 1]));
  return make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
}

template <int kFmt>
__device__ __forceinline__ float fp8_to_float(uint8_t q) {
  constexpr __nv_fp8_interpretation_t kInterp = kFmt == TE_DTYPE_FLOAT8_E4M3 ? __NV_E4M3 : __NV_E5M2;
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, kInterp)));
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return __float2half_rn(v);
  }
}

// Stores v[0..valid) rounded to nearest even into `out` (dtype fp32/fp16/bf16) at elements
// idx..idx+valid-1. vec: all 8 valid and out + idx 16-byte aligned (fp32: two 16-byte stores).
__device__ __forceinline__ void store8_rounded(void* out, int64_t idx, const float (&v)[8],
                                               int32_t dtype, int valid, bool vec) {
  if (dtype == TE_DTYPE_FLOAT32) {
    float* o = static_cast<float*>(out) + idx;
    if (vec) {
      reinterpret_cast<float4*>(o)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(o)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (k < valid) o[k] = v[k];
    }
    return;
  }
  uint32_t w[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    w[k] = dtype == TE_DTYPE_BFLOAT16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v[k]))
                                      : __half_as_ushort(__float2half_rn(v[k]));
  }
  unsigned short* o = static_cast<unsigned short*>(out) + idx;
  if (vec) {
    *reinterpret_cast<uint4*>(o) = make_uint4(w[0] | (w[1] << 16), w[2] | (w[3] << 16),
                                              w[4] | (w[5] << 16), w[6] | (w[7] << 16));
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < valid) o[k] = static_cast<unsigned short>(w[k]);
  }
}

// ---------------------------------------------------------------------------------------------
// dtype int -> C++ type dispatch.

template <typename F>
void dispatch_source(int32_t dtype, F&& f) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32: f(float{}); break;
    case TE_DTYPE_FLOAT16: f(__half{}); break;
    case TE_DTYPE_BFLOAT16: f(__nv_bfloat16{}); break;
    default: fail(TE_ERROR_INTERNAL, "CUDA backend: unexpected source dtype ", dtype);
  }
}

template <int V>
using IntC = std::integral_constant<int, V>;

template <typename F>
void dispatch_fp8(int32_t dtype, F&& f) {
  switch (dtype) {
    case TE_DTYPE_FLOAT8_E4M3: f(IntC<TE_DTYPE_FLOAT8_E4M3>{}); break;
    case TE_DTYPE_FLOAT8_E5M2: f(IntC<TE_DTYPE_FLOAT8_E5M2>{}); break;
    default: fail(TE_ERROR_INTERNAL, "CUDA backend: unexpected FP8 dtype ", dtype);
  }
}

}  // namespace cuda
}  // namespace te
