// te_gemm_ffi: te_gemm as an XLA custom call (row-major, te/gemm.h).
//
// Operands:
//   0 a_data, 1 a_scale_inv: A's one copy that this layout reads. For FP8 that is the row-wise
//     copy when trans_a = 0 and the column-wise one when trans_a = 1 (attribute a_columnwise says
//     which, as te_dequantize_ffi's `columnwise` does); the other copy is absent from the
//     descriptor, so te_gemm's own copy selection sees exactly what te_jax passed and reports a
//     wrong choice by name. High-precision A is its row-wise data; its a_scale_inv is a [0]
//     placeholder (absent: a scale_inv is passed exactly when the data is FP8 or NVFP4).
//   2 b_data, 3 b_scale_inv: likewise for B (row-wise when trans_b = 1).
//   MXFP8/NVFP4 operands likewise, with their byte scales (NVFP4 data as uint8 bytes,
//   describe_data).
//   4 bias: [N] when has_bias (epilogues BIAS, GELU_AUX), else [0] and absent.
//   5 aux_in: the saved pre-activation [M, N] for DGELU, else [0] and absent.
//   6 d_in: the D to accumulate into when beta != 0, else [0]. te_jax aliases operand 6 to
//     result 0 (input_output_aliases), so XLA hands this handler a D that already holds d_in's
//     values (copying first if d_in is still live elsewhere): beta = 1 accumulates in place here
//     and functionally in JAX. d_in itself is never described to the C API.
//   7 a_amax, 8 b_amax: an NVFP4 operand's fp32 [2] global amaxes, else [0]; attributes
//     a_columnwise_rht / b_columnwise_rht say whether the column-wise copy read carries the
//     Hadamard transform (te_quantized_tensor.columnwise_rht).
// Results, in te_core._ops.GEMM_OUTPUTS order (shapes from te_core._ops.gemm_outputs):
//   0 d [M, N], 1 aux [M, N] (GELU_AUX) else [0], 2 bias_grad [M] (BGRAD) else [0].
// Attributes: a_scaling_mode, b_scaling_mode, a_columnwise, b_columnwise, trans_a, trans_b,
// alpha, beta, epilogue (te_gemm_epilogue), has_bias, use_split_accumulator (-1, 0, 1),
// a_columnwise_rht, b_columnwise_rht.
// No workspace: te keeps a cuBLASLt workspace per stream on CUDA.
//
// te_gemm_act_ffi: te_gemm's GELU_AUX / DGELU with a per-tensor FP8 output (te/gemm.h), an MLP's
// FC1 with gelu quantized for FC2, or FC2's dgrad with the gelu backward quantized for FC1's
// backward GEMMs, under delayed scaling. Per-tensor FP8 operands only.
// Operands:
//   0-3 a_data, a_scale_inv, b_data, b_scale_inv as te_gemm_ffi's.
//   4 bias: [N] when has_bias (GELU_AUX), else [0].
//   5 aux_in: the saved pre-activation [M, N] (DGELU), else [0].
//   6 scale: D's fp32 [1] delayed scale (read).
//   7 amax_in: fp32 [1], aliased to result 4: te_gemm max-accumulates D's amax, so te_jax passes
//     zeros for this op's own amax.
// Results: 0-5 D's quantized parts in te_core._ops.QUANTIZE_OUTPUTS order (rowwise [M, N], its
//   scale_inv, columnwise [N, M] and its scale_inv or [0] each, amax [1], scale [0]); 6 aux: the
//   pre-activation [M, N] (GELU_AUX) or [0]; 7 bias_grad [N] (DGELU with has_bias_grad) or [0];
//   8 product [M, N] of aux's dtype (DGELU: te_gemm_config.dgelu_product, XLA's scratch for the
//   product where te runs the GEMM and the activation pass separately) or [0].
// Attributes: a_columnwise, b_columnwise, trans_a, trans_b, epilogue (GELU_AUX or DGELU),
// has_bias, has_bias_grad, use_split_accumulator, columnwise (D's column-wise copy wanted).
#include "ffi_common.h"

