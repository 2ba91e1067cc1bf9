// The fused steps of a quantized LayerNormLinear (te_torch's LayerNormLinearFn, eager mode), one
// Python call each way as linear_step.cpp's: forward = the norm writing the GEMM's packed input
// copies, quantize W, fprop GEMM; backward = linear_bwd's GEMMs into dln, then the norm backward.
// The C API calls and their arguments are the op-by-op path's, so both give the same bytes.
// Operands and packed targets are step_operands.h's tuples.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "python/bindings.h"
#include "python/step_operands.h"

namespace py = pybind11;

namespace te::python {

using namespace step;

void register_layernorm_linear_step(py::module_& m) {
  m.def(
      "layernorm_linear_fwd",
      [](bool rms, py::handle x, py::handle gamma, py::handle beta, py::handle ln_out,
         py::handle mu, py::handle rsigma, py::handle norm_config, py::handle w, py::handle bias,
         py::handle out, py::handle config, uintptr_t stream) {
        NormFwd n = norm_fwd_args(rms, x, gamma, beta, ln_out, mu, rsigma, norm_config);
        Operand wo = operand(w, "w");
        const te_tensor bt = spec(bias, "bias"), d = spec(out, "out");
        const te_gemm_config* c = gemm_config(config, "config");
        void* s = as_stream(stream);
        check(without_gil([&] {
          TE_TRY(norm_fwd(n, s));
          if (wo.quantize) TE_TRY(te_quantize(&wo.src, &wo.q, wo.config, s));
          return gemm(rowwise_for(n.out.q, d), only(wo.q, true), d, c, bt, s);
        }));
      },
      py::arg("rms"), py::arg("x"), py::arg("gamma"), py::arg("beta").none(true),
      py::arg("ln_out"), py::arg("mu").none(true), py::arg("rsigma"), py::arg("norm_config"),
      py::arg("w"), py::arg("bias").none(true), py::arg("out"), py::arg("config"),
      py::arg("stream"),
      "out = norm(x) w^T (+ bias): te_layernorm_fwd (te_rmsnorm_fwd with rms; mu None) writing "
      "ln_out's packed copies (quant, row, col) and mu / rsigma, then linear_fwd's weight "
      "quantization (a kind-0 w) and fprop GEMM on the row-wise copies (a per-tensor ln_out "
      "with more rows than out: its first rows, as linear_fwd's x).");
  m.def(
      "layernorm_linear_bwd",
      [](py::handle dy, py::handle dbias, py::handle ln_out, py::handle w, py::handle dln,
         py::handle dgrad_config, py::handle dw, py::handle wgrad_config, py::handle norm,
         uintptr_t stream) {
        static const char* const names[8] = {"dy",  "dbias",        "ln_out", "w",
                                             "dln", "dgrad_config", "dw",     "wgrad_config"};
        LinearGrads l =
            linear_grads(dy, dbias, ln_out, w, dln, dgrad_config, dw, wgrad_config, names);
        if (present(l.dx) == norm.is_none()) {
          throw py::value_error("norm: expected the norm backward's tuple exactly when dln is "
                                "given (dln is its dz)");
        }
        NormGrads n;
        if (present(l.dx)) n = norm_grads(norm, "norm");
        void* s = as_stream(stream);
        check(without_gil([&] {
          TE_TRY(quantize_grad(l, s));
          TE_TRY(linear_gemms(l, s));
          return present(l.dx) ? norm_bwd(l.dx, n, s) : TE_SUCCESS;
        }));
      },
      py::arg("dy"), py::arg("dbias").none(true), py::arg("ln_out").none(true),
      py::arg("w").none(true), py::arg("dln").none(true), py::arg("dgrad_config").none(true),
      py::arg("dw").none(true), py::arg("wgrad_config").none(true), py::arg("norm").none(true),
      py::arg("stream"),
      "linear_bwd(dy, dbias, ln_out, w, dln, ...) (ln_out: the norm output's saved copies), then "
      "with dln the norm backward norm = (rms, x, mu, rsigma, gamma, dx, dgamma, dbeta, "
      "NormConfig) from dz = dln.");
}

}  // namespace te::python
