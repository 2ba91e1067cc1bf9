// te_activation_fwd/_bwd and te_dbias_quantize: validate every descriptor, then hand the device's
// kernel a flat argument struct (common/kernels.h). Formulas and conventions: te/activation.h.
#include "te/activation.h"

#include <cmath>
#include <string>

#include "api/quantize_output.h"
#include "common/error.h"
#include "common/kernels.h"
#include "common/validate.h"

namespace te {
namespace {

constexpr std::initializer_list<int32_t> kHighPrecision = {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16,
                                                           TE_DTYPE_BFLOAT16};

// Whether `activation` is gated; throws for an unknown value.
bool check_activation(int32_t activation) {
  switch (activation) {
    case TE_ACTIVATION_GELU:
    case TE_ACTIVATION_RELU:
    case TE_ACTIVATION_SILU:
    case TE_ACTIVATION_QGELU:
    case TE_ACTIVATION_SRELU: return false;
    case TE_ACTIVATION_GEGLU:
    case TE_ACTIVATION_REGLU:
    case TE_ACTIVATION_SWIGLU:
    case TE_ACTIVATION_QGEGLU:
    case TE_ACTIVATION_SREGLU:
    case TE_ACTIVATION_GLU:
    case TE_ACTIVATION_CLAMPED_SWIGLU: return true;
  }
  fail(TE_ERROR_INVALID_ARGUMENT, "activation: expected a te_activation value (0..4 or 100..106), "
       "got ", activation);
}

// The kernels' parameters: act_config as far as its struct_size reaches over the defaults,
// checked for the kinds that read them (the others get the defaults, whatever was passed).
ActivationParams read_params(const te_activation_config* act_config, int32_t activation) {
  te_activation_config c = te_activation_config_init();
  if (act_config != nullptr) {
    read_versioned(*act_config, sizeof(te_activation_config), "act_config", &c);
  }
  ActivationParams p;
  if (activation != TE_ACTIVATION_CLAMPED_SWIGLU) return p;
  TE_CHECK_ARG(c.limit > 0.0f, "act_config->limit: expected a value > 0 (the clamp bound; +inf: "
               "no clamp), got ", c.limit);
  TE_CHECK_ARG(std::isfinite(c.alpha), "act_config->alpha: expected a finite value, got ",
               c.alpha);
  TE_CHECK_ARG(std::isfinite(c.glu_linear_offset),
               "act_config->glu_linear_offset: expected a finite value, got ", c.glu_linear_offset);
  p.limit = c.limit;
  p.alpha = c.alpha;
  p.glu_linear_offset = c.glu_linear_offset;
  return p;
}

void check_source(const te_tensor* t, const char* name) {
  check_tensor(t, name);
  check_dtype(*t, name, kHighPrecision);
  TE_CHECK_ARG(t->ndim >= 1, name, ".ndim: expected >= 1 (a [..., K] tensor), got 0");
}

// input [..., K] -> the activation's [..., N]: N = K / 2 for gated kinds.
te_tensor result_shape(const te_tensor& input, bool gated) {
  te_tensor r = input;
  r.data = nullptr;
  r.dtype = TE_DTYPE_FLOAT32;
  if (gated) {
    const int64_t k = input.shape[input.ndim - 1];
    TE_CHECK_ARG(k % 2 == 0, "input.shape: expected an even last dim for a gated activation "
                 "([..., 2N]: activation half, then linear half), got ",
                 shape_string(input.shape, input.ndim));
    r.shape[r.ndim - 1] = k / 2;
  }
  return r;
}

// An optional bias gradient [K] next to `ref` (whose last dim is K).
bool check_dbias(const te_tensor* dbias, const te_tensor& ref, const char* ref_name) {
  if (dbias == nullptr || !present(*dbias)) return false;
  check_tensor(dbias, "dbias");
  check_dtype(*dbias, "dbias", kHighPrecision);
  check_same_device(*dbias, "dbias", ref.device, ref_name);
  check_shape(*dbias, "dbias", {ref.shape[ref.ndim - 1]},
              (std::string("[K], the last dim of ") + ref_name).c_str());
  return true;
}

void activation_fwd(const te_tensor* input, te_quantized_tensor* output, int32_t activation,
                    const te_activation_config* act_config, const te_quant_config* config,
                    void* stream) {
  check_source(input, "input");
  const bool gated = check_activation(activation);
  const ActivationParams params = read_params(act_config, activation);
  const te_tensor result = result_shape(*input, gated);
  ActivationFwdArgs a{};
  a.out = plan_fused_output(result, output, config, "output", "config");
  a.activation = activation;
  a.params = params;
  a.input = input->data;
  a.in_dtype = input->dtype;
  matrix_dims(result, &a.rows, &a.cols);
  a.in_cols = input->shape[input->ndim - 1];
  reset_amax_if_asked(a.out, input->device, stream);
  dispatch(input->device, "input", [&] { cpu::activation_fwd(a, stream); },
           [&] { cuda::activation_fwd(a, stream); });
}

void activation_bwd(const te_tensor* grad, const te_tensor* input, te_quantized_tensor* dx,
                    te_tensor* dbias, int32_t activation, const te_activation_config* act_config,
                    const te_quant_config* config, void* stream) {
  check_source(input, "input");
  const bool gated = check_activation(activation);
  const ActivationParams params = read_params(act_config, activation);
  const te_tensor result = result_shape(*input, gated);
  check_source(grad, "grad");
  check_same_device(*grad, "grad", input->device, "input");
  int64_t rows, cols, grad_rows, grad_cols;
  matrix_dims(result, &rows, &cols);
  matrix_dims(*grad, &grad_rows, &grad_cols);
  TE_CHECK_ARG(grad_rows == rows && grad_cols == cols, "grad.shape: expected ",
               shape_string(result.shape, result.ndim),
               gated ? " (the input's shape with the last dim halved: the activation's output)"
                     : " (the input's shape)",
               ", or any with the same last dim and element count, got ",
               shape_string(grad->shape, grad->ndim));
  te_tensor dx_shape = *input;
  dx_shape.data = nullptr;
  dx_shape.dtype = TE_DTYPE_FLOAT32;
  ActivationBwdArgs a{};
  a.dx = plan_fused_output(dx_shape, dx, config, "dx", "config");
  const bool with_dbias = check_dbias(dbias, *input, "input");
  a.activation = activation;
  a.params = params;
  a.grad = grad->data;
  a.grad_dtype = grad->dtype;
  a.input = input->data;
  a.in_dtype = input->dtype;
  a.rows = rows;
  a.cols = cols;
  a.in_cols = input->shape[input->ndim - 1];
  a.dbias = with_dbias ? dbias->data : nullptr;
  a.dbias_dtype = with_dbias ? dbias->dtype : TE_DTYPE_FLOAT32;
  reset_amax_if_asked(a.dx, input->device, stream);
  dispatch(input->device, "input", [&] { cpu::activation_bwd(a, stream); },
           [&] { cuda::activation_bwd(a, stream); });
}

void dbias_quantize(const te_tensor* input, te_quantized_tensor* output, te_tensor* dbias,
                    const te_quant_config* config, void* stream) {
  check_source(input, "input");
  DbiasQuantizeArgs a{};
  plan_quantize(*input, output, config, "output", "config", &a.out);
  TE_CHECK_ARG(dbias != nullptr && present(*dbias),
               "dbias: expected a [K] tensor (the bias gradient to write), got NULL");
  check_dbias(dbias, *input, "input");
  a.input = input->data;
  a.in_dtype = input->dtype;
  matrix_dims(*input, &a.rows, &a.cols);
  a.dbias = dbias->data;
  a.dbias_dtype = dbias->dtype;
  reset_amax_if_asked(a.out, input->device, stream);
  dispatch(input->device, "input", [&] { cpu::dbias_quantize(a, stream); },
           [&] { cuda::dbias_quantize(a, stream); });
}

}  // namespace
}  // namespace te

