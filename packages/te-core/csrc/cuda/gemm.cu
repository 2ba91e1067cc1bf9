// te_gemm on CUDA tensors through cuBLASLt (opened at run time: cublaslt.h).
//
// Contract (kernels.h GemmArgs; the API layer has validated dtypes, shapes and devices and picked
// the operand copies): row-major D[M, N] = alpha op(A) op(B) + beta D, then the epilogue.
//
// cuBLASLt is column-major. A row-major [R, C] buffer is a column-major [C, R] one, so te's
// product is computed as the column-major D^T[N, M] = op(B)^T op(A)^T: cuBLAS "A" is te's B,
// cuBLAS "B" is te's A, cuBLAS (m, n, k) = te's (N, M, K), and D's leading dimension is N. Every
// per-operand attribute is swapped with it (A_SCALE_* describe te's B). te's bias[N] is then the
// bias over D^T's rows (CUBLASLT_EPILOGUE_BIAS as is), and te's bias_grad[M] = sum_k op(A)[i, k]
// is the sum over k of cuBLAS B, i.e. CUBLASLT_EPILOGUE_BGRADB.
// FP8: the API hands A as [M, K] and B as [N, K] (both K-contiguous), which is cuBLAS's only FP8
// layout, "TN" (transa = T, transb = N).
//
// Steady state does no descriptor creation and no heuristic query: a Plan (matmul descriptor,
// four layouts, the chosen algorithm) is cached per problem (PlanKey below: shapes, dtypes,
// layouts, epilogue, scale modes, fast accumulation, pointer alignment classes, workspace size,
// device); a call looks it up, sets the pointer attributes (scales, bias, aux, amax) under the
// plan's own lock and enqueues cublasLtMatmul. The lock is held only while the descriptor is
// written and the call is enqueued (cuBLASLt reads the descriptor at enqueue time). The plan's
// algorithm is the heuristic's first, but for Hopper's large per-tensor FP8 fprop GEMMs
// (prefers_mid_tiles below: a mid-size tile from its top 8, deterministic, said once at INFO).
//
// Where cuBLASLt has no fused kernel for the request (its heuristic says NOT_SUPPORTED: e.g. an
// fp32 bias next to a 16-bit or FP8 product, E5M2 output from two E4M3 operands, an aux leading
// dimension not a multiple of 8), the plan is the plain fp32 product instead and te's own
// epilogue (gemm_epilogue.cu) finishes it: same numbers as the CPU reference, one more pass over
// the product, logged once at INFO.
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/kernels.h"
#include "common/log.h"
#include "common/validate.h"
#include "cuda/cublaslt.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/gemm_epilogue.cuh"
#include "cuda/scratch.cuh"
#include "te/gemm.h"

