// The operand parsing and packing of the fused steps (step_operands.h).
#include "python/step_operands.h"

#include <cstdint>
#include <string>

namespace py = pybind11;

namespace te::python::step {
namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

int32_t scale_dtype_of(int32_t mode) {
  return mode == TE_SCALING_MXFP8_1D   ? TE_DTYPE_FLOAT8_E8M0
         : mode == TE_SCALING_NVFP4_1D ? TE_DTYPE_FLOAT8_E4M3
                                       : TE_DTYPE_FLOAT32;
}

// The shape came through te_quantized_shape, which rejects negative sizes and element counts
// past int64; the bit count may still overflow.
size_t bytes_of(const te_tensor& t) {
  int32_t bits = 0;
  check(te_dtype_bits(t.dtype, &bits));
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  int64_t total_bits = 0;
  if (__builtin_mul_overflow(n, static_cast<int64_t>(bits), &total_bits)) {
    throw py::value_error("te_quantized_shape: shape: expected a size whose byte count fits in "
                          "int64, got " + std::to_string(n) + " elements of " +
                          std::to_string(bits) + " bits");
  }
  return static_cast<size_t>((total_bits + 7) / 8);
}

// The quantized tensor whose copies are packed at row / col (0: absent). A bad mode, dtype or
// shape fails in the layout query; `arg` (the operand) prefixes its message.
te_quantized_tensor carve(int32_t mode, int32_t fp8_dtype, const te_tensor& src, uintptr_t row,
                          uintptr_t col, const char* arg) {
  te_quantized_tensor q = te_quantized_tensor_init(mode);
  try {
    if (row != 0) {
      carve_copy(mode, fp8_dtype, src, true, row, &q.rowwise_data, &q.rowwise_scale_inv);
    }
    if (col != 0) {
      carve_copy(mode, fp8_dtype, src, false, col, &q.columnwise_data, &q.columnwise_scale_inv);
    }
  } catch (const py::value_error& e) {
    throw py::value_error(std::string(arg) + ": packed copies (mode " + std::to_string(mode) +
                          ", fp8 dtype " + std::to_string(fp8_dtype) + "): " + e.what());
  }
  return q;
}

int64_t item_int(PyObject* t, Py_ssize_t i, const char* arg) {
  const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::type_error(std::string(arg) + "[" + std::to_string(i) + "]: expected an int");
  }
  return v;
}

// A mode, dtype or device: int32 fields, so a wider value would be truncated.
int32_t item_int32(PyObject* t, Py_ssize_t i, const char* arg) {
  const int64_t v = item_int(t, i, arg);
  if (v < INT32_MIN || v > INT32_MAX) {
    throw py::value_error(std::string(arg) + "[" + std::to_string(i) +
                          "]: expected an int32 value, got " + std::to_string(v));
  }
  return static_cast<int32_t>(v);
}

uintptr_t item_ptr(PyObject* t, Py_ssize_t i, const char* arg) {
  const unsigned long long v = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, i));
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::type_error(std::string(arg) + "[" + std::to_string(i) +
                         "]: expected a pointer (int >= 0)");
  }
  return static_cast<uintptr_t>(v);
}

// Copies of src per quant (mode, fp8 dtype, QuantConfig|None, amax, scale) at row / col.
Operand quantized_into(PyObject* qt, const te_tensor& src, uintptr_t row, uintptr_t col,
                       const char* arg) {
  if (!PyTuple_Check(qt) || PyTuple_GET_SIZE(qt) != 5) {
    throw py::type_error(std::string(arg) +
                         ": expected quant = (mode, fp8 dtype, QuantConfig|None, amax, scale), "
                         "got " + std::string(py::repr(qt)));
  }
  Operand op;
  op.src = src;
  const int32_t mode = item_int32(qt, 0, arg);
  const int32_t fp8 = item_int32(qt, 1, arg);
  py::handle cfg = PyTuple_GET_ITEM(qt, 2);
  if (!cfg.is_none()) {
    try {
      op.config = cfg.cast<const te_quant_config*>();
    } catch (const py::cast_error&) {
      throw py::type_error(std::string(arg) + ": expected quant[2] a QuantConfig or None, got " +
                           std::string(py::repr(cfg)));
    }
  }
  op.q = carve(mode, fp8, src, row, col, arg);
  op.q.amax = spec(PyTuple_GET_ITEM(qt, 3), "amax");
  op.q.scale = spec(PyTuple_GET_ITEM(qt, 4), "scale");
  op.quantize = true;
  return op;
}

