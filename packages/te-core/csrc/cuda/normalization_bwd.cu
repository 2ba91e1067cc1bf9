// LayerNorm / RMSNorm backward (te/normalization.h has the formulas; csrc/cpu/normalization.cpp is
// the reference). Per row, with xhat = (x - mu) * rsigma recomputed as in the forward and
// dxhat = dz * g: the row sums of dxhat and dxhat * xhat, then
// dx = rsigma * ((dxhat - mean(dxhat)) - xhat * mean(dxhat * xhat)) (RMSNorm: no mean(dxhat)) as
// fmaf(xhat, k1, rsigma * (dxhat - mean(dxhat))) with the row's k1 = -(rsigma * mean(dxhat * xhat)),
// plus `add` in fp32 for te_rmsnorm_bwd_add, rounded once into dx's dtype.
//
// dgamma = sum over rows of dz * xhat and dbeta = sum of dz are deterministic: every CTA sums a
// fixed, contiguous range of rows into its own fp32 partial row of a scratch [ctas, H] buffer (in
// row order per column; CTAs of several row groups combine the groups in order), then a second
// kernel adds the partial rows in a fixed order. Nothing depends on scheduling, so two runs give
// the same bits.
//
// Paths:
//   fused      dz and x of one dtype and H <= 16384 (the row in registers: 512 threads x up to
//              4 chunks of 8): one kernel reads dz and x once, writes dx, and keeps each column's
//              dgamma/dbeta partial sums in shared memory over its row range. The next row's dz
//              and x are copied into shared memory (cp.async) while the current row is reduced
//              and written, so loads stay in flight through the row's barrier and stores.
//   generic    any other case (longer rows, dz and x of different dtypes, a fused CTA too large for
//              the device's shared memory): a dx kernel that re-reads the row from L2 for its
//              second pass, then a column kernel that reads dz and x again for the partial sums.
//              Correct everywhere, slower.
#include "common/kernels.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/norm_row.cuh"