namespace te {
namespace cuda {
namespace {

constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;
constexpr int kMaxDevices = 64;

cudaDataType_t cuda_dtype(int32_t dt) {
  switch (dt) {
    case TE_DTYPE_FLOAT32: return CUDA_R_32F;
    case TE_DTYPE_FLOAT16: return CUDA_R_16F;
    case TE_DTYPE_BFLOAT16: return CUDA_R_16BF;
    case TE_DTYPE_FLOAT8_E4M3: return CUDA_R_8F_E4M3;
    case TE_DTYPE_FLOAT8_E5M2: return CUDA_R_8F_E5M2;
    default: fail(TE_ERROR_INTERNAL, "te_gemm: dtype ", dt, " has no cuBLASLt type");
  }
}

// cuBLASLt's block scale modes (cublasLt.h >= 12.9). Per-tensor scales use the default mode
// (SCALAR_32F), which is never set so that cuBLAS < 12.8 (no scale-mode attribute) works.
int32_t cublas_scale_mode(int32_t te_mode) {
  return te_mode == TE_SCALING_BLOCK_1D ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                        : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

// The largest power of two (<= 256) dividing the address; 256 for nullptr (no constraint).
int64_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int64_t al = 256;
  while (al > 1 && (a % static_cast<uintptr_t>(al)) != 0) al /= 2;
  return al;
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

std::string describe(const GemmArgs& g) {
  return concat("[M=", g.m, " N=", g.n, " K=", g.k, "; A ", dtype_name(g.a.dtype), " ",
                scaling_mode_name(g.a.scaling_mode), g.a.trans ? " [K,M]" : " [M,K]", "; B ",
                dtype_name(g.b.dtype), " ", scaling_mode_name(g.b.scaling_mode),
                g.b.trans ? " [N,K]" : " [K,N]", "; D ", dtype_name(g.d_dtype), "; epilogue ",
                epilogue_name(g.epilogue),
                g.bias ? concat(", bias ", dtype_name(g.bias_dtype)) : std::string(),
                g.aux ? concat(", aux ", dtype_name(g.aux_dtype)) : std::string(),
                g.bias_grad ? concat(", bias_grad ", dtype_name(g.bias_grad_dtype)) : std::string(),
                "; beta ", g.beta, "]");
}

// ---------------------------------------------------------------------------------------------
// Checks cuBLASLt cannot do for us with a useful message. They run before cuBLASLt is loaded, so
// a bad shape gives the same error on every machine.

void check_fp8_dim(const char* dim, const char* meaning, int64_t value) {
  if (value % 16 != 0) {
    fail(TE_ERROR_INVALID_ARGUMENT, "FP8 GEMM (cuBLASLt) needs ", dim, " (", meaning,
         ") to be a multiple of 16, got ", dim, " = ", value,
         ". Pad that dimension to a multiple of 16 with zeros and slice the result back; in a "
         "layer's weight-gradient GEMM K is the number of tokens (the input's leading dimensions "
         "flattened), so pad the batch or sequence (NUMERICS.md \"Shape rules\").");
  }
}

void check_aligned16(const char* what, const void* p) {
  if (p != nullptr && alignment(p) < 16) {
    fail(TE_ERROR_INVALID_ARGUMENT, "FP8 GEMM (cuBLASLt) needs ", what,
         " 16-byte aligned; its address ends in ...", reinterpret_cast<uintptr_t>(p) % 256,
         " (mod 256). Pass a tensor that starts at an aligned address (a fresh allocation).");
  }
}

// The block scale layout cuBLASLt reads has an implicit leading dimension; te's (te/tensor.h) is
// padded to a multiple of 4 floats. `rows` is the operand's non-K dimension (M for A, N for B).
void check_block_scales(const char* name, const GemmOperand& op, int64_t rows, int64_t k) {
  if (op.scaling_mode != TE_SCALING_BLOCK_1D && op.scaling_mode != TE_SCALING_BLOCK_2D) return;
  const int64_t want = op.scaling_mode == TE_SCALING_BLOCK_1D ? round_up(rows, 4)
                                                              : round_up(ceil_div(k, 128), 4);
  if (op.scale_ld != want) {
    fail(TE_ERROR_INVALID_ARGUMENT, "te_gemm: ", name, "'s ", scaling_mode_name(op.scaling_mode),
         " scale_inv has leading dimension ", op.scale_ld, ", cuBLASLt reads ", want,
         " (te/tensor.h layout)");
  }
  check_aligned16(concat(name, "'s scale_inv").c_str(), op.scale_inv);
}

void check_args(const GemmArgs& g) {
  const bool fp8 = is_fp8(g.a.dtype) || is_fp8(g.b.dtype);
  if (fp8) {
    if (g.a.trans || !g.b.trans) {
      fail(TE_ERROR_INTERNAL, "te_gemm: FP8 operands must reach the CUDA backend K-contiguous "
                              "(A [M,K], B [N,K]); got ", describe(g));
    }
    check_fp8_dim("K", "the reduction dimension, the operands' last dimension", g.k);
    check_fp8_dim("N", "the output's last dimension", g.n);
    check_aligned16("A's data", g.a.data);
    check_aligned16("B's data", g.b.data);
    check_aligned16("D", g.d);
    check_block_scales("A", g.a, g.m, g.k);
    check_block_scales("B", g.b, g.n, g.k);
  }
  if (is_fp8(g.d_dtype) && g.beta != 0.0f) {
    fail(TE_ERROR_UNSUPPORTED, "te_gemm: accumulating (beta = ", g.beta,
         ") into an FP8 output is not supported by cuBLASLt; accumulate in fp32/bf16");
  }
  if ((g.epilogue == TE_EPILOGUE_GELU_AUX || g.epilogue == TE_EPILOGUE_DGELU) &&
      is_fp8(g.aux_dtype)) {
    fail(TE_ERROR_UNSUPPORTED, "te_gemm: an FP8 aux (GELU input) is not supported; use the "
                               "output's high-precision dtype");
  }
}

// ---------------------------------------------------------------------------------------------
// Per-device handle and per-(device, stream) workspace, created once.

std::mutex g_mutex;  // guards the handles, the workspaces and the plan cache

cublasLtHandle_t handle_for(int device) {
  static cublasLtHandle_t handles[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) fail(TE_ERROR_UNSUPPORTED, "CUDA device ", device);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (handles[device] == nullptr) {
    check_cublas(cublaslt().Create(&handles[device]), "cublasLtCreate");
  }
  return handles[device];
}

struct PairHash {
  size_t operator()(const std::pair<int, cudaStream_t>& p) const {
    return std::hash<uintptr_t>()(reinterpret_cast<uintptr_t>(p.second)) * 31u +
           static_cast<size_t>(p.first);
  }
};

using StreamBuffers = std::unordered_map<std::pair<int, cudaStream_t>, void*, PairHash>;

// A buffer of `bytes` per stream: allocated on first use, kept for the process (stream-ordered
// reuse by every GEMM on that stream is safe: cuBLASLt's work on one stream is serial). The first
// GEMM on a stream may come while that stream captures a CUDA graph (torch.cuda.graph's capture
// stream); a graph keeps the pointer, which stays valid for the process.
void* stream_buffer(StreamBuffers& buffers, int device, cudaStream_t stream, size_t bytes,
                    const char* what) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = buffers.find({device, stream});
  if (it != buffers.end()) return it->second;
  void* p = nullptr;
  {
    RelaxedCapture relaxed;
    check_cuda(cudaMalloc(&p, bytes), what);
  }
  buffers.emplace(std::make_pair(device, stream), p);
  return p;
}

void* stream_workspace(int device, cudaStream_t stream) {
  static StreamBuffers workspaces;
  return stream_buffer(workspaces, device, stream, kDefaultWorkspaceBytes,
                       "cudaMalloc of te's 32 MiB cuBLASLt workspace (pass config.workspace to "
                       "avoid it)");
}

// Where cuBLASLt writes an FP8 output's amax, which te then max-accumulates into the caller's
// (cuBLASLt overwrites; te_gemm's contract is te_quantize's delayed-scaling one).
float* stream_amax(int device, cudaStream_t stream) {
  static StreamBuffers amaxes;
  return static_cast<float*>(
      stream_buffer(amaxes, device, stream, 256, "cudaMalloc of te's FP8-output amax scratch"));
}

// ---------------------------------------------------------------------------------------------
// The plan cache.

struct PlanKey {
  std::array<int64_t, 28> v{};
  bool operator==(const PlanKey& o) const { return v == o.v; }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t x : k.v) {
      h ^= static_cast<uint64_t>(x);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

struct Setup {
  bool fp8, fp8_out, block;
  cublasLtEpilogue_t epilogue;
  const void* epilogue_vector;  // BIAS_POINTER: bias, or bias_grad for BGRADB
  int32_t epilogue_vector_dtype;
  bool fast_accum;
};

Setup setup_of(const GemmArgs& g) {
  Setup s{};
  s.fp8 = is_fp8(g.a.dtype);
  s.fp8_out = is_fp8(g.d_dtype);
  s.block = s.fp8 && (g.a.scaling_mode != TE_SCALING_PER_TENSOR ||
                      g.b.scaling_mode != TE_SCALING_PER_TENSOR);
  // Block-scaled FP8 has no fast-accumulation kernels (and cuBLAS rejects the flag).
  s.fast_accum = s.fp8 && !s.block && !g.split_accumulator;
  s.epilogue_vector = nullptr;
  s.epilogue_vector_dtype = -1;
  switch (g.epilogue) {
    case TE_EPILOGUE_BIAS:
      s.epilogue = CUBLASLT_EPILOGUE_BIAS;
      s.epilogue_vector = g.bias;
      s.epilogue_vector_dtype = g.bias_dtype;
      break;
    case TE_EPILOGUE_GELU_AUX:
      s.epilogue = g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      s.epilogue_vector = g.bias;
      s.epilogue_vector_dtype = g.bias ? g.bias_dtype : -1;
      break;
    case TE_EPILOGUE_DGELU:
      s.epilogue = CUBLASLT_EPILOGUE_DGELU;
      break;
    case TE_EPILOGUE_BGRAD:
      s.epilogue = CUBLASLT_EPILOGUE_BGRADB;  // sum over k of cuBLAS B = te's op(A)
      s.epilogue_vector = g.bias_grad;
      s.epilogue_vector_dtype = g.bias_grad_dtype;
      break;
    default:
      s.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
      break;
  }
  return s;
}

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;  // cuBLAS naming
  cublasLtMatmulAlgo_t algo{};
  bool te_epilogue = false;  // the plain fp32 product (plain_args), finished by gemm_epilogue.cu
  Setup setup{};             // of the GemmArgs cuBLASLt runs (plain_args when te_epilogue)
  std::mutex mu;
  // Plans live as long as the process: never destroyed (the cache is static and cuBLASLt may be
  // unloaded before static destructors run).
};

// What cuBLASLt runs when te applies the epilogue: the fp32 product alpha op(A) op(B), into D
// itself (with beta) when D is fp32, else into `scratch` (beta is then te's to apply).
GemmArgs plain_args(const GemmArgs& g, void* scratch) {
  GemmArgs p = g;
  p.epilogue = TE_EPILOGUE_DEFAULT;
  p.bias = nullptr;
  p.aux = nullptr;
  p.bias_grad = nullptr;
  p.d_scale = nullptr;
  p.d_amax = nullptr;
  p.d_scale_inv = nullptr;
  if (g.d_dtype != TE_DTYPE_FLOAT32) {
    p.d_dtype = TE_DTYPE_FLOAT32;
    p.d = scratch;
    p.beta = 0.0f;
  }
  return p;
}

// Whether te's epilogue can stand in for cuBLASLt's: anything beyond the plain product.
bool has_epilogue(const GemmArgs& g) {
  return g.epilogue != TE_EPILOGUE_DEFAULT || is_fp8(g.d_dtype);
}

// cuBLASLt's aux has a leading-dimension rule of its own.
bool needs_te_epilogue(const GemmArgs& g) {
  return (g.epilogue == TE_EPILOGUE_GELU_AUX || g.epilogue == TE_EPILOGUE_DGELU) && g.n % 8 != 0;
}

PlanKey key_of(const GemmArgs& g, const Setup& s, int device, size_t workspace_bytes) {
  PlanKey k;
  int i = 0;
  auto put = [&](int64_t x) { k.v[i++] = x; };
  put(device);
  put(g.m);
  put(g.n);
  put(g.k);
  put(g.a.dtype);
  put(g.b.dtype);
  put(g.d_dtype);
  put(g.a.trans);
  put(g.b.trans);
  put(g.a.scaling_mode);
  put(g.b.scaling_mode);
  put(g.epilogue);
  put(s.epilogue_vector ? s.epilogue_vector_dtype : -1);
  put(g.aux ? g.aux_dtype : -1);
  put(s.fast_accum);
  put(g.beta != 0.0f);
  put(g.d_amax != nullptr);
  put(g.d_scale != nullptr);
  put(alignment(g.a.data));
  put(alignment(g.b.data));
  put(alignment(g.d));
  put(alignment(s.epilogue_vector));
  put(alignment(g.aux));
  put(alignment(g.a.scale_inv));
  put(alignment(g.b.scale_inv));
  put(static_cast<int64_t>(workspace_bytes));
  return k;
}

template <typename T>
void set_attr(const CublasLtApi& lt, cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
              const T& value, const char* name) {
  check_cublas(lt.MatmulDescSetAttribute(desc, attr, &value, sizeof(value)), name);
}

#define TE_SET(lt, desc, attr, value) set_attr(lt, desc, attr, value, "cublasLtMatmulDescSetAttribute(" #attr ")")

// Sets the attributes that hold pointers; called when the plan is built (cuBLASLt's heuristic
// reads their alignment) and on every call.
void set_pointers(const CublasLtApi& lt, cublasLtMatmulDesc_t desc, const GemmArgs& g,
                  const Setup& s) {
  if (s.fp8) {
    // cuBLAS A is te's B (see the top of this file).
    TE_SET(lt, desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.b.scale_inv));
    TE_SET(lt, desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.a.scale_inv));
  }
  if (s.fp8_out) {
    TE_SET(lt, desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(g.d_scale));
    if (g.d_amax != nullptr) {
      TE_SET(lt, desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(g.d_amax));
    }
  }
  if (s.epilogue_vector != nullptr) {
    TE_SET(lt, desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, s.epilogue_vector);
  }
  if (g.epilogue == TE_EPILOGUE_GELU_AUX || g.epilogue == TE_EPILOGUE_DGELU) {
    TE_SET(lt, desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
  }
}

std::string no_kernel_hint(const GemmArgs& g, const Setup& s) {
  std::string h;
  if (s.block) {
    h += " Block-scaled FP8 (cuBLASLt >= 12.9, Hopper only) may need K a multiple of 128, a "
         "bf16 or fp32 output and the DEFAULT or BIAS epilogue.";
  }
  if (s.fp8 && s.epilogue_vector != nullptr && g.epilogue != TE_EPILOGUE_BGRAD) {
    h += " FP8 GEMMs take a bf16 or fp16 bias (an fp32 output needs a bf16 bias).";
  }
  if (!s.fp8 && s.epilogue_vector != nullptr && s.epilogue_vector_dtype != g.d_dtype) {
    h += " cuBLASLt may require the bias / bias_grad dtype to equal the output's.";
  }
  if (s.fp8 && g.epilogue != TE_EPILOGUE_DEFAULT && g.epilogue != TE_EPILOGUE_BIAS) {
    h += " FP8 GEMMs support few epilogues (DEFAULT, BIAS, GELU_AUX with a 16-bit aux).";
  }
  return h;
}

int current_compute_major(int device) {
  static std::atomic<int> cache[kMaxDevices] = {};
  int v = cache[device].load(std::memory_order_relaxed);
  if (v == 0) {
    check_cuda(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, device),
               "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
    cache[device].store(v, std::memory_order_relaxed);
  }
  return v;
}

// Per-tensor E4M3 x E4M3 with fast accumulation (te's fprop) on Hopper: for the large GEMMs of a
// Transformer layer (16384 tokens x 4096 / 16384 features) cuBLASLt's first choice is a big tile
// (320x128, 192x192) that runs 8-14% slower than a mid-size tile in a 2-CTA cluster once the GPU
// sits at its power cap, as it does through training (benchmarks/cublaslt_algos.cu, alternating
// rounds: 1.08-1.14x on the H200, 1.10x on the H100; whole Linear steps 1-3.4% faster on the
// H100: NOTES.md, thirty-fifth and thirty-sixth sessions). The preferred configurations, in order, are
// taken only from cuBLASLt's own top candidates for the problem, so it vouches for each; where
// none is listed, or the problem is smaller, its first choice stands. The choice depends only on
// the problem (no timing), so a GEMM's bits do not vary from run to run.
struct TileCluster {
  uint32_t tile;
  uint16_t cluster;
  const char* name;
};
constexpr TileCluster kPreferredFprop[] = {
    {CUBLASLT_MATMUL_TILE_128x160, CUBLASLT_CLUSTER_SHAPE_2x1x1, "tile 128x160, 2x1 clusters"},
    {CUBLASLT_MATMUL_TILE_168x128, CUBLASLT_CLUSTER_SHAPE_1x2x1, "tile 168x128, 1x2 clusters"},
    {CUBLASLT_MATMUL_TILE_176x128, CUBLASLT_CLUSTER_SHAPE_1x2x1, "tile 176x128, 1x2 clusters"},
};
constexpr int kHeuristicCandidates = 8;
constexpr int64_t kPreferFrom = 4096;  // M, N and K at least this

bool prefers_mid_tiles(const GemmArgs& g, const Setup& s) {
  if (!s.fp8 || s.block || !s.fast_accum || s.fp8_out) return false;
  if (g.a.dtype != TE_DTYPE_FLOAT8_E4M3 || g.b.dtype != TE_DTYPE_FLOAT8_E4M3) return false;
  if (s.epilogue != CUBLASLT_EPILOGUE_DEFAULT && s.epilogue != CUBLASLT_EPILOGUE_BIAS) return false;
  if (g.m < kPreferFrom || g.n < kPreferFrom || g.k < kPreferFrom) return false;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  return current_compute_major(device) == 9;
}

// Index of the first preferred configuration among cuBLASLt's `count` candidates, else 0; said
// once per problem at INFO.
int preferred_candidate(const CublasLtApi& lt, const cublasLtMatmulHeuristicResult_t* r, int count,
                        const GemmArgs& g) {
  for (const TileCluster& want : kPreferredFprop) {
    for (int i = 0; i < count; ++i) {
      uint32_t tile = 0;
      uint16_t cluster = 0;
      size_t written = 0;
      if (r[i].state != CUBLAS_STATUS_SUCCESS ||
          lt.MatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                          &written) != CUBLAS_STATUS_SUCCESS ||
          lt.MatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                          sizeof(cluster), &written) != CUBLAS_STATUS_SUCCESS) {
        continue;
      }
      if (tile == want.tile && cluster == want.cluster) {
        if (i > 0) {
          log_info_once(concat("gemm-tile ", g.m, "x", g.n, "x", g.k, " ", dtype_name(g.d_dtype)), [&] {
            return concat("te_gemm: FP8 ", g.m, " x ", g.n, " x ", g.k, " (fast accumulation) runs cuBLASLt's ",
                          want.name, ", its candidate ", i + 1, ", rather than its first (faster at the GPU's "
                          "power cap: benchmarks/NOTES.md)");
          });
        }
        return i;
      }
    }
  }
  return 0;
}

