// LayerNorm / RMSNorm forward kernels (te/normalization.h has the contract; csrc/cpu/normalization.cpp
// is the reference; normalization.cu chooses the passes). fp32 math: LayerNorm's two passes (mean,
// then the centered squares) over the row, rsigma = 1 / sqrt(var + eps) with both operations
// correctly rounded, and y = fmaf((x - mu) * rsigma, g, beta) with explicit round-to-nearest
// operations (__fmaf_rn, the CPU's std::fma), so y is the CPU's formula; only the sums run in
// another (fixed) order, so mu, rsigma and y agree with the CPU to fp32 rounding.
//
// Two kernels, chosen by norm_row.cuh's layout (from H and the input dtype alone):
//   rows     rows of up to 8 chunks of 8 elements per thread, read once. Persistent: one wave of
//            CTAs, each taking every gridDim.x-th row group (LayerNorm's shared-weights form: one
//            CTA an SM, its rows interleaved with the other CTAs'), with the next row copied into
//            shared memory (cp.async) while the current one is reduced and written, so every CTA
//            keeps a row of loads in flight through its barriers.
//   re-read  longer rows: one row group per CTA, read from L2 again for each pass.
// Both write y directly where the scale is known inside the row: high precision; per-tensor FP8
// (the scale given or derived on the device from a given amax; amax of y max-accumulated, one
// atomic per CTA); 1x128 blocks row-wise (a block is 16 lanes of one warp). The per-tensor and
// block arithmetic (quantize8, compute_scale_from_amax, 1 / scale, amax bits) is the quantize
// kernels' own, so the FP8 output is bit-identical to te_quantize of the fp32 y.
//
// The kernels are instantiated per output kind in normalization_fwd_{hp,per_tensor,block}.cu
// (compiled in parallel); normalization.cu calls launch_fwd.
#pragma once

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "common/kernels.h"
#include "cuda/cast_tile.cuh"
#include "cuda/cuda_utils.cuh"
#include "cuda/norm_row.cuh"

namespace te {
namespace cuda {
namespace normfwd {

using norm::kIter;
using norm::kMaxThreads;

enum OutKind : int { kOutHigh = 0, kOutPerTensor = 1, kOutBlock1D = 2 };

struct FwdParams {
  const void* x;  // [rows, cols]
  int64_t rows, cols;
  // fp32 with a zero-centered gamma's + 1 applied (norm::Fp32Weights), in pieces for the rows
  // kernel or in the natural layout (fwd_weight_pieces); in pieces of x's own 16-bit dtype where
  // w16 (read through a cast).
  const float* gamma;
  const float* beta;  // or nullptr; in pieces always there (-0 where absent: norm::WeightPieces)
  float eps;
  bool rms;
  bool w16;
  // Computed stats are written where non-null; with load_stats they are read instead (pass 2).
  float* mu;
  float* rsigma;
  bool load_stats;
  void* out;  // y: [rows, cols] of out_dtype (high precision) or FP8 bytes; nullptr: not written
  int32_t out_dtype;
  // Per-tensor FP8.
  const float* scale;    // delayed: the scale to use
  const float* amax_in;  // current: the amax the scale derives from
  bool current;
  float* amax_out;  // max-accumulated amax of y, or nullptr
  float* scale_out;  // current: written, or nullptr
  float* rowwise_scale_inv;
  float* columnwise_scale_inv;
  // 1x128 blocks: scale_inv[(c / 128) * ld + row].
  float* block_scale_inv;
  int64_t block_scale_ld;
  bool pow2;
  float amax_epsilon;
  int stages;  // rows kernel: shared-memory stages per row group (set by launch_rows)
};

// x - mu of one element. RMSNorm skips the subtraction: its mu is +0, x - (+0) is x for every
// non-NaN x (-0 included), and a NaN comes out of the multiply that follows the same either way.
template <bool kRms>
__device__ __forceinline__ float centered(float x, float mu) {
  return kRms ? x : __fsub_rn(x, mu);
}

// sq + the sum of d^2 over the chunk's `valid` elements. Whole chunks skip the per-element masks.
__device__ __forceinline__ float add_squares(float sq, const float (&d)[8], int valid) {
  if (valid == 8) {
#pragma unroll
    for (int k = 0; k < 8; ++k) sq = __fmaf_rn(d[k], d[k], sq);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < valid) sq = __fmaf_rn(d[k], d[k], sq);
  }
  return sq;
}

// y = fmaf((x - mu) * rsigma, gamma, beta) of one chunk, from its centered values d, in place
// (one instruction per element fewer than a multiply and an add: the pass is issue-bound).
template <bool kBeta>
__device__ __forceinline__ void apply_weights(float rs, const float (&g)[8], const float (&b)[8], float (&d)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float xhat = __fmul_rn(d[k], rs);
    d[k] = kBeta ? __fmaf_rn(xhat, g[k], b[k]) : __fmul_rn(xhat, g[k]);
  }
}

// The same for column c, the weights in the natural layout (the re-read kernel, beta tested per
// chunk; RMSNorm's rows kernel, kBeta false).
template <bool kTestBeta>
__device__ __forceinline__ void chunk_y(const FwdParams& p, int64_t c, int valid, float rs, float (&d)[8]) {
  float g[8], b[8];
  norm::load8f(p.gamma, c, valid, g);
  if (kTestBeta && p.beta != nullptr) {
    norm::load8f(p.beta, c, valid, b);
    apply_weights<true>(rs, g, b, d);
  } else {
    apply_weights<false>(rs, g, b, d);
  }
}

// The same for thread t's chunk j, the weights in pieces (the rows kernel: LayerNorm's, kBeta, with
// beta always there, -0 where the norm has none: norm::WeightPieces; RMSNorm's where kW16), fp32
// or (kW16) x's 16-bit dtype T.
template <typename T, bool kW16, bool kBeta>
__device__ __forceinline__ void chunk_y_pieces(const FwdParams& p, int j, int X, int t, float rs,
                                               float (&d)[8]) {
  float g[8], b[8];
  norm::load8w<T, kW16>(p.gamma, j, X, t, g);
  if constexpr (kBeta) norm::load8w<T, kW16>(p.beta, j, X, t, b);
  apply_weights<kBeta>(rs, g, b, d);
}

// Max of |y| bits over the chunk's `valid` elements (whole chunks without the masks).
__device__ __forceinline__ uint32_t chunk_amax(const float (&y)[8], int valid) {
  uint32_t m = 0;
  if (valid == 8) {
#pragma unroll
    for (int k = 0; k < 8; ++k) m = max(m, abs_bits(y[k]));
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < valid) m = max(m, abs_bits(y[k]));
  }
  return m;
}

