// te_act_fwd_ffi / te_act_bwd_ffi / te_dbias_quantize_ffi: te_activation_fwd, te_activation_bwd
// and te_dbias_quantize (te/activation.h) as XLA custom calls.
//
// The output of each (y, dx, or the quantized gradient) is six results in
// te_core._ops.QUANTIZE_OUTPUTS order, high precision (rowwise_data alone, the rest [0]) or FP8
// exactly as in te_norm_fwd_ffi (ffi_norm.cpp); the FP8 attributes are te_quantize_ffi's.
// te_act_fwd_ffi
//   Operands: x [..., K], scale, amax (delayed FP8: scale fp32 [1], amax [0] or fp32 [1] aliased
//   to result 4; describe_output in ffi_common.h).
//   Results: y parts ([..., K/2] for gated kinds). Attributes: activation (te_activation),
//   quantized, scaling_mode, rowwise, columnwise, compute_scale, force_pow2_scales, amax_epsilon.
// te_act_bwd_ffi
//   Operands: grad [..., N], x [..., K] (the pre-activation), scale, amax.
//   Results: dx parts [..., K], then dbias [K] (has_dbias) or [0].
//   Attributes: te_act_fwd_ffi's plus has_dbias.
// te_dbias_quantize_ffi
//   Operands: x [..., K], scale, amax. Results: the FP8 parts of x, then dbias [K] (column sums).
//   Attributes: the FP8 ones (always quantized).
#include "ffi_common.h"