// The plan for `g` as given, or nullptr with `*why` set when cuBLASLt has no kernel for it.
std::unique_ptr<Plan> build_plan(const CublasLtApi& lt, cublasLtHandle_t handle, const GemmArgs& g,
                                 const Setup& s, size_t workspace_bytes, std::string* why) {
  auto p = std::make_unique<Plan>();
  p->setup = s;
  // All inputs accumulate in fp32; fp32 inputs stay exact fp32 (no TF32).
  check_cublas(lt.MatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  const int32_t transa = g.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t transb = g.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  TE_SET(lt, p->desc, CUBLASLT_MATMUL_DESC_TRANSA, transa);
  TE_SET(lt, p->desc, CUBLASLT_MATMUL_DESC_TRANSB, transb);
  const int32_t epilogue = static_cast<int32_t>(s.epilogue);
  TE_SET(lt, p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (s.fp8) {
    const int8_t fast = s.fast_accum ? 1 : 0;
    TE_SET(lt, p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast);
    if (s.block) {
      if (lt.version < 120900) {
        fail(TE_ERROR_UNSUPPORTED, "block-scaled FP8 GEMMs need cuBLASLt >= 12.9; ", lt.path,
             " is ", lt.version);
      }
      const int32_t mode_a = cublas_scale_mode(g.b.scaling_mode);
      const int32_t mode_b = cublas_scale_mode(g.a.scaling_mode);
      TE_SET(lt, p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode_a);
      TE_SET(lt, p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode_b);
    }
  }
  if (s.epilogue_vector != nullptr) {
    const int32_t t = cuda_dtype(s.epilogue_vector_dtype);
    TE_SET(lt, p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, t);
  }
  if (g.epilogue == TE_EPILOGUE_GELU_AUX || g.epilogue == TE_EPILOGUE_DGELU) {
    const int64_t ld = g.n;
    TE_SET(lt, p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld);
    if (g.aux_dtype != g.d_dtype || s.fp8) {
      const int32_t t = cuda_dtype(g.aux_dtype);
      TE_SET(lt, p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, t);
    }
  }
  set_pointers(lt, p->desc, g, s);

  // Layouts, column-major (see the top of this file): cuBLAS A = te B, cuBLAS B = te A.
  const uint64_t M = static_cast<uint64_t>(g.m), N = static_cast<uint64_t>(g.n),
                 K = static_cast<uint64_t>(g.k);
  const cudaDataType_t ta = cuda_dtype(g.b.dtype), tb = cuda_dtype(g.a.dtype),
                       td = cuda_dtype(g.d_dtype);
  if (g.b.trans) {
    check_cublas(lt.MatrixLayoutCreate(&p->a, ta, K, N, g.k), "cublasLtMatrixLayoutCreate(A)");
  } else {
    check_cublas(lt.MatrixLayoutCreate(&p->a, ta, N, K, g.n), "cublasLtMatrixLayoutCreate(A)");
  }
  if (g.a.trans) {
    check_cublas(lt.MatrixLayoutCreate(&p->b, tb, M, K, g.m), "cublasLtMatrixLayoutCreate(B)");
  } else {
    check_cublas(lt.MatrixLayoutCreate(&p->b, tb, K, M, g.k), "cublasLtMatrixLayoutCreate(B)");
  }
  check_cublas(lt.MatrixLayoutCreate(&p->d, td, N, M, g.n), "cublasLtMatrixLayoutCreate(D)");
  // C is D itself, except for an FP8 output: cuBLASLt then wants C in the bias's 16-bit type
  // (bf16 without a bias) and never reads it (beta = 0, checked).
  cudaDataType_t tc = td;
  if (s.fp8_out) {
    tc = (s.epilogue_vector != nullptr && g.epilogue != TE_EPILOGUE_BGRAD)
             ? cuda_dtype(s.epilogue_vector_dtype)
             : CUDA_R_16BF;
  }
  check_cublas(lt.MatrixLayoutCreate(&p->c, tc, N, M, g.n), "cublasLtMatrixLayoutCreate(C)");

  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(lt.MatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  struct PrefGuard {
    const CublasLtApi& lt;
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { lt.MatmulPreferenceDestroy(p); }
  } guard{lt, pref};
  const uint64_t ws = workspace_bytes;
  check_cublas(lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                               sizeof(ws)),
               "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
  const uint32_t al_a = static_cast<uint32_t>(alignment(g.b.data));
  const uint32_t al_b = static_cast<uint32_t>(alignment(g.a.data));
  const uint32_t al_c = static_cast<uint32_t>(alignment(s.fp8_out ? nullptr : g.d));
  const uint32_t al_d = static_cast<uint32_t>(alignment(g.d));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d}};
  for (const auto& [attr, value] : aligns) {
    check_cublas(lt.MatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)),
                 "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
  }

  cublasLtMatmulHeuristicResult_t results[kHeuristicCandidates]{};
  const bool prefer = prefers_mid_tiles(g, s);
  int count = 0;
  const cublasStatus_t st = lt.MatmulAlgoGetHeuristic(handle, p->desc, p->a, p->b, p->c, p->d, pref,
                                                      prefer ? kHeuristicCandidates : 1, results, &count);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE ||
      (st == CUBLAS_STATUS_SUCCESS && count == 0)) {
    *why = st == CUBLAS_STATUS_SUCCESS ? std::string() : concat(" (", lt.GetStatusString(st), ")");
    return nullptr;
  }
  check_cublas(st, "cublasLtMatmulAlgoGetHeuristic");
  p->algo = results[prefer ? preferred_candidate(lt, results, count, g) : 0].algo;
  return p;
}