// The per-tensor amax of everything a CTA writes, kept as two running maxima of y's bit patterns,
// the signed (s) and the unsigned (u) one: one 3-input integer max per two elements each, against
// a mask and a max per element for max(|bits|). With M = 0x7fffffff, max(s & M, u & M) is the max
// of |y|'s bits (NaN-propagating as te's amax): a positive value (sign bit clear) beats every
// negative one in s, so s holds the largest positive bits where there is a positive value; a
// negative one beats every positive one in u, and among negatives both orders grow with the
// magnitude, so u & M (and s & M where nothing is positive) is the largest negative magnitude.
struct AmaxAcc {
  int32_t s = INT32_MIN;  // bits 0x80000000: & M is 0, the amax of nothing
  uint32_t u = 0;
  __device__ __forceinline__ void add(const float (&y)[8], int valid) {
    if (valid == 8) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        s = max(s, __float_as_int(y[k]));
        u = max(u, __float_as_uint(y[k]));
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (k < valid) {
          s = max(s, __float_as_int(y[k]));
          u = max(u, __float_as_uint(y[k]));
        }
      }
    }
  }
  __device__ __forceinline__ uint32_t bits() const {
    return max(static_cast<uint32_t>(s) & 0x7fffffffu, u & 0x7fffffffu);
  }
};

template <int kFmt>
constexpr float kFp8Max = kFmt == TE_DTYPE_FLOAT8_E5M2 ? 57344.0f : 448.0f;

// The per-tensor scale of a kernel that writes FP8 (1 otherwise); block 0 writes the scale outputs.
template <int kOut, int kFmt>
__device__ __forceinline__ float per_tensor_scale(const FwdParams& p) {
  float s = 1.0f;
  if constexpr (kOut == kOutPerTensor) {
    if (p.out != nullptr) {
      s = p.current ? compute_scale_from_amax(*p.amax_in, kFp8Max<kFmt>, p.pow2, p.amax_epsilon) : *p.scale;
      if (blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0) {
        const float s_inv = 1.0f / s;
        if (p.current && p.scale_out != nullptr) *p.scale_out = s;
        if (p.rowwise_scale_inv != nullptr) *p.rowwise_scale_inv = s_inv;
        if (p.columnwise_scale_inv != nullptr) *p.columnwise_scale_inv = s_inv;
      }
    }
  }
  return s;
}

// Whether the output row at element offset `base` takes wide stores.
template <int kOut>
__device__ __forceinline__ bool out_row_vec(const FwdParams& p, int64_t base) {
  if (p.out == nullptr) return false;
  if constexpr (kOut == kOutHigh) {
    return norm::aligned16(static_cast<const char*>(p.out) + base * norm::elem_bytes(p.out_dtype));
  } else {
    return (reinterpret_cast<uintptr_t>(static_cast<const uint8_t*>(p.out) + base) & 7u) == 0;
  }
}

template <int kFmt>
__device__ __forceinline__ void store_fp8(const FwdParams& p, int64_t at, const float (&y)[8], float scale,
                                          int valid, bool out_vec) {
  Raw8<float> r;
#pragma unroll
  for (int k = 0; k < 8; ++k) r.w[k] = __float_as_uint(y[k]);
  tile::store_row8(static_cast<uint8_t*>(p.out) + at, quantize8<kFmt>(r, scale), valid, out_vec);
}

// After the CTA's last row: its per-tensor amax, max-accumulated into amax_out.
template <int kOut>
__device__ __forceinline__ void finish_amax(const FwdParams& p, const AmaxAcc& acc, uint32_t* red_max) {
  if constexpr (kOut == kOutPerTensor) {
    if (p.amax_out != nullptr) {
      const uint32_t m = norm::cta_max(acc.bits(), red_max);
      if (threadIdx.x == 0 && threadIdx.y == 0) atomic_max_amax(p.amax_out, m);
    }
  }
}

// ---- 1x128 blocks in the rows kernel ----------------------------------------------------------
// Chunk j of the 16 lanes of a half-warp is one block, so a thread holds pieces of kChunks blocks.
// Rather than a 4-shuffle butterfly and a scale computation (an IEEE division) in every lane for
// every block, the half-warp reduces its K blocks together, keeping half of the set at each
// shuffle step (lanes with bit O set keep the upper half): after log2(K) such steps and a
// butterfly over the remaining lane bits, lane i holds the whole max of one block, computes that
// block's scale only, and the scales are shuffled back to every lane that needs them. For K = 4:
// 5 shuffles and one scale per lane instead of 16 and four.

// Returns the block max this lane ends up with; `chunk` (0 on entry) becomes that block's chunk.
template <int K, int O>
__device__ __forceinline__ uint32_t reduce_scatter_max(const uint32_t (&m)[K], int lane, int& chunk) {
  if constexpr (O == 0) {
    return m[0];
  } else if constexpr (K == 1) {
    const uint32_t v[1] = {max(m[0], __shfl_xor_sync(0xffffffffu, m[0], O))};
    return reduce_scatter_max<1, O / 2>(v, lane, chunk);
  } else {
    constexpr int H = K / 2;
    const bool hi = (lane & O) != 0;
    uint32_t next[H];
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const uint32_t send = hi ? m[i] : m[i + H];
      next[i] = max(hi ? m[i + H] : m[i], __shfl_xor_sync(0xffffffffu, send, O));
    }
    if (hi) chunk += H;
    return reduce_scatter_max<H, O / 2>(next, lane, chunk);
  }
}

