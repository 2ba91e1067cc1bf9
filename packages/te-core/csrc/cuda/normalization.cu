// LayerNorm / RMSNorm forward (te/normalization.h has the contract; csrc/cpu/normalization.cpp is
// the reference). fp32 math: LayerNorm's two passes (mean, then the centered squares) over the
// row, rsigma = 1 / sqrt(var + eps) with both operations correctly rounded, and
// y = ((x - mu) * rsigma) * g + beta with explicit round-to-nearest operations, so nothing is
// contracted into a fused multiply-add and y is the CPU's formula; only the sums run in another
// (fixed) order, so mu, rsigma and y agree with the CPU to fp32 rounding.
//
// One row kernel (norm_row.cuh's layout) holds the row in registers (1-8 chunks of 8 elements per
// thread), or re-reads it from L2 in steps when H is too long, and writes y directly where the
// scale is known inside the row:
//   high precision (fp32/fp16/bf16)            one pass
//   per-tensor FP8, delayed scaling            one pass; amax of y, one atomic per CTA
//   per-tensor FP8, current scaling            pass 1: stats + amax of y (no output); pass 2:
//                                              y again from x, mu, rsigma, quantized with the
//                                              scale derived from that amax on the device
//   per-tensor, existing amax                  one pass, scale from the given amax
//   1x128 blocks, row-wise only                one pass; a block is 16 lanes of one warp
// A per-tensor column-wise copy is te::cuda::transpose of the row-wise bytes (same scale, so the
// bytes are exactly te_quantize's); with only the column-wise copy asked for, the row-wise bytes go
// to scratch. Block modes with a column-wise copy, and 128x128 blocks, need amaxes across rows:
// they write fp32 y to scratch and run te::cuda::quantize_block on it. That fallback is correct
// by construction but slower (8 more bytes per element written and read back).
// The per-tensor and block arithmetic (quantize8, compute_scale_from_amax, 1 / scale, amax bits)
// is the quantize kernels' own, so the FP8 output is bit-identical to te_quantize of the fp32 y.
#include "common/kernels.h"
#include "cuda/cast_tile.cuh"
#include "cuda/cuda_utils.cuh"
#include "cuda/norm_row.cuh"

