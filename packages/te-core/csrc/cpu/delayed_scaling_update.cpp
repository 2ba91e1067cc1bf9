// Delayed-scaling update (te/recipe.h, NUMERICS.md), for each entry's history [L, N] (row j is
// step j, element (j, n) at j * N + n):
//   amax[n]  = max over history[:, n] (NaN propagates) for algo 0, history[0, n] for algo 1;
//   scale[n] = delayed_scale_from_amax(amax[n], scaled_max, scale[n]);
// (algo and scaled_max are the entry's own: one call may update E4M3 and E5M2 histories.)
//   then the rows roll by one, new[j] = old[j + 1], new[L - 1] = old[0], and new[0] = 0.
// Rows are walked in memory order and the roll moves whole rows. Out of place (history_in set)
// the old rows are read from there; an entry's amax is folded into the first row before anything.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/kernels.h"
#include "common/scaling.h"
#include "te/recipe.h"

namespace te {
namespace cpu {

void delayed_scaling_update(const DelayedScalingEntry* entries, int64_t count, void* /*stream*/) {
  for (int64_t i = 0; i < count; ++i) {
    const DelayedScalingEntry& e = entries[i];
    float* history = e.amax_history;
    const float* old = e.history_in != nullptr ? e.history_in : history;
    const float* old_scale = e.scale_in != nullptr ? e.scale_in : e.scale;
    const int64_t len = e.history_len, num = e.num;

    std::vector<float> first(old, old + num);
    if (e.amax != nullptr)
      for (int64_t n = 0; n < num; ++n) first[n] = nan_max(first[n], e.amax[n]);
    std::vector<float> window_amax = first;
    if (e.amax_compute_algo == TE_AMAX_COMPUTE_MAX) {
      for (int64_t j = 1; j < len; ++j)
        for (int64_t n = 0; n < num; ++n)
          window_amax[n] = nan_max(window_amax[n], old[j * num + n]);
    }
    for (int64_t n = 0; n < num; ++n)
      e.scale[n] = delayed_scale_from_amax(window_amax[n], e.scaled_max, old_scale[n]);

    std::copy(old + num, old + len * num, history);
    std::copy(first.begin(), first.end(), history + (len - 1) * num);
    std::fill(history, history + num, 0.0f);
  }
}

}  // namespace cpu
}  // namespace te
