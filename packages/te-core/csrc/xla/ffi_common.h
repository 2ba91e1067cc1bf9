// Shared by te's XLA FFI handlers (te_jax's custom calls): the bridge from an XLA FFI call frame
// to the C API's descriptors, and the per-platform binding.
//
// One handler body serves both platforms. It takes the te_device to put in every descriptor and
// the stream to pass to the C API; the CPU binding supplies {CPU, 0} and no stream, the CUDA
// binding XLA's stream (PlatformStream<void*>, so _C needs no CUDA header) and the device
// ordinal XLA runs the computation on (DeviceOrdinal). The C API then dispatches on the
// descriptors' device like any other caller's.
//
// Errors never cross XLA as exceptions: a failed te_status becomes an ffi::Error carrying
// te_last_error()'s text (INVALID_ARGUMENT for bad arguments, UNIMPLEMENTED for what this build
// or device cannot do, INTERNAL for CUDA failures), which jax raises as a JaxRuntimeError.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "te/te.h"
#include "xla/ffi/api/ffi.h"


namespace te::xla_ffi {

namespace ffi = ::xla::ffi;

// The te dtype of an XLA element type, or -1 where te has none.
inline int32_t te_dtype_of(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F32: return TE_DTYPE_FLOAT32;
    case ffi::DataType::F16: return TE_DTYPE_FLOAT16;
    case ffi::DataType::BF16: return TE_DTYPE_BFLOAT16;
    case ffi::DataType::F8E4M3FN: return TE_DTYPE_FLOAT8_E4M3;
    case ffi::DataType::F8E5M2: return TE_DTYPE_FLOAT8_E5M2;
    case ffi::DataType::F8E8M0FNU: return TE_DTYPE_FLOAT8_E8M0;
    case ffi::DataType::F4E2M1FN: return TE_DTYPE_FLOAT4_E2M1;
    case ffi::DataType::S32: return TE_DTYPE_INT32;
    case ffi::DataType::S64: return TE_DTYPE_INT64;
    case ffi::DataType::U8: return TE_DTYPE_UINT8;
    default: return -1;
  }
}

inline ffi::Error status_error(te_status status) {
  const std::string message = te_last_error();
  switch (status) {
    case TE_ERROR_INVALID_ARGUMENT: return ffi::Error(ffi::ErrorCode::kInvalidArgument, message);
    case TE_ERROR_UNSUPPORTED: return ffi::Error(ffi::ErrorCode::kUnimplemented, message);
    default: return ffi::Error(ffi::ErrorCode::kInternal, message);
  }
}

// Describes `buffer` for the C API on `device`; `present` false gives the absent descriptor
// (data NULL) the C API takes for an optional part. Fails only for what a te_tensor cannot
// express (an element type te has no dtype for, more than TE_MAX_DIMS dims); everything else is
// the C API's to check.
inline ffi::Error describe(const ffi::AnyBuffer& buffer, const te_device& device, bool present,
                           const char* name, te_tensor* out) {
  *out = te_tensor{};
  if (!present) return ffi::Error::Success();
  const int32_t dtype = te_dtype_of(buffer.element_type());
  if (dtype < 0) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string(name) + ": expected an element type te knows (f32, f16, bf16, "
                      "f8e4m3fn, f8e5m2, ...), got XLA type " +
                      std::to_string(static_cast<int>(buffer.element_type())));
  }
  const auto dims = buffer.dimensions();
  if (dims.size() > TE_MAX_DIMS) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string(name) + ": expected at most " + std::to_string(TE_MAX_DIMS) +
                      " dims, got " + std::to_string(dims.size()));
  }
  out->data = buffer.untyped_data();
  out->ndim = static_cast<int32_t>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) out->shape[i] = dims[i];
  out->dtype = dtype;
  out->device = device;
  return ffi::Error::Success();
}

inline ffi::Error describe(ffi::Result<ffi::AnyBuffer>& buffer, const te_device& device,
                           bool present, const char* name, te_tensor* out) {
  return describe(*buffer, device, present, name, out);
}

#define TE_FFI_RETURN_IF_ERROR(expr)                   \
  do {                                                 \
    ::xla::ffi::Error te_ffi_error_ = (expr);          \
    if (te_ffi_error_.failure()) return te_ffi_error_; \
  } while (0)

// A quantized copy's data. NVFP4 data crosses XLA as the bytes te stores, uint8 [..., K / 2] (two
// E2M1 elements a byte, te/tensor.h; te_core._ops.storage_shape), never as XLA's f4e2m1fn,
// whose in-memory packing is XLA's choice per platform: under `scaling_mode` NVFP4_1D a uint8
// buffer is described as E2M1 [..., K].
inline ffi::Error describe_data(const ffi::AnyBuffer& buffer, const te_device& device, bool present,
                                int32_t scaling_mode, const char* name, te_tensor* out) {
  TE_FFI_RETURN_IF_ERROR(describe(buffer, device, present, name, out));
  if (present && scaling_mode == TE_SCALING_NVFP4_1D && out->dtype == TE_DTYPE_UINT8 &&
      out->ndim > 0) {
    out->dtype = TE_DTYPE_FLOAT4_E2M1;
    out->shape[out->ndim - 1] *= 2;
  }
  return ffi::Error::Success();
}

