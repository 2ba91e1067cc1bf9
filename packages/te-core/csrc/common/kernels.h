// The kernel interface both backends implement: te::cpu (csrc/cpu/, the reference) and te::cuda
// (csrc/cuda/). The C entry points in csrc/api/ validate every descriptor first, so a kernel may
// assume: pointers marked required are non-null, dtypes are the ones listed, shapes agree, all
// pointers are on one device and aligned to their element size. A kernel does no validation; it
// throws te::Error only for failures it alone can see (a CUDA launch error).
//
// Matrices are row-major: `rows` = numel / cols, `cols` = the source's last dimension.
// `stream` is a cudaStream_t for te::cuda and unused by te::cpu.
#pragma once

#include <cstdint>

namespace te {

// Source element types: TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16 or TE_DTYPE_BFLOAT16.
// FP8 element types: TE_DTYPE_FLOAT8_E4M3 or TE_DTYPE_FLOAT8_E5M2.

// Per-tensor FP8 quantization (delayed or current scaling), with an optional fused transpose.
struct PerTensorQuantizeArgs {
  const void* input;        // [rows, cols], in_dtype
  int32_t in_dtype;
  int64_t rows, cols;
  int32_t out_dtype;        // FP8
  void* rowwise;            // [rows, cols] or nullptr
  void* columnwise;         // [cols, rows] or nullptr (the transposed copy)
  float* rowwise_scale_inv;     // [1] or nullptr: written with 1 / scale
  float* columnwise_scale_inv;  // [1] or nullptr: written with 1 / scale
  float* amax;              // [1]; delayed: nullptr or max-accumulated (NaN propagates);
                            // current: required, written (or read, if use_existing_amax)
  float* scale;             // [1]; delayed: required, read; current: nullptr or written
  bool current;             // compute the scale from this tensor's amax
  bool use_existing_amax;   // current only: read *amax instead of computing it
  bool force_pow2_scales;
  float amax_epsilon;
};

// Float8BlockScaling: 1x128 (block_dim 1) or 128x128 (block_dim 2) blocks, fp32 scales.
// Scale layouts (te/tensor.h), with ld = rowwise_scale_ld / columnwise_scale_ld:
//   1-D row-wise    scale_inv[col_block * ld + row]
//   1-D column-wise scale_inv[row_block * ld + col]   (col: row of the transposed copy)
//   2-D row-wise    scale_inv[row_tile * ld + col_tile]
//   2-D column-wise scale_inv[col_tile * ld + row_tile] (the same tile scales, transposed)
// Padding is never written.
struct BlockQuantizeArgs {
  const void* input;        // [rows, cols], in_dtype
  int32_t in_dtype;
  int64_t rows, cols;
  int32_t out_dtype;        // FP8
  int32_t block_dim;        // 1 or 2
  void* rowwise;            // [rows, cols] or nullptr
  float* rowwise_scale_inv; // required iff rowwise
  int64_t rowwise_scale_ld;
  void* columnwise;         // [cols, rows] or nullptr
  float* columnwise_scale_inv;  // required iff columnwise
  int64_t columnwise_scale_ld;
  bool force_pow2_scales;
  float amax_epsilon;
};

struct DequantizeArgs {
  int32_t scaling_mode;     // TE_SCALING_PER_TENSOR, _BLOCK_1D or _BLOCK_2D
  const void* data;         // FP8; [rows, cols], or [cols, rows] if transposed
  int32_t data_dtype;
  bool transposed;          // data is the column-wise copy
  const float* scale_inv;   // [1] or the block layout of that copy
  int64_t scale_ld;         // leading dimension of a block scale_inv
  int64_t rows, cols;       // the source's matrix shape
  void* output;             // [rows, cols], out_dtype (fp32/fp16/bf16)
  int32_t out_dtype;
};

// Delayed-scaling update (te/recipe.h); scaled_max = fp8_max * 2^-margin, computed by the caller
// on the host so both backends use the same value.
struct DelayedScalingEntry {
  float* amax_history;      // [history_len, num]: the next history (in place: also the old one)
  float* scale;             // [num]: the next scales
  int64_t history_len;
  int64_t num;
  float scaled_max;         // fp8_max * 2^-margin of this entry's format
  int32_t amax_compute_algo;
  // Out of place (te_delayed_scaling_next_groups): the old history and scales, never written
  // and not overlapping the outputs; nullptr updates amax_history and scale in place.
  const float* history_in = nullptr;
  const float* scale_in = nullptr;
  // nullptr, or [num]: this step's amaxes, folded in first as history[0] = max(history[0], amax)
  const float* amax = nullptr;
};

// One GEMM operand as the kernel reads it: the API has already picked the copy (row-wise or
// column-wise) that gives the layout below, so `trans` describes the chosen data.
struct GemmOperand {
  const void* data;
  int32_t dtype;            // fp32/fp16/bf16, or FP8 with scale_inv
  int32_t scaling_mode;     // PER_TENSOR (also high precision: scale_inv == nullptr), BLOCK_1D/2D
  bool trans;               // A: stored [K, M] (else [M, K]); B: stored [N, K] (else [K, N])
  const float* scale_inv;   // [1] per-tensor; block layout of te/tensor.h for the chosen copy
  int64_t scale_ld;         // leading dimension of a block scale_inv (also of mx_scale_inv)
  // MXFP8_1D / NVFP4_1D (kernels_mx.h): the chosen copy's E8M0 / E4M3 scales, scale_ld per
  // stored row, and for NVFP4 the fp32 global amax that copy was encoded with.
  const uint8_t* mx_scale_inv;
  const float* global_amax;
};

// D[M, N] = alpha op(A)[M, K] op(B)[K, N] + beta D, then the epilogue (te/gemm.h).
struct GemmArgs {
  int64_t m, n, k;
  GemmOperand a, b;
  float alpha, beta;
  void* d;                  // [M, N] row-major
  int32_t d_dtype;          // fp32/fp16/bf16, or FP8
  const float* d_scale;     // FP8 output: [1], read
  float* d_amax;            // FP8 output: [1] or nullptr, written max |result| before the cast
  float* d_scale_inv;       // FP8 output: [1] or nullptr, written 1 / scale
  int32_t epilogue;         // te_gemm_epilogue
  const void* bias;         // [N] or nullptr
  int32_t bias_dtype;
  void* aux;                // [M, N]: GELU_AUX writes, DGELU reads
  int32_t aux_dtype;
  void* bias_grad;          // [M]: BGRAD writes
  int32_t bias_grad_dtype;
  bool split_accumulator;   // FP8 only
  void* workspace;          // CUDA only; nullptr: the backend's own per stream
  int64_t workspace_bytes;
};

// Where a fused op puts its fp32 result [rows, cols]: rounded (RNE) into a high-precision buffer,
// or quantized by exactly the rules of quantize_per_tensor / quantize_block, whose args the API
// filled from the output descriptor (rows, cols, out_dtype, copies, scales); their `input` and
// `in_dtype` are left for the kernel to point at its own fp32 result.
enum FusedOutputKind : int32_t { kFusedHighPrecision = 0, kFusedPerTensor = 1, kFusedBlock = 2 };
struct FusedOutput {
  int32_t kind;             // FusedOutputKind
  void* data;               // high precision: [rows, cols]
  int32_t dtype;            // high precision: fp32/fp16/bf16
  PerTensorQuantizeArgs per_tensor;
  BlockQuantizeArgs block;
  bool reset_amax;          // per tensor, delayed: zero per_tensor.amax before the kernel runs
};

// LayerNorm / RMSNorm forward (te/normalization.h has the formulas).
struct NormFwdArgs {
  bool rms;                 // RMSNorm: no mean, no beta, mu unused
  const void* input;        // [rows, cols], in_dtype
  int32_t in_dtype;
  int64_t rows, cols;
  const void* gamma;        // [cols]
  int32_t gamma_dtype;
  const void* beta;         // [cols] or nullptr (no bias)
  int32_t beta_dtype;
  float eps;
  bool zero_centered_gamma;
  FusedOutput out;          // y [rows, cols]
  float* mu;                // [rows] or nullptr
  float* rsigma;            // [rows] or nullptr
};

// LayerNorm / RMSNorm backward. dgamma/dbeta: fp32 sums over rows in a fixed order.
struct NormBwdArgs {
  bool rms;
  const void* dz;           // [rows, cols]
  int32_t dz_dtype;
  const void* x;            // [rows, cols]
  int32_t x_dtype;
  int64_t rows, cols;
  const float* mu;          // [rows]; LayerNorm only
  const float* rsigma;      // [rows]
  const void* gamma;        // [cols]
  int32_t gamma_dtype;
  bool zero_centered_gamma;
  const void* add;          // [rows, cols] or nullptr: added into dx in fp32
  int32_t add_dtype;
  void* dx;                 // [rows, cols]
  int32_t dx_dtype;
  void* dgamma;             // [cols]
  int32_t dgamma_dtype;
  void* dbeta;              // [cols] or nullptr
  int32_t dbeta_dtype;
};

// Activations (te/activation.h). in_cols = 2 * cols for gated kinds (act half first), else cols.
// The parameters of the parameterized kinds (te_activation_config; CLAMPED_SWIGLU's), checked by
// the API; other kinds ignore them.
struct ActivationParams {
  float limit = 7.0f;
  float alpha = 1.702f;
  float glu_linear_offset = 1.0f;
};

struct ActivationFwdArgs {
  int32_t activation;       // te_activation
  ActivationParams params;
  const void* input;        // [rows, in_cols]
  int32_t in_dtype;
  int64_t rows, cols;       // the output's
  int64_t in_cols;
  FusedOutput out;          // [rows, cols]
};

struct ActivationBwdArgs {
  int32_t activation;
  ActivationParams params;
  const void* grad;         // [rows, cols]
  int32_t grad_dtype;
  const void* input;        // [rows, in_cols], the pre-activation
  int32_t in_dtype;
  int64_t rows, cols;       // grad's
  int64_t in_cols;
  FusedOutput dx;           // [rows, in_cols]
  void* dbias;              // [in_cols] or nullptr: column sums of the fp32 dx
  int32_t dbias_dtype;
};

// Bias gradient fused with the gradient's quantization (cast-transpose): out is FP8.
struct DbiasQuantizeArgs {
  const void* input;        // [rows, cols]
  int32_t in_dtype;
  int64_t rows, cols;
  FusedOutput out;          // kind kFusedPerTensor or kFusedBlock
  void* dbias;              // [cols]: column sums of input in fp32
  int32_t dbias_dtype;
};

// Each kernel exists in both namespaces with the same signature.
#define TE_DECLARE_KERNELS                                                                     \
  void amax(const void* input, int32_t in_dtype, int64_t numel, float* amax, void* stream);     \
  void quantize_per_tensor(const PerTensorQuantizeArgs& args, void* stream);                    \
  void quantize_block(const BlockQuantizeArgs& args, void* stream);                             \
  void dequantize(const DequantizeArgs& args, void* stream);                                    \
  void transpose(const void* input, void* output, int64_t rows, int64_t cols,                   \
                 int32_t elem_bytes, void* stream);                                             \
  void delayed_scaling_update(const DelayedScalingEntry* entries, int64_t count, void* stream); \
  void gemm(const GemmArgs& args, void* stream);                                                \
  /* te_gemm's GELU_AUX with an FP8 output: the GEMM `g` into the pre-activation, then `act`   */ \
  void gemm_gelu(const GemmArgs& g, const ActivationFwdArgs& act, void* stream);                \
  /* DGELU with an FP8 output: the GEMM `g` (d, the product's [M, N] buffer of g.d_dtype, or  */ \
  /* nullptr: the backend's own; act.grad set to it), then `act`                               */ \
  void gemm_dgelu(GemmArgs g, ActivationBwdArgs act, void* stream);                             \
  void norm_fwd(const NormFwdArgs& args, void* stream);                                         \
  void norm_bwd(const NormBwdArgs& args, void* stream);                                         \
  void activation_fwd(const ActivationFwdArgs& args, void* stream);                             \
  void activation_bwd(const ActivationBwdArgs& args, void* stream);                             \
  void dbias_quantize(const DbiasQuantizeArgs& args, void* stream);

namespace cpu {
TE_DECLARE_KERNELS
}
namespace cuda {
TE_DECLARE_KERNELS
// Number of usable CUDA devices: 0 without a GPU or driver (cached after the first call).
int32_t device_count();
inline bool available() { return device_count() > 0; }
// Makes `device` current for this thread for the rest of the call.
void set_device(int32_t device);
}

#undef TE_DECLARE_KERNELS

}  // namespace te