// The lane (within its half-warp) that reduce_scatter_max leaves holding chunk j's block.
template <int K>
__device__ __forceinline__ constexpr int scatter_lane(int j) {
  int lane = 0;
  for (int h = K / 2, o = 8; h >= 1; h /= 2, o /= 2)
    if (j & h) lane += o;
  return lane;
}

// Threads per CTA the rows kernel is compiled for (at least fwd_layout's bound) and the CTAs of
// that size per SM its registers are held for: 4 x 256 threads (64 registers) up to 4 chunks, but 3 (80) for 1x128 blocks of 4
// chunks, which hold all 32 y values for their scales; one CTA of 512 or two of 256 for 8 chunks
// (ptxas -v: NOTES.md).
template <typename T, int kChunks>
constexpr int kRowThreads = (kChunks == 8 && sizeof(T) == 2) ? 512 : 256;
template <typename T, int kOut, int kChunks>
constexpr int kRowMinBlocks =
    kChunks <= 4 ? (kOut == kOutBlock1D && kChunks == 4 ? 3 : 4) : (sizeof(T) == 2 ? 1 : 2);

// The rows kernel's body; the kernels below differ only in how their registers are bounded and
// (kSharedW) where the weights are read from. kSharedW: one CTA an SM holding several rows, each
// row's reductions on its own named barrier (1 + threadIdx.y) so the rows run apart as separate
// CTAs would, and the 16-bit gamma and beta copied once into shared memory after the stages,
// where every row reads them instead of from L1 / L2 (launch_rows_shared_w says where it runs).
constexpr int kSharedWMaxThreads = 1024;
template <typename T, int kOut, int kFmt, int kChunks, bool kRms, bool kW16, bool kSharedW = false>
__device__ __forceinline__ void fwd_rows(const FwdParams& p) {
  constexpr int kCtaThreads = kSharedW ? kSharedWMaxThreads : kMaxThreads;
  extern __shared__ uint4 staged[];  // [stages][Y][kChunks][kQuads][X] 16-byte pieces
  __shared__ __align__(16) float red[2 * kCtaThreads / 32];
  __shared__ uint32_t red_max[kCtaThreads / 32];
  constexpr int kQ = norm::kQuads<T>;
  const int X = blockDim.x, Y = blockDim.y, t = threadIdx.x, ty = threadIdx.y;
  const int64_t cols = p.cols;
  const float n = static_cast<float>(cols);
  const int stages = p.stages;
  const int stage_size = Y * kChunks * kQ * X;  // 16-byte pieces
  uint4* const mine = staged + ty * kChunks * kQ * X + t;
  const uint32_t mine_s = static_cast<uint32_t>(__cvta_generic_to_shared(mine));
  // All of this thread's chunks inside a row (every thread but a row's last few where H is not a
  // multiple of X * 8 * kChunks): then no chunk needs the column arithmetic or masks.
  const bool full = static_cast<int64_t>(((kChunks - 1) * X + t) * 8 + 8) <= cols;
  auto valid_of = [&](int j, bool live) -> int {
    return !live ? 0 : (full ? 8 : norm::chunk_valid(cols, static_cast<int64_t>(j * X + t) * 8));
  };
  const float s = per_tensor_scale<kOut, kFmt>(p);
  // kSharedW: gamma's 16-byte pieces, then beta's, after the stages.
  uint4* const wsm = staged + stages * stage_size;
  // This thread's rows: row group blockIdx.x, then every gridDim.x-th (`step` rows further). With
  // kSharedW (one CTA an SM) the CTAs' rows interleave instead, row ty * gridDim.x + blockIdx.x
  // first: the rows past the last whole wave then spread over every SM, where row groups gave a
  // few CTAs a whole group more (16384 rows, six a CTA: 90 of 132 SMs 126 rows, one 124, the
  // rest 120). Every CTA still takes as many turns; its last one has fewer live rows, which pays
  // where an SM's rows share its bandwidth.
  // row - lead is the CTA's turn, the same for all its threads (the barriers inside).
  const int64_t lead = kSharedW ? static_cast<int64_t>(ty) * gridDim.x : ty;
  const int64_t step = static_cast<int64_t>(gridDim.x) * Y;
  int64_t row = kSharedW ? lead + blockIdx.x : static_cast<int64_t>(blockIdx.x) * Y + ty;

  // Copies this thread's chunks of row `row` into stage st (nothing past the CTA's last turn).
  auto stage_row = [&](int64_t row, int st) {
    if (row - lead >= p.rows) return;
    const bool live = row < p.rows;
    const T* xr = static_cast<const T*>(p.x) + (live ? row : 0) * cols + t * 8;
    const uint32_t dst = mine_s + st * stage_size * 16;
    const int chunk_bytes = kQ * X * 16;  // from one staged chunk to the next
    if (live && full && norm::aligned16(xr)) {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) norm::stage_whole_chunk(dst + j * chunk_bytes, X, xr + j * X * 8);
    } else {
      const bool vec = norm::aligned16(xr);
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        norm::stage_chunk(mine + st * stage_size + j * kQ * X, dst + j * chunk_bytes, X, xr + j * X * 8,
                          valid_of(j, live), vec);
      }
    }
  };
  // mu / rsigma of `row` where they are read, not computed (pass 2 of current scaling): loaded one
  // row ahead, so the load is not waited for.
  auto fetch_stats = [&](int64_t row, float& mu, float& rs) {
    if (!p.load_stats || row >= p.rows) return;
    if (!kRms) mu = p.mu[row];
    rs = p.rsigma[row];
  };

  for (int st = 0; st + 1 < stages; ++st) {
    stage_row(row + st * step, st);
    norm::cp_async_commit();
  }
  // The weights copied while the first rows' copies are in flight (they do not overlap the stages).
  if constexpr (kSharedW) {
    static_assert(kW16, "fwd_rows: shared-memory weights are 16-bit pieces");
    const int pieces = kChunks * X;
    const uint4* g4 = reinterpret_cast<const uint4*>(p.gamma);
    const uint4* b4 = reinterpret_cast<const uint4*>(p.beta);
    for (int i = ty * X + t; i < pieces; i += X * Y) {
      wsm[i] = __ldg(g4 + i);
      if (!kRms) wsm[pieces + i] = __ldg(b4 + i);
    }
    __syncthreads();
  }
  float next_mu = 0.0f, next_rs = 0.0f;
  fetch_stats(row, next_mu, next_rs);
  AmaxAcc amax;
  int parity = 0;
  for (int st = 0; row - lead < p.rows; row += step, st = st + 1 == stages ? 0 : st + 1) {
    // The row stages - 1 turns ahead goes to the stage read last time round. Only this thread
    // reads its chunks, and its reads precede in program order the copy it starts now (an
    // asynchronous copy is performed after the call that starts it), so no barrier is needed.
    stage_row(row + (stages - 1) * step, st == 0 ? stages - 1 : st - 1);
    norm::cp_async_commit();
    norm::cp_async_wait(stages - 1);
    const bool live = row < p.rows;
    const int64_t base = (live ? row : 0) * cols;
    const uint4* const slot = mine + st * stage_size;  // chunk j at slot + j * kQ * X
    float mu = next_mu, rs = next_rs;
    fetch_stats(row + step, next_mu, next_rs);

    if (!p.load_stats) {
      // The row in its own dtype for both sums, widened where used: a 16-bit row of 8 chunks is
      // 32 registers this way against 64 as fp32, which held the kernel at 128 registers and
      // 4 CTAs of 128 threads per SM at H 8192 (NOTES.md).
      Raw8<T> v[kChunks];
#pragma unroll
      for (int j = 0; j < kChunks; ++j) norm::read_chunk(v[j], slot + j * kQ * X, X);
      if (!kRms) {
        float sum[1] = {0.0f};  // elements outside the row are +0, as the CPU never sees them
#pragma unroll
        for (int j = 0; j < kChunks; ++j)
#pragma unroll
          for (int k = 0; k < 8; ++k) sum[0] = __fadd_rn(sum[0], v[j].get(k));
        norm::row_sum_pp<1, kSharedW>(sum, red, parity);
        mu = __fdiv_rn(sum[0], n);
      }
      // One test for the row, not one per chunk: with the test inside the chunk loop the compiler
      // computed every chunk's 64-bit valid count before choosing the unmasked sum (~2
      // instructions per element, SASS). RMSNorm needs no masks at all: the +0 staged past the
      // row adds +0 squares.
      float sq[1] = {0.0f};
      if (kRms || full) {
#pragma unroll
        for (int j = 0; j < kChunks; ++j)
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const float d = centered<kRms>(v[j].get(k), mu);
            sq[0] = __fmaf_rn(d, d, sq[0]);
          }
      } else {
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          float d[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) d[k] = centered<kRms>(v[j].get(k), mu);
          sq[0] = add_squares(sq[0], d, valid_of(j, true));
        }
      }
      norm::row_sum_pp<1, kSharedW>(sq, red, parity);
      rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sq[0], n), p.eps)));
      if (live && t == 0) {
        if (p.mu != nullptr) p.mu[row] = mu;
        if (p.rsigma != nullptr) p.rsigma[row] = rs;
      }
    }

    // The output, from x read again from the stage (one conflict-free 16-byte load per chunk)
    // rather than the fp32 row kept in registers through it: with those and the weights in
    // flight the kernel needed ~100 registers or spilled (ptxas -v, NOTES.md). Two copies: a
    // whole row with aligned output (every chunk complete, wide loads and stores, no per-chunk
    // tests; no output at all in pass 1 of current scaling) and any other. The 1x128 shuffles
    // stay outside them: a warp may hold threads of both.
    const bool whole = live && full && (p.out == nullptr || out_row_vec<kOut>(p, base));
    const int64_t at = base + t * 8;  // chunk j at at + j * X * 8
    auto y_of = [&](int j, int valid, float (&y)[8]) {
      Raw8<T> v;
      norm::read_chunk(v, slot + j * kQ * X, X);
#pragma unroll
      for (int k = 0; k < 8; ++k) y[k] = centered<kRms>(v.get(k), mu);
      if constexpr (kSharedW) {
        float g[8], b[8];
        Raw8<T> gw, bw;
        norm::read_chunk(gw, wsm + j * X + t, X);
#pragma unroll
        for (int k = 0; k < 8; ++k) g[k] = gw.get(k);
        if constexpr (!kRms) {
          norm::read_chunk(bw, wsm + (kChunks + j) * X + t, X);
#pragma unroll
          for (int k = 0; k < 8; ++k) b[k] = bw.get(k);
        }
        apply_weights<!kRms>(rs, g, b, y);
      } else if constexpr (kRms && !kW16) {
        chunk_y<false>(p, t * 8 + j * X * 8, valid, rs, y);
      } else {
        chunk_y_pieces<T, kW16, !kRms>(p, j, X, t, rs, y);
      }
    };
    if constexpr (kOut != kOutBlock1D) {
      auto out = [&](auto whole_tag) {
        constexpr bool kWhole = decltype(whole_tag)::value;
        const bool vec = kWhole || out_row_vec<kOut>(p, base);
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          const int valid = kWhole ? 8 : valid_of(j, live);
          float y[8];
          y_of(j, valid, y);
          if constexpr (kOut == kOutHigh) {
            if (p.out != nullptr) norm::store8(p.out, p.out_dtype, at + j * X * 8, y, valid, vec);
          } else {
            amax.add(y, valid);
            if (p.out != nullptr && valid > 0) store_fp8<kFmt>(p, at + j * X * 8, y, s, valid, vec);
          }
        }
      };
      if (whole) {
        out(std::true_type{});
      } else {
        out(std::false_type{});
      }
    } else {
      // Every chunk's y first: the block scales need the maxima of all of them.
      float y[kChunks][8];
      uint32_t m[kChunks];
      if (whole) {
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          y_of(j, 8, y[j]);
          m[j] = chunk_amax(y[j], 8);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          y_of(j, valid_of(j, live), y[j]);
          m[j] = chunk_amax(y[j], valid_of(j, live));
        }
      }
      const int lane = t & 31;
      int chunk = 0;
      const uint32_t bm = reduce_scatter_max<kChunks, 8>(m, lane, chunk);
      const float sb = compute_scale_from_amax(__uint_as_float(bm), kFp8Max<kFmt>, p.pow2, p.amax_epsilon);
      // One lane per block writes its scale_inv: the block's first lane is inside the row.
      const int first = chunk * X + (t & ~15);
      if (live && (lane & (16 / kChunks - 1)) == 0 && static_cast<int64_t>(first) * 8 < cols)
        p.block_scale_inv[(first / 16) * p.block_scale_ld + row] = 1.0f / sb;
      float sj[kChunks];
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        sj[j] = __shfl_sync(0xffffffffu, sb, (lane & 16) | scatter_lane<kChunks>(j));
      }
      if (whole) {
#pragma unroll
        for (int j = 0; j < kChunks; ++j) store_fp8<kFmt>(p, at + j * X * 8, y[j], sj[j], 8, true);
      } else {
        const bool vec = out_row_vec<kOut>(p, base);
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          const int valid = valid_of(j, live);
          if (valid > 0) store_fp8<kFmt>(p, at + j * X * 8, y[j], sj[j], valid, vec);
        }
      }
    }
  }
  finish_amax<kOut>(p, amax, red_max);
}