namespace te {
namespace cuda {
namespace {

using norm::kIter;
using norm::kMaxThreads;

struct BwdParams {
  const void* dz;  // [rows, cols]
  const void* x;   // [rows, cols]
  int64_t rows, cols;
  const float* mu;  // [rows], LayerNorm only
  const float* rsigma;
  // fp32 with a zero-centered gamma's + 1 applied (norm::Fp32Weights): in pieces for the fused
  // kernel (x's own 16-bit dtype where launch_fused reads them so), in the natural layout for the
  // generic path.
  const float* gamma;
  bool rms;
  const void* add;  // [rows, cols] or nullptr
  int32_t add_dtype;
  void* dx;
  int32_t dx_dtype;
  float* dgamma_part;  // fused: [gridDim.x, cols]
  float* dbeta_part;   // fused: [gridDim.x, cols] or nullptr
  int64_t rows_per_cta;
};

// One element's xhat and dxhat, as the forward computes xhat.
struct Grad {
  float xhat, dxhat;
};

__device__ __forceinline__ Grad grad_at(float x, float dy, float g, float mu, float rs) {
  // mu is +0 for RMSNorm, and x - 0 is x bit for bit.
  return {__fmul_rn(__fsub_rn(x, mu), rs), __fmul_rn(dy, g)};
}

// dx = rsigma (dxhat - mean(dxhat)) + xhat k1, k1 = -(rsigma mean(dxhat xhat)): a subtraction,
// a multiply and a fused multiply-add per element, one instruction fewer than the textbook
// order (the kernels are issue-bound). dxhat - mean(dxhat) stays a subtraction so that it cancels
// exactly where the row's dxhat are equal (H = 1: dx is 0, not rounding noise).
struct DxRow {
  float mean_dxhat, k1;
};

__device__ __forceinline__ DxRow dx_row(float mean_dxhat, float mean_proj, float rs) {
  return {mean_dxhat, -__fmul_rn(rs, mean_proj)};
}

__device__ __forceinline__ float dx_at(const Grad& d, const DxRow& k, float rs) {
  return __fmaf_rn(d.xhat, k.k1, __fmul_rn(rs, __fsub_rn(d.dxhat, k.mean_dxhat)));
}

// dx of one chunk (column c of the row at `base`, weights g), with `add`, stored.
template <typename TX, typename TD>
__device__ __forceinline__ void emit_dx(const BwdParams& p, int64_t base, int64_t c, int valid,
                                        const Raw8<TX>& vx, const Raw8<TD>& vd, const float (&g)[8], float mu,
                                        float rs, const DxRow& k, bool dx_vec, bool add_vec) {
  float a[8], dx[8];
  if (p.add != nullptr) norm::load8(p.add, p.add_dtype, base + c, valid, add_vec, a);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    dx[i] = dx_at(grad_at(vx.get(i), vd.get(i), g[i], mu, rs), k, rs);
    if (p.add != nullptr) dx[i] = __fadd_rn(dx[i], a[i]);
  }
  norm::store8(p.dx, p.dx_dtype, base + c, dx, valid, dx_vec);
}

struct RowPtrs {
  bool x_vec, dz_vec, dx_vec, add_vec;
};

template <typename TX, typename TD>
__device__ __forceinline__ RowPtrs row_ptrs(const BwdParams& p, int64_t base) {
  RowPtrs r;
  r.x_vec = norm::aligned16(static_cast<const TX*>(p.x) + base);
  r.dz_vec = norm::aligned16(static_cast<const TD*>(p.dz) + base);
  r.dx_vec = norm::aligned16(static_cast<const char*>(p.dx) + base * norm::elem_bytes(p.dx_dtype));
  r.add_vec = p.add != nullptr &&
              norm::aligned16(static_cast<const char*>(p.add) + base * norm::elem_bytes(p.add_dtype));
  return r;
}

// ---- fused path -----------------------------------------------------------------------------

// Adds 8 values into a thread's two 16-byte pieces of partial sums: elements 0-3 at acc[0], 4-7
// at acc[X] (acc_piece's layout).
__device__ __forceinline__ void add8(float4* acc, int X, const float (&v)[8]) {
  float4 lo = acc[0], hi = acc[X];
  lo.x = __fadd_rn(lo.x, v[0]);
  lo.y = __fadd_rn(lo.y, v[1]);
  lo.z = __fadd_rn(lo.z, v[2]);
  lo.w = __fadd_rn(lo.w, v[3]);
  hi.x = __fadd_rn(hi.x, v[4]);
  hi.y = __fadd_rn(hi.y, v[5]);
  hi.z = __fadd_rn(hi.z, v[6]);
  hi.w = __fadd_rn(hi.w, v[7]);
  acc[0] = lo;
  acc[X] = hi;
}

// Piece q (0, 1) of chunk j of thread t in a row group's partial sums: [kChunks][2][X] 16-byte
// pieces, so a warp's 16-byte accesses cover consecutive bytes. Each thread's 8 columns as 32
// contiguous bytes put 8 lanes' pieces 32 bytes apart: two wavefronts per quarter-warp, every
// partial-sum access bank-conflicted two ways (4 of the 6 shared-memory accesses per element
// pair in LayerNorm's backward).
__device__ __forceinline__ float4* acc_piece(float4* acc, int X, int t, int j) {
  return acc + 2 * j * X + t;
}

// The dgamma/dbeta partial sums live in shared memory, not registers: [2][Y] row-group blocks of
// X * 8 * kChunks floats (acc_piece's layout), each thread reading and writing only its own
// columns (no barrier needed), so the registers hold just the row data and the CTA count per SM
// is not cut by 2 * H accumulators per CTA in the register file. 16-bit rows of up to 16384 run
// at 512 threads x 4 chunks. Two CTAs of 512 threads per SM (64 registers) where the row data
// allows: 16-bit rows of up to 2 chunks per thread. After the partials, shared memory holds one staged row per row group:
// dz, then x, each [Y][kChunks][kQuads][X] 16-byte pieces (norm_row.cuh). One stage, not two:
// with two, H = 8192 LayerNorm would need 128 KB per CTA and fit one CTA per SM, not two.
template <typename T, int kChunks>
constexpr int kBwdMinBlocks = (sizeof(T) == 2 && kChunks <= 2) ? 2 : 1;

template <typename T, int kChunks, bool kDbeta>
constexpr size_t bwd_smem_bytes(int threads) {
  const size_t partials = (kDbeta ? 2 : 1) * 8 * sizeof(float), staged = 2 * sizeof(Raw8<T>);  // per chunk
  return static_cast<size_t>(threads) * kChunks * (partials + staged);
}

template <typename T, int kChunks, bool kDbeta, bool kW16>
__global__ void __launch_bounds__(kMaxThreads, kBwdMinBlocks<T, kChunks>) norm_bwd_kernel(const BwdParams p) {
  extern __shared__ float4 acc_smem[];
  __shared__ __align__(16) float red[2 * kMaxThreads / 32 * 2];
  constexpr int kQ = norm::kQuads<T>;
  const int X = blockDim.x, Y = blockDim.y, t = threadIdx.x, ty = threadIdx.y;
  const int width = X * 8 * kChunks;
  float4* const acc_g = acc_smem + ty * (width / 4);  // this row group's dgamma
  float4* const acc_b = acc_g + Y * (width / 4);       // and dbeta
  uint4* const staged_dz =
      reinterpret_cast<uint4*>(reinterpret_cast<float*>(acc_smem) + (kDbeta ? 2 : 1) * Y * width) +
      ty * kChunks * kQ * X + t;
  uint4* const staged_x = staged_dz + Y * kChunks * kQ * X;
  const int64_t cols = p.cols;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * p.rows_per_cta;
  const int64_t last = min(p.rows, first + p.rows_per_cta);
  const float n = static_cast<float>(cols);
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    float4* g4 = acc_piece(acc_g, X, t, j);
    g4[0] = g4[X] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (kDbeta) {
      float4* b4 = acc_piece(acc_b, X, t, j);
      b4[0] = b4[X] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }

  // This thread's chunks: all inside a row (every thread but a row's last few where H is not a
  // multiple of X * 8 * kChunks), then no chunk needs the column arithmetic or masks.
  const bool full = static_cast<int64_t>(((kChunks - 1) * X + t) * 8 + 8) <= cols;
  auto valid_of = [&](int j, bool live) -> int {
    return !live ? 0 : (full ? 8 : norm::chunk_valid(cols, static_cast<int64_t>(j * X + t) * 8));
  };
  const uint32_t dz_s = static_cast<uint32_t>(__cvta_generic_to_shared(staged_dz));
  const uint32_t x_s = static_cast<uint32_t>(__cvta_generic_to_shared(staged_x));
  // Stages row `row`'s dz and x (zeros where it is past the CTA's range).
  auto stage_row = [&](int64_t row) {
    const bool live = row < last;
    const int64_t at = (live ? row : 0) * cols + t * 8;  // chunk j at at + j * X * 8
    const T* xr = static_cast<const T*>(p.x) + at;
    const T* dzr = static_cast<const T*>(p.dz) + at;
    const bool x_vec = norm::aligned16(xr), dz_vec = norm::aligned16(dzr);
    if (live && full && x_vec && dz_vec) {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        norm::stage_whole_chunk(dz_s + j * kQ * X * 16, X, dzr + j * X * 8);
        norm::stage_whole_chunk(x_s + j * kQ * X * 16, X, xr + j * X * 8);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int valid = valid_of(j, live);
        norm::stage_chunk(staged_dz + j * kQ * X, dz_s + j * kQ * X * 16, X, dzr + j * X * 8, valid, dz_vec);
        norm::stage_chunk(staged_x + j * kQ * X, x_s + j * kQ * X * 16, X, xr + j * X * 8, valid, x_vec);
      }
    }
    norm::cp_async_commit();
  };
  // mu / rsigma of `row` (0 past the CTA's range).
  auto fetch_stats = [&](int64_t row, float& mu, float& rs) {
    const bool live = row < last;
    mu = live && !p.rms ? p.mu[row] : 0.0f;
    rs = live ? p.rsigma[row] : 0.0f;
  };

