// How a CUDA fused op (activation forward/backward, dbias + quantize) writes the fp32 result it
// computes elementwise: rounded into a high-precision buffer, or quantized by exactly the rules of
// quantize_per_tensor / quantize_block (the CPU twin is cpu/fused_output.h), optionally with the
// column sums of the result for a bias gradient.
//
// The op supplies a loader (cast_tile.cuh describes the interface) that loads its inputs for 8
// consecutive result elements and computes them. Plans, by output:
//   high precision, or per-tensor DELAYED FP8 row-wise only: one pass, flat_kernel (a grid-stride
//     loop over 8-element units, 16-byte loads where aligned, the amax of the fp32 result with one
//     atomic per CTA).
//   per-tensor CURRENT scaling: pass 1 is amax_kernel computing only the amax (nothing written),
//     pass 2 recomputes and quantizes with the scale derived from that amax on the device (no host
//     synchronisation), walking the tensor last-first so the tail pass 1 read last is still in L2.
//   a column-wise copy, 1x128 blocks, or a bias gradient: the 128x128 tile kernel of
//     cast_tile.cuh with the op's loader, so one read gives both copies and the column sums.
//   128x128 blocks (a weight's recipe, rare here): the result through an fp32 scratch, then the
//     plain input's tile plan (see write()).
// The quantized bytes, scales and amax equal te_quantize of the op's fp32 result bit for bit: the
// same values reach the same per-element conversion (quantize8) and the same scale rules.
// Bias gradients: the tile kernel writes each 128-row tile row's column sums to an fp32 scratch
// (stream-ordered allocation), and a second kernel adds those partials in row order, so the result
// is the same bits on every run, then rounds it once to the bias dtype.
#pragma once

#include <initializer_list>
#include <type_traits>

#include "common/kernels.h"
#include "cuda/amax.cuh"
#include "cuda/cast_tile.cuh"
#include "cuda/cuda_utils.cuh"
#include "cuda/scratch.cuh"

namespace te {
namespace cuda {
namespace fused {

// ---------------------------------------------------------------------------------------------
// 8 source elements of a dtype known only at run time. Fused ops take each input's dtype at run
// time so their kernels are instantiated per activation, output mode and width only; the dtype
// branch is uniform and taken once per 8 elements. kNarrow: the source is fp16/bf16 (4 packed
// words); else any of fp32/fp16/bf16 in fp32-sized storage (8 words). The narrow form exists for
// registers: a loader holds several of these per thread, and sized for fp32 they capped the
// 16-bit kernels' resident CTAs and the loads each thread could keep in flight.
template <bool kNarrow>
struct Src8 {
  static constexpr int kWords = kNarrow ? 4 : 8;
  uint32_t w[kWords];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0;
  }

  // Elements base[i..i+7], 16-byte aligned.
  __device__ __forceinline__ void load_vec(const void* base, int64_t i, int32_t dtype) {
    if (!kNarrow && dtype == TE_DTYPE_FLOAT32) {
      Raw8<float> r;
      r.load_vec(static_cast<const float*>(base) + i);
#pragma unroll
      for (int k = 0; k < kWords; ++k) w[k] = r.w[k];
    } else {
      zero();
      Raw8<__half> r;  // fp16 and bf16 load alike: 16-bit words
      r.load_vec(static_cast<const __half*>(base) + i);
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = r.w[k];
    }
  }

  // Elements base[i..i+valid), element-aligned; the rest are +0.
  __device__ __forceinline__ void load_scalar(const void* base, int64_t i, int32_t dtype,
                                              int valid) {
    zero();
    if (!kNarrow && dtype == TE_DTYPE_FLOAT32) {
      Raw8<float> r;
      r.load_scalar(static_cast<const float*>(base) + i, valid);
#pragma unroll
      for (int k = 0; k < kWords; ++k) w[k] = r.w[k];
    } else {
      Raw8<__half> r;
      r.load_scalar(static_cast<const __half*>(base) + i, valid);
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = r.w[k];
    }
  }

