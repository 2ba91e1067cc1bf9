// The non-template parts of cuda/fused_output.cuh: stream-ordered scratch, the in-order sum of
// the bias-gradient partials, and the empty-result case.
#include "cuda/fused_output.cuh"

namespace te {
namespace cuda {
namespace fused {
namespace {

constexpr int kSumThreads = 256;

// One thread per column, chunks added first to last: the fixed order that makes the bias the
// same bits on every run. Reads are coalesced across the threads of a chunk row.
template <typename T>
__global__ void __launch_bounds__(kSumThreads)
    sum_partials_kernel(const float* __restrict__ partial, int64_t chunks, int64_t cols, T* out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kSumThreads + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int64_t i = 0; i < chunks; ++i) s = __fadd_rn(s, partial[i * cols + c]);
  out[c] = from_float<T>(s);
}

}  // namespace

void sum_column_partials(const float* partial, int64_t chunks, int64_t cols, void* out,
                         int32_t dtype, cudaStream_t stream) {
  if (cols == 0) return;
  const int64_t blocks = ceil_div(cols, kSumThreads);
  if (blocks > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "sum_partials_kernel: too many columns");
  dispatch_source(dtype, [&](auto tag) {
    using T = decltype(tag);
    sum_partials_kernel<T><<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(
        partial, chunks, cols, static_cast<T*>(out));
    check_launch("sum_partials_kernel");
  });
}

void write_empty(const FusedOutput& out, int64_t cols, Dbias dbias, cudaStream_t stream) {
  if (dbias.data != nullptr && cols > 0) {
    // All-zero bits are +0 in fp32, fp16 and bf16: the sum of no rows.
    check_cuda(cudaMemsetAsync(dbias.data, 0, static_cast<size_t>(cols * source_bytes(dbias.dtype)),
                               stream),
               "bias gradient: cudaMemsetAsync");
  }
  if (out.kind == kFusedPerTensor) {
    PerTensorQuantizeArgs a = out.per_tensor;
    a.input = nullptr;  // no element is read
    a.in_dtype = TE_DTYPE_FLOAT32;
    quantize_per_tensor(a, stream);
  }
  // Block scaling writes nothing for an empty tensor, and a high-precision result has no element.
}

}  // namespace fused
}  // namespace cuda
}  // namespace te
