// Shared by the fused step files (linear_step.cpp, layernorm_linear_step.cpp,
// layernorm_mlp_step.cpp): how a step's operands arrive from Python and where their packed
// copies live. A packed copy is the data, then its scale_inv at the next 256-byte boundary, in a
// caller-allocated byte buffer.
//
// An operand is one of three tuples:
//   (0, src spec, quant, row ptr, col ptr)
//       quantize src into packed copies at row/col (0: that copy is not made);
//   (1, mode, fp8 dtype, source shape, device, row ptr, col ptr)
//       packed copies made earlier (the saved operands, a cached weight);
//   (2, mode, rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv)
//       parts as specs (a quantized tensor's own buffers; high precision: mode 0, rd only).
// quant = (mode, fp8 dtype, QuantConfig|None, amax spec, scale spec): how a copy is quantized.
// A fused kernel's quantized output (the norm's, an activation's) is a packed target
// (quant, row ptr, col ptr), its source shape the kernel's.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>

#include "python/bindings.h"

namespace te::python::step {

// The size in bytes of one packed copy of a source of `src`'s shape, and its parts at `base`
// (base 0 fills only the shapes).
size_t carve_copy(int32_t mode, int32_t fp8_dtype, const te_tensor& src, bool rowwise,
                  uintptr_t base, te_tensor* data, te_tensor* scale_inv);

// A parsed operand or packed target: its parts, and how to quantize into them (kind 0, targets).
struct Operand {
  te_quantized_tensor q = te_quantized_tensor_init(TE_SCALING_PER_TENSOR);
  bool quantize = false;
  te_tensor src{};
  const te_quant_config* config = nullptr;
};

Operand operand(pybind11::handle h, const char* arg);
// A packed target (quant, row, col) for a kernel output of `src`'s shape.
Operand target(pybind11::handle h, const te_tensor& src, const char* arg);

// The operand with only one copy: te_gemm reads the copy its layout needs, and the other may
// not exist (a saved operand keeps only its column-wise copy).
te_quantized_tensor only(const te_quantized_tensor& q, bool rowwise);

// The row-wise copy of q (only(q, true)) as the A operand of a GEMM writing d. A per-tensor copy
// with more rows than d is cut to d's rows: te_torch quantizes an odd token count padded to a
// multiple of 16, because the weight-gradient GEMM reduces over the tokens and cuBLASLt's FP8
// GEMMs need K a multiple of 16, while fprop and dgrad write only the real rows (M may be
// anything). Row r of the padded copy is row r of the source, and its scale is the tensor's.
te_quantized_tensor rowwise_for(const te_quantized_tensor& q, const te_tensor& d);

te_status gemm(const te_quantized_tensor& a, const te_quantized_tensor& b, const te_tensor& d,
               const te_gemm_config* config, const te_tensor& bias, void* stream);

const te_gemm_config* gemm_config(pybind11::handle h, const char* arg);
const te_norm_config* norm_config(pybind11::handle h, const char* arg);

inline bool present(const te_tensor& t) { return t.data != nullptr || t.ndim > 0; }

// A Linear's backward GEMMs (linear_bwd's arguments, parsed): dy's copies (and the bias gradient
// summed as they are made), dx = dy w, dw = dy^T x. `names` spells the eight arguments in errors.
struct LinearGrads {
  Operand g;
  te_tensor db{}, dx{}, dw{};
  Operand x, w;
  const te_gemm_config* dgrad = nullptr;
  const te_gemm_config* wgrad = nullptr;
};

LinearGrads linear_grads(pybind11::handle dy, pybind11::handle dbias, pybind11::handle x,
                         pybind11::handle w, pybind11::handle dx, pybind11::handle dgrad_config,
                         pybind11::handle dw, pybind11::handle wgrad_config,
                         const char* const names[8]);
// The same from the 8-tuple `what` of them (a step with two Linears). With `dy_src`, dy is a
// packed target of that shape that another kernel writes (FC1's gradient: the activation's).
LinearGrads linear_grads(pybind11::handle args, const char* what, const char* const names[8],
                         const te_tensor* dy_src = nullptr);
// Quantizes dy when it is given as a kind-0 operand (te_dbias_quantize with a bias gradient).
te_status quantize_grad(LinearGrads& l, void* stream);
// The dgrad and wgrad GEMMs that were asked for.
te_status linear_gemms(const LinearGrads& l, void* stream);

// A norm's backward (te_layernorm_bwd / te_rmsnorm_bwd) from the tuple
// (rms, x, mu, rsigma, gamma, dx, dgamma, dbeta, NormConfig), reading dz.
struct NormGrads {
  bool rms = false;
  te_tensor x{}, mu{}, rsigma{}, gamma{}, dx{}, dgamma{}, dbeta{};
  const te_norm_config* config = nullptr;
};

NormGrads norm_grads(pybind11::handle args, const char* arg);
te_status norm_bwd(const te_tensor& dz, NormGrads& n, void* stream);

// A norm's forward (te_layernorm_fwd / te_rmsnorm_fwd) into a packed target `out` of x's
// shape, its arguments parsed (beta and mu None for RMSNorm).
struct NormFwd {
  bool rms = false;
  te_tensor x{}, gamma{}, beta{}, mu{}, rsigma{};
  Operand out;
  const te_norm_config* config = nullptr;
};

NormFwd norm_fwd_args(bool rms, pybind11::handle x, pybind11::handle gamma, pybind11::handle beta,
                      pybind11::handle out, pybind11::handle mu, pybind11::handle rsigma,
                      pybind11::handle config);
te_status norm_fwd(NormFwd& n, void* stream);

}  // namespace te::python::step

#define TE_TRY(call)                 \
  do {                               \
    const te_status s_ = (call);     \
    if (s_ != TE_SUCCESS) return s_; \
  } while (0)
