// The MXFP8 / NVFP4 part of the kernel interface (kernels.h states the common assumptions: the C
// entry points have validated everything, matrices are row-major [rows, cols]). Each kernel
// exists in te::cpu (the reference) and te::cuda with the same signature.
//
// Layouts (te/tensor.h): a copy is stored [R, C] (the row-wise copy [rows, cols], the column-wise
// copy [cols, rows]); its block scales are one byte each at scale_inv[r * ld + c / block] for
// stored element (r, c), row-major, the table padded to 128 x 4 and the padding never written.
// E2M1 data packs stored element i of the copy into byte i / 2, the low nibble for even i; every
// stored row has an even length, so rows start on bytes.
#pragma once

#include <cstdint>

#include "common/kernels.h"

namespace te {

// MXFP8: 1x32 blocks along each copy's stored rows, or 32x32 tiles of the source (tile_2d), E8M0
// scales (common/mx_scaling.h), q = convert(x * e8m0_encode_factor(e)).
struct Mxfp8QuantizeArgs {
  const void* input;        // [rows, cols], in_dtype
  int32_t in_dtype;
  int64_t rows, cols;
  int32_t out_dtype;        // FP8
  uint8_t* rowwise;         // [rows, cols] or nullptr
  uint8_t* rowwise_scale_inv;   // E8M0, required iff rowwise
  int64_t rowwise_scale_ld;
  uint8_t* columnwise;      // [cols, rows] or nullptr
  uint8_t* columnwise_scale_inv;  // E8M0, required iff columnwise
  int64_t columnwise_scale_ld;
  bool tile_2d;
};

// NVFP4: 1x16 blocks along each copy's stored rows, or 16x16 tiles of the source (tile_2d; then
// the column-wise copy is the row-wise quantization transposed), E4M3 block scales and a global
// scale per copy from its amax entry (common/mx_scaling.h).
struct Nvfp4QuantizeArgs {
  const void* input;        // [rows, cols], in_dtype
  int32_t in_dtype;
  int64_t rows, cols;
  uint8_t* rowwise;         // [rows, cols] E2M1 (cols even) or nullptr
  uint8_t* rowwise_scale_inv;   // E4M3, required iff rowwise
  int64_t rowwise_scale_ld;
  uint8_t* columnwise;      // [cols, rows] E2M1 (rows even) or nullptr
  uint8_t* columnwise_scale_inv;  // E4M3, required iff columnwise
  int64_t columnwise_scale_ld;
  float* amax;              // [2]: [0] the row-wise copy's global amax, [1] the column-wise one's;
                            // the present copies' entries are written, or read (use_existing_amax)
  bool use_existing_amax;
  bool tile_2d;
  bool columnwise_rht;      // the column-wise copy is of the transformed source (rows % 16 == 0)
  bool stochastic_rounding;
  uint64_t rng_seed, rng_offset;
  const uint64_t* rng_state;  // [2] {seed, offset} on the input's device, read in place of
                              // rng_seed / rng_offset; or nullptr
};

// Dequantization of one MXFP8 or NVFP4 copy into out [rows, cols] (fp32/fp16/bf16): the element
// in fp32 (MXFP8 float(q) * e8m0_value(e); NVFP4 (q * s_block) * s_global), the inverse Hadamard
// transform over runs of 16 along the source's rows where undo_rht, then one rounding.
struct MxDequantizeArgs {
  int32_t scaling_mode;     // TE_SCALING_MXFP8_1D or TE_SCALING_NVFP4_1D
  const uint8_t* data;      // [rows, cols], or [cols, rows] if transposed
  int32_t data_dtype;       // FP8 (MXFP8) or E2M1 (NVFP4)
  bool transposed;          // data is the column-wise copy
  const uint8_t* scale_inv; // the copy's scales
  int64_t scale_ld;
  const float* global_amax; // NVFP4: the copy's amax entry; MXFP8: nullptr
  bool undo_rht;            // NVFP4, transposed only: the copy carries the transform; undo it
  int64_t rows, cols;       // the output's (the source's) matrix shape
  void* output;             // [rows, cols]
  int32_t out_dtype;
};

#define TE_DECLARE_MX_KERNELS                                           \
  void quantize_mxfp8(const Mxfp8QuantizeArgs& args, void* stream);     \
  void quantize_nvfp4(const Nvfp4QuantizeArgs& args, void* stream);     \
  void dequantize_mx(const MxDequantizeArgs& args, void* stream);

namespace cpu {
TE_DECLARE_MX_KERNELS
}
namespace cuda {
TE_DECLARE_MX_KERNELS
// te_gemm with MXFP8 / NVFP4 operands (GemmOperand's mx_scale_inv / global_amax set): each
// operand's chosen copy is dequantized to BF16 in stream-ordered scratch, then the BF16 te::cuda
// gemm runs (gemm_mx.cu).
void gemm_mx(const GemmArgs& args, void* stream);
}

#undef TE_DECLARE_MX_KERNELS

}  // namespace te