template <typename T, int kOut, int kFmt, int kChunks, bool kRms, bool kW16>
__global__ void __launch_bounds__(kRowThreads<T, kChunks>, kRowMinBlocks<T, kOut, kChunks>)
    norm_fwd_rows_kernel(const FwdParams p) {
  fwd_rows<T, kOut, kFmt, kChunks, kRms, kW16>(p);
}

// 16-bit rows of 8 chunks with a high-precision or per-tensor output, LayerNorm's and (with 16-bit
// weights) RMSNorm's: at most 80 registers, so that H 8192 (128 threads per row) runs 6 CTAs per SM
// instead of the 4 that __launch_bounds__(512) left room for at 128 registers (a 512-thread CTA,
// H 32768, still fits at 80). Measured on the H200 (16384 x 8192 bf16, NOTES.md): LayerNorm BF16
// 0.80 -> 0.81 of copy, FP8 0.61 -> 0.63. RMSNorm with fp32 weights keeps the bound above (at 80
// its FP8 row fell 0.77 -> 0.73); with 16-bit ones, unbounded, ptxas gave its BF16 row 114
// registers (0.144 -> 0.153 ms) and its FP8 row 100; at 80 they ran 0.144 and 0.108 -> 0.106 ms,
// at 72 (7 CTAs) the same. The 1x128 rows stay unbounded (they hold all 64 y values for their
// block scales).
constexpr int kWideRowRegs = 80;
template <typename T, int kOut, int kFmt, int kChunks, bool kRms, bool kW16>
__global__ void __maxnreg__(kWideRowRegs) norm_fwd_wide_rows_kernel(const FwdParams p) {
  fwd_rows<T, kOut, kFmt, kChunks, kRms, kW16>(p);
}
template <typename T, int kOut, int kChunks, bool kRms, bool kW16>
constexpr bool kWideRows = sizeof(T) == 2 && kChunks == 8 && kOut != kOutBlock1D && (!kRms || kW16);
// LayerNorm's rows with 16-bit weights, several rows a CTA (launch_rows_shared_w): the wide rows,
// and the 1x128 ones under the one-row kernel's register bound.
template <typename T, int kOut, int kFmt, int kChunks>
__global__ void __maxnreg__(kWideRowRegs) norm_fwd_shared_w_kernel(const FwdParams p) {
  fwd_rows<T, kOut, kFmt, kChunks, false, true, true>(p);
}
template <typename T, int kFmt, int kChunks>
__global__ void __launch_bounds__(kRowThreads<T, kChunks>, 1) norm_fwd_shared_w_block_kernel(const FwdParams p) {
  fwd_rows<T, kOutBlock1D, kFmt, kChunks, false, true, true>(p);
}

