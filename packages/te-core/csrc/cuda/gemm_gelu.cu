// te_gemm's GELU_AUX with an FP8 output on CUDA: cuBLASLt's GEMM into the pre-activation (with
// the bias epilogue), then te's activation kernel from it into the FP8 copies, the two launches
// te_gemm and te_activation_fwd would make. cuBLASLt's own FP8-output GELU epilogue is not used:
// it costs more in the GEMM than the separate pass (benchmarks/NOTES.md, twenty-first session),
// writes no column-wise copy, and its gelu is not te's.
#include "common/kernels.h"

namespace te {
namespace cuda {

void gemm_gelu(const GemmArgs& g, const ActivationFwdArgs& act, void* stream) {
  gemm(g, stream);
  activation_fwd(act, stream);
}

}  // namespace cuda
}  // namespace te
