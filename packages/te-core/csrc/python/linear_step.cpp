// The fused steps of a quantized Linear (te_torch's LinearFn, eager mode): forward = quantize x,
// quantize W, fprop GEMM; backward = quantize dy (with the bias gradient), dgrad GEMM, wgrad GEMM.
// Each direction is one Python call instead of three to five, and each quantized copy lives in one
// caller-allocated byte buffer ("packed": data, then its scale_inv at the next 256-byte boundary)
// instead of two to four tensors: on the H200 host a small FP8 Linear step spent more time in
// Python frames, per-part allocations and argument conversion than in its kernels (NOTES.md).
// Nothing is computed here: the C API calls are te_quantize / te_dbias_quantize / te_gemm exactly
// as te_torch's unfused path makes them, so both paths give the same bytes.
//
// An operand is one of three tuples:
//   (0, src spec, (mode, fp8 dtype, QuantConfig|None, amax spec, scale spec), row ptr, col ptr)
//       quantize src into packed copies at row/col (0: that copy is not made);
//   (1, mode, fp8 dtype, source shape, device, row ptr, col ptr)
//       packed copies made earlier (the saved operands, a cached weight);
//   (2, mode, rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv)
//       parts as specs (a quantized tensor's own buffers; high precision: mode 0, rd only).
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "python/bindings.h"

namespace py = pybind11;

namespace te::python {
namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

int32_t scale_dtype_of(int32_t mode) {
  return mode == TE_SCALING_MXFP8_1D   ? TE_DTYPE_FLOAT8_E8M0
         : mode == TE_SCALING_NVFP4_1D ? TE_DTYPE_FLOAT8_E4M3
                                       : TE_DTYPE_FLOAT32;
}

size_t bytes_of(const te_tensor& t) {
  int32_t bits = 0;
  check(te_dtype_bits(t.dtype, &bits));
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return static_cast<size_t>((n * bits + 7) / 8);
}

// One copy (row- or column-wise) of a source of `src`'s shape, packed at `base`: the data, then
// its scale_inv at the next 256-byte boundary (16 bytes is what cuBLASLt needs of block scales).
// Returns the copy's size in bytes; base 0 fills only the shapes.
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

// The quantized tensor whose copies are packed at row / col (0: absent).
te_quantized_tensor carve(int32_t mode, int32_t fp8_dtype, const te_tensor& src, uintptr_t row,
                          uintptr_t col) {
  te_quantized_tensor q = te_quantized_tensor_init(mode);
  if (row != 0) carve_copy(mode, fp8_dtype, src, true, row, &q.rowwise_data, &q.rowwise_scale_inv);
  if (col != 0) {
    carve_copy(mode, fp8_dtype, src, false, col, &q.columnwise_data, &q.columnwise_scale_inv);
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

uintptr_t item_ptr(PyObject* t, Py_ssize_t i, const char* arg) {
  const unsigned long long v = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, i));
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::type_error(std::string(arg) + "[" + std::to_string(i) + "]: expected a pointer (int >= 0)");
  }
  return static_cast<uintptr_t>(v);
}

