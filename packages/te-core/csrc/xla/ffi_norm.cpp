// te_norm_fwd_ffi / te_norm_bwd_ffi: te_layernorm_* and te_rmsnorm_* (te/normalization.h) as XLA
// custom calls.
//
// te_norm_fwd_ffi
//   Operands: x [..., H], gamma [H], beta [H] (layernorm) or [0] (rmsnorm), scale (fp32 [1] for
//   delayed-scaled FP8 output, else [0]), amax ([0], or fp32 [1] aliased to result 4 to
//   accumulate into; describe_output in ffi_common.h).
//   Results: the output y in te_core._ops.QUANTIZE_OUTPUTS order (rowwise_data, rowwise_scale_inv,
//   columnwise_data, columnwise_scale_inv, amax, scale), then mu [M] (layernorm; rmsnorm: [0]) and
//   rsigma [M]; shapes from te_core._ops.norm_fwd_outputs. High-precision output (`quantized`
//   false): rowwise_data is y in its own dtype and every other output part is [0] and absent.
//   Attributes: norm_type (0 layernorm, 1 rmsnorm), eps, zero_centered_gamma, quantized, and for
//   FP8 output te_quantize_ffi's scaling_mode, rowwise, columnwise, compute_scale,
//   force_pow2_scales, amax_epsilon.
// te_norm_bwd_ffi
//   Operands: dz, x [..., H], mu [M] (layernorm) or [0], rsigma [M], gamma [H].
//   Results: dx [..., H], dgamma [H], dbeta [H] (layernorm) or [0].
//   Attributes: norm_type, zero_centered_gamma.
#include "ffi_common.h"

namespace te::xla_ffi {
namespace {

using Buf = ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

constexpr int32_t kLayerNorm = 0;
constexpr int32_t kRmsNorm = 1;

ffi::Error check_norm_type(int32_t norm_type) {
  if (norm_type == kLayerNorm || norm_type == kRmsNorm) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                    "norm_type: expected 0 (layernorm) or 1 (rmsnorm), got " +
                        std::to_string(norm_type));
}

}  // namespace

// Shared with ffi_activation.cpp: the output of a fused op as a te_quantized_tensor, either the
// high-precision rowwise_data alone or te_quantize_ffi's six parts.
ffi::Error describe_output(const te_device& device, bool quantized, int32_t scaling_mode,
                           bool rowwise, bool columnwise, bool compute_scale, const Buf& scale_in,
                           const Buf& amax_in, Ret& rowwise_data, Ret& rowwise_scale_inv,
                           Ret& columnwise_data, Ret& columnwise_scale_inv, Ret& amax, Ret& scale,
                           te_quantized_tensor* out, bool* reset_amax) {
  *reset_amax = false;
  if (!quantized) {
    *out = te_quantized_tensor_init(TE_SCALING_PER_TENSOR);
    return describe(rowwise_data, device, true, "y", &out->rowwise_data);
  }
  *out = te_quantized_tensor_init(scaling_mode);
  const bool stats = scaling_mode == TE_SCALING_PER_TENSOR;
  const bool nvfp4 = scaling_mode == TE_SCALING_NVFP4_1D;  // amax [2], no scale
  const bool delayed = stats && !compute_scale;
  TE_FFI_RETURN_IF_ERROR(describe_data(rowwise_data, device, rowwise, scaling_mode,
                                       "rowwise_data", &out->rowwise_data));
  TE_FFI_RETURN_IF_ERROR(describe(rowwise_scale_inv, device, rowwise, "rowwise_scale_inv",
                                  &out->rowwise_scale_inv));
  TE_FFI_RETURN_IF_ERROR(describe_data(columnwise_data, device, columnwise, scaling_mode,
                                       "columnwise_data", &out->columnwise_data));
  TE_FFI_RETURN_IF_ERROR(describe(columnwise_scale_inv, device, columnwise,
                                  "columnwise_scale_inv", &out->columnwise_scale_inv));
  TE_FFI_RETURN_IF_ERROR(describe(amax, device, stats || nvfp4, "amax", &out->amax));
  *reset_amax = delayed && amax_in.element_count() == 0;
  if (delayed) return describe(scale_in, device, true, "scale", &out->scale);
  return describe(scale, device, stats, "scale", &out->scale);
}