// Re-read path: the row in steps of X * 8 * kIter columns, once per pass (L2 after the first).
template <typename T, int kOut, int kFmt>
__global__ void __launch_bounds__(kMaxThreads) norm_fwd_reread_kernel(const FwdParams p) {
  __shared__ float red[kMaxThreads / 32];
  __shared__ uint32_t red_max[kMaxThreads / 32];
  const int X = blockDim.x, t = threadIdx.x;
  const int64_t cols = p.cols;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < p.rows;
  const int64_t base = (live ? row : 0) * cols;
  const T* xr = static_cast<const T*>(p.x) + base;
  const bool x_vec = norm::aligned16(xr);
  const float n = static_cast<float>(cols);
  const float s = per_tensor_scale<kOut, kFmt>(p);
  const int64_t step = static_cast<int64_t>(X) * 8 * kIter;
  // The x of one chunk as fp32; the values past the row are +0.
  auto load_x = [&](int64_t c, float (&x)[8]) {
    Raw8<T> v;
    norm::load_chunk(v, xr + c, live ? norm::chunk_valid(cols, c) : 0, x_vec);
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = v.get(k);
  };

  float mu = 0.0f, rs = 0.0f;
  if (p.load_stats && live) {
    if (!p.rms) mu = p.mu[row];
    rs = p.rsigma[row];
  }
  if (!p.load_stats) {
    if (!p.rms) {
      float sum[1] = {0.0f};
      for (int64_t c0 = 0; c0 < cols; c0 += step) {
#pragma unroll
        for (int j = 0; j < kIter; ++j) {
          float x[8];
          load_x(c0 + static_cast<int64_t>(j * X + t) * 8, x);
#pragma unroll
          for (int k = 0; k < 8; ++k) sum[0] = __fadd_rn(sum[0], x[k]);
        }
      }
      norm::row_sum(sum, red);
      mu = __fdiv_rn(sum[0], n);
    }
    float sq[1] = {0.0f};
    for (int64_t c0 = 0; c0 < cols; c0 += step) {
#pragma unroll
      for (int j = 0; j < kIter; ++j) {
        const int64_t c = c0 + static_cast<int64_t>(j * X + t) * 8;
        float x[8];
        load_x(c, x);
#pragma unroll
        for (int k = 0; k < 8; ++k) x[k] = centered<false>(x[k], mu);
        sq[0] = add_squares(sq[0], x, norm::chunk_valid(cols, c));
      }
    }
    norm::row_sum(sq, red);
    rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sq[0], n), p.eps)));
    if (live && t == 0) {
      if (p.mu != nullptr) p.mu[row] = mu;
      if (p.rsigma != nullptr) p.rsigma[row] = rs;
    }
  }
  const bool out_vec = out_row_vec<kOut>(p, base);
  AmaxAcc amax;
  for (int64_t c0 = 0; c0 < cols; c0 += step) {
#pragma unroll
    for (int j = 0; j < kIter; ++j) {
      const int64_t c = c0 + static_cast<int64_t>(j * X + t) * 8;
      const int valid = live ? norm::chunk_valid(cols, c) : 0;
      float y[8];
      load_x(c, y);
#pragma unroll
      for (int k = 0; k < 8; ++k) y[k] = centered<false>(y[k], mu);
      chunk_y<true>(p, c, valid, rs, y);
      if constexpr (kOut == kOutHigh) {
        if (p.out != nullptr) norm::store8(p.out, p.out_dtype, base + c, y, valid, out_vec);
      } else if constexpr (kOut == kOutPerTensor) {
        amax.add(y, valid);
        if (p.out != nullptr && valid > 0) store_fp8<kFmt>(p, base + c, y, s, valid, out_vec);
      } else {
        // The 16 lanes holding one 128-column block (lane groups of 16 never straddle a block).
        uint32_t m = chunk_amax(y, valid);
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 8));
        const float sb = compute_scale_from_amax(__uint_as_float(m), kFp8Max<kFmt>, p.pow2, p.amax_epsilon);
        if (valid > 0) {
          store_fp8<kFmt>(p, base + c, y, sb, valid, out_vec);
          if ((t & 15) == 0) p.block_scale_inv[(c / 128) * p.block_scale_ld + row] = 1.0f / sb;
        }
      }
    }
  }
  finish_amax<kOut>(p, amax, red_max);
}