// A parsed operand: its parts, and for kind 0 the source and how to quantize it.
struct Operand {
  te_quantized_tensor q;
  bool quantize = false;
  te_tensor src{};
  const te_quant_config* config = nullptr;
};

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
    op.src = spec(PyTuple_GET_ITEM(t, 1), arg);
    PyObject* qt = PyTuple_GET_ITEM(t, 2);
    if (!PyTuple_Check(qt) || PyTuple_GET_SIZE(qt) != 5) {
      throw py::type_error(std::string(arg) +
                           "[2]: expected (mode, fp8 dtype, QuantConfig|None, amax, scale)");
    }
    const auto mode = static_cast<int32_t>(item_int(qt, 0, arg));
    const auto fp8 = static_cast<int32_t>(item_int(qt, 1, arg));
    py::handle cfg = PyTuple_GET_ITEM(qt, 2);
    if (!cfg.is_none()) op.config = cfg.cast<const te_quant_config*>();
    op.q = carve(mode, fp8, op.src, item_ptr(t, 3, arg), item_ptr(t, 4, arg));
    op.q.amax = spec(PyTuple_GET_ITEM(qt, 3), "amax");
    op.q.scale = spec(PyTuple_GET_ITEM(qt, 4), "scale");
    op.quantize = true;
  } else if (kind == 1 && n == 7) {
    te_tensor src{};
    fill_shape(src, PyTuple_GET_ITEM(t, 3), arg);
    src.device = device_of(item_int(t, 4, arg));
    op.q = carve(static_cast<int32_t>(item_int(t, 1, arg)), static_cast<int32_t>(item_int(t, 2, arg)),
                 src, item_ptr(t, 5, arg), item_ptr(t, 6, arg));
  } else if (kind == 2 && n == 6) {
    op.q = te_quantized_tensor_init(static_cast<int32_t>(item_int(t, 1, arg)));
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

// The operand with only one copy: te_gemm reads the copy its layout needs, and the other may
// not exist (a saved operand keeps only its column-wise copy).
te_quantized_tensor only(const te_quantized_tensor& q, bool rowwise) {
  te_quantized_tensor r = q;
  if (rowwise) {
    r.columnwise_data = r.columnwise_scale_inv = te_tensor{};
  } else {
    r.rowwise_data = r.rowwise_scale_inv = te_tensor{};
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
  if (h.is_none()) throw py::type_error(std::string(arg) + ": expected a GemmConfig, got None");
  return h.cast<const te_gemm_config*>();
}

#define TE_TRY(call)                      \
  do {                                    \
    const te_status s_ = (call);          \
    if (s_ != TE_SUCCESS) return s_;      \
  } while (0)

}  // namespace

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
          return gemm(only(xo.q, true), only(wo.q, true), d, c, b, s);
        }));
      },
      py::arg("x"), py::arg("w"), py::arg("bias").none(true), py::arg("out"), py::arg("config"),
      py::arg("stream"),
      "out = x w^T (+ bias) with config's layout (fprop: trans_b): quantizes the kind-0 "
      "operands into their packed buffers first (both copies where both pointers are given), "
      "then te_gemm on the row-wise copies.");
  m.def(
      "linear_bwd",
      [](py::handle dy, py::handle dbias, py::handle x, py::handle w, py::handle dx,
         py::handle dgrad_config, py::handle dw, py::handle wgrad_config, uintptr_t stream) {
        Operand g = operand(dy, "dy");
        te_tensor db = spec(dbias, "dbias");
        if (!g.quantize && (db.data != nullptr || db.ndim > 0)) {
          throw py::value_error(
              "dbias: expected None when dy is given quantized (kind 1 or 2): the bias gradient "
              "is summed from dy's high-precision values as they are quantized (kind 0)");
        }
        const te_tensor dxt = spec(dx, "dx"), dwt = spec(dw, "dw");
        const bool need_dx = dxt.data != nullptr || dxt.ndim > 0;
        const bool need_dw = dwt.data != nullptr || dwt.ndim > 0;
        Operand xo, wo;
        const te_gemm_config *dc = nullptr, *wc = nullptr;
        if (need_dx) {
          wo = operand(w, "w");
          dc = gemm_config(dgrad_config, "dgrad_config");
        }
        if (need_dw) {
          xo = operand(x, "x");
          wc = gemm_config(wgrad_config, "wgrad_config");
        }
        void* s = as_stream(stream);
        check(without_gil([&] {
          const bool with_db = db.data != nullptr || db.ndim > 0;
          if (g.quantize) {
            TE_TRY(with_db ? te_dbias_quantize(&g.src, &g.q, &db, g.config, s)
                           : te_quantize(&g.src, &g.q, g.config, s));
          }
          if (need_dx) TE_TRY(gemm(only(g.q, true), only(wo.q, false), dxt, dc, te_tensor{}, s));
          if (need_dw) return gemm(only(g.q, false), only(xo.q, false), dwt, wc, te_tensor{}, s);
          return TE_SUCCESS;
        }));
      },
      py::arg("dy"), py::arg("dbias").none(true), py::arg("x").none(true), py::arg("w").none(true),
      py::arg("dx").none(true), py::arg("dgrad_config").none(true), py::arg("dw").none(true),
      py::arg("wgrad_config").none(true), py::arg("stream"),
      "The Linear backward: dy quantized (a kind-0 operand; kind 1/2: given quantized), with "
      "dbias (None: no bias gradient; kind 0 only) from the same pass; dx = dy w by dgrad_config (None dx: skipped) on dy's "
      "row-wise and w's column-wise copies; dw = dy^T x by wgrad_config (beta 1 accumulates "
      "into dw, e.g. an fp32 main_grad; None dw: skipped) on both column-wise copies.");
}

}  // namespace te::python
