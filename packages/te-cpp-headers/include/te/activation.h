/* te C API: activations (forward and backward, the output optionally quantized) and the fused
 * bias gradient.
 *
 * All math is fp32 whatever the storage dtype (fp32/fp16/bf16), with TE's formulas
 * (sigmoid(x) = 1 / (1 + expf(-x)); the sigmoid forms' quotients x / (1 + e) are +-0 where
 * 1 + e > 2^126, i.e. where the exact quotient is below |x| 2^-126):
 *   GELU   the tanh approximation 0.5 x (1 + tanh(u)), u = 0.79788456 (x + 0.044715 x^3),
 *          evaluated as x * sigmoid(2u) = x * (1 / (1 + exp2f(t))),
 *          t = x * (-2.30220819 - 0.102943242 x^2) = -log2(e) 2u (the same function with one
 *          exponential, and no cancellation for x << 0);
 *          GELU' = s + x * s * (1 - s) * (1.5957691 + 0.21406445 x^2), s = sigmoid(2u)
 *   RELU   max(x, 0), NaN stays NaN          SRELU  relu(x)^2
 *   SILU   x * sigmoid(x)                    QGELU  x * sigmoid(1.702 x)
 * Gated kinds take an input [..., 2N] and give [..., N]: the FIRST half a = input[..., :N] goes
 * through the activation, the SECOND half b = input[..., N:] is the linear (gate) part, out =
 * act(a) * b. This is TE's convention (its gated kernels read act input at i and gate at i + N),
 * so checkpoints and fused FC1 weights from TE keep their meaning.
 *   GEGLU = GELU, REGLU = RELU, SWIGLU = SILU, QGEGLU = QGELU, SREGLU = SRELU, GLU = sigmoid.
 * Backward: dx = grad * act'(x); gated: dx[a] = (grad * act'(a)) * b, dx[b] = grad * act(a).
 *
 * CLAMPED_SWIGLU (GPT-OSS's SwiGLU, TE's "clamped_swiglu"), with te_activation_config's limit L,
 * alpha and glu_linear_offset o (defaults 7, 1.702, 1: TE's):
 *   a' = min(a, L)   b' = clamp(b, -L, L)   s = sigmoid(alpha a')   out = (a' s) * (b' + o)
 *   dx[a] = (grad * (s + alpha a' s (1 - s))) * (b' + o) where a <= L, else 0
 *   dx[b] = grad * (a' s)                                 where -L <= b <= L, else 0
 * (the activation half is clamped from above only; the derivative at a == L or |b| == L is the
 * unclamped one, as TE's and torch.clamp's). A NaN is never clamped and counts as inside the
 * clamp for the masks, so it propagates (TE's fminf would turn it into L; torch.clamp's gradient
 * is 0 there). With alpha = 1.702, o = 0 and L = +inf it is QGEGLU.
 * The exponential and the sigmoid's divide are the backend's (CUDA: the special-function unit's
 * fast exp and divide), so the CUDA kernels match the CPU reference to a few fp32 ulps of each
 * term, not bit for bit.
 *
 * Output (forward y, backward dx) is a te_quantized_tensor, as in te/normalization.h: high
 * precision (rowwise_data only, fp32/fp16/bf16, PER_TENSOR mode, rounded to nearest even) or FP8
 * exactly as te_quantize quantizes the fp32 result (so PER_TENSOR with a column-wise copy is the
 * fused cast-transpose the next GEMM needs; BLOCK_1D gives both 1x128 copies). */
#ifndef TE_ACTIVATION_H_
#define TE_ACTIVATION_H_

