// The 128x128-tile quantize kernel behind every quantization that writes a column-wise
// (transposed) copy: per-tensor cast-transpose (quantize_per_tensor.cu) and Float8BlockScaling
// 1x128 / 128x128 (quantize_block.cu). One read of the input writes both copies.
//
// Contract: input [rows, cols] fp32/fp16/bf16 row-major; rowwise [rows, cols] and columnwise
// [cols, rows] FP8 (either may be absent); q = convert(x * scale) with one fp32 multiply and a
// saturating round-to-nearest-even conversion, scale_inv = 1 / scale. Any shape: edge tiles load
// zeros outside the matrix (zeros never raise a max) and store only valid elements. Wide accesses
// are used only where pointer and row pitch allow (flags computed on the host); else scalar.
//
// Layout of work (256 threads, 8 warps): thread (g = tid % 8, tr = tid / 8) owns source rows
// 4*tr .. 4*tr+3 of the tile and columns 8g..8g+7 and 64+8g..64+8g+7, i.e. 4 x 16 elements held
// as loaded (packed for 16-bit types). Each load instruction of a warp reads four 128-byte row
// segments, so loads are fully coalesced; row-wise stores are 64-byte segments (whole sectors).
// For the transposed copy each thread packs, per column, its 4 consecutive-row bytes into one
// word, writes the word to a 128 x 32-word shared tile, and after a barrier every thread reads
// 16-byte groups back along the tile's columns, so each transposed row (128 source rows = 128
// bytes) is written as one full line with 16-byte stores. The 16-byte groups of a shared row are
// XOR-swizzled by (column / 8) % 8, which makes both the word writes and the 16-byte reads free of
// bank conflicts without padding (padding would break 16-byte alignment of the reads).
//
// Why 128x128: it is the 2-D block of Float8BlockScaling, and a multiple of the 1x128 block in both
// directions, so a 1-D tile's row blocks and column blocks are both complete inside one CTA (row
// amax: a shuffle across the 8 lanes sharing a row; column amax: shuffles across the 4 lanes
// sharing a column in a warp, then across the 8 warps through shared memory).
//
// The source is a loader (template parameter), so fused ops quantize a value they compute on the
// fly from one read of their own inputs: InputLoader (below) reads a plain fp32/fp16/bf16 matrix,
// the loaders of cuda/activation_fwd.cu and _bwd.cu compute an activation or its gradient (and
// cuda/fused_output.cuh decides which output takes this kernel). A loader provides
//   Value                the element type of the Raw8 vectors the kernel reduces and converts
//   Raw, load(raw, r, c) what it loads for the 8 elements (r, c..c+7), r < rows, c < cols
//   finish(raw, c, x)    the 8 values from the loaded data; elements at or past `cols` must be +-0
//   kBatchRows           how many of the thread's 4 rows it loads before finishing them (the
//                        register budget: every load of a batch is in flight at once)
//   kMinBlocks           the resident CTAs per SM to hold registers for
//   kStreamMinBlocks     (computed sources) the same for the kernels that hold no whole tile of
//                        values: the per-tensor cast_tile_stream_kernel and fused_output's flat pass
//   kStreamPrefetch      (computed sources) whether cast_tile_stream_kernel loads a thread's next
//                        row before computing the current one (two rows of Raw in registers)
//   kFormatTemplate      whether to compile one kernel per FP8 format (the plain input: tuned
//                        conversions) or one reading the format at run time (computed sources,
//                        whose kernels are many and whose math dwarfs the conversion)
// Two extras for fused ops: kHighPrecision mode writes the values rounded to fp32/fp16/bf16 instead
// of quantizing them, and a non-null dbias_partial receives the tile's column sums (rows in a
// fixed order), so a bias gradient comes out of the same read.
#pragma once

#include <cooperative_groups.h>

#include "common/kernels.h"
#include "cuda/cuda_utils.cuh"

