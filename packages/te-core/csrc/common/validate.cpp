#include "common/validate.h"

#include <sstream>

#include "common/error.h"
#include "common/kernels.h"
#include "te/gemm.h"

namespace te {

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32: return "float32";
    case TE_DTYPE_FLOAT16: return "float16";
    case TE_DTYPE_BFLOAT16: return "bfloat16";
    case TE_DTYPE_FLOAT8_E4M3: return "float8_e4m3";
    case TE_DTYPE_FLOAT8_E5M2: return "float8_e5m2";
    case TE_DTYPE_FLOAT4_E2M1: return "float4_e2m1";
    case TE_DTYPE_FLOAT8_E8M0: return "float8_e8m0";
    case TE_DTYPE_INT32: return "int32";
    case TE_DTYPE_INT64: return "int64";
    case TE_DTYPE_UINT8: return "uint8";
  }
  return "unknown";
}

const char* scaling_mode_name(int32_t mode) {
  switch (mode) {
    case TE_SCALING_PER_TENSOR: return "per_tensor";
    case TE_SCALING_BLOCK_1D: return "block_1d";
    case TE_SCALING_BLOCK_2D: return "block_2d";
    case TE_SCALING_MXFP8_1D: return "mxfp8_1d";
    case TE_SCALING_NVFP4_1D: return "nvfp4_1d";
  }
  return "unknown";
}

const char* epilogue_name(int32_t epilogue) {
  switch (epilogue) {
    case TE_EPILOGUE_DEFAULT: return "DEFAULT";
    case TE_EPILOGUE_BIAS: return "BIAS";
    case TE_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case TE_EPILOGUE_DGELU: return "DGELU";
    case TE_EPILOGUE_BGRAD: return "BGRAD";
  }
  return "unknown";
}

bool is_fp8(int32_t dtype) {
  return dtype == TE_DTYPE_FLOAT8_E4M3 || dtype == TE_DTYPE_FLOAT8_E5M2;
}

std::string shape_string(const int64_t* shape, int32_t ndim) {
  std::ostringstream out;
  out << '[';
  for (int32_t i = 0; i < ndim; ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return shape_string(shape.data(), static_cast<int32_t>(shape.size()));
}

int64_t numel(const te_tensor& t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

bool checked_numel(const int64_t* shape, int32_t ndim, int64_t* out) {
  int64_t n = 1;
  bool overflow = false;
  for (int32_t i = 0; i < ndim; ++i) {
    if (shape[i] == 0) {
      *out = 0;
      return true;
    }
    overflow = overflow || __builtin_mul_overflow(n, shape[i], &n);
  }
  *out = n;
  return !overflow;
}

void matrix_dims(const te_tensor& t, int64_t* rows, int64_t* cols) {
  *cols = t.ndim == 0 ? 1 : t.shape[t.ndim - 1];
  *rows = 1;
  for (int32_t i = 0; i + 1 < t.ndim; ++i) *rows *= t.shape[i];
}

int32_t dtype_bits(int32_t dtype) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32:
    case TE_DTYPE_INT32: return 32;
    case TE_DTYPE_INT64: return 64;
    case TE_DTYPE_FLOAT16:
    case TE_DTYPE_BFLOAT16: return 16;
    case TE_DTYPE_FLOAT8_E4M3:
    case TE_DTYPE_FLOAT8_E5M2:
    case TE_DTYPE_FLOAT8_E8M0:
    case TE_DTYPE_UINT8: return 8;
    case TE_DTYPE_FLOAT4_E2M1: return 4;
  }
  fail(TE_ERROR_INVALID_ARGUMENT, "dtype: expected a te_dtype value 0..9, got ", dtype);
}

bool present(const te_tensor& t) {
  // Frameworks give zero-size tensors a NULL pointer; a zeroed descriptor (ndim 0: one element,
  // no data) is the "absent" one. A 0 in the shape, not numel() == 0: an unchecked shape's
  // product may overflow.
  if (t.data != nullptr) return true;
  for (int32_t i = 0; i < t.ndim && i < TE_MAX_DIMS; ++i) {
    if (t.shape[i] == 0) return true;
  }
  return false;
}

void check_tensor(const te_tensor* t, const std::string& name) {
  TE_CHECK_ARG(t != nullptr, name, ": expected a tensor descriptor, got NULL");
  check_tensor(*t, name);
}

