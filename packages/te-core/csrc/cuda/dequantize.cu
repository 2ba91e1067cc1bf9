// Dequantization: out[r][c] = round_to_out_dtype(float(q) * scale_inv), one fp32 multiply, for
// per-tensor, 1-D and 2-D block scaling, from the row-wise copy [rows, cols] or the transposed
// column-wise copy [cols, rows]. Output fp32/fp16/bf16 (__float2half_rn / __float2bfloat16_rn);
// FP8 widening is exact (through fp16). Block scale_inv positions follow te/tensor.h's table.
//
// Row-wise source: a grid-stride loop over 8-element row segments (8-byte loads, 16- or 32-byte
// stores where aligned); a segment never straddles a 128-column block, so it needs one scale.
// Transposed source: 32x32 tiles through shared memory so both the FP8 reads and the output
// writes are coalesced. Not on a training hot path; kept simple.
#include "common/kernels.h"
#include "cuda/cuda_utils.cuh"

namespace te {
namespace cuda {
namespace {

constexpr int64_t kBlock = 128;

struct DqParams {
  const uint8_t* data;
  const float* scale_inv;
  int64_t scale_ld;
  int64_t rows, cols;
  void* out;
  int32_t mode;
  bool vec;
};

// scale_inv of source element (r, c) in the layout of the copy being read.
template <bool kTransposed>
__device__ __forceinline__ float scale_inv_at(const DqParams& p, int64_t r, int64_t c) {
  switch (p.mode) {
    case TE_SCALING_BLOCK_1D:
      return kTransposed ? p.scale_inv[(r / kBlock) * p.scale_ld + c]
                         : p.scale_inv[(c / kBlock) * p.scale_ld + r];
    case TE_SCALING_BLOCK_2D:
      return kTransposed ? p.scale_inv[(c / kBlock) * p.scale_ld + r / kBlock]
                         : p.scale_inv[(r / kBlock) * p.scale_ld + c / kBlock];
    default:
      return p.scale_inv[0];
  }
}

template <typename OT>
__device__ __forceinline__ void store8(OT* dst, const float (&v)[8]) {
  if constexpr (std::is_same_v<OT, float>) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const OT lo = from_float<OT>(v[2 * i]), hi = from_float<OT>(v[2 * i + 1]);
      w[i] = static_cast<uint32_t>(reinterpret_cast<const unsigned short&>(lo)) |
             (static_cast<uint32_t>(reinterpret_cast<const unsigned short&>(hi)) << 16);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <int kFmt, typename OT>
__global__ void __launch_bounds__(256) dequantize_rowwise_kernel(const DqParams p) {
  const int64_t groups_per_row = ceil_div(p.cols, 8);
  const int64_t groups = p.rows * groups_per_row;
  OT* out = static_cast<OT*>(p.out);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < groups;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / groups_per_row, c = (i % groups_per_row) * 8;
    const float s = scale_inv_at<false>(p, r, c);
    const uint8_t* src = p.data + r * p.cols + c;
    OT* dst = out + r * p.cols + c;
    if (p.vec) {
      const uint2 q = *reinterpret_cast<const uint2*>(src);
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k)
        v[k] = __fmul_rn(fp8_to_float<kFmt>(static_cast<uint8_t>((k < 4 ? q.x : q.y) >> (8 * (k % 4)))), s);
      store8(dst, v);
    } else {
      const int64_t n = p.cols - c < 8 ? p.cols - c : 8;
      for (int64_t k = 0; k < n; ++k) dst[k] = from_float<OT>(__fmul_rn(fp8_to_float<kFmt>(src[k]), s));
    }
  }
}

constexpr int kT = 32;  // transposed tiles: 32x32, 32x8 threads, 4 elements each

template <int kFmt, typename OT>
__global__ void __launch_bounds__(kT * 8) dequantize_transposed_kernel(const DqParams p) {
  __shared__ uint8_t tile[kT][kT + 4];
  const int64_t tiles_r = ceil_div(p.rows, kT);
  const int64_t c0 = (blockIdx.x / tiles_r) * kT, r0 = (blockIdx.x % tiles_r) * kT;
  const int tx = threadIdx.x % kT, ty = threadIdx.x / kT;
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // data [cols, rows]: contiguous along source rows
    const int64_t c = c0 + ty + 8 * j, r = r0 + tx;
    if (c < p.cols && r < p.rows) tile[ty + 8 * j][tx] = p.data[c * p.rows + r];
  }
  __syncthreads();
  OT* out = static_cast<OT*>(p.out);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t r = r0 + ty + 8 * j, c = c0 + tx;
    if (c < p.cols && r < p.rows)
      out[r * p.cols + c] =
          from_float<OT>(__fmul_rn(fp8_to_float<kFmt>(tile[tx][ty + 8 * j]), scale_inv_at<true>(p, r, c)));
  }
}

template <typename F>
void dispatch_out(int32_t dtype, F&& f) {
  dispatch_source(dtype, f);  // the same three types
}

}  // namespace

void dequantize(const DequantizeArgs& a, void* stream_ptr) {
  if (a.rows == 0 || a.cols == 0) return;
  const cudaStream_t stream = as_stream(stream_ptr);
  DqParams p{};
  p.data = static_cast<const uint8_t*>(a.data);
  p.scale_inv = a.scale_inv;
  p.scale_ld = a.scale_ld;
  p.rows = a.rows;
  p.cols = a.cols;
  p.out = a.output;
  p.mode = a.scaling_mode;
  dispatch_fp8(a.data_dtype, [&](auto fmt) {
    constexpr int kFmt = decltype(fmt)::value;
    dispatch_out(a.out_dtype, [&](auto out_tag) {
      using OT = decltype(out_tag);
      if (!a.transposed) {
        p.vec = a.cols % 8 == 0 && aligned(p.data, 8) && aligned(p.out, 16);
        const int64_t groups = a.rows * ceil_div(a.cols, 8);
        static const int occupancy = blocks_per_sm(dequantize_rowwise_kernel<kFmt, OT>, 256, 8);
        int64_t blocks = static_cast<int64_t>(sm_count()) * occupancy;
        if (blocks > ceil_div(groups, 256)) blocks = ceil_div(groups, 256);
        dequantize_rowwise_kernel<kFmt, OT><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p);
        check_launch("dequantize_rowwise_kernel");
      } else {
        const int64_t tiles = ceil_div(a.rows, kT) * ceil_div(a.cols, kT);
        if (tiles > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "dequantize_transposed_kernel: too many tiles");
        dequantize_transposed_kernel<kFmt, OT>
            <<<static_cast<unsigned>(tiles), kT * 8, 0, stream>>>(p);
        check_launch("dequantize_transposed_kernel");
      }
    });
  });
}

}  // namespace cuda
}  // namespace te