extern "C" {

te_status te_activation_fwd(const te_tensor* input, te_quantized_tensor* output,
                            int32_t activation, const te_quant_config* config, void* stream) {
  return te::guard("te_activation_fwd", [&] {
    te::activation_fwd(input, output, activation, nullptr, config, stream);
  });
}

te_status te_activation_bwd(const te_tensor* grad, const te_tensor* input,
                            te_quantized_tensor* dx, te_tensor* dbias, int32_t activation,
                            const te_quant_config* config, void* stream) {
  return te::guard("te_activation_bwd", [&] {
    te::activation_bwd(grad, input, dx, dbias, activation, nullptr, config, stream);
  });
}

te_status te_activation_fwd_v2(const te_tensor* input, te_quantized_tensor* output,
                               int32_t activation, const te_activation_config* act_config,
                               const te_quant_config* config, void* stream) {
  return te::guard("te_activation_fwd_v2", [&] {
    te::activation_fwd(input, output, activation, act_config, config, stream);
  });
}

te_status te_activation_bwd_v2(const te_tensor* grad, const te_tensor* input,
                               te_quantized_tensor* dx, te_tensor* dbias, int32_t activation,
                               const te_activation_config* act_config,
                               const te_quant_config* config, void* stream) {
  return te::guard("te_activation_bwd_v2", [&] {
    te::activation_bwd(grad, input, dx, dbias, activation, act_config, config, stream);
  });
}

te_status te_dbias_quantize(const te_tensor* input, te_quantized_tensor* output, te_tensor* dbias,
                            const te_quant_config* config, void* stream) {
  return te::guard("te_dbias_quantize",
                   [&] { te::dbias_quantize(input, output, dbias, config, stream); });
}

}  // extern "C"