  stage_row(first + ty);
  float next_mu, next_rs;
  fetch_stats(first + ty, next_mu, next_rs);
  int parity = 0;
  for (int64_t r0 = first; r0 < last; r0 += Y) {
    const int64_t row = r0 + ty;
    const bool live = row < last;
    const int64_t base = (live ? row : 0) * cols;
    const RowPtrs rp = row_ptrs<T, T>(p, base);
    norm::cp_async_wait(0);
    Raw8<T> vx[kChunks], vd[kChunks];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      norm::read_chunk(vd[j], staged_dz + j * kQ * X, X);
      norm::read_chunk(vx[j], staged_x + j * kQ * X, X);
    }
    // The next row goes into the stage just read: only this thread reads its chunks, and its
    // reads precede in program order the copy it starts now (an asynchronous copy is performed
    // after the call that starts it), so the copy overlaps this whole row's work. Likewise its
    // mu and rsigma, loaded a row ahead.
    if (r0 + Y < last) stage_row(row + Y);
    const float mu = next_mu, rs = next_rs;
    if (r0 + Y < last) fetch_stats(row + Y, next_mu, next_rs);
    float sums[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int valid = valid_of(j, live);
      float g[8], pg[8], pb[8];
      norm::load8w<T, kW16>(p.gamma, j, X, t, g);
      if (valid == 8) {  // whole chunks (all but a row's last) without the masks below
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float dy = vd[j].get(k);
          const Grad d = grad_at(vx[j].get(k), dy, g[k], mu, rs);
          sums[0] = __fadd_rn(sums[0], d.dxhat);
          sums[1] = __fmaf_rn(d.dxhat, d.xhat, sums[1]);
          pg[k] = __fmul_rn(dy, d.xhat);
          pb[k] = dy;
        }
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float dy = vd[j].get(k);
          const Grad d = grad_at(vx[j].get(k), dy, g[k], mu, rs);
          const bool in = k < valid;
          sums[0] = __fadd_rn(sums[0], in ? d.dxhat : 0.0f);
          sums[1] = __fmaf_rn(in ? d.dxhat : 0.0f, d.xhat, sums[1]);
          pg[k] = in ? __fmul_rn(dy, d.xhat) : 0.0f;
          pb[k] = dy;  // 0 outside the row
        }
      }
      if (valid > 0) {
        add8(acc_piece(acc_g, X, t, j), X, pg);
        if constexpr (kDbeta) add8(acc_piece(acc_b, X, t, j), X, pb);
      }
    }
    norm::row_sum_pp(sums, red, parity);
    const DxRow k = dx_row(p.rms ? 0.0f : __fdiv_rn(sums[0], n), __fdiv_rn(sums[1], n), rs);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int64_t c = static_cast<int64_t>(j * X + t) * 8;
      float g[8];
      norm::load8w<T, kW16>(p.gamma, j, X, t, g);
      emit_dx(p, base, c, valid_of(j, live), vx[j], vd[j], g, mu, rs, k, rp.dx_vec,
              rp.add_vec);
    }
  }

  // Row groups (Y > 1) are added in group order by row group 0, which writes the CTA's partial row.
  if (Y > 1) __syncthreads();
  if (ty != 0) return;
  const bool vec = cols % 4 == 0;  // partial rows start 16-byte aligned (scratch is 256-aligned)
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t c = static_cast<int64_t>(j * X + t) * 8;
    const int valid = norm::chunk_valid(cols, c);
    if (valid == 0) continue;
    for (int half = 0; half < (kDbeta ? 2 : 1); ++half) {
      const float* lo = reinterpret_cast<const float*>(acc_piece(half == 0 ? acc_g : acc_b, X, t, j));
      const float* hi = lo + 4 * X;
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float* a = (k < 4 ? lo : hi) + k % 4;
        v[k] = a[0];
        for (int y = 1; y < Y; ++y) v[k] = __fadd_rn(v[k], a[y * width]);
      }
      float* part = half == 0 ? p.dgamma_part : p.dbeta_part;
      norm::store8(part + static_cast<int64_t>(blockIdx.x) * cols + c, v, valid, vec);
    }
  }
}

