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
  TE_ACTIVATION_GLU = 105
} te_activation;

/* output = act(input). input [..., K] (K = 2N for gated kinds, else N); output [..., N].
 * `activation` is a te_activation; `config` (may be NULL) is read only for FP8 output. */
TE_API te_status te_activation_fwd(const te_tensor* input, te_quantized_tensor* output,
                                   int32_t activation, const te_quant_config* config,
                                   void* stream);

/* dx = d act(input) . grad. grad [..., N]; input [..., K], the pre-activation; dx [..., K].
 * dbias: NULL or absent, or [K] (fp32/fp16/bf16) = the column sums of the fp32 dx (before dx is
 * rounded or quantized), reduced over rows in fp32 in a fixed order, then rounded. */
TE_API te_status te_activation_bwd(const te_tensor* grad, const te_tensor* input,
                                   te_quantized_tensor* dx, te_tensor* dbias, int32_t activation,
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
