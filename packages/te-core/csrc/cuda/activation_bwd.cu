// te_activation_bwd on CUDA (activation_bwd.cuh): the kernels for sources of any width, and the
// entry point choosing the 16-bit ones (activation_bwd_16bit.cu) where every source is fp16/bf16.
#include "cuda/activation_bwd.cuh"

namespace te {
namespace cuda {
namespace activation {

template void activation_bwd_width<false>(const ActivationBwdArgs&, cudaStream_t);

}  // namespace activation

void activation_bwd(const ActivationBwdArgs& a, void* stream) {
  fused::with_width({a.grad_dtype, a.in_dtype}, [&](auto narrow) {
    activation::activation_bwd_width<decltype(narrow)::value>(a, as_stream(stream));
  });
}

}  // namespace cuda
}  // namespace te