namespace te {
namespace cuda {
namespace tile {

constexpr int kThreads = 256;
constexpr int kTile = 128;

enum Mode : int { kPerTensor = 0, kBlock1D = 1, kBlock2D = 2, kHighPrecision = 3 };

struct Params {
  int64_t rows, cols;
  int64_t tiles_c;  // ceil(cols / 128)
  uint8_t* rowwise;
  uint8_t* columnwise;
  float* rowwise_scale_inv;
  int64_t rowwise_scale_ld;
  float* columnwise_scale_inv;
  int64_t columnwise_scale_ld;
  // kPerTensor only.
  const float* scale;    // delayed: the scale to use
  const float* amax_in;  // current: the amax to derive the scale from
  float* amax_out;       // delayed: max-accumulated if non-null
  float* scale_out;      // current: written if non-null
  bool current;
  bool reverse;  // walk tiles last-first (current scaling: the amax pass left the end in L2)
  // Scale rule (current and block scaling).
  bool pow2;
  float eps;
  // kHighPrecision: rowwise holds [rows, cols] of this dtype (fp32/fp16/bf16); with a run-time
  // format (kFmt 0): the FP8 dtype of both copies.
  int32_t out_dtype;
  // [ceil(rows / 128), cols] or nullptr: row ti gets the column sums of tile row ti.
  float* dbias_partial;
  // Wide-access permissions for the outputs (the loader has its own for its inputs).
  bool vec_row, vec_col;
  // Cooperative launches only (kCoop; every CTA resident, so grid barriers are allowed):
  // grid_amax: current scaling's amax of the whole input, taken from the tile values already in
  // registers and max-combined in amax_acc (te's amax output) behind grid barriers, instead of a
  // separate amax pass (one launch and one read of the input fewer); dbias_out: dbias_partial's
  // column sums of dbias_chunks tile rows, summed in this launch after a grid barrier in the
  // order fused_output.cu's sum_partials_kernel uses (same bits), instead of by that kernel.
  bool grid_amax;
  float* amax_acc;
  void* dbias_out;
  int32_t dbias_dtype;
  int64_t dbias_chunks;
};

struct alignas(16) Smem {
  uint32_t words[kTile][kTile / 4];  // transposed FP8 tile: [column][4-row word], swizzled
  uint32_t colmax[kThreads / 32][kTile];
  float colscale[kTile];
  uint32_t scratch[kThreads / 32];
};

// The four words (columns k = 0..3 of row-bytes a0..a3, one byte per source row) of 4 rows.
__device__ __forceinline__ void transpose4x4(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t (&w)[4]) {
  const uint32_t lo01 = __byte_perm(a0, a1, 0x5140), lo23 = __byte_perm(a2, a3, 0x5140);
  const uint32_t hi01 = __byte_perm(a0, a1, 0x7362), hi23 = __byte_perm(a2, a3, 0x7362);
  w[0] = __byte_perm(lo01, lo23, 0x5410);
  w[1] = __byte_perm(lo01, lo23, 0x7632);
  w[2] = __byte_perm(hi01, hi23, 0x5410);
  w[3] = __byte_perm(hi01, hi23, 0x7632);
}

// Writes the thread's 4x16 block of FP8 bytes (q[i][h]: row i, columns 64h+8g..+7) into the
// shared transposed tile.
__device__ __forceinline__ void stash_transposed(Smem& sm, const uint2 (&q)[4][2], int g, int tr) {
  const int pos = tr ^ (g << 2);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t lo[4], hi[4];
    transpose4x4(q[0][h].x, q[1][h].x, q[2][h].x, q[3][h].x, lo);
    transpose4x4(q[0][h].y, q[1][h].y, q[2][h].y, q[3][h].y, hi);
    const int c = 64 * h + 8 * g;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      sm.words[c + k][pos] = lo[k];
      sm.words[c + 4 + k][pos] = hi[k];
    }
  }
}

// After a barrier: writes the shared transposed tile to out [cols, rows] (rows of 128 bytes).
__device__ __forceinline__ void store_transposed(const Smem& sm, uint8_t* __restrict__ out,
                                                 int64_t rows, int64_t cols, int64_t r0,
                                                 int64_t c0, bool vec) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int it = 0; it < kTile / (kThreads / 8); ++it) {
    const int c = it * (kThreads / 8) + (tid >> 3);
    const int pq = tid & 7;
    const int q = pq ^ ((c >> 3) & 7);
    const int64_t gc = c0 + c, gr = r0 + 16 * q;
    if (gc >= cols || gr >= rows) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(&sm.words[c][4 * pq]);
    uint8_t* dst = out + gc * rows + gr;
    if (vec && gr + 16 <= rows) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      const int64_t n = rows - gr;
#pragma unroll
      for (int k = 0; k < 16; ++k)
        if (k < n) dst[k] = static_cast<uint8_t>(w[k / 4] >> (8 * (k % 4)));
    }
  }
}

