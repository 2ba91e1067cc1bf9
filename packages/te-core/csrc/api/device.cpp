#include "te/device.h"

#include "common/error.h"
#include "common/kernels.h"

extern "C" {

te_status te_cuda_device_count(int32_t* count) {
  return te::guard("te_cuda_device_count", [&] {
    TE_CHECK_ARG(count != nullptr, "count: expected an output pointer, got NULL");
    *count = te::cuda::device_count();
  });
}

int32_t te_built_with_cuda(void) {
#ifdef TE_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

}  // extern "C"
