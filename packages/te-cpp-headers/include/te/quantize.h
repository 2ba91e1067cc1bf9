/* te C API: amax, quantization, dequantization and transpose.
 *
 * Every function here dispatches on the device of its tensors: all tensors of one call must be on
 * the same device, CPU or one CUDA device. `stream` is a cudaStream_t for CUDA tensors (NULL is
 * the legacy default stream) and is ignored for CPU tensors. CUDA work is enqueued, never waited
 * for. The CPU backend is the reference the CUDA kernels match bit for bit.
 *
 * Numerics (NUMERICS.md): q = convert(x * scale) in fp32, round to nearest even, saturating
 * finite values and +-inf to +-max, NaN stays NaN; scale_inv = 1 / scale. */
#ifndef TE_QUANTIZE_H_
#define TE_QUANTIZE_H_

#include "te/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct te_quant_config {
  uint32_t struct_size; /* sizeof(te_quant_config) as compiled by the caller */
  /* PER_TENSOR only. 0: delayed scaling, `scale` is read, and `amax` (if present) is updated to
   * max(amax, amax(x)) so every quantization of a step lands in the same history slot.
   * 1: current scaling, the scale comes from this tensor's amax (written to `amax`, required) by
   * the rule below and is written to `scale` (if present). Block modes always compute scales. */
  int32_t compute_scale;
  /* PER_TENSOR current scaling only: take the amax already in `amax` (e.g. all-reduced across
   * ranks, or produced by the previous kernel) instead of reading the input for it. */
  int32_t use_existing_amax;
  /* Scale rule for current and block scaling: amax = max(amax, amax_epsilon); amax 0, inf or NaN
   * gives scale 1; else scale = fp8_max / amax (inf -> FLT_MAX); with force_pow2_scales the
   * mantissa bits are cleared (rounds down to a power of two). */
  int32_t force_pow2_scales;
  float amax_epsilon;
} te_quant_config;

static inline te_quant_config te_quant_config_init(void) {
  te_quant_config c;
  c.struct_size = (uint32_t)sizeof(te_quant_config);
  c.compute_scale = 0;
  c.use_existing_amax = 0;
  c.force_pow2_scales = 0;
  c.amax_epsilon = 0.0f;
  return c;
}

/* amax[0] = max |x| over `input` (fp32/fp16/bf16), NaN if any element is NaN, 0 for an empty
 * tensor. `amax` is fp32 [1] (any shape with one element). */
TE_API te_status te_amax(const te_tensor* input, te_tensor* amax, void* stream);

/* Quantizes `input` (fp32/fp16/bf16, shape [..., K]) into the parts of `output` that are present.
 * output->scaling_mode picks the format (te_quantized_tensor's table); the data dtype is
 * FLOAT8_E4M3 or FLOAT8_E5M2, both copies the same. PER_TENSOR with a column-wise copy is the
 * fused cast-transpose: one pass writes both copies. `config` may be NULL (all defaults).
 * MXFP8_1D and NVFP4_1D are reported as TE_ERROR_UNSUPPORTED in this version. */
TE_API te_status te_quantize(const te_tensor* input, te_quantized_tensor* output,
                             const te_quant_config* config, void* stream);

/* x = q * scale_inv per element (per block), rounded to output's dtype (fp32/fp16/bf16).
 * Reads the row-wise copy if present, else the column-wise one (transposing back), so `output`
 * always has the source's shape [..., K]. Scales are read from the quantized tensor as stored. */
TE_API te_status te_dequantize(const te_quantized_tensor* input, te_tensor* output, void* stream);

/* output[k, m] = input[m, k] for input viewed as [M, K] (K the last dim) and output 2-D [K, M].
 * Any 1-, 2- or 4-byte dtype (FP8 data in particular); input and output dtypes must match. */
TE_API te_status te_transpose(const te_tensor* input, te_tensor* output, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_QUANTIZE_H_ */