namespace {

ffi::Error norm_fwd(te_device device, void* stream, Buf x, Buf gamma, Buf beta, Buf scale_in,
                    Buf amax_in, Ret rowwise_data, Ret rowwise_scale_inv,
                    Ret columnwise_data, Ret columnwise_scale_inv, Ret amax, Ret scale, Ret mu,
                    Ret rsigma, int32_t norm_type, float eps, bool zero_centered_gamma,
                    bool quantized, int32_t scaling_mode, bool rowwise, bool columnwise,
                    bool compute_scale, bool force_pow2_scales, float amax_epsilon) {
  TE_FFI_RETURN_IF_ERROR(check_norm_type(norm_type));
  const bool layernorm = norm_type == kLayerNorm;
  te_tensor t_x, t_gamma, t_beta, t_mu, t_rsigma;
  TE_FFI_RETURN_IF_ERROR(describe(x, device, true, "x", &t_x));
  TE_FFI_RETURN_IF_ERROR(describe(gamma, device, true, "gamma", &t_gamma));
  TE_FFI_RETURN_IF_ERROR(describe(beta, device, layernorm, "beta", &t_beta));
  TE_FFI_RETURN_IF_ERROR(describe(mu, device, layernorm, "mu", &t_mu));
  TE_FFI_RETURN_IF_ERROR(describe(rsigma, device, true, "rsigma", &t_rsigma));
  te_quantized_tensor y;
  bool reset_amax;
  TE_FFI_RETURN_IF_ERROR(describe_output(device, quantized, scaling_mode, rowwise, columnwise,
                                         compute_scale, scale_in, amax_in, rowwise_data,
                                         rowwise_scale_inv, columnwise_data, columnwise_scale_inv,
                                         amax, scale, &y, &reset_amax));
  te_norm_config config = te_norm_config_init();
  config.eps = eps;
  config.zero_centered_gamma = zero_centered_gamma;
  te_quant_config qconfig = te_quant_config_init();
  qconfig.compute_scale = compute_scale;
  qconfig.force_pow2_scales = force_pow2_scales;
  qconfig.amax_epsilon = amax_epsilon;
  qconfig.reset_amax = reset_amax;
  const te_status status =
      layernorm ? te_layernorm_fwd(&t_x, &t_gamma, &t_beta, &y, &t_mu, &t_rsigma, &config,
                                   &qconfig, stream)
                : te_rmsnorm_fwd(&t_x, &t_gamma, &y, &t_rsigma, &config, &qconfig, stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

ffi::Error norm_bwd(te_device device, void* stream, Buf dz, Buf x, Buf mu, Buf rsigma, Buf gamma,
                    Ret dx, Ret dgamma, Ret dbeta, int32_t norm_type, bool zero_centered_gamma) {
  TE_FFI_RETURN_IF_ERROR(check_norm_type(norm_type));
  const bool layernorm = norm_type == kLayerNorm;
  te_tensor t_dz, t_x, t_mu, t_rsigma, t_gamma, t_dx, t_dgamma, t_dbeta;
  TE_FFI_RETURN_IF_ERROR(describe(dz, device, true, "dz", &t_dz));
  TE_FFI_RETURN_IF_ERROR(describe(x, device, true, "x", &t_x));
  TE_FFI_RETURN_IF_ERROR(describe(mu, device, layernorm, "mu", &t_mu));
  TE_FFI_RETURN_IF_ERROR(describe(rsigma, device, true, "rsigma", &t_rsigma));
  TE_FFI_RETURN_IF_ERROR(describe(gamma, device, true, "gamma", &t_gamma));
  TE_FFI_RETURN_IF_ERROR(describe(dx, device, true, "dx", &t_dx));
  TE_FFI_RETURN_IF_ERROR(describe(dgamma, device, true, "dgamma", &t_dgamma));
  TE_FFI_RETURN_IF_ERROR(describe(dbeta, device, layernorm, "dbeta", &t_dbeta));
  te_norm_config config = te_norm_config_init();
  config.zero_centered_gamma = zero_centered_gamma;
  const te_status status =
      layernorm ? te_layernorm_bwd(&t_dz, &t_x, &t_mu, &t_rsigma, &t_gamma, &t_dx, &t_dgamma,
                                   &t_dbeta, &config, stream)
                : te_rmsnorm_bwd(&t_dz, &t_x, &t_rsigma, &t_gamma, &t_dx, &t_dgamma, &config,
                                 stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

template <typename Binding>
auto bind_norm_fwd(Binding binding) {
  // Operands: x, gamma, beta or [0], scale (delayed) or [0], amax (delayed) or [0]; results: the
  // quantized parts (y), then mu or [0] and rsigma.
  return attr_quantization(ret_quantized_parts(std::move(binding)
                                                   .template Arg<Buf>()
                                                   .template Arg<Buf>()
                                                   .template Arg<Buf>()
                                                   .template Arg<Buf>()
                                                   .template Arg<Buf>())
                               .template Ret<Buf>()
                               .template Ret<Buf>()
                               .template Attr<int32_t>("norm_type")
                               .template Attr<float>("eps")
                               .template Attr<bool>("zero_centered_gamma")
                               .template Attr<bool>("quantized"));
}

template <typename Binding>
auto bind_norm_bwd(Binding binding) {
  return std::move(binding)
      .template Arg<Buf>()   // dz
      .template Arg<Buf>()   // x
      .template Arg<Buf>()   // mu or [0]
      .template Arg<Buf>()   // rsigma
      .template Arg<Buf>()   // gamma
      .template Ret<Buf>()   // dx
      .template Ret<Buf>()   // dgamma
      .template Ret<Buf>()   // dbeta or [0]
      .template Attr<int32_t>("norm_type")
      .template Attr<bool>("zero_centered_gamma");
}

}  // namespace
}  // namespace te::xla_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_norm_fwd_ffi_cpu, te::xla_ffi::on_cpu(te::xla_ffi::norm_fwd),
                              te::xla_ffi::bind_norm_fwd(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_norm_fwd_ffi_cuda, te::xla_ffi::on_cuda(te::xla_ffi::norm_fwd),
                              te::xla_ffi::bind_norm_fwd(te::xla_ffi::cuda_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_norm_bwd_ffi_cpu, te::xla_ffi::on_cpu(te::xla_ffi::norm_bwd),
                              te::xla_ffi::bind_norm_bwd(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_norm_bwd_ffi_cuda, te::xla_ffi::on_cuda(te::xla_ffi::norm_bwd),
                              te::xla_ffi::bind_norm_bwd(te::xla_ffi::cuda_binding()));