// 16-bit rows: at most 128 threads per row up to 4 chunks. Measured on the H200 (16384 rows, bf16)
// against 256: H 4096 (2 -> 4 chunks) LayerNorm BF16 0.64 -> 0.76 of copy, FP8 delayed 0.49 ->
// 0.56, 1x128 0.43 -> 0.54, RMSNorm FP8 delayed 0.64 -> 0.73 (BF16 0.82 -> 0.78); H 8192 (4 -> 8)
// every per-tensor row +0.01-0.04, the 1x128 rows -0.01 / -0.06. fp32 rows keep 256 (not
// measured). Registers per thread bound the chunk count: 8 chunks take 512 threads for 16-bit
// inputs, 256 for fp32.
template <typename T>
norm::RowLayout fwd_layout(int64_t cols) {
  constexpr int kCapBelow8 = sizeof(T) == 2 ? 128 : 256;
  return norm::choose_layout(
      cols, [](int k) { return k < 8 ? kCapBelow8 : (sizeof(T) == 2 ? 512 : 256); }, kMaxThreads);
}

// Stages of the rows kernel: 2, one row per row group in flight while the CTA works on another
// (16 KB per CTA for 16-bit rows of 8192, several CTAs per SM: enough for the copy rate at ~2 us
// of latency).
// Measured on the H200 (16384 rows, bf16, NOTES.md): 3 stages lost 0.04-0.05 of copy on the FP8
// rows and gained 0.04 only on RMSNorm's BF16 one (fifth session). Again after the eleventh
// session's changes: at H 8192 every row lost (RMSNorm BF16 0.87 -> 0.83, FP8 0.77 -> 0.63,
// LayerNorm BF16 0.82 -> 0.76), at H 4096 (16-bit rows of 4 chunks) all but RMSNorm's BF16 output,
// 0.79 -> 0.86, which takes 3.
template <typename T, int kOut, int kChunks, bool kRms>
constexpr int kFwdStages = (kRms && kOut == kOutHigh && sizeof(T) == 2 && kChunks == 4) ? 3 : 2;

template <auto kKernel, typename T, int kChunks, int kStages>
void launch_rows_with(FwdParams p, const norm::RowLayout& layout, cudaStream_t stream);