inline ffi::Error describe_data(ffi::Result<ffi::AnyBuffer>& buffer, const te_device& device,
                                bool present, int32_t scaling_mode, const char* name,
                                te_tensor* out) {
  return describe_data(*buffer, device, present, scaling_mode, name, out);
}

// The two bindings a handler is defined with: the CPU one has no context, the CUDA one starts
// with (stream, device ordinal).
inline auto cpu_binding() { return ffi::Ffi::Bind(); }
inline auto cuda_binding() {
  return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Ctx<ffi::DeviceOrdinal>();
}

// Adapts a body `Error body(te_device, void* stream, args...)` to each binding's parameters.
template <typename Body>
auto on_cpu(Body body) {
  return [body](auto... args) {
    return body(te_device{TE_DEVICE_CPU, 0}, nullptr, args...);
  };
}
template <typename Body>
auto on_cuda(Body body) {
  return [body](void* stream, int32_t ordinal, auto... args) {
    return body(te_device{TE_DEVICE_CUDA, ordinal}, stream, args...);
  };
}

// The output of a quantizing op (quantize, norm, activation) as a te_quantized_tensor: high
// precision (`quantized` false: rowwise_data alone, PER_TENSOR) or te_quantize_ffi's six parts for
// `scaling_mode`. Delayed scaling (PER_TENSOR, compute_scale false) reads the scale from the
// `scale_in` operand (result `scale` is [0]): no result aliases it, so XLA copies nothing. An
// `amax_in` of fp32 [1] is aliased to result `amax` and max-accumulated into; an `amax_in` of [0]
// leaves result `amax` fresh, and *reset_amax tells the caller to set te_quant_config.reset_amax
// (this op's amax alone, with no zeroed operand for XLA to copy in). Defined in ffi_norm.cpp.
ffi::Error describe_output(const te_device& device, bool quantized, int32_t scaling_mode,
                           bool rowwise, bool columnwise, bool compute_scale,
                           const ffi::AnyBuffer& scale_in, const ffi::AnyBuffer& amax_in,
                           ffi::Result<ffi::AnyBuffer>& rowwise_data,
                           ffi::Result<ffi::AnyBuffer>& rowwise_scale_inv,
                           ffi::Result<ffi::AnyBuffer>& columnwise_data,
                           ffi::Result<ffi::AnyBuffer>& columnwise_scale_inv,
                           ffi::Result<ffi::AnyBuffer>& amax, ffi::Result<ffi::AnyBuffer>& scale,
                           te_quantized_tensor* out, bool* reset_amax);

// Builder pieces every quantizing op shares. An xla::ffi binding cannot be moved into a local, so
// each piece takes the chain so far as a temporary and returns it extended.
// The six results of a quantized output, in te_core._ops.QUANTIZE_OUTPUTS order.
template <typename Binding>
auto ret_quantized_parts(Binding binding) {
  using Buf = ffi::AnyBuffer;
  return std::move(binding)
      .template Ret<Buf>()   // rowwise_data
      .template Ret<Buf>()   // rowwise_scale_inv
      .template Ret<Buf>()   // columnwise_data
      .template Ret<Buf>()   // columnwise_scale_inv
      .template Ret<Buf>()   // amax
      .template Ret<Buf>();  // scale
}

// How to quantize (te_quant_config and the scaling mode), as attributes.
template <typename Binding>
auto attr_quantization(Binding binding) {
  return std::move(binding)
      .template Attr<int32_t>("scaling_mode")
      .template Attr<bool>("rowwise")
      .template Attr<bool>("columnwise")
      .template Attr<bool>("compute_scale")
      .template Attr<bool>("force_pow2_scales")
      .template Attr<float>("amax_epsilon");
}

}  // namespace te::xla_ffi

// The handler symbols, defined in the ffi_*.cpp files beside this one and exported as PyCapsules
// by ffi_targets.cpp.
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_quantize_ffi_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_quantize_ffi_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_dequantize_ffi_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_dequantize_ffi_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_amax_ffi_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_amax_ffi_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_transpose_ffi_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_transpose_ffi_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_gemm_ffi_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_gemm_ffi_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_gemm_act_ffi_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_gemm_act_ffi_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_norm_fwd_ffi_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_norm_fwd_ffi_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_norm_bwd_ffi_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_norm_bwd_ffi_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_act_fwd_ffi_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_act_fwd_ffi_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_act_bwd_ffi_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_act_bwd_ffi_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_dbias_quantize_ffi_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_dbias_quantize_ffi_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_delayed_update_ffi_cpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(te_delayed_update_ffi_cuda);
