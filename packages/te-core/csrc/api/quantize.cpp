// te_quantize: validates the request (api/quantize_output.cpp: against the layout table of
// common/layout.h) and hands the matching kernel of the tensor's device a flat argument struct.
#include "te/quantize.h"

#include "api/quantize_output.h"
#include "common/error.h"
#include "common/kernels.h"
#include "common/validate.h"

namespace te {
namespace {

void quantize(const te_tensor* input, te_quantized_tensor* output, const te_quant_config* config,
              void* stream) {
  check_tensor(input, "input");
  check_dtype(*input, "input", {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16});
  FusedOutput plan;
  plan_quantize(*input, output, config, "output", "config", &plan);
  if (plan.kind == kFusedPerTensor) {
    dispatch(input->device, "input", [&] { cpu::quantize_per_tensor(plan.per_tensor, stream); },
             [&] { cuda::quantize_per_tensor(plan.per_tensor, stream); });
  } else {
    dispatch(input->device, "input", [&] { cpu::quantize_block(plan.block, stream); },
             [&] { cuda::quantize_block(plan.block, stream); });
  }
}

}  // namespace
}  // namespace te

extern "C" te_status te_quantize(const te_tensor* input, te_quantized_tensor* output,
                                 const te_quant_config* config, void* stream) {
  return te::guard("te_quantize", [&] { te::quantize(input, output, config, stream); });
}
