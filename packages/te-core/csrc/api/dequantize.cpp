// te_dequantize: reads the row-wise copy if present, else the column-wise (transposed) one.
// MXFP8 and NVFP4 go through api/quantize_mx.cpp.
#include "api/quantize_mx.h"
#include "common/error.h"
#include "common/kernels.h"
#include "common/layout.h"
#include "common/validate.h"
#include "te/quantize.h"

extern "C" te_status te_dequantize(const te_quantized_tensor* input, te_tensor* output,
                                   void* stream) {
  return te::guard("te_dequantize", [&] {
    TE_CHECK_ARG(input != nullptr, "input: expected a quantized tensor descriptor, got NULL");
    te::check_struct_size(input->struct_size, te::kQuantizedTensorV1Size, "input");
    te::check_tensor(output, "output");
    te::check_dtype(*output, "output", {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16});
    const int32_t mode = input->scaling_mode;
    te::quantized_shape(mode, TE_PART_ROWWISE_DATA, output->shape, output->ndim);
    if (te::is_mx_mode(mode)) {
      te::dequantize_mx_tensor(*input, output, stream);
      return;
    }
    const bool transposed = !te::present(input->rowwise_data);
    const te_tensor& data = transposed ? input->columnwise_data : input->rowwise_data;
    const te_tensor& scale_inv = transposed ? input->columnwise_scale_inv
                                            : input->rowwise_scale_inv;
    const std::string data_name = transposed ? "input->columnwise_data" : "input->rowwise_data";
    const std::string scale_name =
        transposed ? "input->columnwise_scale_inv" : "input->rowwise_scale_inv";
    TE_CHECK_ARG(te::present(data) || te::numel(*output) == 0,
                 "input: expected rowwise_data or columnwise_data, got neither");
    if (!te::present(data)) return;  // a zero-size output: nothing to read or write
    te::check_tensor(data, data_name);
    te::check_dtype(data, data_name, {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2});
    te::check_same_device(data, data_name, output->device, "output");
    te::check_tensor(scale_inv, scale_name);
    te::check_dtype(scale_inv, scale_name, {TE_DTYPE_FLOAT32});
    te::check_same_device(scale_inv, scale_name, output->device, "output");

    int64_t rows, cols;
    te::matrix_dims(*output, &rows, &cols);
    if (transposed) {
      te::check_shape(data, data_name, {cols, rows}, "[K, M] for the [M, K] output");
    } else {
      int64_t data_rows, data_cols;
      te::matrix_dims(data, &data_rows, &data_cols);
      TE_CHECK_ARG(data_rows == rows && data_cols == cols, "output.shape: expected ",
                   te::shape_string(data.shape, data.ndim),
                   " (the row-wise data's shape, or any with the same last dim and element "
                   "count), got ", te::shape_string(output->shape, output->ndim));
    }
    const int32_t part = transposed ? TE_PART_COLUMNWISE_SCALE_INV : TE_PART_ROWWISE_SCALE_INV;
    if (mode == TE_SCALING_PER_TENSOR) {
      te::check_numel(scale_inv, scale_name, 1);
    } else {
      te::check_shape(scale_inv, scale_name,
                      te::quantized_shape(mode, part, output->shape, output->ndim),
                      "the block-scale layout of te/tensor.h for this shape");
    }
    te::DequantizeArgs a{};
    a.scaling_mode = mode;
    a.data = data.data;
    a.data_dtype = data.dtype;
    a.transposed = transposed;
    a.scale_inv = static_cast<const float*>(scale_inv.data);
    a.scale_ld = mode == TE_SCALING_PER_TENSOR ? 0 : scale_inv.shape[1];
    a.rows = rows;
    a.cols = cols;
    a.output = output->data;
    a.out_dtype = output->dtype;
    te::dispatch(output->device, "output", [&] { te::cpu::dequantize(a, stream); },
                 [&] { te::cuda::dequantize(a, stream); });
  });
}
