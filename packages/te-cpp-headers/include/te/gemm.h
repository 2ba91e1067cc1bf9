/* te C API: matrix products, D = alpha * op(A) * op(B) + beta * D, with training epilogues.
 *
 * Row-major, as the math reads: op(A) is [M, K], op(B) is [K, N], D is [M, N].
 *   trans_a = 0: A is stored [M, K];  trans_a = 1: A is stored [K, M] and op(A) = A^T.
 *   trans_b = 0: B is stored [K, N];  trans_b = 1: B is stored [N, K] and op(B) = B^T.
 * A Linear layer y = x w^T is (A = x, B = w, trans_b = 1); its dgrad dx = dy w is (A = dy,
 * B = w); its wgrad dw = dy^T x is (A = dy, trans_a = 1, B = x).
 *
 * Operands are te_quantized_tensor. A high-precision operand (fp32/fp16/bf16) is its
 * rowwise_data alone (scaling mode PER_TENSOR, no scale_inv). A quantized operand's shape is
 * that of its source ([M, K] for A with trans_a = 0, ...). FP8 GEMMs read both operands with K
 * contiguous (Hopper's only FP8 layout): where op() needs the other orientation, te reads the
 * operand's column-wise copy, which the quantizer wrote in the same pass; it never transposes
 * per call. A quantized operand missing the copy a layout needs is an error that says which.
 *
 * Supported: fp32 x fp32, fp16 x fp16, bf16 x bf16; FP8 per-tensor E4M3 x E4M3, E4M3 x E5M2,
 * E5M2 x E4M3 (with scale_inv); FP8 block-scaled 1x128 x 128x128 and 1x128 x 1x128 (at most one
 * 2-D operand). Accumulation is fp32. The output D is fp32, fp16 or bf16, or per-tensor FP8
 * (rowwise_data E4M3/E5M2 with `scale` read; `amax`, if given, updated to max(amax, max |result|)
 * before the cast, NaN propagating, as te_quantize's delayed scaling updates it, so every FP8
 * result of a step lands in the same history slot; rowwise_scale_inv written 1/scale).
 *
 * GELU_AUX and DGELU with a per-tensor FP8 output are an MLP's activation fused with FC1's
 * forward GEMM and FC2's dgrad, quantized for the next GEMMs under delayed scaling: D is exactly
 * te_activation_fwd / te_activation_bwd's GELU output with D as that output (te/activation.h's
 * formulas; rowwise_data and, if given, columnwise_data [N, M], each with its scale_inv; d->scale
 * read, d->amax max-accumulated), and aux is fp32, fp16 or bf16:
 *   GELU_AUX  aux is written: the pre-activation alpha op(A) op(B) (+ bias, aux's dtype or fp32)
 *             rounded to aux's dtype; D = te_activation_fwd(aux).
 *   DGELU     aux is read: the saved pre-activation; the product alpha op(A) op(B), rounded to
 *             aux's dtype, is the gradient g, and D = te_activation_bwd(g, aux); bias_grad, if
 *             given ([N], fp32, fp16 or bf16), gets its dbias (the pre-activation's bias gradient).
 * (A high-precision D takes gelu / gelu' of the unrounded fp32 values by the tanh formula, as
 * cuBLASLt's epilogues do.)
 *
 * MXFP8 x MXFP8 and NVFP4 x NVFP4 (both operands of one family; mixing a family with per-tensor
 * or 1x128 FP8 is an error): the output is fp32, fp16 or bf16. Every backend runs the same
 * numerics by block dequantization: each operand element becomes float(q) * 2^(e-127) (MXFP8) or
 * (q * s_block) * s_global (NVFP4, s_global from the amax entry of the copy read) in fp32,
 * rounded to BF16, and the BF16 operands are multiplied with fp32 accumulation. On CUDA that is
 * two dequantize kernels into stream-ordered BF16 scratch and cuBLASLt's BF16 GEMM: correct, not
 * fast (logged once at INFO). Blackwell's native block-scaled kernels (cuBLASLt VEC32_UE8M0 /
 * VEC16_UE4M3) are not used yet. NVFP4 column-wise copies carrying the Hadamard transform
 * (te_quantized_tensor.columnwise_rht) are multiplied as stored: both operands of the product
 * must carry it (the wgrad of NVFP4BlockScaling) or neither.
 *
 * Runs on the device of its tensors: the CUDA backend through cuBLASLt (loaded at run time), the
 * CPU backend as the reference (fp32 accumulation of the dequantized operands). */
#ifndef TE_GEMM_H_
#define TE_GEMM_H_

#include "te/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum te_gemm_epilogue {
  TE_EPILOGUE_DEFAULT = 0,   /* D = alpha op(A) op(B) + beta D */
  TE_EPILOGUE_BIAS = 1,      /* ... + bias[N], broadcast over the M rows */
  TE_EPILOGUE_GELU_AUX = 2,  /* aux = the pre-activation (with bias if given); D = gelu(aux) */
  TE_EPILOGUE_DGELU = 3,     /* D = (alpha op(A) op(B)) * gelu'(aux), aux the saved pre-activation */
  TE_EPILOGUE_BGRAD = 4      /* bias_grad[i] = sum over k of op(A)[i, k] (dbias of a wgrad) */
} te_gemm_epilogue;

/* gelu is the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */

typedef struct te_gemm_config {
  uint32_t struct_size; /* sizeof(te_gemm_config) as compiled by the caller */
  int32_t trans_a;
  int32_t trans_b;
  float alpha;          /* default 1 */
  float beta;           /* default 0; 1 accumulates into D (e.g. an fp32 main_grad) */
  int32_t epilogue;     /* te_gemm_epilogue */
  te_tensor bias;       /* BIAS, GELU_AUX (optional): [N], the output's dtype or fp32 (FP8
                         * output: aux's dtype with GELU_AUX, else bf16; or fp32) */
  te_tensor aux;        /* GELU_AUX: written; DGELU: read. [M, N], the output's dtype (with an
                         * FP8 output: fp32, fp16 or bf16) */
  te_tensor bias_grad;  /* BGRAD: written, [M], the output's dtype or fp32 (DGELU with an FP8
                         * output: optional, [N], above) */
  /* FP8 only: 1 = promote partial sums to fp32 often (accurate; dgrad/wgrad default), 0 = fast
   * accumulation (fprop default). -1: 1, te's safe default. */
  int32_t use_split_accumulator;
  /* CUDA only: scratch for cuBLASLt, uint8, >= 32 MiB recommended; absent: te keeps one per
   * stream. */
  te_tensor workspace;
  /* ---- appended after te-core 0.1.0 (a caller whose struct_size ends above gets it absent) */
  /* DGELU with an FP8 output, optional: [M, N] of aux's dtype, where te keeps the product
   * between the GEMM and the activation pass when it runs them separately (absent: scratch of
   * te's own for the call). Its contents afterwards are unspecified; a kernel that does both in
   * one pass does not touch it. For a caller that holds such a buffer anyway. */
  te_tensor dgelu_product;
} te_gemm_config;

static inline te_gemm_config te_gemm_config_init(void) {
  te_gemm_config c;
  unsigned char* p = (unsigned char*)&c;
  for (size_t i = 0; i < sizeof(c); ++i) p[i] = 0;
  c.struct_size = (uint32_t)sizeof(te_gemm_config);
  c.alpha = 1.0f;
  c.use_split_accumulator = -1;
  return c;
}

TE_API te_status te_gemm(const te_quantized_tensor* a, const te_quantized_tensor* b,
                         te_quantized_tensor* d, const te_gemm_config* config, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_GEMM_H_ */
