// Probe: a Hopper (sm_90a) GEMM of te's own for the product cuBLASLt runs slowest, both operands
// FP8 in 1x128 blocks along K (Float8BlockScaling's wgrad, x^T dy from the two column-wise
// copies: cuBLASLt ~1050 TFLOP/s on the H200 against ~1320 for the 1x128 x 128x128 fprop, every
// configuration it offers timed in the twenty-sixth session). Checked against a naive fp32
// reference and timed against cuBLASLt's kernel in alternating rounds. Not part of te: te_gemm runs
// cuBLASLt, which this kernel does not beat yet (benchmarks/NOTES.md, twenty-eighth session: its
// best variant runs at 0.89-0.90x cuBLASLt's speed). It is the starting point for te's own Hopper
// GEMM (the fused epilogues the MLP targets need): TMA maps, an mbarrier ring filled by a producer
// warpgroup, wgmma on 128-byte-swizzled K-major tiles, block-scale promotion, a persistent loop.
//
// D[M, N] = alpha * sum over 128-blocks kb of (sum over k in kb of A[m, k] B[n, k]) * sa[kb, m] *
// sb[kb, n] (+ beta * D_old), A stored [M, K] and B stored [N, K] (K contiguous, Hopper's only FP8
// layout), scales in te/tensor.h's 1-D layout. Each 128-block's partial sum is accumulated by the
// tensor core from zero (wgmma m64nNk32, four per block), then promoted into fp32 registers with
// its two scales: the same bound on the tensor core's short accumulator as cuBLASLt's block-scaled
// kernels, and the CPU reference's numerics up to the order of the fp32 additions.
//
// Shape: one CTA per SM walking output tiles of kBlockM x kBlockN. One thread of a producer
// warpgroup issues every copy: TMA for the operands' 128-deep K slices (128-byte swizzle, zero fill
// past the edges) and bulk copies for their scales, into a ring of stages it keeps full across
// tiles. Two or three consumer warpgroups of 64 rows each hold their 64 x kBlockN fp32 result and
// a 64 x kWgmmaN wgmma accumulator; setmaxnreg moves registers from the producer (40) to them (232
// each for two, 152 for three). Each consumer waits for its whole wgmma batch before promoting:
// reading one accumulator while another batch is in flight makes ptxas serialize every wgmma
// (C7514), so the tensor cores are kept busy by the other warpgroups' batches instead. Variants
// (Tile): 128 x 256 in two m64n128 halves ("wide") or 128 x 192 in one m64n192 ("narrow") with two
// consumers, 192 x 128 with three ("tall"); batches issued in turns (named barriers) or not;
// column scales bulk-copied in place or written permuted by a producer warp ("-perm").
// "tensor-*": per-tensor scales with fast accumulation (te_gemm's per-tensor fprop), timed against
// cuBLASLt's per-tensor kernel with fast accumulation: whether a GEMM of te's own can match the
// kernels a fused epilogue would replace (benchmarks/NOTES.md, thirty-second session); and the
// fused fc1 epilogue itself on the ping-pong tiles (h, gelu(h)'s two FP8 copies and amax),
// checked against te's own gelu and FP8 conversion and timed against the same kernel without it,
// each scheme also with its stores in whole sectors ("vec": a quad transpose of the bf16 pairs).
// "tensor-split*": per-tensor with split accumulation (each K slice promoted into the fp32
// result), timed against cuBLASLt with FAST_ACCUM off: te's dgrad default, the GEMM a dGELU
// epilogue in FC2's dgrad would run on.
//
// "tensor-pingpong-cluster": the ping-pong tiles in 2 x 1 clusters multicasting the shared B slice
// (half the B reads from L2), with the gelu epilogue too; mode 3, a process of its own.
//
// Build and run on the GPU machine (cuBLASLt from the nvidia-cublas wheel beside torch):
//   NV=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')
//   nvcc -std=c++17 -arch=sm_90a -O3 -Ipackages/te-core/csrc -Ipackages/te-cpp-headers/include \
//     -I$NV/include benchmarks/block_gemm_sm90.cu -o /tmp/block_gemm \
//     -Xlinker $NV/lib/libcublasLt.so.13 -Xlinker -rpath=$NV/lib
//   /tmp/block_gemm [iters=10] [rounds=7] [mode: 0 check and time, 1 one call of each (for ncu),
//                   2 check and time the per-tensor variants and the gelu epilogue only,
//                   3 the same for the 2 x 1 cluster scheme]
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdlib>

#include "common/kernels.h"
#include "cuda/activation.cuh"
#include "cuda/cuda_utils.cuh"
#include "te/gemm.h"

namespace te {
namespace cuda {
namespace probe {

int multiprocessors() {
  int n = 0;
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0);
  return n;
}

constexpr int kBlockK = 128;

template <int kWgmmaN_, int kHalves_, int kStages_, bool kTakeTurns_, int kConsumers_ = 2,
          bool kPermutedScales_ = false, bool kPerTensor_ = false, bool kPingPong_ = false,
          bool kGelu_ = false, bool kSplit_ = false, bool kCluster_ = false,
          bool kVecEpilogue_ = false>
struct Tile {
  // Per-tensor scales (delayed / current scaling) with fast accumulation, as te_gemm asks
  // cuBLASLt for fprop: the tensor core accumulates the whole K, the two scales multiply alpha
  // once in the epilogue, and a consumer keeps one K slice's batch in flight while the next is
  // issued (no promotion to wait for). The question it answers: whether a GEMM of te's own can
  // match cuBLASLt's per-tensor FP8 kernels, which a fused epilogue (gelu writing both FP8
  // copies, dGELU in dgrad) would have to do to pay.
  static constexpr bool kPerTensor = kPerTensor_;
  static_assert(!(kPerTensor && kPermutedScales_), "per-tensor: no scale tables to permute");
  // Per-tensor with split accumulation (te's dgrad / wgrad default, cuBLASLt's FAST_ACCUM off):
  // each K slice's batch starts from zero and is added into the fp32 result, the block kernels'
  // promotion without the scales. What a dGELU epilogue in FC2's dgrad would run on.
  static constexpr bool kSplit = kSplit_;
  static_assert(!kSplit || (kPerTensor && !kPingPong_), "split: per-tensor, cooperative tiles");
  // Ping-pong in clusters of two CTAs on vertically adjacent tiles (same columns): each CTA's
  // producer loads half of the shared B slice and multicasts it to both, so a CTA reads 24 KB of
  // L2 per slice instead of 40 (cuBLASLt's 2 x 1 clusters). A stage is free once the consumers
  // of both CTAs release it (their warps arrive on both CTAs' empty barriers), and a producer
  // waits for its last stages' releases before its CTA exits (the peer still arrives there).
  static constexpr bool kCluster = kCluster_;
  static_assert(!kCluster || (kPingPong_ && kPerTensor), "clusters: ping-pong per-tensor tiles");
  // Ping-pong (per-tensor only): each consumer warpgroup owns whole 64-row tiles, the CTA's tiles
  // alternating between them, so one warpgroup's epilogue runs while the other's mainloop keeps
  // the tensor core busy (else the tensor core idles through every tile's stores). The stage
  // ring is filled in tile order, so the two mainloops follow each other without a barrier.
  static constexpr bool kPingPong = kPingPong_;
  static_assert(!kPingPong || (kPerTensor && kConsumers_ == 2 && !kTakeTurns_), "ping-pong");
  // LayerNormMLP's fc1 epilogue fused (ping-pong only): D is h = bf16(alpha acc + bias), and
  // gelu(h) is quantized with the delayed scale into a row-wise copy (stored from registers) and
  // a column-wise one (through a shared-memory transpose of the warpgroup's tile, columns
  // kColStride bytes apart: 64 rows + 16 bytes, so a warp's byte stores spread over the banks
  // and each column stays 16-byte aligned), with |gelu(h)|'s max folded into an amax.
  static constexpr bool kGelu = kGelu_;
  // Also on the cooperative 128 x 256 tiles (each warpgroup's 64 rows through the same epilogue),
  // whose two warpgroups read one B slice where the ping-pong ones read one each: the ping-pong
  // tiles ask the L2 for ~0.0098 bytes per FLOP, ~14.5 TB/s at cuBLASLt's ~1480 TFLOP/s, more
  // than it gives (the block kernels' ncu: 43-52% busy at ~5.7 TB/s), the cooperative ones for
  // ~0.0057 (~8.5 TB/s), at the price of an epilogue in which the tensor cores wait.
  static_assert(!kGelu || (kPerTensor && !kSplit_), "the fused gelu epilogue: fast per-tensor");
  static constexpr int kColStride = 80;
  // The gelu epilogue's stores in whole sectors (store_tile_gelu_vec): each lane trades its
  // column pairs within its quad for eight consecutive columns of one row.
  static constexpr bool kVecEpilogue = kVecEpilogue_;
  static_assert(!kVecEpilogue || kGelu, "the whole-sector stores: the gelu epilogue's");
  // Column scales written into shared memory by a warp of the producer warpgroup, permuted so a
  // consumer thread reads the four it needs for two column groups as one float4 (half the shared
  // loads of reading them in place, two per float2); else bulk-copied in place.
  static constexpr bool kPermutedScales = kPermutedScales_;
  // Consumer warpgroups of 64 rows each (2 or 3), and the registers setmaxnreg gives each of
  // their threads: a scheduler holds one producer warp (40) and one warp of each consumer.
  static constexpr int kConsumers = kConsumers_, kBlockM = kPingPong ? 64 : 64 * kConsumers;
  // Warps that release a stage: those of every consumer warpgroup, or (ping-pong) of its owner.
  static constexpr int kStageReaders = kCluster ? 8 : (kPingPong ? 4 : 4 * kConsumers);
  static constexpr int kClusterSize = kCluster ? 2 : 1;
  static constexpr int kConsumerThreads = 128 * kConsumers, kThreads = kConsumerThreads + 128;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 232 : 152;
  static_assert(40 + kConsumers * kConsumerRegs <= 512, "registers per scheduler lane");
  static constexpr int kWgmmaN = kWgmmaN_, kHalves = kHalves_, kStages = kStages_;
  // The consumer warpgroups issue their wgmma batches in turns (named barriers 1..kConsumers), so
  // one promotes while another's batch runs instead of all waiting on the tensor cores together.
  static constexpr bool kTakeTurns = kTakeTurns_;
  static constexpr int kBlockN = kWgmmaN * kHalves;
  static constexpr int kABytes = kBlockM * kBlockK, kBBytes = kBlockN * kBlockK;
  static constexpr int kStageBytes = kABytes + kBBytes;  // a multiple of 1024 (the swizzle)
  static constexpr int kScaleOffset = kStages * kStageBytes;
  static constexpr int kScaleStageBytes = kPerTensor ? 0 : (kBlockM + kBlockN) * 4;
  static constexpr int kBarOffset = kScaleOffset + kStages * kScaleStageBytes;
  static constexpr int kTransposeOffset = (kBarOffset + 2 * kStages * 8 + 15) / 16 * 16;
  static constexpr int kTransposeBytes = kGelu ? kConsumers * kBlockN * kColStride : 0;
  static constexpr int kSmemBytes = kTransposeOffset + kTransposeBytes + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");
};

struct Params {
  int64_t m, n, k;
  const float* a_scale;  // [ceil(K/128), a_scale_ld]; per-tensor: [1]
  const float* b_scale;  // [ceil(K/128), b_scale_ld]; per-tensor: [1]
  int64_t a_scale_ld, b_scale_ld;
  float alpha, beta;
  void* d;
  int32_t d_dtype;
  int tiles_n, tiles;
  // The tiles' order (tile_origin): 0 row-major, else group_m row blocks at a time down each
  // column block.
  int group_m;
  // kGelu only: bias [n] (or null), gelu(h)'s FP8 E4M3 copies [m, n] and [n, m], the scale they
  // are quantized with [1], and the amax [1] they max-accumulate into.
  const __nv_bfloat16* bias;
  uint8_t* q_row;
  uint8_t* q_col;
  const float* q_scale;
  float* q_amax;
};

// What a kGelu launch writes besides D (Params' last five fields).
struct GeluOut {
  const __nv_bfloat16* bias;
  uint8_t* q_row;
  uint8_t* q_col;
  const float* q_scale;
  float* q_amax;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TE_SM90A_DEVICE 1
#endif

// Tile `tile`'s first row and column. Row-major, a wave of CTAs (two rows of 64 x 256 tiles per
// SM in the ping-pong kernels) covers a few row blocks and every column block, so at 16384 x
// 16384 x 4096 each wave reads all of B (64 MiB, more than the L2) from DRAM again. Grouped, a
// wave covers group_m row blocks and a few column blocks, and B is read once per group.
__device__ __forceinline__ void tile_origin(const Params& p, int tile, int block_m, int block_n,
                                            int64_t& m0, int64_t& n0) {
  int tm = tile / p.tiles_n, tn = tile % p.tiles_n;
  if (p.group_m > 0) {
    const int tiles_m = p.tiles / p.tiles_n, per_group = p.group_m * p.tiles_n;
    const int first = tile / per_group * p.group_m;
    const int rows = min(p.group_m, tiles_m - first), in = tile % per_group;
    tm = first + in % rows;
    tn = in / rows;
  }
  m0 = int64_t{tm} * block_m;
  n0 = int64_t{tn} * block_n;
}

#ifdef TE_SM90A_DEVICE
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                         int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, "
      "%4}], [%2];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// Cluster pieces (kCluster): this CTA's rank, a barrier arrival on the peer CTA's copy of a
// barrier, a TMA load written into every CTA of `mask` (each barrier at the same offset gets the
// bytes), and the cluster-wide barrier.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void bar_arrive_remote(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote)
               : "memory");
}
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap* map,
                                                   uint32_t bar, int32_t c0, int32_t c1,
                                                   uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}

