// Per-tensor FP8 quantization (NUMERICS.md), delayed or current scaling, with the optional fused
// transpose. q = convert(x * scale), one fp32 multiply, RNE saturating; scale_inv = 1 / scale.
//
// Passes over memory:
//   delayed, row-wise only:   1 (read x, write q; the amax for the history in the same pass)
//   delayed, with transpose:  1 (cast_tile.cuh: both copies from one read)
//   current:                  2 (amax.cu's pass, then the cast pass reading *amax on the device;
//                             the scale is computed in-kernel, so nothing syncs with the host)
//   current, use_existing_amax: 1
//   current, up to one wave of 128x128 tiles: 1 (cast_tile.cuh's cooperative variant: the amax
//                             from the tile values in registers, combined behind grid barriers)
// The current-scaling cast pass walks the tensor last-to-first: the amax pass walked it
// first-to-last, so the tail it read last (up to the L2 size, ~50 MB on H200) is still in L2.
//
// The row-wise-only cast is a grid-stride loop over 8-element units, launched with one step
// (8192 elements) per block so that blocks finishing early take new steps: each thread keeps four
// 16-byte loads in flight, a warp's stores are 256 contiguous bytes, and the delayed amax is a
// block reduce plus one atomicMax per block. Buffers whose input is not 16-byte
// aligned or whose output is not 8-byte aligned take the scalar path.
#include "common/kernels.h"
#include "cuda/amax.cuh"
#include "cuda/cast_tile.cuh"
#include "cuda/cuda_utils.cuh"

namespace te {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnitsPerThread = 4;
constexpr int64_t kUnitsPerStep = static_cast<int64_t>(kThreads) * kUnitsPerThread;

struct CastParams {
  const void* input;
  uint8_t* out;
  int64_t numel;
  int64_t units;  // 8-element units taken by the vector path (0: all scalar)
  const float* scale;
  const float* amax_in;
  float* amax_out;
  float* scale_out;
  float* rowwise_scale_inv;
  float* columnwise_scale_inv;
  bool current, reverse, pow2;
  float eps;
};

template <typename T, int kFmt>
__global__ void __launch_bounds__(kThreads) cast_kernel(const CastParams p) {
  __shared__ uint32_t scratch[kThreads / 32];
  constexpr float kMax = kFmt == TE_DTYPE_FLOAT8_E4M3 ? 448.0f : 57344.0f;
  const float s =
      p.current ? compute_scale_from_amax(*p.amax_in, kMax, p.pow2, p.eps) : *p.scale;
  const int tid = threadIdx.x;
  if (blockIdx.x == 0 && tid == 0) {
    const float s_inv = 1.0f / s;
    if (p.current && p.scale_out != nullptr) *p.scale_out = s;
    if (p.rowwise_scale_inv != nullptr) *p.rowwise_scale_inv = s_inv;
    if (p.columnwise_scale_inv != nullptr) *p.columnwise_scale_inv = s_inv;
  }
  const T* in = static_cast<const T*>(p.input);
  const bool want_amax = p.amax_out != nullptr;
  uint32_t m = 0;

  const int64_t steps = ceil_div(p.units, kUnitsPerStep);
  for (int64_t step = blockIdx.x; step < steps; step += gridDim.x) {
    const int64_t base = (p.reverse ? steps - 1 - step : step) * kUnitsPerStep + tid;
    Raw8<T> x[kUnitsPerThread];
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      const int64_t u = base + j * kThreads;
      if (u < p.units) x[j].load_vec(in + u * 8);
    }
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      const int64_t u = base + j * kThreads;
      if (u < p.units) {
        if (want_amax) {
#pragma unroll
          for (int k = 0; k < 8; ++k) m = max(m, abs_bits(x[j].get(k)));
        }
        *reinterpret_cast<uint2*>(p.out + u * 8) = quantize8<kFmt>(x[j], s);
      }
    }
  }

  // Tail after the last unit, or everything when unaligned.
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t e = p.units * 8 + static_cast<int64_t>(blockIdx.x) * kThreads + tid; e < p.numel;
       e += stride) {
    Raw8<T> x;
    x.load_scalar(in + e, 1);
    const float v = x.get(0);
    m = max(m, abs_bits(v));
    p.out[e] = static_cast<uint8_t>(fp8x2<kFmt>(scaled(v, s), 0.0f));
  }

  if (want_amax) {
    m = block_max<kThreads>(m, scratch);
    if (tid == 0) atomic_max_amax(p.amax_out, canonical_amax_bits<T>(m));
  }
}

