// Activation reference (te/activation.h has the contract): TE's fp32 formulas, elementwise, the
// gated kinds as act(first half) * second half (CLAMPED_SWIGLU: of the clamped halves, the
// linear one offset). The result goes through write_fused_output, so a quantized output is
// exactly te_quantize of the fp32 result.
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/kernels.h"
#include "cpu/fp_convert.h"
#include "cpu/fused_output.h"
#include "te/activation.h"

namespace te {
namespace cpu {
namespace {

// x / (1 + e) for the sigmoid forms. A denominator above 2^126 gives x * 0, as CUDA's fast divide
// does: the exact quotient is below |x| 2^-126 there, and the two backends must agree on whether a
// gate of inf then makes the product inf or NaN.
float div_1p(float x, float e) {
  const float d = 1.0f + e;
  return d > 0x1p126f ? x * 0.0f : x / d;
}

float sigmoid(float x) { return div_1p(1.0f, std::exp(-x)); }

// GELU's tanh approximation 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), evaluated as
// x sigmoid(2u) (the same function; one exp, no cancellation for x << 0), with
// sigmoid(2u) = 1 / (1 + 2^t) and t = -log2(e) 2u = x (kGeluT0 + kGeluT1 x^2): CUDA's formula
// (cuda/activation.cuh, whose exponential is base 2), so only the exponential and the divide
// differ between the backends.
constexpr float kGeluT0 = -2.30220819f;   // -log2(e) * 2 sqrt(2/pi)
constexpr float kGeluT1 = -0.102943242f;  // -log2(e) * 2 sqrt(2/pi) * 0.044715
float gelu_exp(float x, float x2) { return std::exp2(x * std::fma(kGeluT1, x2, kGeluT0)); }

// s (1 - s) as s - s^2 in one rounding (std::fma, as CUDA's __fmaf_rn: the two backends fuse the
// same products, so only the exponential and the divide differ).
float dsigmoid_of(float s) { return std::fma(-s, s, s); }

float dsigmoid(float x) { return dsigmoid_of(sigmoid(x)); }

// The activation of a gated kind's first half, or of a plain kind; and its derivative.
int32_t base_kind(int32_t activation) {
  switch (activation) {
    case TE_ACTIVATION_GEGLU: return TE_ACTIVATION_GELU;
    case TE_ACTIVATION_REGLU: return TE_ACTIVATION_RELU;
    case TE_ACTIVATION_SWIGLU: return TE_ACTIVATION_SILU;
    case TE_ACTIVATION_QGEGLU: return TE_ACTIVATION_QGELU;
    case TE_ACTIVATION_SREGLU: return TE_ACTIVATION_SRELU;
    case TE_ACTIVATION_GLU: return -1;  // sigmoid
    default: return activation;
  }
}

bool is_gated(int32_t activation) { return activation >= TE_ACTIVATION_GEGLU; }

float act(int32_t kind, float x) {
  switch (kind) {
    case TE_ACTIVATION_GELU:
      return x * div_1p(1.0f, gelu_exp(x, x * x));
    case TE_ACTIVATION_RELU: return x > 0.0f ? x : (x == x ? 0.0f : x);
    case TE_ACTIVATION_SILU: return x * sigmoid(x);
    case TE_ACTIVATION_QGELU: return x * sigmoid(1.702f * x);
    case TE_ACTIVATION_SRELU: return x > 0.0f ? x * x : (x == x ? 0.0f : x);
    default: return sigmoid(x);
  }
}

float dact(int32_t kind, float x) {
  switch (kind) {
    case TE_ACTIVATION_GELU: {  // s + x s (1 - s) d(2u)/dx
      const float x2 = x * x;
      const float s = div_1p(1.0f, gelu_exp(x, x2));
      return std::fma(x * dsigmoid_of(s), std::fma(0.21406445f, x2, 1.5957691f), s);
    }
    case TE_ACTIVATION_RELU: return x > 0.0f ? 1.0f : (x == x ? 0.0f : x);
    case TE_ACTIVATION_SILU: return std::fma(x, dsigmoid(x), sigmoid(x));
    case TE_ACTIVATION_QGELU: return std::fma(1.702f * x, dsigmoid(1.702f * x), sigmoid(1.702f * x));
    case TE_ACTIVATION_SRELU: return x > 0.0f ? 2.0f * x : (x == x ? 0.0f : x);
    default: return dsigmoid(x);
  }
}

// CLAMPED_SWIGLU at one element pair (a, b), in the CUDA kernels' operation order
// (cuda/activation.cuh's Clamped): a' = min(a, limit), b' = clamp(b, -limit, limit), NaN kept.
struct Clamped {
  float y, s, act, gate;  // alpha a', sigmoid(alpha a'), a' s, b' + glu_linear_offset