namespace te::xla_ffi {
namespace {

using Buf = ffi::AnyBuffer;
using Ret = ffi::Result<ffi::AnyBuffer>;

bool is_fp8(const Buf& buffer) {
  const int32_t dtype = te_dtype_of(buffer.element_type());
  return dtype == TE_DTYPE_FLOAT8_E4M3 || dtype == TE_DTYPE_FLOAT8_E5M2;
}

// One operand as a te_quantized_tensor holding only the copy `columnwise` names.
ffi::Error operand(const Buf& data, const Buf& scale_inv, const Buf& amax,
                   const te_device& device, int32_t scaling_mode, bool columnwise,
                   bool columnwise_rht, const char* data_name, const char* scale_name,
                   const char* amax_name, te_quantized_tensor* out) {
  *out = te_quantized_tensor_init(scaling_mode);
  const bool nvfp4 = scaling_mode == TE_SCALING_NVFP4_1D;
  te_tensor& q_data = columnwise ? out->columnwise_data : out->rowwise_data;
  te_tensor& q_scale_inv = columnwise ? out->columnwise_scale_inv : out->rowwise_scale_inv;
  TE_FFI_RETURN_IF_ERROR(describe_data(data, device, true, scaling_mode, data_name, &q_data));
  TE_FFI_RETURN_IF_ERROR(describe(amax, device, nvfp4, amax_name, &out->amax));
  out->columnwise_rht = columnwise_rht;
  return describe(scale_inv, device, is_fp8(data) || nvfp4, scale_name, &q_scale_inv);
}

// The layout and epilogue fields of `config` and the epilogue's buffers: bias read where
// `has_bias`, aux read by DGELU (aux_in) or written by GELU_AUX (aux), bias_grad written where
// `has_bias_grad`.
ffi::Error epilogue_config(const te_device& device, bool trans_a, bool trans_b, int32_t epilogue,
                           int32_t use_split_accumulator, const Buf& bias, bool has_bias,
                           const Buf& aux_in, Ret& aux, Ret& bias_grad, bool has_bias_grad,
                           te_gemm_config* config) {
  config->trans_a = trans_a;
  config->trans_b = trans_b;
  config->epilogue = epilogue;
  config->use_split_accumulator = use_split_accumulator;
  TE_FFI_RETURN_IF_ERROR(describe(bias, device, has_bias, "bias", &config->bias));
  if (epilogue == TE_EPILOGUE_DGELU) {
    TE_FFI_RETURN_IF_ERROR(describe(aux_in, device, true, "aux_in", &config->aux));
  } else {
    TE_FFI_RETURN_IF_ERROR(
        describe(aux, device, epilogue == TE_EPILOGUE_GELU_AUX, "aux", &config->aux));
  }
  return describe(bias_grad, device, has_bias_grad, "bias_grad", &config->bias_grad);
}

ffi::Error gemm(te_device device, void* stream, Buf a_data, Buf a_scale_inv, Buf b_data,
                Buf b_scale_inv, Buf bias, Buf aux_in, Buf d_in, Buf a_amax, Buf b_amax, Ret d,
                Ret aux, Ret bias_grad, int32_t a_scaling_mode, int32_t b_scaling_mode,
                bool a_columnwise, bool b_columnwise, bool trans_a, bool trans_b, float alpha,
                float beta, int32_t epilogue, bool has_bias, int32_t use_split_accumulator,
                bool a_columnwise_rht, bool b_columnwise_rht) {
  te_quantized_tensor a, b;
  TE_FFI_RETURN_IF_ERROR(operand(a_data, a_scale_inv, a_amax, device, a_scaling_mode,
                                 a_columnwise, a_columnwise_rht, "a_data", "a_scale_inv",
                                 "a_amax", &a));
  TE_FFI_RETURN_IF_ERROR(operand(b_data, b_scale_inv, b_amax, device, b_scaling_mode,
                                 b_columnwise, b_columnwise_rht, "b_data", "b_scale_inv",
                                 "b_amax", &b));
  te_quantized_tensor out = te_quantized_tensor_init(TE_SCALING_PER_TENSOR);
  TE_FFI_RETURN_IF_ERROR(describe(d, device, true, "d", &out.rowwise_data));
  if (beta != 0.0f && d->element_count() > 0 && d_in.untyped_data() != d->untyped_data()) {
    // Without the alias, D holds no defined values to accumulate into.
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "d_in: beta != 0 needs operand 6 (d_in) aliased to result 0 (d) through "
                      "input_output_aliases, got separate buffers");
  }