void check_tensor(const te_tensor& t, const std::string& name) {
  TE_CHECK_ARG(t.ndim >= 0 && t.ndim <= TE_MAX_DIMS, name, ".ndim: expected 0..", TE_MAX_DIMS,
               ", got ", t.ndim);
  for (int32_t i = 0; i < t.ndim; ++i) {
    TE_CHECK_ARG(t.shape[i] >= 0, name, ".shape: expected non-negative sizes, got ",
                 shape_string(t.shape, t.ndim));
  }
  TE_CHECK_ARG(t.dtype >= TE_DTYPE_FLOAT32 && t.dtype <= TE_DTYPE_UINT8, name,
               ".dtype: expected a te_dtype value 0..9, got ", t.dtype);
  const int32_t bits = dtype_bits(t.dtype);
  // The byte count must fit too: kernels index elements (and bytes) with int64.
  int64_t n = 0, byte_count = 0;
  TE_CHECK_ARG(checked_numel(t.shape, t.ndim, &n) &&
                   !__builtin_mul_overflow(n, static_cast<int64_t>(bits), &byte_count),
               name, ".shape: expected a size whose element and byte counts fit in int64, got ",
               shape_string(t.shape, t.ndim));
  TE_CHECK_ARG(t.device.type == TE_DEVICE_CPU || t.device.type == TE_DEVICE_CUDA, name,
               ".device.type: expected TE_DEVICE_CPU (0) or TE_DEVICE_CUDA (1), got ",
               t.device.type);
  TE_CHECK_ARG(t.device.type == TE_DEVICE_CPU || t.device.index >= 0, name,
               ".device.index: expected a CUDA ordinal >= 0, got ", t.device.index);
  TE_CHECK_ARG(t.data != nullptr || numel(t) == 0, name, ".data: expected a pointer to ",
               numel(t), " elements, got NULL (a tensor without storage, such as one on "
               "PyTorch's meta device, has no data for te to read or write)");
  const int64_t align = bits >= 8 ? bits / 8 : 1;
  TE_CHECK_ARG(reinterpret_cast<uintptr_t>(t.data) % align == 0, name,
               ".data: expected an address aligned to ", align, " bytes (", dtype_name(t.dtype),
               "), got ", t.data);
}

void check_dtype(const te_tensor& t, const std::string& name,
                 std::initializer_list<int32_t> allowed) {
  for (int32_t d : allowed) {
    if (t.dtype == d) return;
  }
  std::ostringstream list;
  bool first = true;
  for (int32_t d : allowed) {
    list << (first ? "" : ", ") << dtype_name(d);
    first = false;
  }
  fail(TE_ERROR_INVALID_ARGUMENT, name, ".dtype: expected ", list.str(), ", got ",
       dtype_name(t.dtype));
}

void check_shape(const te_tensor& t, const std::string& name, const std::vector<int64_t>& expected,
                 const char* why) {
  bool same = t.ndim == static_cast<int32_t>(expected.size());
  for (int32_t i = 0; same && i < t.ndim; ++i) same = t.shape[i] == expected[i];
  TE_CHECK_ARG(same, name, ".shape: expected ", shape_string(expected), " (", why, "), got ",
               shape_string(t.shape, t.ndim));
}

void check_numel(const te_tensor& t, const std::string& name, int64_t expected) {
  TE_CHECK_ARG(numel(t) == expected, name, ".shape: expected ", expected, " element",
               expected == 1 ? "" : "s", ", got ", shape_string(t.shape, t.ndim));
}

void check_same_device(const te_tensor& t, const std::string& name, const te_device& device,
                       const std::string& reference_name) {
  const bool same = t.device.type == device.type &&
                    (device.type == TE_DEVICE_CPU || t.device.index == device.index);
  TE_CHECK_ARG(same, name, ".device: expected the device of ", reference_name, " (",
               device.type == TE_DEVICE_CPU ? "cpu" : "cuda:", 
               device.type == TE_DEVICE_CPU ? std::string() : std::to_string(device.index),
               "), got ", t.device.type == TE_DEVICE_CPU ? "cpu" : "cuda:",
               t.device.type == TE_DEVICE_CPU ? std::string() : std::to_string(t.device.index));
}

void check_no_overlap(const te_tensor& a, const std::string& a_name, const te_tensor& b,
                      const std::string& b_name) {
  const int64_t na = numel(a), nb = numel(b);
  if (a.data == nullptr || b.data == nullptr || na == 0 || nb == 0) return;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data);
  const auto b0 = reinterpret_cast<uintptr_t>(b.data);
  const uintptr_t a1 = a0 + static_cast<uintptr_t>((na * dtype_bits(a.dtype) + 7) / 8);
  const uintptr_t b1 = b0 + static_cast<uintptr_t>((nb * dtype_bits(b.dtype) + 7) / 8);
  TE_CHECK_ARG(a1 <= b0 || b1 <= a0, b_name, ".data: expected a buffer separate from ", a_name,
               "'s (this op does not work in place), got one that overlaps it");
}

void check_struct_size(uint32_t struct_size, size_t min_size, const char* name) {
  TE_CHECK_ARG(struct_size >= min_size, name,
               "->struct_size: expected at least ", min_size,
               " (set it with the *_init() helper of te's headers), got ", struct_size);
}

int32_t columnwise_rht_of(const te_quantized_tensor& q) {
  return q.struct_size >= offsetof(te_quantized_tensor, columnwise_rht) + sizeof(int32_t)
             ? q.columnwise_rht
             : 0;
}

void require_cuda(const te_device& device, const std::string& name) {
  if (!cuda::available()) {
#ifdef TE_WITH_CUDA
    fail(TE_ERROR_UNSUPPORTED, name, " is on cuda:", device.index,
         " but no CUDA device is usable here (no GPU, or no NVIDIA driver)");
#else
    fail(TE_ERROR_UNSUPPORTED, name, " is on cuda:", device.index,
         " but this te-core was built without CUDA (TE_CUDA_ARCHS was empty); reinstall a "
         "CUDA build or keep tensors on the CPU");
#endif
  }
  cuda::set_device(device.index);
}

}  // namespace te