// ---- generic path ---------------------------------------------------------------------------

// dx only, the row re-read in steps of X * 8 * kIter columns (L2 on the second pass).
template <typename TX, typename TD>
__global__ void __launch_bounds__(kMaxThreads) norm_bwd_dx_kernel(const BwdParams p) {
  __shared__ float red[kMaxThreads / 32 * 2];
  const int X = blockDim.x, t = threadIdx.x;
  const int64_t cols = p.cols;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < p.rows;
  const int64_t base = (live ? row : 0) * cols;
  const RowPtrs rp = row_ptrs<TX, TD>(p, base);
  const TX* xr = static_cast<const TX*>(p.x) + base;
  const TD* dzr = static_cast<const TD*>(p.dz) + base;
  const float mu = live && !p.rms ? p.mu[row] : 0.0f;
  const float rs = live ? p.rsigma[row] : 0.0f;
  const float n = static_cast<float>(cols);
  const int64_t step = static_cast<int64_t>(X) * 8 * kIter;

  float sums[2] = {0.0f, 0.0f};
  for (int64_t c0 = 0; c0 < cols; c0 += step) {
    Raw8<TX> vx[kIter];
    Raw8<TD> vd[kIter];
#pragma unroll
    for (int j = 0; j < kIter; ++j) {
      const int64_t c = c0 + static_cast<int64_t>(j * X + t) * 8;
      const int valid = live ? norm::chunk_valid(cols, c) : 0;
      norm::load_chunk(vd[j], dzr + c, valid, rp.dz_vec);
      norm::load_chunk(vx[j], xr + c, valid, rp.x_vec);
    }
#pragma unroll
    for (int j = 0; j < kIter; ++j) {
      const int64_t c = c0 + static_cast<int64_t>(j * X + t) * 8;
      const int valid = live ? norm::chunk_valid(cols, c) : 0;
      float g[8];
      norm::load8f(p.gamma, c, valid, g);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (k < valid) {
          const Grad d = grad_at(vx[j].get(k), vd[j].get(k), g[k], mu, rs);
          sums[0] = __fadd_rn(sums[0], d.dxhat);
          sums[1] = __fmaf_rn(d.dxhat, d.xhat, sums[1]);
        }
      }
    }
  }
  norm::row_sum(sums, red);
  const DxRow k = dx_row(p.rms ? 0.0f : __fdiv_rn(sums[0], n), __fdiv_rn(sums[1], n), rs);
  for (int64_t c0 = 0; c0 < cols; c0 += step) {
    Raw8<TX> vx[kIter];
    Raw8<TD> vd[kIter];
#pragma unroll
    for (int j = 0; j < kIter; ++j) {
      const int64_t c = c0 + static_cast<int64_t>(j * X + t) * 8;
      const int valid = live ? norm::chunk_valid(cols, c) : 0;
      norm::load_chunk(vd[j], dzr + c, valid, rp.dz_vec);
      norm::load_chunk(vx[j], xr + c, valid, rp.x_vec);
    }
#pragma unroll
    for (int j = 0; j < kIter; ++j) {
      const int64_t c = c0 + static_cast<int64_t>(j * X + t) * 8;
      const int valid = live ? norm::chunk_valid(cols, c) : 0;
      float g[8];
      norm::load8f(p.gamma, c, valid, g);
      emit_dx(p, base, c, valid, vx[j], vd[j], g, mu, rs, k, rp.dx_vec, rp.add_vec);
    }
  }
}

