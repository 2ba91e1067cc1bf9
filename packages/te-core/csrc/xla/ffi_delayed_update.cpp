// te_delayed_update_ffi: te_delayed_scaling_next_groups (te/recipe.h) as an XLA custom call, so
// a te_jax step's DelayedScaling update of every role is one kernel instead of a few XLA fusions
// per role.
//
// Operands, three per role: amax_history fp32 [L], scale fp32 [1], amax fp32 [1] (this step's,
// reduced over the mesh). Results, two per role: the next amax_history [L] and scale [1], fresh
// buffers (no aliasing: the state operands are usually the jitted step's parameters, which XLA
// would copy before letting a custom call write them).
// Attributes: fp8_max (fp32 array, one per role: 448 for E4M3 roles, 57344 for E5M2), margin,
// amax_compute_algo (te_amax_compute_algo).
#include <string>
#include <vector>

#include "ffi_common.h"

namespace te::xla_ffi {
namespace {

using Buf = ffi::AnyBuffer;

ffi::Error delayed_update(te_device device, void* stream, ffi::RemainingArgs args,
                          ffi::RemainingRets rets, ffi::Span<const float> fp8_max, float margin,
                          int32_t amax_compute_algo) {
  const size_t roles = fp8_max.size();
  if (args.size() != 3 * roles || rets.size() != 2 * roles) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "te_delayed_update_ffi: expected 3 operands (amax_history, scale, amax) and "
                      "2 results (amax_history, scale) per role, one fp8_max each (" +
                          std::to_string(roles) + "), got " + std::to_string(args.size()) +
                          " operands and " + std::to_string(rets.size()) + " results");
  }
  // [role]: one group of one entry each, so every role keeps its own fp8_max.
  std::vector<te_tensor> tensors(5 * roles);
  std::vector<te_delayed_scaling_group> groups(roles);
  std::vector<te_delayed_scaling_next> next(roles);
  static const char* const kParts[5] = {"amax_history", "scale", "amax", "next amax_history",
                                         "next scale"};
  for (size_t r = 0; r < roles; ++r) {
    te_tensor* t = &tensors[5 * r];  // in kParts order
    for (size_t k = 0; k < 5; ++k) {
      ffi::Error error;
      if (k < 3) {
        auto buffer = args.get<Buf>(3 * r + k);
        error = buffer.has_error() ? buffer.error()
                                   : describe(*buffer, device, true, kParts[k], &t[k]);
      } else {
        auto result = rets.get<Buf>(2 * r + k - 3);
        error = result.has_error() ? result.error()
                                   : describe(*result, device, true, kParts[k], &t[k]);
      }
      if (error.failure()) {  // the role named only now: no strings on the per-step path
        return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                          "role " + std::to_string(r) + " (groups[" + std::to_string(r) + "]) " +
                              error.message());
      }
    }
    groups[r] = {&t[0], &t[1], 1, fp8_max[r], margin, amax_compute_algo};
    next[r] = {&t[2], &t[3], &t[4]};
  }
  const te_status status = te_delayed_scaling_next_groups(
      groups.data(), next.data(), static_cast<int64_t>(roles), stream);
  return status == TE_SUCCESS ? ffi::Error::Success() : status_error(status);
}

template <typename Binding>
auto bind_delayed_update(Binding binding) {
  return std::move(binding)
      .RemainingArgs()
      .RemainingRets()
      .template Attr<ffi::Span<const float>>("fp8_max")
      .template Attr<float>("margin")
      .template Attr<int32_t>("amax_compute_algo");
}

}  // namespace
}  // namespace te::xla_ffi

XLA_FFI_DEFINE_HANDLER_SYMBOL(te_delayed_update_ffi_cpu,
                              te::xla_ffi::on_cpu(te::xla_ffi::delayed_update),
                              te::xla_ffi::bind_delayed_update(te::xla_ffi::cpu_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(te_delayed_update_ffi_cuda,
                              te::xla_ffi::on_cuda(te::xla_ffi::delayed_update),
                              te::xla_ffi::bind_delayed_update(te::xla_ffi::cuda_binding()));
