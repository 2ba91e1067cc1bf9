#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/kernels.h"
#include "common/validate.h"
#include "te/recipe.h"

namespace {

// Where every history and scale of a call must be: the first history's device, named as its
// argument in messages.
struct CallDevice {
  te_device device{};
  std::string name;  // empty until the first group with entries
};

// Checks one group's arguments and appends its entries. `prefix` names the group in messages
// ("" for te_delayed_scaling_update's own arguments, "groups[g]." for a group).
void add_group(const te_delayed_scaling_group& g, const std::string& prefix, CallDevice* call,
               std::vector<te::DelayedScalingEntry>* entries) {
  TE_CHECK_ARG(g.count >= 0, prefix, "count: expected >= 0, got ", g.count);
  if (g.count == 0) return;
  TE_CHECK_ARG(g.amax_histories != nullptr && g.scales != nullptr, prefix, "amax_histories, ",
               prefix, "scales: expected arrays of ", g.count, " descriptors, got NULL");
  TE_CHECK_ARG(std::isfinite(g.fp8_max) && g.fp8_max > 0.0f, prefix,
               "fp8_max: expected a positive finite value (448 for E4M3, 57344 for E5M2), got ",
               g.fp8_max);
  TE_CHECK_ARG(std::isfinite(g.margin), prefix, "margin: expected a finite value, got ", g.margin);
  TE_CHECK_ARG(g.amax_compute_algo == TE_AMAX_COMPUTE_MAX ||
                   g.amax_compute_algo == TE_AMAX_COMPUTE_MOST_RECENT,
               prefix, "amax_compute_algo: expected TE_AMAX_COMPUTE_MAX (0) or "
               "TE_AMAX_COMPUTE_MOST_RECENT (1), got ", g.amax_compute_algo);
  if (call->name.empty()) {
    call->device = g.amax_histories[0].device;
    call->name = prefix + "amax_histories[0]";
  }
  const float scaled_max = g.fp8_max * std::exp2(-g.margin);
  // One entry's checks under the given argument names. They run unnamed first and are named only
  // to report a failure: a model of hundreds of layers passes hundreds of entries per update, and
  // building two names per entry cost more than the update's launch.
  auto check_entry = [&](int64_t i, const std::string& h, const std::string& s) {
    const te_tensor& hist = g.amax_histories[i];
    te::check_tensor(hist, h);
    te::check_dtype(hist, h, {TE_DTYPE_FLOAT32});
    TE_CHECK_ARG(hist.ndim == 1 || hist.ndim == 2, h, ".ndim: expected 1 ([L]) or 2 ([L, N]), got ",
                 hist.ndim);
    TE_CHECK_ARG(hist.shape[0] >= 1, h, ".shape: expected a history length L >= 1, got ",
                 te::shape_string(hist.shape, hist.ndim));
    te::check_same_device(hist, h, call->device, call->name);
    const int64_t num = hist.ndim == 2 ? hist.shape[1] : 1;
    te::check_tensor(g.scales[i], s);
    te::check_dtype(g.scales[i], s, {TE_DTYPE_FLOAT32});
    te::check_numel(g.scales[i], s, num);
    te::check_same_device(g.scales[i], s, call->device, call->name);
    return num;
  };
  const std::string unnamed;
  for (int64_t i = 0; i < g.count; ++i) {
    int64_t num = 0;
    try {
      num = check_entry(i, unnamed, unnamed);
    } catch (const te::Error&) {
      const std::string index = "[" + std::to_string(i) + "]";
      check_entry(i, prefix + "amax_histories" + index, prefix + "scales" + index);
      throw;
    }
    entries->push_back({static_cast<float*>(g.amax_histories[i].data),
                        static_cast<float*>(g.scales[i].data), g.amax_histories[i].shape[0], num,
                        scaled_max, g.amax_compute_algo});
  }
}

void run(const std::vector<te::DelayedScalingEntry>& entries, const CallDevice& call, void* stream) {
  if (entries.empty()) return;
  const auto count = static_cast<int64_t>(entries.size());
  te::dispatch(call.device, call.name,
               [&] { te::cpu::delayed_scaling_update(entries.data(), count, stream); },
               [&] { te::cuda::delayed_scaling_update(entries.data(), count, stream); });
}

}  // namespace

extern "C" te_status te_delayed_scaling_update(te_tensor* amax_histories, te_tensor* scales,
                                               int64_t count, float fp8_max, float margin,
                                               int32_t amax_compute_algo, void* stream) {
  return te::guard("te_delayed_scaling_update", [&] {
    const te_delayed_scaling_group g{amax_histories, scales, count, fp8_max, margin, amax_compute_algo};
    CallDevice call;
    std::vector<te::DelayedScalingEntry> entries;
    entries.reserve(count > 0 ? static_cast<size_t>(count) : 0);
    add_group(g, "", &call, &entries);
    run(entries, call, stream);
  });
}

extern "C" te_status te_delayed_scaling_update_groups(const te_delayed_scaling_group* groups,
                                                      int64_t num_groups, void* stream) {
  return te::guard("te_delayed_scaling_update_groups", [&] {
    TE_CHECK_ARG(num_groups >= 0, "num_groups: expected >= 0, got ", num_groups);
    if (num_groups == 0) return;
    TE_CHECK_ARG(groups != nullptr, "groups: expected an array of ", num_groups,
                 " te_delayed_scaling_group, got NULL");
    CallDevice call;
    std::vector<te::DelayedScalingEntry> entries;
    for (int64_t g = 0; g < num_groups; ++g)
      add_group(groups[g], "groups[" + std::to_string(g) + "].", &call, &entries);
    run(entries, call, stream);
  });
}
