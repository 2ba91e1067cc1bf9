// amax = max |x| over a fp32/fp16/bf16 buffer, NaN if any element is NaN (a canonical 0x7FFFFFFF
// for fp16/bf16 sources, as the CPU reference widens them), 0 for an empty buffer.
//
// One read of the input: a grid-stride loop over 16-byte words with four independent loads in
// flight per thread (64 bytes; a persistent grid of the resident block count keeps ~128 KB in
// flight per SM, enough to cover HBM latency), a block reduce, then one atomicMax per block on
// the bits (cuda_utils.cuh). The output is zeroed in-stream first, so nothing waits on the host;
// a buffer small enough for one block (up to 16K 16-bit elements, the host-bound sizes where a
// launch costs more than the work) skips that memset and stores its max directly.
// fp16/bf16 words are reduced two halves at a time with __vmaxu2 on the sign-cleared bits, which
// order like the values (NaN above inf) in 16 bits too. A misaligned start is peeled element by
// element, so every buffer gets the vector body.
#include "common/kernels.h"
#include "cuda/amax.cuh"
#include "cuda/cuda_utils.cuh"

namespace te {
namespace cuda {
namespace {

constexpr int kThreads = 512;

template <typename T>
__device__ __forceinline__ uint32_t elem_abs_bits(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return abs_bits(x);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return abs_bits(__bfloat162float(x));
  } else {
    return abs_bits(__half2float(x));
  }
}

// Folds one 16-byte word into the running max (`m`: fp32 bits, or two packed 16-bit magnitudes).
template <typename T>
__device__ __forceinline__ uint32_t fold(uint32_t m, uint4 u) {
  if constexpr (std::is_same_v<T, float>) {
    m = max(m, u.x & 0x7fffffffu);
    m = max(m, u.y & 0x7fffffffu);
    m = max(m, u.z & 0x7fffffffu);
    m = max(m, u.w & 0x7fffffffu);
  } else {
    m = __vmaxu2(m, u.x & 0x7fff7fffu);
    m = __vmaxu2(m, u.y & 0x7fff7fffu);
    m = __vmaxu2(m, u.z & 0x7fff7fffu);
    m = __vmaxu2(m, u.w & 0x7fff7fffu);
  }
  return m;
}

// Packed 16-bit magnitudes -> fp32 magnitude bits.
template <typename T>
__device__ __forceinline__ uint32_t unpack_max(uint32_t m) {
  if constexpr (std::is_same_v<T, float>) {
    return m;
  } else {
    const uint32_t h = max(m & 0xffffu, m >> 16);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return h << 16;
    } else {
      if (h > 0x7c00u) return 0x7fffffffu;  // fp16 NaN
      return abs_bits(__half2float(__ushort_as_half(static_cast<unsigned short>(h))));
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) amax_kernel(const T* __restrict__ in, int64_t head,
                                                        int64_t words, int64_t numel,
                                                        float* __restrict__ amax, bool store) {
  constexpr int64_t kPerWord = 16 / sizeof(T);
  __shared__ uint32_t scratch[kThreads / 32];
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;

  uint32_t packed = 0;
  const uint4* body = reinterpret_cast<const uint4*>(in + head);
  int64_t i = tid;
  for (; i + 3 * stride < words; i += 4 * stride) {
    const uint4 a = __ldg(body + i), b = __ldg(body + i + stride);
    const uint4 c = __ldg(body + i + 2 * stride), d = __ldg(body + i + 3 * stride);
    packed = fold<T>(fold<T>(fold<T>(fold<T>(packed, a), b), c), d);
  }
  for (; i < words; i += stride) packed = fold<T>(packed, __ldg(body + i));
  uint32_t m = unpack_max<T>(packed);

  // Head (before the first aligned word) and tail (after the last) element by element.
  if (tid < head) m = max(m, elem_abs_bits(in[tid]));
  for (int64_t e = head + words * kPerWord + tid; e < numel; e += stride)
    m = max(m, elem_abs_bits(in[e]));

  m = block_max<kThreads>(canonical_amax_bits<T>(m), scratch);
  if (threadIdx.x == 0) {
    if (store) {
      *reinterpret_cast<uint32_t*>(amax) = m;
    } else if (m != 0u) {
      atomic_max_amax(amax, m);
    }
  }
}

// Zeroes *amax (unless one block covers the buffer: it then stores) and launches the kernel.
template <typename T>
void launch_amax(const T* in, int64_t numel, float* amax, cudaStream_t stream) {
  constexpr int64_t kPerWord = 16 / sizeof(T);
  const uintptr_t misalign = reinterpret_cast<uintptr_t>(in) % 16;
  int64_t head = misalign == 0 ? 0 : static_cast<int64_t>((16 - misalign) / sizeof(T));
  if (head > numel) head = numel;
  const int64_t words = (numel - head) / kPerWord;
  static const int occupancy = blocks_per_sm(amax_kernel<T>, kThreads, 2048 / kThreads);
  const int64_t max_blocks = static_cast<int64_t>(sm_count()) * occupancy;
  int64_t blocks = ceil_div(words > 0 ? ceil_div(words, 4) : numel, kThreads);
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  const bool store = blocks == 1;
  if (!store) check_cuda(cudaMemsetAsync(amax, 0, sizeof(float), stream), "amax: cudaMemsetAsync");
  amax_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(in, head, words, numel,
                                                                         amax, store);
  check_launch("amax_kernel");
}

}  // namespace

void amax_into_zeroed(const void* input, int32_t in_dtype, int64_t numel, float* amax,
                      cudaStream_t stream) {
  if (numel == 0) {
    check_cuda(cudaMemsetAsync(amax, 0, sizeof(float), stream), "amax: cudaMemsetAsync");
    return;
  }
  dispatch_source(in_dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_amax(static_cast<const T*>(input), numel, amax, stream);
  });
}

void amax(const void* input, int32_t in_dtype, int64_t numel, float* amax, void* stream) {
  amax_into_zeroed(input, in_dtype, numel, amax, as_stream(stream));
}

}  // namespace cuda
}  // namespace te
