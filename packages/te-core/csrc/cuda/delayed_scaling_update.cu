// Delayed-scaling update (te/recipe.h, NUMERICS.md) for a batch of histories, one launch per 48
// entries (one launch in practice: the entries travel by value in the kernel's parameter block,
// 48 of them ~3.4 KB, under the classic 4 KB limit). A batch of at most 4 entries (a model of a
// few layers, or one updated alone) launches with a parameter block of 4 (~0.3 KB): the driver
// copies the whole block into the launch, and a small model's step makes one such launch (its
// forward and backward histories together: each entry carries its own scaled_max and algo,
// te_delayed_scaling_update_groups).
// Per column n of an entry's history [L, N] (element (j, n) at j * N + n):
//   amax     = max over the column (NaN propagates; nan_max) or history[0] (most_recent);
//   scale[n] = delayed_scale_from_amax(amax, entry's scaled_max, scale[n]);
//   roll:    new[j] = old[j + 1], new[L - 1] = old[0], then new[0] = 0.
//
// A CTA owns up to 32 columns of one entry (fewer when N is small, so a 1-D history of 1024 steps
// still gets 256 threads along it). The roll is in place, so it walks the column in segments of
// kRowsPerThread steps per row of threads: each thread reads its old[j + 1] of the segment, a
// barrier, then it writes their new[j]. A segment's writes (positions < j0 + S) never touch what
// the next segment reads (positions > j0 + S), so one barrier per segment suffices; old[0] is read
// before the first barrier and written back last. Out of place (te_delayed_scaling_next_groups)
// the reads come from history_in, which no write touches; an entry's amax joins old[0] first.
#include <cmath>

#include "common/kernels.h"
#include "cuda/cuda_utils.cuh"
#include "te/recipe.h"

namespace te {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxEntries = 48;
constexpr int kFewEntries = 4;
// Rows of its column a thread loads before a segment's barrier: all in flight at once, so a
// 1024-step history of a few columns takes one segment (one barrier), not 16.
constexpr int kRowsPerThread = 16;

template <int kCap>
struct UpdateParams {
  DelayedScalingEntry entries[kCap];
  int64_t block_start[kCap + 1];  // first CTA of each entry; [count] = total
  int32_t count;
};

// Columns per CTA for an entry of N columns: the smallest power of two >= N, at most 32.
__host__ __device__ inline int columns_per_block(int64_t num) {
  int cw = 1;
  while (cw < 32 && cw < num) cw *= 2;
  return cw;
}

template <int kCap>
__global__ void __launch_bounds__(kThreads) delayed_scaling_update_kernel(const UpdateParams<kCap> p) {
  __shared__ float partial[kThreads];
  const int64_t b = blockIdx.x;
  int e = 0;
  while (e + 1 < p.count && p.block_start[e + 1] <= b) ++e;
  const DelayedScalingEntry entry = p.entries[e];
  const int64_t len = entry.history_len, num = entry.num;
  const int cw = columns_per_block(num), rows_per_step = kThreads / cw;
  const int c = threadIdx.x % cw, r = threadIdx.x / cw;
  const int64_t n = (b - p.block_start[e]) * cw + c;
  const bool valid = n < num;
  float* h = entry.amax_history;
  const float* old = entry.history_in != nullptr ? entry.history_in : h;

  float first = (valid && r == 0) ? old[n] : 0.0f;
  if (entry.amax != nullptr && valid && r == 0) first = nan_max(first, entry.amax[n]);
  float m = r == 0 ? first : -INFINITY;  // -inf: the identity of nan_max
  const int64_t segment = static_cast<int64_t>(rows_per_step) * kRowsPerThread;
  for (int64_t j0 = 0; j0 < len - 1; j0 += segment) {
    float v[kRowsPerThread];
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) {
      const int64_t j = j0 + r + static_cast<int64_t>(k) * rows_per_step;
      v[k] = valid && j + 1 < len ? old[(j + 1) * num + n] : -INFINITY;
    }
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) m = nan_max(m, v[k]);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) {
      const int64_t j = j0 + r + static_cast<int64_t>(k) * rows_per_step;
      if (valid && j + 1 < len) h[j * num + n] = v[k];
    }
  }

  partial[threadIdx.x] = m;
  __syncthreads();
  if (valid && r == 0) {
    float amax = first;
    if (entry.amax_compute_algo == TE_AMAX_COMPUTE_MAX) {
      for (int k = 0; k < rows_per_step; ++k) amax = nan_max(amax, partial[k * cw + c]);
    }
    const float* old_scale = entry.scale_in != nullptr ? entry.scale_in : entry.scale;
    entry.scale[n] = delayed_scale_from_amax(amax, entry.scaled_max, old_scale[n]);
    if (len > 1) h[(len - 1) * num + n] = first;
    h[n] = 0.0f;
  }
}

// One launch for entries[0, count), count <= kCap.
template <int kCap>
void launch(const DelayedScalingEntry* entries, int32_t count, void* stream) {
  UpdateParams<kCap> p{};
  p.count = count;
  int64_t blocks = 0;
  for (int i = 0; i < count; ++i) {
    p.entries[i] = entries[i];
    p.block_start[i] = blocks;
    const int64_t num = entries[i].num;
    if (entries[i].history_len > 0 && num > 0) blocks += ceil_div(num, columns_per_block(num));
  }
  p.block_start[count] = blocks;
  if (blocks == 0) return;
  if (blocks > 0x7fffffffLL) fail(TE_ERROR_INTERNAL, "delayed_scaling_update_kernel: too many columns");
  delayed_scaling_update_kernel<kCap><<<static_cast<unsigned>(blocks), kThreads, 0, as_stream(stream)>>>(p);
  check_launch("delayed_scaling_update_kernel");
}

}  // namespace

void delayed_scaling_update(const DelayedScalingEntry* entries, int64_t count, void* stream) {
  if (count <= kFewEntries) {
    launch<kFewEntries>(entries, static_cast<int32_t>(count), stream);
    return;
  }
  for (int64_t base = 0; base < count; base += kMaxEntries) {
    const int64_t n = count - base < kMaxEntries ? count - base : kMaxEntries;
    launch<kMaxEntries>(entries + base, static_cast<int32_t>(n), stream);
  }
}

}  // namespace cuda
}  // namespace te
