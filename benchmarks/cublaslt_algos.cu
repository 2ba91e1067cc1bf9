// Every cuBLASLt configuration that runs te.Linear's FP8 GEMMs, timed against the heuristic's
// first choice (what te_gemm runs): is there a faster kernel for the block-scaled GEMMs
// (benchmarks/NOTES.md: the 1x128 x 1x128 wgrad runs at ~1090 TFLOP/s against ~1300 for fprop
// and dgrad) or for the per-tensor ones?
//
// GEMMs of the Linear steps in linear.py, 16384 tokens (row-major, D[M, N] = A[M, K] B[N, K]^T,
// both operands K-major as te stores them, bf16 D):
//   4096 -> 16384  fprop  M 16384 N 16384 K 4096    dgrad  M 16384 N 4096 K 16384
//                  wgrad  M 16384 N 4096  K 16384 (both operands 1x128 blocks along K)
//   4096 -> 4096   fprop / dgrad / wgrad  M 16384 N 4096 K 4096 (M 4096 N 4096 K 16384 for wgrad)
// and mlp.py's LayerNormMLP 4096 -> 16384 -> 4096 (FC1's are 4096 -> 16384's; FC2 fprop M 16384
// N 4096 K 16384, dgrad M 16384 N 16384 K 4096, wgrad M 4096 N 16384 K 16384).
// Block-scaled: fprop x 1x128 by W 128x128, dgrad dy 1x128 by W 128x128, wgrad 1x128 by 1x128.
// Per-tensor: E4M3 by E4M3 (fprop) and E5M2 by E4M3 (dgrad, wgrad: HYBRID), fast accumulation in
// fprop only (TE's split-accumulator defaults).
//
// For each GEMM: the heuristic's top 8 and, for every algorithm id cuBLASLt lists, each tile x
// stages x cluster shape it reports that AlgoCheck accepts (no split-K), timed `iters` calls
// after a short warm-up. Then the fastest few are timed again alternating with the heuristic's
// first in `rounds` rounds (the H200's clocks drift with its load), and the median ratio printed.
// Not part of te: it calls cuBLASLt directly, to see what te_gemm could ask of it.
//
// Build and run on the GPU machine (cuBLASLt from the nvidia-cublas wheel beside torch):
//   NV=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')
//   nvcc -std=c++17 -arch=sm_90a -O2 -I$NV/include benchmarks/cublaslt_algos.cu \
//     -o /tmp/algos -Xlinker $NV/lib/libcublasLt.so.13 -Xlinker -rpath=$NV/lib
//   /tmp/algos [iters=10] [rounds=7] [only the GEMMs whose name contains this]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

constexpr cudaDataType_t kBf16 = CUDA_R_16BF, kE4m3 = CUDA_R_8F_E4M3, kE5m2 = CUDA_R_8F_E5M2;

struct Gemm {
  const char* name;
  int64_t m, n, k;
  bool block;          // block-scaled (else per-tensor)
  bool b_2d;           // B (the weight) in 128x128 blocks; A always 1x128 when block
  cudaDataType_t a_type, b_type;
  bool fast_accum;
};

const Gemm kGemms[] = {
    {"block 4096->16384 fprop", 16384, 16384, 4096, true, true, kE4m3, kE4m3, false},
    {"block 4096->16384 dgrad", 16384, 4096, 16384, true, true, kE4m3, kE4m3, false},
    {"block 4096->16384 wgrad", 16384, 4096, 16384, true, false, kE4m3, kE4m3, false},
    {"block 4096->4096 fprop", 16384, 4096, 4096, true, true, kE4m3, kE4m3, false},
    {"block 4096->4096 wgrad", 4096, 4096, 16384, true, false, kE4m3, kE4m3, false},
    {"tensor 4096->4096 fprop", 16384, 4096, 4096, false, false, kE4m3, kE4m3, true},
    {"tensor 4096->4096 dgrad", 16384, 4096, 4096, false, false, kE5m2, kE4m3, false},
    {"tensor 4096->4096 wgrad", 4096, 4096, 16384, false, false, kE5m2, kE4m3, false},
    // LayerNormMLP 4096 -> 16384 -> 4096 (mlp.py), per-tensor; FC1's GEMMs are 4096 -> 16384's
    {"tensor 4096->16384 fprop / mlp fc1 fprop", 16384, 16384, 4096, false, false, kE4m3, kE4m3, true},
    {"tensor 4096->16384 dgrad, wgrad / mlp fc1 dgrad, wgrad", 16384, 4096, 16384, false, false, kE5m2, kE4m3,
     false},
    {"tensor mlp fc2 fprop", 16384, 4096, 16384, false, false, kE4m3, kE4m3, true},
    {"tensor mlp fc2 dgrad", 16384, 16384, 4096, false, false, kE5m2, kE4m3, false},
    {"tensor mlp fc2 wgrad", 4096, 16384, 16384, false, false, kE5m2, kE4m3, false},
};

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
}

