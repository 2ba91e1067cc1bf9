// te_gemm's GELU_AUX with an FP8 output, the reference: the GEMM into the pre-activation (rounded
// to its dtype), then the activation of that stored pre-activation into the FP8 copies, so the
// bytes are exactly those of te_gemm followed by te_activation_fwd.
#include "common/kernels.h"

namespace te {
namespace cpu {

void gemm_gelu(const GemmArgs& g, const ActivationFwdArgs& act, void* stream) {
  gemm(g, stream);
  activation_fwd(act, stream);
}

}  // namespace cpu
}  // namespace te