  te_gemm_config config = te_gemm_config_init();
  config.alpha = alpha;
  config.beta = beta;
  TE_FFI_RETURN_IF_ERROR(epilogue_config(device, trans_a, trans_b, epilogue,
                                         use_split_accumulator, bias, has_bias, aux_in, aux,
                                         bias_grad, epilogue == TE_EPILOGUE_BGRAD, &config));
  const te_status status = te_gemm(&a, &b, &out, &config, stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

ffi::Error gemm_act(te_device device, void* stream, Buf a_data, Buf a_scale_inv, Buf b_data,
                    Buf b_scale_inv, Buf bias, Buf aux_in, Buf scale_in, Buf amax_in,
                    Ret rowwise_data, Ret rowwise_scale_inv, Ret columnwise_data,
                    Ret columnwise_scale_inv, Ret amax, Ret scale, Ret aux, Ret bias_grad,
                    Ret product, bool a_columnwise, bool b_columnwise, bool trans_a,
                    bool trans_b, int32_t epilogue, bool has_bias, bool has_bias_grad,
                    int32_t use_split_accumulator, bool columnwise) {
  if (epilogue != TE_EPILOGUE_GELU_AUX && epilogue != TE_EPILOGUE_DGELU) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "epilogue: expected GELU_AUX (2) or DGELU (3) for te_gemm_act_ffi, got " +
                          std::to_string(epilogue));
  }
  const bool dgelu = epilogue == TE_EPILOGUE_DGELU;
  te_quantized_tensor a, b;
  // Per-tensor operands carry no amax of their own: operand() leaves it absent.
  TE_FFI_RETURN_IF_ERROR(operand(a_data, a_scale_inv, amax_in, device, TE_SCALING_PER_TENSOR,
                                 a_columnwise, false, "a_data", "a_scale_inv", "a_amax", &a));
  TE_FFI_RETURN_IF_ERROR(operand(b_data, b_scale_inv, amax_in, device, TE_SCALING_PER_TENSOR,
                                 b_columnwise, false, "b_data", "b_scale_inv", "b_amax", &b));
  te_quantized_tensor d;
  bool reset_amax;
  TE_FFI_RETURN_IF_ERROR(describe_output(device, true, TE_SCALING_PER_TENSOR, true, columnwise,
                                         false, scale_in, amax_in, rowwise_data,
                                         rowwise_scale_inv, columnwise_data, columnwise_scale_inv,
                                         amax, scale, &d, &reset_amax));
  if (reset_amax || amax_in.untyped_data() != amax->untyped_data()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "amax_in: expected fp32 [1] aliased to result 4 (amax) through "
                      "input_output_aliases (te_gemm max-accumulates D's amax into it)");
  }
  te_gemm_config config = te_gemm_config_init();
  TE_FFI_RETURN_IF_ERROR(epilogue_config(device, trans_a, trans_b, epilogue,
                                         use_split_accumulator, bias, has_bias, aux_in, aux,
                                         bias_grad, has_bias_grad, &config));
  TE_FFI_RETURN_IF_ERROR(describe(product, device, dgelu, "product", &config.dgelu_product));
  const te_status status = te_gemm(&a, &b, &d, &config, stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

template <typename Binding>
auto bind_gemm(Binding binding) {
  return std::move(binding)
      .template Arg<Buf>()  // a_data
      .template Arg<Buf>()  // a_scale_inv or [0]
      .template Arg<Buf>()  // b_data
      .template Arg<Buf>()  // b_scale_inv or [0]
      .template Arg<Buf>()  // bias or [0]
      .template Arg<Buf>()  // aux_in (DGELU) or [0]
      .template Arg<Buf>()  // d_in (beta != 0, aliased to d) or [0]
      .template Arg<Buf>()  // a_amax (NVFP4) or [0]
      .template Arg<Buf>()  // b_amax (NVFP4) or [0]
      .template Ret<Buf>()  // d
      .template Ret<Buf>()  // aux (GELU_AUX) or [0]
      .template Ret<Buf>()  // bias_grad (BGRAD) or [0]
      .template Attr<int32_t>("a_scaling_mode")
      .template Attr<int32_t>("b_scaling_mode")
      .template Attr<bool>("a_columnwise")
      .template Attr<bool>("b_columnwise")
      .template Attr<bool>("trans_a")
      .template Attr<bool>("trans_b")
      .template Attr<float>("alpha")
      .template Attr<float>("beta")
      .template Attr<int32_t>("epilogue")
      .template Attr<bool>("has_bias")
      .template Attr<int32_t>("use_split_accumulator")
      .template Attr<bool>("a_columnwise_rht")
      .template Attr<bool>("b_columnwise_rht");
}

template <typename Binding>
auto bind_gemm_act(Binding binding) {
  return ret_quantized_parts(std::move(binding)
                                 .template Arg<Buf>()   // a_data
                                 .template Arg<Buf>()   // a_scale_inv
                                 .template Arg<Buf>()   // b_data
                                 .template Arg<Buf>()   // b_scale_inv
                                 .template Arg<Buf>()   // bias or [0]
                                 .template Arg<Buf>()   // aux_in (DGELU) or [0]
                                 .template Arg<Buf>()   // scale
                                 .template Arg<Buf>())  // amax_in (aliased to result 4)
      .template Ret<Buf>()  // aux (GELU_AUX) or [0]
      .template Ret<Buf>()  // bias_grad or [0]
      .template Ret<Buf>()  // product (DGELU) or [0]
      .template Attr<bool>("a_columnwise")
      .template Attr<bool>("b_columnwise")
      .template Attr<bool>("trans_a")
      .template Attr<bool>("trans_b")
      .template Attr<int32_t>("epilogue")
      .template Attr<bool>("has_bias")
      .template Attr<bool>("has_bias_grad")
      .template Attr<int32_t>("use_split_accumulator")
      .template Attr<bool>("columnwise");
}

}  // namespace
}  // namespace te::xla_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_gemm_ffi_cpu, te::xla_ffi::on_cpu(te::xla_ffi::gemm),
                              te::xla_ffi::bind_gemm(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_gemm_ffi_cuda, te::xla_ffi::on_cuda(te::xla_ffi::gemm),
                              te::xla_ffi::bind_gemm(te::xla_ffi::cuda_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_gemm_act_ffi_cpu, te::xla_ffi::on_cpu(te::xla_ffi::gemm_act),
                              te::xla_ffi::bind_gemm_act(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_gemm_act_ffi_cuda, te::xla_ffi::on_cuda(te::xla_ffi::gemm_act),
                              te::xla_ffi::bind_gemm_act(te::xla_ffi::cuda_binding()));
