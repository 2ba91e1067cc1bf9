// te_activation_fwd on CUDA, the kernels: y = act(x) (gated: act(first half) * second half),
// written through cuda/fused_output.cuh (high precision, per-tensor FP8 with its optional
// column-wise copy, blocks).
//
// activation_fwd_width<kNarrow> runs the op with the loader of one source width (fused::Src8):
// instantiated for 16-bit sources in activation_fwd_16bit.cu and for any sources in
// activation_fwd.cu, so the two sets of kernels compile in parallel.
#pragma once

#include "common/kernels.h"
#include "cuda/activation.cuh"
#include "cuda/fused_output.cuh"

namespace te {
namespace cuda {
namespace activation {

// y[r, c] = act(in[r, c]) (* in[r, cols + c] when gated). Result [rows, cols], input
// [rows, in_cols]. kNarrow: a 16-bit input (half the raw registers, so twice the rows in flight
// for the same budget).
template <int kBase, bool kGated, bool kNarrow>
struct FwdLoader {
  using Value = float;
  struct RawPlain {
    fused::Src8<kNarrow> a;
  };
  struct RawGated {
    fused::Src8<kNarrow> a, b;
  };
  using Raw = std::conditional_t<kGated, RawGated, RawPlain>;
  static constexpr int kBatchRows = kNarrow ? 4 : 2;
  static constexpr int kMinBlocks = 2;
  static constexpr int kStreamMinBlocks = kGated ? 2 : 4;
  static constexpr bool kStreamPrefetch = kNarrow;
  static constexpr bool kFormatTemplate = false;

  const void* in;
  int32_t dtype;
  int64_t cols, in_cols;
  bool vec;  // input aligned, row pitch and gate offset multiples of 16 bytes
  ActivationParams p;  // kClampedSilu's

  __device__ __forceinline__ void load(Raw& raw, int64_t r, int64_t c) const {
    const int64_t i = r * in_cols + c;
    const int64_t left = cols - c;
    if (vec && left >= 8) {
      raw.a.load_vec(in, i, dtype);
      if constexpr (kGated) raw.b.load_vec(in, i + cols, dtype);
    } else {
      const int valid = static_cast<int>(left < 8 ? left : 8);
      raw.a.load_scalar(in, i, dtype, valid);
      if constexpr (kGated) raw.b.load_scalar(in, i + cols, dtype, valid);
    }
  }

  __device__ __forceinline__ void finish(const Raw& raw, int64_t, Raw8<float>& y) const {
    float a[8];
    raw.a.decode(dtype, a);
    if constexpr (kBase == kClampedSilu) {
      float b[8];
      raw.b.decode(dtype, b);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const Clamped v(p, a[k], b[k]);
        y.w[k] = __float_as_uint(__fmul_rn(v.act, v.gate));
      }
    } else if constexpr (kGated) {
      float b[8];
      raw.b.decode(dtype, b);
#pragma unroll
      for (int k = 0; k < 8; ++k) y.w[k] = __float_as_uint(__fmul_rn(act<kBase>(a[k]), b[k]));
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) y.w[k] = __float_as_uint(act<kBase>(a[k]));
    }
  }
};

template <bool kNarrow>
void activation_fwd_width(const ActivationFwdArgs& a, cudaStream_t stream) {
  with_base(a.activation, [&](auto base, auto gated_c) {
    constexpr bool gated = decltype(gated_c)::value != 0;
    FwdLoader<decltype(base)::value, gated, kNarrow> ld{};
    ld.in = a.input;
    ld.dtype = a.in_dtype;
    ld.cols = a.cols;
    ld.in_cols = a.in_cols;
    ld.p = a.params;
    const int64_t bytes = fused::source_bytes(a.in_dtype);
    ld.vec = vec_rows(a.input, a.in_cols, bytes) && (!gated || (a.cols * bytes) % 16 == 0);
    fused::write<false>(a.out, ld, a.rows, a.cols, fused::Dbias{nullptr, 0}, stream);
  });
}

extern template void activation_fwd_width<true>(const ActivationFwdArgs&, cudaStream_t);
extern template void activation_fwd_width<false>(const ActivationFwdArgs&, cudaStream_t);

}  // namespace activation
}  // namespace cuda
}  // namespace te