// Rows a CTA of kShared (a shared-weights kernel of at most kMaxCta threads) on the current device
// at X threads a row: the most that fit its registers, threads, named barriers (1..15; 0 is the
// CTA's) and shared memory (the stages and the weights), or 0 where that is fewer than kOne (the
// same rows one a CTA) has CTAs an SM: then the rows in flight would drop. Cached per device and X.
template <auto kShared, auto kOne, int kStages, int kMaxCta>
int shared_w_rows(int X, size_t row_bytes) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices][kMaxThreads / 32 + 1] = {};
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    const int known = cache[device][X / 32].load(std::memory_order_relaxed);
    if (known != 0) return known - 1;
  }
  const size_t w_bytes = 2 * row_bytes;  // gamma's and beta's pieces
  const size_t avail = norm::max_dynamic_smem<kShared>();
  int fit = avail > w_bytes ? static_cast<int>((avail - w_bytes) / (kStages * row_bytes)) : 0;
  fit = std::min({fit, kMaxCta / X, 15});
  if (fit < 2) {  // also keeps the one-row query below within the device's shared memory
    if (cached) cache[device][X / 32].store(1, std::memory_order_relaxed);
    return 0;
  }
  const size_t one_smem = kStages * row_bytes;
  norm::allow_dynamic_smem<kOne>(one_smem);
  int one = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&one, kOne, X, one_smem),
             "norm: cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  int rows = 0;
  for (int r = fit; r >= std::max(2, one) && rows == 0; --r) {
    const size_t smem = kStages * row_bytes * r + w_bytes;
    norm::allow_dynamic_smem<kShared>(smem);
    int per_sm = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kShared, X * r, smem),
               "norm: cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    if (per_sm >= 1) rows = r;
  }
  if (cached) cache[device][X / 32].store(rows + 1, std::memory_order_relaxed);
  return rows;
}

// LayerNorm's rows of 8 chunks with 16-bit weights: one CTA an SM holding as many rows as the
// one-row kernel has CTAs there, gamma and beta copied once per CTA into shared memory (fwd_rows'
// kSharedW). With one row a CTA the weights (32 KB a row at H 8192) were re-read by every row,
// mostly from L2 (ncu on the H200: ~9.4 M sectors a call beside x's 8.4 M), since 192 KB of
// stages leave the L1 28 KB, and each chunk's y waited on them. Measured on the H200 (16384 x 8192
// bf16, three alternating passes; benchmarks/NOTES.md, thirty-eighth session): per-tensor FP8
// 0.131-0.133 -> 0.104-0.105 ms (0.73 -> 0.92 of copy), the current-scaling pair 0.223 -> 0.195,
// BF16 0.152-0.154 -> 0.149-0.150. On an H100, whose LayerNorm rows were already at 0.85-0.90 of
// its lower copy bandwidth, the same change moved them by -1 to +2%. RMSNorm (16 KB of weights,
// which mostly hit L1) gained nothing in BF16 and lost 6% in per-tensor FP8 this way on the H200,
// so it keeps one row a CTA. The 1x128 rows (four a CTA at H 8192: they hold all their y values
// in 128 registers) take it where DRAM is fast per SM (kSharedWBlockMinMbpsPerSm). Only for a full
// wave of rows (fewer would sit on fewer SMs than one row a CTA spreads them over). False: the
// caller launches the one-row kernel.
template <auto kShared, auto kOne, typename T, int kChunks, int kStages, int kMaxCta>
bool launch_rows_shared_w(FwdParams p, const norm::RowLayout& layout, const char* name, cudaStream_t stream) {
  if (layout.rows != 1) return false;
  const int X = layout.threads;
  const size_t row_bytes = static_cast<size_t>(X) * kChunks * sizeof(Raw8<T>);
  const int rows = shared_w_rows<kShared, kOne, kStages, kMaxCta>(X, row_bytes);
  if (rows == 0 || p.rows < static_cast<int64_t>(rows) * sm_count()) return false;
  p.stages = kStages;
  const size_t smem = kStages * row_bytes * rows + 2 * row_bytes;
  norm::allow_dynamic_smem<kShared>(smem);
  const int64_t ctas = std::min<int64_t>(sm_count(), ceil_div(p.rows, rows));
  kShared<<<static_cast<unsigned>(ctas), dim3(X, rows), smem, stream>>>(p);
  check_launch(name);
  return true;
}

// LayerNorm's 1x128 rows in the shared-weights form, measured at 16384 x 8192 bf16: on the H200
// (4.9 TB/s over 132 SMs, ~37 GB/s an SM) 0.140 -> 0.128 ms (0.69 -> 0.75 of copy, forty-fifth
// session); on an H100 SXM (3.35 TB/s, ~25 GB/s an SM) 0.156 -> 0.167 ms, 5% slower at H 6144
// and 8% faster at H 12288 (two rows a CTA; thirty-ninth session). The form trades each chunk's L1 / L2 reads of gamma and beta for two
// shared-memory reads an element: where DRAM feeds each SM faster, the weights' L2 re-reads are
// what the one-row kernel waits on (LayerNorm's per-tensor rows gained 0.73 -> 0.92 of copy on
// the H200 the same way); where it feeds them slower, the H100's L1 held the weights well enough
// and the extra shared reads cost more. The line sits between the two measured cards.
constexpr int kSharedWBlockMinMbpsPerSm = 30000;

template <typename T, int kOut, int kFmt, int kChunks, bool kRms, bool kW16>
void launch_rows_w(FwdParams p, const norm::RowLayout& layout, cudaStream_t stream) {
  constexpr int kStages = kFwdStages<T, kOut, kChunks, kRms>;
  if constexpr (kWideRows<T, kOut, kChunks, kRms, kW16>) {
    constexpr auto kWide = norm_fwd_wide_rows_kernel<T, kOut, kFmt, kChunks, kRms, kW16>;
    if constexpr (!kRms && kW16) {
      if (launch_rows_shared_w<norm_fwd_shared_w_kernel<T, kOut, kFmt, kChunks>, kWide, T, kChunks, kStages,
                               kSharedWMaxThreads>(p, layout, "norm_fwd_shared_w_kernel", stream)) {
        return;
      }
    }
    launch_rows_with<kWide, T, kChunks, kStages>(p, layout, stream);
  } else {
    constexpr auto kOne = norm_fwd_rows_kernel<T, kOut, kFmt, kChunks, kRms, kW16>;
    if constexpr (kOut == kOutBlock1D && !kRms && kW16 && kChunks == 8) {
      if (dram_mbps_per_sm() >= kSharedWBlockMinMbpsPerSm &&
          launch_rows_shared_w<norm_fwd_shared_w_block_kernel<T, kFmt, kChunks>, kOne, T, kChunks, kStages,
                               kRowThreads<T, kChunks>>(p, layout, "norm_fwd_shared_w_block_kernel", stream)) {
        return;
      }
    }
    launch_rows_with<kOne, T, kChunks, kStages>(p, layout, stream);
  }
}

