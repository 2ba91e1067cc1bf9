// te_gemm's GELU_AUX and DGELU with an FP8 output on CUDA: cuBLASLt's GEMM, then te's activation
// kernel over its output, the launches te_gemm and te_activation_fwd / _bwd would make (DGELU's
// product in stream-ordered scratch). cuBLASLt's own epilogues are not used: its FP8-output GELU
// costs more in the GEMM than the separate pass and its DGELU has no FP8 output
// (benchmarks/NOTES.md, twenty-first session); neither writes a column-wise copy, and their gelu
// is not te's.
#include "common/kernels.h"
#include "common/validate.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/scratch.cuh"

namespace te {
namespace cuda {

void gemm_gelu(const GemmArgs& g, const ActivationFwdArgs& act, void* stream) {
  gemm(g, stream);
  activation_fwd(act, stream);
}

void gemm_dgelu(GemmArgs g, ActivationBwdArgs act, void* stream) {
  Scratch own(g.d == nullptr ? static_cast<size_t>(g.m * g.n * dtype_bits(g.d_dtype) / 8) : 0,
              as_stream(stream),
              "te scratch (te_gemm DGELU: the product before the activation pass)");
  if (g.d == nullptr) g.d = own.as<void>();
  act.grad = g.d;
  gemm(g, stream);
  activation_bwd(act, stream);
}

}  // namespace cuda
}  // namespace te
