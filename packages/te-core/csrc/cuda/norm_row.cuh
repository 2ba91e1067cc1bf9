// Pieces shared by the LayerNorm / RMSNorm kernels (norm_fwd.cuh: forward,
// normalization_bwd.cu: backward): the row layout, fixed-order row reductions, 8-element loads
// and stores of tensors whose dtype is known only at run time, rows staged in shared memory by
// cp.async, and stream-ordered scratch memory.
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

// Where the rows kernels find a thread's weights. Natural (x == 0): column c at w[c]. In pieces
// (x = X, the kernel's threads per row): thread t's chunk j, columns (j * X + t) * 8 + 0..7, as
// two 16-byte pieces, columns 0-3 at float4 index 2 * j * X + t and 4-7 at (2 * j + 1) * X + t,
// `width` = X * 8 * chunks floats, zero past the row. A warp's 16-byte loads of one piece are then
// consecutive; in the natural layout each lane's 8 weights are 32 contiguous bytes, so every load
// instruction used half of each sector it fetched, twice over, and the weights were most of the
// rows kernels' L1 traffic (ncu at H 8192: L1 the busiest unit, 77%; NOTES.md).
// `beta`: beta is written even where the norm has none, as -0 (fmaf(xhat, g, -0) is xhat * g bit
// for bit, -0 and +0 products included), so that LayerNorm's rows kernel adds it unconditionally:
// a run-time test there cost a predicated-off multiply beside every fused multiply-add (SASS).
// `dtype16`: the pieces hold the source weights' own 16-bit dtype, copied unconverted (0: fp32).
struct WeightPieces {
  int x = 0;
  int64_t width = 0;
  bool beta = false;
  int32_t dtype16 = 0;
};

// Whether a weight of dtype w_dtype reaches the kernels of a 16-bit input x_dtype as it is
// (WeightPieces::dtype16): only where widening it gives exactly the fp32 values they would use,
// i.e. it has x's dtype and is not zero-centered (whose + 1 is rounded once, in fp32).
inline bool weight_as_is_16(int32_t x_dtype, int32_t w_dtype, bool zero_centered) {
  return (x_dtype == TE_DTYPE_BFLOAT16 || x_dtype == TE_DTYPE_FLOAT16) && w_dtype == x_dtype && !zero_centered;
}

// gamma (and beta) as the fp32 values the kernels multiply by and add (or, in pieces with
// WeightPieces::dtype16, their 16-bit source values, which widen to exactly those): gamma + 1 where gamma is
// zero-centered (__fadd_rn(1.0f, g), the formula's own rounding, done once per column instead of
// once per element), else widened (exact). In the natural layout, the caller's own pointers where
// they already are that (fp32, 16-byte aligned, not zero-centered); otherwise, and always in
// pieces, copies in scratch written by one small kernel. Either way both are 16-byte aligned.
// The kernels then load 8 weights with two 16-byte loads and no conversion: branching on the
// weights' dtype and widening them per chunk cost the first kernels ~8 of their ~38 instructions
// per element (benchmarks/NOTES.md).
class Fp32Weights {
 public:
  Fp32Weights(const void* gamma, int32_t gamma_dtype, const void* beta, int32_t beta_dtype,
              bool zero_centered, int64_t cols, WeightPieces pieces, cudaStream_t stream);
  const float* gamma() const { return gamma_; }
  const float* beta() const { return beta_; }  // nullptr without beta

 private:
  static bool usable(const void* w, int32_t dtype) {
    return dtype == TE_DTYPE_FLOAT32 && aligned(w, 16);
  }
  Scratch scratch_;
  const float* gamma_;
  const float* beta_;
};

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

// Lets kKernel take `smem` bytes of dynamic shared memory (above 48 KB needs an opt-in, per
// device; remembered per ordinal). Call before resident_ctas, whose query assumes it.
template <auto kKernel>
void allow_dynamic_smem(size_t smem) {
  constexpr int kMaxDevices = 64;
  static std::atomic<size_t> opted_in[kMaxDevices] = {};
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached && smem <= opted_in[device].load(std::memory_order_relaxed)) return;
  check_cuda(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)),
             "norm: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (cached) opted_in[device].store(smem, std::memory_order_relaxed);
}

