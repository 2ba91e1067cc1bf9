// plan_quantize / plan_fused_output (quantize_output.h): the checks of te_quantize's output,
// against the layout table (common/layout.h), and the flat kernel arguments they produce.
#include "api/quantize_output.h"

#include <cstddef>
#include <string>

#include "common/error.h"
#include "common/layout.h"
#include "common/validate.h"

namespace te {
namespace {

constexpr std::initializer_list<int32_t> kFp8Dtypes = {TE_DTYPE_FLOAT8_E4M3,
                                                       TE_DTYPE_FLOAT8_E5M2};

// Checks one present part of `q` against the source shape.
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

}  // namespace

te_quant_config read_quant_config(const te_quant_config* config, const std::string& name) {
  te_quant_config c = te_quant_config_init();
  if (config == nullptr) return c;
  read_versioned(*config, offsetof(te_quant_config, with_2d_quantization), name.c_str(), &c);
  TE_CHECK_ARG(c.amax_epsilon >= 0.0f, name, "->amax_epsilon: expected a value >= 0, got ",
               c.amax_epsilon);
  TE_CHECK_ARG(!c.use_existing_amax || c.compute_scale, name,
               "->use_existing_amax: only meaningful with compute_scale = 1 (current "
               "scaling), got compute_scale = 0");
  TE_CHECK_ARG(c.with_2d_quantization == 0 || c.with_2d_quantization == 1, name,
               "->with_2d_quantization: expected 0 or 1, got ", c.with_2d_quantization);
  TE_CHECK_ARG(c.stochastic_rounding == 0 || c.stochastic_rounding == 1, name,
               "->stochastic_rounding: expected 0 or 1, got ", c.stochastic_rounding);
  TE_CHECK_ARG(!present(c.rng_state) || c.stochastic_rounding, name,
               "->rng_state: only read with stochastic_rounding = 1, got a buffer with 0");
  TE_CHECK_ARG(c.reset_amax == 0 || c.reset_amax == 1, name,
               "->reset_amax: expected 0 or 1, got ", c.reset_amax);
  TE_CHECK_ARG(!c.reset_amax || !c.compute_scale, name,
               "->reset_amax: only for delayed scaling (compute_scale = 0; current scaling "
               "always writes amax), got compute_scale = 1");
  return c;
}

void plan_quantize(const te_tensor& source, te_quantized_tensor* output,
                   const te_quant_config* config, const std::string& name,
                   const std::string& config_name, FusedOutput* out) {
  TE_CHECK_ARG(output != nullptr, name, ": expected a quantized tensor descriptor, got NULL");
  check_struct_size(output->struct_size, kQuantizedTensorV1Size, name.c_str());
  const int32_t mode = output->scaling_mode;
  if (is_mx_mode(mode)) {
    fail(TE_ERROR_UNSUPPORTED, name, "->scaling_mode: ", scaling_mode_name(mode),
         " output from a fused op is not implemented; write the result in high precision and "
         "quantize it with te_quantize");
  }
  const te_quant_config cfg = read_quant_config(config, config_name);
  TE_CHECK_ARG(!cfg.with_2d_quantization, config_name,
               "->with_2d_quantization: only for mxfp8_1d and nvfp4_1d (block_2d is its own "
               "scaling mode), got 1 with scaling mode ", scaling_mode_name(mode));
  TE_CHECK_ARG(!cfg.stochastic_rounding, config_name,
               "->stochastic_rounding: only for nvfp4_1d, got 1 with scaling mode ",
               scaling_mode_name(mode));
  TE_CHECK_ARG(!columnwise_rht_of(*output), name,
               "->columnwise_rht: only for nvfp4_1d, got 1 with scaling mode ",
               scaling_mode_name(mode));
  const bool rowwise = present(output->rowwise_data);
  const bool columnwise = present(output->columnwise_data);

  // The layout query rejects unknown and unimplemented modes with the right status.
  quantized_shape(mode, TE_PART_ROWWISE_DATA, source.shape, source.ndim);
  TE_CHECK_ARG(rowwise || columnwise || numel(source) == 0, name,
               ": expected rowwise_data and/or columnwise_data, got neither");
  if (rowwise) {
    check_part(output->rowwise_data, name + "->rowwise_data", mode, TE_PART_ROWWISE_DATA, source,
               kFp8Dtypes);
    check_part(output->rowwise_scale_inv, name + "->rowwise_scale_inv", mode,
               TE_PART_ROWWISE_SCALE_INV, source, {TE_DTYPE_FLOAT32});
  }
  if (columnwise) {
    check_part(output->columnwise_data, name + "->columnwise_data", mode,
               TE_PART_COLUMNWISE_DATA, source, kFp8Dtypes);
    check_part(output->columnwise_scale_inv, name + "->columnwise_scale_inv", mode,
               TE_PART_COLUMNWISE_SCALE_INV, source, {TE_DTYPE_FLOAT32});
  }
  TE_CHECK_ARG(!(rowwise && columnwise) ||
                   output->rowwise_data.dtype == output->columnwise_data.dtype,
               name, "->columnwise_data.dtype: expected the row-wise copy's ",
               dtype_name(output->rowwise_data.dtype), ", got ",
               dtype_name(output->columnwise_data.dtype));
  const int32_t out_dtype = rowwise ? output->rowwise_data.dtype : output->columnwise_data.dtype;
  int64_t rows, cols;
  matrix_dims(source, &rows, &cols);
  const std::string mode_name = scaling_mode_name(mode);

  *out = FusedOutput{};
  if (mode == TE_SCALING_PER_TENSOR) {
    out->kind = kFusedPerTensor;
    PerTensorQuantizeArgs& a = out->per_tensor;
    a.input = source.data;
    a.in_dtype = source.dtype;
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
      TE_CHECK_ARG(present(output->amax), name, "->amax: current scaling (", config_name,
                   "->compute_scale = 1) needs an fp32 [1] amax buffer, got NULL");
    } else {
      TE_CHECK_ARG(present(output->scale), name, "->scale: delayed scaling (", config_name,
                   "->compute_scale = 0) needs the fp32 [1] scale to quantize with, got NULL");
    }
    if (present(output->amax)) check_scalar(output->amax, name + "->amax", source);
    if (present(output->scale)) check_scalar(output->scale, name + "->scale", source);
    TE_CHECK_ARG(!cfg.reset_amax || present(output->amax), name, "->amax: ", config_name,
                 "->reset_amax = 1 needs the fp32 [1] amax buffer to write, got NULL");
    a.amax = static_cast<float*>(output->amax.data);
    a.scale = static_cast<float*>(output->scale.data);
    out->reset_amax = cfg.reset_amax != 0;
    return;
  }

