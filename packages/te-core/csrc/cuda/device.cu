// Device queries for the CUDA backend: the device count (cached; kernels.h's available() uses it),
// making a device current, and the multiprocessor count the grid sizes use (cached per ordinal).
#include <atomic>

#include "common/kernels.h"
#include "cuda/cuda_utils.cuh"

namespace te {
namespace cuda {

int32_t device_count() {
  // Queried once: a machine's device count does not change while a process runs, and a failure
  // (no driver) means zero devices rather than an error.
  static const int32_t count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    return static_cast<int32_t>(n);
  }();
  return count;
}


void set_device(int32_t device) {
  int current = -1;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices] = {};
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (device >= 0 && device < kMaxDevices) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int n = 0;
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
  if (device >= 0 && device < kMaxDevices) cache[device].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace cuda
}  // namespace te
