// te_quantize_ffi: te_quantize as an XLA custom call.
//
// Operands: x, scale, amax. Results, in te_core._ops.QUANTIZE_OUTPUTS order: rowwise_data,
// rowwise_scale_inv, columnwise_data, columnwise_scale_inv, amax, scale (te_jax takes the shapes
// from te_core._ops.quantize_outputs; a part not requested has shape [0] and is passed to the C
// API as absent).
//   - delayed scaling (per_tensor, compute_scale false): scale and amax are fp32 [1]; te_jax
//     aliases operand 1 (scale) to result 5 and operand 2 (amax) to result 4, so XLA hands this
//     handler result buffers that already hold the operands' values. te_quantize reads the scale
//     there and max-accumulates amax(x) into the amax there: functional in JAX, in place here.
//   - current scaling (per_tensor, compute_scale true): the scale and amax operands are unused
//     ([0]); results 4 and 5 receive amax(x) and the scale computed from it.
//   - block modes: amax and scale are absent everywhere.
// Attributes: scaling_mode (te_scaling_mode), rowwise, columnwise, compute_scale,
// force_pow2_scales, amax_epsilon. The fp8 dtype is the data results' element type.
#include "ffi_common.h"

namespace te::xla_ffi {
namespace {

using Buf = ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

ffi::Error quantize(te_device device, void* stream, Buf x, Buf /*scale_in*/, Buf /*amax_in*/,
                    Ret rowwise_data, Ret rowwise_scale_inv, Ret columnwise_data,
                    Ret columnwise_scale_inv, Ret amax, Ret scale, int32_t scaling_mode,
                    bool rowwise, bool columnwise, bool compute_scale, bool force_pow2_scales,
                    float amax_epsilon) {
  te_tensor input;
  TE_FFI_RETURN_IF_ERROR(describe(x, device, true, "x", &input));
  te_quantized_tensor q;
  TE_FFI_RETURN_IF_ERROR(describe_output(device, true, scaling_mode, rowwise, columnwise,
                                         rowwise_data, rowwise_scale_inv, columnwise_data,
                                         columnwise_scale_inv, amax, scale, &q));
  te_quant_config config = te_quant_config_init();
  config.compute_scale = compute_scale;
  config.force_pow2_scales = force_pow2_scales;
  config.amax_epsilon = amax_epsilon;
  const te_status status = te_quantize(&input, &q, &config, stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

template <typename Binding>
auto bind_quantize(Binding binding) {
  // Operands: x, scale (delayed) or [0], amax (delayed) or [0]. (A binding cannot be held in a
  // local: each piece takes the chain so far as a temporary.)
  return attr_quantization(ret_quantized_parts(std::move(binding).template Arg<Buf>().template Arg<Buf>().template Arg<Buf>()));
}

}  // namespace
}  // namespace te::xla_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_quantize_ffi_cpu, te::xla_ffi::on_cpu(te::xla_ffi::quantize),
                              te::xla_ffi::bind_quantize(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_quantize_ffi_cuda, te::xla_ffi::on_cuda(te::xla_ffi::quantize),
                              te::xla_ffi::bind_quantize(te::xla_ffi::cuda_binding()));
