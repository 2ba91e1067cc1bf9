// The fused steps of a quantized LayerNormMLP (te_torch's LayerNormMLPFn, eager mode), one Python
// call each way:
//   forward   norm -> FC1's packed input copies, FC1 GEMM (+b1) into the pre-activation h, the
//             activation -> FC2's packed input copies, FC2 GEMM (+b2)
//   backward  FC2 as linear_bwd (dy quantized with db2, dgrad into da, wgrad), the activation
//             backward writing FC1's packed grad copies and db1, FC1's GEMMs into dln, the norm
//             backward
// with the C API calls and arguments of the op-by-op path, so both give the same bytes.
// Operands and packed targets are step_operands.h's tuples.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "python/bindings.h"
#include "python/step_operands.h"

namespace py = pybind11;

namespace te::python {

using namespace step;

namespace {

// act(h)'s shape: gated kinds (te_activation 100 + n) halve the last dim.
te_tensor activation_out(const te_tensor& h, int32_t activation) {
  te_tensor a = h;
  if (activation >= TE_ACTIVATION_GEGLU && a.ndim > 0) a.shape[a.ndim - 1] /= 2;
  return a;
}

// Whether FC1's GEMM writes act_out itself (te_gemm's GELU_AUX with an FP8 output, te/gemm.h):
// gelu into a per-tensor copy under delayed scaling, whose scale is known before the GEMM runs.
// The same bytes as the GEMM and te_activation_fwd, in one C call the backend may fuse.
bool gelu_in_gemm(int32_t activation, const Operand& a) {
  const te_quant_config* q = a.config;
  const int32_t dt = a.q.rowwise_data.dtype;
  return activation == TE_ACTIVATION_GELU && a.q.scaling_mode == TE_SCALING_PER_TENSOR &&
         a.q.rowwise_data.data != nullptr &&
         (dt == TE_DTYPE_FLOAT8_E4M3 || dt == TE_DTYPE_FLOAT8_E5M2) &&
         (q == nullptr || (!q->compute_scale && !q->reset_amax));
}

// Whether FC2's dgrad writes FC1's quantized gradient (and db1) itself: te_gemm's DGELU with an
// FP8 output, whose product is rounded to h's dtype as the separate pass's da is.
bool dgelu_in_gemm(int32_t activation, const Operand& g1, const LinearGrads& l2,
                   const te_tensor& h) {
  return gelu_in_gemm(activation, g1) && l2.dgrad != nullptr && l2.dx.dtype == h.dtype &&
         l2.dgrad->beta == 0.0f && l2.dgrad->epilogue == TE_EPILOGUE_DEFAULT;
}

}  // namespace

void register_layernorm_mlp_step(py::module_& m) {
  m.def(
      "layernorm_mlp_fwd",
      [](bool rms, py::handle x, py::handle gamma, py::handle beta, py::handle ln_out,
         py::handle mu, py::handle rsigma, py::handle norm_config, py::handle w1, py::handle b1,
         py::handle h, py::handle fc1_config, int32_t activation, py::handle act_out,
         py::handle w2, py::handle b2, py::handle out, py::handle fc2_config, uintptr_t stream,
         const te_activation_config* act_config) {
        NormFwd n = norm_fwd_args(rms, x, gamma, beta, ln_out, mu, rsigma, norm_config);
        Operand w1o = operand(w1, "w1");
        const te_tensor b1t = spec(b1, "b1"), ht = spec(h, "h");
        const te_gemm_config* c1 = gemm_config(fc1_config, "fc1_config");
        Operand a = target(act_out, activation_out(ht, activation), "act_out");
        Operand w2o = operand(w2, "w2");
        const te_tensor b2t = spec(b2, "b2"), d = spec(out, "out");
        const te_gemm_config* c2 = gemm_config(fc2_config, "fc2_config");
        void* s = as_stream(stream);
        check(without_gil([&] {
          TE_TRY(norm_fwd(n, s));
          if (w1o.quantize) TE_TRY(te_quantize(&w1o.src, &w1o.q, w1o.config, s));
          if (gelu_in_gemm(activation, a)) {
            te_gemm_config c = *c1;
            c.epilogue = TE_EPILOGUE_GELU_AUX;
            c.bias = b1t;
            c.aux = ht;
            const te_quantized_tensor x1 = only(n.out.q, true), w1r = only(w1o.q, true);
            TE_TRY(te_gemm(&x1, &w1r, &a.q, &c, s));
          } else {
            TE_TRY(gemm(only(n.out.q, true), only(w1o.q, true), ht, c1, b1t, s));
            TE_TRY(te_activation_fwd_v2(&ht, &a.q, activation, act_config, a.config, s));
          }
          if (w2o.quantize) TE_TRY(te_quantize(&w2o.src, &w2o.q, w2o.config, s));
          return gemm(rowwise_for(a.q, d), only(w2o.q, true), d, c2, b2t, s);
        }));
      },
      py::arg("rms"), py::arg("x"), py::arg("gamma"), py::arg("beta").none(true),
      py::arg("ln_out"), py::arg("mu").none(true), py::arg("rsigma"), py::arg("norm_config"),
      py::arg("w1"), py::arg("b1").none(true), py::arg("h"), py::arg("fc1_config"),
      py::arg("activation"), py::arg("act_out"), py::arg("w2"), py::arg("b2").none(true),
      py::arg("out"), py::arg("fc2_config"), py::arg("stream"),
      py::arg("act_config").none(true) = py::none(),
      "out = act(norm(x) w1^T (+ b1)) w2^T (+ b2): the norm writes ln_out's packed copies "
      "(quant, row, col) and mu / rsigma (mu None with rms), FC1's fprop GEMM writes the "
      "pre-activation h (high precision), te_activation_fwd_v2 (act_config: None or an "
      "ActivationConfig) writes act_out's packed copies, "
      "then FC2's fprop GEMM (a per-tensor act_out with more rows than out: its first rows, as "
      "linear_fwd's x); kind-0 weights are quantized right before their GEMM.");
  m.def(
      "layernorm_mlp_bwd",
      [](py::handle fc2, int32_t activation, py::handle h, py::handle fc1, py::handle norm,
         uintptr_t stream, const te_activation_config* act_config) {
        static const char* const names2[8] = {"fc2.dy",  "fc2.dbias",        "fc2.x",
                                              "fc2.w",   "fc2.dx",           "fc2.dgrad_config",
                                              "fc2.dw",  "fc2.wgrad_config"};
        static const char* const names1[8] = {"fc1.g1",  "fc1.dbias",        "fc1.x",
                                              "fc1.w",   "fc1.dx",           "fc1.dgrad_config",
                                              "fc1.dw",  "fc1.wgrad_config"};
        LinearGrads l2 = linear_grads(fc2, "fc2", names2);
        if (present(l2.dx) == fc1.is_none()) {
          throw py::value_error("fc1: expected FC1's backward tuple exactly when fc2's dx (the "
                                "activation's gradient da) is given");
        }
        const te_tensor ht = spec(h, "h");
        LinearGrads l1;
        NormGrads n;
        if (present(l2.dx)) {
          // FC1's dy is the activation backward's output, a packed target of h's shape.
          l1 = linear_grads(fc1, "fc1", names1, &ht);
          if (present(l1.dx) == norm.is_none()) {
            throw py::value_error("norm: expected the norm backward's tuple exactly when fc1's "
                                  "dx (dln, its dz) is given");
          }
          if (present(l1.dx)) n = norm_grads(norm, "norm");
        }
        void* s = as_stream(stream);
        check(without_gil([&] {
          TE_TRY(quantize_grad(l2, s));
          if (present(l2.dx) && dgelu_in_gemm(activation, l1.g, l2, ht)) {
            te_gemm_config c = *l2.dgrad;
            c.epilogue = TE_EPILOGUE_DGELU;
            c.aux = ht;
            c.bias_grad = l1.db;
            c.dgelu_product = l2.dx;  // the step's da buffer, where te runs two passes
            const te_quantized_tensor g2 = rowwise_for(l2.g.q, ht), w2 = only(l2.w.q, false);
            TE_TRY(te_gemm(&g2, &w2, &l1.g.q, &c, s));
            if (present(l2.dw)) {
              TE_TRY(gemm(only(l2.g.q, false), only(l2.x.q, false), l2.dw, l2.wgrad, te_tensor{},
                          s));
            }
          } else {
            TE_TRY(linear_gemms(l2, s));
            if (!present(l2.dx)) return TE_SUCCESS;
            TE_TRY(te_activation_bwd_v2(&l2.dx, &ht, &l1.g.q, &l1.db, activation, act_config,
                                        l1.g.config, s));
          }
          TE_TRY(linear_gemms(l1, s));
          return present(l1.dx) ? norm_bwd(l1.dx, n, s) : TE_SUCCESS;
        }));
      },
      py::arg("fc2"), py::arg("activation"), py::arg("h").none(true), py::arg("fc1").none(true),
      py::arg("norm").none(true), py::arg("stream"), py::arg("act_config").none(true) = py::none(),
      "fc2 = linear_bwd's (dy, dbias, x, w, dx, dgrad_config, dw, wgrad_config) for FC2, its dx "
      "the activation's gradient da; with da, te_activation_bwd_v2(da, h) (act_config as "
      "layernorm_mlp_fwd's) writes fc1's first item, "
      "a packed target (quant, row, col) of h's shape, and fc1's dbias (db1), then FC1's GEMMs as "
      "linear_bwd's; with fc1's dx (dln) the norm backward norm = (rms, x, mu, rsigma, gamma, "
      "dx, dgamma, dbeta, NormConfig) from dz = dln.");
}

}  // namespace te::python