constexpr int kColThreads = 256;  // columns per CTA of the column kernel

// Partial dgamma/dbeta of p.rows_per_cta rows x kColThreads columns, rows in order:
// part[blockIdx.y][c].
template <typename TX, typename TD>
__global__ void __launch_bounds__(kColThreads) norm_bwd_columns_kernel(const BwdParams p,
                                                                       float* dg_part,
                                                                       float* db_part) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;
  if (c >= p.cols) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * p.rows_per_cta;
  const int64_t r1 = min(p.rows, r0 + p.rows_per_cta);
  const TX* x = static_cast<const TX*>(p.x);
  const TD* dz = static_cast<const TD*>(p.dz);
  float dg = 0.0f, db = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    Raw8<TX> vx;
    Raw8<TD> vd;
    vx.load_scalar(x + r * p.cols + c, 1);
    vd.load_scalar(dz + r * p.cols + c, 1);
    const float rs = p.rsigma[r];
    const float xhat = __fmul_rn(__fsub_rn(vx.get(0), p.rms ? 0.0f : p.mu[r]), rs);
    dg = __fmaf_rn(vd.get(0), xhat, dg);
    db = __fadd_rn(db, vd.get(0));
  }
  dg_part[blockIdx.y * p.cols + c] = dg;
  if (db_part != nullptr) db_part[blockIdx.y * p.cols + c] = db;
}

