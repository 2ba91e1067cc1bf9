// _C.ffi_targets(platform): te's XLA FFI handlers as PyCapsules, for te_jax to register with
// jax.ffi.register_ffi_target(name, capsule, platform=...). Both platforms' handlers are always
// compiled (the CUDA ones need no CUDA header: they take XLA's stream as void*); on a te-core
// built without CUDA the CUDA handlers fail at run time with the C API's "built without CUDA"
// error, never at registration.
#include <pybind11/pybind11.h>

#include <string>

#include "ffi_common.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace te::python {
namespace {

struct Target {
  const char* name;
  XLA_FFI_Handler* cpu;
  XLA_FFI_Handler* cuda;
};

// The custom call target names te_jax uses (te_jax/_ffi.py).
constexpr Target kTargets[] = {
    {"te_quantize_ffi", te_quantize_ffi_cpu, te_quantize_ffi_cuda},
    {"te_dequantize_ffi", te_dequantize_ffi_cpu, te_dequantize_ffi_cuda},
    {"te_amax_ffi", te_amax_ffi_cpu, te_amax_ffi_cuda},
    {"te_transpose_ffi", te_transpose_ffi_cpu, te_transpose_ffi_cuda},
    {"te_gemm_ffi", te_gemm_ffi_cpu, te_gemm_ffi_cuda},
    {"te_gemm_act_ffi", te_gemm_act_ffi_cpu, te_gemm_act_ffi_cuda},
    {"te_norm_fwd_ffi", te_norm_fwd_ffi_cpu, te_norm_fwd_ffi_cuda},
    {"te_norm_bwd_ffi", te_norm_bwd_ffi_cpu, te_norm_bwd_ffi_cuda},
    {"te_act_fwd_ffi", te_act_fwd_ffi_cpu, te_act_fwd_ffi_cuda},
    {"te_act_bwd_ffi", te_act_bwd_ffi_cpu, te_act_bwd_ffi_cuda},
    {"te_dbias_quantize_ffi", te_dbias_quantize_ffi_cpu, te_dbias_quantize_ffi_cuda},
    {"te_delayed_update_ffi", te_delayed_update_ffi_cpu, te_delayed_update_ffi_cuda},
};

}  // namespace

void register_xla_ffi(py::module_& m) {
  m.def(
      "ffi_targets",
      [](const std::string& platform) {
        const bool cpu = platform == "cpu" || platform == "Host";
        const bool cuda = platform == "cuda" || platform == "CUDA" || platform == "gpu";
        if (!cpu && !cuda) {
          throw py::value_error("platform: expected 'cpu' or 'cuda', got '" + platform + "'");
        }
        py::dict targets;
        for (const Target& t : kTargets) {
          targets[t.name] = py::capsule(reinterpret_cast<void*>(cpu ? t.cpu : t.cuda));
        }
        return targets;
      },
      py::arg("platform"),
      "te's XLA FFI handlers for `platform` ('cpu' or 'cuda'): {target name: PyCapsule}.");
}

}  // namespace te::python
