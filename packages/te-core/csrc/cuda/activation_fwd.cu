// te_activation_fwd on CUDA: y = act(x) (gated: act(first half) * second half), written through
// cuda/fused_output.cuh (high precision, per-tensor FP8 with its optional column-wise copy, blocks).
#include "common/kernels.h"
#include "cuda/activation.cuh"
#include "cuda/fused_output.cuh"

namespace te {
namespace cuda {
namespace activation {
namespace {

// y[r, c] = act(in[r, c]) (* in[r, cols + c] when gated). Result [rows, cols], input
// [rows, in_cols].
template <int kBase, bool kGated>
struct FwdLoader {
  using Value = float;
  struct RawPlain {
    fused::Src8 a;
  };
  struct RawGated {
    fused::Src8 a, b;
  };
  using Raw = std::conditional_t<kGated, RawGated, RawPlain>;
  static constexpr int kBatchRows = 2;
  static constexpr int kMinBlocks = 2;
  static constexpr int kStreamMinBlocks = kGated ? 2 : 4;
  static constexpr bool kFormatTemplate = false;

  const void* in;
  int32_t dtype;
  int64_t cols, in_cols;
  bool vec;  // input aligned, row pitch and gate offset multiples of 16 bytes

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
    if constexpr (kGated) {
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

}  // namespace
}  // namespace activation

void activation_fwd(const ActivationFwdArgs& a, void* stream) {
  activation::with_base(a.activation, [&](auto base, auto gated_c) {
    constexpr bool gated = decltype(gated_c)::value != 0;
    activation::FwdLoader<decltype(base)::value, gated> ld{};
    ld.in = a.input;
    ld.dtype = a.in_dtype;
    ld.cols = a.cols;
    ld.in_cols = a.in_cols;
    const int64_t bytes = fused::source_bytes(a.in_dtype);
    ld.vec = activation::vec_rows(a.input, a.in_cols, bytes) && (!gated || (a.cols * bytes) % 16 == 0);
    fused::write<false>(a.out, ld, a.rows, a.cols, fused::Dbias{nullptr, 0}, as_stream(stream));
  });
}

}  // namespace cuda
}  // namespace te
