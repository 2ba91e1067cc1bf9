// MXFP8 quantization (kernels_mx.h Mxfp8QuantizeArgs; NUMERICS.md "MXFP8BlockScaling"),
// bit-exact with cpu/quantize_mxfp8.cpp.
//
// One CTA of 128 threads per 32 x 128 source tile (mx_convert.cuh): one read of the input into
// shared memory as fp32, then
//   row-wise:    thread t owns the 1x32 block (row t / 4, block t % 4): its amax, E8M0 byte and 32
//                FP8 bytes (two 16-byte stores where aligned: a warp writes 8 rows x 128 bytes);
//   column-wise: thread t owns source column t's 32x1 block, i.e. 32 consecutive bytes of a row of
//                the [cols, rows] copy.
// With tile_2d a 32x32 tile's amax is the max over the 32 row blocks of one block column (a shared
// atomicMax on the bits), and both copies use it.
#include "common/kernels_mx.h"
#include "cuda/mx_convert.cuh"

namespace te {
namespace cuda {
namespace {

constexpr int kBlock = 32;
constexpr int kThreads = 128;  // = the row blocks and the columns of a tile

struct Params {
  const void* input;
  int64_t rows, cols, tiles_c;
  uint8_t* rowwise;
  uint8_t* rowwise_scale;
  int64_t rowwise_ld;
  uint8_t* columnwise;
  uint8_t* columnwise_scale;
  int64_t columnwise_ld;
  bool vec_in, vec_row, vec_col;
};

// Quantizes 32 values with the factor of byte e into 32 bytes at dst (n valid).
template <int kFmt>
__device__ __forceinline__ void store_block(const float (&v)[kBlock], float f, uint8_t* dst,
                                            int64_t n, bool vec) {
  uint32_t w[kBlock / 4];
#pragma unroll
  for (int i = 0; i < kBlock / 4; ++i) {
    w[i] = mx::fp8_rn<kFmt>(__fmul_rn(v[4 * i], f)) | (mx::fp8_rn<kFmt>(__fmul_rn(v[4 * i + 1], f)) << 8) |
           (mx::fp8_rn<kFmt>(__fmul_rn(v[4 * i + 2], f)) << 16) |
           (mx::fp8_rn<kFmt>(__fmul_rn(v[4 * i + 3], f)) << 24);
  }
  if (vec && n >= kBlock) {
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(w[0], w[1], w[2], w[3]);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(w[4], w[5], w[6], w[7]);
  } else {
    for (int k = 0; k < n && k < kBlock; ++k) dst[k] = static_cast<uint8_t>(w[k / 4] >> (8 * (k % 4)));
  }
}

template <typename T, int kFmt, bool k2D>
__global__ void __launch_bounds__(kThreads) mxfp8_kernel(const Params p) {
  __shared__ mx::Tile<kBlock> tile;
  __shared__ uint32_t tile_amax[mx::kTileCols / kBlock];
  constexpr float kMax = kFmt == TE_DTYPE_FLOAT8_E4M3 ? 448.0f : 57344.0f;
  const int t = threadIdx.x;
  const int64_t r0 = (blockIdx.x / p.tiles_c) * mx::kTileRows;
  const int64_t c0 = (blockIdx.x % p.tiles_c) * mx::kTileCols;
  if (k2D && t < mx::kTileCols / kBlock) tile_amax[t] = 0u;
  mx::load_tile<T, kBlock, kThreads>(tile, static_cast<const T*>(p.input), p.rows, p.cols, r0, c0,
                                     p.vec_in);
  __syncthreads();

  // The row block of this thread.
  const int row = t / 4, blk = t % 4;
  float v[kBlock];
#pragma unroll
  for (int k = 0; k < kBlock; ++k) v[k] = tile.at(row, blk * kBlock + k);
  uint32_t row_amax = mx::amax_bits(v);
  if constexpr (k2D) {
    atomicMax(&tile_amax[blk], row_amax);
    __syncthreads();
    row_amax = tile_amax[blk];
  }
  const int64_t gr = r0 + row, gc0 = c0 + blk * kBlock;
  if (p.rowwise != nullptr && gr < p.rows && gc0 < p.cols) {
    const uint32_t e = e8m0_from_amax(__uint_as_float(row_amax), kMax);
    p.rowwise_scale[gr * p.rowwise_ld + gc0 / kBlock] = static_cast<uint8_t>(e);
    store_block<kFmt>(v, e8m0_encode_factor(e), p.rowwise + gr * p.cols + gc0, p.cols - gc0, p.vec_row);
  }

  // The column block of this thread: source column c0 + t, rows r0 .. r0 + 31.
  const int64_t gc = c0 + t;
  if (p.columnwise != nullptr && gc < p.cols) {
#pragma unroll
    for (int k = 0; k < kBlock; ++k) v[k] = tile.at(k, t);
    const uint32_t col_amax = k2D ? tile_amax[t / kBlock] : mx::amax_bits(v);
    const uint32_t e = e8m0_from_amax(__uint_as_float(col_amax), kMax);
    p.columnwise_scale[gc * p.columnwise_ld + r0 / kBlock] = static_cast<uint8_t>(e);
    store_block<kFmt>(v, e8m0_encode_factor(e), p.columnwise + gc * p.rows + r0, p.rows - r0, p.vec_col);
  }
}

}  // namespace

void quantize_mxfp8(const Mxfp8QuantizeArgs& a, void* stream) {
  if (a.rows == 0 || a.cols == 0 || (a.rowwise == nullptr && a.columnwise == nullptr)) return;
  Params p{};
  p.input = a.input;
  p.rows = a.rows;
  p.cols = a.cols;
  p.tiles_c = ceil_div(a.cols, mx::kTileCols);
  p.rowwise = a.rowwise;
  p.rowwise_scale = a.rowwise_scale_inv;
  p.rowwise_ld = a.rowwise_scale_ld;
  p.columnwise = a.columnwise;
  p.columnwise_scale = a.columnwise_scale_inv;
  p.columnwise_ld = a.columnwise_scale_ld;
  p.vec_row = a.rowwise != nullptr && aligned(a.rowwise, 16) && a.cols % 16 == 0;
  p.vec_col = a.columnwise != nullptr && aligned(a.columnwise, 16) && a.rows % 16 == 0;
  const int64_t tiles = ceil_div(a.rows, mx::kTileRows) * p.tiles_c;
  if (tiles > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "mxfp8_kernel: too many tiles");
  dispatch_source(a.in_dtype, [&](auto in_tag) {
    using T = decltype(in_tag);
    p.vec_in = aligned(a.input, 16) && (a.cols * static_cast<int64_t>(sizeof(T))) % 16 == 0;
    dispatch_fp8(a.out_dtype, [&](auto fmt) {
      constexpr int kFmt = decltype(fmt)::value;
      if (a.tile_2d) {
        mxfp8_kernel<T, kFmt, true><<<static_cast<unsigned>(tiles), kThreads, 0, as_stream(stream)>>>(p);
      } else {
        mxfp8_kernel<T, kFmt, false><<<static_cast<unsigned>(tiles), kThreads, 0, as_stream(stream)>>>(p);
      }
      check_launch("mxfp8_kernel");
    });
  });
}

}  // namespace cuda
}  // namespace te