  // Element k from base[i]; the vector must have been zeroed.
  __device__ __forceinline__ void load_one(int k, const void* base, int64_t i, int32_t dtype) {
    if (!kNarrow && dtype == TE_DTYPE_FLOAT32) {
      w[k % kWords] = __ldg(static_cast<const uint32_t*>(base) + i);
    } else {
      w[k / 2] |= static_cast<uint32_t>(__ldg(static_cast<const unsigned short*>(base) + i))
                  << (16 * (k & 1));
    }
  }

  // The 8 elements widened to fp32 (exact).
  __device__ __forceinline__ void decode(int32_t dtype, float (&v)[8]) const {
    if (!kNarrow && dtype == TE_DTYPE_FLOAT32) {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __uint_as_float(w[k % kWords]);
    } else if (dtype == TE_DTYPE_BFLOAT16) {
      Raw8<__nv_bfloat16> r;
#pragma unroll
      for (int k = 0; k < 4; ++k) r.w[k] = w[k];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = r.get(k);
    } else {
      Raw8<__half> r;
#pragma unroll
      for (int k = 0; k < 4; ++k) r.w[k] = w[k];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = r.get(k);
    }
  }
};

// Calls f(std::bool_constant<narrow>{}), narrow: every dtype in `dtypes` is fp16/bf16 (Src8's
// kNarrow).
template <typename F>
inline void with_width(std::initializer_list<int32_t> dtypes, F&& f) {
  bool narrow = true;
  for (const int32_t d : dtypes) narrow = narrow && d != TE_DTYPE_FLOAT32;
  if (narrow) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// Size in bytes of a fp32/fp16/bf16 element.
inline int64_t source_bytes(int32_t dtype) { return dtype == TE_DTYPE_FLOAT32 ? 4 : 2; }

// ---------------------------------------------------------------------------------------------
// The flat pass.

constexpr int kFlatThreads = 256;
constexpr int kUnitsPerThread = 4;
constexpr int64_t kUnitsPerStep = static_cast<int64_t>(kFlatThreads) * kUnitsPerThread;

struct FlatParams {
  int64_t rows, cols;
  int64_t units_per_row;  // ceil(cols / 8)
  int64_t units;          // rows * units_per_row
  bool narrow;            // units < 2^32: 32-bit index arithmetic
  int32_t out_dtype;      // fp32/fp16/bf16 (rounded) or FP8 (quantized per tensor)
  void* out;              // [rows, cols]
  bool vec_out;           // full units stored whole (FP8: 8 bytes, else 16/32 bytes)
  // FP8, as quantize_per_tensor's row-wise cast: delayed reads *scale; current derives the scale
  // from *amax_in; amax_out (max-accumulated) may be set in either kind of pass.
  const float* scale;
  const float* amax_in;
  float* amax_out;
  float* scale_out;
  float* rowwise_scale_inv;
  float* columnwise_scale_inv;
  bool current, reverse, pow2;
  float eps;
};

// L::kStreamMinBlocks CTAs per SM (3-4): the computed sources spend 40-60 instructions per
// element, and at two CTAs per SM (the old 128-register cap) ncu showed half the issue slots idle
// waiting on loads; uncapped, the backward kernels take 150+ registers and get one.
template <typename L>
__global__ void __launch_bounds__(kFlatThreads, L::kStreamMinBlocks) flat_kernel(const FlatParams p, const L ld) {
  static_assert(std::is_same_v<typename L::Value, float>, "flat_kernel: computed fp32 sources");
  __shared__ uint32_t scratch[kFlatThreads / 32];
  const int tid = threadIdx.x;
  const bool fp8 = p.out_dtype == TE_DTYPE_FLOAT8_E4M3 || p.out_dtype == TE_DTYPE_FLOAT8_E5M2;
  float s = 1.0f;
  if (fp8) {
    s = p.current ? compute_scale_from_amax(*p.amax_in, fp8_max(p.out_dtype), p.pow2, p.eps)
                  : *p.scale;
    if (blockIdx.x == 0 && tid == 0) {
      const float s_inv = 1.0f / s;
      if (p.current && p.scale_out != nullptr) *p.scale_out = s;
      if (p.rowwise_scale_inv != nullptr) *p.rowwise_scale_inv = s_inv;
      if (p.columnwise_scale_inv != nullptr) *p.columnwise_scale_inv = s_inv;
    }
  }
  uint32_t m = 0;
  const int64_t steps = ceil_div(p.units, kUnitsPerStep);
  // Units loaded before any is finished: the loader's register budget (its tile batch), at most
  // the step (more units per thread spill: each holds its 64-bit row and column).
  constexpr int kBatch = 2 * L::kBatchRows < kUnitsPerThread ? 2 * L::kBatchRows : kUnitsPerThread;
  static_assert(kUnitsPerThread % kBatch == 0, "flat_kernel: batch must divide the step");
  for (int64_t step = blockIdx.x; step < steps; step += gridDim.x) {
    const int64_t base = (p.reverse ? steps - 1 - step : step) * kUnitsPerStep + tid;
#pragma unroll
    for (int j0 = 0; j0 < kUnitsPerThread; j0 += kBatch) {
      typename L::Raw raw[kBatch];
      int64_t row[kBatch], col[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t u = base + (j0 + j) * kFlatThreads;
        if (p.narrow) {
          const uint32_t uu = static_cast<uint32_t>(u), upr = static_cast<uint32_t>(p.units_per_row);
          row[j] = uu / upr;
          col[j] = 8 * static_cast<int64_t>(uu - static_cast<uint32_t>(row[j]) * upr);
        } else {
          row[j] = u / p.units_per_row;
          col[j] = 8 * (u - row[j] * p.units_per_row);
        }
        if (u < p.units) ld.load(raw[j], row[j], col[j]);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (base + (j0 + j) * kFlatThreads >= p.units) continue;
        Raw8<float> x;
        ld.finish(raw[j], col[j], x);
        if (p.amax_out != nullptr) {
#pragma unroll
          for (int k = 0; k < 8; ++k) m = max(m, abs_bits(x.get(k)));
        }
        const int64_t idx = row[j] * p.cols + col[j];
        const int64_t valid = p.cols - col[j];
        if (p.out_dtype == TE_DTYPE_FLOAT8_E4M3) {
          tile::store_row8(static_cast<uint8_t*>(p.out) + idx,
                           quantize8<TE_DTYPE_FLOAT8_E4M3>(x, s), valid, p.vec_out);
        } else if (p.out_dtype == TE_DTYPE_FLOAT8_E5M2) {
          tile::store_row8(static_cast<uint8_t*>(p.out) + idx,
                           quantize8<TE_DTYPE_FLOAT8_E5M2>(x, s), valid, p.vec_out);
        } else {
          float v[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) v[k] = x.get(k);
          store8_rounded(p.out, idx, v, p.out_dtype, static_cast<int>(valid < 8 ? valid : 8),
                         p.vec_out && valid >= 8);
        }
      }
    }
  }
  if (p.amax_out != nullptr) {
    m = block_max<kFlatThreads>(m, scratch);
    if (tid == 0) atomic_max_amax(p.amax_out, m);  // fp32 results: no canonical NaN to apply
  }
}

template <typename L>
void launch_flat(FlatParams p, const L& ld, cudaStream_t stream) {
  p.units_per_row = ceil_div(p.cols, 8);
  p.units = p.rows * p.units_per_row;
  p.narrow = p.units < (int64_t{1} << 32);
  const bool fp8 = p.out_dtype == TE_DTYPE_FLOAT8_E4M3 || p.out_dtype == TE_DTYPE_FLOAT8_E5M2;
  p.vec_out = p.out != nullptr && p.cols % 8 == 0 && aligned(p.out, fp8 ? 8 : 16);
  // One step per block, as quantize_per_tensor's cast: blocks that finish early take new steps.
  int64_t blocks = ceil_div(p.units, kUnitsPerStep);
  if (blocks > 0x7fffffffLL) blocks = 0x7fffffffLL;
  if (blocks < 1) blocks = 1;
  flat_kernel<L><<<static_cast<unsigned>(blocks), kFlatThreads, 0, stream>>>(p, ld);
  check_launch("flat_kernel");
}

// Current scaling's amax pass over a computed source: max |result|, nothing written. It was
// flat_kernel storing nothing, whose one-step-per-CTA walk waits on each batch of loads before its
// math and divides per unit. Here one wave of CTAs walks the units grid-stride, each thread
// loading its next batch before computing the current one, with the row and column advanced by
// additions (the stride's row and column steps are fixed). Measured on the H200 (16384 x 16384
// GELU / dGELU): 0.321 -> 0.302 ms and 0.506 -> 0.464 ms. The activation's instructions, not the
// loads, bound both (ncu: issue slots 71% busy; NOTES.md).
template <typename L>
__global__ void __launch_bounds__(kFlatThreads, L::kStreamMinBlocks) amax_kernel(const FlatParams p, const L ld) {
  static_assert(std::is_same_v<typename L::Value, float>, "amax_kernel: computed fp32 sources");
  // Units per batch, two batches in flight: half the loader's tile batch (the whole one spills).
  constexpr int kB = L::kBatchRows > 1 ? L::kBatchRows / 2 : 1;
  __shared__ uint32_t scratch[kFlatThreads / 32];
  const int64_t upr = p.units_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kFlatThreads;
  const int64_t cols8 = 8 * upr, drow = stride / upr, dcol = 8 * (stride % upr);
  const int64_t u = static_cast<int64_t>(blockIdx.x) * kFlatThreads + threadIdx.x;
  int64_t row = u / upr, col = 8 * (u % upr);  // the next unit to load
  const auto advance = [&](int64_t& r, int64_t& c) {
    c += dcol;
    r += drow;
    if (c >= cols8) {
      c -= cols8;
      ++r;
    }
  };
  typename L::Raw raw[2][kB];
  int64_t r0[2], c0[2];  // each batch's first unit
  const auto load = [&](int b) {
    r0[b] = row;
    c0[b] = col;
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      if (row < p.rows) ld.load(raw[b][j], row, col);
      advance(row, col);
    }
  };
  uint32_t m = 0;
  const auto reduce = [&](int b) {
    int64_t r = r0[b], c = c0[b];
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      if (r < p.rows) {
        Raw8<float> x;
        ld.finish(raw[b][j], c, x);
#pragma unroll
        for (int k = 0; k < 8; ++k) m = max(m, abs_bits(x.get(k)));
      }
      advance(r, c);
    }
  };
  load(0);
  while (r0[0] < p.rows) {
    load(1);
    reduce(0);
    if (r0[1] >= p.rows) break;
    load(0);
    reduce(1);
  }
  m = block_max<kFlatThreads>(m, scratch);
  if (threadIdx.x == 0) atomic_max_amax(p.amax_out, m);  // fp32 results: no canonical NaN to apply
}

// ---------------------------------------------------------------------------------------------
// Bias gradients.


// out[c] = sum over chunks i, first to last, of partial[i * cols + c], rounded once to dtype
// (fp32/fp16/bf16).
void sum_column_partials(const float* partial, int64_t chunks, int64_t cols, void* out,
                         int32_t dtype, cudaStream_t stream);

// A bias gradient to produce: data [cols] or nullptr, dtype fp32/fp16/bf16.
struct Dbias {
  void* data;
  int32_t dtype;
};

// An empty result: no element to read, but the bias is zero and a per-tensor output's scales are
// written exactly as te_quantize writes them for an empty tensor.
void write_empty(const FusedOutput& out, int64_t cols, Dbias dbias, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// The plan of the file comment.

// The flat pass that writes `out` (high precision, or per-tensor FP8 row-wise only).
inline FlatParams flat_params(const FusedOutput& out, int64_t rows, int64_t cols, bool reverse) {
  FlatParams f{};
  f.rows = rows;
  f.cols = cols;
  if (out.kind == kFusedHighPrecision) {
    f.out_dtype = out.dtype;
    f.out = out.data;
    return f;
  }
  const PerTensorQuantizeArgs& a = out.per_tensor;
  f.out_dtype = a.out_dtype;
  f.out = a.rowwise;
  f.scale = a.scale;
  f.amax_in = a.amax;
  f.amax_out = a.current ? nullptr : a.amax;
  f.scale_out = a.scale;
  f.rowwise_scale_inv = a.rowwise_scale_inv;
  f.columnwise_scale_inv = a.columnwise_scale_inv;
  f.current = a.current;
  f.reverse = reverse;
  f.pow2 = a.force_pow2_scales;
  f.eps = a.amax_epsilon;
  return f;
}

// Current scaling's first pass: *amax = max |result|. A plain input's amax is te_quantize's own
// pass over it (amax.cu), which also canonicalises fp16/bf16 NaNs as te_quantize does.
template <bool kComputed, typename L>
void amax_pass(const PerTensorQuantizeArgs& a, const L& ld, int64_t rows, int64_t cols,
               cudaStream_t stream) {
  if constexpr (kComputed) {
    check_cuda(cudaMemsetAsync(a.amax, 0, sizeof(float), stream), "fused amax: cudaMemsetAsync");
    FlatParams f{};
    f.rows = rows;
    f.cols = cols;
    f.amax_out = a.amax;
    f.units_per_row = ceil_div(cols, 8);
    f.units = rows * f.units_per_row;
    static const int per_sm = blocks_per_sm(amax_kernel<L>, kFlatThreads, 1);
    const int64_t resident = static_cast<int64_t>(sm_count()) * per_sm;
    int64_t blocks = ceil_div(f.units, kFlatThreads);
    if (blocks > resident) blocks = resident;
    amax_kernel<L><<<static_cast<unsigned>(blocks), kFlatThreads, 0, stream>>>(f, ld);
    check_launch("amax_kernel");
  } else {
    amax_into_zeroed(ld.in, a.in_dtype, rows * cols, a.amax, stream);
  }
}

// A plain input's quantization (+ bias sums) as one cooperative tile launch, with current
// scaling's amax and the bias gradient's final sum inside it (cast_tile.cuh, kCoop): false when
// the tiles do not all fit on the GPU at once (nothing launched).
template <typename L>
bool write_coop(const FusedOutput& out, const L& ld, int64_t rows, int64_t cols, Dbias dbias,
                cudaStream_t stream) {
  const bool per_tensor = out.kind == kFusedPerTensor;
  tile::Params p = per_tensor ? tile::per_tensor_params(out.per_tensor, false) : tile::block_params(out.block);
  const int mode = per_tensor ? tile::kPerTensor : out.block.block_dim == 2 ? tile::kBlock2D : tile::kBlock1D;
  if (per_tensor && out.per_tensor.current && !out.per_tensor.use_existing_amax) {
    p.grid_amax = true;
    p.amax_acc = out.per_tensor.amax;
  }
  const int64_t chunks = ceil_div(rows, tile::kTile);
  Scratch partials(dbias.data != nullptr ? static_cast<size_t>(chunks * cols) * 4 : 0, stream,
                   "fused-op scratch (bias-gradient partials)");
  if (dbias.data != nullptr) {
    p.dbias_partial = partials.as<float>();
    p.dbias_out = dbias.data;
    p.dbias_dtype = dbias.dtype;
    p.dbias_chunks = chunks;
  }
  const int32_t in_dtype = per_tensor ? out.per_tensor.in_dtype : out.block.in_dtype;
  const int32_t out_dtype = per_tensor ? out.per_tensor.out_dtype : out.block.out_dtype;
  return tile::launch_input_coop(mode, p, ld.in, in_dtype, out_dtype, stream);
}

// Result [rows, cols] from loader `ld` into `out`, with the column sums into `dbias`. A loader
// that reads a plain input (InputLoader: te_dbias_quantize) is only used with an FP8 output and a
// bias, both of which take the tile kernel. kMayHaveDbias false (an op without a bias gradient)
// leaves out the high-precision tile kernel, which only a bias gradient needs.
template <bool kMayHaveDbias, typename L>
void write(const FusedOutput& out, const L& ld, int64_t rows, int64_t cols, Dbias dbias,
           cudaStream_t stream) {
  if (rows == 0 || cols == 0) {
    write_empty(out, cols, dbias, stream);
    return;
  }
  constexpr bool kComputed = !std::is_same_v<L, tile::InputLoader<typename L::Value>>;
  if constexpr (!kComputed) {
    if (out.kind != kFusedHighPrecision && write_coop(out, ld, rows, cols, dbias, stream)) return;
  }
  const bool per_tensor = out.kind == kFusedPerTensor;
  const bool tiles = dbias.data != nullptr || out.kind == kFusedBlock ||
                     (per_tensor && out.per_tensor.columnwise != nullptr);
  bool reverse = false;
  if (per_tensor && out.per_tensor.current && !out.per_tensor.use_existing_amax) {
    amax_pass<kComputed>(out.per_tensor, ld, rows, cols, stream);
    reverse = true;  // pass 2 starts where pass 1 ended, on what L2 still holds
  }

  if constexpr (kComputed) {
    if (!tiles) {
      launch_flat(flat_params(out, rows, cols, reverse), ld, stream);
      return;
    }
    if (out.kind == kFusedBlock && out.block.block_dim == 2) {
      // 128x128 blocks are the weights' recipe, not an activation's, so rather than compile one
      // more tile kernel per activation, the result goes through an fp32 scratch and the plain
      // plan (te_quantize's kernels, plus the bias): 8 more bytes of traffic per element.
      Scratch y(static_cast<size_t>(rows * cols) * 4, stream, "fused-op scratch (fp32 result)");
      FusedOutput fp32{};
      fp32.kind = kFusedHighPrecision;
      fp32.data = y.as<float>();
      fp32.dtype = TE_DTYPE_FLOAT32;
      launch_flat(flat_params(fp32, rows, cols, false), ld, stream);
      FusedOutput plain = out;
      plain.block.input = y.as<float>();
      plain.block.in_dtype = TE_DTYPE_FLOAT32;
      tile::InputLoader<float> from_y{};
      from_y.in = y.as<float>();
      from_y.cols = cols;
      write<kMayHaveDbias>(plain, from_y, rows, cols, dbias, stream);
      return;
    }
  } else {
    if (!tiles) fail(TE_ERROR_INTERNAL, "fused::write: a plain input needs an FP8 output and a bias");
  }

  const int64_t chunks = ceil_div(rows, tile::kTile);
  Scratch partials(dbias.data != nullptr ? static_cast<size_t>(chunks * cols) * 4 : 0, stream,
                   "fused-op scratch (bias-gradient partials)");
  tile::Params p{};
  int mode = tile::kHighPrecision;
  int32_t out_dtype = out.dtype;
  if (per_tensor) {
    p = tile::per_tensor_params(out.per_tensor, reverse);
    mode = tile::kPerTensor;
    out_dtype = out.per_tensor.out_dtype;
  } else if (out.kind == kFusedBlock) {
    p = tile::block_params(out.block);
    mode = out.block.block_dim == 2 ? tile::kBlock2D : tile::kBlock1D;
    out_dtype = out.block.out_dtype;
  } else {
    p.rows = rows;
    p.cols = cols;
    p.rowwise = static_cast<uint8_t*>(out.data);
  }
  p.dbias_partial = partials.as<float>();
  if constexpr (kComputed) {
    if (mode == tile::kPerTensor) {
      tile::launch_loader<tile::kPerTensor, kMayHaveDbias>(p, ld, out_dtype, stream);
    } else if (mode == tile::kBlock1D) {
      tile::launch_loader<tile::kBlock1D, kMayHaveDbias>(p, ld, out_dtype, stream);
    } else if constexpr (kMayHaveDbias) {
      tile::launch_loader<tile::kHighPrecision, kMayHaveDbias>(p, ld, out_dtype, stream);
    }
  } else {
    // The plain-input kernels are compiled once, in cast_tile.cu.
    const int32_t in_dtype = per_tensor ? out.per_tensor.in_dtype : out.block.in_dtype;
    tile::launch_input(mode, p, ld.in, in_dtype, out_dtype, stream);
  }
  if (dbias.data != nullptr) {
    sum_column_partials(partials.as<float>(), chunks, cols, dbias.data, dbias.dtype, stream);
  }
}

}  // namespace fused
}  // namespace cuda
}  // namespace te
