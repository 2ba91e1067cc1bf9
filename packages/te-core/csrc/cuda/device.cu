// Device queries for the CUDA backend: the device count (cached; kernels.h's available() uses it),
// making a device current, the multiprocessor count the grid sizes use and the DRAM bandwidth per
// SM that a kernel choice reads (both cached per ordinal).
#include <algorithm>
#include <atomic>
#include <cstdint>

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

int dram_mbps_per_sm() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices] = {};  // value + 1, so an unknown 0 is cached too
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known > 0) return known - 1;
  }
  // A device that does not report its memory clock (0 or an error) counts as 0: the kernel
  // choices that read this keep their default for it.
  int khz = 0, bits = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    (void)cudaGetLastError();
    khz = bits = 0;
  }
  // kHz x 1000 = Hz; Hz x bits x 2 / 8 = bytes/s; / 1e6 = MB/s (H200: 3201 MHz x 6144 bits = 4.9 TB/s).
  const int64_t mbps = static_cast<int64_t>(khz) * bits * 2 / 8 / 1000;
  const int n = static_cast<int>(mbps / std::max(1, sm_count()));
  if (cached) cache[device].store(n + 1, std::memory_order_relaxed);
  return n;
}

}  // namespace cuda
}  // namespace te