te_tensor item_spec(PyObject* t, Py_ssize_t i, const char* arg) {
  return spec(PyTuple_GET_ITEM(t, i), (std::string(arg) + "[" + std::to_string(i) + "]").c_str());
}

}  // namespace

size_t carve_copy(int32_t mode, int32_t fp8_dtype, const te_tensor& src, bool rowwise,
                  uintptr_t base, te_tensor* data, te_tensor* scale_inv) {
  *data = src;
  data->dtype = fp8_dtype;
  if (!rowwise) {
    check(te_quantized_shape(mode, TE_PART_COLUMNWISE_DATA, src.shape, src.ndim, data->shape,
                             &data->ndim));
  }
  *scale_inv = te_tensor{};
  scale_inv->dtype = scale_dtype_of(mode);
  scale_inv->device = src.device;
  check(te_quantized_shape(mode, rowwise ? TE_PART_ROWWISE_SCALE_INV : TE_PART_COLUMNWISE_SCALE_INV,
                           src.shape, src.ndim, scale_inv->shape, &scale_inv->ndim));
  const size_t data_bytes = align_up(bytes_of(*data));
  data->data = reinterpret_cast<void*>(base);
  scale_inv->data = reinterpret_cast<void*>(base == 0 ? 0 : base + data_bytes);
  return data_bytes + bytes_of(*scale_inv);
}

Operand operand(py::handle h, const char* arg) {
  PyObject* t = h.ptr();
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1) {
    throw py::type_error(std::string(arg) + ": expected an operand tuple (0|1|2, ...), got " +
                         std::string(py::repr(h)));
  }
  const int64_t kind = item_int(t, 0, arg);
  const Py_ssize_t n = PyTuple_GET_SIZE(t);
  Operand op;
  if (kind == 0 && n == 5) {
    op = quantized_into(PyTuple_GET_ITEM(t, 2), spec(PyTuple_GET_ITEM(t, 1), arg),
                        item_ptr(t, 3, arg), item_ptr(t, 4, arg), arg);
  } else if (kind == 1 && n == 7) {
    te_tensor src{};
    fill_shape(src, PyTuple_GET_ITEM(t, 3), arg);
    src.device = device_of(item_int32(t, 4, arg));
    const int32_t mode = item_int32(t, 1, arg);
    const int32_t fp8 = item_int32(t, 2, arg);
    op.q = carve(mode, fp8, src, item_ptr(t, 5, arg), item_ptr(t, 6, arg), arg);
  } else if (kind == 2 && n == 6) {
    op.q = te_quantized_tensor_init(item_int32(t, 1, arg));
    op.q.rowwise_data = spec(PyTuple_GET_ITEM(t, 2), arg);
    op.q.rowwise_scale_inv = spec(PyTuple_GET_ITEM(t, 3), arg);
    op.q.columnwise_data = spec(PyTuple_GET_ITEM(t, 4), arg);
    op.q.columnwise_scale_inv = spec(PyTuple_GET_ITEM(t, 5), arg);
  } else {
    throw py::type_error(std::string(arg) + ": expected (0, src, quant, row, col), (1, mode, "
                         "fp8 dtype, shape, device, row, col) or (2, mode, rd, rs, cd, cs), got " +
                         std::string(py::repr(h)));
  }
  return op;
}

Operand target(py::handle h, const te_tensor& src, const char* arg) {
  PyObject* t = h.ptr();
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) {
    throw py::type_error(std::string(arg) + ": expected a packed target (quant, row ptr, col "
                         "ptr), got " + std::string(py::repr(h)));
  }
  return quantized_into(PyTuple_GET_ITEM(t, 0), src, item_ptr(t, 1, arg), item_ptr(t, 2, arg),
                        arg);
}