__device__ __forceinline__ void store_row8(uint8_t* __restrict__ dst, uint2 q, int64_t valid,
                                           bool vec) {
  if (vec && valid >= 8) {
    *reinterpret_cast<uint2*>(dst) = q;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < valid) dst[k] = static_cast<uint8_t>((k < 4 ? q.x : q.y) >> (8 * (k % 4)));
  }
}

// A plain fp32/fp16/bf16 source [rows, cols]: what te_quantize reads.
template <typename T>
struct InputLoader {
  using Value = T;
  using Raw = Raw8<T>;
  static constexpr int kBatchRows = 4;
  // 16-bit inputs: capped at 64 registers for 4 resident CTAs per SM (the 1-D kernel would take
  // 80+ and get 2-3); fp32 inputs are left uncapped (capping would spill hundreds of bytes).
  static constexpr int kMinBlocks = sizeof(T) == 4 ? 1 : 4;
  static constexpr bool kFormatTemplate = true;

  const T* in;
  int64_t cols;
  bool vec;  // 16-byte loads: pointer aligned and row pitch a multiple of 16 bytes

  __device__ __forceinline__ void load(Raw& x, int64_t r, int64_t c) const {
    const T* src = in + r * cols + c;
    if (vec && c + 8 <= cols) {
      x.load_vec(src);
    } else {
      x.load_scalar(src, static_cast<int>(cols - c < 8 ? cols - c : 8));
    }
  }
  __device__ __forceinline__ void finish(const Raw& raw, int64_t, Raw8<T>& x) const { x = raw; }
};

// The tile's column sums into p.dbias_partial (row ti): each thread adds its 4 rows in order,
// shuffles add the 4 lanes sharing a column, then warps 0..7 in order through shared memory
// (borrowing colmax, whose other users all come later and behind a barrier). A fixed order, so
// the sums are the same bits on every run.
template <typename V>
__device__ __forceinline__ void column_partials(const Params& p, Smem& sm, const Raw8<V> (&x)[4][2],
                                                int64_t ti, int64_t c0) {
  const int tid = threadIdx.x, g = tid & 7, lane = tid & 31, warp = tid >> 5;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float s = __fadd_rn(__fadd_rn(__fadd_rn(x[0][h].get(k), x[1][h].get(k)), x[2][h].get(k)),
                          x[3][h].get(k));
      s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 8));
      s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 16));
      if (lane < 8) sm.colmax[warp][64 * h + 8 * g + k] = __float_as_uint(s);
    }
  }
  __syncthreads();
  if (tid < kTile && c0 + tid < p.cols) {
    float s = __uint_as_float(sm.colmax[0][tid]);
#pragma unroll
    for (int w = 1; w < kThreads / 32; ++w) s = __fadd_rn(s, __uint_as_float(sm.colmax[w][tid]));
    p.dbias_partial[ti * p.cols + c0 + tid] = s;
  }
  __syncthreads();
}

// Quantizes 8 values with one scale or a scale per element; kFmt 0: the format is `fmt`.
template <int kFmt, typename V, typename S>
__device__ __forceinline__ uint2 quantize8_as(const Raw8<V>& v, const S& scale, int32_t fmt) {
  if constexpr (kFmt != 0) {
    return quantize8<kFmt>(v, scale);
  } else {
    return fmt == TE_DTYPE_FLOAT8_E4M3 ? quantize8<TE_DTYPE_FLOAT8_E4M3>(v, scale)
                                       : quantize8<TE_DTYPE_FLOAT8_E5M2>(v, scale);
  }
}

