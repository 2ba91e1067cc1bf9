// Argument checks shared by the C entry points. Each throws te::Error(TE_ERROR_INVALID_ARGUMENT)
// with a message naming the argument (as the caller wrote it, e.g. "output->rowwise_data"), what
// was expected and what was given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/ieee_denormals.h"
#include "te/tensor.h"

namespace te {

const char* dtype_name(int32_t dtype);
const char* scaling_mode_name(int32_t mode);
const char* epilogue_name(int32_t epilogue);
bool is_fp8(int32_t dtype);
std::string shape_string(const int64_t* shape, int32_t ndim);
std::string shape_string(const std::vector<int64_t>& shape);

int64_t numel(const te_tensor& t);
// The element count of shape[0..ndim) (all sizes >= 0) into *out; false when it overflows int64.
// Only check_tensor and te_quantized_shape need it: every other count is of a checked tensor.
bool checked_numel(const int64_t* shape, int32_t ndim, int64_t* out);
// The matrix view used by every op: cols = last dim (1 for a scalar), rows = numel / cols.
void matrix_dims(const te_tensor& t, int64_t* rows, int64_t* cols);
int32_t dtype_bits(int32_t dtype);  // throws for an unknown dtype

bool present(const te_tensor& t);

// A required tensor: descriptor non-null, ndim and shape sane (sizes >= 0, and the buffer's byte
// count fits in int64), dtype known, data non-null unless it holds no elements, data aligned to
// its element size, device type known.
void check_tensor(const te_tensor* t, const std::string& name);
void check_tensor(const te_tensor& t, const std::string& name);
void check_dtype(const te_tensor& t, const std::string& name, std::initializer_list<int32_t> allowed);
void check_shape(const te_tensor& t, const std::string& name, const std::vector<int64_t>& expected,
                 const char* why);
void check_numel(const te_tensor& t, const std::string& name, int64_t expected);
void check_same_device(const te_tensor& t, const std::string& name, const te_device& device,
                       const std::string& reference_name);
// Two checked tensors that one call reads and writes must not share a byte (a kernel would read
// what it has already overwritten). Empty or absent ones never overlap.
void check_no_overlap(const te_tensor& a, const std::string& a_name, const te_tensor& b,
                      const std::string& b_name);

// Reads a versioned struct's size field: at least `min_size`, the v1 layout.
void check_struct_size(uint32_t struct_size, size_t min_size, const char* name);

// The first published sizes of the structs that grew (te/tensor.h "Versions"): a caller compiled
// against them passes this struct_size, and the fields past it take their defaults.
constexpr size_t kQuantizedTensorV1Size = offsetof(te_quantized_tensor, columnwise_rht);

// te_quantized_tensor.columnwise_rht, or 0 when the caller's struct_size does not reach it.
int32_t columnwise_rht_of(const te_quantized_tensor& q);

// Copies the part of a versioned struct that its struct_size covers (at least `v1_size`) over
// `*out`, which holds the defaults; out->struct_size becomes sizeof(T).
template <typename T>
void read_versioned(const T& in, size_t v1_size, const char* name, T* out) {
  check_struct_size(in.struct_size, v1_size, name);
  const size_t n = in.struct_size < sizeof(T) ? in.struct_size : sizeof(T);
  std::memcpy(static_cast<void*>(out), static_cast<const void*>(&in), n);
  out->struct_size = static_cast<uint32_t>(sizeof(T));
}

// Runs `cpu()` or, for a CUDA device, makes that device current and runs `cuda()`. Fails clearly
// when a CUDA tensor reaches a build or machine without CUDA.
template <typename Cpu, typename Cuda>
void dispatch(const te_device& device, const std::string& name, Cpu&& cpu, Cuda&& cuda);

void require_cuda(const te_device& device, const std::string& name);

template <typename Cpu, typename Cuda>
void dispatch(const te_device& device, const std::string& name, Cpu&& cpu, Cuda&& cuda) {
  if (device.type == TE_DEVICE_CPU) {
    ScopedIeeeDenormals ieee;
    cpu();
  } else {
    require_cuda(device, name);
    cuda();
  }
}

}  // namespace te