// wgmma descriptor of a K-major tile with 128-byte rows, 128-byte swizzle, 8-row groups 1024
// bytes apart; stepping K by 32 elements adds 32 bytes to the start address.
__device__ __forceinline__ uint64_t tile_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

#define TE_WGMMA_REGS_64 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

#define TE_WGMMA_OPERANDS_64 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
  "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
  "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
  "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
  "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
  "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
  "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
  "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
  "+f"(d[62]), "+f"(d[63])

#define TE_WGMMA_REGS_96 \
  TE_WGMMA_REGS_64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, " \
  "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"

#define TE_WGMMA_OPERANDS_96 \
  TE_WGMMA_OPERANDS_64, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), \
  "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), \
  "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), \
  "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), \
  "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])


#define TE_WGMMA_ASM(SHAPE, REGS, OPERANDS, IA, IB, IS, TA, TB)                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IS ", 0;\n"                           \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TA "." TB " {" REGS "}, %" IA \
               ", %" IB ", p, 1, 1;\n}\n"                                                 \
               : OPERANDS                                                                \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate))
#define TE_WGMMA_N128(TA, TB) \
  TE_WGMMA_ASM("m64n128k32", TE_WGMMA_REGS_64, TE_WGMMA_OPERANDS_64, "64", "65", "66", TA, TB)
#define TE_WGMMA_N192(TA, TB) \
  TE_WGMMA_ASM("m64n192k32", TE_WGMMA_REGS_96, TE_WGMMA_OPERANDS_96, "96", "97", "98", TA, TB)
#define TE_WGMMA_TYPED(OP)                                                     \
  if constexpr (TypeA == TE_DTYPE_FLOAT8_E4M3 && TypeB == TE_DTYPE_FLOAT8_E4M3) { \
    OP("e4m3", "e4m3");                                                        \
  } else if constexpr (TypeA == TE_DTYPE_FLOAT8_E4M3) {                        \
    OP("e4m3", "e5m2");                                                        \
  } else if constexpr (TypeB == TE_DTYPE_FLOAT8_E4M3) {                        \
    OP("e5m2", "e4m3");                                                        \
  } else {                                                                     \
    OP("e5m2", "e5m2");                                                        \
  }

// d (+)= A_tile (64 x 32, K-major) * B_tile (N x 32, K-major)^T; accumulate = 0 starts from zero.
template <int N, int TypeA, int TypeB>
__device__ __forceinline__ void wgmma(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                      int accumulate) {
  static_assert(N == 128 || N == 192, "wgmma: N is 128 or 192");
  if constexpr (N == 128) {
    TE_WGMMA_TYPED(TE_WGMMA_N128)
  } else {
    TE_WGMMA_TYPED(TE_WGMMA_N192)
  }
}
#undef TE_WGMMA_TYPED
#undef TE_WGMMA_N192
#undef TE_WGMMA_N128
#undef TE_WGMMA_ASM

__device__ __forceinline__ void named_sync(int id) {
  asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory");  // the waiting and the opening warpgroup
}
__device__ __forceinline__ void named_arrive(int id) {
  asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory");
}
__device__ __forceinline__ void warpgroup_sync(int id) {
  asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
}

// Half h of a tile's accumulator, as the N / 2 registers one wgmma writes.
template <int R, int kAll>
__device__ __forceinline__ float (&half_of(float (&acc)[kAll], int h))[R] {
  return *reinterpret_cast<float(*)[R]>(acc + h * R);
}

// Keeps the compiler from moving reads of wgmma's registers above the wait for it.
template <int R>
__device__ __forceinline__ void pin(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D's two elements (row, col) and (row, col + 1) as floats; the second is 0 past N.
template <typename T>
__device__ __forceinline__ float2 load_pair(const T* d, bool both, bool vector) {
  if (vector) {
    if constexpr (sizeof(T) == 4) {
      return *reinterpret_cast<const float2*>(d);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(d));
    } else {
      return __half22float2(*reinterpret_cast<const __half2*>(d));
    }
  }
  return make_float2(static_cast<float>(d[0]), both ? static_cast<float>(d[1]) : 0.0f);
}

template <typename T>
__device__ __forceinline__ void store_pair(T* d, bool both, bool vector, float v0, float v1) {
  if (vector) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float2*>(d) = make_float2(v0, v1);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      *reinterpret_cast<__nv_bfloat162*>(d) = __floats2bfloat162_rn(v0, v1);
    } else {
      *reinterpret_cast<__half2*>(d) = __floats2half2_rn(v0, v1);
    }
    return;
  }
  d[0] = static_cast<T>(v0);
  if (both) d[1] = static_cast<T>(v1);
}

// The tile's D = alpha acc (+ beta D_old). D_old is read for a batch of column groups before any
// of them is written: read and written one pair at a time, each load would wait for the store
// before it (the compiler cannot tell they do not overlap), a full memory latency per pair.
template <typename T, int kGroups>
__device__ __forceinline__ void store_tile(const Params& p, float alpha, const float* acc,
                                           int64_t m0, int64_t n0, int row0, int col0) {
  constexpr int kBatch = 8;
  static_assert(kGroups % kBatch == 0, "column groups per batch");
#pragma unroll
  for (int c0 = 0; c0 < kGroups; c0 += kBatch) {
    float2 old[kBatch][2];
#pragma unroll
    for (int c = 0; c < kBatch; ++c) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = m0 + row0 + 8 * half, col = n0 + 8 * (c0 + c) + col0;
        old[c][half] = make_float2(0.0f, 0.0f);
        if (p.beta != 0.0f && row < p.m && col < p.n) {
          const bool both = col + 1 < p.n;
          old[c][half] =
              load_pair(static_cast<const T*>(p.d) + row * p.n + col, both, both && p.n % 2 == 0);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < kBatch; ++c) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = m0 + row0 + 8 * half, col = n0 + 8 * (c0 + c) + col0;
        if (row >= p.m || col >= p.n) continue;
        const bool both = col + 1 < p.n;
        const float* a = acc + 4 * (c0 + c) + 2 * half;
        store_pair(static_cast<T*>(p.d) + row * p.n + col, both, both && p.n % 2 == 0,
                   alpha * a[0] + p.beta * old[c][half].x, alpha * a[1] + p.beta * old[c][half].y);
      }
    }
  }
}

// A 4 x 4 transpose of 32-bit words across each quad of lanes (j: the lane's place in its
// quad): 2 x 2 blocks across the lanes two apart, then within them across neighbours, so lane j
// ends with w[k] = lane k's w[j]. In the wgmma layout, where lane k of a quad holds columns
// 2 k, 2 k + 1 of each eight-column group as a bf16 pair w[group], lane j ends with the eight
// consecutive columns of group j.
// One stage of it: the lanes kMask apart trade two words, the lane with `upper` set giving and
// taking w[kU0], w[kU1], its partner w[kL0], w[kL1] (indices fixed at compile time, so w stays
// in registers).
template <int kMask, int kU0, int kU1, int kL0, int kL1>
__device__ __forceinline__ void trade_pair(uint32_t (&w)[4], bool upper) {
  const uint32_t r0 = __shfl_xor_sync(0xffffffffu, upper ? w[kU0] : w[kL0], kMask);
  const uint32_t r1 = __shfl_xor_sync(0xffffffffu, upper ? w[kU1] : w[kL1], kMask);
  if (upper) {
    w[kU0] = r0;
    w[kU1] = r1;
  } else {
    w[kL0] = r0;
    w[kL1] = r1;
  }
}

__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], int j) {
  trade_pair<2, 0, 1, 2, 3>(w, (j & 2) != 0);
  trade_pair<1, 0, 2, 1, 3>(w, (j & 1) != 0);
}

// store_tile for a bf16 D with beta 0 in whole sectors (per-tensor variants): the quad of lanes
// trades its bf16 pairs (store_tile_gelu_vec's transpose) so a lane stores eight consecutive
// columns of a row as one 16-byte store, not four 4-byte ones: half the L2 requests.
template <int kGroups>
__device__ __forceinline__ void store_tile_bf16_vec(const Params& p, float alpha, const float* acc,
                                                    int64_t m0, int64_t n0, int row0, int col0) {
  static_assert(kGroups % 4 == 0, "column groups in quads");
  const int j = col0 / 2;  // the lane's place in its quad
  auto* d = static_cast<__nv_bfloat16*>(p.d);
#pragma unroll
  for (int q = 0; q < kGroups / 4; ++q) {
    const int64_t col = n0 + 8 * (4 * q + j);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t w[4];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const float* a = acc + 4 * (4 * q + jj) + 2 * half;
        const __nv_bfloat162 h2 = __floats2bfloat162_rn(alpha * a[0], alpha * a[1]);
        w[jj] = *reinterpret_cast<const uint32_t*>(&h2);
      }
      quad_transpose(w, j);
      const int64_t row = m0 + row0 + 8 * half;
      if (row >= p.m || col >= p.n) continue;
      if (p.n % 8 == 0 && col + 8 <= p.n) {
        reinterpret_cast<uint4*>(d + row * p.n + n0)[4 * q + j] = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        const auto* hb = reinterpret_cast<const __nv_bfloat16*>(w);
        for (int e = 0; e < 8 && col + e < p.n; ++e) d[row * p.n + col + e] = hb[e];
      }
    }
  }
}