// ---- the final reduction --------------------------------------------------------------------

constexpr int kRedCols = 32, kRedGroups = 8;

// out[c] = sum over j of part[j][c] (blockIdx.y 0: dgamma, 1: dbeta): group g of 8 adds the
// partial rows j = g, g + 8, ... in order, then the groups are added in order.
__global__ void __launch_bounds__(kRedCols* kRedGroups)
    reduce_partials_kernel(const float* dg_part, const float* db_part, int64_t parts, int64_t cols,
                           void* dgamma, int32_t dgamma_dtype, void* dbeta, int32_t dbeta_dtype) {
  __shared__ float acc[kRedGroups][kRedCols];
  const float* part = blockIdx.y == 0 ? dg_part : db_part;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kRedCols + tx;
  float a = 0.0f;
  if (c < cols) {
    for (int64_t j = ty; j < parts; j += kRedGroups) a = __fadd_rn(a, part[j * cols + c]);
  }
  acc[ty][tx] = a;
  __syncthreads();
  if (ty != 0 || c >= cols) return;
  for (int g = 1; g < kRedGroups; ++g) a = __fadd_rn(a, acc[g][tx]);
  if (blockIdx.y == 0) {
    norm::store1(dgamma, dgamma_dtype, c, a);
  } else {
    norm::store1(dbeta, dbeta_dtype, c, a);
  }
}

void reduce_partials(const NormBwdArgs& a, const float* dg_part, const float* db_part,
                     int64_t parts, cudaStream_t stream) {
  const int64_t blocks = ceil_div(a.cols, kRedCols);
  if (blocks > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "reduce_partials_kernel: H too large");
  reduce_partials_kernel<<<dim3(static_cast<unsigned>(blocks), db_part != nullptr ? 2 : 1),
                           dim3(kRedCols, kRedGroups), 0, stream>>>(
      dg_part, db_part, parts, a.cols, a.dgamma, a.dgamma_dtype, a.dbeta, a.dbeta_dtype);
  check_launch("reduce_partials_kernel");
}

// The fused path's layout: the fewest chunks (1, 2, 4) with at most 512 threads per row, but at
// most 256 for 16-bit rows below 2 chunks (LayerNorm) or 4 (RMSNorm). Measured on the H200
// (16384 rows, bf16) against 512 throughout: H 4096 (1 -> 2 chunks) LayerNorm 0.49 -> 0.55 of
// copy, RMSNorm 0.60 -> 0.71; H 8192 (2 -> 4) RMSNorm 0.72 -> 0.75, LayerNorm 0.57 -> 0.54 (its
// dbeta partials take more shared memory: 2 CTAs of 4 chunks per SM against RMSNorm's 3), so
// LayerNorm keeps 2. At most 128 threads (H 4096: 4 chunks) lost LayerNorm's gain and added
// nothing to RMSNorm's. Re-measured with conflict-free partial sums and weights in pieces
// (eleventh session): LayerNorm at H 8192, 2 chunks 0.71, 4 chunks 0.67-0.68.
template <typename T>
norm::RowLayout fused_layout(int64_t cols, bool dbeta) {
  const int narrow_chunks = sizeof(T) == 2 ? (dbeta ? 2 : 4) : 1;
  return norm::choose_layout(
      cols, [&](int k) { return k == 8 ? 0 : (k < narrow_chunks ? 256 : kMaxThreads); }, kMaxThreads);
}

