// Activations on CUDA (te/activation.h has the contract; cpu/activation.cpp is the reference):
// the fp32 math shared by activation_fwd.cu and activation_bwd.cu (two files so the two sets of
// kernels, each one per base activation and output mode, compile in parallel).
//
// The formulas are the reference's, operation for operation: every multiply, add and fused
// multiply-add is an explicit round-to-nearest intrinsic (__fmul_rn, __fmaf_rn ...), which nvcc
// never contracts or splits, and the reference makes the same calls (std::fma). The only
// differences from the CPU are the exponential and the one divide of the sigmoid forms, which run
// on the special-function unit (exp_sfu: __expf's 2 + 1.16|x| ulps; div_1p: __fdividef's 2 ulps):
// CUDA's accurate tanhf or expf + IEEE divide cost 2-3x their instructions (GELU: 25 per element
// against 9), and these passes are bound by instruction issue (NOTES.md). Every kernel that
// evaluates them (the flat pass, the tile kernel) gets the same bits: a quantized output is
// exactly te_quantize of this backend's own fp32 result.
//
// Kernels are instantiated per base activation (GELU, RELU, SILU, QGELU, SRELU, sigmoid, and
// CLAMPED_SWIGLU's clamped SiLU, whose gate half is clamped and offset too), gating and output
// mode; the dtypes of grad and input are run-time values (uniform branches once per 8
// elements), which keeps the instantiation count and the build time down.
// The loaders (activation_*.cu) plug the math into cuda/fused_output.cuh, which picks the passes.
// They rely on: zero inputs give a +-0 result for every kind (act(0) = 0 for the plain kinds, a
// zero gate or a zero grad elsewhere, and act/dact are finite at 0; CLAMPED_SWIGLU's gate at
// b = 0 is its finite offset), so the zero-filled tail of a partial unit never raises a max or a
// column sum.
#pragma once

#include "common/error.h"
#include "common/kernels.h"
#include "cuda/cuda_utils.cuh"
#include "te/activation.h"

namespace te {
namespace cuda {
namespace activation {

// The activation of a plain kind, and of a gated kind's first half (GLU's is the sigmoid).
enum Base : int { kGelu, kRelu, kSilu, kQgelu, kSrelu, kSigmoid, kClampedSilu };

// 2^t: ex2.approx with ftz. Its non-ftz form guards results below 2^-126 (3 more instructions
// per call, ncu / SASS: NOTES.md); every use below feeds 1 + 2^t, to which such a result adds
// nothing.
__device__ __forceinline__ float exp2_sfu(float t) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(t));
  return y;
}

// __expf(x): 2^t at t = x * log2(e) rounded to fp32, so the bits are __expf's.
__device__ __forceinline__ float exp_sfu(float x) { return exp2_sfu(__fmul_rn(x, 1.44269502f)); }

// 1 / d for d = 1 + e^z >= 1 (or NaN): __fdividef's reciprocal (rcp.approx) without its guard
// for a denormal d, which d >= 1 never is. A reciprocal below 2^-126 (d > 2^126) is 0; the CPU
// reference's div_1p does the same.
__device__ __forceinline__ float rcp_1p(float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return r;
}

// x / d for the same d (__fdividef(x, d) without the guard: 4 instructions fewer per call).
__device__ __forceinline__ float div_1p(float x, float d) { return __fmul_rn(x, rcp_1p(d)); }

// 1 / (1 + e^-x): the reciprocal itself, not 1 * reciprocal (ptxas keeps an explicit
// round-to-nearest multiply by 1: one instruction per element in SASS, NOTES.md).
__device__ __forceinline__ float sigmoid(float x) { return rcp_1p(__fadd_rn(1.0f, exp_sfu(-x))); }

// GELU's tanh approximation 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), as
// x sigmoid(2u) (the same function; one exponential, no cancellation for x << 0), with
// sigmoid(2u) = 1 / (1 + 2^t) and t = -log2(e) 2u = x (kGeluT0 + kGeluT1 x^2): the constants
// carry the -log2(e), so no multiply scales the exponent (one instruction per element fewer).
constexpr float kGeluT0 = -2.30220819f;   // -log2(e) * 2 sqrt(2/pi)
constexpr float kGeluT1 = -0.102943242f;  // -log2(e) * 2 sqrt(2/pi) * 0.044715
__device__ __forceinline__ float gelu_sigmoid_of(float x, float x2) {
  return rcp_1p(__fadd_rn(1.0f, exp2_sfu(__fmul_rn(x, __fmaf_rn(kGeluT1, x2, kGeluT0)))));
}

// s (1 - s) from s = sigmoid(x), as s - s^2 in one rounding.
__device__ __forceinline__ float dsigmoid_of(float s) { return __fmaf_rn(-s, s, s); }

// x for x > 0, else 0, NaN staying NaN.
__device__ __forceinline__ float relu_or(float x, float positive) {
  return x > 0.0f ? positive : (x == x ? 0.0f : x);
}

template <int kBase>
__device__ __forceinline__ float act(float x) {
  if constexpr (kBase == kGelu) {
    return __fmul_rn(x, gelu_sigmoid_of(x, __fmul_rn(x, x)));
  } else if constexpr (kBase == kRelu) {
    return relu_or(x, x);
  } else if constexpr (kBase == kSilu) {
    return __fmul_rn(x, sigmoid(x));
  } else if constexpr (kBase == kQgelu) {
    return __fmul_rn(x, sigmoid(__fmul_rn(1.702f, x)));
  } else if constexpr (kBase == kSrelu) {
    return relu_or(x, __fmul_rn(x, x));
  } else {
    return sigmoid(x);
  }
}

template <int kBase>
__device__ __forceinline__ float dact(float x) {
  if constexpr (kBase == kGelu) {
    // s + x s (1 - s) d(2u)/dx, x^2 shared by 2u and its derivative
    const float x2 = __fmul_rn(x, x);
    const float s = gelu_sigmoid_of(x, x2);
    const float d2u = __fmaf_rn(0.21406445f, x2, 1.5957691f);
    return __fmaf_rn(__fmul_rn(x, dsigmoid_of(s)), d2u, s);
  } else if constexpr (kBase == kRelu) {
    return relu_or(x, 1.0f);
  } else if constexpr (kBase == kSilu) {
    const float s = sigmoid(x);
    return __fmaf_rn(x, dsigmoid_of(s), s);
  } else if constexpr (kBase == kQgelu) {
    const float y = __fmul_rn(1.702f, x);
    const float s = sigmoid(y);
    return __fmaf_rn(y, dsigmoid_of(s), s);
  } else if constexpr (kBase == kSrelu) {
    return relu_or(x, __fmul_rn(2.0f, x));
  } else {
    return dsigmoid_of(sigmoid(x));
  }
}

// CLAMPED_SWIGLU at one element pair (a, b) (te/activation.h; the loaders apply its gradient's
// masks): a' = min(a, limit), b' = clamp(b, -limit, limit), a NaN kept (the comparisons are
// false for it). The CPU reference's Clamped, operation for operation.
struct Clamped {
  float y, s, act, gate;  // alpha a', sigmoid(alpha a'), a' s, b' + glu_linear_offset