void launch_cast(CastParams p, int32_t in_dtype, int32_t out_dtype, cudaStream_t stream) {
  dispatch_source(in_dtype, [&](auto in_tag) {
    using T = decltype(in_tag);
    const bool vec = aligned(p.input, 16) && aligned(p.out, 8);
    p.units = vec ? p.numel / 8 : 0;
    dispatch_fp8(out_dtype, [&](auto fmt) {
      constexpr int kFmt = decltype(fmt)::value;
      const int64_t work = p.units > 0 ? ceil_div(p.units, kUnitsPerStep)
                                       : ceil_div(p.numel, kThreads);
      // One step per block (not a persistent grid of the resident count): a persistent grid left
      // a last round in which half the blocks ran alone (16384 steps / 1056 blocks = 15.5).
      int64_t blocks = work < 0x7fffffffLL ? work : 0x7fffffffLL;
      if (blocks < 1) blocks = 1;
      cast_kernel<T, kFmt><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
      check_launch("cast_kernel");
    });
  });
}

}  // namespace

void quantize_per_tensor(const PerTensorQuantizeArgs& a, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const int64_t numel = a.rows * a.cols;
  if (a.current && !a.use_existing_amax && numel > 0) {
    // Small enough for every tile's CTA to be resident: amax and cast in one launch and one read.
    tile::Params p = tile::per_tensor_params(a, false);
    p.grid_amax = true;
    p.amax_acc = a.amax;
    if (tile::launch_input_coop(tile::kPerTensor, p, a.input, a.in_dtype, a.out_dtype, stream)) return;
  }
  bool reverse = false;
  if (a.current && !a.use_existing_amax) {
    amax_into_zeroed(a.input, a.in_dtype, numel, a.amax, stream);
    reverse = true;
  }

  if (a.columnwise == nullptr) {
    // Row-wise only (or nothing): the flat cast. It also runs for an empty tensor (one block,
    // no elements) so the scale outputs are written as the CPU reference writes them.
    CastParams p{};
    p.input = a.input;
    p.out = static_cast<uint8_t*>(a.rowwise);
    p.numel = a.rowwise != nullptr ? numel : 0;
    p.scale = a.scale;
    p.amax_in = a.amax;
    p.amax_out = a.current ? nullptr : a.amax;
    p.scale_out = a.scale;
    p.rowwise_scale_inv = a.rowwise_scale_inv;
    p.columnwise_scale_inv = a.columnwise_scale_inv;
    p.current = a.current;
    p.reverse = reverse;
    p.pow2 = a.force_pow2_scales;
    p.eps = a.amax_epsilon;
    if (p.numel == 0) p.amax_out = nullptr;
    launch_cast(p, a.in_dtype, a.out_dtype, stream);
    return;
  }

  if (numel == 0) {
    // Nothing to transpose; the flat cast with no elements writes the scale outputs.
    CastParams c{};
    c.input = a.input;
    c.scale = a.scale;
    c.amax_in = a.amax;
    c.scale_out = a.scale;
    c.rowwise_scale_inv = a.rowwise_scale_inv;
    c.columnwise_scale_inv = a.columnwise_scale_inv;
    c.current = a.current;
    c.pow2 = a.force_pow2_scales;
    c.eps = a.amax_epsilon;
    launch_cast(c, a.in_dtype, a.out_dtype, stream);
    return;
  }
  tile::launch_input(tile::kPerTensor, tile::per_tensor_params(a, reverse), a.input, a.in_dtype,
                     a.out_dtype, stream);
}

}  // namespace cuda
}  // namespace te
