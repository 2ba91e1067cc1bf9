// te_layernorm_fwd/_bwd, te_rmsnorm_fwd/_bwd/_bwd_add: validate every descriptor, then hand the
// device's norm kernel a flat argument struct (common/kernels.h). Formulas: te/normalization.h.
#include "te/normalization.h"

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

te_norm_config read_config(const te_norm_config* config) {
  te_norm_config c = te_norm_config_init();
  if (config == nullptr) return c;
  check_struct_size(config->struct_size, sizeof(te_norm_config), "config");
  c = *config;
  TE_CHECK_ARG(std::isfinite(c.eps) && c.eps >= 0.0f,
               "config->eps: expected a finite value >= 0, got ", c.eps);
  TE_CHECK_ARG(c.zero_centered_gamma == 0 || c.zero_centered_gamma == 1,
               "config->zero_centered_gamma: expected 0 or 1, got ", c.zero_centered_gamma);
  return c;
}

// The [..., H] tensor every other argument is checked against; returns M and H.
void check_source(const te_tensor* t, const char* name, int64_t* rows, int64_t* cols) {
  check_tensor(t, name);
  check_dtype(*t, name, kHighPrecision);
  TE_CHECK_ARG(t->ndim >= 1, name, ".ndim: expected >= 1 (a [..., H] tensor), got 0");
  matrix_dims(*t, rows, cols);
  TE_CHECK_ARG(*cols >= 1, name, ".shape: expected a last dim (H, the normalized size) >= 1, got ",
               shape_string(t->shape, t->ndim));
}

// A high-precision tensor with the same [M, H] view as `ref`.
void check_like(const te_tensor* t, const std::string& name, const te_tensor& ref,
                const char* ref_name) {
  check_tensor(t, name);
  check_dtype(*t, name, kHighPrecision);
  check_same_device(*t, name, ref.device, ref_name);
  int64_t rows, cols, r, c;
  matrix_dims(ref, &rows, &cols);
  matrix_dims(*t, &r, &c);
  TE_CHECK_ARG(t->ndim >= 1 && r == rows && c == cols, name, ".shape: expected ",
               shape_string(ref.shape, ref.ndim), " (", ref_name,
               "'s shape, or any with the same last dim and element count), got ",
               shape_string(t->shape, t->ndim));
}

// A [H] vector (gamma, beta, dgamma, dbeta).
void check_vector(const te_tensor* t, const std::string& name, int64_t h, const te_tensor& ref,
                  const char* ref_name) {
  check_tensor(t, name);
  check_dtype(*t, name, kHighPrecision);
  check_same_device(*t, name, ref.device, ref_name);
  check_shape(*t, name, {h}, "[H], the input's last dim");
}

// mu / rsigma: fp32 with one element per row.
void check_stats(const te_tensor* t, const std::string& name, int64_t rows, const te_tensor& ref,
                 const char* ref_name) {
  check_tensor(t, name);
  check_dtype(*t, name, {TE_DTYPE_FLOAT32});
  check_same_device(*t, name, ref.device, ref_name);
  TE_CHECK_ARG(numel(*t) == rows, name, ".shape: expected ", rows,
               " elements (one per row of the [M, H] input, M = ", rows, "), got ",
               shape_string(t->shape, t->ndim));
}

bool given(const te_tensor* t) { return t != nullptr && present(*t); }

void norm_fwd(bool rms, const te_tensor* input, const te_tensor* gamma, const te_tensor* beta,
              te_quantized_tensor* output, te_tensor* mu, te_tensor* rsigma,
              const te_norm_config* config, const te_quant_config* quant_config, void* stream) {
  int64_t rows, cols;
  check_source(input, "input", &rows, &cols);
  const te_norm_config cfg = read_config(config);
  check_vector(gamma, "gamma", cols, *input, "input");
  if (given(beta)) check_vector(beta, "beta", cols, *input, "input");
  if (given(mu)) check_stats(mu, "mu", rows, *input, "input");
  if (given(rsigma)) check_stats(rsigma, "rsigma", rows, *input, "input");

  te_tensor result = *input;  // the fp32 y the output receives: the input's shape and device
  result.dtype = TE_DTYPE_FLOAT32;
  result.data = nullptr;
  NormFwdArgs a{};
  a.out = plan_fused_output(result, output, quant_config, "output", "quant_config");
  a.rms = rms;
  a.input = input->data;
  a.in_dtype = input->dtype;
  a.rows = rows;
  a.cols = cols;
  a.gamma = gamma->data;
  a.gamma_dtype = gamma->dtype;
  a.beta = given(beta) ? beta->data : nullptr;
  a.beta_dtype = given(beta) ? beta->dtype : TE_DTYPE_FLOAT32;
  a.eps = cfg.eps;
  a.zero_centered_gamma = cfg.zero_centered_gamma != 0;
  a.mu = given(mu) ? static_cast<float*>(mu->data) : nullptr;
  a.rsigma = given(rsigma) ? static_cast<float*>(rsigma->data) : nullptr;
  reset_amax_if_asked(a.out, input->device, stream);
  dispatch(input->device, "input", [&] { cpu::norm_fwd(a, stream); },
           [&] { cuda::norm_fwd(a, stream); });
}

