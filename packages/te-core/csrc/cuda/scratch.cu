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

// A few small scratch blocks of the legacy default stream (torch's default stream) are kept for
// the next call instead of going back to the pool: on the H200 host the pool's alloc + free pair
// cost ~10 us per call, a fifth of a small Linear step's te-core time (NOTES.md). Only that stream:
// it is never destroyed, and a block reused in the stream it was freed in needs no other ordering
// (calls from two host threads reach the stream in the order they take the mutex). A graph
// capture never runs on it, so a captured call still takes pool memory the graph owns.
constexpr size_t kKeepMaxBytes = size_t(8) << 20;
constexpr size_t kKeepGranule = size_t(256) << 10;
constexpr int kKeepBlocks = 4;

struct Kept {
  void* ptr = nullptr;
  size_t bytes = 0;
};

std::mutex kept_mutex;
Kept kept[kMaxDevices][kKeepBlocks];

bool keeps(cudaStream_t stream, size_t bytes) {
  return (stream == nullptr || stream == cudaStreamLegacy) && bytes <= kKeepMaxBytes;
}

// The smallest kept block of `device` holding `bytes`, taken out of the list (ptr null: none).
Kept take_kept(int device, size_t bytes) {
  std::lock_guard<std::mutex> lock(kept_mutex);
  Kept* best = nullptr;
  for (Kept& k : kept[device]) {
    if (k.ptr != nullptr && k.bytes >= bytes && (best == nullptr || k.bytes < best->bytes)) best = &k;
  }
  if (best == nullptr) return Kept{};
  const Kept out = *best;
  *best = Kept{};
  return out;
}

// Keeps `block` in a free slot, or in place of a smaller one (freed); false: not kept.
bool keep(int device, Kept block) {
  std::lock_guard<std::mutex> lock(kept_mutex);
  Kept* slot = nullptr;
  for (Kept& k : kept[device]) {
    if (k.ptr == nullptr) {
      slot = &k;
      break;
    }
    if (k.bytes < block.bytes && (slot == nullptr || k.bytes < slot->bytes)) slot = &k;
  }
  if (slot == nullptr) return false;
  if (slot->ptr != nullptr) (void)cudaFreeAsync(slot->ptr, cudaStreamLegacy);
  *slot = block;
  return true;
}

}  // namespace

Scratch::Scratch(size_t bytes, cudaStream_t stream, const char* what) : stream_(stream) {
  if (bytes == 0) return;
  if (keeps(stream, bytes)) {
    check_cuda(cudaGetDevice(&device_), "cudaGetDevice");
    if (device_ < 0 || device_ >= kMaxDevices) fail(TE_ERROR_UNSUPPORTED, "CUDA device ", device_);
    const Kept k = take_kept(device_, bytes);
    if (k.ptr != nullptr) {
      ptr_ = k.ptr;
      bytes_ = k.bytes;
      return;
    }
    bytes = (bytes + kKeepGranule - 1) / kKeepGranule * kKeepGranule;
  }
  check_cuda(cudaMallocFromPoolAsync(&ptr_, bytes, pool_for_current_device(), stream), what);
  bytes_ = bytes;
}

Scratch::~Scratch() {
  if (ptr_ == nullptr) return;
  if (device_ >= 0 && keep(device_, Kept{ptr_, bytes_})) return;
  (void)cudaFreeAsync(ptr_, stream_);
}

}  // namespace cuda
}  // namespace te
