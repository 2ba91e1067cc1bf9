// te_quantize: validates the request against the layout table (common/layout.h) and hands the
// matching kernel of the tensor's device a flat argument struct.
#include "te/quantize.h"

#include <string>

#include "common/error.h"
#include "common/kernels.h"
#include "common/layout.h"
#include "common/validate.h"

namespace te {
namespace {

constexpr std::initializer_list<int32_t> kSourceDtypes = {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16,
                                                          TE_DTYPE_BFLOAT16};
constexpr std::initializer_list<int32_t> kFp8Dtypes = {TE_DTYPE_FLOAT8_E4M3,
                                                       TE_DTYPE_FLOAT8_E5M2};

te_quant_config read_config(const te_quant_config* config) {
  te_quant_config c = te_quant_config_init();
  if (config == nullptr) return c;
  check_struct_size(config->struct_size, sizeof(te_quant_config), "config");
  c = *config;
  TE_CHECK_ARG(c.amax_epsilon >= 0.0f, "config->amax_epsilon: expected a value >= 0, got ",
               c.amax_epsilon);
  TE_CHECK_ARG(!c.use_existing_amax || c.compute_scale,
               "config->use_existing_amax: only meaningful with compute_scale = 1 (current "
               "scaling), got compute_scale = 0");
  return c;
}

// Checks one present part of `q` against the source shape, returning its data pointer.
void check_part(const te_tensor& part, const std::string& name, int32_t mode, int32_t which,
                const te_tensor& input, std::initializer_list<int32_t> dtypes) {
  check_tensor(part, name);
  check_dtype(part, name, dtypes);
  check_same_device(part, name, input.device, "input");
  const std::vector<int64_t> expected = quantized_shape(mode, which, input.shape, input.ndim);
  const bool data = which == TE_PART_ROWWISE_DATA || which == TE_PART_COLUMNWISE_DATA;
  if (which == TE_PART_ROWWISE_DATA) {
    int64_t rows, cols, part_rows, part_cols;
    matrix_dims(input, &rows, &cols);
    matrix_dims(part, &part_rows, &part_cols);
    TE_CHECK_ARG(part_rows == rows && part_cols == cols, name, ".shape: expected ",
                 shape_string(expected), " (the input's shape, or any with the same last dim "
                 "and element count), got ", shape_string(part.shape, part.ndim));
  } else if (mode == TE_SCALING_PER_TENSOR && !data) {
    check_numel(part, name, 1);
  } else {
    check_shape(part, name, expected,
                data ? "[K, M]: the transposed copy of the [M, K] input"
                     : "the block-scale layout of te/tensor.h for this input");
  }
}

void check_scalar(const te_tensor& t, const std::string& name, const te_tensor& input) {
  check_tensor(t, name);
  check_dtype(t, name, {TE_DTYPE_FLOAT32});
  check_numel(t, name, 1);
  check_same_device(t, name, input.device, "input");
}

void quantize(const te_tensor* input, te_quantized_tensor* output, const te_quant_config* config,
              void* stream) {
  check_tensor(input, "input");
  check_dtype(*input, "input", kSourceDtypes);
  TE_CHECK_ARG(output != nullptr, "output: expected a quantized tensor descriptor, got NULL");
  check_struct_size(output->struct_size, sizeof(te_quantized_tensor), "output");
  const te_quant_config cfg = read_config(config);
  const int32_t mode = output->scaling_mode;
  const bool rowwise = present(output->rowwise_data);
  const bool columnwise = present(output->columnwise_data);

  // The layout query rejects unknown and unimplemented modes with the right status.
  quantized_shape(mode, TE_PART_ROWWISE_DATA, input->shape, input->ndim);
  TE_CHECK_ARG(rowwise || columnwise || numel(*input) == 0,
               "output: expected rowwise_data and/or columnwise_data, got neither");
  if (rowwise) {
    check_part(output->rowwise_data, "output->rowwise_data", mode, TE_PART_ROWWISE_DATA, *input,
               kFp8Dtypes);
    check_part(output->rowwise_scale_inv, "output->rowwise_scale_inv", mode,
               TE_PART_ROWWISE_SCALE_INV, *input, {TE_DTYPE_FLOAT32});
  }
  if (columnwise) {
    check_part(output->columnwise_data, "output->columnwise_data", mode,
               TE_PART_COLUMNWISE_DATA, *input, kFp8Dtypes);
    check_part(output->columnwise_scale_inv, "output->columnwise_scale_inv", mode,
               TE_PART_COLUMNWISE_SCALE_INV, *input, {TE_DTYPE_FLOAT32});
  }
  TE_CHECK_ARG(!(rowwise && columnwise) ||
                   output->rowwise_data.dtype == output->columnwise_data.dtype,
               "output->columnwise_data.dtype: expected the row-wise copy's ",
               dtype_name(output->rowwise_data.dtype), ", got ",
               dtype_name(output->columnwise_data.dtype));
  const int32_t out_dtype = rowwise ? output->rowwise_data.dtype : output->columnwise_data.dtype;
  int64_t rows, cols;
  matrix_dims(*input, &rows, &cols);
  const std::string mode_name = scaling_mode_name(mode);

  if (mode == TE_SCALING_PER_TENSOR) {
    PerTensorQuantizeArgs a{};
    a.input = input->data;
    a.in_dtype = input->dtype;
    a.rows = rows;
    a.cols = cols;
    a.out_dtype = out_dtype;
    a.rowwise = output->rowwise_data.data;
    a.columnwise = output->columnwise_data.data;
    // A copy's scale_inv was validated only if the copy is present; never pass it otherwise.
    a.rowwise_scale_inv =
        rowwise ? static_cast<float*>(output->rowwise_scale_inv.data) : nullptr;
    a.columnwise_scale_inv =
        columnwise ? static_cast<float*>(output->columnwise_scale_inv.data) : nullptr;
    a.current = cfg.compute_scale != 0;
    a.use_existing_amax = cfg.use_existing_amax != 0;
    a.force_pow2_scales = cfg.force_pow2_scales != 0;
    a.amax_epsilon = cfg.amax_epsilon;
    if (a.current) {
      TE_CHECK_ARG(present(output->amax), "output->amax: current scaling (config->compute_scale"
                   " = 1) needs an fp32 [1] amax buffer, got NULL");
    } else {
      TE_CHECK_ARG(present(output->scale), "output->scale: delayed scaling (config->compute_scale"
                   " = 0) needs the fp32 [1] scale to quantize with, got NULL");
    }
    if (present(output->amax)) check_scalar(output->amax, "output->amax", *input);
    if (present(output->scale)) check_scalar(output->scale, "output->scale", *input);
    a.amax = static_cast<float*>(output->amax.data);
    a.scale = static_cast<float*>(output->scale.data);
    dispatch(input->device, "input", [&] { cpu::quantize_per_tensor(a, stream); },
             [&] { cuda::quantize_per_tensor(a, stream); });
    return;
  }

  TE_CHECK_ARG(!present(output->amax), "output->amax: expected NULL for scaling mode ",
               mode_name, " (block scales are computed per block), got a buffer");
  TE_CHECK_ARG(!present(output->scale), "output->scale: expected NULL for scaling mode ",
               mode_name, " (block scales are computed per block), got a buffer");
  TE_CHECK_ARG(!cfg.use_existing_amax, "config->use_existing_amax: not supported by scaling mode ",
               mode_name, " (per-block amaxes are always computed)");
  BlockQuantizeArgs a{};
  a.input = input->data;
  a.in_dtype = input->dtype;
  a.rows = rows;
  a.cols = cols;
  a.out_dtype = out_dtype;
  a.block_dim = mode == TE_SCALING_BLOCK_1D ? 1 : 2;
  a.rowwise = output->rowwise_data.data;
  a.rowwise_scale_inv = rowwise ? static_cast<float*>(output->rowwise_scale_inv.data) : nullptr;
  a.rowwise_scale_ld = rowwise ? output->rowwise_scale_inv.shape[1] : 0;
  a.columnwise = output->columnwise_data.data;
  a.columnwise_scale_inv =
      columnwise ? static_cast<float*>(output->columnwise_scale_inv.data) : nullptr;
  a.columnwise_scale_ld = columnwise ? output->columnwise_scale_inv.shape[1] : 0;
  a.force_pow2_scales = cfg.force_pow2_scales != 0;
  a.amax_epsilon = cfg.amax_epsilon;
  dispatch(input->device, "input", [&] { cpu::quantize_block(a, stream); },
           [&] { cuda::quantize_block(a, stream); });
}

}  // namespace
}  // namespace te

extern "C" te_status te_quantize(const te_tensor* input, te_quantized_tensor* output,
                                 const te_quant_config* config, void* stream) {
  return te::guard("te_quantize", [&] { te::quantize(input, output, config, stream); });
}