  TE_CHECK_ARG(!present(output->amax), name, "->amax: expected NULL for scaling mode ",
               mode_name, " (block scales are computed per block), got a buffer");
  TE_CHECK_ARG(!present(output->scale), name, "->scale: expected NULL for scaling mode ",
               mode_name, " (block scales are computed per block), got a buffer");
  TE_CHECK_ARG(!cfg.use_existing_amax, config_name,
               "->use_existing_amax: not supported by scaling mode ", mode_name,
               " (per-block amaxes are always computed)");
  TE_CHECK_ARG(!cfg.reset_amax, config_name, "->reset_amax: not supported by scaling mode ",
               mode_name, " (it has no amax)");
  out->kind = kFusedBlock;
  BlockQuantizeArgs& a = out->block;
  a.input = source.data;
  a.in_dtype = source.dtype;
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
}

void reset_amax_if_asked(const FusedOutput& out, const te_device& device, void* stream) {
  if (out.kind != kFusedPerTensor || !out.reset_amax) return;
  // The amax of no elements is 0: the backends' own zeroing of an amax slot.
  float* amax = out.per_tensor.amax;
  dispatch(device, "amax", [&] { cpu::amax(nullptr, TE_DTYPE_FLOAT32, 0, amax, stream); },
           [&] { cuda::amax(nullptr, TE_DTYPE_FLOAT32, 0, amax, stream); });
}

FusedOutput plan_fused_output(const te_tensor& shape, te_quantized_tensor* output,
                              const te_quant_config* config, const std::string& name,
                              const std::string& config_name) {
  TE_CHECK_ARG(output != nullptr, name, ": expected a quantized tensor descriptor, got NULL");
  check_struct_size(output->struct_size, kQuantizedTensorV1Size, name.c_str());
  const te_tensor& data = output->rowwise_data;
  if (!present(data) || is_fp8(data.dtype)) {
    FusedOutput out;
    plan_quantize(shape, output, config, name, config_name, &out);
    return out;
  }
  const std::string data_name = name + "->rowwise_data";
  check_tensor(data, data_name);
  check_dtype(data, data_name,
              {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT8_E4M3,
               TE_DTYPE_FLOAT8_E5M2});
  check_same_device(data, data_name, shape.device, "input");
  int64_t rows, cols, data_rows, data_cols;
  matrix_dims(shape, &rows, &cols);
  matrix_dims(data, &data_rows, &data_cols);
  TE_CHECK_ARG(data_rows == rows && data_cols == cols, data_name, ".shape: expected ",
               shape_string(shape.shape, shape.ndim),
               " (or any with the same last dim and element count), got ",
               shape_string(data.shape, data.ndim));
  const char* hp = " for a high-precision (";
  TE_CHECK_ARG(output->scaling_mode == TE_SCALING_PER_TENSOR, name,
               "->scaling_mode: expected per_tensor", hp, dtype_name(data.dtype),
               ") output, got ", scaling_mode_name(output->scaling_mode));
  const struct {
    const te_tensor* t;
    const char* part;
  } others[] = {{&output->rowwise_scale_inv, "rowwise_scale_inv"},
                {&output->columnwise_data, "columnwise_data"},
                {&output->columnwise_scale_inv, "columnwise_scale_inv"},
                {&output->amax, "amax"},
                {&output->scale, "scale"}};
  for (const auto& o : others) {
    TE_CHECK_ARG(!present(*o.t), name, "->", o.part, ": expected NULL", hp,
                 dtype_name(data.dtype), ") output, got a buffer");
  }
  FusedOutput out{};
  out.kind = kFusedHighPrecision;
  out.data = data.data;
  out.dtype = data.dtype;
  return out;
}

}  // namespace te