// The most dynamic shared memory one CTA of kKernel can take on the current device: the opt-in
// limit (227 KB on sm_90/100, 163 KB on sm_80, 99 KB on sm_89/120) less the kernel's static shared
// memory. Cached per device.
template <auto kKernel>
size_t max_dynamic_smem() {
  constexpr int kMaxDevices = 64;
  static std::atomic<size_t> cache[kMaxDevices] = {};
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    const size_t c = cache[device].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int optin = 0;
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)");
  cudaFuncAttributes attr{};
  check_cuda(cudaFuncGetAttributes(&attr, kKernel), "norm: cudaFuncGetAttributes");
  const size_t optin_bytes = static_cast<size_t>(optin);
  const size_t limit = optin_bytes > attr.sharedSizeBytes ? optin_bytes - attr.sharedSizeBytes : 0;
  if (cached) cache[device].store(limit, std::memory_order_relaxed);
  return limit;
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

// 8 weights at w[c..] (w from Fp32Weights: 16-byte aligned; c a multiple of 8); elements >= valid
// read as 0.
__device__ __forceinline__ void load8f(const float* w, int64_t c, int valid, float (&out)[8]) {
  if (valid >= 8) {
    const float4 lo = __ldg(reinterpret_cast<const float4*>(w + c));
    const float4 hi = __ldg(reinterpret_cast<const float4*>(w + c) + 1);
    out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w;
    out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = k < valid ? __ldg(w + c + k) : 0.0f;
  }
}

// Thread t's 8 weights of chunk j from a copy in pieces (WeightPieces, x = X).
__device__ __forceinline__ void load8p(const float* w, int j, int X, int t, float (&out)[8]) {
  const float4* w4 = reinterpret_cast<const float4*>(w);
  const float4 lo = __ldg(w4 + 2 * j * X + t);
  const float4 hi = __ldg(w4 + (2 * j + 1) * X + t);
  out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w;
  out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
}

