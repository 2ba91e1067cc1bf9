// te_amax_ffi and te_transpose_ffi: te_amax and te_transpose as XLA custom calls.
//   te_amax_ffi:      x (f32/f16/bf16) -> amax fp32 [1] (NaN if any element is NaN).
//   te_transpose_ffi: x [..., K] viewed as [M, K] -> [K, M], same dtype (1, 2 or 4 bytes).
#include "ffi_common.h"

namespace te::xla_ffi {
namespace {

using Buf = ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

ffi::Error amax(te_device device, void* stream, Buf x, Ret out) {
  te_tensor input, amax_t;
  TE_FFI_RETURN_IF_ERROR(describe(x, device, true, "x", &input));
  TE_FFI_RETURN_IF_ERROR(describe(out, device, true, "amax", &amax_t));
  const te_status status = te_amax(&input, &amax_t, stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

ffi::Error transpose(te_device device, void* stream, Buf x, Ret out) {
  te_tensor input, output;
  TE_FFI_RETURN_IF_ERROR(describe(x, device, true, "x", &input));
  TE_FFI_RETURN_IF_ERROR(describe(out, device, true, "output", &output));
  const te_status status = te_transpose(&input, &output, stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

template <typename Binding>
auto bind_unary(Binding binding) {
  return std::move(binding).template Arg<Buf>().template Ret<Buf>();
}

}  // namespace
}  // namespace te::xla_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_amax_ffi_cpu, te::xla_ffi::on_cpu(te::xla_ffi::amax),
                              te::xla_ffi::bind_unary(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_amax_ffi_cuda, te::xla_ffi::on_cuda(te::xla_ffi::amax),
                              te::xla_ffi::bind_unary(te::xla_ffi::cuda_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_transpose_ffi_cpu, te::xla_ffi::on_cpu(te::xla_ffi::transpose),
                              te::xla_ffi::bind_unary(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_transpose_ffi_cuda,
                              te::xla_ffi::on_cuda(te::xla_ffi::transpose),
                              te::xla_ffi::bind_unary(te::xla_ffi::cuda_binding()));