// Column c's sum of the dbias partials (chunks in order), rounded to the bias gradient's dtype.
__device__ __forceinline__ void store_column_sum(const Params& p, int64_t c) {
  float s = 0.0f;
  for (int64_t i = 0; i < p.dbias_chunks; ++i) s = __fadd_rn(s, __ldcg(p.dbias_partial + i * p.cols + c));
  if (p.dbias_dtype == TE_DTYPE_FLOAT32) {
    static_cast<float*>(p.dbias_out)[c] = s;
  } else if (p.dbias_dtype == TE_DTYPE_BFLOAT16) {
    static_cast<__nv_bfloat16*>(p.dbias_out)[c] = from_float<__nv_bfloat16>(s);
  } else {
    static_cast<__half*>(p.dbias_out)[c] = from_float<__half>(s);
  }
}

// kFmt: the FP8 dtype, or 0 for p.out_dtype (a run-time format).
// kCoop: launched cooperatively (launch_input_coop), with Params' grid-barrier options.
template <typename L, int kFmt, int kMode, bool kCoop = false>
__global__ void __launch_bounds__(kThreads, L::kMinBlocks) cast_tile_kernel(const Params p,
                                                                            const L ld) {
  static_assert(kMode != kHighPrecision, "high precision with dbias: cast_tile_stream_kernel");
  using V = typename L::Value;
  __shared__ Smem sm;
  const float fmt_max = kFmt != 0 ? fp8_max(kFmt) : fp8_max(p.out_dtype);
  const int tid = threadIdx.x, g = tid & 7, tr = tid >> 3, lane = tid & 31, warp = tid >> 5;
  const int64_t t = p.reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int64_t ti = t / p.tiles_c, tj = t % p.tiles_c;
  const int64_t r0 = ti * kTile, c0 = tj * kTile;
  const int64_t rows = p.rows, cols = p.cols;

  // ---- load the thread's 4 x 16 elements (a batch's loads all issued before any use)
  Raw8<V> x[4][2];
  constexpr int kBatch = L::kBatchRows;
#pragma unroll
  for (int i0 = 0; i0 < 4; i0 += kBatch) {
    typename L::Raw raw[kBatch][2];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = r0 + 4 * tr + i0 + i, c = c0 + 64 * h + 8 * g;
        if (r < rows && c < cols) ld.load(raw[i][h], r, c);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = r0 + 4 * tr + i0 + i, c = c0 + 64 * h + 8 * g;
        if (r < rows && c < cols) {
          ld.finish(raw[i][h], c, x[i0 + i][h]);
        } else {
#pragma unroll
          for (int w = 0; w < Raw8<V>::kWords; ++w) x[i0 + i][h].w[w] = 0;
        }
      }
    }
  }

  if (p.dbias_partial != nullptr) column_partials(p, sm, x, ti, c0);

  uint2 q[4][2];

  // ---- scales
  float srow[4] = {1.0f, 1.0f, 1.0f, 1.0f};  // row-wise copy, per row i
  float scol[2][8];                           // column-wise copy (1-D only), per column (h, k)
  if constexpr (kMode == kPerTensor) {
    float s = 0.0f;
    bool grid_scale = false;
    if constexpr (kCoop) {
      if (p.grid_amax) {
        uint32_t m = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int k = 0; k < 8; ++k) m = max(m, abs_bits(x[i][h].get(k)));
        m = block_max<kThreads>(m, sm.scratch);
        cooperative_groups::grid_group grid = cooperative_groups::this_grid();
        if (blockIdx.x == 0 && tid == 0) *reinterpret_cast<uint32_t*>(p.amax_acc) = 0u;
        grid.sync();
        if (tid == 0 && m != 0u) atomic_max_amax(p.amax_acc, canonical_amax_bits<V>(m));
        grid.sync();
        s = compute_scale_from_amax(__ldcg(p.amax_acc), fmt_max, p.pow2, p.eps);
        grid_scale = true;
      }
    }
    if (!grid_scale) s = p.current ? compute_scale_from_amax(*p.amax_in, fmt_max, p.pow2, p.eps) : *p.scale;
