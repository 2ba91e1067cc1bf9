// Pieces shared by the LayerNorm / RMSNorm kernels (normalization.cu: forward,
// normalization_bwd.cu: backward): the row layout, fixed-order row reductions, 8-element loads
// and stores of tensors whose dtype is known only at run time, and stream-ordered scratch memory.
//
// Row layout. A CTA is blockDim.x = X threads per row (a multiple of 32) by blockDim.y = Y rows
// (Y > 1 only for short rows, so that a CTA still has 128 threads). Thread t of a row owns, in
// chunk j, the 8 elements starting at column (j * X + t) * 8: a warp's loads of one chunk are 32
// consecutive 16-byte vectors, and every 128-column block of Float8BlockScaling is exactly 16
// neighbouring lanes of one warp. The assignment does not depend on alignment (an unaligned row
// loads the same elements one by one), and the layout is chosen from H and the input dtype
// alone, never from the output kind: so the row sums, hence mu and rsigma, are the same bits for
// every output, and an FP8 output quantizes exactly the y a fp32-output call writes.
#pragma once

#include <atomic>
#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/scratch.cuh"

namespace te {
namespace cuda {
namespace norm {

constexpr int kMaxThreads = 512;  // per CTA, every norm kernel
constexpr int kIter = 4;          // chunks per thread per step where a row is re-read

struct RowLayout {
  int chunks;   // chunks per thread, the whole row held in registers; 0: re-read in steps
  int threads;  // X
  int rows;     // Y
};

// The fewest chunks per thread (1, 2, 4, 8) for which X = ceil(H / (8 * chunks)), rounded up to
// a warp, stays within max_threads(chunks) (0 excludes that count); else a re-read layout of
// `reread_threads`. Fewer chunks first: registers stay low, so more CTAs share an SM.
template <typename Limit>
RowLayout choose_layout(int64_t cols, Limit max_threads, int reread_threads) {
  const int64_t vecs = ceil_div(cols, 8);
  for (int k = 1; k <= 8; k *= 2) {
    const int64_t x = ceil_div(ceil_div(vecs, k), 32) * 32;
    if (x <= max_threads(k)) return {k, static_cast<int>(x), x < 128 ? static_cast<int>(128 / x) : 1};
  }
  const int64_t x = ceil_div(ceil_div(vecs, kIter), 32) * 32;
  const int threads = x < reread_threads ? static_cast<int>(x) : reread_threads;
  return {0, threads, threads < 128 ? 128 / threads : 1};
}

template <typename F>
void dispatch_chunks(int chunks, F&& f) {
  switch (chunks) {
    case 0: f(IntC<0>{}); break;
    case 1: f(IntC<1>{}); break;
    case 2: f(IntC<2>{}); break;
    case 4: f(IntC<4>{}); break;
    case 8: f(IntC<8>{}); break;
    default: fail(TE_ERROR_INTERNAL, "norm: unexpected chunk count ", chunks);
  }
}

// sm_count() * resident CTAs per SM of kKernel at `threads` with `smem` bytes of dynamic shared
// memory (a function of `threads` for each kernel; cached per kernel and thread count).
template <auto kKernel>
int64_t resident_ctas(int threads, size_t smem = 0) {
  static std::atomic<int> cache[kMaxThreads / 32 + 1] = {};
  const int slot = threads / 32;
  int n = cache[slot].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, threads, smem) != cudaSuccess ||
        n <= 0) {
      (void)cudaGetLastError();
      n = 1;
    }
    cache[slot].store(n, std::memory_order_relaxed);
  }
  return static_cast<int64_t>(n) * sm_count();
}


// ---------------------------------------------------------------------------------------------
// Device helpers.

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Elements of a chunk starting at column c that lie inside the row: 0..8.
__device__ __forceinline__ int chunk_valid(int64_t cols, int64_t c) {
  const int64_t v = cols - c;
  return v <= 0 ? 0 : (v >= 8 ? 8 : static_cast<int>(v));
}

// 8 elements of a T row into raw words: one 16-byte vector where allowed, else element by element.
template <typename T>
__device__ __forceinline__ void load_chunk(Raw8<T>& v, const T* p, int valid, bool vec) {
  if (vec && valid >= 8) {
    v.load_vec(p);
  } else {
    v.load_scalar(p, valid);
  }
}

