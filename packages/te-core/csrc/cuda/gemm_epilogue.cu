// te's GEMM epilogue and BGRAD row sums (gemm_epilogue.cuh has the contract). A fallback: one
// extra read and write of the fp32 product, so gemm.cu takes it only where cuBLASLt has no fused
// kernel, and logs that once.
#include "cuda/cuda_utils.cuh"
#include "cuda/gemm_epilogue.cuh"
#include "te/gemm.h"

namespace te {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

__device__ __forceinline__ float load_f(const void* p, int32_t dtype, int64_t i) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32: return static_cast<const float*>(p)[i];
    case TE_DTYPE_FLOAT16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

__device__ __forceinline__ void store_f(void* p, int32_t dtype, int64_t i, float v) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32: static_cast<float*>(p)[i] = v; break;
    case TE_DTYPE_FLOAT16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
  }
}

// The CPU reference's tanh-approximation gelu and derivative, each operation rounded on its own.
__device__ __forceinline__ float gelu_inner(float x) {
  const float x3 = __fmul_rn(__fmul_rn(x, x), x);
  return tanhf(__fmul_rn(kSqrt2OverPi, __fadd_rn(x, __fmul_rn(kGeluCoeff, x3))));
}

__device__ __forceinline__ float gelu(float x) {
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, gelu_inner(x)));
}

__device__ __forceinline__ float dgelu(float x) {
  const float t = gelu_inner(x);
  const float poly = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * kGeluCoeff, x), x));
  const float dt = __fmul_rn(__fmul_rn(kSqrt2OverPi, poly), __fsub_rn(1.0f, __fmul_rn(t, t)));
  return __fadd_rn(__fmul_rn(0.5f, __fadd_rn(1.0f, t)), __fmul_rn(__fmul_rn(0.5f, x), dt));
}

// kFmt: 0 for a high-precision output, else the FP8 dtype.
template <int kFmt>
__global__ void __launch_bounds__(kThreads) epilogue_kernel(const EpilogueParams p) {
  __shared__ uint32_t scratch[kThreads / 32];
  const int64_t total = p.m * p.n;
  const float scale = kFmt != 0 ? *p.d_scale : 1.0f;
  uint32_t amax = 0;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * kThreads) {
    float v = p.acc[idx];
    if (p.beta != 0.0f) v = __fadd_rn(v, __fmul_rn(p.beta, load_f(p.d, p.d_dtype, idx)));
    if (p.bias != nullptr) v = __fadd_rn(v, load_f(p.bias, p.bias_dtype, idx % p.n));
    if (p.epilogue == TE_EPILOGUE_GELU_AUX) {
      store_f(p.aux, p.aux_dtype, idx, v);
      v = gelu(v);
    } else if (p.epilogue == TE_EPILOGUE_DGELU) {
      v = __fmul_rn(v, dgelu(load_f(p.aux, p.aux_dtype, idx)));
    }
    if constexpr (kFmt != 0) {
      amax = max(amax, abs_bits(v));
      static_cast<uint8_t*>(p.d)[idx] = static_cast<uint8_t>(fp8x2<kFmt>(scaled(v, scale), 0.0f));
    } else {
      store_f(p.d, p.d_dtype, idx, v);
    }
  }
  if constexpr (kFmt != 0) {
    if (p.d_amax != nullptr) {
      amax = block_max<kThreads>(amax, scratch);
      if (threadIdx.x == 0) atomic_max_amax(p.d_amax, amax);
    }
  }
}

// op(A)[i, kk] dequantized, as csrc/cpu/gemm.cpp's element(): A stored [K, M] when trans.
__device__ __forceinline__ float operand_at(const GemmOperand& a, int64_t m, int64_t k, int64_t i,
                                            int64_t kk) {
  const int64_t sr = a.trans ? kk : i, sc = a.trans ? i : kk, cols = a.trans ? m : k;
  const int64_t idx = sr * cols + sc;
  if (a.dtype != TE_DTYPE_FLOAT8_E4M3 && a.dtype != TE_DTYPE_FLOAT8_E5M2)
    return load_f(a.data, a.dtype, idx);
  const uint8_t q = static_cast<const uint8_t*>(a.data)[idx];
  const float x = a.dtype == TE_DTYPE_FLOAT8_E4M3 ? fp8_to_float<TE_DTYPE_FLOAT8_E4M3>(q)
                                                  : fp8_to_float<TE_DTYPE_FLOAT8_E5M2>(q);
  float s;
  switch (a.scaling_mode) {
    case TE_SCALING_BLOCK_1D: s = a.scale_inv[(sc / 128) * a.scale_ld + sr]; break;
    case TE_SCALING_BLOCK_2D: s = a.scale_inv[(sr / 128) * a.scale_ld + sc / 128]; break;
    default: s = a.scale_inv[0];
  }
  return __fmul_rn(x, s);
}

// One thread per output row i, k in increasing order (the reference's order). With A stored
// [K, M] (wgrad's dy^T, the usual BGRAD operand) consecutive threads read consecutive bytes.
__global__ void __launch_bounds__(kThreads) row_sums_kernel(const GemmOperand a, int64_t m,
                                                            int64_t k, void* out, int32_t dtype) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= m) return;
  float s = 0.0f;
  for (int64_t kk = 0; kk < k; ++kk) s = __fadd_rn(s, operand_at(a, m, k, i, kk));
  store_f(out, dtype, i, s);
}

}  // namespace

void gemm_epilogue(const EpilogueParams& p, cudaStream_t stream) {
  const int64_t total = p.m * p.n;
  if (total == 0) return;
  int64_t blocks = ceil_div(total, kThreads);
  const int64_t cap = static_cast<int64_t>(sm_count()) * 8;
  if (blocks > cap) blocks = cap;
  switch (p.d_dtype) {
    case TE_DTYPE_FLOAT8_E4M3:
      epilogue_kernel<TE_DTYPE_FLOAT8_E4M3><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
      break;
    case TE_DTYPE_FLOAT8_E5M2:
      epilogue_kernel<TE_DTYPE_FLOAT8_E5M2><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
      break;
    default: epilogue_kernel<0><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  }
  check_launch("te_gemm epilogue_kernel");
}

void gemm_row_sums(const GemmOperand& a, int64_t m, int64_t k, void* out, int32_t out_dtype,
                   cudaStream_t stream) {
  if (m == 0) return;
  row_sums_kernel<<<static_cast<unsigned>(ceil_div(m, kThreads)), kThreads, 0, stream>>>(a, m, k, out,
                                                                                          out_dtype);
  check_launch("te_gemm row_sums_kernel");
}

}  // namespace cuda
}  // namespace te
