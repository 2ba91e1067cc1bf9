// LayerNorm / RMSNorm reference (te/normalization.h has the contract). Every step is a plain fp32
// operation in a fixed order, so the numbers are reproducible and the CUDA kernels can be checked
// against them, but for the forward's two row sums (LayerNorm's two passes: the mean, then the
// centered squares, which avoids the cancellation of E[x^2] - E[x]^2), accumulated in double
// and rounded to fp32 once: an fp32 sum in index order lost up to 4e-5 of rsigma on rows with an
// outlier or a large offset (a 3000 beside N(0, 1) values, against float64), more than the CUDA
// kernels' fp32 tree sums do, so the reference would not have been the accurate side. Each
// square is the fp32 d = x - mu squared exactly (as the kernels' fmaf). rsigma = 1 / sqrt(var +
// eps) with both operations correctly rounded, dgamma/dbeta accumulated over rows in index order.
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/kernels.h"
#include "cpu/fp_convert.h"
#include "cpu/fused_output.h"

namespace te {
namespace cpu {
namespace {

// The weight actually applied: gamma, or 1 + gamma.
std::vector<float> weight(const void* gamma, int32_t dtype, int64_t cols, bool zero_centered) {
  std::vector<float> g(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    const float v = load_as_float(gamma, dtype, c);
    g[c] = zero_centered ? 1.0f + v : v;
  }
  return g;
}

}  // namespace

void norm_fwd(const NormFwdArgs& args, void* /*stream*/) {
  const int64_t rows = args.rows, cols = args.cols;
  const std::vector<float> g = weight(args.gamma, args.gamma_dtype, cols, args.zero_centered_gamma);
  std::vector<float> y(static_cast<size_t>(rows * cols));
  const float n = static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * cols;
    float mu = 0.0f;
    if (!args.rms) {
      double sum = 0.0;
      for (int64_t c = 0; c < cols; ++c) sum += load_as_float(args.input, args.in_dtype, base + c);
      mu = static_cast<float>(sum) / n;
    }
    double sq = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double d = load_as_float(args.input, args.in_dtype, base + c) - mu;
      sq += d * d;
    }
    const float var = static_cast<float>(sq) / n;
    const float rsigma = 1.0f / std::sqrt(var + args.eps);
    for (int64_t c = 0; c < cols; ++c) {
      const float xhat = (load_as_float(args.input, args.in_dtype, base + c) - mu) * rsigma;
      y[base + c] =
          args.beta ? std::fma(xhat, g[c], load_as_float(args.beta, args.beta_dtype, c)) : xhat * g[c];
    }
    if (args.mu) args.mu[r] = mu;
    if (args.rsigma) args.rsigma[r] = rsigma;
  }
  write_fused_output(args.out, y.data(), rows, cols);
}

void norm_bwd(const NormBwdArgs& args, void* /*stream*/) {
  const int64_t rows = args.rows, cols = args.cols;
  const std::vector<float> g = weight(args.gamma, args.gamma_dtype, cols, args.zero_centered_gamma);
  std::vector<float> dgamma(static_cast<size_t>(cols), 0.0f), dbeta(static_cast<size_t>(cols), 0.0f);
  std::vector<float> xhat(static_cast<size_t>(cols)), dxhat(static_cast<size_t>(cols));
  const float n = static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * cols;
    const float mu = args.rms ? 0.0f : args.mu[r];
    const float rsigma = args.rsigma[r];
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      const float dy = load_as_float(args.dz, args.dz_dtype, base + c);
      xhat[c] = (load_as_float(args.x, args.x_dtype, base + c) - mu) * rsigma;
      dxhat[c] = dy * g[c];
      sum_dxhat += dxhat[c];
      sum_dxhat_xhat += dxhat[c] * xhat[c];
      dgamma[c] += dy * xhat[c];
      dbeta[c] += dy;
    }
    const float mean_dxhat = args.rms ? 0.0f : sum_dxhat / n;
    const float mean_dxhat_xhat = sum_dxhat_xhat / n;
    const float k1 = -(rsigma * mean_dxhat_xhat);
    for (int64_t c = 0; c < cols; ++c) {
      float dx = std::fma(xhat[c], k1, rsigma * (dxhat[c] - mean_dxhat));
      if (args.add) dx = dx + load_as_float(args.add, args.add_dtype, base + c);
      store_from_float(args.dx, args.dx_dtype, base + c, dx);
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    store_from_float(args.dgamma, args.dgamma_dtype, c, dgamma[c]);
    if (args.dbeta) store_from_float(args.dbeta, args.dbeta_dtype, c, dbeta[c]);
  }
}

}  // namespace cpu
}  // namespace te
