// The fused steps of a quantized Linear (te_torch's LinearFn, eager mode): forward = quantize x,
// quantize W, fprop GEMM; backward = quantize dy (with the bias gradient), dgrad GEMM, wgrad GEMM.
// Each direction is one Python call instead of three to five, and each quantized copy lives in one
// caller-allocated byte buffer ("packed": data, then its scale_inv at the next 256-byte boundary)
// instead of two to four tensors: on the H200 host a small FP8 Linear step spent more time in
// Python frames, per-part allocations and argument conversion than in its kernels (NOTES.md).
// Nothing is computed here: the C API calls are te_quantize / te_dbias_quantize / te_gemm exactly
// as te_torch's unfused path makes them, so both paths give the same bytes.
//
// Operands are step_operands.h's tuples.
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>

#include "python/bindings.h"
#include "python/step_operands.h"

namespace py = pybind11;

namespace te::python {

using namespace step;

void register_linear_step(py::module_& m) {
  m.def(
      "packed_bytes",
      [](int32_t mode, int32_t fp8_dtype, py::handle shape) {
        te_tensor src{};
        fill_shape(src, shape, "shape");
        te_tensor data{}, scale_inv{};
        const size_t row = carve_copy(mode, fp8_dtype, src, true, 0, &data, &scale_inv);
        const size_t col = carve_copy(mode, fp8_dtype, src, false, 0, &data, &scale_inv);
        return py::make_tuple(row, col);
      },
      py::arg("mode"), py::arg("fp8_dtype"), py::arg("shape"),
      "(row_bytes, col_bytes): the sizes of the packed row-wise and column-wise copies of a "
      "source of `shape` quantized in `mode` (data, then scale_inv at the next 256-byte "
      "boundary); the buffers the linear_fwd / linear_bwd operands point into.");
  m.def(
      "linear_fwd",
      [](py::handle x, py::handle w, py::handle bias, py::handle out, py::handle config,
         uintptr_t stream) {
        Operand xo = operand(x, "x"), wo = operand(w, "w");
        const te_tensor b = spec(bias, "bias"), d = spec(out, "out");
        const te_gemm_config* c = gemm_config(config, "config");
        void* s = as_stream(stream);
        check(without_gil([&] {
          if (xo.quantize) TE_TRY(te_quantize(&xo.src, &xo.q, xo.config, s));
          if (wo.quantize) TE_TRY(te_quantize(&wo.src, &wo.q, wo.config, s));
          return gemm(rowwise_for(xo.q, d), only(wo.q, true), d, c, b, s);
        }));
      },
      py::arg("x"), py::arg("w"), py::arg("bias").none(true), py::arg("out"), py::arg("config"),
      py::arg("stream"),
      "out = x w^T (+ bias) with config's layout (fprop: trans_b): quantizes the kind-0 "
      "operands into their packed buffers first (both copies where both pointers are given), "
      "then te_gemm on the row-wise copies (a per-tensor x with more rows than out: its first "
      "rows, step_operands.h rowwise_for).");
  m.def(
      "linear_bwd",
      [](py::handle dy, py::handle dbias, py::handle x, py::handle w, py::handle dx,
         py::handle dgrad_config, py::handle dw, py::handle wgrad_config, uintptr_t stream) {
        static const char* const names[8] = {"dy", "dbias",       "x",  "w",
                                             "dx", "dgrad_config", "dw", "wgrad_config"};
        LinearGrads l = linear_grads(dy, dbias, x, w, dx, dgrad_config, dw, wgrad_config, names);
        void* s = as_stream(stream);
        check(without_gil([&] {
          TE_TRY(quantize_grad(l, s));
          return linear_gemms(l, s);
        }));
      },
      py::arg("dy"), py::arg("dbias").none(true), py::arg("x").none(true), py::arg("w").none(true),
      py::arg("dx").none(true), py::arg("dgrad_config").none(true), py::arg("dw").none(true),
      py::arg("wgrad_config").none(true), py::arg("stream"),
      "The Linear backward: dy quantized (a kind-0 operand; kind 1/2: given quantized), with "
      "dbias (None: no bias gradient; kind 0 only) from the same pass; dx = dy w by "
      "dgrad_config (None dx: skipped) on dy's row-wise and w's column-wise copies; dw = dy^T x "
      "by wgrad_config (beta 1 accumulates into dw, e.g. an fp32 main_grad; None dw: skipped) "
      "on both column-wise copies.");
}

}  // namespace te::python
