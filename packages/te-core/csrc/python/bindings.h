// Shared by the pybind module's source files.
#pragma once

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "te/status.h"

namespace te::python {

// Raised in Python as NotImplementedError (pybind11 maps std::exception subclasses it knows;
// this one is registered in bindings.cpp).
struct NotImplementedErrorPy : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws the Python exception matching a failed status, with te_last_error()'s text.
void check(te_status status);

// Adds `ffi_targets(platform) -> dict[name, PyCapsule]` for te_jax when te-core was built with
// jaxlib's XLA FFI headers, and a stub that says how to get them otherwise (csrc/xla/).
void register_xla_ffi(pybind11::module_& m);

}  // namespace te::python
