// te_quantize_ffi: te_quantize as an XLA custom call.
//
// Operands: x, scale, amax, rng_state. Results, in te_core._ops.QUANTIZE_OUTPUTS order:
// rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, amax, scale (te_jax
// takes the shapes from te_core._ops.quantize_outputs; a part not requested has shape [0] and is
// passed to the C API as absent).
//   - delayed scaling (per_tensor, compute_scale false): the scale is operand 1, fp32 [1], read
//     where it is (result 5 is [0]: aliasing it would make XLA copy the scale first). Result 4,
//     fp32 [1], receives amax(x); given an fp32 [1] operand 2 aliased to it (te_jax.quantize's
//     running amax), te_quantize max-accumulates into that value instead: functional in JAX, in
//     place here.
//   - current scaling (per_tensor, compute_scale true): the scale and amax operands are unused
//     ([0]); results 4 and 5 receive amax(x) and the scale computed from it.
//   - block modes and mxfp8_1d: amax and scale are absent everywhere.
//   - nvfp4_1d: result 4 is the fp32 [2] global amaxes and there is no scale. With
//     use_existing_amax, operand 2 holds the amaxes to encode with (e.g. all-reduced over a mesh),
//     aliased to result 4 as for delayed scaling. The data results are uint8 [..., K / 2], two
//     E2M1 elements a byte (describe_data).
// rng_state (operand 3): with stochastic_rounding, uint32 [4], the bytes of te_quant_config's
// int64 [2] rng_state {seed, offset} (jax has no 64-bit integers unless x64 is on), read by the
// kernel on the device: a traced seed never makes the host wait. Otherwise [0].
// Attributes: scaling_mode (te_scaling_mode), rowwise, columnwise, compute_scale,
// force_pow2_scales, amax_epsilon, and te_quant_config's MXFP8/NVFP4 fields use_existing_amax,
// with_2d_quantization, stochastic_rounding, plus columnwise_rht (te_quantized_tensor's). The
// data dtype is the data results' element type.
#include "ffi_common.h"

namespace te::xla_ffi {
namespace {

using Buf = ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

ffi::Error describe_rng_state(const Buf& buffer, const te_device& device, te_tensor* out) {
  if (buffer.element_type() != ffi::DataType::U32 || buffer.element_count() != 4) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "rng_state: expected uint32 [4] (the bytes of int64 {seed, offset}) with "
                      "stochastic_rounding, got " + std::to_string(buffer.element_count()) +
                      " elements of XLA type " +
                      std::to_string(static_cast<int>(buffer.element_type())));
  }
  *out = te_tensor{};
  out->data = buffer.untyped_data();
  out->ndim = 1;
  out->shape[0] = 2;
  out->dtype = TE_DTYPE_INT64;
  out->device = device;
  return ffi::Error::Success();
}

ffi::Error quantize(te_device device, void* stream, Buf x, Buf scale_in, Buf amax_in,
                    Buf rng_state, Ret rowwise_data, Ret rowwise_scale_inv, Ret columnwise_data,
                    Ret columnwise_scale_inv, Ret amax, Ret scale, int32_t scaling_mode,
                    bool rowwise, bool columnwise, bool compute_scale, bool force_pow2_scales,
                    float amax_epsilon, bool use_existing_amax, bool with_2d_quantization,
                    bool stochastic_rounding, bool columnwise_rht) {
  te_tensor input;
  TE_FFI_RETURN_IF_ERROR(describe(x, device, true, "x", &input));
  te_quantized_tensor q;
  bool reset_amax;
  TE_FFI_RETURN_IF_ERROR(describe_output(device, true, scaling_mode, rowwise, columnwise,
                                         compute_scale, scale_in, amax_in, rowwise_data,
                                         rowwise_scale_inv, columnwise_data, columnwise_scale_inv,
                                         amax, scale, &q, &reset_amax));
  q.columnwise_rht = columnwise_rht;
  te_quant_config config = te_quant_config_init();
  config.compute_scale = compute_scale;
  config.force_pow2_scales = force_pow2_scales;
  config.amax_epsilon = amax_epsilon;
  config.reset_amax = reset_amax;
  config.use_existing_amax = use_existing_amax;
  config.with_2d_quantization = with_2d_quantization;
  config.stochastic_rounding = stochastic_rounding;
  if (stochastic_rounding) {
    TE_FFI_RETURN_IF_ERROR(describe_rng_state(rng_state, device, &config.rng_state));
  }
  const te_status status = te_quantize(&input, &q, &config, stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

template <typename Binding>
auto bind_quantize(Binding binding) {
  // Operands: x, scale (delayed) or [0], amax (delayed, existing NVFP4 amaxes) or [0], rng_state
  // or [0]. (A binding cannot be held in a local: each piece takes the chain so far as a
  // temporary.)
  return attr_quantization(ret_quantized_parts(std::move(binding)
                                                   .template Arg<Buf>()
                                                   .template Arg<Buf>()
                                                   .template Arg<Buf>()
                                                   .template Arg<Buf>()))
      .template Attr<bool>("use_existing_amax")
      .template Attr<bool>("with_2d_quantization")
      .template Attr<bool>("stochastic_rounding")
      .template Attr<bool>("columnwise_rht");
}

}  // namespace
}  // namespace te::xla_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_quantize_ffi_cpu, te::xla_ffi::on_cpu(te::xla_ffi::quantize),
                              te::xla_ffi::bind_quantize(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_quantize_ffi_cuda, te::xla_ffi::on_cuda(te::xla_ffi::quantize),
                              te::xla_ffi::bind_quantize(te::xla_ffi::cuda_binding()));