void norm_bwd(bool rms, const te_tensor* dz, const te_tensor* x, const te_tensor* add,
              const te_tensor* mu, const te_tensor* rsigma, const te_tensor* gamma, te_tensor* dx,
              te_tensor* dgamma, te_tensor* dbeta, const te_norm_config* config, void* stream) {
  int64_t rows, cols;
  check_source(x, "x", &rows, &cols);
  const te_norm_config cfg = read_config(config);
  check_like(dz, "dz", *x, "x");
  if (add != nullptr) check_like(add, "add", *x, "x");  // only _bwd_add passes one
  if (!rms) check_stats(mu, "mu", rows, *x, "x");
  check_stats(rsigma, "rsigma", rows, *x, "x");
  check_vector(gamma, "gamma", cols, *x, "x");
  check_like(dx, "dx", *x, "x");
  check_vector(dgamma, "dgamma", cols, *x, "x");
  if (!rms && given(dbeta)) check_vector(dbeta, "dbeta", cols, *x, "x");

  NormBwdArgs a{};
  a.rms = rms;
  a.dz = dz->data;
  a.dz_dtype = dz->dtype;
  a.x = x->data;
  a.x_dtype = x->dtype;
  a.rows = rows;
  a.cols = cols;
  a.mu = rms ? nullptr : static_cast<const float*>(mu->data);
  a.rsigma = static_cast<const float*>(rsigma->data);
  a.gamma = gamma->data;
  a.gamma_dtype = gamma->dtype;
  a.zero_centered_gamma = cfg.zero_centered_gamma != 0;
  a.add = add ? add->data : nullptr;
  a.add_dtype = add ? add->dtype : TE_DTYPE_FLOAT32;
  a.dx = dx->data;
  a.dx_dtype = dx->dtype;
  a.dgamma = dgamma->data;
  a.dgamma_dtype = dgamma->dtype;
  const bool with_dbeta = !rms && given(dbeta);
  a.dbeta = with_dbeta ? dbeta->data : nullptr;
  a.dbeta_dtype = with_dbeta ? dbeta->dtype : TE_DTYPE_FLOAT32;
  dispatch(x->device, "x", [&] { cpu::norm_bwd(a, stream); }, [&] { cuda::norm_bwd(a, stream); });
}

}  // namespace
}  // namespace te

extern "C" {

te_status te_layernorm_fwd(const te_tensor* input, const te_tensor* gamma, const te_tensor* beta,
                           te_quantized_tensor* output, te_tensor* mu, te_tensor* rsigma,
                           const te_norm_config* config, const te_quant_config* quant_config,
                           void* stream) {
  return te::guard("te_layernorm_fwd", [&] {
    te::norm_fwd(false, input, gamma, beta, output, mu, rsigma, config, quant_config, stream);
  });
}

te_status te_rmsnorm_fwd(const te_tensor* input, const te_tensor* gamma,
                         te_quantized_tensor* output, te_tensor* rsigma,
                         const te_norm_config* config, const te_quant_config* quant_config,
                         void* stream) {
  return te::guard("te_rmsnorm_fwd", [&] {
    te::norm_fwd(true, input, gamma, nullptr, output, nullptr, rsigma, config, quant_config,
                 stream);
  });
}

te_status te_layernorm_bwd(const te_tensor* dz, const te_tensor* x, const te_tensor* mu,
                           const te_tensor* rsigma, const te_tensor* gamma, te_tensor* dx,
                           te_tensor* dgamma, te_tensor* dbeta, const te_norm_config* config,
                           void* stream) {
  return te::guard("te_layernorm_bwd", [&] {
    te::norm_bwd(false, dz, x, nullptr, mu, rsigma, gamma, dx, dgamma, dbeta, config, stream);
  });
}

te_status te_rmsnorm_bwd(const te_tensor* dz, const te_tensor* x, const te_tensor* rsigma,
                         const te_tensor* gamma, te_tensor* dx, te_tensor* dgamma,
                         const te_norm_config* config, void* stream) {
  return te::guard("te_rmsnorm_bwd", [&] {
    te::norm_bwd(true, dz, x, nullptr, nullptr, rsigma, gamma, dx, dgamma, nullptr, config,
                 stream);
  });
}

te_status te_rmsnorm_bwd_add(const te_tensor* dz, const te_tensor* x, const te_tensor* add,
                             const te_tensor* rsigma, const te_tensor* gamma, te_tensor* dx,
                             te_tensor* dgamma, const te_norm_config* config, void* stream) {
  return te::guard("te_rmsnorm_bwd_add", [&] {
    TE_CHECK_ARG(add != nullptr, "add: expected a tensor descriptor, got NULL");
    te::norm_bwd(true, dz, x, add, nullptr, rsigma, gamma, dx, dgamma, nullptr, config, stream);
  });
}

}  // extern "C"
