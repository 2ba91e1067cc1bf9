// te_quantize: validates the request (api/quantize_output.cpp, and api/quantize_mx.cpp for MXFP8
// and NVFP4: against the layout table of common/layout.h) and hands the matching kernel of the
// tensor's device a flat argument struct.
#include "te/quantize.h"

#include "api/quantize_mx.h"
#include "api/quantize_output.h"
#include "common/error.h"
#include "common/kernels.h"
#include "common/layout.h"
#include "common/validate.h"

namespace te {
namespace {

// The parts te_quantize writes must not share bytes with the input it reads (the column-wise
// copy, a second pass of current scaling or any CUDA kernel would read overwritten values). Run
// after the plan has validated every present part.
void check_outputs_apart(const te_tensor& input, const te_quantized_tensor& output) {
  const bool rowwise = present(output.rowwise_data);
  const bool columnwise = present(output.columnwise_data);
  if (rowwise) {
    check_no_overlap(input, "input", output.rowwise_data, "output->rowwise_data");
    check_no_overlap(input, "input", output.rowwise_scale_inv, "output->rowwise_scale_inv");
  }
  if (columnwise) {
    check_no_overlap(input, "input", output.columnwise_data, "output->columnwise_data");
    check_no_overlap(input, "input", output.columnwise_scale_inv, "output->columnwise_scale_inv");
  }
  check_no_overlap(input, "input", output.amax, "output->amax");
}

void quantize(const te_tensor* input, te_quantized_tensor* output, const te_quant_config* config,
              void* stream) {
  check_tensor(input, "input");
  check_dtype(*input, "input", {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16});
  TE_CHECK_ARG(output != nullptr, "output: expected a quantized tensor descriptor, got NULL");
  check_struct_size(output->struct_size, kQuantizedTensorV1Size, "output");
  if (is_mx_mode(output->scaling_mode)) {
    const MxQuantizePlan mx = plan_quantize_mx(*input, output, config);
    check_outputs_apart(*input, *output);
    if (mx.nvfp4) {
      dispatch(input->device, "input", [&] { cpu::quantize_nvfp4(mx.nvfp4_args, stream); },
               [&] { cuda::quantize_nvfp4(mx.nvfp4_args, stream); });
    } else {
      dispatch(input->device, "input", [&] { cpu::quantize_mxfp8(mx.mxfp8, stream); },
               [&] { cuda::quantize_mxfp8(mx.mxfp8, stream); });
    }
    return;
  }
  FusedOutput plan;
  plan_quantize(*input, output, config, "output", "config", &plan);
  check_outputs_apart(*input, *output);
  if (plan.kind == kFusedPerTensor) {
    reset_amax_if_asked(plan, input->device, stream);
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
