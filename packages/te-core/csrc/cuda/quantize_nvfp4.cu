// NVFP4 quantization (kernels_mx.h Nvfp4QuantizeArgs; NUMERICS.md "NVFP4BlockScaling"),
// bit-exact with cpu/quantize_nvfp4.cpp, stochastic rounding and the Hadamard transform included.
//
// Two steps, both stream-ordered: the global amaxes (unless use_existing_amax): amax[0] by te's
// amax kernel, amax[1] the same value (copied) or, for a transformed column-wise copy, by this
// file's kernel in its amax-only form; then the quantize kernel, which reads them back on the
// device. One CTA of 256 threads per 32 x 128 source tile (mx_convert.cuh), one read of the input:
//   row-wise:    thread t owns the 1x16 block (row t / 8, block t % 8): amax, E4M3 scale, 16 E2M1
//                codes = 8 bytes (one 8-byte store where aligned);
//   column-wise: thread t owns 16 consecutive rows (t / 128) of source column t % 128: 8 bytes of a
//                row of the [cols, rows] copy, transformed first by the same rht_forward (and so
//                the same fp32 adds) as the CPU.
// With tile_2d a 16x16 tile's amax is a shared atomicMax over its 16 row blocks; the column-wise
// pass then reproduces the row-wise quantization element for element (same scale, same Philox
// word), which makes the copies transposes of each other as on the CPU.
#include "common/kernels_mx.h"
#include "cuda/amax.cuh"
#include "cuda/mx_convert.cuh"