  __device__ __forceinline__ Clamped(const ActivationParams& p, float a, float b) {
    const float ac = a > p.limit ? p.limit : a;
    y = __fmul_rn(p.alpha, ac);
    s = sigmoid(y);
    act = __fmul_rn(ac, s);
    const float bc = b > p.limit ? p.limit : (b < -p.limit ? -p.limit : b);
    gate = __fadd_rn(bc, p.glu_linear_offset);
  }
  // d(a' s)/da', unmasked
  __device__ __forceinline__ float dact() const { return __fmaf_rn(y, dsigmoid_of(s), s); }
};

// Calls f(IntC<base>{}, IntC<gated>{}) for a te_activation (the API validated it). Gated is a
// compile-time value: a plain kind's loaders then hold no gate registers and its backward
// computes only act'(x), which is what lets its kernels run more CTAs per SM.
template <typename F>
inline void with_base(int32_t activation, F&& f) {
  switch (activation) {
    case TE_ACTIVATION_GELU: f(IntC<kGelu>{}, IntC<0>{}); break;
    case TE_ACTIVATION_RELU: f(IntC<kRelu>{}, IntC<0>{}); break;
    case TE_ACTIVATION_SILU: f(IntC<kSilu>{}, IntC<0>{}); break;
    case TE_ACTIVATION_QGELU: f(IntC<kQgelu>{}, IntC<0>{}); break;
    case TE_ACTIVATION_SRELU: f(IntC<kSrelu>{}, IntC<0>{}); break;
    case TE_ACTIVATION_GEGLU: f(IntC<kGelu>{}, IntC<1>{}); break;
    case TE_ACTIVATION_REGLU: f(IntC<kRelu>{}, IntC<1>{}); break;
    case TE_ACTIVATION_SWIGLU: f(IntC<kSilu>{}, IntC<1>{}); break;
    case TE_ACTIVATION_QGEGLU: f(IntC<kQgelu>{}, IntC<1>{}); break;
    case TE_ACTIVATION_SREGLU: f(IntC<kSrelu>{}, IntC<1>{}); break;
    case TE_ACTIVATION_GLU: f(IntC<kSigmoid>{}, IntC<1>{}); break;
    case TE_ACTIVATION_CLAMPED_SWIGLU: f(IntC<kClampedSilu>{}, IntC<1>{}); break;
    default: fail(TE_ERROR_INTERNAL, "CUDA activation: unexpected kind ", activation);
  }
}

// Whether rows of `elems` elements of `bytes` each start 16-byte aligned after `p`.
inline bool vec_rows(const void* p, int64_t elems, int64_t bytes) {
  return aligned(p, 16) && (elems * bytes) % 16 == 0;
}

}  // namespace activation
}  // namespace cuda
}  // namespace te