// The kGelu epilogue of one warpgroup's 64-row tile (Tile's comment). `tr`: the warpgroup's
// transpose tile; `bar`: its named barrier; `t`: the thread's index in the warpgroup; `amax`: the
// thread's running max of |gelu(h)|'s bits (one atomic per warp at the end, not per tile: every
// tile's warps max-accumulating into one address would queue at the L2).
template <int kBlockN, int kColStride>
__device__ __forceinline__ void store_tile_gelu(const Params& p, float alpha, const float* acc,
                                                int64_t m0, int64_t n0, int row0, int col0,
                                                uint8_t* tr, int bar, int t, uint32_t& amax) {
  const float s = *p.q_scale;
  warpgroup_sync(bar);  // the previous tile's column-wise reads of tr are done
#pragma unroll
  for (int c = 0; c < kBlockN / 8; ++c) {
    const int cl = 8 * c + col0;
    const int64_t col = n0 + cl;
    const bool c0v = col < p.n, c1v = col + 1 < p.n;
    const float b0 = p.bias != nullptr && c0v ? __bfloat162float(p.bias[col]) : 0.0f;
    const float b1 = p.bias != nullptr && c1v ? __bfloat162float(p.bias[col + 1]) : 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row0 + 8 * half;
      const int64_t row = m0 + r;
      const float* a = acc + 4 * c + 2 * half;
      const __nv_bfloat162 h = __floats2bfloat162_rn(__fadd_rn(__fmul_rn(alpha, a[0]), b0),
                                                     __fadd_rn(__fmul_rn(alpha, a[1]), b1));
      const float g0 = activation::act<activation::kGelu>(__low2float(h));
      const float g1 = activation::act<activation::kGelu>(__high2float(h));
      const uint32_t q = fp8x2<TE_DTYPE_FLOAT8_E4M3>(scaled(g0, s), scaled(g1, s));
      tr[cl * kColStride + r] = static_cast<uint8_t>(q);
      tr[(cl + 1) * kColStride + r] = static_cast<uint8_t>(q >> 8);
      if (row >= p.m) continue;
      if (c0v) amax = max(amax, abs_bits(g0));
      if (c1v) amax = max(amax, abs_bits(g1));
      __nv_bfloat16* dp = static_cast<__nv_bfloat16*>(p.d) + row * p.n + col;
      uint8_t* qp = p.q_row + row * p.n + col;
      if (c1v && p.n % 2 == 0) {
        *reinterpret_cast<__nv_bfloat162*>(dp) = h;
        *reinterpret_cast<uint16_t*>(qp) = static_cast<uint16_t>(q);
      } else if (c0v) {
        dp[0] = h.x;
        qp[0] = static_cast<uint8_t>(q);
        if (c1v) {
          dp[1] = h.y;
          qp[1] = static_cast<uint8_t>(q >> 8);
        }
      }
    }
  }
  warpgroup_sync(bar);
  // Column cl of the tile is row n0 + cl of the column-wise copy, its bytes m0 .. m0 + 63.
  for (int i = t; i < kBlockN * 4; i += 128) {
    const int cl = i / 4, part = i % 4;
    const int64_t col = n0 + cl, row = m0 + 16 * part;
    if (col >= p.n || row >= p.m) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(tr + cl * kColStride + 16 * part);
    uint8_t* dst = p.q_col + col * p.m + row;
    if (p.m % 16 == 0) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
      const auto* bytes = reinterpret_cast<const uint8_t*>(&v);
      for (int k = 0; k < 16 && row + k < p.m; ++k) dst[k] = bytes[k];
    }
  }
}

// store_tile_gelu with whole sectors (Tile's kVecEpilogue): each quad of lanes holds one row's
// eight-column groups two columns a lane (the wgmma layout), so a warp's stores of h and of the
// row-wise copy write 16 and 8 bytes a row (half and a quarter of a 32-byte sector, each a
// request of its own at the L2). A 4 x 4 transpose of the quad's bf16 pairs (two shuffle
// stages) gives each lane eight consecutive columns of one row instead: 16-byte h and 8-byte
// q stores, 64 and 32 contiguous bytes a row per quad, half the L2 requests of the epilogue.
// The transpose tile is written with column group j's rows rotated by 16 j bytes, so the quad's
// four byte stores per column land in four bank groups; the read-back undoes the rotation.
template <int kBlockN, int kColStride>
__device__ __forceinline__ void store_tile_gelu_vec(const Params& p, float alpha, const float* acc,
                                                    int64_t m0, int64_t n0, int row0, int col0,
                                                    uint8_t* tr, int bar, int t, uint32_t& amax) {
  const float s = *p.q_scale;
  const int j = col0 / 2;  // the lane's place in its quad
  const bool vec_rows = p.n % 8 == 0;  // every row's groups 16-byte (h) / 8-byte (q) aligned
  warpgroup_sync(bar);  // the previous tile's column-wise reads of tr are done
#pragma unroll
  for (int q = 0; q < kBlockN / 32; ++q) {
    float b[4][2];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int64_t col = n0 + 8 * (4 * q + jj) + col0;
      b[jj][0] = p.bias != nullptr && col < p.n ? __bfloat162float(p.bias[col]) : -0.0f;
      b[jj][1] = p.bias != nullptr && col + 1 < p.n ? __bfloat162float(p.bias[col + 1]) : -0.0f;
    }
    const int cl = 8 * (4 * q + j);  // the eight columns this lane stores
    const int64_t col = n0 + cl;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t w[4];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const float* a = acc + 4 * (4 * q + jj) + 2 * half;
        const __nv_bfloat162 h2 =
            __floats2bfloat162_rn(__fadd_rn(__fmul_rn(alpha, a[0]), b[jj][0]),
                                  __fadd_rn(__fmul_rn(alpha, a[1]), b[jj][1]));
        w[jj] = *reinterpret_cast<const uint32_t*>(&h2);
      }
      quad_transpose(w, j);  // w[k]: lane k's pair of column group 4 q + j
      const int r = row0 + 8 * half;
      const int64_t row = m0 + r;
      float g[8];
      uint32_t qw[2] = {0, 0};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const __nv_bfloat162 h2 = *reinterpret_cast<const __nv_bfloat162*>(&w[k]);
        g[2 * k] = activation::act<activation::kGelu>(__low2float(h2));
        g[2 * k + 1] = activation::act<activation::kGelu>(__high2float(h2));
        const uint32_t q2 = fp8x2<TE_DTYPE_FLOAT8_E4M3>(scaled(g[2 * k], s), scaled(g[2 * k + 1], s));
        qw[k / 2] |= q2 << (16 * (k % 2));
      }
      const int rot = (r + 16 * j) & 63;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        tr[(cl + e) * kColStride + rot] = static_cast<uint8_t>(qw[e / 4] >> (8 * (e % 4)));
      }
      if (row >= p.m || col >= p.n) continue;
      __nv_bfloat16* dp = static_cast<__nv_bfloat16*>(p.d) + row * p.n + col;
      uint8_t* qp = p.q_row + row * p.n + col;
      if (vec_rows && col + 8 <= p.n) {
#pragma unroll
        for (int e = 0; e < 8; ++e) amax = max(amax, abs_bits(g[e]));
        // (indexed as vectors: as dp, n0 | 8 j lost its alignment to ptxas, which split the
        // q = 0 stores into 4-byte ones)
        reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.d) + row * p.n + n0)[4 * q + j] =
            make_uint4(w[0], w[1], w[2], w[3]);
        reinterpret_cast<uint2*>(p.q_row + row * p.n + n0)[4 * q + j] = make_uint2(qw[0], qw[1]);
      } else {
        const auto* hb = reinterpret_cast<const __nv_bfloat16*>(w);
        for (int e = 0; e < 8 && col + e < p.n; ++e) {
          amax = max(amax, abs_bits(g[e]));
          dp[e] = hb[e];
          qp[e] = static_cast<uint8_t>(qw[e / 4] >> (8 * (e % 4)));
        }
      }
    }
  }
  warpgroup_sync(bar);
  // Column cl of the tile is row n0 + cl of the column-wise copy, its bytes m0 .. m0 + 63; rows
  // 16 part .. of column group g sit at 16 ((part + g) % 4) of the column's 64 bytes.
  for (int i = t; i < kBlockN * 4; i += 128) {
    const int cl = i / 4, part = i % 4;
    const int64_t col = n0 + cl, row = m0 + 16 * part;
    if (col >= p.n || row >= p.m) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(tr + cl * kColStride +
                                                    16 * ((part + (cl >> 3)) & 3));
    uint8_t* dst = p.q_col + col * p.m + row;
    if (p.m % 16 == 0) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
      const auto* bytes = reinterpret_cast<const uint8_t*>(&v);
      for (int k = 0; k < 16 && row + k < p.m; ++k) dst[k] = bytes[k];
    }
  }
}
#endif  // TE_SM90A_DEVICE