// The same from pieces in fp32 or (kW16, WeightPieces::dtype16) x's 16-bit dtype T, widened:
// chunk j of thread t is then the one 16-byte piece at 8 (j * X + t).
template <typename T, bool kW16>
__device__ __forceinline__ void load8w(const float* w, int j, int X, int t, float (&out)[8]) {
  if constexpr (kW16) {
    Raw8<T> v;
    v.load_vec(reinterpret_cast<const T*>(w) + static_cast<int64_t>(j * X + t) * 8);
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = v.get(k);
  } else {
    load8p(w, j, X, t, out);
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

// v[i] = s[i] + s[N + i] + ... + s[(W - 1) * N + i], added in that order (row_sum's), with
// 16-byte reads: s 16-byte aligned, W * N a multiple of 4.
template <int N, int W>
__device__ __forceinline__ void fold_warps(float (&v)[N], const float* s) {
  static_assert((W * N) % 4 == 0, "fold_warps: whole 16-byte reads");
  const float4* s4 = reinterpret_cast<const float4*>(s);
#pragma unroll
  for (int q = 0; q < W * N / 4; ++q) {
    const float4 f = s4[q];
    const float e[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
    for (int r = 0; r < 4; ++r) v[r % N] = q == 0 && r < N ? e[r] : __fadd_rn(v[r % N], e[r]);
  }
}

// row_sum for kernels that loop over rows: one barrier per call instead of two. Successive calls
// alternate between the two halves of `smem` (2 * blockDim.y * (X / 32) * N floats, 16-byte
// aligned; `parity` starts at 0 and is the caller's, uniform over the CTA): call k writes half
// k % 2 only after passing the barrier of call k - 1, which every thread reaches after it has read
// what it needed of call k - 2, the last user of that half. The sum is row_sum's, in row_sum's
// order. kRowBarrier: the CTA's rows (blockDim.y of them, whole warps each) must not wait for
// each other, so the barrier is the row's own named one (1 + threadIdx.y, its blockDim.x
// threads) and `parity` need only be uniform over the row.
template <int N, bool kRowBarrier = false>
__device__ __forceinline__ void row_sum_pp(float (&v)[N], float* smem, int& parity) {
  static_assert(N == 1 || N == 2, "row_sum_pp: 1 or 2 sums");
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[i] = __fadd_rn(v[i], __shfl_xor_sync(0xffffffffu, v[i], o));
  const int warps = blockDim.x / 32;
  if (warps == 1) return;
  float* s = smem + (parity * blockDim.y + threadIdx.y) * warps * N;
  parity ^= 1;
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) s[(threadIdx.x / 32) * N + i] = v[i];
  }
  if constexpr (kRowBarrier) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + static_cast<int>(threadIdx.y)), "r"(static_cast<int>(blockDim.x))
                 : "memory");
  } else {
    __syncthreads();
  }
  // The common warp counts unrolled: 16-byte reads and a straight chain of adds (a loop with a
  // run-time trip count cost ~100 instructions per call for 16 warps: SASS, NOTES.md).
  switch (warps) {
    case 4: fold_warps<N, 4>(v, s); break;
    case 8: fold_warps<N, 8>(v, s); break;
    case 16: fold_warps<N, 16>(v, s); break;
    default:
#pragma unroll
      for (int i = 0; i < N; ++i) {
        float a = s[i];
        for (int w = 1; w < warps; ++w) a = __fadd_rn(a, s[w * N + i]);
        v[i] = a;
      }
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

// ---------------------------------------------------------------------------------------------
// Rows staged in shared memory. The row kernels copy a later row into shared memory with cp.async
// while they compute the current one, so loads stay in flight through a row's reductions and
// stores (with one row per CTA and nothing in flight from its load to its last barrier, the first
// kernels were latency-bound: benchmarks/NOTES.md). A thread copies and reads back only its own
// chunks, so no barrier is needed between the two: cp.async.wait_group makes a thread's copies
// visible to itself. A staged chunk is kQuads 16-byte pieces, piece q of thread t at
// slot[q * X + t]: a warp's 16-byte accesses cover consecutive bytes, free of bank conflicts.

template <typename T>
constexpr int kQuads = Raw8<T>::kWords / 4;  // 16-byte pieces per chunk of 8: fp32 2, 16-bit 1

// Copies `bytes` (1..16) from global `src` (16-byte aligned) to the shared address `dst`,
// zero-filling to 16.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
  if (bytes >= 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
  }
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most `pending` (0..2) of this thread's newest commit groups are incomplete.
__device__ __forceinline__ void cp_async_wait(int pending) {
  if (pending >= 2) {
    asm volatile("cp.async.wait_group 2;\n" ::: "memory");
  } else if (pending == 1) {
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  } else {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  }
}

// Stages one whole chunk of a 16-byte aligned row: slot at shared address dst (pieces X * 16 bytes
// apart).
template <typename T>
__device__ __forceinline__ void stage_whole_chunk(uint32_t dst, int X, const T* src) {
#pragma unroll
  for (int q = 0; q < kQuads<T>; ++q) {
    cp_async16(dst + q * X * 16, src + q * (16 / static_cast<int>(sizeof(T))), 16);
  }
}

// Stages any chunk (the `valid` elements at src; the rest +0, as load_chunk reads them) into the
// slot at `slot` (shared address dst): cp.async where the row is 16-byte aligned (vec), else
// loaded here and stored (an unaligned row then waits for its loads, like the unstaged kernels).
template <typename T>
__device__ __forceinline__ void stage_chunk(uint4* slot, uint32_t dst, int X, const T* src, int valid,
                                            bool vec) {
  if (vec && valid > 0) {
#pragma unroll
    for (int q = 0; q < kQuads<T>; ++q) {
      const int bytes = valid * static_cast<int>(sizeof(T)) - 16 * q;
      if (bytes > 0) {
        cp_async16(dst + q * X * 16, src + q * (16 / static_cast<int>(sizeof(T))), bytes);
      } else {
        slot[q * X] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  } else {
    Raw8<T> v;
    v.load_scalar(src, valid);
#pragma unroll
    for (int q = 0; q < kQuads<T>; ++q) {
      slot[q * X] = make_uint4(v.w[4 * q], v.w[4 * q + 1], v.w[4 * q + 2], v.w[4 * q + 3]);
    }
  }
}

template <typename T>
__device__ __forceinline__ void read_chunk(Raw8<T>& v, const uint4* slot, int X) {
#pragma unroll
  for (int q = 0; q < kQuads<T>; ++q) {
    const uint4 u = slot[q * X];
    v.w[4 * q] = u.x;
    v.w[4 * q + 1] = u.y;
    v.w[4 * q + 2] = u.z;
    v.w[4 * q + 3] = u.w;
  }
}

}  // namespace norm
}  // namespace cuda
}  // namespace te
