// Validation of a te_quantized_tensor as the destination of a quantization, shared by te_quantize
// and the fused ops (norms, activations, dbias) so every one of them accepts exactly the same
// outputs with exactly the same messages, and builds the same kernel arguments.
#pragma once

#include <string>

#include "common/kernels.h"
#include "te/quantize.h"

namespace te {

// `config` read as the caller's struct_size covers it (NULL: the defaults) and its fields checked
// for what every mode requires; `name` names it in messages.
te_quant_config read_quant_config(const te_quant_config* config, const std::string& name);

// Validates `output` as the quantized form of a source shaped and placed like `source` (its dtype
// and data are copied into the args, not checked) and `config` (may be NULL; named `config_name`
// in messages), and builds the kernel args. Part names in messages are `name`->rowwise_data etc.
// Returns kFusedPerTensor or kFusedBlock with the matching args filled in `out`.
void plan_quantize(const te_tensor& source, te_quantized_tensor* output,
                   const te_quant_config* config, const std::string& name,
                   const std::string& config_name, FusedOutput* out);

// For fused ops: output->rowwise_data of fp32/fp16/bf16 is a plain high-precision result (then
// PER_TENSOR mode and every other part absent are required), otherwise the output is FP8 and
// plan_quantize decides. `shape` is the result's shape and device (data and dtype unused).
FusedOutput plan_fused_output(const te_tensor& shape, te_quantized_tensor* output,
                              const te_quant_config* config, const std::string& name,
                              const std::string& config_name);

// Zeroes a per-tensor output's amax when the config asked for reset_amax: run it on the stream
// before the kernel, which then max-accumulates into 0.
void reset_amax_if_asked(const FusedOutput& out, const te_device& device, void* stream);

}  // namespace te