template <int TypeA, int TypeB, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    block1d_gemm_kernel(const __grid_constant__ CUtensorMap map_a,
                        const __grid_constant__ CUtensorMap map_b, const Params p) {
#ifdef TE_SM90A_DEVICE
  constexpr int kStages = Cfg::kStages, kBlockN = Cfg::kBlockN, kWgmmaN = Cfg::kWgmmaN;
  constexpr int kBlockM = Cfg::kBlockM, kConsumerThreads = Cfg::kConsumerThreads;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023) & ~uint32_t{1023};
  const float* scales = reinterpret_cast<const float*>(smem_raw + (base - smem_addr(smem_raw)) +
                                                       Cfg::kScaleOffset);
  const uint32_t full = base + Cfg::kBarOffset, empty = full + kStages * 8;
  const int k_blocks = static_cast<int>((p.k + kBlockK - 1) / kBlockK);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      bar_init(full + 8 * s, Cfg::kPermutedScales ? 33 : 1);  // + the scale warp's 32 lanes
      bar_init(empty + 8 * s, Cfg::kStageReaders);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // kCluster: the tiles walked are the cluster's (2 x 64 rows); this CTA's are `rank`'s half.
  const int walker = Cfg::kCluster ? static_cast<int>(blockIdx.x) / 2 : static_cast<int>(blockIdx.x);
  const int walkers = Cfg::kCluster ? static_cast<int>(gridDim.x) / 2 : static_cast<int>(gridDim.x);
  const uint32_t rank = Cfg::kCluster ? cluster_rank() : 0;
  if constexpr (Cfg::kCluster) cluster_sync();  // both CTAs' barriers initialized

  if (warp >= kConsumerThreads / 32) {  // the producer warpgroup: one thread issues every copy
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (Cfg::kPermutedScales && warp == kConsumerThreads / 32 + 1) {
      // The scale warp: row scales in place, column j = 8 c + 2 q + e at q (kBlockN / 4) + 2 c + e
      // (q = the consumer thread's lane % 4). Entries past the table's leading dimension are 0:
      // they feed rows and columns that are never stored.
      int it = 0;
      for (int tile = blockIdx.x; tile < p.tiles; tile += gridDim.x) {
        int64_t m0, n0;
        tile_origin(p, tile, kBlockM, kBlockN, m0, n0);
        for (int kb = 0; kb < k_blocks; ++kb, ++it) {
          const int s = it % kStages;
          if (it >= kStages) bar_wait(empty + 8 * s, ((it / kStages) + 1) & 1);
          float* sa = const_cast<float*>(scales) + s * (Cfg::kScaleStageBytes / 4);
          float* sb = sa + kBlockM;
          const float* ga = p.a_scale + kb * p.a_scale_ld;
          const float* gb = p.b_scale + kb * p.b_scale_ld;
          for (int i = lane; i < kBlockM; i += 32) sa[i] = m0 + i < p.a_scale_ld ? ga[m0 + i] : 0.0f;
          for (int j = lane; j < kBlockN; j += 32) {
            const int c = j / 8, q = (j % 8) / 2, e = j % 2;
            sb[q * (kBlockN / 4) + 2 * c + e] = n0 + j < p.b_scale_ld ? gb[n0 + j] : 0.0f;
          }
          bar_arrive(full + 8 * s);  // release: this lane's stores are seen by the waiters
        }
      }
      return;
    }
    if (warp != kConsumerThreads / 32 || lane != 0) return;
    int it = 0;  // K slices issued so far, over all of this CTA's tiles
    for (int tile = walker; tile < p.tiles; tile += walkers) {
      int64_t m0, n0;
      tile_origin(p, tile, kBlockM * Cfg::kClusterSize, kBlockN, m0, n0);
      m0 += kBlockM * rank;
      // Scale rows are read up to the padded leading dimension (a multiple of 4 floats), so every
      // copy is whole 16-byte units inside the table; entries past M or N feed rows and columns
      // that are never stored.
      const uint32_t a_bytes =
          static_cast<uint32_t>(4 * (p.a_scale_ld - m0 < kBlockM ? p.a_scale_ld - m0 : kBlockM));
      const uint32_t b_bytes =
          static_cast<uint32_t>(4 * (p.b_scale_ld - n0 < kBlockN ? p.b_scale_ld - n0 : kBlockN));
      for (int kb = 0; kb < k_blocks; ++kb, ++it) {
        const int s = it % kStages;
        if (it >= kStages) bar_wait(empty + 8 * s, ((it / kStages) + 1) & 1);
        const uint32_t bar = full + 8 * s;
        bar_expect_tx(bar, Cfg::kStageBytes +
                               (Cfg::kPermutedScales || Cfg::kPerTensor ? 0 : a_bytes + b_bytes));
        const uint32_t stage = base + s * Cfg::kStageBytes;
        tma_load(stage, &map_a, bar, kb * kBlockK, static_cast<int32_t>(m0));
        if constexpr (Cfg::kCluster) {  // this CTA's half of B, into both CTAs
          constexpr int kHalfRows = kBlockN / 2;
          tma_load_multicast(stage + Cfg::kABytes + rank * kHalfRows * kBlockK, &map_b, bar,
                             kb * kBlockK, static_cast<int32_t>(n0 + kHalfRows * rank), 0x3);
        } else {
          tma_load(stage + Cfg::kABytes, &map_b, bar, kb * kBlockK, static_cast<int32_t>(n0));
        }
        if (!Cfg::kPermutedScales && !Cfg::kPerTensor) {
          const uint32_t sc = base + Cfg::kScaleOffset + s * Cfg::kScaleStageBytes;
          bulk_load(sc, p.a_scale + kb * p.a_scale_ld + m0, a_bytes, bar);
          bulk_load(sc + kBlockM * 4, p.b_scale + kb * p.b_scale_ld + n0, b_bytes, bar);
        }
      }
    }
    if constexpr (Cfg::kCluster) {
      // The peer's consumers still arrive on this CTA's empty barriers: wait for the releases
      // of the last kStages slices (both CTAs' warps) before the CTA may exit.
      for (int j = it < kStages ? kStages : it; j < it + kStages; ++j) {
        bar_wait(empty + 8 * (j % kStages), ((j / kStages) + 1) & 1);
      }
    }
    return;
  }

  // Consumer warpgroup g holds rows 64 g .. 64 g + 63 of the tile. In wgmma's accumulator layout
  // register i of a 64 x kWgmmaN block is row 16 w + lane / 4 + 8 ((i / 2) % 2), column
  // 8 (i / 4) + 2 (lane % 4) + i % 2, for warp w of the warpgroup.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Cfg::kConsumerRegs));
  const int g = warp / 4;
  const int row0 = (Cfg::kPingPong ? 0 : 64 * g) + 16 * (warp % 4) + lane / 4;
  const uint32_t a_rows = Cfg::kPingPong ? 0 : 64 * g * kBlockK;  // this warpgroup's A rows
  const int col0 = 2 * (lane % 4);
  float part[kWgmmaN / 2];
#pragma unroll
  for (int i = 0; i < kWgmmaN / 2; ++i) part[i] = 0.0f;
  // Turns: warpgroup g waits on barrier 1 + g before each batch and then opens the next
  // warpgroup's; the last one opens warpgroup 0's barrier once first.
  const int my_turn = 1 + g, next_turn = 1 + (g + 1) % Cfg::kConsumers;
  // A warp's release of a stage: to this CTA's producer, and (kCluster) to the peer's, whose
  // multicast half of B lands in this CTA's stage too.
  auto release = [&](uint32_t bar) {
    bar_arrive(bar);
    if constexpr (Cfg::kCluster) bar_arrive_remote(bar, rank ^ 1u);
  };
  if (Cfg::kTakeTurns && g == Cfg::kConsumers - 1) named_arrive(1);
  int it = 0;
  uint32_t gelu_amax = 0;  // kGelu: this thread's max of |gelu(h)|'s bits over its tiles
  const int tile_step = Cfg::kPingPong ? 2 * walkers : walkers;
  for (int tile = walker + (Cfg::kPingPong ? g * walkers : 0); tile < p.tiles;
       tile += tile_step) {
    int64_t m0, n0;
    tile_origin(p, tile, kBlockM * Cfg::kClusterSize, kBlockN, m0, n0);
    m0 += kBlockM * rank;
    // ping-pong: the ring position of this tile's first slice (the producer walks every tile)
    const int local = (tile - walker) / walkers;
    if (Cfg::kPingPong) it = local * k_blocks;
    float acc[kBlockN / 2];
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) acc[i] = 0.0f;
    if constexpr (Cfg::kPerTensor && !Cfg::kSplit) {
      // Each K slice is one batch into acc itself; waiting for all but the newest batch frees the
      // slice before it, so the tensor core always has the next batch queued.
      // Ping-pong: a warpgroup starts a mainloop once the other has issued its previous one
      // (named barrier 1 + g): a stage's mbarrier is waited on by parity, which tells only
      // adjacent phases apart, so no warpgroup may wait on a slice more than one trip of the ring
      // ahead of the producer.
      if (Cfg::kPingPong && local > 0) named_sync(1 + g);
      for (int kb = 0; kb < k_blocks; ++kb, ++it) {
        const int s = it % kStages;
        bar_wait(full + 8 * s, (it / kStages) & 1);
        const uint32_t a_tile = base + s * Cfg::kStageBytes + a_rows;
        const uint32_t b_tile = base + s * Cfg::kStageBytes + Cfg::kABytes;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int h = 0; h < Cfg::kHalves; ++h) {
#pragma unroll
          for (int kk = 0; kk < kBlockK / 32; ++kk) {
            wgmma<kWgmmaN, TypeA, TypeB>(half_of<kWgmmaN / 2>(acc, h), tile_desc(a_tile + 32 * kk),
                                         tile_desc(b_tile + h * kWgmmaN * kBlockK + 32 * kk), 1);
          }
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        __syncwarp();
        if (kb > 0 && lane == 0) release(empty + 8 * ((it - 1) % kStages));
      }
      if (Cfg::kPingPong) named_arrive(2 - g);
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      pin(acc);
      __syncwarp();
      if (k_blocks > 0 && lane == 0) release(empty + 8 * ((it - 1) % kStages));
    }
    for (int kb = 0; kb < (Cfg::kPerTensor && !Cfg::kSplit ? 0 : k_blocks); ++kb, ++it) {
      const int s = it % kStages;
      bar_wait(full + 8 * s, (it / kStages) & 1);
      const uint32_t a_tile = base + s * Cfg::kStageBytes + a_rows;
      const uint32_t b_tile = base + s * Cfg::kStageBytes + Cfg::kABytes;
      const float* sa = scales + s * (Cfg::kScaleStageBytes / 4);
      const float* sb = sa + kBlockM;
      const float sa0 = Cfg::kSplit ? 1.0f : sa[row0], sa1 = Cfg::kSplit ? 1.0f : sa[row0 + 8];
#pragma unroll
      for (int h = 0; h < Cfg::kHalves; ++h) {
        if (Cfg::kTakeTurns) named_sync(my_turn);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < kBlockK / 32; ++kk) {
          wgmma<kWgmmaN, TypeA, TypeB>(part, tile_desc(a_tile + 32 * kk),
                                       tile_desc(b_tile + h * kWgmmaN * kBlockK + 32 * kk), kk > 0);
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        if (Cfg::kTakeTurns) named_arrive(next_turn);
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        pin(part);
        // column group c of this half: columns 8 c + col0 and + 1, scales sbc.x and sbc.y
        auto promote = [&](int c, float2 sbc) {
          float* out = acc + h * (kWgmmaN / 2) + 4 * c;
          out[0] = fmaf(part[4 * c + 0], sa0 * sbc.x, out[0]);
          out[1] = fmaf(part[4 * c + 1], sa0 * sbc.y, out[1]);
          out[2] = fmaf(part[4 * c + 2], sa1 * sbc.x, out[2]);
          out[3] = fmaf(part[4 * c + 3], sa1 * sbc.y, out[3]);
        };
        if constexpr (Cfg::kSplit) {
#pragma unroll
          for (int i = 0; i < kWgmmaN / 2; ++i) acc[h * (kWgmmaN / 2) + i] += part[i];
        } else if constexpr (Cfg::kPermutedScales) {
          const float* sbq = sb + (lane % 4) * (kBlockN / 4) + 2 * (h * kWgmmaN / 8);
#pragma unroll
          for (int c = 0; c < kWgmmaN / 8; c += 2) {
            const float4 v = *reinterpret_cast<const float4*>(sbq + 2 * c);
            promote(c, make_float2(v.x, v.y));
            promote(c + 1, make_float2(v.z, v.w));
          }
        } else {
#pragma unroll
          for (int c = 0; c < kWgmmaN / 8; ++c) {
            promote(c, *reinterpret_cast<const float2*>(sb + h * kWgmmaN + 8 * c + col0));
          }
        }
      }
      __syncwarp();
      if (lane == 0) bar_arrive(empty + 8 * s);
    }

    const float alpha = Cfg::kPerTensor ? p.alpha * *p.a_scale * *p.b_scale : p.alpha;
    if constexpr (Cfg::kGelu) {
      uint8_t* tr = smem_raw + (base - smem_addr(smem_raw)) + Cfg::kTransposeOffset +
                    g * kBlockN * Cfg::kColStride;
      // (cooperative: this warpgroup's 64 rows of the tile as a tile of their own)
      const int own = Cfg::kPingPong ? 0 : 64 * g;
      if constexpr (Cfg::kVecEpilogue) {
        store_tile_gelu_vec<kBlockN, Cfg::kColStride>(p, alpha, acc, m0 + own, n0, row0 - own,
                                                      col0, tr, 3 + g, threadIdx.x % 128,
                                                      gelu_amax);
      } else {
        store_tile_gelu<kBlockN, Cfg::kColStride>(p, alpha, acc, m0 + own, n0, row0 - own, col0,
                                                  tr, 3 + g, threadIdx.x % 128, gelu_amax);
      }
    } else {
      switch (p.d_dtype) {
        case TE_DTYPE_FLOAT32:
          store_tile<float, kBlockN / 8>(p, alpha, acc, m0, n0, row0, col0);
          break;
        case TE_DTYPE_BFLOAT16:
          if (Cfg::kPerTensor && p.beta == 0.0f) {
            store_tile_bf16_vec<kBlockN / 8>(p, alpha, acc, m0, n0, row0, col0);
          } else {
            store_tile<__nv_bfloat16, kBlockN / 8>(p, alpha, acc, m0, n0, row0, col0);
          }
          break;
        default: store_tile<__half, kBlockN / 8>(p, alpha, acc, m0, n0, row0, col0); break;
      }
    }
  }
  if (Cfg::kTakeTurns && g == 0) named_sync(1);  // the last warpgroup's last opening
  if (Cfg::kGelu) {
    gelu_amax = warp_max(gelu_amax);
    if (lane == 0) atomic_max_amax(p.q_amax, gelu_amax);
  }
  if (Cfg::kPingPong && walker < p.tiles) {
    // the other warpgroup's opening after its last mainloop, which nothing here waited for
    const int tiles = (p.tiles - walker + walkers - 1) / walkers;
    if (tiles % 2 == g) named_sync(1 + g);
  }