// Native first; where cuBLASLt has no fused kernel, the plain product for te's epilogue.
std::unique_ptr<Plan> plan_or_fallback(const CublasLtApi& lt, cublasLtHandle_t handle,
                                       const GemmArgs& g, const Setup& s, size_t workspace_bytes) {
  std::string why;
  if (!needs_te_epilogue(g)) {
    if (auto p = build_plan(lt, handle, g, s, workspace_bytes, &why)) return p;
  }
  if (has_epilogue(g)) {
    const GemmArgs pg = plain_args(g, nullptr);
    std::string plain_why;
    if (auto p = build_plan(lt, handle, pg, setup_of(pg), workspace_bytes, &plain_why)) {
      p->te_epilogue = true;
      return p;
    }
  }
  fail(TE_ERROR_UNSUPPORTED, "cuBLASLt ", lt.version, " (", lt.path,
       ") has no kernel for this GEMM on this GPU: ", describe(g), why, ".", no_kernel_hint(g, s));
}

Plan* plan_for(const CublasLtApi& lt, cublasLtHandle_t handle, const GemmArgs& g, const Setup& s,
               int device, size_t workspace_bytes) {
  static std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> cache;
  const PlanKey key = key_of(g, s, device, workspace_bytes);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second.get();
  }
  // Built outside the lock (heuristics take tens of microseconds); a racing thread may build the
  // same plan, and the first one inserted wins (the loser's descriptors leak, once).
  std::unique_ptr<Plan> built = plan_or_fallback(lt, handle, g, s, workspace_bytes);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto [it, inserted] = cache.emplace(key, std::move(built));
  return it->second.get();
}

