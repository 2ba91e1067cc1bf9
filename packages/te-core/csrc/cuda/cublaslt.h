// cuBLASLt, opened at run time (dlopen), so that libte_core.so links no CUDA library but the
// static runtime and a CPU-only install needs none. Only the functions te calls are looked up.
//
// Search order (the first that opens wins; the message of a failure lists every place tried):
//   1. $TE_CUBLASLT_PATH, a full path to a libcublasLt.so (te_core's Python sets it from
//      cuda-pathfinder before the first GEMM; a user can set it by hand);
//   2. a libcublasLt.so.13 / .so.12 already loaded in the process (torch or jax loaded it);
//   3. the nvidia wheels next to te_core: <site-packages>/nvidia/cu13/lib/libcublasLt.so.13 and
//      <site-packages>/nvidia/cublas/lib/libcublasLt.so.12, found from libte_core.so's own path
//      (<site-packages>/te_core/lib/libte_core.so);
//   4. the dynamic loader's search ("libcublasLt.so.13", then ".so.12": LD_LIBRARY_PATH,
//      ld.so.cache), then /usr/local/cuda/lib64.
// Types and enum values come from cublasLt.h at compile time; they are stable across cuBLAS 12
// and 13, and features newer than the loaded library (block scaling needs >= 12.9) are checked
// against cublasLtGetVersion() at run time.
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <string>

namespace te {
namespace cuda {

struct CublasLtApi {
  size_t version;  // cublasLtGetVersion(): major * 10000 + minor * 100 + patch
  std::string path;  // the file that was opened
  size_t (*GetVersion)();
  const char* (*GetStatusString)(cublasStatus_t);
  cublasStatus_t (*Create)(cublasLtHandle_t*);
  cublasStatus_t (*MatmulDescCreate)(cublasLtMatmulDesc_t*, cublasComputeType_t, cudaDataType_t);
  cublasStatus_t (*MatmulDescDestroy)(cublasLtMatmulDesc_t);
  cublasStatus_t (*MatmulDescSetAttribute)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t,
                                           const void*, size_t);
  cublasStatus_t (*MatrixLayoutCreate)(cublasLtMatrixLayout_t*, cudaDataType, uint64_t, uint64_t,
                                       int64_t);
  cublasStatus_t (*MatrixLayoutDestroy)(cublasLtMatrixLayout_t);
  cublasStatus_t (*MatmulPreferenceCreate)(cublasLtMatmulPreference_t*);
  cublasStatus_t (*MatmulPreferenceDestroy)(cublasLtMatmulPreference_t);
  cublasStatus_t (*MatmulPreferenceSetAttribute)(cublasLtMatmulPreference_t,
                                                 cublasLtMatmulPreferenceAttributes_t, const void*,
                                                 size_t);
  cublasStatus_t (*MatmulAlgoGetHeuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                           cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                           cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                           cublasLtMatmulPreference_t, int,
                                           cublasLtMatmulHeuristicResult_t*, int*);
  cublasStatus_t (*MatmulAlgoConfigGetAttribute)(const cublasLtMatmulAlgo_t*,
                                                 cublasLtMatmulAlgoConfigAttributes_t, void*, size_t,
                                                 size_t*);
  cublasStatus_t (*Matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*,
                           cublasLtMatrixLayout_t, const void*, cublasLtMatrixLayout_t,
                           const void*, const void*, cublasLtMatrixLayout_t, void*,
                           cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*, void*, size_t,
                           cudaStream_t);
};

// Loads cuBLASLt once per process (thread-safe); throws te::Error(TE_ERROR_UNSUPPORTED) naming
// every path tried when it cannot, on this and every later call.
const CublasLtApi& cublaslt();

// Throws te::Error(TE_ERROR_CUDA) with the cuBLAS status name and `what` unless s is success.
void check_cublas(cublasStatus_t s, const char* what);

}  // namespace cuda
}  // namespace te
