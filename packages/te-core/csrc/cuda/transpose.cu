// output[c][r] = input[r][c] for input [rows, cols] of 1-, 2- or 4-byte elements.
//
// 1-byte elements (FP8 data: making a column-wise copy from a row-wise one) use the 128x128 tile
// of cast_tile.cuh with the conversion left out: 8-byte loads whose warp accesses are 128-byte row
// segments, a conflict-free swizzled shared tile, and 16-byte stores of whole 128-byte output rows.
// 2- and 4-byte elements use the classic 32x32 shared-memory tile (padded row against bank
// conflicts); a warp moves 64 or 128 contiguous bytes per access there, already whole sectors.
#include "common/kernels.h"
#include "cuda/cast_tile.cuh"
#include "cuda/cuda_utils.cuh"

namespace te {
namespace cuda {
namespace {

struct ByteParams {
  const uint8_t* in;
  uint8_t* out;
  int64_t rows, cols, tiles_c;
  bool vec_in, vec_out;
};

__global__ void __launch_bounds__(tile::kThreads) transpose_bytes_kernel(const ByteParams p) {
  __shared__ tile::Smem sm;
  const int tid = threadIdx.x, g = tid & 7, tr = tid >> 3;
  const int64_t r0 = (blockIdx.x / p.tiles_c) * tile::kTile, c0 = (blockIdx.x % p.tiles_c) * tile::kTile;
  uint2 q[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = r0 + 4 * tr + i, c = c0 + 64 * h + 8 * g;
      q[i][h] = make_uint2(0, 0);
      if (r < p.rows && c < p.cols) {
        const uint8_t* src = p.in + r * p.cols + c;
        if (p.vec_in && c + 8 <= p.cols) {
          q[i][h] = __ldg(reinterpret_cast<const uint2*>(src));
        } else {
          const int64_t n = p.cols - c;
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            if (k < n) {
              const uint32_t b = static_cast<uint32_t>(__ldg(src + k)) << (8 * (k % 4));
              if (k < 4) q[i][h].x |= b; else q[i][h].y |= b;
            }
          }
        }
      }
    }
  }
  tile::stash_transposed(sm, q, g, tr);
  __syncthreads();
  tile::store_transposed(sm, p.out, p.rows, p.cols, r0, c0, p.vec_out);
}

constexpr int kT = 32;

template <typename E>
__global__ void __launch_bounds__(kT * 8) transpose_kernel(const E* __restrict__ in, E* __restrict__ out,
                                                           int64_t rows, int64_t cols, int64_t tiles_c) {
  __shared__ E tile[kT][kT + 1];
  const int64_t r0 = (blockIdx.x / tiles_c) * kT, c0 = (blockIdx.x % tiles_c) * kT;
  const int tx = threadIdx.x % kT, ty = threadIdx.x / kT;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t r = r0 + ty + 8 * j, c = c0 + tx;
    if (r < rows && c < cols) tile[ty + 8 * j][tx] = in[r * cols + c];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t c = c0 + ty + 8 * j, r = r0 + tx;
    if (r < rows && c < cols) out[c * rows + r] = tile[tx][ty + 8 * j];
  }
}

}  // namespace

void transpose(const void* input, void* output, int64_t rows, int64_t cols, int32_t elem_bytes,
               void* stream_ptr) {
  if (rows == 0 || cols == 0) return;
  const cudaStream_t stream = as_stream(stream_ptr);
  if (elem_bytes == 1) {
    ByteParams p{static_cast<const uint8_t*>(input), static_cast<uint8_t*>(output), rows, cols,
                 ceil_div(cols, tile::kTile), false, false};
    p.vec_in = aligned(input, 8) && cols % 8 == 0;
    p.vec_out = aligned(output, 16) && rows % 16 == 0;
    const int64_t tiles = ceil_div(rows, tile::kTile) * p.tiles_c;
    if (tiles > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "transpose_bytes_kernel: too many tiles");
    transpose_bytes_kernel<<<static_cast<unsigned>(tiles), tile::kThreads, 0, stream>>>(p);
    check_launch("transpose_bytes_kernel");
    return;
  }
  const int64_t tiles_c = ceil_div(cols, kT), tiles = ceil_div(rows, kT) * tiles_c;
  if (tiles > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "transpose_kernel: too many tiles");
  if (elem_bytes == 2) {
    transpose_kernel<uint16_t><<<static_cast<unsigned>(tiles), kT * 8, 0, stream>>>(
        static_cast<const uint16_t*>(input), static_cast<uint16_t*>(output), rows, cols, tiles_c);
  } else if (elem_bytes == 4) {
    transpose_kernel<uint32_t><<<static_cast<unsigned>(tiles), kT * 8, 0, stream>>>(
        static_cast<const uint32_t*>(input), static_cast<uint32_t*>(output), rows, cols, tiles_c);
  } else {
    fail(TE_ERROR_INTERNAL, "transpose: unexpected element size ", elem_bytes);
  }
  check_launch("transpose_kernel");
}

}  // namespace cuda
}  // namespace te
