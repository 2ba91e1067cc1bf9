// Argument checks shared by the C entry points. Each throws te::Error(TE_ERROR_INVALID_ARGUMENT)
// with a message naming the argument (as the caller wrote it, e.g. "output->rowwise_data"), what
// was expected and what was given.
#pragma once

#include <cstdint>
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
// The matrix view used by every op: cols = last dim (1 for a scalar), rows = numel / cols.
void matrix_dims(const te_tensor& t, int64_t* rows, int64_t* cols);
int32_t dtype_bits(int32_t dtype);  // throws for an unknown dtype

bool present(const te_tensor& t);

// A required tensor: descriptor non-null, ndim and shape sane, data non-null unless it holds no
// elements, data aligned to its element size, device type known.
void check_tensor(const te_tensor* t, const std::string& name);
void check_tensor(const te_tensor& t, const std::string& name);
void check_dtype(const te_tensor& t, const std::string& name, std::initializer_list<int32_t> allowed);
void check_shape(const te_tensor& t, const std::string& name, const std::vector<int64_t>& expected,
                 const char* why);
void check_numel(const te_tensor& t, const std::string& name, int64_t expected);
void check_same_device(const te_tensor& t, const std::string& name, const te_device& device,
                       const std::string& reference_name);

// Reads a versioned struct's size field: at least `min_size`, the v1 layout.
void check_struct_size(uint32_t struct_size, size_t min_size, const char* name);

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
