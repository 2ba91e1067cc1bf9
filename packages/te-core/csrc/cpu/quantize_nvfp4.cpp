// NVFP4 quantization (NUMERICS.md "NVFP4BlockScaling"), the reference.
//
// Per copy: a global amax (amax[0] row-wise, amax[1] column-wise; computed with NaN propagating,
// or read with use_existing_amax) gives S_enc; per block of 16 along the copy's stored rows (or
// 16x16 source tile with tile_2d) s_block = E4M3((block_amax / 6) * S_enc) is stored at
// scale_inv[r * ld + c / 16], enc = S_enc / s_block, q = E2M1(x * enc), to nearest even or
// stochastically with the Philox word of the element (row-wise copy: word = its index n in the
// copy; column-wise copy: word = rows * cols + n; with tile_2d both copies are the one row-wise
// quantization, so both use the row-wise words).
//
// The column-wise copy [cols, rows] quantizes the source's transpose, or with columnwise_rht the
// transform of it: each run of 16 consecutive elements of a stored row (16 source rows of one
// column) through rht_forward, its amax and block amaxes taken after the transform.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/kernels.h"
#include "common/kernels_mx.h"
#include "common/mx_scaling.h"
#include "cpu/fp_convert.h"
#include "cpu/mx_convert.h"

namespace te {
namespace cpu {
namespace {

constexpr int64_t kBlock = 16;

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// NaN-propagating amax of a matrix given by get(i, j), a NaN made canonical so that the value does
// not depend on which NaN came first.
template <typename Get>
float matrix_amax(Get get, int64_t R, int64_t C) {
  float m = 0.0f;
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) m = nan_max(m, std::fabs(get(i, j)));
  return m == m ? m : bits_float(kCanonicalNanF32);
}

struct Rounding {
  bool stochastic;
  uint64_t seed, offset;
  uint64_t word_base;  // the word of stored element 0
  uint32_t code(float v, int64_t n) const {
    if (!stochastic) return float_to_e2m1(v);
    return float_to_e2m1_stochastic(
        v, philox_word(seed, offset, word_base + static_cast<uint64_t>(n)));
  }
};

// One copy stored [R, C] with element (i, j) = get(i, j); block (i, j / 16) has amax
// block_amax(i, jb) when given (2-D tiles), else its own.
template <typename Get, typename TileAmax>
void quantize_copy(Get get, TileAmax tile_amax, bool tile_2d, int64_t R, int64_t C, float s_enc,
                   const Rounding& rounding, uint8_t* data, uint8_t* scale_inv, int64_t ld) {
  for (int64_t i = 0; i < R; ++i) {
    for (int64_t j0 = 0; j0 < C; j0 += kBlock) {
      const int64_t j1 = min64(j0 + kBlock, C);
      float amax = 0.0f;
      if (tile_2d) {
        amax = tile_amax(i, j0 / kBlock);
      } else {
        for (int64_t j = j0; j < j1; ++j) amax = nan_max(amax, std::fabs(get(i, j)));
      }
      const uint8_t sb = float_to_fp8(nvfp4_block_scale_value(amax, s_enc), TE_DTYPE_FLOAT8_E4M3);
      scale_inv[i * ld + j0 / kBlock] = sb;
      const float enc = nvfp4_block_encode(s_enc, fp8_to_float(sb, TE_DTYPE_FLOAT8_E4M3));
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t n = i * C + j;
        set_e2m1(data, n, rounding.code(get(i, j) * enc, n));
      }
    }
  }
}

}  // namespace

void quantize_nvfp4(const Nvfp4QuantizeArgs& a, void* /*stream*/) {
  const int64_t rows = a.rows, cols = a.cols;
  auto x = [&](int64_t r, int64_t c) { return load_as_float(a.input, a.in_dtype, r * cols + c); };
  const bool row = a.rowwise != nullptr, col = a.columnwise != nullptr;
  const bool state = a.stochastic_rounding && a.rng_state != nullptr;
  Rounding rounding{a.stochastic_rounding, state ? a.rng_state[0] : a.rng_seed,
                    state ? a.rng_state[1] : a.rng_offset, 0};
  if (rows == 0 || cols == 0) {  // no data and no scale is stored; an empty amax is 0
    if (!a.use_existing_amax) {
      if (row) a.amax[0] = 0.0f;
      if (col) a.amax[1] = 0.0f;
    }
    return;
  }

  if (a.tile_2d) {
    // One quantization of the source; the column-wise copy is its transpose, nibble for nibble.
    const float amax = a.use_existing_amax ? a.amax[row ? 0 : 1] : matrix_amax(x, rows, cols);
    if (!a.use_existing_amax) {
      if (row) a.amax[0] = amax;
      if (col) a.amax[1] = amax;
    }
    const float s_enc = nvfp4_encode_scale(amax);
    const int64_t tc = (cols + kBlock - 1) / kBlock;
    std::vector<float> tiles(static_cast<size_t>(((rows + kBlock - 1) / kBlock) * tc), 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        float& m = tiles[(r / kBlock) * tc + c / kBlock];
        m = nan_max(m, std::fabs(x(r, c)));
      }
    std::vector<uint8_t> q(static_cast<size_t>((rows * cols + 1) / 2));
    std::vector<uint8_t> s(static_cast<size_t>(rows * tc));
    quantize_copy(x, [&](int64_t i, int64_t jb) { return tiles[(i / kBlock) * tc + jb]; }, true,
                  rows, cols, s_enc, rounding, q.data(), s.data(), tc);
    if (row) {
      std::memcpy(a.rowwise, q.data(), q.size());
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(a.rowwise_scale_inv + r * a.rowwise_scale_ld, s.data() + r * tc,
                    static_cast<size_t>(tc));
    }
    if (col) {
      for (int64_t c = 0; c < cols; ++c) {
        for (int64_t r = 0; r < rows; ++r)
          set_e2m1(a.columnwise, c * rows + r, e2m1_at(q.data(), r * cols + c));
        for (int64_t ib = 0; ib * kBlock < rows; ++ib)
          a.columnwise_scale_inv[c * a.columnwise_scale_ld + ib] = s[ib * kBlock * tc + c / kBlock];
      }
    }
    return;
  }

  if (row) {
    if (!a.use_existing_amax) a.amax[0] = matrix_amax(x, rows, cols);
    quantize_copy(x, [](int64_t, int64_t) { return 0.0f; }, false, rows, cols,
                  nvfp4_encode_scale(a.amax[0]), rounding, a.rowwise, a.rowwise_scale_inv,
                  a.rowwise_scale_ld);
  }
  if (col) {
    // The stored copy's values: the transpose, or its transform in runs of 16 along each row.
    std::vector<float> t(static_cast<size_t>(rows * cols));
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < rows; ++r) t[c * rows + r] = x(r, c);
      if (a.columnwise_rht) {
        for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
          float v[16];
          for (int k = 0; k < 16; ++k) v[k] = t[c * rows + r0 + k];
          rht_forward(v);
          for (int k = 0; k < 16; ++k) t[c * rows + r0 + k] = v[k];
        }
      }
    }
    auto get = [&](int64_t i, int64_t j) { return t[i * rows + j]; };
    if (!a.use_existing_amax) a.amax[1] = matrix_amax(get, cols, rows);
    rounding.word_base = static_cast<uint64_t>(rows * cols);
    quantize_copy(get, [](int64_t, int64_t) { return 0.0f; }, false, cols, rows,
                  nvfp4_encode_scale(a.amax[1]), rounding, a.columnwise, a.columnwise_scale_inv,
                  a.columnwise_scale_ld);
  }
}

}  // namespace cpu
}  // namespace te
