// te_activation_fwd on CUDA (activation_fwd.cuh): the kernels for sources of any width, and the
// entry point choosing the 16-bit ones (activation_fwd_16bit.cu) where every source is fp16/bf16.
#include "cuda/activation_fwd.cuh"

namespace te {
namespace cuda {
namespace activation {

template void activation_fwd_width<false>(const ActivationFwdArgs&, cudaStream_t);

}  // namespace activation

void activation_fwd(const ActivationFwdArgs& a, void* stream) {
  fused::with_width({a.in_dtype}, [&](auto narrow) {
    activation::activation_fwd_width<decltype(narrow)::value>(a, as_stream(stream));
  });
}

}  // namespace cuda
}  // namespace te