// False, launching nothing, where a CTA's partial sums and staged row do not fit the device's
// shared memory (fp32 LayerNorm rows of 4 chunks on any device; 16-bit ones of 4 chunks on
// sm_80/89/120, fp32 ones of 2 on sm_89/120): the generic path then does the work.
template <typename T, int kChunks, bool kDbeta, bool kW16>
bool launch_fused_w(const NormBwdArgs& a, BwdParams p, const norm::RowLayout& layout,
                    norm::WeightPieces pieces, cudaStream_t stream) {
  constexpr auto kKernel = norm_bwd_kernel<T, kChunks, kDbeta, kW16>;
  const int threads = layout.threads * layout.rows;
  const size_t smem = bwd_smem_bytes<T, kChunks, kDbeta>(threads);
  if (smem > norm::max_dynamic_smem<kKernel>()) return false;
  norm::allow_dynamic_smem<kKernel>(smem);
  const norm::Fp32Weights w(a.gamma, a.gamma_dtype, nullptr, TE_DTYPE_FLOAT32, a.zero_centered_gamma, a.cols,
                            pieces, stream);
  p.gamma = w.gamma();
  // One wave of CTAs, each over a contiguous range of rows: as few partial rows as keep every SM
  // busy.
  const int64_t groups = ceil_div(a.rows, layout.rows);
  int64_t ctas = norm::resident_ctas<kKernel>(threads, smem);
  if (ctas > groups) ctas = groups;
  p.rows_per_cta = ceil_div(a.rows, ctas);
  ctas = ceil_div(a.rows, p.rows_per_cta);
  Scratch part(sizeof(float) * static_cast<size_t>(ctas * a.cols) * (kDbeta ? 2 : 1), stream, "norm scratch");
  p.dgamma_part = part.as<float>();
  p.dbeta_part = kDbeta ? part.as<float>() + ctas * a.cols : nullptr;
  kKernel<<<static_cast<unsigned>(ctas), dim3(layout.threads, layout.rows), smem, stream>>>(p);
  check_launch("norm_bwd_kernel");
  reduce_partials(a, p.dgamma_part, p.dbeta_part, ctas, stream);
  return true;
}

// gamma in x's own 16-bit dtype where norm::weight_as_is_16 allows (the kernel loads it twice per
// row), else fp32 pieces.
template <typename T, int kChunks, bool kDbeta>
bool launch_fused(const NormBwdArgs& a, const BwdParams& p, const norm::RowLayout& layout,
                  cudaStream_t stream) {
  const int64_t width = static_cast<int64_t>(layout.threads) * 8 * kChunks;
  if constexpr (sizeof(T) == 2) {
    if (norm::weight_as_is_16(a.x_dtype, a.gamma_dtype, a.zero_centered_gamma))
      return launch_fused_w<T, kChunks, kDbeta, true>(a, p, layout, {layout.threads, width, false, a.x_dtype},
                                                      stream);
  }
  return launch_fused_w<T, kChunks, kDbeta, false>(a, p, layout, {layout.threads, width}, stream);
}

template <typename T>
bool fused_bwd(const NormBwdArgs& a, const BwdParams& p, cudaStream_t stream) {
  const norm::RowLayout layout = fused_layout<T>(a.cols, a.dbeta != nullptr);
  if (layout.chunks == 0) return false;
  bool done = false;
  norm::dispatch_chunks(layout.chunks, [&](auto chunks) {
    constexpr int kChunks = decltype(chunks)::value;
    if constexpr (kChunks > 0 && kChunks < 8) {
      done = a.dbeta != nullptr ? launch_fused<T, kChunks, true>(a, p, layout, stream)
                                : launch_fused<T, kChunks, false>(a, p, layout, stream);
    }
  });
  return done;
}