te_quantized_tensor only(const te_quantized_tensor& q, bool rowwise) {
  te_quantized_tensor r = q;
  if (rowwise) {
    r.columnwise_data = r.columnwise_scale_inv = te_tensor{};
  } else {
    r.rowwise_data = r.rowwise_scale_inv = te_tensor{};
  }
  return r;
}

namespace {

int64_t matrix_rows(const te_tensor& t) {
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.ndim; ++i) rows *= t.shape[i];
  return rows;
}

}  // namespace

te_quantized_tensor rowwise_for(const te_quantized_tensor& q, const te_tensor& d) {
  te_quantized_tensor r = only(q, true);
  te_tensor& a = r.rowwise_data;
  if (r.scaling_mode != TE_SCALING_PER_TENSOR || a.ndim < 1 || d.ndim < 1) return r;
  const int64_t rows = matrix_rows(d);
  if (rows < matrix_rows(a)) {
    a.shape[1] = a.shape[a.ndim - 1];
    a.shape[0] = rows;
    a.ndim = 2;
  }
  return r;
}

te_status gemm(const te_quantized_tensor& a, const te_quantized_tensor& b, const te_tensor& d,
               const te_gemm_config* config, const te_tensor& bias, void* stream) {
  te_quantized_tensor out = te_quantized_tensor_init(TE_SCALING_PER_TENSOR);
  out.rowwise_data = d;
  te_gemm_config c = *config;
  c.bias = bias;
  return te_gemm(&a, &b, &out, &c, stream);
}

const te_gemm_config* gemm_config(py::handle h, const char* arg) {
  // The cast checks the type anyway (a per-call path): its failure becomes a message that
  // names the argument.
  try {
    if (!h.is_none()) return h.cast<const te_gemm_config*>();
  } catch (const py::cast_error&) {
  }
  throw py::type_error(std::string(arg) + ": expected a GemmConfig, got " + std::string(py::repr(h)));
}

const te_norm_config* norm_config(py::handle h, const char* arg) {
  if (!py::isinstance<te_norm_config>(h)) {
    throw py::type_error(std::string(arg) + ": expected a NormConfig, got " +
                         std::string(py::repr(h)));
  }
  return h.cast<const te_norm_config*>();
}

namespace {

LinearGrads linear_grads(Operand g, py::handle dbias, py::handle x, py::handle w, py::handle dx,
                         py::handle dgrad_config, py::handle dw, py::handle wgrad_config,
                         const char* const names[8]) {
  LinearGrads l;
  l.g = g;
  l.db = spec(dbias, names[1]);
  if (!l.g.quantize && present(l.db)) {
    throw py::value_error(std::string(names[1]) +
                          ": expected None when dy is given quantized (kind 1 or 2): the bias "
                          "gradient is summed from dy's high-precision values as they are "
                          "quantized (kind 0)");
  }
  l.dx = spec(dx, names[4]);
  l.dw = spec(dw, names[6]);
  if (present(l.dx)) {
    l.w = operand(w, names[3]);
    l.dgrad = gemm_config(dgrad_config, names[5]);
  }
  if (present(l.dw)) {
    l.x = operand(x, names[2]);
    l.wgrad = gemm_config(wgrad_config, names[7]);
  }
  return l;
}

}  // namespace

LinearGrads linear_grads(py::handle dy, py::handle dbias, py::handle x, py::handle w,
                         py::handle dx, py::handle dgrad_config, py::handle dw,
                         py::handle wgrad_config, const char* const names[8]) {
  return linear_grads(operand(dy, names[0]), dbias, x, w, dx, dgrad_config, dw, wgrad_config,
                      names);
}

