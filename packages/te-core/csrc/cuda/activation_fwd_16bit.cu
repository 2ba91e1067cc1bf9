// te_activation_fwd's kernels for fp16/bf16 sources (activation_fwd.cuh), in their own
// translation unit so they compile in parallel with the others.
#include "cuda/activation_fwd.cuh"

namespace te {
namespace cuda {
namespace activation {

template void activation_fwd_width<true>(const ActivationFwdArgs&, cudaStream_t);

}  // namespace activation
}  // namespace cuda
}  // namespace te
