// Placeholder: the CUDA activation and dbias kernels come in a later slice. Until then a CUDA
// tensor gets a clear TE_ERROR_UNSUPPORTED (the CPU backend, csrc/cpu/activation.cpp and
// dbias_quantize.cpp, is the reference they will match: te/activation.h's contract).
#include "common/error.h"
#include "common/kernels.h"

namespace te::cuda {

void activation_fwd(const ActivationFwdArgs&, void*) {
  fail(TE_ERROR_UNSUPPORTED,
       "te_activation_fwd on CUDA tensors is not implemented yet (CPU only in this version)");
}

void activation_bwd(const ActivationBwdArgs&, void*) {
  fail(TE_ERROR_UNSUPPORTED,
       "te_activation_bwd on CUDA tensors is not implemented yet (CPU only in this version)");
}

void dbias_quantize(const DbiasQuantizeArgs&, void*) {
  fail(TE_ERROR_UNSUPPORTED,
       "te_dbias_quantize on CUDA tensors is not implemented yet (CPU only in this version)");
}

}  // namespace te::cuda
