// The amax pass, shared by te::cuda::amax and current-scaling quantization: zeroes *amax in
// `stream`, then max-accumulates max |x| of the buffer into it (amax.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace te {
namespace cuda {

void amax_into_zeroed(const void* input, int32_t in_dtype, int64_t numel, float* amax,
                      cudaStream_t stream);

}  // namespace cuda
}  // namespace te
