#include "common/error.h"
#include "common/kernels.h"
#include "common/validate.h"
#include "te/quantize.h"

extern "C" te_status te_amax(const te_tensor* input, te_tensor* amax, void* stream) {
  return te::guard("te_amax", [&] {
    te::check_tensor(input, "input");
    te::check_dtype(*input, "input", {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16});
    te::check_tensor(amax, "amax");
    te::check_dtype(*amax, "amax", {TE_DTYPE_FLOAT32});
    te::check_numel(*amax, "amax", 1);
    te::check_same_device(*amax, "amax", input->device, "input");
    const int64_t n = te::numel(*input);
    float* out = static_cast<float*>(amax->data);
    te::dispatch(input->device, "input",
                 [&] { te::cpu::amax(input->data, input->dtype, n, out, stream); },
                 [&] { te::cuda::amax(input->data, input->dtype, n, out, stream); });
  });
}
