/* te C API: LayerNorm and RMSNorm, forward (optionally fused with FP8 quantization of the output)
 * and backward.
 *
 * The input is viewed as M rows of H (its last dim; H >= 1, M may be 0). All math is fp32 whatever
 * the storage dtypes (fp32/fp16/bf16 for every high-precision tensor, chosen independently):
 *
 *   LayerNorm  mu = (sum x) / H;  var = (sum (x - mu)^2) / H        (two passes, not Welford)
 *   RMSNorm    var = (sum x^2) / H                                   (no mean)
 *   rsigma = 1.0f / sqrtf(var + eps)  (correctly rounded sqrt, then a correctly rounded divide;
 *                                      NOT rsqrtf: the CUDA kernel must use __fsqrt_rn/__fdiv_rn)
 *   g = gamma, or 1 + gamma with zero_centered_gamma (the fp32 sum)
 *   xhat = (x - mu) * rsigma            (RMSNorm: x * rsigma)
 *   y = fmaf(xhat, g, beta)              (without beta: xhat * g)
 *   evaluated in this order, each operation rounded once (fmaf: one rounding of xhat * g + beta)
 *
 * The forward's row sums run in index order in double on the CPU, rounded to fp32 once (an fp32
 * sum in index order loses ~1e-5 on rows with an outlier or a large offset); the CUDA backend
 * reduces in fp32 in another order, so mu, rsigma and y agree to fp32 rounding, not bit for bit.
 * The output is a
 * te_quantized_tensor: either
 *   - high precision: only rowwise_data, dtype fp32/fp16/bf16, scaling_mode PER_TENSOR, every
 *     other part absent; y is rounded to nearest even; or
 *   - FP8, exactly as te_quantize would quantize the fp32 y (same modes, parts, scale rules and
 *     te_quant_config; the result is bit-identical to a fp32 norm followed by te_quantize).
 *
 * Backward, with xhat = (x - mu) * rsigma (RMSNorm: x * rsigma) recomputed as in the forward,
 * dy = dz and dxhat = dy * g:
 *   LayerNorm  dx = rsigma * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
 *   RMSNorm    dx = rsigma * (dxhat - xhat * mean(dxhat * xhat))   (+ add, for _bwd_add)
 * evaluated as dx = fmaf(xhat, k1, rsigma * (dxhat - mean(dxhat))) with the row's k1 =
 * -(rsigma * mean(dxhat * xhat)) (RMSNorm: mean(dxhat) taken as 0), so that dxhat - mean(dxhat)
 * cancels exactly where a row's dxhat are equal;
 *   dgamma = sum over rows of dy * xhat;  dbeta = sum over rows of dy
 * dgamma and dbeta are reduced over rows in fp32 in a fixed order (deterministic run to run), then
 * rounded to their dtype. With zero_centered_gamma the gradient is with respect to the stored
 * gamma (the same numbers, since d(1 + gamma) = d gamma).
 *
 * Why a config struct and not plain eps/zero_centered_gamma arguments: TE has already grown this
 * call several times (sm_count, the cuDNN backend switch, zero-centered gamma in the weight dtype);
 * a struct_size-versioned te_norm_config takes such options later without an ABI break, and the
 * same struct serves forward and backward. NULL means all defaults (eps 1e-5, TE's default). */
#ifndef TE_NORMALIZATION_H_
#define TE_NORMALIZATION_H_

#include "te/quantize.h"
#include "te/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct te_norm_config {
  uint32_t struct_size;        /* sizeof(te_norm_config) as compiled by the caller */
  float eps;                   /* forward only: added to the variance; finite, >= 0 */
  int32_t zero_centered_gamma; /* 1: the weight applied is 1 + gamma */
} te_norm_config;

static inline te_norm_config te_norm_config_init(void) {
  te_norm_config c;
  c.struct_size = (uint32_t)sizeof(te_norm_config);
  c.eps = 1e-5f;
  c.zero_centered_gamma = 0;
  return c;
}

/* LayerNorm forward. input [..., H]; gamma [H]; beta [H] or absent (no bias); output as above,
 * shape [..., H]; mu and rsigma fp32 with M elements each, or absent (not written: inference).
 * `config` and `quant_config` may be NULL (defaults); quant_config is read only for FP8 output. */
TE_API te_status te_layernorm_fwd(const te_tensor* input, const te_tensor* gamma,
                                  const te_tensor* beta, te_quantized_tensor* output,
                                  te_tensor* mu, te_tensor* rsigma, const te_norm_config* config,
                                  const te_quant_config* quant_config, void* stream);

/* RMSNorm forward: te_layernorm_fwd without beta and mu. */
TE_API te_status te_rmsnorm_fwd(const te_tensor* input, const te_tensor* gamma,
                                te_quantized_tensor* output, te_tensor* rsigma,
                                const te_norm_config* config, const te_quant_config* quant_config,
                                void* stream);

/* LayerNorm backward. dz and x [..., H]; mu, rsigma fp32 with M elements (from the forward);
 * gamma [H]; writes dx [..., H] (x's shape or any with the same last dim and element count),
 * dgamma [H] and dbeta [H] (absent: not computed). Only config->zero_centered_gamma is read. */
TE_API te_status te_layernorm_bwd(const te_tensor* dz, const te_tensor* x, const te_tensor* mu,
                                  const te_tensor* rsigma, const te_tensor* gamma, te_tensor* dx,
                                  te_tensor* dgamma, te_tensor* dbeta,
                                  const te_norm_config* config, void* stream);

/* RMSNorm backward: dx [..., H] and dgamma [H]. */
TE_API te_status te_rmsnorm_bwd(const te_tensor* dz, const te_tensor* x, const te_tensor* rsigma,
                                const te_tensor* gamma, te_tensor* dx, te_tensor* dgamma,
                                const te_norm_config* config, void* stream);

/* RMSNorm backward that also adds `add` ([..., H], e.g. the residual branch's gradient) into dx,
 * in fp32 before dx is rounded: dx = rmsnorm_dx + add. */
TE_API te_status te_rmsnorm_bwd_add(const te_tensor* dz, const te_tensor* x, const te_tensor* add,
                                    const te_tensor* rsigma, const te_tensor* gamma, te_tensor* dx,
                                    te_tensor* dgamma, const te_norm_config* config, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_NORMALIZATION_H_ */
