#include <algorithm>
#include <cmath>
#include <cstdint>
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

// Bytes [begin, end) of a present tensor, for the overlap check.
struct Span {
  uintptr_t begin, end;
};
Span bytes_of(const te_tensor& t) {
  const auto begin = reinterpret_cast<uintptr_t>(t.data);
  return {begin, begin + static_cast<uintptr_t>(te::numel(t)) * 4u};
}
bool overlap(Span a, Span b) { return a.begin < b.end && b.begin < a.end; }

// Checks group g's out-of-place half against the entries add_group made of the group (the last
// g.count of `entries`) and points them at the outputs, the old state becoming their inputs.
void add_next(const te_delayed_scaling_group& g, const te_delayed_scaling_next& nx,
              const std::string& prefix, const CallDevice& call,
              std::vector<te::DelayedScalingEntry>* entries, std::vector<Span>* inputs,
              std::vector<Span>* outputs) {
  if (g.count == 0) return;
  TE_CHECK_ARG(nx.next_amax_histories != nullptr && nx.next_scales != nullptr, prefix,
               "next_amax_histories, ", prefix, "next_scales: expected arrays of ", g.count,
               " descriptors, got NULL");
  const size_t first = entries->size() - static_cast<size_t>(g.count);
  // Checked unnamed first and named only to report a failure, as add_group does.
  auto check_next = [&](int64_t i, int64_t num, const std::string& h, const std::string& s,
                        const std::string& a) {
    const te_tensor& hist = g.amax_histories[i];
    const te_tensor& out_h = nx.next_amax_histories[i];
    te::check_tensor(out_h, h);
    te::check_dtype(out_h, h, {TE_DTYPE_FLOAT32});
    TE_CHECK_ARG(out_h.ndim == hist.ndim && out_h.shape[0] == hist.shape[0] &&
                     (hist.ndim == 1 || out_h.shape[1] == hist.shape[1]),
                 h, ".shape: expected ", te::shape_string(hist.shape, hist.ndim),
                 " (the shape of the amax history it follows), got ",
                 te::shape_string(out_h.shape, out_h.ndim));
    te::check_same_device(out_h, h, call.device, call.name);
    te::check_tensor(nx.next_scales[i], s);
    te::check_dtype(nx.next_scales[i], s, {TE_DTYPE_FLOAT32});
    te::check_numel(nx.next_scales[i], s, num);
    te::check_same_device(nx.next_scales[i], s, call.device, call.name);
    if (nx.amaxes != nullptr) {
      te::check_tensor(nx.amaxes[i], a);
      te::check_dtype(nx.amaxes[i], a, {TE_DTYPE_FLOAT32});
      te::check_numel(nx.amaxes[i], a, num);
      te::check_same_device(nx.amaxes[i], a, call.device, call.name);
    }
  };
  const std::string unnamed;
  for (int64_t i = 0; i < g.count; ++i) {
    te::DelayedScalingEntry& e = (*entries)[first + static_cast<size_t>(i)];
    try {
      check_next(i, e.num, unnamed, unnamed, unnamed);
    } catch (const te::Error&) {
      const std::string index = "[" + std::to_string(i) + "]";
      check_next(i, e.num, prefix + "next_amax_histories" + index, prefix + "next_scales" + index,
                 prefix + "amaxes" + index);
      throw;
    }
    if (nx.amaxes != nullptr) {
      e.amax = static_cast<const float*>(nx.amaxes[i].data);
      inputs->push_back(bytes_of(nx.amaxes[i]));
    }
    inputs->push_back(bytes_of(g.amax_histories[i]));
    inputs->push_back(bytes_of(g.scales[i]));
    outputs->push_back(bytes_of(nx.next_amax_histories[i]));
    outputs->push_back(bytes_of(nx.next_scales[i]));
    e.history_in = e.amax_history;
    e.scale_in = e.scale;
    e.amax_history = static_cast<float*>(nx.next_amax_histories[i].data);
    e.scale = static_cast<float*>(nx.next_scales[i].data);
  }
}