#pragma unroll
    for (int i = 0; i < 4; ++i) srow[i] = s;
    if (p.amax_out != nullptr) {
      uint32_t m = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int k = 0; k < 8; ++k) m = max(m, abs_bits(x[i][h].get(k)));
      m = block_max<kThreads>(m, sm.scratch);
      if (tid == 0) atomic_max_amax(p.amax_out, canonical_amax_bits<V>(m));
    }
    if (blockIdx.x == 0 && tid == 0) {
      const float s_inv = 1.0f / s;
      if (p.current && p.scale_out != nullptr) *p.scale_out = s;
      if (p.rowwise_scale_inv != nullptr) *p.rowwise_scale_inv = s_inv;
      if (p.columnwise_scale_inv != nullptr) *p.columnwise_scale_inv = s_inv;
    }
  } else if constexpr (kMode == kBlock2D) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int k = 0; k < 8; ++k) m = max(m, abs_bits(x[i][h].get(k)));
    m = block_max<kThreads>(m, sm.scratch);
    const float s = compute_scale_from_amax(__uint_as_float(m), fmt_max, p.pow2, p.eps);
#pragma unroll
    for (int i = 0; i < 4; ++i) srow[i] = s;
    if (tid == 0) {
      const float s_inv = 1.0f / s;
      if (p.rowwise != nullptr) p.rowwise_scale_inv[ti * p.rowwise_scale_ld + tj] = s_inv;
      if (p.columnwise != nullptr) p.columnwise_scale_inv[tj * p.columnwise_scale_ld + ti] = s_inv;
    }
  } else {  // kBlock1D
    if (p.rowwise != nullptr) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t m = 0;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int k = 0; k < 8; ++k) m = max(m, abs_bits(x[i][h].get(k)));
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 4));
        srow[i] = compute_scale_from_amax(__uint_as_float(m), fmt_max, p.pow2, p.eps);
        const int64_t r = r0 + 4 * tr + i;
        if (g == 0 && r < rows) p.rowwise_scale_inv[tj * p.rowwise_scale_ld + r] = 1.0f / srow[i];
      }
      // The row-wise copy now, before the column scales: its stores start earlier and its
      // registers are free again for the column-wise pass.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint2 qr = quantize8_as<kFmt>(x[i][h], srow[i], p.out_dtype);
          const int64_t r = r0 + 4 * tr + i, c = c0 + 64 * h + 8 * g;
          if (r < rows && c < cols) store_row8(p.rowwise + r * cols + c, qr, cols - c, p.vec_row);
        }
      }
    }
    if (p.columnwise != nullptr) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          uint32_t m = 0;
#pragma unroll
          for (int i = 0; i < 4; ++i) m = max(m, abs_bits(x[i][h].get(k)));
          m = max(m, __shfl_xor_sync(0xffffffffu, m, 8));
          m = max(m, __shfl_xor_sync(0xffffffffu, m, 16));
          if (lane < 8) sm.colmax[warp][64 * h + 8 * g + k] = m;
        }
      }
      __syncthreads();
      if (tid < kTile) {
        uint32_t m = 0;
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) m = max(m, sm.colmax[w][tid]);
        const float s = compute_scale_from_amax(__uint_as_float(m), fmt_max, p.pow2, p.eps);
        sm.colscale[tid] = s;
        if (c0 + tid < cols)
          p.columnwise_scale_inv[ti * p.columnwise_scale_ld + c0 + tid] = 1.0f / s;
      }
      __syncthreads();
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int k = 0; k < 8; ++k) scol[h][k] = sm.colscale[64 * h + 8 * g + k];
    }
  }

  // ---- row-wise copy (and, where both copies share a scale, the bytes of the transposed one;
  // 1-D wrote its row-wise copy above)
  if (kMode != kBlock1D && (p.rowwise != nullptr || p.columnwise != nullptr)) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        q[i][h] = quantize8_as<kFmt>(x[i][h], srow[i], p.out_dtype);
        const int64_t r = r0 + 4 * tr + i, c = c0 + 64 * h + 8 * g;
        if (p.rowwise != nullptr && r < rows && c < cols)
          store_row8(p.rowwise + r * cols + c, q[i][h], cols - c, p.vec_row);
      }
    }
  }

  // ---- column-wise copy
  if (p.columnwise != nullptr) {
    if constexpr (kMode == kBlock1D) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) q[i][h] = quantize8_as<kFmt>(x[i][h], scol[h], p.out_dtype);
    }
    stash_transposed(sm, q, g, tr);
    __syncthreads();
    store_transposed(sm, p.columnwise, rows, cols, r0, c0, p.vec_col);
  }

  if constexpr (kCoop) {
    if (p.dbias_out != nullptr) {
      cooperative_groups::this_grid().sync();  // every tile row's partials are written
      const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
      for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + tid; c < cols; c += stride)
        store_column_sum(p, c);
    }
  }
}

