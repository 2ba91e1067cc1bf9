#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/kernels.h"
#include "common/validate.h"
#include "te/recipe.h"

extern "C" te_status te_delayed_scaling_update(te_tensor* amax_histories, te_tensor* scales,
                                               int64_t count, float fp8_max, float margin,
                                               int32_t amax_compute_algo, void* stream) {
  return te::guard("te_delayed_scaling_update", [&] {
    TE_CHECK_ARG(count >= 0, "count: expected >= 0, got ", count);
    if (count == 0) return;
    TE_CHECK_ARG(amax_histories != nullptr && scales != nullptr,
                 "amax_histories, scales: expected arrays of ", count, " descriptors, got NULL");
    TE_CHECK_ARG(std::isfinite(fp8_max) && fp8_max > 0.0f,
                 "fp8_max: expected a positive finite value (448 for E4M3, 57344 for E5M2), got ",
                 fp8_max);
    TE_CHECK_ARG(std::isfinite(margin), "margin: expected a finite value, got ", margin);
    TE_CHECK_ARG(amax_compute_algo == TE_AMAX_COMPUTE_MAX ||
                     amax_compute_algo == TE_AMAX_COMPUTE_MOST_RECENT,
                 "amax_compute_algo: expected TE_AMAX_COMPUTE_MAX (0) or "
                 "TE_AMAX_COMPUTE_MOST_RECENT (1), got ", amax_compute_algo);
    const te_device device = amax_histories[0].device;
    // One entry's checks under the given argument names. They run unnamed first and are named
    // only to report a failure: a model of hundreds of layers passes hundreds of entries per
    // update, and building two names per entry cost more than the update's launch.
    auto check_entry = [&](int64_t i, const std::string& h, const std::string& s) {
      te::check_tensor(amax_histories[i], h);
      te::check_dtype(amax_histories[i], h, {TE_DTYPE_FLOAT32});
      TE_CHECK_ARG(amax_histories[i].ndim == 1 || amax_histories[i].ndim == 2, h,
                   ".ndim: expected 1 ([L]) or 2 ([L, N]), got ", amax_histories[i].ndim);
      TE_CHECK_ARG(amax_histories[i].shape[0] >= 1, h,
                   ".shape: expected a history length L >= 1, got ",
                   te::shape_string(amax_histories[i].shape, amax_histories[i].ndim));
      te::check_same_device(amax_histories[i], h, device, "amax_histories[0]");
      const int64_t num = amax_histories[i].ndim == 2 ? amax_histories[i].shape[1] : 1;
      te::check_tensor(scales[i], s);
      te::check_dtype(scales[i], s, {TE_DTYPE_FLOAT32});
      te::check_numel(scales[i], s, num);
      te::check_same_device(scales[i], s, device, "amax_histories[0]");
      return num;
    };
    const std::string unnamed;
    std::vector<te::DelayedScalingEntry> entries(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      int64_t num = 0;
      try {
        num = check_entry(i, unnamed, unnamed);
      } catch (const te::Error&) {
        const std::string index = "[" + std::to_string(i) + "]";
        check_entry(i, "amax_histories" + index, "scales" + index);
        throw;
      }
      entries[i] = {static_cast<float*>(amax_histories[i].data),
                    static_cast<float*>(scales[i].data), amax_histories[i].shape[0], num};
    }
    const float scaled_max = fp8_max * std::exp2(-margin);
    te::dispatch(device, "amax_histories[0]",
                 [&] {
                   te::cpu::delayed_scaling_update(entries.data(), count, scaled_max,
                                                   amax_compute_algo, stream);
                 },
                 [&] {
                   te::cuda::delayed_scaling_update(entries.data(), count, scaled_max,
                                                    amax_compute_algo, stream);
                 });
  });
}
