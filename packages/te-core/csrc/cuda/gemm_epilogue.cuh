// te's own GEMM epilogue, for the products cuBLASLt has no fused kernel for on this GPU (an fp32
// bias or bias gradient next to a 16-bit output, an fp32 bias on an FP8 product, an aux whose
// leading dimension is not a multiple of 8, E5M2 output from two E4M3 operands, ...). gemm.cu then
// asks cuBLASLt for the plain fp32 product and finishes here, with the CPU reference's order of
// operations (csrc/cpu/gemm.cpp): v = acc (+ beta * D_old) (+ bias); GELU_AUX stores v as aux and
// applies gelu; DGELU multiplies by dgelu(aux); then the output conversion (RNE, or FP8 with the
// output scale and its amax).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/kernels.h"

namespace te {
namespace cuda {

struct EpilogueParams {
  const float* acc;   // [M, N] alpha * op(A) op(B), fp32; may alias d when d is fp32
  int64_t m, n;
  float beta;         // applied here (0: D_old not read)
  void* d;            // [M, N], d_dtype
  int32_t d_dtype;
  const float* d_scale;  // FP8 output
  float* d_amax;         // FP8 output, or nullptr; max-accumulated
  int32_t epilogue;      // te_gemm_epilogue (BGRAD is row_sums' job)
  const void* bias;      // [N] or nullptr
  int32_t bias_dtype;
  void* aux;             // [M, N]
  int32_t aux_dtype;
};

void gemm_epilogue(const EpilogueParams& p, cudaStream_t stream);

// bias_grad[i] = sum over k of op(A)[i, k] (dequantized), in fp32 in increasing k, rounded once:
// the BGRAD epilogue when cuBLASLt cannot fuse it.
void gemm_row_sums(const GemmOperand& a, int64_t m, int64_t k, void* out, int32_t out_dtype,
                   cudaStream_t stream);

}  // namespace cuda
}  // namespace te