// Per-tensor FP8 from a computed source (an activation or its gradient) whose scale is known
// before the tile is read (delayed scaling, or current scaling after its amax pass): each row's
// values are quantized as soon as they are computed, so a thread holds the tile's bytes (16
// registers), not its 64 fp32 values, and L::kStreamMinBlocks CTAs fit per SM instead of
// L::kMinBlocks. Loads, math and stores of the resident CTAs then overlap; the computed sources
// spend ~40-60 instructions per element, and at two CTAs per SM half the issue slots stood idle.
// Same bits as cast_tile_kernel<L, 0, kPerTensor>: the same values, scale, conversion, amax and
// column sums in the same order (a thread's 4 rows first to last, then the shuffles and warps).
// kDbias: p.dbias_partial is set (compiled apart). The thread's 16 running column sums live in
// its own shared-memory slots ([column][thread]: conflict-free), not in registers: there they
// spilled 84 bytes at the 80-register bound of L::kStreamMinBlocks = 3 and the dGELU + dbias pass
// took 0.587 ms against 0.479-0.489 ms (16384 x 16384 bf16, H200; 0.41 without a bias gradient).
// kHp (kHighPrecision with a bias gradient, e.g. te's BF16 dGELU + dbias): each row's values are
// stored rounded to p.out_dtype as they are computed, beside the same column sums; no amax, scale
// or transposed copy. cast_tile_kernel held the tile's 64 fp32 values a thread (2 CTAs per SM).
template <typename L, bool kDbias, bool kHp = false>
__global__ void __launch_bounds__(kThreads, L::kStreamMinBlocks)
    cast_tile_stream_kernel(const Params p, const L ld) {
  static_assert(kDbias || !kHp, "a high-precision result without a bias gradient: launch_flat");
  __shared__ Smem sm;
  __shared__ float colsum_slots[kDbias ? 16 : 1][kThreads];
  // volatile: otherwise the compiler forwards each store to the next row's load and the sums are
  // back in registers.
  volatile float* colsum = &colsum_slots[0][threadIdx.x];
  const float fmt_max = fp8_max(p.out_dtype);
  const int tid = threadIdx.x, g = tid & 7, tr = tid >> 3, lane = tid & 31, warp = tid >> 5;
  const int64_t t = p.reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int64_t ti = t / p.tiles_c, tj = t % p.tiles_c;
  const int64_t r0 = ti * kTile, c0 = tj * kTile;
  const int64_t rows = p.rows, cols = p.cols;
  const float s = kHp         ? 1.0f
                  : p.current ? compute_scale_from_amax(*p.amax_in, fmt_max, p.pow2, p.eps)
                              : *p.scale;

  uint2 q[4][2];
  uint32_t m = 0;
  // Raw data of row i in slot i % 2 (kStreamPrefetch: row i + 1 is loaded before row i is
  // computed, so each thread keeps a row of loads in flight through its math).
  typename L::Raw raw[L::kStreamPrefetch ? 2 : 1][2];
  const auto load_row = [&](int i) {
    const int64_t r = r0 + 4 * tr + i;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t c = c0 + 64 * h + 8 * g;
      if (r < rows && c < cols) ld.load(raw[L::kStreamPrefetch ? i % 2 : 0][h], r, c);
    }
  };
  if constexpr (L::kStreamPrefetch) load_row(0);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + 4 * tr + i;
    if constexpr (L::kStreamPrefetch) {
      if (i + 1 < 4) load_row(i + 1);
    } else {
      load_row(i);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t c = c0 + 64 * h + 8 * g;
      const bool valid = r < rows && c < cols;
      Raw8<float> x;
      if (valid) {
        ld.finish(raw[L::kStreamPrefetch ? i % 2 : 0][h], c, x);
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) x.w[k] = 0;
      }
      if constexpr (!kHp) {
#pragma unroll
        for (int k = 0; k < 8; ++k) m = max(m, abs_bits(x.get(k)));
      }
      if constexpr (kDbias) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          volatile float& sum = colsum[(8 * h + k) * kThreads];
          sum = i == 0 ? x.get(k) : __fadd_rn(sum, x.get(k));
        }
      }
      if constexpr (kHp) {
        if (valid) {
          float v[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) v[k] = x.get(k);
          store8_rounded(p.rowwise, r * cols + c, v, p.out_dtype,
                         static_cast<int>(cols - c < 8 ? cols - c : 8), p.vec_row);
        }
      } else {
        q[i][h] = quantize8_as<0>(x, s, p.out_dtype);
        if (p.rowwise != nullptr && valid)
          store_row8(p.rowwise + r * cols + c, q[i][h], cols - c, p.vec_row);
      }
    }
  }

  if constexpr (kDbias) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        float v = colsum[(8 * h + k) * kThreads];
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 8));
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 16));
        if (lane < 8) sm.colmax[warp][64 * h + 8 * g + k] = __float_as_uint(v);
      }
    }
    __syncthreads();
    if (tid < kTile && c0 + tid < cols) {
      float v = __uint_as_float(sm.colmax[0][tid]);
#pragma unroll
      for (int w = 1; w < kThreads / 32; ++w) v = __fadd_rn(v, __uint_as_float(sm.colmax[w][tid]));
      p.dbias_partial[ti * cols + c0 + tid] = v;
    }
  }
  if constexpr (!kHp) {
    if (p.amax_out != nullptr) {
      m = block_max<kThreads>(m, sm.scratch);
      if (tid == 0) atomic_max_amax(p.amax_out, m);  // fp32 values: no canonical NaN to apply
    }
    if (blockIdx.x == 0 && tid == 0) {
      const float s_inv = 1.0f / s;
      if (p.current && p.scale_out != nullptr) *p.scale_out = s;
      if (p.rowwise_scale_inv != nullptr) *p.rowwise_scale_inv = s_inv;
      if (p.columnwise_scale_inv != nullptr) *p.columnwise_scale_inv = s_inv;
    }
    if (p.columnwise != nullptr) {
      stash_transposed(sm, q, g, tr);
      __syncthreads();
      store_transposed(sm, p.columnwise, rows, cols, r0, c0, p.vec_col);
    }
  }
}

