/* te C API: amax, quantization, dequantization and transpose.
 *
 * Every function here dispatches on the device of its tensors: all tensors of one call must be on
 * the same device, CPU or one CUDA device. `stream` is a cudaStream_t for CUDA tensors (NULL is
 * the legacy default stream) and is ignored for CPU tensors. CUDA work is enqueued, never waited
 * for. The CPU backend is the reference the CUDA kernels match bit for bit.
 *
 * Numerics (NUMERICS.md): q = convert(x * scale) in fp32, round to nearest even, saturating
 * finite values and +-inf to +-max, NaN stays NaN; scale_inv = 1 / scale. MXFP8 and NVFP4 below. */
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
  /* ---- appended after te-core 0.1.0 (a caller whose struct_size ends above gets 0 for these) */
  /* MXFP8_1D / NVFP4_1D: one scale per 32x32 (MXFP8) or 16x16 (NVFP4) tile of the source instead
   * of per 1x32 / 1x16 run, so the row-wise and column-wise copies are the same quantization,
   * transposed (weights; NVFP4BlockScaling's default for them). Not with the Hadamard transform. */
  int32_t with_2d_quantization;
  /* NVFP4_1D only: round each element to E2M1 stochastically (gradients) instead of to nearest:
   * up with probability (|v| - lo) / (hi - lo), lo <= |v| < hi the neighbouring E2M1 magnitudes,
   * decided by the 32-bit word u of a Philox4x32-10 stream as u < frac * 2^32 (exact). Element n
   * of the row-wise copy (row-major index in that copy) takes word n, element n of the
   * column-wise copy word numel + n (with 2-D tiles both copies are the row-wise quantization and
   * use its words); word w is lane w % 4 of Philox4x32-10 with key
   * {lo32(rng_seed), hi32(rng_seed)} and counter {lo32(w / 4), hi32(w / 4), lo32(rng_offset),
   * hi32(rng_offset)}. So a (seed, offset) pair fixes every bit, on every device; give each
   * quantization of a step its own offset (any distinct value: each is a separate stream). */
  int32_t stochastic_rounding;
  uint64_t rng_seed;
  uint64_t rng_offset;
  /* Stochastic rounding only, optional: int64 [2] {seed, offset} on the input's device, read by
   * the kernel when it runs, in place of rng_seed / rng_offset (which are then ignored). For a
   * seed that is itself device data (a JAX key under jit, a step replayed from a CUDA graph):
   * the host never has to wait for it. The same (seed, offset) gives the same bits either way. */
  te_tensor rng_state;
  /* PER_TENSOR delayed scaling only (compute_scale = 0): 1 sets `amax` (required) to this call's
   * amax(x) instead of max-accumulating into it, for a caller whose amax buffer holds nothing
   * yet (a fresh XLA result: te_jax), where zeroing it first would cost the caller an op. */
  int32_t reset_amax;
} te_quant_config;

static inline te_quant_config te_quant_config_init(void) {
  te_quant_config c;
  unsigned char* p = (unsigned char*)&c;
  for (size_t i = 0; i < sizeof(c); ++i) p[i] = 0;
  c.struct_size = (uint32_t)sizeof(te_quant_config);
  return c;
}

/* amax[0] = max |x| over `input` (fp32/fp16/bf16), NaN if any element is NaN, 0 for an empty
 * tensor. `amax` is fp32 [1] (any shape with one element). */
TE_API te_status te_amax(const te_tensor* input, te_tensor* amax, void* stream);

/* Quantizes `input` (fp32/fp16/bf16, shape [..., K]) into the parts of `output` that are present.
 * output->scaling_mode picks the format (te_quantized_tensor's table); the data dtype is
 * FLOAT8_E4M3 or FLOAT8_E5M2 (FLOAT4_E2M1 for NVFP4_1D), both copies the same. PER_TENSOR with a
 * column-wise copy is the fused cast-transpose: one pass writes both copies. `config` may be NULL
 * (all defaults).
 *
 * MXFP8_1D (NUMERICS.md "MXFP8BlockScaling"): per block of 32 (or 32x32 tile), e = the E8M0 of
 * block_amax / fp8_max rounded up (fp32 exponent bits, +1 if any mantissa bit is set, capped at
 * 0xFE; amax 0 -> 0x00, NaN -> 0xFF), q = convert(x * 2^(127 - e)) (= x / scale_inv exactly; a
 * NaN scale makes the block NaN). Takes no amax/scale; use_existing_amax, force_pow2_scales and
 * amax_epsilon must be 0.
 *
 * NVFP4_1D (NUMERICS.md "NVFP4BlockScaling"): `amax` (fp32 [2]) receives each present copy's
 * global amax (NaN-propagating), or with use_existing_amax is read instead (with 2-D tiles both
 * copies are one quantization, encoded with amax[0], or amax[1] when only the column-wise copy
 * is present). Per copy S_enc from its amax (te_quantized_tensor's comment); per block of 16
 * (or 16x16 tile) s_block =
 * convert_e4m3((block_amax / 6) * S_enc), stored; enc = S_enc / s_block (0 if s_block is 0,
 * capped at FLT_MAX), q = convert_e2m1(x * enc): round to nearest even (or stochastically, see
 * te_quant_config), saturating to +-6, sign kept (-0 -> 0x8), NaN -> 0x7 (its block's scale is
 * NaN, so it decodes to NaN). With output->columnwise_rht the column-wise copy is quantized from
 * the Hadamard-transformed source (its amax and block amaxes after the transform); the transform
 * is a fixed sequence of fp32 adds (signs, then the radix-2 butterfly with strides 1, 2, 4, 8:
 * (a, b) -> (a + b, a - b), then * 1/4), so every backend gives the same bits. */
TE_API te_status te_quantize(const te_tensor* input, te_quantized_tensor* output,
                             const te_quant_config* config, void* stream);

/* x = q * scale_inv per element (per block), rounded to output's dtype (fp32/fp16/bf16).
 * Reads the row-wise copy if present, else the column-wise one (transposing back), so `output`
 * always has the source's shape [..., K]. Scales are read from the quantized tensor as stored.
 * MXFP8: x = q * 2^(e-127). NVFP4: x = (q * s_block) * s_global in fp32, s_global from the
 * copy's amax entry; a column-wise copy with columnwise_rht is transformed back (per run of 16:
 * the butterfly, * 1/4, then the signs) before the rounding. */
TE_API te_status te_dequantize(const te_quantized_tensor* input, te_tensor* output, void* stream);

/* output[k, m] = input[m, k] for input viewed as [M, K] (K the last dim) and output 2-D [K, M].
 * Any 1-, 2- or 4-byte dtype (FP8 data in particular); input and output dtypes must match. */
TE_API te_status te_transpose(const te_tensor* input, te_tensor* output, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_QUANTIZE_H_ */
