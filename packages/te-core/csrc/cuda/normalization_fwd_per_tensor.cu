// The forward norm kernels writing per-tensor FP8 y (norm_fwd.cuh), in their own translation unit
// so the forward's many kernel instances compile in parallel.
#include "cuda/norm_fwd.cuh"

namespace te {
namespace cuda {
namespace normfwd {

template void launch_fwd<kOutPerTensor, TE_DTYPE_FLOAT8_E4M3>(const FwdParams&, int32_t, cudaStream_t);
template void launch_fwd<kOutPerTensor, TE_DTYPE_FLOAT8_E5M2>(const FwdParams&, int32_t, cudaStream_t);

}  // namespace normfwd
}  // namespace cuda
}  // namespace te
