// te_activation_bwd's kernels for fp16/bf16 sources (activation_bwd.cuh), in their own
// translation unit so they compile in parallel with the others.
#include "cuda/activation_bwd.cuh"

namespace te {
namespace cuda {
namespace activation {

template void activation_bwd_width<true>(const ActivationBwdArgs&, cudaStream_t);

}  // namespace activation
}  // namespace cuda
}  // namespace te