template <typename T>
__device__ __forceinline__ void load8(const T* p, int valid, bool vec, float (&out)[8]) {
  Raw8<T> v;
  load_chunk(v, p, valid, vec);
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = v.get(k);
}

// 8 elements at p[offset..] of a fp32/fp16/bf16 tensor of run-time dtype (gamma, beta, add):
// elements >= valid read as 0; vec: p + offset is 16-byte aligned.
__device__ __forceinline__ void load8(const void* p, int32_t dtype, int64_t offset, int valid,
                                      bool vec, float (&out)[8]) {
  if (dtype == TE_DTYPE_FLOAT32) {
    load8(static_cast<const float*>(p) + offset, valid, vec, out);
  } else if (dtype == TE_DTYPE_FLOAT16) {
    load8(static_cast<const __half*>(p) + offset, valid, vec, out);
  } else {
    load8(static_cast<const __nv_bfloat16*>(p) + offset, valid, vec, out);
  }
}

template <typename T>
__device__ __forceinline__ uint32_t bits16(T v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half_as_ushort(v);
  } else {
    return __bfloat16_as_ushort(v);
  }
}

// Rounds (RNE) and stores elements [0, valid) of v; vec: p is 16-byte aligned.
template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&v)[8], int valid, bool vec) {
  if (vec && valid >= 8) {
    if constexpr (std::is_same_v<T, float>) {
      reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      uint32_t w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        w[i] = bits16(from_float<T>(v[2 * i])) | (bits16(from_float<T>(v[2 * i + 1])) << 16);
      *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < valid) p[k] = from_float<T>(v[k]);
  }
}

__device__ __forceinline__ void store8(void* p, int32_t dtype, int64_t offset, const float (&v)[8],
                                       int valid, bool vec) {
  if (dtype == TE_DTYPE_FLOAT32) {
    store8(static_cast<float*>(p) + offset, v, valid, vec);
  } else if (dtype == TE_DTYPE_FLOAT16) {
    store8(static_cast<__half*>(p) + offset, v, valid, vec);
  } else {
    store8(static_cast<__nv_bfloat16*>(p) + offset, v, valid, vec);
  }
}

__device__ __forceinline__ void store1(void* p, int32_t dtype, int64_t i, float v) {
  if (dtype == TE_DTYPE_FLOAT32) {
    static_cast<float*>(p)[i] = v;
  } else if (dtype == TE_DTYPE_FLOAT16) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
}

__device__ __forceinline__ int elem_bytes(int32_t dtype) { return dtype == TE_DTYPE_FLOAT32 ? 4 : 2; }

// Sums v[0..N) over the X threads of each row of the CTA; all threads of a row get the same bits.
// The order is fixed: a butterfly inside each warp, then the warps' sums in warp order. `smem`
// holds blockDim.y * (X / 32) * N floats. Every thread of the CTA must call it (it syncs).
template <int N>
__device__ __forceinline__ void row_sum(float (&v)[N], float* smem) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[i] = __fadd_rn(v[i], __shfl_xor_sync(0xffffffffu, v[i], o));
  const int warps = blockDim.x / 32;
  if (warps == 1) return;
  float* s = smem + threadIdx.y * warps * N;
  __syncthreads();  // an earlier call may still be reading smem
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) s[(threadIdx.x / 32) * N + i] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float a = s[i];
    for (int w = 1; w < warps; ++w) a = __fadd_rn(a, s[w * N + i]);
    v[i] = a;
  }
}

// Max of amax bits over the whole CTA (valid in every thread). `smem`: one word per warp.
__device__ __forceinline__ uint32_t cta_max(uint32_t m, uint32_t* smem) {
  m = warp_max(m);
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int warps = blockDim.x * blockDim.y / 32;
  __syncthreads();
  if (tid % 32 == 0) smem[tid / 32] = m;
  __syncthreads();
  uint32_t r = 0;
  for (int w = 0; w < warps; ++w) r = max(r, smem[w]);
  return r;
}

}  // namespace norm
}  // namespace cuda
}  // namespace te