namespace te {
namespace cuda {
namespace {

using norm::kIter;
using norm::kMaxThreads;

enum OutKind : int { kOutHigh = 0, kOutPerTensor = 1, kOutBlock1D = 2 };

struct FwdParams {
  const void* x;  // [rows, cols]
  int64_t rows, cols;
  const void* gamma;  // [cols]
  int32_t gamma_dtype;
  const void* beta;  // [cols] or nullptr
  int32_t beta_dtype;
  bool gb_vec;  // gamma and beta 16-byte aligned
  float eps;
  bool rms, zero_centered;
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
};

// sq + the sum of (x - mu)^2 over the chunk's `valid` elements (mu is +0 for RMSNorm, and x - 0
// is x bit for bit). Whole chunks, all but the last of a row, skip the per-element masks.
template <typename T>
__device__ __forceinline__ float add_squares(float sq, const Raw8<T>& v, float mu, int valid) {
  if (valid == 8) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float d = __fsub_rn(v.get(k), mu);
      sq = __fmaf_rn(d, d, sq);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float d = __fsub_rn(v.get(k), mu);
      if (k < valid) sq = __fmaf_rn(d, d, sq);
    }
  }
  return sq;
}

template <typename T, int kOut, int kFmt, int kChunks>
__global__ void __launch_bounds__(kMaxThreads) norm_fwd_kernel(const FwdParams p) {
  __shared__ float red[kMaxThreads / 32];
  __shared__ uint32_t red_max[kMaxThreads / 32];
  constexpr float kMax = kFmt == TE_DTYPE_FLOAT8_E5M2 ? 57344.0f : 448.0f;
  const int X = blockDim.x, t = threadIdx.x;
  const int64_t cols = p.cols;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < p.rows;
  const int64_t base = (live ? row : 0) * cols;
  const T* xr = static_cast<const T*>(p.x) + base;
  const bool x_vec = norm::aligned16(xr);
  const float n = static_cast<float>(cols);

  float s = 1.0f;  // per-tensor scale
  bool out_vec = false;
  if (p.out != nullptr) {
    if constexpr (kOut == kOutHigh) {
      out_vec = norm::aligned16(static_cast<const char*>(p.out) + base * norm::elem_bytes(p.out_dtype));
    } else {
      out_vec = (reinterpret_cast<uintptr_t>(static_cast<const uint8_t*>(p.out) + base) & 7u) == 0;
    }
  }
  if constexpr (kOut == kOutPerTensor) {
    if (p.out != nullptr) {
      s = p.current ? compute_scale_from_amax(*p.amax_in, kMax, p.pow2, p.amax_epsilon) : *p.scale;
      if (blockIdx.x == 0 && t == 0 && threadIdx.y == 0) {
        const float s_inv = 1.0f / s;
        if (p.current && p.scale_out != nullptr) *p.scale_out = s;
        if (p.rowwise_scale_inv != nullptr) *p.rowwise_scale_inv = s_inv;
        if (p.columnwise_scale_inv != nullptr) *p.columnwise_scale_inv = s_inv;
      }
    }
  }
  uint32_t amax_bits = 0;

  // y of one chunk (column c), written to the output.
  auto emit = [&](int64_t c, const Raw8<T>& v, float mu, float rs) {
    const int valid = live ? norm::chunk_valid(cols, c) : 0;
    float g[8], b[8], y[8];
    norm::load8(p.gamma, p.gamma_dtype, c, valid, p.gb_vec, g);
    if (p.beta != nullptr) norm::load8(p.beta, p.beta_dtype, c, valid, p.gb_vec, b);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float xhat = __fmul_rn(__fsub_rn(v.get(k), mu), rs);
      y[k] = __fmul_rn(xhat, p.zero_centered ? __fadd_rn(1.0f, g[k]) : g[k]);
      if (p.beta != nullptr) y[k] = __fadd_rn(y[k], b[k]);
    }
    if constexpr (kOut == kOutHigh) {
      if (p.out != nullptr) norm::store8(p.out, p.out_dtype, base + c, y, valid, out_vec);
    } else {
      Raw8<float> r;
      uint32_t m = 0;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        r.w[k] = __float_as_uint(y[k]);
        if (valid == 8 || k < valid) m = max(m, abs_bits(y[k]));
      }
      uint8_t* dst = static_cast<uint8_t*>(p.out) + base + c;
      if constexpr (kOut == kOutPerTensor) {
        amax_bits = max(amax_bits, m);
        if (p.out != nullptr && valid > 0) tile::store_row8(dst, quantize8<kFmt>(r, s), valid, out_vec);
      } else {
        // The 16 lanes holding one 128-column block (lane groups of 16 never straddle a block).
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = max(m, __shfl_xor_sync(0xffffffffu, m, 8));
        const float sb = compute_scale_from_amax(__uint_as_float(m), kMax, p.pow2, p.amax_epsilon);
        if (valid > 0) {
          tile::store_row8(dst, quantize8<kFmt>(r, sb), valid, out_vec);
          if ((t & 15) == 0) p.block_scale_inv[(c / 128) * p.block_scale_ld + row] = 1.0f / sb;
        }
      }
    }
  };

  // Stats from the row sums; every thread of the CTA runs this (row_sum syncs).
  auto finish_stats = [&](float sq, float mu) -> float {
    float v[1] = {sq};
    norm::row_sum(v, red);
    const float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(v[0], n), p.eps)));
    if (live && t == 0) {
      if (p.mu != nullptr) p.mu[row] = mu;
      if (p.rsigma != nullptr) p.rsigma[row] = rs;
    }
    return rs;
  };
  auto mean_of = [&](float sum) -> float {
    float v[1] = {sum};
    norm::row_sum(v, red);
    return __fdiv_rn(v[0], n);
  };
  float mu = 0.0f, rs = 0.0f;
  if (p.load_stats && live) {
    if (!p.rms) mu = p.mu[row];
    rs = p.rsigma[row];
  }

  if constexpr (kChunks > 0) {
    Raw8<T> v[kChunks];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int64_t c = static_cast<int64_t>(j * X + t) * 8;
      norm::load_chunk(v[j], xr + c, live ? norm::chunk_valid(cols, c) : 0, x_vec);
    }
    if (!p.load_stats) {
      if (!p.rms) {
        float sum = 0.0f;  // elements outside the row loaded as +0, which leave a sum unchanged
#pragma unroll
        for (int j = 0; j < kChunks; ++j)
#pragma unroll
          for (int k = 0; k < 8; ++k) sum = __fadd_rn(sum, v[j].get(k));
        mu = mean_of(sum);
      }
      float sq = 0.0f;
#pragma unroll
      for (int j = 0; j < kChunks; ++j)
        sq = add_squares(sq, v[j], mu, norm::chunk_valid(cols, static_cast<int64_t>(j * X + t) * 8));
      rs = finish_stats(sq, mu);
    }
