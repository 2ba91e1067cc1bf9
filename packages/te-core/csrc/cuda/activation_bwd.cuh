// te_activation_bwd on CUDA, the kernels: dx = grad * act'(x) (gated: both halves' gradients),
// written through cuda/fused_output.cuh with the optional bias gradient from the same read.
//
// activation_bwd_width<kNarrow> runs the op with the loader of one source width (fused::Src8):
// instantiated for 16-bit sources in activation_bwd_16bit.cu and for any sources in
// activation_bwd.cu, so the two sets of kernels compile in parallel.
#pragma once

#include "common/kernels.h"
#include "cuda/activation.cuh"
#include "cuda/fused_output.cuh"

namespace te {
namespace cuda {
namespace activation {

// dx[r, c] for the result dx [rows, in_cols]; grad [rows, n]. Plain: grad * act'(x). Gated
// (in_cols = 2n): columns c < n are (grad * act'(a)) * b, columns n + j are grad * act(a), with
// a = in[r, j], b = in[r, n + j] and grad[r, j]; kClampedSilu's with its clamps, offset and
// masks (te/activation.h), which read b for the second half's columns too. A unit of 8 columns
// lies in one half when n is a multiple of 8 (the vector path requires it); otherwise elements
// are gathered one by one.
// kNarrow: grad and input both 16-bit (as FwdLoader's).
template <int kBase, bool kGated, bool kNarrow>
struct BwdLoader {
  using Value = float;
  struct RawPlain {
    fused::Src8<kNarrow> g, a;
  };
  struct RawGated {
    fused::Src8<kNarrow> g, a, b;
  };
  using Raw = std::conditional_t<kGated, RawGated, RawPlain>;
  static constexpr int kBatchRows = kNarrow ? 2 : 1;
  static constexpr int kMinBlocks = 2;
  static constexpr int kStreamMinBlocks = kGated ? 2 : 3;
  static constexpr bool kStreamPrefetch = kNarrow;
  static constexpr bool kFormatTemplate = false;

  const void* grad;
  const void* in;
  int32_t grad_dtype, in_dtype;
  int64_t n, in_cols;
  bool vec;  // pointers aligned, row pitches multiples of 16 bytes, gated: n % 8 == 0
  ActivationParams p;  // kClampedSilu's
  static constexpr bool kClamped = kBase == kClampedSilu;

  __device__ __forceinline__ void load(Raw& raw, int64_t r, int64_t c) const {
    const int64_t left = in_cols - c;
    if constexpr (!kGated) {
      if (vec && left >= 8) {
        raw.g.load_vec(grad, r * n + c, grad_dtype);
        raw.a.load_vec(in, r * in_cols + c, in_dtype);
      } else {
        const int valid = static_cast<int>(left < 8 ? left : 8);
        raw.g.load_scalar(grad, r * n + c, grad_dtype, valid);
        raw.a.load_scalar(in, r * in_cols + c, in_dtype, valid);
      }
    } else if (vec) {
      const bool first = c < n;
      const int64_t j = first ? c : c - n;
      raw.g.load_vec(grad, r * n + j, grad_dtype);
      raw.a.load_vec(in, r * in_cols + j, in_dtype);
      if (first || kClamped) {
        raw.b.load_vec(in, r * in_cols + n + j, in_dtype);
      } else {
        raw.b.zero();
      }
    } else {
      raw.g.zero();
      raw.a.zero();
      raw.b.zero();
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (k >= left) break;
        const int64_t cc = c + k;
        const bool first = cc < n;
        const int64_t j = first ? cc : cc - n;
        raw.g.load_one(k, grad, r * n + j, grad_dtype);
        raw.a.load_one(k, in, r * in_cols + j, in_dtype);
        if (first || kClamped) raw.b.load_one(k, in, r * in_cols + n + j, in_dtype);
      }
    }
  }

  __device__ __forceinline__ void finish(const Raw& raw, int64_t c, Raw8<float>& dx) const {
    float g[8], a[8];
    raw.g.decode(grad_dtype, g);
    raw.a.decode(in_dtype, a);
    if constexpr (!kGated) {
#pragma unroll
      for (int k = 0; k < 8; ++k) dx.w[k] = __float_as_uint(__fmul_rn(g[k], dact<kBase>(a[k])));
    } else if constexpr (kClamped) {
      float b[8];
      raw.b.decode(in_dtype, b);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const Clamped v(p, a[k], b[k]);
        float d;
        if (c + k < n) {
          d = a[k] > p.limit ? 0.0f : __fmul_rn(__fmul_rn(g[k], v.dact()), v.gate);
        } else {
          d = b[k] > p.limit || b[k] < -p.limit ? 0.0f : __fmul_rn(g[k], v.act);
        }
        dx.w[k] = __float_as_uint(d);
      }
    } else {
      float b[8];
      raw.b.decode(in_dtype, b);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const bool first = c + k < n;
        float v = __fmul_rn(g[k], first ? dact<kBase>(a[k]) : act<kBase>(a[k]));
        if (first) v = __fmul_rn(v, b[k]);
        dx.w[k] = __float_as_uint(v);
      }
    }
  }
};

template <bool kNarrow>
void activation_bwd_width(const ActivationBwdArgs& a, cudaStream_t stream) {
  with_base(a.activation, [&](auto base, auto gated_c) {
    constexpr bool gated = decltype(gated_c)::value != 0;
    BwdLoader<decltype(base)::value, gated, kNarrow> ld{};
    ld.grad = a.grad;
    ld.in = a.input;
    ld.grad_dtype = a.grad_dtype;
    ld.in_dtype = a.in_dtype;
    ld.n = a.cols;
    ld.in_cols = a.in_cols;
    ld.p = a.params;
    ld.vec = vec_rows(a.grad, a.cols, fused::source_bytes(a.grad_dtype)) &&
            vec_rows(a.input, a.in_cols, fused::source_bytes(a.in_dtype)) &&
            (!gated || a.cols % 8 == 0);
    fused::write<true>(a.dx, ld, a.rows, a.in_cols, fused::Dbias{a.dbias, a.dbias_dtype},
                 stream);
  });
}

extern template void activation_bwd_width<true>(const ActivationBwdArgs&, cudaStream_t);
extern template void activation_bwd_width<false>(const ActivationBwdArgs&, cudaStream_t);

}  // namespace activation
}  // namespace cuda
}  // namespace te
