// output[c][r] = input[r][c] for a row-major [rows, cols] input of 1-, 2- or 4-byte elements.
// Square tiles keep both the reads and the strided writes within a few cache lines.
#include <cstdint>

#include "common/kernels.h"

namespace te {
namespace cpu {
namespace {

constexpr int64_t kTile = 32;

template <typename T>
void transpose_tiled(const T* in, T* out, int64_t rows, int64_t cols) {
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = r0 + kTile < rows ? r0 + kTile : rows;
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = c0 + kTile < cols ? c0 + kTile : cols;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) out[c * rows + r] = in[r * cols + c];
    }
  }
}

}  // namespace

void transpose(const void* input, void* output, int64_t rows, int64_t cols, int32_t elem_bytes,
               void* /*stream*/) {
  switch (elem_bytes) {
    case 1:
      transpose_tiled(static_cast<const uint8_t*>(input), static_cast<uint8_t*>(output), rows,
                      cols);
      break;
    case 2:
      transpose_tiled(static_cast<const uint16_t*>(input), static_cast<uint16_t*>(output), rows,
                      cols);
      break;
    case 4:
      transpose_tiled(static_cast<const uint32_t*>(input), static_cast<uint32_t*>(output), rows,
                      cols);
      break;
  }
}

}  // namespace cpu
}  // namespace te