#endif  // TE_SM90A_DEVICE
}

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                cudaEnableDefault, &found),
               "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (f == nullptr || found != cudaDriverEntryPointSuccess) {
      fail(TE_ERROR_CUDA, "te_gemm: the CUDA driver has no cuTensorMapEncodeTiled");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A [rows, k] FP8 operand, K contiguous, as a TMA map of box [box_rows, 128] with 128-byte swizzle.
CUtensorMap operand_map(const void* data, int64_t rows, int64_t k, uint32_t box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k)};
  const cuuint32_t box[2] = {kBlockK, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(data),
                                    dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    fail(TE_ERROR_CUDA, "te_gemm: cuTensorMapEncodeTiled failed (", static_cast<int>(r),
         ") for an operand of ", rows, " x ", k);
  }
  return map;
}

// Params::group_m of the launches that follow (mode 2 times both orders).
int g_group_m = 0;

// persistent: one CTA per SM walking the tiles (else one CTA per tile).
template <int TypeA, int TypeB, typename Cfg>
void launch_typed(const GemmArgs& g, cudaStream_t stream, bool persistent,
                  const GeluOut* gelu = nullptr) {
  static const bool configured = [] {
    check_cuda(cudaFuncSetAttribute(block1d_gemm_kernel<TypeA, TypeB, Cfg>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
               "cudaFuncSetAttribute(block1d_gemm_kernel)");
    return true;
  }();
  (void)configured;
  // kCluster: tiles_m counts the clusters' pairs of row blocks; B is loaded in halves.
  const int64_t cluster_rows = int64_t{Cfg::kBlockM} * Cfg::kClusterSize;
  const int tiles_m = static_cast<int>((g.m + cluster_rows - 1) / cluster_rows);
  const int tiles_n = static_cast<int>((g.n + Cfg::kBlockN - 1) / Cfg::kBlockN);
  const CUtensorMap a = operand_map(g.a.data, g.m, g.k, Cfg::kBlockM);
  const CUtensorMap b = operand_map(g.b.data, g.n, g.k, Cfg::kBlockN / Cfg::kClusterSize);
  Params p{g.m,          g.n,     g.k,    g.a.scale_inv, g.b.scale_inv, g.a.scale_ld,
           g.b.scale_ld, g.alpha, g.beta, g.d,           g.d_dtype,     tiles_n,
           tiles_m * tiles_n, g_group_m};
  if (Cfg::kGelu) {
    if (gelu == nullptr || g.d_dtype != TE_DTYPE_BFLOAT16 || g.beta != 0.0f) {
      fail(TE_ERROR_INVALID_ARGUMENT, "probe: the gelu epilogue needs its outputs, a bf16 D, beta 0");
    }
    p.bias = gelu->bias;
    p.q_row = gelu->q_row;
    p.q_col = gelu->q_col;
    p.q_scale = gelu->q_scale;
    p.q_amax = gelu->q_amax;
  }
  if constexpr (Cfg::kCluster) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(2 * static_cast<unsigned>(p.tiles));
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = Cfg::kSmemBytes;
    config.stream = stream;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 2;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    // A persistent cluster that is not resident from the start would run its whole walk after
    // the others: as many as fit at once (an SM left alone in its GPC holds none).
    static const int resident = [&] {
      int n = 0;
      check_cuda(cudaOccupancyMaxActiveClusters(&n, block1d_gemm_kernel<TypeA, TypeB, Cfg>, &config),
                 "cudaOccupancyMaxActiveClusters");
      return n;
    }();
    if (resident < 1) fail(TE_ERROR_CUDA, "probe: no 2 x 1 cluster of this kernel fits an SM pair");
    const int clusters = resident < p.tiles ? resident : p.tiles;
    config.gridDim = dim3(2 * static_cast<unsigned>(clusters));
    check_cuda(cudaLaunchKernelEx(&config, block1d_gemm_kernel<TypeA, TypeB, Cfg>, a, b, p),
               "cudaLaunchKernelEx(block1d_gemm_kernel, 2 x 1 clusters)");
    return;
  }
  const int grid = persistent && multiprocessors() < p.tiles ? multiprocessors() : p.tiles;
  block1d_gemm_kernel<TypeA, TypeB, Cfg><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a, b, p);
  check_launch("te_gemm block1d_gemm_kernel (sm_90a)");
}

template <typename Cfg>
void launch(const GemmArgs& g, cudaStream_t stream, bool persistent = true) {
  const bool a_e4m3 = g.a.dtype == TE_DTYPE_FLOAT8_E4M3, b_e4m3 = g.b.dtype == TE_DTYPE_FLOAT8_E4M3;
  if (a_e4m3 && b_e4m3) {
    launch_typed<TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E4M3, Cfg>(g, stream, persistent);
  } else if (a_e4m3) {
    launch_typed<TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2, Cfg>(g, stream, persistent);
  } else if (b_e4m3) {
    launch_typed<TE_DTYPE_FLOAT8_E5M2, TE_DTYPE_FLOAT8_E4M3, Cfg>(g, stream, persistent);
  } else {
    launch_typed<TE_DTYPE_FLOAT8_E5M2, TE_DTYPE_FLOAT8_E5M2, Cfg>(g, stream, persistent);
  }
}

using Wide = Tile<128, 2, 4, false>;    // 128 x 256 tiles, two wgmma halves
using Narrow = Tile<192, 1, 5, false>;  // 128 x 192 tiles, one wgmma
using WideTurns = Tile<128, 2, 4, true>;
using NarrowTurns = Tile<192, 1, 5, true>;
using Tall = Tile<128, 1, 5, false, 3>;  // 192 x 128 tiles, three consumer warpgroups
using TallTurns = Tile<128, 1, 5, true, 3>;
using WideTurnsPermuted = Tile<128, 2, 4, true, 2, true>;
using TallTurnsPermuted = Tile<128, 1, 5, true, 3, true>;
using TensorWide = Tile<128, 2, 4, false, 2, false, true>;
using TensorNarrow = Tile<192, 1, 5, false, 2, false, true>;
using TensorTall = Tile<128, 1, 5, false, 3, false, true>;
using TensorPingPong = Tile<128, 2, 5, false, 2, false, true, true>;  // 64 x 256 per warpgroup
using TensorPingPongGelu = Tile<128, 2, 4, false, 2, false, true, true, true>;
using TensorWideGelu = Tile<128, 2, 3, false, 2, false, true, false, true>;  // 3 stages: smem
using TensorSplit = Tile<128, 2, 4, false, 2, false, true, false, false, true>;
using TensorPingPongCluster = Tile<128, 2, 5, false, 2, false, true, true, false, false, true>;
using TensorPingPongClusterGelu = Tile<128, 2, 4, false, 2, false, true, true, true, false, true>;
using TensorSplitTurns = Tile<128, 2, 4, true, 2, false, true, false, false, true>;
using TensorPingPongGeluVec = Tile<128, 2, 4, false, 2, false, true, true, true, false, false, true>;
using TensorWideGeluVec = Tile<128, 2, 3, false, 2, false, true, false, true, false, false, true>;
using TensorPingPongClusterGeluVec =
    Tile<128, 2, 4, false, 2, false, true, true, true, false, true, true>;

}  // namespace probe
}  // namespace cuda
}  // namespace te

#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

