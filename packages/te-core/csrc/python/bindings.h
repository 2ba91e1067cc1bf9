// Shared by the pybind module's source files.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "te/te.h"

namespace te::python {

// Raised in Python as NotImplementedError (pybind11 maps std::exception subclasses it knows;
// this one is registered in bindings.cpp).
struct NotImplementedErrorPy : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws the Python exception matching a failed status, with te_last_error()'s text.
void check(te_status status);

// The flat entry points (DESIGN.md "The hot path") take plain ints and tuples and build the
// te_tensor structs on the C++ stack, so a call makes no descriptor objects. Only type conversion
// happens here; the C API validates. A tensor argument ("spec") is None (absent), a
// te_core._C.Tensor, or a tuple (ptr, dtype, shape, device) with device -1 for the CPU, else the
// CUDA ordinal. `arg` names the argument in error messages.
te_tensor spec(pybind11::handle h, const char* arg);
// t's shape from a tuple (or torch.Size, or any sequence) of ints.
void fill_shape(te_tensor& t, pybind11::handle shape, const char* arg);
// -1: the CPU, else the CUDA ordinal.
te_device device_of(int64_t device);

inline void* as_stream(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

// Runs a C call without the GIL, after every argument is converted: CPU kernels run on this
// thread and can be long. Measured: releasing costs ~50 ns a call (pybind11 call_guard, 2-core
// dev machine), against ~1.2 us for the whole call at tiny sizes, so CUDA calls release it too.
template <class F>
te_status without_gil(F&& f) {
  pybind11::gil_scoped_release release;
  return f();
}

// Adds `ffi_targets(platform) -> dict[name, PyCapsule]` for te_jax when te-core was built with
// jaxlib's XLA FFI headers, and a stub that says how to get them otherwise (csrc/xla/).
void register_xla_ffi(pybind11::module_& m);

// Adds the fused Linear steps (linear_step.cpp): quantize + GEMM in one call each way.
void register_linear_step(pybind11::module_& m);
// Adds the fused LayerNormLinear / LayerNormMLP steps (layernorm_linear_step.cpp,
// layernorm_mlp_step.cpp): one call each way.
void register_layernorm_linear_step(pybind11::module_& m);
void register_layernorm_mlp_step(pybind11::module_& m);

}  // namespace te::python