template <typename TX, typename TD>
void generic_bwd(const NormBwdArgs& a, BwdParams p, cudaStream_t stream) {
  const norm::Fp32Weights w(a.gamma, a.gamma_dtype, nullptr, TE_DTYPE_FLOAT32, a.zero_centered_gamma, a.cols,
                            {}, stream);
  p.gamma = w.gamma();
  const norm::RowLayout layout = norm::choose_layout(a.cols, [](int) { return 0; }, kMaxThreads);
  const int64_t grid = ceil_div(a.rows, layout.rows);
  if (grid > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "norm_bwd_dx_kernel: too many rows");
  norm_bwd_dx_kernel<TX, TD>
      <<<static_cast<unsigned>(grid), dim3(layout.threads, layout.rows), 0, stream>>>(p);
  check_launch("norm_bwd_dx_kernel");

  // 256 rows per partial row, more where the grid's y dimension (65535) would overflow.
  p.rows_per_cta = ceil_div(a.rows, 65535) > 256 ? ceil_div(a.rows, 65535) : 256;
  const int64_t parts = ceil_div(a.rows, p.rows_per_cta), col_blocks = ceil_div(a.cols, kColThreads);
  if (col_blocks > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "norm_bwd_columns_kernel: H too large");
  const bool dbeta = a.dbeta != nullptr;
  Scratch part(sizeof(float) * static_cast<size_t>(parts * a.cols) * (dbeta ? 2 : 1), stream, "norm scratch");
  float* dg_part = part.as<float>();
  float* db_part = dbeta ? dg_part + parts * a.cols : nullptr;
  norm_bwd_columns_kernel<TX, TD>
      <<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(parts)), kColThreads, 0,
         stream>>>(p, dg_part, db_part);
  check_launch("norm_bwd_columns_kernel");
  reduce_partials(a, dg_part, db_part, parts, stream);
}

}  // namespace

void norm_bwd(const NormBwdArgs& a, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  if (a.rows == 0) {
    // Sums over no rows: +0 in every dtype is all-zero bits.
    const size_t gsize = a.dgamma_dtype == TE_DTYPE_FLOAT32 ? 4 : 2;
    check_cuda(cudaMemsetAsync(a.dgamma, 0, gsize * static_cast<size_t>(a.cols), stream),
               "norm_bwd: cudaMemsetAsync(dgamma)");
    if (a.dbeta != nullptr) {
      const size_t bsize = a.dbeta_dtype == TE_DTYPE_FLOAT32 ? 4 : 2;
      check_cuda(cudaMemsetAsync(a.dbeta, 0, bsize * static_cast<size_t>(a.cols), stream),
                 "norm_bwd: cudaMemsetAsync(dbeta)");
    }
    return;
  }
  BwdParams p{};
  p.dz = a.dz;
  p.x = a.x;
  p.rows = a.rows;
  p.cols = a.cols;
  p.mu = a.rms ? nullptr : a.mu;
  p.rsigma = a.rsigma;
  p.rms = a.rms;
  p.add = a.add;
  p.add_dtype = a.add_dtype;
  p.dx = a.dx;
  p.dx_dtype = a.dx_dtype;

  bool done = false;
  if (a.dz_dtype == a.x_dtype) {
    dispatch_source(a.x_dtype, [&](auto tag) { done = fused_bwd<decltype(tag)>(a, p, stream); });
  }
  if (done) return;
  dispatch_source(a.x_dtype, [&](auto x_tag) {
    dispatch_source(a.dz_dtype, [&](auto dz_tag) {
      generic_bwd<decltype(x_tag), decltype(dz_tag)>(a, p, stream);
    });
  });
}

}  // namespace cuda
}  // namespace te
