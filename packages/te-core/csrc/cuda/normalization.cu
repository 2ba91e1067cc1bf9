// LayerNorm / RMSNorm forward: which passes run for each output (the kernels: norm_fwd.cuh).
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
#include "cuda/norm_fwd.cuh"

namespace te {
namespace cuda {
namespace {

using normfwd::FwdParams;
using normfwd::kOutBlock1D;
using normfwd::kOutHigh;
using normfwd::kOutPerTensor;
using normfwd::launch_fwd;

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
  const norm::WeightPieces pieces = normfwd::fwd_weight_pieces(
      a.rms, a.in_dtype, a.cols, a.gamma_dtype, a.beta != nullptr, a.beta_dtype, a.zero_centered_gamma);
  const norm::Fp32Weights w(a.gamma, a.gamma_dtype, a.rms ? nullptr : a.beta, a.beta_dtype,
                            a.zero_centered_gamma, a.cols, pieces, stream);
  p.gamma = w.gamma();
  p.beta = w.beta();
  p.w16 = pieces.dtype16 != 0;
  p.eps = a.eps;
  p.rms = a.rms;
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
