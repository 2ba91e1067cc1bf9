// MXFP8 / NVFP4 dequantization (kernels_mx.h MxDequantizeArgs), bit-exact with
// cpu/dequantize_mx.cpp: each element in fp32 (MXFP8 float(q) * 2^(e-127); NVFP4 (q * s_block) *
// s_global, each product one rounded multiply), the inverse Hadamard transform of a run of 16 where
// undo_rht (the same rht_inverse as the CPU), one rounding to the output dtype.
//
// A thread per run of 16 stored elements along a stored row (grid-stride): it reads 16 bytes (FP8)
// or 8 (E2M1) and one or two scale bytes, and writes 16 outputs, contiguous from the row-wise
// copy, one per output row from the column-wise one. This kernel also feeds te_gemm's emulated
// block-scaled path (gemm_mx.cu), which reads the stored copy as it is, never transposed.
#include "common/kernels_mx.h"
#include "cuda/mx_convert.cuh"

namespace te {
namespace cuda {
namespace {

constexpr int kRun = 16;
constexpr int kThreads = 256;

struct Params {
  const uint8_t* data;
  const uint8_t* scale;
  int64_t scale_ld;
  const float* global_amax;
  int64_t R, C;  // the stored copy
  bool transposed, undo_rht;
  void* out;
};

template <int kMode, int kFmt, typename OT>
__global__ void __launch_bounds__(kThreads) dequantize_mx_kernel(const Params p) {
  const int64_t runs_per_row = ceil_div(p.C, kRun);
  const int64_t runs = p.R * runs_per_row;
  const float s_global = kMode == TE_SCALING_NVFP4_1D ? nvfp4_decode_scale(*p.global_amax) : 0.0f;
  OT* out = static_cast<OT*>(p.out);
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < runs;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / runs_per_row, j0 = (idx % runs_per_row) * kRun;
    const int64_t n = p.C - j0 < kRun ? p.C - j0 : kRun;
    float v[kRun];
    if constexpr (kMode == TE_SCALING_MXFP8_1D) {
      const float s = e8m0_value(p.scale[i * p.scale_ld + j0 / 32]);
#pragma unroll
      for (int k = 0; k < kRun; ++k)
        v[k] = k < n ? __fmul_rn(fp8_to_float<kFmt>(p.data[i * p.C + j0 + k]), s) : 0.0f;
    } else {
      const float s = fp8_to_float<TE_DTYPE_FLOAT8_E4M3>(p.scale[i * p.scale_ld + j0 / kRun]);
      const uint8_t* bytes = p.data + (i * p.C + j0) / 2;  // C even: the run starts on a byte
#pragma unroll
      for (int k = 0; k < kRun; ++k) {
        const uint32_t code = k < n ? (bytes[k / 2] >> (4 * (k % 2))) & 0xfu : 0u;
        v[k] = __fmul_rn(__fmul_rn(mx::e2m1_value(code), s), s_global);
      }
      if (p.undo_rht) rht_inverse(v);  // runs are whole here: the API requires M % 16 == 0
    }
#pragma unroll
    for (int k = 0; k < kRun; ++k) {
      if (k < n) {
        const int64_t j = j0 + k;
        out[p.transposed ? j * p.R + i : i * p.C + j] = from_float<OT>(v[k]);
      }
    }
  }
}

}  // namespace

void dequantize_mx(const MxDequantizeArgs& a, void* stream) {
  if (a.rows == 0 || a.cols == 0) return;
  Params p{};
  p.data = a.data;
  p.scale = a.scale_inv;
  p.scale_ld = a.scale_ld;
  p.global_amax = a.global_amax;
  p.R = a.transposed ? a.cols : a.rows;
  p.C = a.transposed ? a.rows : a.cols;
  p.transposed = a.transposed;
  p.undo_rht = a.undo_rht;
  p.out = a.output;
  const int64_t runs = p.R * ceil_div(p.C, kRun);
  int64_t blocks = ceil_div(runs, kThreads);
  const int64_t cap = static_cast<int64_t>(sm_count()) * 8;
  if (blocks > cap) blocks = cap;
  dispatch_source(a.out_dtype, [&](auto out_tag) {
    using OT = decltype(out_tag);
    if (a.scaling_mode == TE_SCALING_NVFP4_1D) {
      dequantize_mx_kernel<TE_SCALING_NVFP4_1D, TE_DTYPE_FLOAT8_E4M3, OT>
          <<<static_cast<unsigned>(blocks), kThreads, 0, as_stream(stream)>>>(p);
    } else {
      dispatch_fp8(a.data_dtype, [&](auto fmt) {
        dequantize_mx_kernel<TE_SCALING_MXFP8_1D, decltype(fmt)::value, OT>
            <<<static_cast<unsigned>(blocks), kThreads, 0, as_stream(stream)>>>(p);
      });
    }
    check_launch("dequantize_mx_kernel");
  });
}

}  // namespace cuda
}  // namespace te