namespace te::xla_ffi {
namespace {

using Buf = ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

te_quant_config quant_config(bool compute_scale, bool force_pow2_scales, float amax_epsilon,
                             bool reset_amax) {
  te_quant_config c = te_quant_config_init();
  c.compute_scale = compute_scale;
  c.force_pow2_scales = force_pow2_scales;
  c.amax_epsilon = amax_epsilon;
  c.reset_amax = reset_amax;
  return c;
}

ffi::Error act_fwd(te_device device, void* stream, Buf x, Buf scale_in, Buf amax_in,
                   Ret rowwise_data, Ret rowwise_scale_inv, Ret columnwise_data,
                   Ret columnwise_scale_inv, Ret amax, Ret scale, int32_t activation,
                   bool quantized, int32_t scaling_mode, bool rowwise, bool columnwise,
                   bool compute_scale, bool force_pow2_scales, float amax_epsilon) {
  te_tensor t_x;
  TE_FFI_RETURN_IF_ERROR(describe(x, device, true, "x", &t_x));
  te_quantized_tensor y;
  bool reset_amax;
  TE_FFI_RETURN_IF_ERROR(describe_output(device, quantized, scaling_mode, rowwise, columnwise,
                                         compute_scale, scale_in, amax_in, rowwise_data,
                                         rowwise_scale_inv, columnwise_data, columnwise_scale_inv,
                                         amax, scale, &y, &reset_amax));
  const te_quant_config config =
      quant_config(compute_scale, force_pow2_scales, amax_epsilon, reset_amax);
  const te_status status = te_activation_fwd(&t_x, &y, activation, &config, stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

ffi::Error act_bwd(te_device device, void* stream, Buf grad, Buf x, Buf scale_in,
                   Buf amax_in, Ret rowwise_data, Ret rowwise_scale_inv, Ret columnwise_data,
                   Ret columnwise_scale_inv, Ret amax, Ret scale, Ret dbias, int32_t activation,
                   bool quantized, int32_t scaling_mode, bool rowwise, bool columnwise,
                   bool compute_scale, bool force_pow2_scales, float amax_epsilon,
                   bool has_dbias) {
  te_tensor t_grad, t_x, t_dbias;
  TE_FFI_RETURN_IF_ERROR(describe(grad, device, true, "grad", &t_grad));
  TE_FFI_RETURN_IF_ERROR(describe(x, device, true, "x", &t_x));
  TE_FFI_RETURN_IF_ERROR(describe(dbias, device, has_dbias, "dbias", &t_dbias));
  te_quantized_tensor dx;
  bool reset_amax;
  TE_FFI_RETURN_IF_ERROR(describe_output(device, quantized, scaling_mode, rowwise, columnwise,
                                         compute_scale, scale_in, amax_in, rowwise_data,
                                         rowwise_scale_inv, columnwise_data, columnwise_scale_inv,
                                         amax, scale, &dx, &reset_amax));
  const te_quant_config config =
      quant_config(compute_scale, force_pow2_scales, amax_epsilon, reset_amax);
  const te_status status = te_activation_bwd(&t_grad, &t_x, &dx, has_dbias ? &t_dbias : nullptr,
                                             activation, &config, stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

ffi::Error dbias_quantize(te_device device, void* stream, Buf x, Buf scale_in,
                          Buf amax_in, Ret rowwise_data, Ret rowwise_scale_inv,
                          Ret columnwise_data, Ret columnwise_scale_inv, Ret amax, Ret scale,
                          Ret dbias, int32_t scaling_mode, bool rowwise, bool columnwise,
                          bool compute_scale, bool force_pow2_scales, float amax_epsilon) {
  te_tensor t_x, t_dbias;
  TE_FFI_RETURN_IF_ERROR(describe(x, device, true, "x", &t_x));
  TE_FFI_RETURN_IF_ERROR(describe(dbias, device, true, "dbias", &t_dbias));
  te_quantized_tensor q;
  bool reset_amax;
  TE_FFI_RETURN_IF_ERROR(describe_output(device, true, scaling_mode, rowwise, columnwise,
                                         compute_scale, scale_in, amax_in, rowwise_data,
                                         rowwise_scale_inv, columnwise_data, columnwise_scale_inv,
                                         amax, scale, &q, &reset_amax));
  const te_quant_config config =
      quant_config(compute_scale, force_pow2_scales, amax_epsilon, reset_amax);
  const te_status status = te_dbias_quantize(&t_x, &q, &t_dbias, &config, stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

template <typename Binding>
auto bind_act_fwd(Binding binding) {
  // Operands: x, scale or [0], amax or [0].
  return attr_quantization(ret_quantized_parts(std::move(binding).template Arg<Buf>().template Arg<Buf>().template Arg<Buf>())
                               .template Attr<int32_t>("activation")
                               .template Attr<bool>("quantized"));
}

template <typename Binding>
auto bind_act_bwd(Binding binding) {
  // Operands: grad, x, scale or [0], amax or [0]; results: the quantized parts, then dbias or [0].
  return attr_quantization(
             ret_quantized_parts(std::move(binding)
                                     .template Arg<Buf>()
                                     .template Arg<Buf>()
                                     .template Arg<Buf>()
                                     .template Arg<Buf>())
                 .template Ret<Buf>()
                 .template Attr<int32_t>("activation")
                 .template Attr<bool>("quantized"))
      .template Attr<bool>("has_dbias");
}

template <typename Binding>
auto bind_dbias_quantize(Binding binding) {
  // Operands: x, scale or [0], amax or [0]; results: the quantized parts, then dbias.
  return attr_quantization(ret_quantized_parts(std::move(binding).template Arg<Buf>().template Arg<Buf>().template Arg<Buf>()).template Ret<Buf>());
}

}  // namespace
}  // namespace te::xla_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_act_fwd_ffi_cpu, te::xla_ffi::on_cpu(te::xla_ffi::act_fwd),
                              te::xla_ffi::bind_act_fwd(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_act_fwd_ffi_cuda, te::xla_ffi::on_cuda(te::xla_ffi::act_fwd),
                              te::xla_ffi::bind_act_fwd(te::xla_ffi::cuda_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_act_bwd_ffi_cpu, te::xla_ffi::on_cpu(te::xla_ffi::act_bwd),
                              te::xla_ffi::bind_act_bwd(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_act_bwd_ffi_cuda, te::xla_ffi::on_cuda(te::xla_ffi::act_bwd),
                              te::xla_ffi::bind_act_bwd(te::xla_ffi::cuda_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_dbias_quantize_ffi_cpu,
                              te::xla_ffi::on_cpu(te::xla_ffi::dbias_quantize),
                              te::xla_ffi::bind_dbias_quantize(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_dbias_quantize_ffi_cuda,
                              te::xla_ffi::on_cuda(te::xla_ffi::dbias_quantize),
                              te::xla_ffi::bind_dbias_quantize(te::xla_ffi::cuda_binding()));
