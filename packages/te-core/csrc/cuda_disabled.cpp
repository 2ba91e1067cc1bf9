// Built instead of csrc/cuda/ when TE_CUDA_ARCHS is empty: a CPU-only te-core whose CUDA entry
// points fail with one clear message (validate.cpp's require_cuda says why before these run).
#include "common/error.h"
#include "common/kernels.h"
#include "common/kernels_mx.h"

namespace te::cuda {

namespace {
[[noreturn]] void no_cuda() {
  fail(TE_ERROR_UNSUPPORTED, "this te-core was built without CUDA (TE_CUDA_ARCHS was empty)");
}
}  // namespace

int32_t device_count() { return 0; }
void set_device(int32_t) { no_cuda(); }
void amax(const void*, int32_t, int64_t, float*, void*) { no_cuda(); }
void quantize_per_tensor(const PerTensorQuantizeArgs&, void*) { no_cuda(); }
void quantize_block(const BlockQuantizeArgs&, void*) { no_cuda(); }
void dequantize(const DequantizeArgs&, void*) { no_cuda(); }
void transpose(const void*, void*, int64_t, int64_t, int32_t, void*) { no_cuda(); }
void delayed_scaling_update(const DelayedScalingEntry*, int64_t, void*) {
  no_cuda();
}
void gemm(const GemmArgs&, void*) { no_cuda(); }
void gemm_gelu(const GemmArgs&, const ActivationFwdArgs&, void*) { no_cuda(); }
void gemm_dgelu(GemmArgs, ActivationBwdArgs, void*) { no_cuda(); }
void norm_fwd(const NormFwdArgs&, void*) { no_cuda(); }
void norm_bwd(const NormBwdArgs&, void*) { no_cuda(); }
void activation_fwd(const ActivationFwdArgs&, void*) { no_cuda(); }
void activation_bwd(const ActivationBwdArgs&, void*) { no_cuda(); }
void dbias_quantize(const DbiasQuantizeArgs&, void*) { no_cuda(); }

}  // namespace te::cuda

namespace te::cuda {

void quantize_mxfp8(const Mxfp8QuantizeArgs&, void*) { no_cuda(); }
void quantize_nvfp4(const Nvfp4QuantizeArgs&, void*) { no_cuda(); }
void dequantize_mx(const MxDequantizeArgs&, void*) { no_cuda(); }
void gemm_mx(const GemmArgs&, void*) { no_cuda(); }

}  // namespace te::cuda