  Clamped(const ActivationParams& p, float a, float b) {
    const float ac = a > p.limit ? p.limit : a;
    y = p.alpha * ac;
    s = sigmoid(y);
    act = ac * s;
    const float bc = b > p.limit ? p.limit : (b < -p.limit ? -p.limit : b);
    gate = bc + p.glu_linear_offset;
  }
  // d(a' s)/da' (the caller zeroes it above the clamp; at a == limit it is kept, as TE's and
  // torch.clamp's gradients keep it)
  float dact() const { return std::fma(y, dsigmoid_of(s), s); }
};

}  // namespace

void activation_fwd(const ActivationFwdArgs& args, void* /*stream*/) {
  const int64_t rows = args.rows, cols = args.cols, in_cols = args.in_cols;
  const int32_t kind = base_kind(args.activation);
  const bool gated = is_gated(args.activation);
  const bool clamped = args.activation == TE_ACTIVATION_CLAMPED_SWIGLU;
  std::vector<float> y(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float a = load_as_float(args.input, args.in_dtype, r * in_cols + c);
      float v;
      if (clamped) {
        const float b = load_as_float(args.input, args.in_dtype, r * in_cols + cols + c);
        const Clamped k(args.params, a, b);
        v = k.act * k.gate;
      } else {
        v = act(kind, a);
        if (gated) v = v * load_as_float(args.input, args.in_dtype, r * in_cols + cols + c);
      }
      y[r * cols + c] = v;
    }
  }
  write_fused_output(args.out, y.data(), rows, cols);
}

void activation_bwd(const ActivationBwdArgs& args, void* /*stream*/) {
  const int64_t rows = args.rows, cols = args.cols, in_cols = args.in_cols;
  const int32_t kind = base_kind(args.activation);
  const bool gated = is_gated(args.activation);
  const bool clamped = args.activation == TE_ACTIVATION_CLAMPED_SWIGLU;
  const ActivationParams& p = args.params;
  std::vector<float> dx(static_cast<size_t>(rows * in_cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float g = load_as_float(args.grad, args.grad_dtype, r * cols + c);
      const float a = load_as_float(args.input, args.in_dtype, r * in_cols + c);
      if (clamped) {
        const float b = load_as_float(args.input, args.in_dtype, r * in_cols + cols + c);
        const Clamped k(p, a, b);
        dx[r * in_cols + c] = a > p.limit ? 0.0f : (g * k.dact()) * k.gate;
        dx[r * in_cols + cols + c] = b > p.limit || b < -p.limit ? 0.0f : g * k.act;
      } else if (gated) {
        const float b = load_as_float(args.input, args.in_dtype, r * in_cols + cols + c);
        dx[r * in_cols + c] = (g * dact(kind, a)) * b;
        dx[r * in_cols + cols + c] = g * act(kind, a);
      } else {
        dx[r * in_cols + c] = g * dact(kind, a);
      }
    }
  }
  if (args.dbias) write_column_sums(dx.data(), rows, in_cols, args.dbias, args.dbias_dtype);
  write_fused_output(args.dx, dx.data(), rows, in_cols);
}

}  // namespace cpu
}  // namespace te
