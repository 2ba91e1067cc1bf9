#include "common/layout.h"

#include "common/error.h"
#include "common/validate.h"
#include "te/tensor.h"

namespace te {

std::vector<int64_t> quantized_shape(int32_t scaling_mode, int32_t part, const int64_t* shape,
                                     int32_t ndim) {
  const int64_t cols = ndim == 0 ? 1 : shape[ndim - 1];
  int64_t rows = 1;
  for (int32_t i = 0; i + 1 < ndim; ++i) rows *= shape[i];
  TE_CHECK_ARG(scaling_mode >= TE_SCALING_PER_TENSOR && scaling_mode <= TE_SCALING_NVFP4_1D,
               "scaling_mode: expected a te_scaling_mode value 0..4, got ", scaling_mode);
  if (is_mx_mode(scaling_mode)) {
    // Each copy is blocked along its own rows: the column-wise copy is the row-wise layout of
    // the [K, M] transpose.
    const int64_t b = mx_block(scaling_mode);
    switch (part) {
      case TE_PART_ROWWISE_DATA: return std::vector<int64_t>(shape, shape + ndim);
      case TE_PART_COLUMNWISE_DATA: return {cols, rows};
      case TE_PART_ROWWISE_SCALE_INV:
        return {round_up(rows, kMxScaleRowAlign), round_up(ceil_div(cols, b), kMxScaleColAlign)};
      case TE_PART_COLUMNWISE_SCALE_INV:
        return {round_up(cols, kMxScaleRowAlign), round_up(ceil_div(rows, b), kMxScaleColAlign)};
    }
  }
  switch (part) {
    case TE_PART_ROWWISE_DATA: return std::vector<int64_t>(shape, shape + ndim);
    case TE_PART_COLUMNWISE_DATA: return {cols, rows};
    case TE_PART_ROWWISE_SCALE_INV:
      if (scaling_mode == TE_SCALING_PER_TENSOR) return {1};
      if (scaling_mode == TE_SCALING_BLOCK_1D)
        return {ceil_div(cols, kBlockSize), round_up(rows, kScaleAlign)};
      return {ceil_div(rows, kBlockSize), round_up(ceil_div(cols, kBlockSize), kScaleAlign)};
    case TE_PART_COLUMNWISE_SCALE_INV:
      if (scaling_mode == TE_SCALING_PER_TENSOR) return {1};
      if (scaling_mode == TE_SCALING_BLOCK_1D)
        return {ceil_div(rows, kBlockSize), round_up(cols, kScaleAlign)};
      return {ceil_div(cols, kBlockSize), round_up(ceil_div(rows, kBlockSize), kScaleAlign)};
  }
  fail(TE_ERROR_INVALID_ARGUMENT, "part: expected a te_quantized_part value 0..3, got ", part);
}

}  // namespace te

extern "C" {

te_status te_quantized_shape(int32_t scaling_mode, int32_t part, const int64_t* shape,
                             int32_t ndim, int64_t* out_shape, int32_t* out_ndim) {
  return te::guard("te_quantized_shape", [&] {
    TE_CHECK_ARG(ndim >= 0 && ndim <= TE_MAX_DIMS, "ndim: expected 0..", TE_MAX_DIMS, ", got ",
                 ndim);
    TE_CHECK_ARG(shape != nullptr || ndim == 0, "shape: expected ", ndim, " sizes, got NULL");
    TE_CHECK_ARG(out_shape != nullptr && out_ndim != nullptr,
                 "out_shape, out_ndim: expected output pointers, got NULL");
    for (int32_t i = 0; i < ndim; ++i) {
      TE_CHECK_ARG(shape[i] >= 0, "shape: expected non-negative sizes, got ",
                   te::shape_string(shape, ndim));
    }
    int64_t n = 0;
    TE_CHECK_ARG(te::checked_numel(shape, ndim, &n), "shape: expected an element count that fits "
                 "in int64, got ", te::shape_string(shape, ndim));
    const std::vector<int64_t> result = te::quantized_shape(scaling_mode, part, shape, ndim);
    for (size_t i = 0; i < result.size(); ++i) out_shape[i] = result[i];
    *out_ndim = static_cast<int32_t>(result.size());
  });
}

te_status te_dtype_bits(int32_t dtype, int32_t* bits) {
  return te::guard("te_dtype_bits", [&] {
    TE_CHECK_ARG(bits != nullptr, "bits: expected an output pointer, got NULL");
    *bits = te::dtype_bits(dtype);
  });
}

}  // extern "C"