#include "te/quantize.h"
#include "te/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Values are te's own, stable; gated kinds are 100 + n. */
typedef enum te_activation {
  TE_ACTIVATION_GELU = 0,
  TE_ACTIVATION_RELU = 1,
  TE_ACTIVATION_SILU = 2,
  TE_ACTIVATION_QGELU = 3,
  TE_ACTIVATION_SRELU = 4,
  TE_ACTIVATION_GEGLU = 100,
  TE_ACTIVATION_REGLU = 101,
  TE_ACTIVATION_SWIGLU = 102,
  TE_ACTIVATION_QGEGLU = 103,
  TE_ACTIVATION_SREGLU = 104,
  TE_ACTIVATION_GLU = 105,
  TE_ACTIVATION_CLAMPED_SWIGLU = 106
} te_activation;

/* The parameters of the parameterized kinds (today CLAMPED_SWIGLU's: TE's LayerNormMLP
 * activation_params); every other kind ignores them. Versioned as te_quant_config: a struct that
 * will grow, read as far as the caller's struct_size reaches. NULL means all defaults. */
typedef struct te_activation_config {
  uint32_t struct_size;    /* sizeof(te_activation_config) as compiled by the caller */
  float limit;             /* the clamp bound L: > 0 (+inf: no clamp); default 7 */
  float alpha;             /* the sigmoid's gain: finite; default 1.702 */
  float glu_linear_offset; /* added to the clamped linear half: finite; default 1 */
} te_activation_config;

static inline te_activation_config te_activation_config_init(void) {
  te_activation_config c;
  c.struct_size = (uint32_t)sizeof(te_activation_config);
  c.limit = 7.0f;
  c.alpha = 1.702f;
  c.glu_linear_offset = 1.0f;
  return c;
}

/* output = act(input). input [..., K] (K = 2N for gated kinds, else N); output [..., N].
 * `activation` is a te_activation; `config` (may be NULL) is read only for FP8 output.
 * The parameterized kinds take te_activation_config's defaults (te_activation_fwd_v2 sets them). */
TE_API te_status te_activation_fwd(const te_tensor* input, te_quantized_tensor* output,
                                   int32_t activation, const te_quant_config* config,
                                   void* stream);

/* dx = d act(input) . grad. grad [..., N]; input [..., K], the pre-activation; dx [..., K].
 * dbias: NULL or absent, or [K] (fp32/fp16/bf16) = the column sums of the fp32 dx (before dx is
 * rounded or quantized), reduced over rows in fp32 in a fixed order, then rounded. */
TE_API te_status te_activation_bwd(const te_tensor* grad, const te_tensor* input,
                                   te_quantized_tensor* dx, te_tensor* dbias, int32_t activation,
                                   const te_quant_config* config, void* stream);

/* te_activation_fwd / _bwd with the activation's parameters: `act_config` (may be NULL: the
 * defaults) is read as far as its struct_size reaches (checked for every kind); its values are
 * checked and used by the parameterized kinds and ignored by the others. With NULL these are
 * te_activation_fwd / _bwd. (New entry points rather than a changed signature: programs built
 * against te-core 0.1.0 keep calling the old ones.) */
TE_API te_status te_activation_fwd_v2(const te_tensor* input, te_quantized_tensor* output,
                                      int32_t activation, const te_activation_config* act_config,
                                      const te_quant_config* config, void* stream);

TE_API te_status te_activation_bwd_v2(const te_tensor* grad, const te_tensor* input,
                                      te_quantized_tensor* dx, te_tensor* dbias,
                                      int32_t activation, const te_activation_config* act_config,
                                      const te_quant_config* config, void* stream);

/* The bias gradient fused with the gradient's cast(-transpose): input [..., K] (fp32/fp16/bf16)
 * is quantized into `output` exactly as te_quantize does (FP8 only: PER_TENSOR with its optional
 * column-wise copy, BLOCK_1D/2D), and dbias [K] gets the column sums of input in fp32 (fixed
 * order), rounded to its dtype. The identity case of te_activation_bwd's dbias. */
TE_API te_status te_dbias_quantize(const te_tensor* input, te_quantized_tensor* output,
                                   te_tensor* dbias, const te_quant_config* config, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_ACTIVATION_H_ */
