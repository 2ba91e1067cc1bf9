// MXFP8 quantization (NUMERICS.md "MXFP8BlockScaling"), the reference. Each copy is quantized
// from the source on its own: the row-wise copy [rows, cols] in 1x32 blocks along its rows, the
// column-wise copy [cols, rows] in 1x32 blocks along its rows (the source's 32x1 columns). A
// block's scale byte is e = e8m0_from_amax(block_amax, fp8_max) over its valid elements, stored
// at scale_inv[r * ld + c / 32] of the copy's stored (r, c); q = convert(x * 2^(127 - e)).
// With tile_2d the block amax is that of the block's 32x32 source tile, so both copies use one
// scale per tile (their bytes are then transposes of each other).
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/kernels_mx.h"
#include "common/mx_scaling.h"
#include "cpu/fp_convert.h"

namespace te {
namespace cpu {
namespace {

constexpr int64_t kBlock = 32;

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Source element (r, c) as fp32.
struct Source {
  const void* data;
  int32_t dtype;
  int64_t cols;
  float operator()(int64_t r, int64_t c) const { return load_as_float(data, dtype, r * cols + c); }
};

// amax of every 32x32 tile of the source: [ceil(rows / 32), ceil(cols / 32)].
std::vector<float> tile_amaxes(const Source& x, int64_t rows, int64_t cols) {
  const int64_t tc = (cols + kBlock - 1) / kBlock;
  std::vector<float> t(static_cast<size_t>(((rows + kBlock - 1) / kBlock) * tc), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& m = t[(r / kBlock) * tc + c / kBlock];
      m = nan_max(m, std::fabs(x(r, c)));
    }
  return t;
}

// One copy stored [R, C] whose element (i, j) is get(i, j); `tile(i, jb)` gives the 2-D amax of
// block (i, jb) (nullptr-like empty function for 1-D blocks).
template <typename Get, typename Tile>
void quantize_copy(Get get, Tile tile, bool tile_2d, int64_t R, int64_t C, int32_t fmt,
                   uint8_t* data, uint8_t* scale_inv, int64_t ld) {
  const float fmax = fp8_max(fmt);
  for (int64_t i = 0; i < R; ++i) {
    for (int64_t j0 = 0; j0 < C; j0 += kBlock) {
      const int64_t j1 = min64(j0 + kBlock, C);
      float amax = 0.0f;
      if (tile_2d) {
        amax = tile(i, j0 / kBlock);
      } else {
        for (int64_t j = j0; j < j1; ++j) amax = nan_max(amax, std::fabs(get(i, j)));
      }
      const uint32_t e = e8m0_from_amax(amax, fmax);
      scale_inv[i * ld + j0 / kBlock] = static_cast<uint8_t>(e);
      const float f = e8m0_encode_factor(e);
      for (int64_t j = j0; j < j1; ++j) data[i * C + j] = float_to_fp8(get(i, j) * f, fmt);
    }
  }
}

}  // namespace

void quantize_mxfp8(const Mxfp8QuantizeArgs& a, void* /*stream*/) {
  const int64_t rows = a.rows, cols = a.cols;
  const Source x{a.input, a.in_dtype, cols};
  std::vector<float> tiles;
  const int64_t tiles_c = (cols + kBlock - 1) / kBlock;
  if (a.tile_2d) tiles = tile_amaxes(x, rows, cols);
  if (a.rowwise != nullptr) {
    quantize_copy(x, [&](int64_t i, int64_t jb) { return tiles[(i / kBlock) * tiles_c + jb]; },
                  a.tile_2d, rows, cols, a.out_dtype, a.rowwise, a.rowwise_scale_inv,
                  a.rowwise_scale_ld);
  }
  if (a.columnwise != nullptr) {
    // Stored (i, j) of the column-wise copy is source (j, i).
    quantize_copy([&](int64_t i, int64_t j) { return x(j, i); },
                  [&](int64_t i, int64_t jb) { return tiles[jb * tiles_c + i / kBlock]; },
                  a.tile_2d, cols, rows, a.out_dtype, a.columnwise, a.columnwise_scale_inv,
                  a.columnwise_scale_ld);
  }
}

}  // namespace cpu
}  // namespace te
