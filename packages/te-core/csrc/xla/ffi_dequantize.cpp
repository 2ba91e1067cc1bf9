// te_dequantize_ffi: te_dequantize as an XLA custom call.
//
// Operands: data (the row-wise copy [..., K], or with `columnwise` the column-wise copy [K, M];
// NVFP4's as uint8 bytes, describe_data), its scale_inv, and amax: NVFP4's fp32 [2] global amaxes,
// else [0]. Result: the source-shaped tensor in the result's element type (f32/f16/bf16).
// Attributes: scaling_mode, columnwise, columnwise_rht (NVFP4: the column-wise copy carries the
// Hadamard transform, which te_dequantize undoes).
#include "ffi_common.h"

namespace te::xla_ffi {
namespace {

using Buf = ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

ffi::Error dequantize(te_device device, void* stream, Buf data, Buf scale_inv, Buf amax, Ret out,
                      int32_t scaling_mode, bool columnwise, bool columnwise_rht) {
  te_quantized_tensor q = te_quantized_tensor_init(scaling_mode);
  te_tensor& q_data = columnwise ? q.columnwise_data : q.rowwise_data;
  te_tensor& q_scale_inv = columnwise ? q.columnwise_scale_inv : q.rowwise_scale_inv;
  TE_FFI_RETURN_IF_ERROR(describe_data(data, device, true, scaling_mode, "data", &q_data));
  TE_FFI_RETURN_IF_ERROR(describe(scale_inv, device, true, "scale_inv", &q_scale_inv));
  TE_FFI_RETURN_IF_ERROR(
      describe(amax, device, scaling_mode == TE_SCALING_NVFP4_1D, "amax", &q.amax));
  q.columnwise_rht = columnwise_rht;
  te_tensor output;
  TE_FFI_RETURN_IF_ERROR(describe(out, device, true, "output", &output));
  const te_status status = te_dequantize(&q, &output, stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

template <typename Binding>
auto bind_dequantize(Binding binding) {
  return std::move(binding)
      .template Arg<Buf>()  // data
      .template Arg<Buf>()  // scale_inv
      .template Arg<Buf>()  // amax (NVFP4) or [0]
      .template Ret<Buf>()  // output
      .template Attr<int32_t>("scaling_mode")
      .template Attr<bool>("columnwise")
      .template Attr<bool>("columnwise_rht");
}

}  // namespace
}  // namespace te::xla_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_dequantize_ffi_cpu,
                              te::xla_ffi::on_cpu(te::xla_ffi::dequantize),
                              te::xla_ffi::bind_dequantize(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_dequantize_ffi_cuda,
                              te::xla_ffi::on_cuda(te::xla_ffi::dequantize),
                              te::xla_ffi::bind_dequantize(te::xla_ffi::cuda_binding()));