// The product of a te_epilogue plan, then the epilogue. Scratch for a non-fp32 D comes from the
// stream-ordered pool, so nothing synchronizes.
void run_with_te_epilogue(const CublasLtApi& lt, cublasLtHandle_t handle, Plan* plan,
                          const GemmArgs& g, void* workspace, size_t workspace_bytes,
                          cudaStream_t stream) {
  log_info_once(concat("gemm-epilogue ", dtype_name(g.a.dtype), dtype_name(g.d_dtype), g.epilogue,
                       g.bias ? dtype_name(g.bias_dtype) : "", g.n % 8),
                [&] {
                  return concat("te_gemm: cuBLASLt ", lt.version, " has no fused kernel for ",
                                describe(g),
                                "; te computes the fp32 product and applies the epilogue in a "
                                "separate kernel (same numbers, one more pass over the output). "
                                "Logged once per kind of GEMM.");
                });
  Scratch product(g.d_dtype != TE_DTYPE_FLOAT32
                      ? static_cast<size_t>(g.m) * static_cast<size_t>(g.n) * sizeof(float)
                      : 0,
                  stream, "te scratch (te_gemm epilogue product)");
  const GemmArgs pg = plain_args(g, product.as<float>());
  {
    std::lock_guard<std::mutex> lock(plan->mu);
    set_pointers(lt, plan->desc, pg, plan->setup);
    const float alpha = pg.alpha, beta = pg.beta;
    check_cublas(lt.Matmul(handle, plan->desc, &alpha, pg.b.data, plan->a, pg.a.data, plan->b,
                           &beta, pg.d, plan->c, pg.d, plan->d, &plan->algo, workspace,
                           workspace_bytes, stream),
                 "cublasLtMatmul");
  }
  EpilogueParams e{};
  e.acc = static_cast<const float*>(pg.d);
  e.m = g.m;
  e.n = g.n;
  e.beta = g.d_dtype == TE_DTYPE_FLOAT32 ? 0.0f : g.beta;
  e.d = g.d;
  e.d_dtype = g.d_dtype;
  e.d_scale = g.d_scale;
  e.d_amax = g.d_amax;
  e.epilogue = g.epilogue;
  e.bias = g.bias;
  e.bias_dtype = g.bias_dtype;
  e.aux = g.aux;
  e.aux_dtype = g.aux_dtype;
  gemm_epilogue(e, stream);
  if (g.epilogue == TE_EPILOGUE_BGRAD) gemm_row_sums(g.a, g.m, g.k, g.bias_grad, g.bias_grad_dtype, stream);
}