template <typename T>
bool config(cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, T value) {
  return cublasLtMatmulAlgoConfigSetAttribute(algo, attr, &value, sizeof(value)) == CUBLAS_STATUS_SUCCESS;
}

template <typename T>
std::vector<T> caps(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes);
  std::vector<T> out(bytes / sizeof(T));
  if (!out.empty()) cublasLtMatmulAlgoCapGetAttribute(&algo, attr, out.data(), bytes, &bytes);
  return out;
}

struct Candidate {
  cublasLtMatmulAlgo_t algo;
  int id;
  uint32_t tile, stages;
  uint16_t cluster;
  uint32_t swizzle;
  float ms;
};

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 10;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  if (iters < 1 || rounds < 1) {
    std::printf("usage: %s [iters >= 1, default 10] [rounds >= 1, default 7]; got iters %d, rounds %d\n",
                argv[0], iters, rounds);
    return 2;
  }
  const int64_t max_elems = int64_t{16384} * 16384;
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  void *a, *b, *d, *workspace;
  float *scale_a, *scale_b;
  const size_t ws_bytes = size_t{64} << 20;
  check(cudaMalloc(&a, max_elems), "cudaMalloc");
  check(cudaMalloc(&b, max_elems), "cudaMalloc");
  check(cudaMalloc(&d, max_elems * 2), "cudaMalloc");
  check(cudaMalloc(&workspace, ws_bytes), "cudaMalloc");
  // 1x128 scales of a 16384 x 16384 operand (the largest here), with room for any padding
  const size_t scale_count = static_cast<size_t>(max_elems / 128) * 2;
  check(cudaMalloc(&scale_a, scale_count * 4), "cudaMalloc");
  check(cudaMalloc(&scale_b, scale_count * 4), "cudaMalloc");
  {
    // Finite FP8 bytes below 2 in magnitude, both signs (no NaN in either format), and scales of
    // 1/16 (a power of two, as Float8BlockScaling's are)
    std::vector<unsigned char> bytes(static_cast<size_t>(max_elems));
    uint32_t state = 1;
    for (auto& x : bytes) {
      state = state * 1664525u + 1013904223u;
      x = static_cast<unsigned char>(((state >> 24) & 0x37) | ((state >> 16) & 0x80));
    }
    check(cudaMemcpy(a, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(b, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    std::vector<float> s(scale_count, 0.0625f);
    check(cudaMemcpy(scale_a, s.data(), s.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(scale_b, s.data(), s.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const float alpha = 1.0f, beta = 0.0f;

  const char* only = argc > 3 ? argv[3] : "";
  for (const Gemm& g : kGemms) {
    if (std::strstr(g.name, only) == nullptr) continue;
    const int64_t M = g.m, N = g.n, K = g.k;
    // Column-major view of the row-major product: D^T[N, M] = B[N, K] (op T) x A^T[K, M]
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    set(desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    set(desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(scale_b));
    set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(scale_a));
    if (g.block) {
      const cublasLtMatmulMatrixScale_t a_mode =
          g.b_2d ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode);
      set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F);
    } else {
      set(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(g.fast_accum ? 1 : 0));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, g.b_type, K, N, K);
    cublasLtMatrixLayoutCreate(&lb, g.a_type, K, M, K);
    cublasLtMatrixLayoutCreate(&ld, kBf16, N, M, N);
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
      return cublasLtMatmul(lt, desc, &alpha, b, la, a, lb, &beta, d, ld, d, ld, &algo, workspace,
                            ws_bytes, nullptr);
    };
    auto time = [&](const cublasLtMatmulAlgo_t& algo, int n) {
      for (int i = 0; i < 3; ++i) run(algo);
      cudaEventRecord(start);
      for (int i = 0; i < n; ++i) run(algo);
      cudaEventRecord(stop);
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, start, stop);
      return ms / static_cast<float>(n);
    };
    const double tflop = 2.0 * M * N * K / 1e12;

    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                         sizeof(ws_bytes));
    cublasLtMatmulHeuristicResult_t heur[8];
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, heur, &found);
    if (found == 0) {
      std::printf("%s: no heuristic algorithm\n", g.name);
      continue;
    }
    std::vector<Candidate> cands;
    auto describe = [](cublasLtMatmulAlgo_t algo, Candidate* c) {
      size_t w = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &c->id, sizeof(c->id), &w);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &c->tile, sizeof(c->tile), &w);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c->stages,
                                           sizeof(c->stages), &w);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c->cluster,
                                           sizeof(c->cluster), &w);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c->swizzle,
                                           sizeof(c->swizzle), &w);
    };
    for (int i = 0; i < found; ++i) {
      Candidate c{heur[i].algo, 0, 0, 0, 0, 0, 0.0f};
      describe(c.algo, &c);
      cands.push_back(c);
    }
    const size_t n_heur = cands.size();
    int ids[256];
    int n_ids = 0;
    cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, g.b_type, g.a_type, kBf16, kBf16, 256, ids,
                             &n_ids);
    for (int i = 0; i < n_ids; ++i) {
      cublasLtMatmulAlgo_t base;
      if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, g.b_type, g.a_type, kBf16, kBf16, ids[i],
                                 &base) != CUBLAS_STATUS_SUCCESS) {
        continue;
      }
      auto tiles = caps<uint32_t>(base, CUBLASLT_ALGO_CAP_TILE_IDS);
      auto stages = caps<uint32_t>(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
      if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
      if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
      int swz = 0;
      size_t w = 0;
      cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz, sizeof(swz), &w);
      for (uint32_t tile : tiles) {
        for (uint32_t st : stages) {
          for (uint16_t cl : {uint16_t{0}, uint16_t{CUBLASLT_CLUSTER_SHAPE_1x1x1},
                              uint16_t{CUBLASLT_CLUSTER_SHAPE_2x1x1}, uint16_t{CUBLASLT_CLUSTER_SHAPE_1x2x1}}) {
            for (uint32_t sw = 0; sw <= (swz ? 1u : 0u); ++sw) {
              cublasLtMatmulAlgo_t algo = base;
              if (!config(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, tile) ||
                  !config(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, st) ||
                  !config(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cl) ||
                  !config(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, sw) ||
                  !config(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, int32_t{1})) {
                continue;
              }
              cublasLtMatmulHeuristicResult_t r{};
              if (cublasLtMatmulAlgoCheck(lt, desc, la, lb, ld, ld, &algo, &r) != CUBLAS_STATUS_SUCCESS) continue;
              if (r.workspaceSize > ws_bytes) continue;
              Candidate c{algo, 0, 0, 0, 0, 0, 0.0f};
              describe(algo, &c);
              cands.push_back(c);
            }
          }
        }
      }
    }
    int ran = 0;
    for (auto& c : cands) {
      if (run(c.algo) != CUBLAS_STATUS_SUCCESS || cudaDeviceSynchronize() != cudaSuccess) {
        cudaGetLastError();
        c.ms = 1e9f;
        continue;
      }
      c.ms = time(c.algo, iters);
      ++ran;
    }
    const Candidate first = cands[0];
    std::printf("%s (M %lld N %lld K %lld): %zu heuristic + %zu enumerated configs, %d ran\n", g.name,
                static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), n_heur,
                cands.size() - n_heur, ran);
    for (size_t i = 0; i < n_heur; ++i) {
      const auto& c = cands[i];
      std::printf("  heuristic %zu: id %d tile %u stages %u cluster %u swizzle %u  %.3f ms %.0f TFLOP/s\n", i,
                  c.id, c.tile, c.stages, c.cluster, c.swizzle, c.ms, tflop / c.ms * 1e3);
    }
    std::vector<Candidate> order(cands.begin(), cands.end());
    std::sort(order.begin(), order.end(), [](const Candidate& x, const Candidate& y) { return x.ms < y.ms; });
    // The fastest five (first pass) against the heuristic's first, alternating, per-round ratios
    for (size_t i = 0; i < order.size() && i < 5; ++i) {
      const auto& c = order[i];
      std::vector<float> ratios, mine;
      for (int r = 0; r < rounds; ++r) {
        const float base = time(first.algo, iters);
        const float t = time(c.algo, iters);
        ratios.push_back(base / t);
        mine.push_back(t);
      }
      std::sort(ratios.begin(), ratios.end());
      std::sort(mine.begin(), mine.end());
      std::printf("  best %zu: id %d tile %u stages %u cluster %u swizzle %u  %.3f ms %.0f TFLOP/s  %.3fx heuristic\n",
                  i, c.id, c.tile, c.stages, c.cluster, c.swizzle, mine[mine.size() / 2],
                  tflop / mine[mine.size() / 2] * 1e3, ratios[ratios.size() / 2]);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
  }
  return 0;
}