namespace te {
namespace cuda {
namespace {

constexpr int kBlock = 16;
constexpr int kThreads = 256;  // = the row blocks of a tile = its columns x 2 runs of 16 rows
constexpr int kTiles2D = (mx::kTileRows / kBlock) * (mx::kTileCols / kBlock);

struct Params {
  const void* input;
  int64_t rows, cols, tiles_c;
  uint8_t* rowwise;
  uint8_t* rowwise_scale;
  int64_t rowwise_ld;
  uint8_t* columnwise;
  uint8_t* columnwise_scale;
  int64_t columnwise_ld;
  float* amax;  // [2]
  bool rht, sr;
  uint64_t seed, offset;
  const uint64_t* rng_state;  // {seed, offset} on the device, read in place of seed / offset
  bool vec_in, vec_row, vec_col;
};

// E4M3 block scale byte and the block's encode factor.
__device__ __forceinline__ uint32_t block_scale(uint32_t amax_bits, float s_enc, float* enc) {
  const uint32_t sb = mx::fp8_rn<TE_DTYPE_FLOAT8_E4M3>(nvfp4_block_scale_value(__uint_as_float(amax_bits), s_enc));
  *enc = nvfp4_block_encode(s_enc, fp8_to_float<TE_DTYPE_FLOAT8_E4M3>(static_cast<uint8_t>(sb)));
  return sb;
}

// 16 codes of v * enc (nearest, or stochastic with the words word0 + k * word_step) as 8 bytes,
// stored at dst (n valid elements, even).
__device__ __forceinline__ void store_codes(const float (&v)[kBlock], float enc, const Params& p,
                                            uint64_t word0, uint64_t word_step, uint8_t* dst,
                                            int64_t n, bool vec) {
  uint32_t w[2] = {0u, 0u};
  uint64_t seed = p.seed, offset = p.offset;
  if (p.sr && p.rng_state != nullptr) {
    seed = p.rng_state[0];
    offset = p.rng_state[1];
  }
#pragma unroll
  for (int k = 0; k < kBlock; ++k) {
    const float x = __fmul_rn(v[k], enc);
    const uint32_t code =
        p.sr ? mx::e2m1_sr(x, philox_word(seed, offset, word0 + static_cast<uint64_t>(k) * word_step))
             : mx::e2m1_rn(x);
    w[k / 8] |= code << (4 * (k % 8));
  }
  if (vec && n >= kBlock) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
  } else {
    for (int b = 0; 2 * b < n && b < kBlock / 2; ++b) dst[b] = static_cast<uint8_t>(w[b / 4] >> (8 * (b % 4)));
  }
}

template <typename T, bool k2D, bool kAmaxOnly>
__global__ void __launch_bounds__(kThreads) nvfp4_kernel(const Params p) {
  __shared__ mx::Tile<kBlock> tile;
  __shared__ uint32_t tile_amax[kTiles2D];
  __shared__ uint32_t scratch[kThreads / 32];
  const int t = threadIdx.x;
  const int64_t r0 = (blockIdx.x / p.tiles_c) * mx::kTileRows;
  const int64_t c0 = (blockIdx.x % p.tiles_c) * mx::kTileCols;
  if (k2D && t < kTiles2D) tile_amax[t] = 0u;
  mx::load_tile<T, kBlock, kThreads>(tile, static_cast<const T*>(p.input), p.rows, p.cols, r0, c0,
                                     p.vec_in);
  __syncthreads();
  const int64_t numel = p.rows * p.cols;

  // The column run of this thread: source column c0 + c, rows r0 + 16 run .. + 15.
  const int c = t % mx::kTileCols, run = t / mx::kTileCols;
  const int64_t gc = c0 + c, gr0 = r0 + kBlock * run;
  float v[kBlock];
  if (kAmaxOnly || p.columnwise != nullptr) {
#pragma unroll
    for (int k = 0; k < kBlock; ++k) v[k] = tile.at(kBlock * run + k, c);
    if (p.rht) rht_forward(v);
  }
  if constexpr (kAmaxOnly) {
    // Values outside the matrix are zeros, whose transform is zeros: they raise no max.
    uint32_t m = block_max<kThreads>(mx::amax_bits(v), scratch);
    if (m > 0x7f800000u) m = 0x7fffffffu;  // the CPU's canonical NaN
    if (t == 0) atomic_max_amax(p.amax + 1, m);
    return;
  }

  // The row block of this thread.
  const int row = t / 8, blk = t % 8;
  float u[kBlock];
#pragma unroll
  for (int k = 0; k < kBlock; ++k) u[k] = tile.at(row, blk * kBlock + k);
  uint32_t row_amax = mx::amax_bits(u);
  if constexpr (k2D) {
    atomicMax(&tile_amax[(row / kBlock) * (mx::kTileCols / kBlock) + blk], row_amax);
    __syncthreads();
    row_amax = tile_amax[(row / kBlock) * (mx::kTileCols / kBlock) + blk];
  }
  // 2-D tiles are one quantization: both copies use the global amax of the row-wise one.
  const float s_enc_row = nvfp4_encode_scale(p.amax[k2D && p.rowwise == nullptr ? 1 : 0]);
  const int64_t gr = r0 + row, gc0 = c0 + blk * kBlock;
  if (p.rowwise != nullptr && gr < p.rows && gc0 < p.cols) {
    float enc;
    p.rowwise_scale[gr * p.rowwise_ld + gc0 / kBlock] = static_cast<uint8_t>(block_scale(row_amax, s_enc_row, &enc));
    store_codes(u, enc, p, static_cast<uint64_t>(gr * p.cols + gc0), 1, p.rowwise + (gr * p.cols + gc0) / 2,
                p.cols - gc0, p.vec_row);
  }

  if (p.columnwise != nullptr && gc < p.cols && gr0 < p.rows) {
    float enc;
    uint32_t sb;
    uint64_t word0, step;
    if constexpr (k2D) {
      sb = block_scale(tile_amax[run * (mx::kTileCols / kBlock) + c / kBlock], s_enc_row, &enc);
      word0 = static_cast<uint64_t>(gr0 * p.cols + gc);  // the row-wise copy's words
      step = static_cast<uint64_t>(p.cols);
    } else {
      sb = block_scale(mx::amax_bits(v), nvfp4_encode_scale(p.amax[1]), &enc);
      word0 = static_cast<uint64_t>(numel + gc * p.rows + gr0);
      step = 1;
    }
    p.columnwise_scale[gc * p.columnwise_ld + gr0 / kBlock] = static_cast<uint8_t>(sb);
    store_codes(v, enc, p, word0, step, p.columnwise + (gc * p.rows + gr0) / 2, p.rows - gr0, p.vec_col);
  }
}

template <bool k2D, bool kAmaxOnly>
void launch(const Params& p, int32_t in_dtype, int64_t tiles, cudaStream_t stream) {
  dispatch_source(in_dtype, [&](auto in_tag) {
    using T = decltype(in_tag);
    Params q = p;
    q.vec_in = aligned(p.input, 16) && (p.cols * static_cast<int64_t>(sizeof(T))) % 16 == 0;
    nvfp4_kernel<T, k2D, kAmaxOnly><<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(q);
    check_launch("nvfp4_kernel");
  });
}

}  // namespace

void quantize_nvfp4(const Nvfp4QuantizeArgs& a, void* stream_ptr) {
  const cudaStream_t stream = as_stream(stream_ptr);
  const bool row = a.rowwise != nullptr, col = a.columnwise != nullptr;
  if (!row && !col) return;
  const int64_t numel = a.rows * a.cols;
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
  p.amax = a.amax;
  p.rht = a.columnwise_rht && col;
  p.sr = a.stochastic_rounding;
  p.seed = a.rng_seed;
  p.offset = a.rng_offset;
  p.rng_state = a.rng_state;
  p.vec_row = row && aligned(a.rowwise, 8) && a.cols % 16 == 0;
  p.vec_col = col && aligned(a.columnwise, 8) && a.rows % 16 == 0;
  const int64_t tiles = ceil_div(a.rows, mx::kTileRows) * p.tiles_c;
  if (tiles > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "nvfp4_kernel: too many tiles");

  if (!a.use_existing_amax) {
    if (row) amax_into_zeroed(a.input, a.in_dtype, numel, a.amax, stream);
    if (col && p.rht) {
      check_cuda(cudaMemsetAsync(a.amax + 1, 0, sizeof(float), stream), "cudaMemsetAsync(amax[1])");
      if (numel > 0) launch<false, true>(p, a.in_dtype, tiles, stream);
    } else if (col && row) {
      check_cuda(cudaMemcpyAsync(a.amax + 1, a.amax, sizeof(float), cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync(amax[1] = amax[0])");
    } else if (col) {
      amax_into_zeroed(a.input, a.in_dtype, numel, a.amax + 1, stream);
    }
  }
  if (numel == 0) return;
  if (a.tile_2d) {
    launch<true, false>(p, a.in_dtype, tiles, stream);
  } else {
    launch<false, false>(p, a.in_dtype, tiles, stream);
  }
}

}  // namespace cuda
}  // namespace te
