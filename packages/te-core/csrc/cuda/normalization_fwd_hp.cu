// The forward norm kernels writing fp32/fp16/bf16 y (norm_fwd.cuh), in their own translation unit
// so the forward's many kernel instances compile in parallel.
#include "cuda/norm_fwd.cuh"

namespace te {
namespace cuda {
namespace normfwd {

template void launch_fwd<kOutHigh, 0>(const FwdParams&, int32_t, cudaStream_t);

}  // namespace normfwd
}  // namespace cuda
}  // namespace te
