// plan_quantize_mx / dequantize_mx (quantize_mx.h): the checks of an MXFP8 or NVFP4 tensor
// against te/tensor.h's layout table and te/quantize.h's rules, each failure naming the argument.
#include "api/quantize_mx.h"

#include <string>

#include "api/quantize_output.h"
#include "common/error.h"
#include "common/layout.h"
#include "common/validate.h"

namespace te {
namespace {

// A present data copy: dtype, device, and its shape: the source's matrix (row-wise: any shape with
// the source's last dim and element count) or [K, M] (column-wise). `source_name` is "input"
// (quantize) or "output" (dequantize).
void check_data(const te_tensor& data, const std::string& name, bool rowwise,
                const te_tensor& source, const char* source_name, bool nvfp4) {
  check_tensor(data, name);
  if (nvfp4) {
    check_dtype(data, name, {TE_DTYPE_FLOAT4_E2M1});
  } else {
    check_dtype(data, name, {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2});
  }
  check_same_device(data, name, source.device, source_name);
  int64_t rows, cols;
  matrix_dims(source, &rows, &cols);
  if (rowwise) {
    int64_t data_rows, data_cols;
    matrix_dims(data, &data_rows, &data_cols);
    TE_CHECK_ARG(data_rows == rows && data_cols == cols, name, ".shape: expected ",
                 shape_string(source.shape, source.ndim),
                 " (the ", source_name, "'s shape, or any with the same last dim and element "
                 "count), got ", shape_string(data.shape, data.ndim));
  } else {
    check_shape(data, name, {cols, rows},
                source_name[0] == 'i' ? "[K, M]: the transposed copy of the [M, K] input"
                                      : "[K, M]: the transposed copy of the [M, K] output");
  }
}

void check_scales(const te_tensor& scale_inv, const std::string& name, int32_t mode, int32_t part,
                  const te_tensor& source, const char* source_name) {
  check_tensor(scale_inv, name);
  check_dtype(scale_inv, name, {mx_scale_dtype(mode)});
  check_same_device(scale_inv, name, source.device, source_name);
  check_shape(scale_inv, name, quantized_shape(mode, part, source.shape, source.ndim),
              "the block-scale layout of te/tensor.h for this shape");
}

void check_nvfp4_amax(const te_tensor& amax, const std::string& name, const te_device& device,
                      const std::string& device_name) {
  TE_CHECK_ARG(present(amax), name,
               ": nvfp4_1d needs the fp32 [2] global amaxes (row-wise, column-wise), got NULL");
  check_tensor(amax, name);
  check_dtype(amax, name, {TE_DTYPE_FLOAT32});
  check_numel(amax, name, 2);
  check_same_device(amax, name, device, device_name);
}

}  // namespace

void check_e2m1_rows(const std::string& name, int64_t stored_cols, const char* dim) {
  TE_CHECK_ARG(stored_cols % 2 == 0, name,
               ".shape: float4_e2m1 packs two elements per byte and each stored row must start "
               "on a byte, so ", dim, " must be even, got ", dim, " = ", stored_cols);
}

MxQuantizePlan plan_quantize_mx(const te_tensor& source, te_quantized_tensor* output,
                                const te_quant_config* config) {
  const te_quant_config cfg = read_quant_config(config, "config");
  const int32_t mode = output->scaling_mode;
  const bool nvfp4 = mode == TE_SCALING_NVFP4_1D;
  const std::string mode_name = scaling_mode_name(mode);
  const bool rowwise = present(output->rowwise_data);
  const bool columnwise = present(output->columnwise_data);
  const bool rht = columnwise_rht_of(*output) != 0;
  int64_t rows, cols;
  matrix_dims(source, &rows, &cols);

  TE_CHECK_ARG(rowwise || columnwise || numel(source) == 0,
               "output: expected rowwise_data and/or columnwise_data, got neither");
  if (rowwise) {
    check_data(output->rowwise_data, "output->rowwise_data", true, source, "input",
               nvfp4);
    check_scales(output->rowwise_scale_inv, "output->rowwise_scale_inv", mode,
                 TE_PART_ROWWISE_SCALE_INV, source, "input");
    if (nvfp4) check_e2m1_rows("output->rowwise_data", cols, "K (the last dim)");
  }
  if (columnwise) {
    check_data(output->columnwise_data, "output->columnwise_data", false, source, "input",
               nvfp4);
    check_scales(output->columnwise_scale_inv, "output->columnwise_scale_inv", mode,
                 TE_PART_COLUMNWISE_SCALE_INV, source, "input");
    if (nvfp4) check_e2m1_rows("output->columnwise_data", rows, "M (the input's rows)");
  }
  TE_CHECK_ARG(!(rowwise && columnwise) ||
                   output->rowwise_data.dtype == output->columnwise_data.dtype,
               "output->columnwise_data.dtype: expected the row-wise copy's ",
               dtype_name(output->rowwise_data.dtype), ", got ",
               dtype_name(output->columnwise_data.dtype));
  TE_CHECK_ARG(!present(output->scale), "output->scale: expected NULL for scaling mode ",
               mode_name, nvfp4 ? " (its global scales derive from amax)" : " (it has no "
               "per-tensor scale)", ", got a buffer");
  TE_CHECK_ARG(!cfg.force_pow2_scales, "config->force_pow2_scales: expected 0 for scaling mode ",
               mode_name, " (its scale rule is fixed by NUMERICS.md), got ",
               cfg.force_pow2_scales);
  TE_CHECK_ARG(cfg.amax_epsilon == 0.0f, "config->amax_epsilon: expected 0 for scaling mode ",
               mode_name, " (its scale rule is fixed by NUMERICS.md), got ", cfg.amax_epsilon);
  TE_CHECK_ARG(!cfg.reset_amax, "config->reset_amax: only for per_tensor delayed scaling, got 1 "
               "with scaling mode ", mode_name);

  MxQuantizePlan plan{};
  plan.nvfp4 = nvfp4;
  if (!nvfp4) {
    TE_CHECK_ARG(!present(output->amax), "output->amax: expected NULL for scaling mode ",
                 mode_name, " (block scales come from per-block amaxes), got a buffer");
    TE_CHECK_ARG(!cfg.use_existing_amax, "config->use_existing_amax: not supported by scaling "
                 "mode mxfp8_1d (per-block amaxes are always computed)");
    TE_CHECK_ARG(!cfg.stochastic_rounding,
                 "config->stochastic_rounding: only for nvfp4_1d, got 1 with scaling mode "
                 "mxfp8_1d");
    TE_CHECK_ARG(!rht, "output->columnwise_rht: only for nvfp4_1d, got 1 with scaling mode "
                 "mxfp8_1d");
    Mxfp8QuantizeArgs& a = plan.mxfp8;
    a.input = source.data;
    a.in_dtype = source.dtype;
    a.rows = rows;
    a.cols = cols;
    a.out_dtype = rowwise ? output->rowwise_data.dtype : output->columnwise_data.dtype;
    a.rowwise = rowwise ? static_cast<uint8_t*>(output->rowwise_data.data) : nullptr;
    a.rowwise_scale_inv = rowwise ? static_cast<uint8_t*>(output->rowwise_scale_inv.data) : nullptr;
    a.rowwise_scale_ld = rowwise ? output->rowwise_scale_inv.shape[1] : 0;
    a.columnwise = columnwise ? static_cast<uint8_t*>(output->columnwise_data.data) : nullptr;
    a.columnwise_scale_inv =
        columnwise ? static_cast<uint8_t*>(output->columnwise_scale_inv.data) : nullptr;
    a.columnwise_scale_ld = columnwise ? output->columnwise_scale_inv.shape[1] : 0;
    a.tile_2d = cfg.with_2d_quantization != 0;
    return plan;
  }

  check_nvfp4_amax(output->amax, "output->amax", source.device, "input");
  TE_CHECK_ARG(!(rht && cfg.with_2d_quantization),
               "output->columnwise_rht: not with config->with_2d_quantization (2-D tiles make the "
               "column-wise copy the row-wise one transposed; the transform would change it)");
  TE_CHECK_ARG(!(rht && columnwise) || rows % 16 == 0,
               "output->columnwise_rht: the Hadamard transform runs over 16 rows of the input at "
               "a time, so M (the input's rows) must be a multiple of 16, got M = ", rows);
  Nvfp4QuantizeArgs& a = plan.nvfp4_args;
  a.input = source.data;
  a.in_dtype = source.dtype;
  a.rows = rows;
  a.cols = cols;
  a.rowwise = rowwise ? static_cast<uint8_t*>(output->rowwise_data.data) : nullptr;
  a.rowwise_scale_inv = rowwise ? static_cast<uint8_t*>(output->rowwise_scale_inv.data) : nullptr;
  a.rowwise_scale_ld = rowwise ? output->rowwise_scale_inv.shape[1] : 0;
  a.columnwise = columnwise ? static_cast<uint8_t*>(output->columnwise_data.data) : nullptr;
  a.columnwise_scale_inv =
      columnwise ? static_cast<uint8_t*>(output->columnwise_scale_inv.data) : nullptr;
  a.columnwise_scale_ld = columnwise ? output->columnwise_scale_inv.shape[1] : 0;
  a.amax = static_cast<float*>(output->amax.data);
  a.use_existing_amax = cfg.use_existing_amax != 0;
  a.tile_2d = cfg.with_2d_quantization != 0;
  a.columnwise_rht = rht;
  a.stochastic_rounding = cfg.stochastic_rounding != 0;
  a.rng_seed = cfg.rng_seed;
  a.rng_offset = cfg.rng_offset;
  if (present(cfg.rng_state)) {
    check_tensor(cfg.rng_state, "config->rng_state");
    check_dtype(cfg.rng_state, "config->rng_state", {TE_DTYPE_INT64});
    check_numel(cfg.rng_state, "config->rng_state", 2);
    check_same_device(cfg.rng_state, "config->rng_state", source.device, "input");
    a.rng_state = static_cast<const uint64_t*>(cfg.rng_state.data);
  }
  return plan;
}

void dequantize_mx_tensor(const te_quantized_tensor& input, te_tensor* output, void* stream) {
  const int32_t mode = input.scaling_mode;
  const bool nvfp4 = mode == TE_SCALING_NVFP4_1D;
  const bool transposed = !present(input.rowwise_data);
  const te_tensor& data = transposed ? input.columnwise_data : input.rowwise_data;
  const te_tensor& scale_inv = transposed ? input.columnwise_scale_inv : input.rowwise_scale_inv;
  const std::string data_name = transposed ? "input->columnwise_data" : "input->rowwise_data";
  const std::string scale_name =
      transposed ? "input->columnwise_scale_inv" : "input->rowwise_scale_inv";
  int64_t rows, cols;
  matrix_dims(*output, &rows, &cols);
  TE_CHECK_ARG(present(data) || rows * cols == 0,
               "input: expected rowwise_data or columnwise_data, got neither");
  if (!present(data)) return;  // a zero-size output: nothing to read or write
  // The output plays the source: its shape decides the expected layout.
  const te_tensor& source = *output;
  check_data(data, data_name, !transposed, source, "output", nvfp4);
  check_scales(scale_inv, scale_name, mode,
               transposed ? TE_PART_COLUMNWISE_SCALE_INV : TE_PART_ROWWISE_SCALE_INV, source,
               "output");
  const bool undo_rht = transposed && columnwise_rht_of(input) != 0;
  if (nvfp4) {
    check_e2m1_rows(data_name, transposed ? rows : cols,
                    transposed ? "M (the output's rows)" : "K (the last dim)");
    check_nvfp4_amax(input.amax, "input->amax", output->device, "output");
    TE_CHECK_ARG(!undo_rht || rows % 16 == 0,
                 "input->columnwise_rht: the Hadamard transform runs over 16 rows at a time, so "
                 "M (the output's rows) must be a multiple of 16, got M = ", rows);
  } else {
    TE_CHECK_ARG(!columnwise_rht_of(input), "input->columnwise_rht: only for nvfp4_1d, got 1");
  }
  MxDequantizeArgs a{};
  a.scaling_mode = mode;
  a.data = static_cast<const uint8_t*>(data.data);
  a.data_dtype = data.dtype;
  a.transposed = transposed;
  a.scale_inv = static_cast<const uint8_t*>(scale_inv.data);
  a.scale_ld = scale_inv.shape[1];
  a.global_amax = nvfp4 ? static_cast<const float*>(input.amax.data) + (transposed ? 1 : 0)
                        : nullptr;
  a.undo_rht = undo_rht;
  a.rows = rows;
  a.cols = cols;
  a.output = output->data;
  a.out_dtype = output->dtype;
  dispatch(output->device, "output", [&] { cpu::dequantize_mx(a, stream); },
           [&] { cuda::dequantize_mx(a, stream); });
}

}  // namespace te