namespace {

using te::GemmArgs;
using te::GemmOperand;
namespace pr = te::cuda::probe;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// ---- the variants ------------------------------------------------------------------------------

const char* const kVariants[] = {
    "wide",          "wide-per-tile",        "narrow",        "wide-turns",  "narrow-turns",
    "tall",          "tall-turns",           "wide-turns-perm", "tall-turns-perm",
    "tensor-wide",   "tensor-wide-per-tile", "tensor-narrow", "tensor-tall", "tensor-pingpong",
    "tensor-split",  "tensor-split-turns", "tensor-pingpong-cluster"};
constexpr int kVariantCount = 16;  // the ones modes 0 and 2 run; mode 3 runs the cluster one
constexpr int kTensorPingPongCluster = 16;
constexpr int kFirstPerTensor = 9;  // variants from here on take per-tensor scales
constexpr int kTensorWide = 9;      // "tensor-wide", the cooperative gelu epilogue's own mainloop
constexpr int kTensorPingPong = 13;  // "tensor-pingpong", the fused gelu epilogue's own mainloop
constexpr int kFirstSplit = 14;      // per-tensor with split accumulation, against cuBLASLt's

bool per_tensor(int variant) { return variant >= kFirstPerTensor; }
bool split(int variant) { return variant == kFirstSplit || variant == kFirstSplit + 1; }

// E4M3 x E4M3 through variant v; other formats through the wide kernel.
void run_variant(const GemmArgs& g, int v) {
  constexpr int kE4m3 = TE_DTYPE_FLOAT8_E4M3;
  if (g.a.dtype != kE4m3 || g.b.dtype != kE4m3) {
    if (per_tensor(v)) {
      pr::launch<pr::TensorWide>(g, nullptr);
    } else {
      pr::launch<pr::Wide>(g, nullptr);
    }
    return;
  }
  switch (v) {
    case 0: pr::launch_typed<kE4m3, kE4m3, pr::Wide>(g, nullptr, true); break;
    case 1: pr::launch_typed<kE4m3, kE4m3, pr::Wide>(g, nullptr, false); break;
    case 2: pr::launch_typed<kE4m3, kE4m3, pr::Narrow>(g, nullptr, true); break;
    case 3: pr::launch_typed<kE4m3, kE4m3, pr::WideTurns>(g, nullptr, true); break;
    case 4: pr::launch_typed<kE4m3, kE4m3, pr::NarrowTurns>(g, nullptr, true); break;
    case 5: pr::launch_typed<kE4m3, kE4m3, pr::Tall>(g, nullptr, true); break;
    case 6: pr::launch_typed<kE4m3, kE4m3, pr::TallTurns>(g, nullptr, true); break;
    case 7: pr::launch_typed<kE4m3, kE4m3, pr::WideTurnsPermuted>(g, nullptr, true); break;
    case 8: pr::launch_typed<kE4m3, kE4m3, pr::TallTurnsPermuted>(g, nullptr, true); break;
    case 9: pr::launch_typed<kE4m3, kE4m3, pr::TensorWide>(g, nullptr, true); break;
    case 10: pr::launch_typed<kE4m3, kE4m3, pr::TensorWide>(g, nullptr, false); break;
    case 11: pr::launch_typed<kE4m3, kE4m3, pr::TensorNarrow>(g, nullptr, true); break;
    case 12: pr::launch_typed<kE4m3, kE4m3, pr::TensorTall>(g, nullptr, true); break;
    case 13: pr::launch_typed<kE4m3, kE4m3, pr::TensorPingPong>(g, nullptr, true); break;
    case 14: pr::launch_typed<kE4m3, kE4m3, pr::TensorSplit>(g, nullptr, true); break;
    case 15: pr::launch_typed<kE4m3, kE4m3, pr::TensorSplitTurns>(g, nullptr, true); break;
    default: pr::launch_typed<kE4m3, kE4m3, pr::TensorPingPongCluster>(g, nullptr, true); break;
  }
}

// ---- operands and the reference ----------------------------------------------------------------

__device__ float fp8_value(uint8_t v, bool e4m3) {
  if (e4m3) {
    __nv_fp8_e4m3 x;
    x.__x = v;
    return static_cast<float>(x);
  }
  __nv_fp8_e5m2 x;
  x.__x = v;
  return static_cast<float>(x);
}

// out = sum over k of dequantized products, in increasing k (the CPU reference's order);
// abs_sum = the sum of their magnitudes (the scale of the rounding a result may carry).
__global__ void reference_kernel(const uint8_t* a, const uint8_t* b, const float* sa,
                                 const float* sb, int64_t sa_ld, int64_t sb_ld, int64_t m, int64_t n,
                                 int64_t k, bool a_e4m3, bool b_e4m3, float* out, float* abs_sum) {
  const int64_t i = blockIdx.y, j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= m || j >= n) return;
  float acc = 0.0f, mag = 0.0f;
  for (int64_t kk = 0; kk < k; ++kk) {
    const float x = fp8_value(a[i * k + kk], a_e4m3) * sa[(kk / 128) * sa_ld + i];
    const float y = fp8_value(b[j * k + kk], b_e4m3) * sb[(kk / 128) * sb_ld + j];
    acc += x * y;
    mag += fabsf(x * y);
  }
  out[i * n + j] = acc;
  abs_sum[i * n + j] = mag;
}

uint32_t next_random() {
  static uint32_t state = 12345;
  state = state * 1664525u + 1013904223u;
  return state >> 8;
}

// Any finite FP8 byte (the format's whole range), or, for timing, small values of both signs.
uint8_t random_fp8(bool e4m3, bool small) {
  if (small) return static_cast<uint8_t>((next_random() & 0x37) | (next_random() & 0x80));
  for (;;) {
    const auto v = static_cast<uint8_t>(next_random() & 0xFF);
    if (e4m3 ? (v & 0x7F) == 0x7F : (v & 0x7C) == 0x7C) continue;  // NaN (and E5M2's inf)
    return v;
  }
}

struct Problem {
  int64_t m, n, k;
  bool a_e4m3, b_e4m3;
  bool tensor;  // per-tensor scales: every entry of a scale table holds that operand's one scale
  uint8_t *a = nullptr, *b = nullptr;
  float *sa = nullptr, *sb = nullptr;
  void* d = nullptr;  // room for an fp32 [m, n]
  int64_t sa_ld, sb_ld;