// Fills the tiling and FP8-output alignment fields of `p`; returns the number of tiles (CTAs).
inline unsigned prepare_fp8(Params& p) {
  const int64_t tiles = ceil_div(p.rows, kTile) * ceil_div(p.cols, kTile);
  if (tiles > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "cast_tile_kernel: too many tiles");
  p.tiles_c = ceil_div(p.cols, kTile);
  p.vec_row = p.rowwise != nullptr && aligned(p.rowwise, 8) && p.cols % 8 == 0;
  p.vec_col = p.columnwise != nullptr && aligned(p.columnwise, 16) && p.rows % 16 == 0;
  return static_cast<unsigned>(tiles);
}

// Fills the tiling and output-alignment fields of `p` and launches one CTA per 128x128 tile of
// loader `ld`. out_dtype: the FP8 dtype, or for kHighPrecision fp32/fp16/bf16.
// kMayHaveDbias false: the op has no bias gradient (its per-tensor kernel is compiled without).
template <int kMode, bool kMayHaveDbias, typename L>
void launch_loader(Params p, const L& ld, int32_t out_dtype, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return;
  if constexpr (kMode == kHighPrecision) {
    // Only a computed source with a bias gradient takes the tiles in high precision (without
    // one, fused_output's flat pass writes the result).
    static_assert(!L::kFormatTemplate && kMayHaveDbias,
                  "high-precision tiles: a computed source with dbias");
    if (p.dbias_partial == nullptr) {
      fail(TE_ERROR_INTERNAL, "launch_loader: high-precision tiles without dbias");
    }
    const unsigned grid = prepare_fp8(p);
    p.out_dtype = out_dtype;
    p.vec_row = aligned(p.rowwise, 16) && p.cols % 8 == 0;
    p.vec_col = false;
    cast_tile_stream_kernel<L, true, true><<<grid, kThreads, 0, stream>>>(p, ld);
    check_launch("cast_tile_stream_kernel");
  } else {
    const unsigned grid = prepare_fp8(p);
    dispatch_fp8(out_dtype, [&](auto fmt) {
      if constexpr (L::kFormatTemplate) {
        cast_tile_kernel<L, decltype(fmt)::value, kMode><<<grid, kThreads, 0, stream>>>(p, ld);
      } else if constexpr (kMode == kPerTensor) {
        p.out_dtype = out_dtype;
        if (p.dbias_partial == nullptr) {
          cast_tile_stream_kernel<L, false><<<grid, kThreads, 0, stream>>>(p, ld);
        } else if constexpr (kMayHaveDbias) {
          cast_tile_stream_kernel<L, true><<<grid, kThreads, 0, stream>>>(p, ld);
        } else {
          fail(TE_ERROR_INTERNAL, "launch_loader: a bias gradient from an op without one");
        }
      } else {
        p.out_dtype = out_dtype;
        cast_tile_kernel<L, 0, kMode><<<grid, kThreads, 0, stream>>>(p, ld);
      }
      check_launch("cast_tile_kernel");
    });
  }
}