// An FP8 output's scalars after the product: scale_inv = 1 / scale (correctly rounded, as the
// CPU backend's 1.0f / scale) and amax = max(amax, the product's amax from cuBLASLt).
__global__ void fp8_output_scalars_kernel(const float* __restrict__ scale, float* scale_inv,
                                          const float* __restrict__ product_amax, float* amax) {
  if (scale_inv != nullptr) *scale_inv = __frcp_rn(*scale);
  if (amax != nullptr) *amax = nan_max(*amax, *product_amax);
}

// Outputs of a product with no terms (M, N or K zero).
void degenerate(const GemmArgs& g, cudaStream_t stream) {
  const size_t d_bytes = static_cast<size_t>(g.m) * static_cast<size_t>(g.n) *
                         (g.d_dtype == TE_DTYPE_FLOAT32 ? 4 : is_fp8(g.d_dtype) ? 1 : 2);
  const bool empty_out = g.m == 0 || g.n == 0;
  if (!empty_out) {  // K == 0: op(A) op(B) = 0
    if (g.epilogue != TE_EPILOGUE_DEFAULT && g.epilogue != TE_EPILOGUE_BGRAD) {
      fail(TE_ERROR_UNSUPPORTED, "te_gemm on CUDA: K = 0 with the ", epilogue_name(g.epilogue),
           " epilogue");
    }
    if (g.beta == 0.0f) {
      check_cuda(cudaMemsetAsync(g.d, 0, d_bytes, stream), "cudaMemsetAsync(D)");
    } else if (g.beta != 1.0f) {
      fail(TE_ERROR_UNSUPPORTED, "te_gemm on CUDA: K = 0 with beta = ", g.beta);
    }
  }
  if (g.epilogue == TE_EPILOGUE_BGRAD && g.m > 0) {
    if (g.k > 0) {
      fail(TE_ERROR_UNSUPPORTED, "te_gemm on CUDA: BGRAD with N = 0 and K > 0");
    }
    const size_t elem = g.bias_grad_dtype == TE_DTYPE_FLOAT32 ? 4 : 2;
    check_cuda(cudaMemsetAsync(g.bias_grad, 0, static_cast<size_t>(g.m) * elem, stream),
               "cudaMemsetAsync(bias_grad)");
  }
  // An FP8 output's amax stays: the max over no elements, or over K = 0's zeros, adds nothing.
}