  Problem(int64_t m_, int64_t n_, int64_t k_, bool a_e4m3_, bool b_e4m3_, bool small, bool tensor_)
      : m(m_), n(n_), k(k_), a_e4m3(a_e4m3_), b_e4m3(b_e4m3_), tensor(tensor_),
        sa_ld((m_ + 3) / 4 * 4), sb_ld((n_ + 3) / 4 * 4) {
    const int64_t k_blocks = (k + 127) / 128;
    std::vector<uint8_t> ha(m * k), hb(n * k);
    std::vector<float> hsa(k_blocks * sa_ld), hsb(k_blocks * sb_ld);
    for (auto& x : ha) x = random_fp8(a_e4m3, small);
    for (auto& x : hb) x = random_fp8(b_e4m3, small);
    // powers of two from 1/16 to 16, as Float8BlockScaling's scales are
    for (auto& x : hsa) x = ldexpf(1.0f, static_cast<int>(next_random() % 9) - 4);
    for (auto& x : hsb) x = ldexpf(1.0f, static_cast<int>(next_random() % 9) - 4);
    if (tensor) {  // the reference reads the tables as they are, the kernels their first entry
      std::fill(hsa.begin(), hsa.end(), hsa[0]);
      std::fill(hsb.begin(), hsb.end(), hsb[0]);
    }
    check(cudaMalloc(&a, ha.size()), "cudaMalloc");
    check(cudaMalloc(&b, hb.size()), "cudaMalloc");
    check(cudaMalloc(&sa, hsa.size() * 4), "cudaMalloc");
    check(cudaMalloc(&sb, hsb.size() * 4), "cudaMalloc");
    check(cudaMalloc(&d, m * n * 4), "cudaMalloc");
    check(cudaMemcpy(a, ha.data(), ha.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(b, hb.data(), hb.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(sa, hsa.data(), hsa.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(sb, hsb.data(), hsb.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~Problem() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(sa);
    cudaFree(sb);
    cudaFree(d);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  GemmArgs args(int32_t d_dtype, float alpha, float beta) const {
    GemmArgs g{};
    g.m = m;
    g.n = n;
    g.k = k;
    const int32_t ta = a_e4m3 ? TE_DTYPE_FLOAT8_E4M3 : TE_DTYPE_FLOAT8_E5M2;
    const int32_t tb = b_e4m3 ? TE_DTYPE_FLOAT8_E4M3 : TE_DTYPE_FLOAT8_E5M2;
    const int32_t mode = tensor ? TE_SCALING_PER_TENSOR : TE_SCALING_BLOCK_1D;
    g.a = GemmOperand{a, ta, mode, false, sa, sa_ld, nullptr, nullptr};
    g.b = GemmOperand{b, tb, mode, true, sb, sb_ld, nullptr, nullptr};
    g.alpha = alpha;
    g.beta = beta;
    g.d = d;
    g.d_dtype = d_dtype;
    g.epilogue = TE_EPILOGUE_DEFAULT;
    return g;
  }
};

// The naive product of x's operands (reference_kernel) and the sums of its terms' magnitudes, on
// the host.
void reference_product(const Problem& x, std::vector<float>& out, std::vector<float>& abs_sum) {
  const int64_t count = x.m * x.n;
  float *ref, *mag;
  check(cudaMalloc(&ref, count * 4), "cudaMalloc");
  check(cudaMalloc(&mag, count * 4), "cudaMalloc");
  reference_kernel<<<dim3(static_cast<unsigned>((x.n + 127) / 128), static_cast<unsigned>(x.m)), 128>>>(
      x.a, x.b, x.sa, x.sb, x.sa_ld, x.sb_ld, x.m, x.n, x.k, x.a_e4m3, x.b_e4m3, ref, mag);
  out.resize(count);
  abs_sum.resize(count);
  check(cudaMemcpy(out.data(), ref, count * 4, cudaMemcpyDeviceToHost), "reference");
  check(cudaMemcpy(abs_sum.data(), mag, count * 4, cudaMemcpyDeviceToHost), "reference");
  cudaFree(ref);
  cudaFree(mag);
}

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
}

// cuBLASLt's 1x128 x 1x128 product on the same operands (its heuristic's first algorithm, as
// te_gemm runs it): the column-major view D^T[N, M] = B[N, K] (op T) x A^T[K, M]. Per-tensor
// problems: scalar scales with fast accumulation (te_gemm's fprop).
struct Cublaslt {
  cublasLtHandle_t handle{};
  cublasLtMatmulDesc_t desc{};
  cublasLtMatrixLayout_t la{}, lb{}, ld{};
  cublasLtMatmulHeuristicResult_t heuristic{};
  void* workspace = nullptr;
  size_t workspace_bytes = size_t{64} << 20;
  bool found = false;

  // fast: per-tensor problems' FAST_ACCUM (te's fprop); off for the split variants' peer.
  Cublaslt(const Problem& x, int32_t d_dtype, bool fast = true) {
    cublasLtCreate(&handle);
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    set(desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    set(desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(x.sb));
    set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(x.sa));
    if (x.tensor) {
      set(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(fast ? 1 : 0));
    } else {
      set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F);
      set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F);
    }
    const cudaDataType_t dt = d_dtype == TE_DTYPE_FLOAT32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, x.k, x.n, x.k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, x.k, x.m, x.k);
    cublasLtMatrixLayoutCreate(&ld, dt, x.n, x.m, x.n);
    check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc");
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace_bytes, sizeof(workspace_bytes));
    int count = 0;
    cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, 1, &heuristic, &count);
    found = count > 0;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  ~Cublaslt() {
    cudaFree(workspace);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(handle);
  }
  void run(const Problem& x, float alpha, float beta) {
    cublasLtMatmul(handle, desc, &alpha, x.b, la, x.a, lb, &beta, x.d, ld, x.d, ld, &heuristic.algo,
                   workspace, workspace_bytes, nullptr);
  }
};

float host_value(const std::vector<uint8_t>& buf, int64_t i, int32_t dtype) {
  if (dtype == TE_DTYPE_FLOAT32) {
    float f;
    std::memcpy(&f, &buf[i * 4], 4);
    return f;
  }
  uint16_t v;
  std::memcpy(&v, &buf[i * 2], 2);
  if (dtype == TE_DTYPE_BFLOAT16) {
    const uint32_t u = uint32_t{v} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half h;
  std::memcpy(&h, &v, 2);
  return __half2float(h);
}

// Fast accumulation's error grows with K for cuBLASLt too: a fast-accumulation product passes
// within twice cuBLASLt's error on the same operands (`theirs`, NaN where it has none) where
// that exceeds te's tolerance.
double fast_accum_tol(double te_tol, double theirs) {
  return theirs == theirs ? std::max(te_tol, 2 * theirs) : te_tol;
}

// Normwise relative error against the reference, with te's GPU-test tolerances (4e-4 for an
// fp32 D, 1e-2 for 16-bit); D starts as a byte pattern so that beta's read is checked too.
// cuBLASLt's error on the same operands is printed beside it (E4M3 x E4M3, fp32 or bf16 D): the
// tensor core's short accumulator, not the kernel, sets both.
int check_variant(int64_t m, int64_t n, int64_t k, bool a_e4m3, bool b_e4m3, int32_t d_dtype,
                  float alpha, float beta, int variant) {
  Problem x(m, n, k, a_e4m3, b_e4m3, false, per_tensor(variant));
  std::vector<float> want_acc, want_mag;
  reference_product(x, want_acc, want_mag);
  const int esize = d_dtype == TE_DTYPE_FLOAT32 ? 4 : 2;
  std::vector<uint8_t> old(m * n * esize), out(m * n * esize);
  for (size_t i = 0; i < old.size(); ++i) old[i] = static_cast<uint8_t>((i * 7 + 3) & 0x3F);
  double worst = 0;
  auto error_of = [&](auto&& run) {  // normwise relative error of what `run` writes into D
    check(cudaMemcpy(x.d, old.data(), old.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    run();
    check(cudaDeviceSynchronize(), "the product");
    check(cudaMemcpy(out.data(), x.d, out.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    double num = 0, den = 0;
    worst = 0;
    for (int64_t i = 0; i < m * n; ++i) {
      const double o = host_value(old, i, d_dtype), got = host_value(out, i, d_dtype);
      const double want = double{alpha} * want_acc[i] + double{beta} * o;
      num += (got - want) * (got - want);
      den += want * want;
      const double scale = alpha * want_mag[i] + std::fabs(beta * o) + 1e-30;
      worst = std::max(worst, std::fabs(got - want) / scale);
    }
    return std::sqrt(num / (den + 1e-300));
  };
  double theirs = NAN;
  if (a_e4m3 && b_e4m3 && d_dtype != TE_DTYPE_FLOAT16) {
    Cublaslt lt(x, d_dtype, !split(variant));
    if (lt.found) theirs = error_of([&] { lt.run(x, alpha, beta); });
  }
  const double rel = error_of([&] { run_variant(x.args(d_dtype, alpha, beta), variant); });
  const double te_tol = d_dtype == TE_DTYPE_FLOAT32 ? 4e-4 : 1e-2;
  const double tol = x.tensor && !split(variant) ? fast_accum_tol(te_tol, theirs) : te_tol;
  const bool bad = !(rel <= tol);
  std::printf(
      "%s %-20s M %5lld N %5lld K %5lld %s x %s D %d alpha %g beta %g: normwise %.3g (tol %g; "
      "cuBLASLt %.3g), worst |err| / sum |terms| %.3g\n",
      bad ? "FAIL" : "ok  ", kVariants[variant], static_cast<long long>(m),
      static_cast<long long>(n), static_cast<long long>(k), a_e4m3 ? "e4m3" : "e5m2",
      b_e4m3 ? "e4m3" : "e5m2", d_dtype, alpha, beta, rel, tol, theirs, worst);
  return bad ? 1 : 0;
}

// ---- timing against cuBLASLt -------------------------------------------------------------------

// Milliseconds per call of `call` over `iters` calls after two warm-up calls, by CUDA events.
struct EventTimer {
  cudaEvent_t start{}, stop{};
  int iters;
  explicit EventTimer(int iters_) : iters(iters_) {
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
  }
  ~EventTimer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  template <typename F>
  float operator()(F&& call) {
    for (int i = 0; i < 2; ++i) call();
    cudaEventRecord(start);
    for (int i = 0; i < iters; ++i) call();
    cudaEventRecord(stop);
    check(cudaEventSynchronize(stop), "timing");
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    return ms / static_cast<float>(iters);
  }
};

void time_variant(int64_t m, int64_t n, int64_t k, int32_t d_dtype, float beta, int iters,
                  int rounds, int variant) {
  Problem x(m, n, k, true, true, true, per_tensor(variant));
  const GemmArgs g = x.args(d_dtype, 1.0f, beta);
  Cublaslt lt(x, d_dtype, !split(variant));
  EventTimer time(iters);
  std::vector<float> own_ms, lt_ms, ratios;
  for (int r = 0; r < rounds; ++r) {  // alternating: the H200's clock follows its recent load
    const float own = time([&] { run_variant(g, variant); });
    const float theirs = lt.found ? time([&] { lt.run(x, 1.0f, beta); }) : NAN;
    own_ms.push_back(own);
    lt_ms.push_back(theirs);
    ratios.push_back(theirs / own);
  }
  std::sort(own_ms.begin(), own_ms.end());
  std::sort(lt_ms.begin(), lt_ms.end());
  std::sort(ratios.begin(), ratios.end());
  const double tflop = 2.0 * m * n * k / 1e12;
  const int mid = rounds / 2;
  std::printf(
      "time %-20s group %2d M %5lld N %5lld K %5lld D %d beta %g: own %.3f ms (%.0f TFLOP/s), "
      "cuBLASLt %.3f ms (%.0f), cuBLASLt / own median %.3fx [%.3f .. %.3f]\n",
      kVariants[variant], pr::g_group_m, static_cast<long long>(m), static_cast<long long>(n),
      static_cast<long long>(k), d_dtype, beta, own_ms[mid], tflop / own_ms[mid] * 1e3,
      lt_ms[mid], tflop / lt_ms[mid] * 1e3, ratios[mid], ratios.front(), ratios.back());
}

// ---- the fused gelu epilogue (TensorPingPongGelu) ---------------------------------------------

// gelu(h) of the fused kernel's own h, quantized with te's functions as its epilogue does: the
// bytes its row-wise copy must hold, and the amax it must reach.
__global__ void gelu_reference_kernel(const __nv_bfloat16* h, int64_t count, const float* scale,
                                      uint8_t* q, float* amax) {
  namespace tc = te::cuda;
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= count) return;
  const float g = tc::activation::act<tc::activation::kGelu>(__bfloat162float(h[i]));
  q[i] = static_cast<uint8_t>(tc::fp8x2<TE_DTYPE_FLOAT8_E4M3>(tc::scaled(g, *scale), 0.0f));
  tc::atomic_max_amax(amax, tc::abs_bits(g));
}

// The epilogue's other outputs for an [m, n] product: a bias in [-1, 1], the delayed scale 4.
struct GeluBuffers {
  pr::GeluOut out{};
  __nv_bfloat16* bias = nullptr;
  uint8_t *q_row = nullptr, *q_col = nullptr;
  float *scale = nullptr, *amax = nullptr;

  GeluBuffers(int64_t m, int64_t n) {
    std::vector<__nv_bfloat16> hb(n);
    for (auto& b : hb) b = __float2bfloat16(static_cast<float>(next_random() % 2001) / 1000.0f - 1.0f);
    const float four = 4.0f;
    check(cudaMalloc(&bias, n * 2), "cudaMalloc");
    check(cudaMalloc(&q_row, m * n), "cudaMalloc");
    check(cudaMalloc(&q_col, m * n), "cudaMalloc");
    check(cudaMalloc(&scale, 4), "cudaMalloc");
    check(cudaMalloc(&amax, 4), "cudaMalloc");
    check(cudaMemcpy(bias, hb.data(), n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(scale, &four, 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    out = pr::GeluOut{bias, q_row, q_col, scale, amax};
  }
  ~GeluBuffers() {
    cudaFree(bias);
    cudaFree(q_row);
    cudaFree(q_col);
    cudaFree(scale);
    cudaFree(amax);
  }
  GeluBuffers(const GeluBuffers&) = delete;
  GeluBuffers& operator=(const GeluBuffers&) = delete;
};

// The fused gelu epilogue's tile schemes, each with the whole-sector stores too (-vec).
enum GeluTiles { kPingPongTiles, kWideTiles, kClusterTiles, kPingPongVec, kWideVec, kClusterVec };
const char* const kGeluTileNames[] = {"ping-pong", "wide", "cluster", "pp-vec", "wide-vec",
                                      "clust-vec"};

void run_gelu(const Problem& x, const GeluBuffers& gb, GeluTiles tiles) {
  constexpr int kE4m3 = TE_DTYPE_FLOAT8_E4M3;
  const GemmArgs g = x.args(TE_DTYPE_BFLOAT16, 1.0f, 0.0f);
  switch (tiles) {
    case kWideTiles: pr::launch_typed<kE4m3, kE4m3, pr::TensorWideGelu>(g, nullptr, true, &gb.out); break;
    case kClusterTiles:
      pr::launch_typed<kE4m3, kE4m3, pr::TensorPingPongClusterGelu>(g, nullptr, true, &gb.out);
      break;
    case kPingPongVec:
      pr::launch_typed<kE4m3, kE4m3, pr::TensorPingPongGeluVec>(g, nullptr, true, &gb.out);
      break;
    case kWideVec: pr::launch_typed<kE4m3, kE4m3, pr::TensorWideGeluVec>(g, nullptr, true, &gb.out); break;
    case kClusterVec:
      pr::launch_typed<kE4m3, kE4m3, pr::TensorPingPongClusterGeluVec>(g, nullptr, true, &gb.out);
      break;
    default: pr::launch_typed<kE4m3, kE4m3, pr::TensorPingPongGelu>(g, nullptr, true, &gb.out); break;
  }
}

// h against the naive product plus the bias (normwise, te's bf16 tolerance, or twice cuBLASLt's
// error on the same operands where fast accumulation's grows past it with K, as check_variant);
// the row-wise bytes and the amax exactly against gelu_reference_kernel of the kernel's own h;
// the column-wise bytes exactly as the row-wise ones transposed.
int check_gelu(int64_t m, int64_t n, int64_t k, GeluTiles tiles) {
  Problem x(m, n, k, true, true, true, true);
  GeluBuffers gb(m, n);
  std::vector<float> want, want_mag;
  reference_product(x, want, want_mag);
  double theirs = NAN;
  {
    Cublaslt lt(x, TE_DTYPE_BFLOAT16);
    if (lt.found) {
      lt.run(x, 1.0f, 0.0f);
      check(cudaDeviceSynchronize(), "cuBLASLt");
      std::vector<__nv_bfloat16> d(m * n);
      check(cudaMemcpy(d.data(), x.d, m * n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
      double num = 0, den = 0;
      for (int64_t i = 0; i < m * n; ++i) {
        const double got = __bfloat162float(d[i]);
        num += (got - want[i]) * (got - want[i]);
        den += double{want[i]} * want[i];
      }
      theirs = std::sqrt(num / (den + 1e-300));
    }
  }
  const double tol = fast_accum_tol(1e-2, theirs);
  check(cudaMemset(gb.amax, 0, 4), "cudaMemset");
  run_gelu(x, gb, tiles);
  check(cudaDeviceSynchronize(), "the fused product");
  uint8_t* q_want;
  float* amax_want;
  check(cudaMalloc(&q_want, m * n), "cudaMalloc");
  check(cudaMalloc(&amax_want, 4), "cudaMalloc");
  check(cudaMemset(amax_want, 0, 4), "cudaMemset");
  gelu_reference_kernel<<<static_cast<unsigned>((m * n + 255) / 256), 256>>>(
      static_cast<const __nv_bfloat16*>(x.d), m * n, gb.scale, q_want, amax_want);
  check(cudaDeviceSynchronize(), "the gelu reference");
  std::vector<__nv_bfloat16> h(m * n), hb(n);
  std::vector<uint8_t> q_row(m * n), q_col(m * n), q_ref(m * n);
  float amax = 0, amax_ref = 0;
  check(cudaMemcpy(h.data(), x.d, m * n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(hb.data(), gb.bias, n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(q_row.data(), gb.q_row, m * n, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(q_col.data(), gb.q_col, m * n, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(q_ref.data(), q_want, m * n, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(&amax, gb.amax, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaMemcpy(&amax_ref, amax_want, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(q_want);
  cudaFree(amax_want);
  double num = 0, den = 0;
  int64_t row_bad = 0, col_bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const double w = double{want[i * n + j]} + double{__bfloat162float(hb[j])};
      const double got = __bfloat162float(h[i * n + j]);
      num += (got - w) * (got - w);
      den += w * w;
      row_bad += q_row[i * n + j] != q_ref[i * n + j];
      col_bad += q_col[j * m + i] != q_ref[i * n + j];
    }
  }
  const double rel = std::sqrt(num / (den + 1e-300));
  const bool bad = !(rel <= tol) || row_bad != 0 || col_bad != 0 || amax != amax_ref;
  std::printf(
      "%s gelu-epilogue %-9s group %2d M %5lld N %5lld K %5lld: h normwise %.3g (tol %.3g; "
      "cuBLASLt's product %.3g), row-wise bytes off %lld, column-wise off %lld, amax %g (want "
      "%g)\n",
      bad ? "FAIL" : "ok  ", kGeluTileNames[tiles], pr::g_group_m, static_cast<long long>(m),
      static_cast<long long>(n), static_cast<long long>(k), rel, tol, theirs,
      static_cast<long long>(row_bad), static_cast<long long>(col_bad), amax, amax_ref);
  return bad ? 1 : 0;
}

// Rows of `time_gelu`: a label and the call it times.
struct Timed {
  const char* label;
  std::function<void()> call;
};

// The fused kernels against the same kernels writing only D and against cuBLASLt's plain product
// (alternating rounds; medians): what the epilogue costs in the GEMM. The pass it replaces (te's
// gelu + cast-transpose of h, ~0.3 ms at 16384 x 16384 on the H200: benchmarks/NOTES.md) is not
// timed here. cluster: the 2 x 1 cluster scheme beside ping-pong (mode 3, a process of its own:
// a protocol error there hangs rather than fails), else ping-pong and cooperative tiles.
void time_gelu(int64_t m, int64_t n, int64_t k, int iters, int rounds, bool cluster) {
  Problem x(m, n, k, true, true, true, true);
  GeluBuffers gb(m, n);
  const GemmArgs g = x.args(TE_DTYPE_BFLOAT16, 1.0f, 0.0f);
  Cublaslt lt(x, TE_DTYPE_BFLOAT16);
  EventTimer time(iters);
  std::vector<Timed> rows = {{"ping-pong fused", [&] { run_gelu(x, gb, kPingPongTiles); }},
                             {"ping-pong fused vec", [&] { run_gelu(x, gb, kPingPongVec); }},
                             {"ping-pong D only", [&] { run_variant(g, kTensorPingPong); }}};
  if (cluster) {
    rows.push_back({"cluster fused", [&] { run_gelu(x, gb, kClusterTiles); }});
    rows.push_back({"cluster fused vec", [&] { run_gelu(x, gb, kClusterVec); }});
    rows.push_back({"cluster D only", [&] { run_variant(g, kTensorPingPongCluster); }});
  } else {
    rows.push_back({"cooperative fused", [&] { run_gelu(x, gb, kWideTiles); }});
    rows.push_back({"cooperative fused vec", [&] { run_gelu(x, gb, kWideVec); }});
    rows.push_back({"cooperative D only", [&] { run_variant(g, kTensorWide); }});
  }
  if (lt.found) rows.push_back({"cuBLASLt D only", [&] { lt.run(x, 1.0f, 0.0f); }});
  std::vector<std::vector<float>> ms(rows.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < rows.size(); ++i) ms[i].push_back(time(rows[i].call));
  }
  std::printf("time gelu-epilogue group %2d M %5lld N %5lld K %5lld (medians of %d rounds):",
              pr::g_group_m, static_cast<long long>(m), static_cast<long long>(n),
              static_cast<long long>(k), rounds);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    std::printf("%s %s %.3f ms", i == 0 ? "" : ",", rows[i].label, ms[i][rounds / 2]);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 10, rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  const int mode = argc > 3 ? std::atoi(argv[3]) : 0;
  if (iters < 1 || rounds < 1 || mode < 0 || mode > 3) {
    std::printf(
        "usage: %s [iters >= 1] [rounds >= 1] [mode: 0 check and time, 1 one call each, "
        "2 check and time the per-tensor variants and the gelu epilogue only, 3 the same for the "
        "2 x 1 cluster scheme]\n",
        argv[0]);
    return 2;
  }
  if (mode == 1) {  // one call of each variant, then cuBLASLt's: for ncu
    Problem x(16384, 4096, 16384, true, true, true, false);
    for (int v = 0; v < kFirstPerTensor; ++v) run_variant(x.args(TE_DTYPE_BFLOAT16, 1.0f, 0.0f), v);
    check(cudaDeviceSynchronize(), "the variants");
    Cublaslt lt(x, TE_DTYPE_BFLOAT16);
    lt.run(x, 1.0f, 0.0f);
    check(cudaDeviceSynchronize(), "cuBLASLt");
    return 0;
  }
  int fails = 0;
  const int64_t shapes[][3] = {{128, 256, 128}, {64, 64, 16},    {200, 300, 384}, {1000, 520, 1040},
                               {37, 17, 272},   {513, 1030, 2064}, {256, 512, 4096}, {1, 1, 32}};
  if (mode == 3) {  // the cluster scheme: odd row-block counts leave a CTA a tile past M
    for (const int group : {0, 16}) {
      pr::g_group_m = group;
      for (const auto& s : shapes) {
        fails += check_variant(s[0], s[1], s[2], true, true, TE_DTYPE_BFLOAT16, 1.0f, 0.0f,
                               kTensorPingPongCluster);
        fails += check_gelu(s[0], s[1], s[2], kClusterTiles);
        fails += check_gelu(s[0], s[1], s[2], kClusterVec);
      }
      fails += check_variant(2100, 700, 256, true, true, TE_DTYPE_BFLOAT16, 1.0f, 0.0f,
                             kTensorPingPongCluster);
      fails += check_gelu(2100, 700, 256, kClusterTiles);
      fails += check_gelu(2100, 704, 256, kClusterVec);
    }
    std::printf("failures: %d\n", fails);
    for (const int group : {0, 16}) {
      pr::g_group_m = group;
      time_variant(16384, 16384, 4096, TE_DTYPE_BFLOAT16, 0.0f, iters, rounds, kTensorPingPongCluster);
      time_variant(16384, 4096, 16384, TE_DTYPE_BFLOAT16, 0.0f, iters, rounds, kTensorPingPongCluster);
      time_gelu(16384, 16384, 4096, iters, rounds, true);
    }
    return fails;
  }
  if (mode == 2) {  // the MLP's fc1 and fc2 fprop and the Linear 4096 -> 4096 fprop
    for (int v = kFirstPerTensor; v < kVariantCount; ++v) {
      for (const auto& s : shapes) {
        fails += check_variant(s[0], s[1], s[2], true, true, TE_DTYPE_BFLOAT16, 1.0f, 0.0f, v);
      }
      fails += check_variant(1000, 520, 1040, true, true, TE_DTYPE_FLOAT32, 0.5f, 1.0f, v);
    }
    for (const GeluTiles tiles : {kPingPongTiles, kWideTiles, kPingPongVec, kWideVec}) {
      for (const auto& s : shapes) fails += check_gelu(s[0], s[1], s[2], tiles);
      fails += check_gelu(1024, 768, 2048, tiles);
      fails += check_gelu(200, 1000, 256, tiles);  // N a multiple of 8, not of 256
    }
    pr::g_group_m = 16;  // the grouped order: whole and partial groups of 64-row tiles
    for (const int64_t m : {int64_t{2000}, int64_t{1500}, int64_t{37}}) {
      for (int v = kFirstPerTensor; v < kVariantCount; ++v) {
        fails += check_variant(m, 700, 256, true, true, TE_DTYPE_BFLOAT16, 1.0f, 0.0f, v);
      }
      fails += check_gelu(m, 700, 256, kPingPongTiles);
      fails += check_gelu(m, 700, 256, kWideTiles);
      fails += check_gelu(m, 704, 256, kPingPongVec);
      fails += check_gelu(m, 704, 256, kWideVec);
    }
    pr::g_group_m = 0;
    std::printf("failures: %d\n", fails);
    for (int v = kFirstPerTensor; v < kVariantCount; ++v) {
      time_variant(16384, 16384, 4096, TE_DTYPE_BFLOAT16, 0.0f, iters, rounds, v);
      time_variant(16384, 4096, 16384, TE_DTYPE_BFLOAT16, 0.0f, iters, rounds, v);
      time_variant(16384, 4096, 4096, TE_DTYPE_BFLOAT16, 0.0f, iters, rounds, v);
    }
    time_gelu(16384, 16384, 4096, iters, rounds, false);
    for (const int group : {8, 16, 32}) {
      pr::g_group_m = group;
      time_variant(16384, 16384, 4096, TE_DTYPE_BFLOAT16, 0.0f, iters, rounds, kTensorPingPong);
      time_variant(16384, 4096, 16384, TE_DTYPE_BFLOAT16, 0.0f, iters, rounds, kTensorPingPong);
      time_variant(16384, 16384, 4096, TE_DTYPE_BFLOAT16, 0.0f, iters, rounds, 9);
    }
    pr::g_group_m = 16;
    time_gelu(16384, 16384, 4096, iters, rounds, false);
    return fails;
  }
  for (int v = 0; v < kVariantCount; ++v) {
    for (const auto& s : shapes) {
      fails += check_variant(s[0], s[1], s[2], true, true, TE_DTYPE_BFLOAT16, 1.0f, 0.0f, v);
    }
    fails += check_variant(1000, 520, 1040, true, true, TE_DTYPE_FLOAT32, 1.0f, 0.0f, v);
    fails += check_variant(300, 520, 1040, true, true, TE_DTYPE_FLOAT32, 1.0f, 1.0f, v);
  }
  fails += check_variant(300, 520, 1040, false, true, TE_DTYPE_FLOAT32, 0.5f, 0.0f, 0);
  fails += check_variant(300, 522, 1040, true, false, TE_DTYPE_FLOAT32, 1.0f, 0.0f, 0);
  fails += check_variant(300, 521, 1040, false, false, TE_DTYPE_BFLOAT16, 2.0f, 1.0f, 0);
  fails += check_variant(2000, 1000, 4096, true, true, TE_DTYPE_FLOAT32, 1.0f, 0.0f, 0);
  std::printf("failures: %d\n", fails);
  for (int v : {0, 3, 5, 6, 7, 8}) {
    time_variant(16384, 4096, 16384, TE_DTYPE_BFLOAT16, 0.0f, iters, rounds, v);
  }
  for (int v : {3, 6, 8}) time_variant(16384, 4096, 16384, TE_DTYPE_FLOAT32, 1.0f, iters, rounds, v);
  for (int v : {3, 6, 8}) time_variant(4096, 4096, 16384, TE_DTYPE_BFLOAT16, 0.0f, iters, rounds, v);
  for (int v : {3, 6, 8}) time_variant(16384, 16384, 4096, TE_DTYPE_BFLOAT16, 0.0f, iters, rounds, v);
  return fails;
}
