// te_gemm's GELU_AUX and DGELU with an FP8 output, the reference: the GEMM, rounded to the
// pre-activation's dtype, then the activation pass over the stored values, so the bytes are
// exactly those of te_gemm followed by te_activation_fwd / te_activation_bwd.
#include <cstdint>
#include <vector>

#include "common/kernels.h"
#include "common/validate.h"

namespace te {
namespace cpu {

void gemm_gelu(const GemmArgs& g, const ActivationFwdArgs& act, void* stream) {
  gemm(g, stream);
  activation_fwd(act, stream);
}

void gemm_dgelu(GemmArgs g, ActivationBwdArgs act, void* stream) {
  std::vector<uint8_t> own;
  if (g.d == nullptr) {
    own.resize(static_cast<size_t>(g.m * g.n * dtype_bits(g.d_dtype) / 8));
    g.d = own.data();
  }
  act.grad = g.d;
  gemm(g, stream);
  activation_bwd(act, stream);
}

}  // namespace cpu
}  // namespace te