#pragma unroll
    for (int j = 0; j < kChunks; ++j) emit(static_cast<int64_t>(j * X + t) * 8, v[j], mu, rs);
  } else {
    // Re-read path: the row in steps of X * 8 * kIter columns, once per pass (L2 after the first).
    const int64_t step = static_cast<int64_t>(X) * 8 * kIter;
    auto load_step = [&](int64_t c0, Raw8<T>(&v)[kIter]) {
#pragma unroll
      for (int j = 0; j < kIter; ++j) {
        const int64_t c = c0 + static_cast<int64_t>(j * X + t) * 8;
        norm::load_chunk(v[j], xr + c, live ? norm::chunk_valid(cols, c) : 0, x_vec);
      }
    };
    if (!p.load_stats) {
      if (!p.rms) {
        float sum = 0.0f;
        for (int64_t c0 = 0; c0 < cols; c0 += step) {
          Raw8<T> v[kIter];
          load_step(c0, v);
#pragma unroll
          for (int j = 0; j < kIter; ++j)
#pragma unroll
            for (int k = 0; k < 8; ++k) sum = __fadd_rn(sum, v[j].get(k));
        }
        mu = mean_of(sum);
      }
      float sq = 0.0f;
      for (int64_t c0 = 0; c0 < cols; c0 += step) {
        Raw8<T> v[kIter];
        load_step(c0, v);
#pragma unroll
        for (int j = 0; j < kIter; ++j)
          sq = add_squares(sq, v[j], mu, norm::chunk_valid(cols, c0 + static_cast<int64_t>(j * X + t) * 8));
      }
      rs = finish_stats(sq, mu);
    }
    for (int64_t c0 = 0; c0 < cols; c0 += step) {
      Raw8<T> v[kIter];
      load_step(c0, v);
#pragma unroll
      for (int j = 0; j < kIter; ++j) emit(c0 + static_cast<int64_t>(j * X + t) * 8, v[j], mu, rs);
    }
  }

  if constexpr (kOut == kOutPerTensor) {
    if (p.amax_out != nullptr) {
      const uint32_t m = norm::cta_max(amax_bits, red_max);
      if (t == 0 && threadIdx.y == 0) atomic_max_amax(p.amax_out, m);
    }
  }
}

// Registers per thread bound the chunk count: 8 chunks only with 16-bit inputs at 512 threads.
template <typename T>
norm::RowLayout fwd_layout(int64_t cols) {
  return norm::choose_layout(
      cols, [](int k) { return k < 8 ? 256 : (sizeof(T) == 2 ? 512 : 256); }, kMaxThreads);
}

template <int kOut, int kFmt>
void launch_fwd(const FwdParams& p, int32_t in_dtype, cudaStream_t stream) {
  dispatch_source(in_dtype, [&](auto tag) {
    using T = decltype(tag);
    const norm::RowLayout layout = fwd_layout<T>(p.cols);
    const int64_t grid = ceil_div(p.rows, layout.rows);
    if (grid > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "norm_fwd_kernel: too many rows");
    norm::dispatch_chunks(layout.chunks, [&](auto chunks) {
      norm_fwd_kernel<T, kOut, kFmt, decltype(chunks)::value>
          <<<static_cast<unsigned>(grid), dim3(layout.threads, layout.rows), 0, stream>>>(p);
    });
    check_launch("norm_fwd_kernel");
  });
}