// 16-bit weights only where the rows kernel reads pieces of x's own 16-bit dtype.
template <typename T, int kOut, int kFmt, int kChunks, bool kRms>
void launch_rows(FwdParams p, const norm::RowLayout& layout, cudaStream_t stream) {
  if constexpr (sizeof(T) == 2) {
    if (p.w16) {
      launch_rows_w<T, kOut, kFmt, kChunks, kRms, true>(p, layout, stream);
      return;
    }
  }
  launch_rows_w<T, kOut, kFmt, kChunks, kRms, false>(p, layout, stream);
}

template <auto kKernel, typename T, int kChunks, int kStages>
void launch_rows_with(FwdParams p, const norm::RowLayout& layout, cudaStream_t stream) {
  const int threads = layout.threads * layout.rows;
  // Fewer stages where a CTA's shared memory is smaller (99 KB on sm_89/120): one stage, the row
  // copied and waited for in the same turn, always fits (64 KB at most).
  const size_t stage_bytes = static_cast<size_t>(threads) * kChunks * sizeof(Raw8<T>);
  const size_t fit = norm::max_dynamic_smem<kKernel>() / stage_bytes;
  const int wanted = kStages;
  p.stages = fit >= static_cast<size_t>(wanted) ? wanted : std::max(1, static_cast<int>(fit));
  const size_t smem = static_cast<size_t>(p.stages) * stage_bytes;
  norm::allow_dynamic_smem<kKernel>(smem);
  // One wave: as many CTAs as are resident at once, each looping over row groups.
  const int64_t groups = ceil_div(p.rows, layout.rows);
  int64_t ctas = norm::resident_ctas<kKernel>(threads, smem);
  if (ctas > groups) ctas = groups;
  kKernel<<<static_cast<unsigned>(ctas), dim3(layout.threads, layout.rows), smem, stream>>>(p);
  check_launch("norm_fwd_rows_kernel");
}

template <int kOut, int kFmt>
void launch_fwd(const FwdParams& p, int32_t in_dtype, cudaStream_t stream) {
  dispatch_source(in_dtype, [&](auto tag) {
    using T = decltype(tag);
    const norm::RowLayout layout = fwd_layout<T>(p.cols);
    norm::dispatch_chunks(layout.chunks, [&](auto chunks) {
      constexpr int kChunks = decltype(chunks)::value;
      if constexpr (kChunks == 0) {
        const int64_t grid = ceil_div(p.rows, layout.rows);
        if (grid > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "norm_fwd_reread_kernel: too many rows");
        norm_fwd_reread_kernel<T, kOut, kFmt>
            <<<static_cast<unsigned>(grid), dim3(layout.threads, layout.rows), 0, stream>>>(p);
        check_launch("norm_fwd_reread_kernel");
      } else if (p.rms) {
        launch_rows<T, kOut, kFmt, kChunks, true>(p, layout, stream);
      } else {
        launch_rows<T, kOut, kFmt, kChunks, false>(p, layout, stream);
      }
    });
  });
}

// The layout of the weights launch_fwd's kernel reads for this norm, input dtype and H: pieces for
// the rows kernel, in x's own 16-bit dtype where gamma and beta have it and gamma is not
// zero-centered (the values the kernel widens are then exactly the fp32 ones): ncu of LayerNorm at
// H 8192 found its 64 KB of fp32 weights per row missing L1 (28% hits beside 192 KB of staged
// rows), L2 75% busy and long-scoreboard waits 40% of the stalls; half the bytes cost one widening
// per weight. Otherwise fp32 pieces for LayerNorm's rows kernel and the natural layout for
// RMSNorm's: in fp32 pieces its BF16 and 1x128 rows measured 0.87 -> 0.85 and 0.65 -> 0.63 of copy
// at H 8192 on the H200 (its FP8 row 0.76 -> 0.77), where LayerNorm's, with twice the weights to
// load, gained on every row (NOTES.md). 16-bit pieces are the natural layout padded to the width.
inline norm::WeightPieces fwd_weight_pieces(bool rms, int32_t in_dtype, int64_t cols, int32_t gamma_dtype,
                                            bool has_beta, int32_t beta_dtype, bool zero_centered) {
  norm::WeightPieces w;
  dispatch_source(in_dtype, [&](auto tag) {
    using T = decltype(tag);
    const norm::RowLayout layout = fwd_layout<T>(cols);
    const bool w16 = norm::weight_as_is_16(in_dtype, gamma_dtype, zero_centered) &&
                     (rms || !has_beta || beta_dtype == in_dtype);
    if (layout.chunks > 0 && (w16 || !rms))
      w = {layout.threads, static_cast<int64_t>(layout.threads) * 8 * layout.chunks, !rms, w16 ? in_dtype : 0};
  });
  return w;
}

// One translation unit each (normalization_fwd_*.cu).
extern template void launch_fwd<kOutHigh, 0>(const FwdParams&, int32_t, cudaStream_t);
extern template void launch_fwd<kOutPerTensor, TE_DTYPE_FLOAT8_E4M3>(const FwdParams&, int32_t, cudaStream_t);
extern template void launch_fwd<kOutPerTensor, TE_DTYPE_FLOAT8_E5M2>(const FwdParams&, int32_t, cudaStream_t);
extern template void launch_fwd<kOutBlock1D, TE_DTYPE_FLOAT8_E4M3>(const FwdParams&, int32_t, cudaStream_t);
extern template void launch_fwd<kOutBlock1D, TE_DTYPE_FLOAT8_E5M2>(const FwdParams&, int32_t, cudaStream_t);

}  // namespace normfwd
}  // namespace cuda
}  // namespace te