LinearGrads linear_grads(py::handle args, const char* what, const char* const names[8],
                         const te_tensor* dy_src) {
  PyObject* t = args.ptr();
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 8) {
    throw py::type_error(std::string(what) +
                         ": expected (dy, dbias, x, w, dx, dgrad_config, dw, wgrad_config), got " +
                         std::string(py::repr(args)));
  }
  auto at = [t](Py_ssize_t i) { return py::handle(PyTuple_GET_ITEM(t, i)); };
  Operand g = dy_src == nullptr ? operand(at(0), names[0]) : target(at(0), *dy_src, names[0]);
  return linear_grads(g, at(1), at(2), at(3), at(4), at(5), at(6), at(7), names);
}

te_status quantize_grad(LinearGrads& l, void* stream) {
  if (!l.g.quantize) return TE_SUCCESS;
  if (present(l.db)) return te_dbias_quantize(&l.g.src, &l.g.q, &l.db, l.g.config, stream);
  return te_quantize(&l.g.src, &l.g.q, l.g.config, stream);
}

te_status linear_gemms(const LinearGrads& l, void* stream) {
  if (present(l.dx)) {
    TE_TRY(gemm(rowwise_for(l.g.q, l.dx), only(l.w.q, false), l.dx, l.dgrad, te_tensor{}, stream));
  }
  if (present(l.dw)) {
    return gemm(only(l.g.q, false), only(l.x.q, false), l.dw, l.wgrad, te_tensor{}, stream);
  }
  return TE_SUCCESS;
}

NormGrads norm_grads(py::handle args, const char* arg) {
  PyObject* t = args.ptr();
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 9) {
    throw py::type_error(std::string(arg) + ": expected (rms, x, mu, rsigma, gamma, dx, dgamma, "
                         "dbeta, NormConfig), got " + std::string(py::repr(args)));
  }
  NormGrads n;
  const int rms = PyObject_IsTrue(PyTuple_GET_ITEM(t, 0));
  if (rms < 0) throw py::error_already_set();  // its __bool__ raised
  n.rms = rms == 1;
  n.x = item_spec(t, 1, arg);
  n.mu = item_spec(t, 2, arg);
  n.rsigma = item_spec(t, 3, arg);
  n.gamma = item_spec(t, 4, arg);
  n.dx = item_spec(t, 5, arg);
  n.dgamma = item_spec(t, 6, arg);
  n.dbeta = item_spec(t, 7, arg);
  n.config = norm_config(PyTuple_GET_ITEM(t, 8), (std::string(arg) + "[8]").c_str());
  if (n.rms && (present(n.mu) || present(n.dbeta))) {
    throw py::value_error(std::string(arg) +
                          ": expected mu and dbeta None for RMSNorm (it has no mean or bias)");
  }
  return n;
}

te_status norm_bwd(const te_tensor& dz, NormGrads& n, void* stream) {
  if (n.rms) {
    return te_rmsnorm_bwd(&dz, &n.x, &n.rsigma, &n.gamma, &n.dx, &n.dgamma, n.config, stream);
  }
  return te_layernorm_bwd(&dz, &n.x, &n.mu, &n.rsigma, &n.gamma, &n.dx, &n.dgamma, &n.dbeta,
                          n.config, stream);
}

NormFwd norm_fwd_args(bool rms, py::handle x, py::handle gamma, py::handle beta, py::handle out,
                      py::handle mu, py::handle rsigma, py::handle config) {
  if (rms && !beta.is_none()) {
    throw py::value_error("beta: expected None for RMSNorm (it has no bias)");
  }
  NormFwd n;
  n.rms = rms;
  n.x = spec(x, "x");
  n.gamma = spec(gamma, "gamma");
  n.beta = spec(beta, "beta");
  n.out = target(out, n.x, "ln_out");
  n.mu = spec(mu, "mu");
  n.rsigma = spec(rsigma, "rsigma");
  n.config = norm_config(config, "norm_config");
  return n;
}

te_status norm_fwd(NormFwd& n, void* stream) {
  if (n.rms) {
    return te_rmsnorm_fwd(&n.x, &n.gamma, &n.out.q, &n.rsigma, n.config, n.out.config, stream);
  }
  return te_layernorm_fwd(&n.x, &n.gamma, &n.beta, &n.out.q, &n.mu, &n.rsigma, n.config,
                          n.out.config, stream);
}

}  // namespace te::python::step
