/* te C API: what this build and machine can run. */
#ifndef TE_DEVICE_H_
#define TE_DEVICE_H_

#include <stdint.h>

#include "te/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices te can use: 0 when te-core was built without CUDA, or when there is no
 * GPU or NVIDIA driver (that is not an error). */
TE_API te_status te_cuda_device_count(int32_t* count);

/* 1 if this te-core was compiled with CUDA kernels, 0 for a CPU-only build. */
TE_API int32_t te_built_with_cuda(void);

#ifdef __cplusplus
}
#endif

#endif /* TE_DEVICE_H_ */
