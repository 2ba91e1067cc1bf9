// Placeholder: the CUDA LayerNorm/RMSNorm kernels come in a later slice. Until then a CUDA tensor
// gets a clear TE_ERROR_UNSUPPORTED (the CPU backend, csrc/cpu/normalization.cpp, is the
// reference they will match: te/normalization.h's contract, 1.0f / sqrtf with __fsqrt_rn and
// __fdiv_rn, no fused multiply-add in y).
#include "common/error.h"
#include "common/kernels.h"

namespace te::cuda {

void norm_fwd(const NormFwdArgs& args, void*) {
  fail(TE_ERROR_UNSUPPORTED, args.rms ? "te_rmsnorm_fwd" : "te_layernorm_fwd",
       " on CUDA tensors is not implemented yet (CPU only in this version)");
}

void norm_bwd(const NormBwdArgs& args, void*) {
  fail(TE_ERROR_UNSUPPORTED, args.rms ? "te_rmsnorm_bwd" : "te_layernorm_bwd",
       " on CUDA tensors is not implemented yet (CPU only in this version)");
}

}  // namespace te::cuda