// The plain quantization of `input` [p.rows, p.cols] (in_dtype fp32/fp16/bf16) in FP8 mode
// `mode` (kPerTensor, kBlock1D or kBlock2D): the kernels behind te_quantize and te_dbias_quantize,
// instantiated once (cast_tile.cu).
void launch_input(int mode, const Params& p, const void* input, int32_t in_dtype,
                  int32_t out_dtype, cudaStream_t stream);

// The same as one cooperative launch with p's grid-barrier options (grid_amax, dbias_out), when
// every tile's CTA fits on the GPU at once; false (nothing launched) when they do not, and the
// caller runs the separate passes. For the host-bound sizes a small Linear step quantizes
// (dozens of tiles), this saves one or two launches per quantization.
bool launch_input_coop(int mode, Params p, const void* input, int32_t in_dtype, int32_t out_dtype,
                       cudaStream_t stream);

// Params for a quantization described by the C API's kernel args (common/kernels.h). `reverse`:
// walk the tiles last-first (a current-scaling amax pass just read the tensor first-to-last).
inline Params per_tensor_params(const PerTensorQuantizeArgs& a, bool reverse) {
  Params p{};
  p.rows = a.rows;
  p.cols = a.cols;
  p.rowwise = static_cast<uint8_t*>(a.rowwise);
  p.columnwise = static_cast<uint8_t*>(a.columnwise);
  p.rowwise_scale_inv = a.rowwise_scale_inv;
  p.columnwise_scale_inv = a.columnwise_scale_inv;
  p.scale = a.scale;
  p.amax_in = a.amax;
  p.amax_out = a.current ? nullptr : a.amax;
  p.scale_out = a.scale;
  p.current = a.current;
  p.reverse = reverse;
  p.pow2 = a.force_pow2_scales;
  p.eps = a.amax_epsilon;
  return p;
}

inline Params block_params(const BlockQuantizeArgs& a) {
  Params p{};
  p.rows = a.rows;
  p.cols = a.cols;
  p.rowwise = static_cast<uint8_t*>(a.rowwise);
  p.columnwise = static_cast<uint8_t*>(a.columnwise);
  p.rowwise_scale_inv = a.rowwise_scale_inv;
  p.rowwise_scale_ld = a.rowwise_scale_ld;
  p.columnwise_scale_inv = a.columnwise_scale_inv;
  p.columnwise_scale_ld = a.columnwise_scale_ld;
  p.pow2 = a.force_pow2_scales;
  p.eps = a.amax_epsilon;
  return p;
}

}  // namespace tile
}  // namespace cuda
}  // namespace te
