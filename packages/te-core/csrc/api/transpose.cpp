#include "common/error.h"
#include "common/kernels.h"
#include "common/validate.h"
#include "te/quantize.h"

extern "C" te_status te_transpose(const te_tensor* input, te_tensor* output, void* stream) {
  return te::guard("te_transpose", [&] {
    te::check_tensor(input, "input");
    te::check_tensor(output, "output");
    const int32_t bits = te::dtype_bits(input->dtype);
    TE_CHECK_ARG(bits == 8 || bits == 16 || bits == 32, "input.dtype: expected a 1-, 2- or 4-byte"
                 " dtype, got ", te::dtype_name(input->dtype));
    TE_CHECK_ARG(output->dtype == input->dtype, "output.dtype: expected the input's ",
                 te::dtype_name(input->dtype), ", got ", te::dtype_name(output->dtype));
    te::check_same_device(*output, "output", input->device, "input");
    int64_t rows, cols;
    te::matrix_dims(*input, &rows, &cols);
    te::check_shape(*output, "output", {cols, rows}, "[K, M] for an [M, K] input");
    te::check_no_overlap(*input, "input", *output, "output");
    te::dispatch(
        input->device, "input",
        [&] { te::cpu::transpose(input->data, output->data, rows, cols, bits / 8, stream); },
        [&] { te::cuda::transpose(input->data, output->data, rows, cols, bits / 8, stream); });
  });
}