void per_tensor_fwd(const NormFwdArgs& a, FwdParams p, const PerTensorQuantizeArgs& q,
                    cudaStream_t stream) {
  const int64_t numel = a.rows * a.cols;
  // Only the column-wise copy asked for: the row-wise bytes it is transposed from go to scratch.
  Scratch row_copy(q.rowwise == nullptr ? static_cast<size_t>(numel) : 0, stream, "norm scratch");
  uint8_t* rowwise = q.rowwise != nullptr ? static_cast<uint8_t*>(q.rowwise) : row_copy.as<uint8_t>();
  p.pow2 = q.force_pow2_scales;
  p.amax_epsilon = q.amax_epsilon;
  dispatch_fp8(q.out_dtype, [&](auto fmt) {
    constexpr int kFmt = decltype(fmt)::value;
    if (q.current && !q.use_existing_amax) {
      // Pass 1: stats and amax(y). mu/rsigma go to the caller's buffers, else to scratch, for
      // pass 2 to read back: the same fp32 values, so pass 2's y is pass 1's y bit for bit.
      const bool need_mu = !a.rms && a.mu == nullptr, need_rs = a.rsigma == nullptr;
      Scratch stats(sizeof(float) * static_cast<size_t>(a.rows) * (need_mu + need_rs), stream, "norm scratch");
      p.mu = need_mu ? stats.as<float>() : a.mu;
      p.rsigma = need_rs ? stats.as<float>() + (need_mu ? a.rows : 0) : a.rsigma;
      check_cuda(cudaMemsetAsync(q.amax, 0, sizeof(float), stream), "norm_fwd: cudaMemsetAsync(amax)");
      FwdParams p1 = p;
      p1.amax_out = q.amax;
      launch_fwd<kOutPerTensor, kFmt>(p1, a.in_dtype, stream);
      FwdParams p2 = p;
      p2.load_stats = true;
      p2.out = rowwise;
      p2.current = true;
      p2.amax_in = q.amax;
      p2.scale_out = q.scale;
      p2.rowwise_scale_inv = q.rowwise_scale_inv;
      p2.columnwise_scale_inv = q.columnwise_scale_inv;
      launch_fwd<kOutPerTensor, kFmt>(p2, a.in_dtype, stream);
    } else {
      p.out = rowwise;
      p.current = q.current;
      p.scale = q.scale;
      p.amax_in = q.amax;
      p.scale_out = q.current ? q.scale : nullptr;
      p.amax_out = q.current ? nullptr : q.amax;
      p.rowwise_scale_inv = q.rowwise_scale_inv;
      p.columnwise_scale_inv = q.columnwise_scale_inv;
      launch_fwd<kOutPerTensor, kFmt>(p, a.in_dtype, stream);
    }
  });
  if (q.columnwise != nullptr) transpose(rowwise, q.columnwise, a.rows, a.cols, 1, stream);
}

void block_fwd(const NormFwdArgs& a, FwdParams p, const BlockQuantizeArgs& q, cudaStream_t stream) {
  if (q.block_dim == 1 && q.columnwise == nullptr) {
    p.out = q.rowwise;
    p.block_scale_inv = q.rowwise_scale_inv;
    p.block_scale_ld = q.rowwise_scale_ld;
    p.pow2 = q.force_pow2_scales;
    p.amax_epsilon = q.amax_epsilon;
    dispatch_fp8(q.out_dtype, [&](auto fmt) {
      launch_fwd<kOutBlock1D, decltype(fmt)::value>(p, a.in_dtype, stream);
    });
    return;
  }
  // Column-wise 1-D blocks and 128x128 tiles span rows: fp32 y to scratch, then quantize_block
  // (correct by construction; slower, see the top of this file).
  Scratch y(sizeof(float) * static_cast<size_t>(a.rows * a.cols), stream, "norm scratch");
  p.out = y.as<float>();
  p.out_dtype = TE_DTYPE_FLOAT32;
  launch_fwd<kOutHigh, 0>(p, a.in_dtype, stream);
  BlockQuantizeArgs b = q;
  b.input = y.as<float>();
  b.in_dtype = TE_DTYPE_FLOAT32;
  quantize_block(b, stream);
}

}  // namespace

void norm_fwd(const NormFwdArgs& a, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const FusedOutput& out = a.out;
  if (a.rows == 0) {
    // No rows: only the per-tensor scale outputs are written, exactly as te_quantize writes them
    // for an empty input (its kernels accept a null input of no elements).
    if (out.kind == kFusedPerTensor) {
      PerTensorQuantizeArgs q = out.per_tensor;
      q.input = nullptr;
      q.in_dtype = TE_DTYPE_FLOAT32;
      quantize_per_tensor(q, stream);
    }
    return;
  }
  FwdParams p{};
  p.x = a.input;
  p.rows = a.rows;
  p.cols = a.cols;
  p.gamma = a.gamma;
  p.gamma_dtype = a.gamma_dtype;
  p.beta = a.rms ? nullptr : a.beta;
  p.beta_dtype = a.beta_dtype;
  p.gb_vec = aligned(a.gamma, 16) && (p.beta == nullptr || aligned(p.beta, 16));
  p.eps = a.eps;
  p.rms = a.rms;
  p.zero_centered = a.zero_centered_gamma;
  p.mu = a.rms ? nullptr : a.mu;
  p.rsigma = a.rsigma;
  if (out.kind == kFusedHighPrecision) {
    p.out = out.data;
    p.out_dtype = out.dtype;
    launch_fwd<kOutHigh, 0>(p, a.in_dtype, stream);
  } else if (out.kind == kFusedPerTensor) {
    per_tensor_fwd(a, p, out.per_tensor, stream);
  } else {
    block_fwd(a, p, out.block, stream);
  }
}

}  // namespace cuda
}  // namespace te
