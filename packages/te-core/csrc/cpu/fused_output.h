// How a CPU fused op writes its fp32 result: round it into a high-precision buffer, or run the
// reference quantize kernels on it. Going through quantize_per_tensor / quantize_block (rather
// than a copy of their rules) makes "norm/activation then quantize" and the fused op bit-identical
// by construction, amax and scale updates included.
#pragma once

#include <cstdint>
#include <vector>

#include "common/kernels.h"
#include "cpu/fp_convert.h"
#include "te/tensor.h"

namespace te {
namespace cpu {

inline void write_fused_output(const FusedOutput& out, const float* result, int64_t rows,
                               int64_t cols) {
  if (out.kind == kFusedHighPrecision) {
    for (int64_t i = 0; i < rows * cols; ++i) store_from_float(out.data, out.dtype, i, result[i]);
  } else if (out.kind == kFusedPerTensor) {
    PerTensorQuantizeArgs a = out.per_tensor;
    a.input = result;
    a.in_dtype = TE_DTYPE_FLOAT32;
    quantize_per_tensor(a, nullptr);
  } else {
    BlockQuantizeArgs a = out.block;
    a.input = result;
    a.in_dtype = TE_DTYPE_FLOAT32;
    quantize_block(a, nullptr);
  }
}

// Column sums of a fp32 [rows, cols] matrix, rows in index order, rounded once into `dbias`.
inline void write_column_sums(const float* m, int64_t rows, int64_t cols, void* dbias,
                              int32_t dbias_dtype) {
  std::vector<float> sum(static_cast<size_t>(cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) sum[c] += m[r * cols + c];
  for (int64_t c = 0; c < cols; ++c) store_from_float(dbias, dbias_dtype, c, sum[c]);
}

}  // namespace cpu
}  // namespace te
