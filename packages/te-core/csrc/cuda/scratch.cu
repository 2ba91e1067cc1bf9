#include <cstdint>
#include <mutex>

#include "cuda/cuda_utils.cuh"
#include "cuda/scratch.cuh"

namespace te {
namespace cuda {
namespace {

constexpr int kMaxDevices = 64;

cudaMemPool_t pool_for_current_device() {
  static std::mutex mutex;
  static cudaMemPool_t pools[kMaxDevices] = {};
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (device < 0 || device >= kMaxDevices) fail(TE_ERROR_UNSUPPORTED, "CUDA device ", device);
  std::lock_guard<std::mutex> lock(mutex);
  if (pools[device] == nullptr) {
    RelaxedCapture relaxed;  // the first scratch may be asked for inside a graph capture
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check_cuda(cudaMemPoolCreate(&pools[device], &props), "cudaMemPoolCreate (te scratch pool)");
    uint64_t keep = UINT64_MAX;
    check_cuda(cudaMemPoolSetAttribute(pools[device], cudaMemPoolAttrReleaseThreshold, &keep),
               "cudaMemPoolSetAttribute(ReleaseThreshold) (te scratch pool)");
  }
  return pools[device];
}

}  // namespace

Scratch::Scratch(size_t bytes, cudaStream_t stream, const char* what) : stream_(stream) {
  if (bytes == 0) return;
  check_cuda(cudaMallocFromPoolAsync(&ptr_, bytes, pool_for_current_device(), stream), what);
}

Scratch::~Scratch() {
  if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
}

}  // namespace cuda
}  // namespace te