// Every group checked (add_group) into one entry list; none for num_groups 0.
std::vector<te::DelayedScalingEntry> checked_entries(const te_delayed_scaling_group* groups,
                                                     int64_t num_groups, CallDevice* call) {
  TE_CHECK_ARG(num_groups >= 0, "num_groups: expected >= 0, got ", num_groups);
  std::vector<te::DelayedScalingEntry> entries;
  if (num_groups == 0) return entries;
  TE_CHECK_ARG(groups != nullptr, "groups: expected an array of ", num_groups,
               " te_delayed_scaling_group, got NULL");
  for (int64_t g = 0; g < num_groups; ++g)
    add_group(groups[g], "groups[" + std::to_string(g) + "].", call, &entries);
  return entries;
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
    CallDevice call;
    run(checked_entries(groups, num_groups, &call), call, stream);
  });
}

extern "C" te_status te_delayed_scaling_check_groups(const te_delayed_scaling_group* groups,
                                                     int64_t num_groups) {
  return te::guard("te_delayed_scaling_check_groups", [&] {
    CallDevice call;
    checked_entries(groups, num_groups, &call);
    // (span, group, index, is_scale) of every non-empty history and scale
    struct Part {
      Span span;
      int64_t group, index;
      bool scale;
    };
    std::vector<Part> parts;
    for (int64_t g = 0; g < num_groups; ++g) {
      for (int64_t i = 0; i < groups[g].count; ++i) {
        if (te::numel(groups[g].scales[i]) == 0) continue;  // N = 0: nothing to update
        parts.push_back({bytes_of(groups[g].amax_histories[i]), g, i, false});
        parts.push_back({bytes_of(groups[g].scales[i]), g, i, true});
      }
    }
    std::sort(parts.begin(), parts.end(),
              [](const Part& a, const Part& b) { return a.span.begin < b.span.begin; });
    const auto name = [&](const Part& p) {
      return "groups[" + std::to_string(p.group) + "]." + (p.scale ? "scales[" : "amax_histories[") +
             std::to_string(p.index) + "]";
    };
    // Sorted by start, a part overlaps an earlier one iff it starts before the furthest end so far.
    size_t furthest = 0;
    for (size_t k = 1; k < parts.size(); ++k) {
      TE_CHECK_ARG(!overlap(parts[furthest].span, parts[k].span), name(parts[k]), " and ",
                   name(parts[furthest]), ": expected separate buffers (the update rolls each "
                   "history once and writes each scale), got overlapping ones; list a state once");
      if (parts[k].span.end > parts[furthest].span.end) furthest = k;
    }
  });
}

extern "C" te_status te_delayed_scaling_next_groups(const te_delayed_scaling_group* groups,
                                                    const te_delayed_scaling_next* next,
                                                    int64_t num_groups, void* stream) {
  return te::guard("te_delayed_scaling_next_groups", [&] {
    TE_CHECK_ARG(num_groups >= 0, "num_groups: expected >= 0, got ", num_groups);
    if (num_groups == 0) return;
    TE_CHECK_ARG(groups != nullptr && next != nullptr, "groups, next: expected arrays of ",
                 num_groups, " te_delayed_scaling_group / te_delayed_scaling_next, got NULL");
    CallDevice call;
    std::vector<te::DelayedScalingEntry> entries;
    std::vector<Span> inputs, outputs;
    for (int64_t g = 0; g < num_groups; ++g) {
      const std::string prefix = "groups[" + std::to_string(g) + "].";
      add_group(groups[g], prefix, &call, &entries);
      add_next(groups[g], next[g], "next[" + std::to_string(g) + "].", call, &entries, &inputs,
               &outputs);
    }
    // Every output against every buffer before it: the kernel reads inputs while other CTAs
    // write outputs, so any shared byte would race. A step's few dozen entries make this cheap.
    for (size_t o = 0; o < outputs.size(); ++o) {
      for (const Span& in : inputs) {
        TE_CHECK_ARG(!overlap(outputs[o], in), "next: output buffer ", o,
                     " (entry ", o / 2, "'s ", o % 2 ? "next_scales" : "next_amax_histories",
                     ") overlaps an input history, scale or amax; expected separate buffers");
      }
      for (size_t p = 0; p < o; ++p) {
        TE_CHECK_ARG(!overlap(outputs[o], outputs[p]), "next: output buffers ", p, " and ", o,
                     " overlap; expected separate buffers");
      }
    }
    run(entries, call, stream);
  });
}