#undef TE_SET

}  // namespace

void gemm(const GemmArgs& g, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  check_args(g);  // before cuBLASLt: shape errors do not depend on the machine
  const Setup s = setup_of(g);

  float* product_amax = nullptr;  // set where cuBLASLt writes D's amax to scratch
  if (g.m == 0 || g.n == 0 || g.k == 0) {
    degenerate(g, stream);
  } else {
    const CublasLtApi& lt = cublaslt();
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    if (s.block && current_compute_major(device) != 9) {
      fail(TE_ERROR_UNSUPPORTED, "block-scaled FP8 (1x128 / 128x128) GEMMs run natively only on "
                                 "Hopper (compute capability 9.x); device ", device, " is ",
           current_compute_major(device), ".x");
    }
    const cublasLtHandle_t handle = handle_for(device);
    void* workspace = g.workspace;
    size_t workspace_bytes = static_cast<size_t>(g.workspace_bytes);
    if (workspace == nullptr || workspace_bytes == 0) {
      workspace = stream_workspace(device, stream);
      workspace_bytes = kDefaultWorkspaceBytes;
    }
    Plan* plan = plan_for(lt, handle, g, s, device, workspace_bytes);
    if (plan->te_epilogue) {
      run_with_te_epilogue(lt, handle, plan, g, workspace, workspace_bytes, stream);
    } else {
      GemmArgs lg = g;  // cuBLASLt's amax goes to scratch, max-accumulated below
      if (is_fp8(g.d_dtype) && g.d_amax != nullptr) {
        product_amax = lg.d_amax = stream_amax(device, stream);
      }
      std::lock_guard<std::mutex> lock(plan->mu);
      set_pointers(lt, plan->desc, lg, s);
      const float alpha = g.alpha, beta = g.beta;
      const void* c = s.fp8_out ? nullptr : g.d;
      // cuBLAS A = te B, cuBLAS B = te A.
      check_cublas(lt.Matmul(handle, plan->desc, &alpha, g.b.data, plan->a, g.a.data, plan->b,
                             &beta, c, plan->c, g.d, plan->d, &plan->algo, workspace,
                             workspace_bytes, stream),
                   "cublasLtMatmul");
    }
  }
  if (is_fp8(g.d_dtype) && (g.d_scale_inv != nullptr || product_amax != nullptr)) {
    fp8_output_scalars_kernel<<<1, 1, 0, stream>>>(g.d_scale, g.d_scale_inv, product_amax,
                                                   product_amax != nullptr ? g.d_amax : nullptr);
    check_launch("te_gemm fp8_output_scalars_kernel (D's scale_inv and amax)");
  }
}

}  // namespace cuda
}  // namespace te
