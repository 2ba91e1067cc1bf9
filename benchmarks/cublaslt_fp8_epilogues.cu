// Which activation epilogues cuBLASLt runs on an FP8 GEMM, and what each costs against the plain
// FP8 GEMM with a bf16 output that te's LayerNormMLP runs today (benchmarks/NOTES.md, twenty-first
// session: the answer closed the epilogue route to the MLP targets).
//
// Shape: the MLP's FC1 fprop / FC2 dgrad, D[M, N] = A[M, K] B[N, K]^T with M = N = 16384, K = 4096;
// E4M3 operands with per-tensor scales, fast accumulation, cuBLASLt's first heuristic algorithm.
// Prints, per case, "no algorithm" or the mean ms of `iters` back-to-back calls after 20 warm-up
// calls. Not part of te: it calls cuBLASLt directly, to see what te_gemm could ask of it.
//
// Build and run on the GPU machine (cuBLASLt from the nvidia-cublas wheel beside torch):
//   NV=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')
//   nvcc -std=c++17 -arch=sm_90a -O2 -I$NV/include benchmarks/cublaslt_fp8_epilogues.cu \
//     -o /tmp/epilogues -Xlinker $NV/lib/libcublasLt.so.13 -Xlinker -rpath=$NV/lib
//   /tmp/epilogues 50; /tmp/epilogues 200
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Case {
  const char* name;
  cublasLtEpilogue_t epilogue;
  cudaDataType_t d_type;
  cudaDataType_t c_type;  // an FP8 D takes a 16-bit C of its own (unread: beta = 0)
  bool aux;               // GELU_AUX writes the pre-activation there, DGELU reads it (bf16)
};

constexpr cudaDataType_t kBf16 = CUDA_R_16BF, kE4m3 = CUDA_R_8F_E4M3, kE5m2 = CUDA_R_8F_E5M2;

const Case kCases[] = {
    {"bf16 D, DEFAULT (te today)", CUBLASLT_EPILOGUE_DEFAULT, kBf16, kBf16, false},
    {"bf16 D, GELU_AUX", CUBLASLT_EPILOGUE_GELU_AUX, kBf16, kBf16, true},
    {"e4m3 D + amax, DEFAULT", CUBLASLT_EPILOGUE_DEFAULT, kE4m3, kBf16, false},
    {"e4m3 D + amax, DEFAULT, e4m3 C", CUBLASLT_EPILOGUE_DEFAULT, kE4m3, kE4m3, false},
    {"e4m3 D + amax, GELU_AUX", CUBLASLT_EPILOGUE_GELU_AUX, kE4m3, kBf16, true},
    {"e5m2 D + amax, DGELU", CUBLASLT_EPILOGUE_DGELU, kE5m2, kBf16, true},
    {"bf16 D, DGELU", CUBLASLT_EPILOGUE_DGELU, kBf16, kBf16, true},
};

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t M = 16384, N = 16384, K = 4096;
  const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  void *a, *b, *c, *d, *aux, *workspace;
  float *scale_a, *scale_b, *scale_d, *amax;
  const size_t ws_bytes = 64 << 20;
  check(cudaMalloc(&a, M * K), "cudaMalloc");
  check(cudaMalloc(&b, N * K), "cudaMalloc");
  check(cudaMalloc(&c, M * N * 2), "cudaMalloc");
  check(cudaMalloc(&d, M * N * 2), "cudaMalloc");
  check(cudaMalloc(&aux, M * N * 2), "cudaMalloc");
  check(cudaMalloc(&workspace, ws_bytes), "cudaMalloc");
  for (float** p : {&scale_a, &scale_b, &scale_d, &amax}) check(cudaMalloc(p, 4), "cudaMalloc");
  // Finite E4M3 bytes of both signs and magnitudes below 2 (exponent field < 8), so the products
  // stay in range; the bf16 aux holds 1.0-ish values.
  std::vector<unsigned char> bytes(M * K);
  uint32_t state = 1;
  for (auto& x : bytes) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<unsigned char>(((state >> 24) & 0x3F) | ((state >> 16) & 0x80));
  }
  check(cudaMemcpy(a, bytes.data(), M * K, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(b, bytes.data(), N * K, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemset(aux, 0x3c, M * N * 2), "cudaMemset");
  const float operand_scale = 0.05f, one = 1.0f;
  check(cudaMemcpy(scale_a, &operand_scale, 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(scale_b, &operand_scale, 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(scale_d, &one, 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);

  for (const Case& k : kCases) {
    // Column-major cuBLAS view of the row-major product: D^T[N, M] = B[N, K] (transposed) x A^T.
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    set(desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    set(desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(scale_b));
    set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(scale_a));
    set(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(1));
    set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, k.epilogue);
    const bool fp8_out = k.d_type != kBf16;
    if (fp8_out) {
      set(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(scale_d));
      set(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(amax));
    }
    if (k.aux) {
      set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(aux));
      set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(N));
      set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, kBf16);
    }
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatrixLayoutCreate(&la, kE4m3, K, N, K);
    cublasLtMatrixLayoutCreate(&lb, kE4m3, K, M, K);
    cublasLtMatrixLayoutCreate(&lc, k.c_type, N, M, N);
    cublasLtMatrixLayoutCreate(&ld, k.d_type, N, M, N);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                         sizeof(ws_bytes));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 1, &result, &found);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      std::printf("%-34s no algorithm (status %d)\n", k.name, static_cast<int>(st));
      continue;
    }
    const float alpha = 1.0f, beta = 0.0f;
    void* c_ptr = fp8_out ? c : d;
    auto run = [&] {
      return cublasLtMatmul(lt, desc, &alpha, b, la, a, lb, &beta, c_ptr, lc, d, ld, &result.algo,
                            workspace, ws_bytes, nullptr);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) {
      std::printf("%-34s cublasLtMatmul failed\n", k.name);
      continue;
    }
    for (int i = 0; i < 20; ++i) run();
    cudaEventRecord(start);
    for (int i = 0; i < iters; ++i) run();
    cudaEventRecord(stop);
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    ms /= static_cast<float>(iters);
    std::printf("%-34s %7.3f ms %6.0f TFLOP/s\n", k.name, ms, 2.0 * M * N * K / ms / 1e9);
  }
  return 0;
}
