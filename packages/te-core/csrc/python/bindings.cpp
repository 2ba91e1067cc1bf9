// te_core._C: the C API for Python, and nothing more. It takes raw pointers (ints), shapes, dtype
// enums and stream handles; no framework type crosses it. The C layer validates everything, so
// this file only converts and maps a failed status to a Python exception carrying
// te_last_error()'s text: ValueError for bad arguments, NotImplementedError for what this build
// or device cannot do, RuntimeError for CUDA failures.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "python/bindings.h"
#include "te/te.h"

namespace py = pybind11;

namespace te::python {

// te/log.h handler: te-core logs once per kind of event, from whatever thread runs the call (GIL
// released there, or an XLA thread), so the GIL is taken here; after interpreter shutdown the
// message is dropped.
void forward_log(int32_t level, const char* message, void*) {
  if (!Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  try {
    py::module_::import("logging").attr("getLogger")("te").attr("log")(level, message);
  } catch (const py::error_already_set&) {
    PyErr_Clear();
  }
}

void check(te_status status) {
  if (status == TE_SUCCESS) return;
  const std::string message = te_last_error();
  switch (status) {
    case TE_ERROR_INVALID_ARGUMENT: throw py::value_error(message);
    case TE_ERROR_UNSUPPORTED: throw NotImplementedErrorPy(message);
    default: throw std::runtime_error(message);
  }
}

namespace {

te_tensor make_tensor(uintptr_t ptr, int32_t dtype, const std::vector<int64_t>& shape,
                      int32_t device_type, int32_t device_index) {
  if (shape.size() > TE_MAX_DIMS) {
    throw py::value_error("shape: expected at most " + std::to_string(TE_MAX_DIMS) +
                          " dims, got " + std::to_string(shape.size()));
  }
  te_tensor t{};
  t.data = reinterpret_cast<void*>(ptr);
  t.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  t.dtype = dtype;
  t.device = {device_type, device_index};
  return t;
}

std::vector<int64_t> shape_of(const te_tensor& t) {
  return std::vector<int64_t>(t.shape, t.shape + t.ndim);
}

te_tensor or_absent(const std::optional<te_tensor>& t) { return t ? *t : te_tensor{}; }

}  // namespace

// ---- flat entry points (DESIGN.md "The hot path"; bindings.h says what a spec is) -------------

void fill_shape(te_tensor& t, py::handle shape, const char* arg) {
  PyObject* s = shape.ptr();
  if (PyTuple_Check(s)) {  // also torch.Size
    const Py_ssize_t n = PyTuple_GET_SIZE(s);
    if (n > TE_MAX_DIMS) {
      throw py::value_error(std::string(arg) + ": expected at most " +
                            std::to_string(TE_MAX_DIMS) + " dims, got " + std::to_string(n));
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      const long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(s, i));
      if (d == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        throw py::type_error(std::string(arg) + ": expected a tuple of ints, got " +
                             std::string(py::repr(shape)));
      }
      t.shape[i] = d;
    }
    t.ndim = static_cast<int32_t>(n);
    return;
  }
  std::vector<int64_t> v;  // any other sequence of ints
  try {
    v = shape.cast<std::vector<int64_t>>();
  } catch (const py::cast_error&) {
    throw py::type_error(std::string(arg) + ": expected a tuple of ints, got " +
                         std::string(py::repr(shape)));
  }
  if (v.size() > TE_MAX_DIMS) {
    throw py::value_error(std::string(arg) + ": expected at most " + std::to_string(TE_MAX_DIMS) +
                          " dims, got " + std::to_string(v.size()));
  }
  for (size_t i = 0; i < v.size(); ++i) t.shape[i] = v[i];
  t.ndim = static_cast<int32_t>(v.size());
}

te_device device_of(int64_t device) {
  return device < 0 ? te_device{TE_DEVICE_CPU, 0}
                    : te_device{TE_DEVICE_CUDA, static_cast<int32_t>(device)};
}

namespace {

[[noreturn]] void bad_spec(const char* arg, py::handle h) {
  throw py::type_error(std::string(arg) +
                       ": expected None, a Tensor or a (ptr: int, dtype: int, shape: tuple, "
                       "device: int) tuple, got " + std::string(py::repr(h)));
}

uintptr_t as_ptr(PyObject* o, const char* arg, py::handle h) {
  const unsigned long long p = PyLong_AsUnsignedLongLong(o);
  if (p == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    bad_spec(arg, h);
  }
  return static_cast<uintptr_t>(p);
}

int64_t as_int(PyObject* o, const char* arg, py::handle h) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    bad_spec(arg, h);
  }
  return v;
}

// A dtype or CUDA ordinal: an int32 field of te_tensor, so a wider value would be truncated.
int32_t as_int32(PyObject* o, const char* arg, py::handle h) {
  const int64_t v = as_int(o, arg, h);
  if (v < INT32_MIN || v > INT32_MAX) {
    throw py::value_error(std::string(arg) + ": expected dtype and device to fit in int32 (device "
                          "-1: the CPU), got " + std::string(py::repr(h)));
  }
  return static_cast<int32_t>(v);
}

}  // namespace

te_tensor spec(py::handle h, const char* arg) {
  te_tensor t{};
  PyObject* o = h.ptr();
  if (o == Py_None) return t;
  if (PyTuple_Check(o)) {
    if (PyTuple_GET_SIZE(o) != 4) bad_spec(arg, h);
    t.data = reinterpret_cast<void*>(as_ptr(PyTuple_GET_ITEM(o, 0), arg, h));
    t.dtype = as_int32(PyTuple_GET_ITEM(o, 1), arg, h);
    fill_shape(t, PyTuple_GET_ITEM(o, 2), arg);
    t.device = device_of(as_int32(PyTuple_GET_ITEM(o, 3), arg, h));
    return t;
  }
  if (!py::isinstance<te_tensor>(h)) bad_spec(arg, h);
  return h.cast<const te_tensor&>();
}

namespace {

// A dense tensor of one of the quantize outputs: absent when ``shape`` is None.
te_tensor part(uintptr_t ptr, int32_t dtype, py::handle shape, te_device device, const char* arg) {
  te_tensor t{};
  if (shape.is_none()) return t;
  t.data = reinterpret_cast<void*>(ptr);
  t.dtype = dtype;
  fill_shape(t, shape, arg);
  t.device = device;
  return t;
}

// A te_quantized_tensor from its parts as specs (above); the output of the fused ops' *_flat
// entry points (high precision: rowwise data alone in PER_TENSOR mode).
te_quantized_tensor quantized(int32_t mode, py::handle rd, py::handle rs, py::handle cd,
                              py::handle cs, py::handle amax, py::handle scale) {
  te_quantized_tensor q = te_quantized_tensor_init(mode);
  q.rowwise_data = spec(rd, "rowwise_data");
  q.rowwise_scale_inv = spec(rs, "rowwise_scale_inv");
  q.columnwise_data = spec(cd, "columnwise_data");
  q.columnwise_scale_inv = spec(cs, "columnwise_scale_inv");
  q.amax = spec(amax, "amax");
  q.scale = spec(scale, "scale");
  return q;
}

void require_none(py::handle h, const char* arg, const char* why) {
  if (!h.is_none()) throw py::value_error(std::string(arg) + ": expected None " + why);
}

// te_delayed_scaling_update_groups' arguments converted once: te_torch keeps one per unchanged
// set of delayed-scaling states and calls it every step, so the step pays no list conversions.
// The descriptors point at buffers the caller keeps alive; `groups` points into the vectors, so
// the object moves but never copies.
struct DelayedScalingUpdate {
  std::vector<std::vector<te_tensor>> histories, scales;
  std::vector<te_delayed_scaling_group> groups;
  DelayedScalingUpdate() = default;
  DelayedScalingUpdate(DelayedScalingUpdate&&) = default;
  DelayedScalingUpdate(const DelayedScalingUpdate&) = delete;
  DelayedScalingUpdate& operator=(const DelayedScalingUpdate&) = delete;
};

}  // namespace

#ifndef TE_WITH_XLA_FFI
void register_xla_ffi(py::module_& m) {
  m.def("ffi_targets", [](const std::string&) -> py::dict {
    throw NotImplementedErrorPy(
        "this te-core was built without jaxlib's XLA FFI headers, so te_jax cannot call it; "
        "install jaxlib, then rebuild te-core");
  });
}
#endif

}  // namespace te::python

PYBIND11_MODULE(_C, m) {
  using namespace te::python;
  m.doc() = "te-core's C API (thin pybind11 layer; see te/te.h)";
  m.attr("VERSION") = te_version();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const NotImplementedErrorPy& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    }
  });
  m.attr("BUILT_WITH_CUDA") = te_built_with_cuda() != 0;

  py::enum_<te_dtype>(m, "DType")
      .value("FLOAT32", TE_DTYPE_FLOAT32)
      .value("FLOAT16", TE_DTYPE_FLOAT16)
      .value("BFLOAT16", TE_DTYPE_BFLOAT16)
      .value("FLOAT8_E4M3", TE_DTYPE_FLOAT8_E4M3)
      .value("FLOAT8_E5M2", TE_DTYPE_FLOAT8_E5M2)
      .value("FLOAT4_E2M1", TE_DTYPE_FLOAT4_E2M1)
      .value("FLOAT8_E8M0", TE_DTYPE_FLOAT8_E8M0)
      .value("INT32", TE_DTYPE_INT32)
      .value("INT64", TE_DTYPE_INT64)
      .value("UINT8", TE_DTYPE_UINT8);
  py::enum_<te_scaling_mode>(m, "ScalingMode")
      .value("PER_TENSOR", TE_SCALING_PER_TENSOR)
      .value("BLOCK_1D", TE_SCALING_BLOCK_1D)
      .value("BLOCK_2D", TE_SCALING_BLOCK_2D)
      .value("MXFP8_1D", TE_SCALING_MXFP8_1D)
      .value("NVFP4_1D", TE_SCALING_NVFP4_1D);
  py::enum_<te_quantized_part>(m, "Part")
      .value("ROWWISE_DATA", TE_PART_ROWWISE_DATA)
      .value("ROWWISE_SCALE_INV", TE_PART_ROWWISE_SCALE_INV)
      .value("COLUMNWISE_DATA", TE_PART_COLUMNWISE_DATA)
      .value("COLUMNWISE_SCALE_INV", TE_PART_COLUMNWISE_SCALE_INV);
  py::enum_<te_device_type>(m, "DeviceType")
      .value("CPU", TE_DEVICE_CPU)
      .value("CUDA", TE_DEVICE_CUDA);
  py::enum_<te_amax_compute_algo>(m, "AmaxComputeAlgo")
      .value("MAX", TE_AMAX_COMPUTE_MAX)
      .value("MOST_RECENT", TE_AMAX_COMPUTE_MOST_RECENT);

  py::class_<te_tensor>(m, "Tensor", "te_tensor: a dense row-major buffer (not owned)")
      .def(py::init(&make_tensor), py::arg("ptr"), py::arg("dtype"), py::arg("shape"),
           py::arg("device_type") = 0, py::arg("device_index") = 0)
      .def_property(
          "ptr", [](const te_tensor& t) { return reinterpret_cast<uintptr_t>(t.data); },
          [](te_tensor& t, uintptr_t p) { t.data = reinterpret_cast<void*>(p); })
      .def_readwrite("dtype", &te_tensor::dtype)
      .def_property_readonly("shape", &shape_of)
      .def_property_readonly("device_type", [](const te_tensor& t) { return t.device.type; })
      .def_property_readonly("device_index", [](const te_tensor& t) { return t.device.index; });

  py::class_<te_quantized_tensor>(m, "QuantizedTensor",
                                  "te_quantized_tensor: row-wise/column-wise data and scales")
      .def(py::init([](int32_t mode, std::optional<te_tensor> rowwise_data,
                       std::optional<te_tensor> rowwise_scale_inv,
                       std::optional<te_tensor> columnwise_data,
                       std::optional<te_tensor> columnwise_scale_inv,
                       std::optional<te_tensor> amax, std::optional<te_tensor> scale, bool columnwise_rht) {
             te_quantized_tensor q = te_quantized_tensor_init(mode);
             q.rowwise_data = or_absent(rowwise_data);
             q.rowwise_scale_inv = or_absent(rowwise_scale_inv);
             q.columnwise_data = or_absent(columnwise_data);
             q.columnwise_scale_inv = or_absent(columnwise_scale_inv);
             q.amax = or_absent(amax);
             q.scale = or_absent(scale);
             q.columnwise_rht = columnwise_rht;
             return q;
           }),
           py::arg("scaling_mode"), py::arg("rowwise_data") = py::none(),
           py::arg("rowwise_scale_inv") = py::none(), py::arg("columnwise_data") = py::none(),
           py::arg("columnwise_scale_inv") = py::none(), py::arg("amax") = py::none(),
           py::arg("scale") = py::none(), py::arg("columnwise_rht") = false)
      .def_readwrite("struct_size", &te_quantized_tensor::struct_size)
      .def_readwrite("scaling_mode", &te_quantized_tensor::scaling_mode)
      .def_readwrite("rowwise_data", &te_quantized_tensor::rowwise_data)
      .def_readwrite("rowwise_scale_inv", &te_quantized_tensor::rowwise_scale_inv)
      .def_readwrite("columnwise_data", &te_quantized_tensor::columnwise_data)
      .def_readwrite("columnwise_scale_inv", &te_quantized_tensor::columnwise_scale_inv)
      .def_readwrite("amax", &te_quantized_tensor::amax)
      .def_readwrite("scale", &te_quantized_tensor::scale)
      .def_readwrite("columnwise_rht", &te_quantized_tensor::columnwise_rht);

  py::class_<te_quant_config>(m, "QuantConfig", "te_quant_config")
      .def(py::init([](bool compute_scale, bool use_existing_amax, bool force_pow2_scales,
                       float amax_epsilon, bool with_2d_quantization, bool stochastic_rounding,
                       uint64_t rng_seed, uint64_t rng_offset, std::optional<te_tensor> rng_state,
                       bool reset_amax) {
             te_quant_config c = te_quant_config_init();
             c.compute_scale = compute_scale;
             c.use_existing_amax = use_existing_amax;
             c.force_pow2_scales = force_pow2_scales;
             c.amax_epsilon = amax_epsilon;
             c.with_2d_quantization = with_2d_quantization;
             c.stochastic_rounding = stochastic_rounding;
             c.rng_seed = rng_seed;
             c.rng_offset = rng_offset;
             c.rng_state = or_absent(rng_state);
             c.reset_amax = reset_amax;
             return c;
           }),
           py::arg("compute_scale") = false, py::arg("use_existing_amax") = false,
           py::arg("force_pow2_scales") = false, py::arg("amax_epsilon") = 0.0f,
           py::arg("with_2d_quantization") = false, py::arg("stochastic_rounding") = false,
           py::arg("rng_seed") = 0, py::arg("rng_offset") = 0, py::arg("rng_state") = py::none(),
           py::arg("reset_amax") = false)
      .def_readwrite("struct_size", &te_quant_config::struct_size)
      .def_readwrite("compute_scale", &te_quant_config::compute_scale)
      .def_readwrite("use_existing_amax", &te_quant_config::use_existing_amax)
      .def_readwrite("force_pow2_scales", &te_quant_config::force_pow2_scales)
      .def_readwrite("amax_epsilon", &te_quant_config::amax_epsilon)
      .def_readwrite("with_2d_quantization", &te_quant_config::with_2d_quantization)
      .def_readwrite("stochastic_rounding", &te_quant_config::stochastic_rounding)
      .def_readwrite("rng_seed", &te_quant_config::rng_seed)
      .def_readwrite("rng_offset", &te_quant_config::rng_offset)
      .def_readwrite("rng_state", &te_quant_config::rng_state)
      .def_readwrite("reset_amax", &te_quant_config::reset_amax)
      // Picklable, so modules holding quantizers can be deep-copied. rng_state (a device buffer's
      // address) is not carried: a copy reads rng_seed / rng_offset until given its own.
      .def(py::pickle(
          [](const te_quant_config& c) {
            return py::make_tuple(static_cast<bool>(c.compute_scale),
                                  static_cast<bool>(c.use_existing_amax),
                                  static_cast<bool>(c.force_pow2_scales), c.amax_epsilon,
                                  static_cast<bool>(c.with_2d_quantization),
                                  static_cast<bool>(c.stochastic_rounding), c.rng_seed,
                                  c.rng_offset, static_cast<bool>(c.reset_amax));
          },
          [](const py::tuple& t) {
            if (t.size() != 9) throw py::value_error("QuantConfig state: expected 9 fields");
            te_quant_config c = te_quant_config_init();
            c.compute_scale = t[0].cast<bool>();
            c.use_existing_amax = t[1].cast<bool>();
            c.force_pow2_scales = t[2].cast<bool>();
            c.amax_epsilon = t[3].cast<float>();
            c.with_2d_quantization = t[4].cast<bool>();
            c.stochastic_rounding = t[5].cast<bool>();
            c.rng_seed = t[6].cast<uint64_t>();
            c.rng_offset = t[7].cast<uint64_t>();
            c.reset_amax = t[8].cast<bool>();
            return c;
          }));

  py::enum_<te_gemm_epilogue>(m, "Epilogue")
      .value("DEFAULT", TE_EPILOGUE_DEFAULT)
      .value("BIAS", TE_EPILOGUE_BIAS)
      .value("GELU_AUX", TE_EPILOGUE_GELU_AUX)
      .value("DGELU", TE_EPILOGUE_DGELU)
      .value("BGRAD", TE_EPILOGUE_BGRAD);

  py::class_<te_gemm_config>(m, "GemmConfig", "te_gemm_config: build once, reuse per call")
      .def(py::init([](bool trans_a, bool trans_b, float alpha, float beta, int32_t epilogue,
                       std::optional<te_tensor> bias, std::optional<te_tensor> aux,
                       std::optional<te_tensor> bias_grad, int32_t use_split_accumulator,
                       std::optional<te_tensor> workspace, std::optional<te_tensor> dgelu_product) {
             te_gemm_config c = te_gemm_config_init();
             c.trans_a = trans_a;
             c.trans_b = trans_b;
             c.alpha = alpha;
             c.beta = beta;
             c.epilogue = epilogue;
             c.bias = or_absent(bias);
             c.aux = or_absent(aux);
             c.bias_grad = or_absent(bias_grad);
             c.use_split_accumulator = use_split_accumulator;
             c.workspace = or_absent(workspace);
             c.dgelu_product = or_absent(dgelu_product);
             return c;
           }),
           py::arg("trans_a") = false, py::arg("trans_b") = false, py::arg("alpha") = 1.0f,
           py::arg("beta") = 0.0f, py::arg("epilogue") = 0, py::arg("bias") = py::none(),
           py::arg("aux") = py::none(), py::arg("bias_grad") = py::none(),
           py::arg("use_split_accumulator") = -1, py::arg("workspace") = py::none(),
           py::arg("dgelu_product") = py::none())
      .def_readwrite("trans_a", &te_gemm_config::trans_a)
      .def_readwrite("trans_b", &te_gemm_config::trans_b)
      .def_readwrite("alpha", &te_gemm_config::alpha)
      .def_readwrite("beta", &te_gemm_config::beta)
      .def_readwrite("epilogue", &te_gemm_config::epilogue)
      .def_readwrite("bias", &te_gemm_config::bias)
      .def_readwrite("aux", &te_gemm_config::aux)
      .def_readwrite("bias_grad", &te_gemm_config::bias_grad)
      .def_readwrite("use_split_accumulator", &te_gemm_config::use_split_accumulator)
      .def_readwrite("workspace", &te_gemm_config::workspace)
      .def_readwrite("dgelu_product", &te_gemm_config::dgelu_product);

  m.def(
      "amax",
      [](const te_tensor& input, te_tensor& amax, uintptr_t stream) {
        check(te_amax(&input, &amax, as_stream(stream)));
      },
      py::arg("input"), py::arg("amax"), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "quantize",
      [](const te_tensor& input, te_quantized_tensor& output,
         const std::optional<te_quant_config>& config, uintptr_t stream) {
        check(te_quantize(&input, &output, config ? &*config : nullptr, as_stream(stream)));
      },
      py::arg("input"), py::arg("output"), py::arg("config") = py::none(),
      py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>());
  m.def(
      "dequantize",
      [](const te_quantized_tensor& input, te_tensor& output, uintptr_t stream) {
        check(te_dequantize(&input, &output, as_stream(stream)));
      },
      py::arg("input"), py::arg("output"), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "transpose",
      [](const te_tensor& input, te_tensor& output, uintptr_t stream) {
        check(te_transpose(&input, &output, as_stream(stream)));
      },
      py::arg("input"), py::arg("output"), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "gemm",
      [](const te_quantized_tensor& a, const te_quantized_tensor& b, te_quantized_tensor& d,
         const std::optional<te_gemm_config>& config, uintptr_t stream) {
        check(te_gemm(&a, &b, &d, config ? &*config : nullptr, as_stream(stream)));
      },
      py::arg("a"), py::arg("b"), py::arg("d"), py::arg("config") = py::none(),
      py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>());
  m.def(
      "delayed_scaling_update",
      [](std::vector<te_tensor> amax_histories, std::vector<te_tensor> scales, float fp8_max,
         float margin, int32_t amax_compute_algo, uintptr_t stream) {
        if (amax_histories.size() != scales.size()) {
          throw py::value_error("scales: expected one per amax history (" +
                                std::to_string(amax_histories.size()) + "), got " +
                                std::to_string(scales.size()));
        }
        check(te_delayed_scaling_update(amax_histories.data(), scales.data(),
                                        static_cast<int64_t>(amax_histories.size()), fp8_max,
                                        margin, amax_compute_algo, as_stream(stream)));
      },
      py::arg("amax_histories"), py::arg("scales"), py::arg("fp8_max"), py::arg("margin") = 0.0f,
      py::arg("amax_compute_algo") = 0, py::arg("stream") = 0);
  using GroupArgs = std::tuple<std::vector<te_tensor>, std::vector<te_tensor>, float, float, int32_t>;
  py::class_<DelayedScalingUpdate>(
      m, "DelayedScalingUpdate",
      "te_delayed_scaling_update_groups of fixed groups: u = DelayedScalingUpdate([(amax_histories, "
      "scales, fp8_max, margin, amax_compute_algo), ...]), then u(stream) per step")
      .def(py::init([](std::vector<GroupArgs> groups) {
             DelayedScalingUpdate u;
             u.histories.reserve(groups.size());
             u.scales.reserve(groups.size());
             for (size_t g = 0; g < groups.size(); ++g) {
               auto& [h, s, fp8_max, margin, algo] = groups[g];
               if (h.size() != s.size()) {
                 throw py::value_error("groups[" + std::to_string(g) +
                                       "]: expected one scale per amax history (" +
                                       std::to_string(h.size()) + "), got " + std::to_string(s.size()));
               }
               u.histories.push_back(std::move(h));
               u.scales.push_back(std::move(s));
               u.groups.push_back({u.histories.back().data(), u.scales.back().data(),
                                   static_cast<int64_t>(u.histories.back().size()), fp8_max, margin,
                                   algo});
             }
             check(te_delayed_scaling_check_groups(u.groups.data(),
                                                   static_cast<int64_t>(u.groups.size())));
             return u;
           }),
           py::arg("groups"))
      .def(
          "__call__",
          [](const DelayedScalingUpdate& u, uintptr_t stream) {
            check(te_delayed_scaling_update_groups(u.groups.data(),
                                                   static_cast<int64_t>(u.groups.size()),
                                                   as_stream(stream)));
          },
          py::arg("stream") = 0);
  using NextArgs = std::tuple<std::vector<te_tensor>, std::vector<te_tensor>,
                              std::optional<std::vector<te_tensor>>, std::vector<te_tensor>,
                              std::vector<te_tensor>, float, float, int32_t>;
  m.def(
      "delayed_scaling_next",
      [](std::vector<NextArgs> groups, uintptr_t stream) {
        // Sizes are the C API's to check, except what a descriptor array cannot say: its length.
        std::vector<te_delayed_scaling_group> g(groups.size());
        std::vector<te_delayed_scaling_next> nx(groups.size());
        for (size_t i = 0; i < groups.size(); ++i) {
          auto& [h, s, a, nh, ns, fp8_max, margin, algo] = groups[i];
          const size_t n = h.size();
          if (s.size() != n || nh.size() != n || ns.size() != n || (a && a->size() != n)) {
            throw py::value_error("groups[" + std::to_string(i) + "]: expected " +
                                  std::to_string(n) + " scales, amaxes (or None), next "
                                  "histories and next scales, one per amax history");
          }
          g[i] = {h.data(), s.data(), static_cast<int64_t>(n), fp8_max, margin, algo};
          nx[i] = {a ? a->data() : nullptr, nh.data(), ns.data()};
        }
        check(te_delayed_scaling_next_groups(g.data(), nx.data(), static_cast<int64_t>(g.size()),
                                             as_stream(stream)));
      },
      py::arg("groups"), py::arg("stream") = 0,
      "te_delayed_scaling_next_groups: groups = [(amax_histories, scales, amaxes or None, "
      "next_amax_histories, next_scales, fp8_max, margin, amax_compute_algo), ...]");
  m.def(
      "quantized_shape",
      [](int32_t scaling_mode, int32_t part, const std::vector<int64_t>& shape) {
        if (shape.size() > TE_MAX_DIMS) {
          throw py::value_error("shape: expected at most " + std::to_string(TE_MAX_DIMS) +
                                " dims, got " + std::to_string(shape.size()));
        }
        int64_t out[TE_MAX_DIMS];
        int32_t ndim = 0;
        check(te_quantized_shape(scaling_mode, part, shape.data(),
                                 static_cast<int32_t>(shape.size()), out, &ndim));
        return py::tuple(py::cast(std::vector<int64_t>(out, out + ndim)));
      },
      py::arg("scaling_mode"), py::arg("part"), py::arg("shape"));
  py::enum_<te_activation>(m, "Activation")
      .value("GELU", TE_ACTIVATION_GELU)
      .value("RELU", TE_ACTIVATION_RELU)
      .value("SILU", TE_ACTIVATION_SILU)
      .value("QGELU", TE_ACTIVATION_QGELU)
      .value("SRELU", TE_ACTIVATION_SRELU)
      .value("GEGLU", TE_ACTIVATION_GEGLU)
      .value("REGLU", TE_ACTIVATION_REGLU)
      .value("SWIGLU", TE_ACTIVATION_SWIGLU)
      .value("QGEGLU", TE_ACTIVATION_QGEGLU)
      .value("SREGLU", TE_ACTIVATION_SREGLU)
      .value("GLU", TE_ACTIVATION_GLU)
      .value("CLAMPED_SWIGLU", TE_ACTIVATION_CLAMPED_SWIGLU);

  py::class_<te_activation_config>(m, "ActivationConfig", "te_activation_config")
      .def(py::init([](float limit, float alpha, float glu_linear_offset) {
             te_activation_config c = te_activation_config_init();
             c.limit = limit;
             c.alpha = alpha;
             c.glu_linear_offset = glu_linear_offset;
             return c;
           }),
           py::arg("limit") = 7.0f, py::arg("alpha") = 1.702f,
           py::arg("glu_linear_offset") = 1.0f)
      .def_readwrite("struct_size", &te_activation_config::struct_size)
      .def_readwrite("limit", &te_activation_config::limit)
      .def_readwrite("alpha", &te_activation_config::alpha)
      .def_readwrite("glu_linear_offset", &te_activation_config::glu_linear_offset);

  py::class_<te_norm_config>(m, "NormConfig", "te_norm_config")
      .def(py::init([](float eps, bool zero_centered_gamma) {
             te_norm_config c = te_norm_config_init();
             c.eps = eps;
             c.zero_centered_gamma = zero_centered_gamma;
             return c;
           }),
           py::arg("eps") = 1e-5f, py::arg("zero_centered_gamma") = false)
      .def_readwrite("struct_size", &te_norm_config::struct_size)
      .def_readwrite("eps", &te_norm_config::eps)
      .def_readwrite("zero_centered_gamma", &te_norm_config::zero_centered_gamma);

  m.def(
      "layernorm_fwd",
      [](const te_tensor& input, const te_tensor& gamma, const std::optional<te_tensor>& beta,
         te_quantized_tensor& output, std::optional<te_tensor> mu,
         std::optional<te_tensor> rsigma, const std::optional<te_norm_config>& config,
         const std::optional<te_quant_config>& quant_config, uintptr_t stream) {
        const te_tensor b = or_absent(beta);
        te_tensor mu_t = or_absent(mu), rsigma_t = or_absent(rsigma);
        check(te_layernorm_fwd(&input, &gamma, &b, &output, &mu_t, &rsigma_t,
                               config ? &*config : nullptr,
                               quant_config ? &*quant_config : nullptr, as_stream(stream)));
      },
      py::arg("input"), py::arg("gamma"), py::arg("beta"), py::arg("output"),
      py::arg("mu") = py::none(), py::arg("rsigma") = py::none(), py::arg("config") = py::none(),
      py::arg("quant_config") = py::none(), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "rmsnorm_fwd",
      [](const te_tensor& input, const te_tensor& gamma, te_quantized_tensor& output,
         std::optional<te_tensor> rsigma, const std::optional<te_norm_config>& config,
         const std::optional<te_quant_config>& quant_config, uintptr_t stream) {
        te_tensor rsigma_t = or_absent(rsigma);
        check(te_rmsnorm_fwd(&input, &gamma, &output, &rsigma_t, config ? &*config : nullptr,
                             quant_config ? &*quant_config : nullptr, as_stream(stream)));
      },
      py::arg("input"), py::arg("gamma"), py::arg("output"), py::arg("rsigma") = py::none(),
      py::arg("config") = py::none(), py::arg("quant_config") = py::none(),
      py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>());
  m.def(
      "layernorm_bwd",
      [](const te_tensor& dz, const te_tensor& x, const te_tensor& mu, const te_tensor& rsigma,
         const te_tensor& gamma, te_tensor& dx, te_tensor& dgamma, std::optional<te_tensor> dbeta,
         const std::optional<te_norm_config>& config, uintptr_t stream) {
        te_tensor dbeta_t = or_absent(dbeta);
        check(te_layernorm_bwd(&dz, &x, &mu, &rsigma, &gamma, &dx, &dgamma, &dbeta_t,
                               config ? &*config : nullptr, as_stream(stream)));
      },
      py::arg("dz"), py::arg("x"), py::arg("mu"), py::arg("rsigma"), py::arg("gamma"),
      py::arg("dx"), py::arg("dgamma"), py::arg("dbeta") = py::none(),
      py::arg("config") = py::none(), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "rmsnorm_bwd",
      [](const te_tensor& dz, const te_tensor& x, const te_tensor& rsigma, const te_tensor& gamma,
         te_tensor& dx, te_tensor& dgamma, const std::optional<te_norm_config>& config,
         uintptr_t stream) {
        check(te_rmsnorm_bwd(&dz, &x, &rsigma, &gamma, &dx, &dgamma,
                             config ? &*config : nullptr, as_stream(stream)));
      },
      py::arg("dz"), py::arg("x"), py::arg("rsigma"), py::arg("gamma"), py::arg("dx"),
      py::arg("dgamma"), py::arg("config") = py::none(), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "rmsnorm_bwd_add",
      [](const te_tensor& dz, const te_tensor& x, const te_tensor& add, const te_tensor& rsigma,
         const te_tensor& gamma, te_tensor& dx, te_tensor& dgamma,
         const std::optional<te_norm_config>& config, uintptr_t stream) {
        check(te_rmsnorm_bwd_add(&dz, &x, &add, &rsigma, &gamma, &dx, &dgamma,
                                 config ? &*config : nullptr, as_stream(stream)));
      },
      py::arg("dz"), py::arg("x"), py::arg("add"), py::arg("rsigma"), py::arg("gamma"),
      py::arg("dx"), py::arg("dgamma"), py::arg("config") = py::none(), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>());
  // With act_config these call the _v2 entry points (te_activation_config), else the 0.1.0 ones.
  m.def(
      "activation_fwd",
      [](const te_tensor& input, te_quantized_tensor& output, int32_t activation,
         const std::optional<te_quant_config>& config, uintptr_t stream,
         const std::optional<te_activation_config>& act_config) {
        const te_quant_config* c = config ? &*config : nullptr;
        void* s = as_stream(stream);
        check(act_config ? te_activation_fwd_v2(&input, &output, activation, &*act_config, c, s)
                         : te_activation_fwd(&input, &output, activation, c, s));
      },
      py::arg("input"), py::arg("output"), py::arg("activation"), py::arg("config") = py::none(),
      py::arg("stream") = 0, py::arg("act_config") = py::none(),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "activation_bwd",
      [](const te_tensor& grad, const te_tensor& input, te_quantized_tensor& dx,
         std::optional<te_tensor> dbias, int32_t activation,
         const std::optional<te_quant_config>& config, uintptr_t stream,
         const std::optional<te_activation_config>& act_config) {
        te_tensor dbias_t = or_absent(dbias);
        const te_quant_config* c = config ? &*config : nullptr;
        void* s = as_stream(stream);
        check(act_config ? te_activation_bwd_v2(&grad, &input, &dx, &dbias_t, activation,
                                                &*act_config, c, s)
                         : te_activation_bwd(&grad, &input, &dx, &dbias_t, activation, c, s));
      },
      py::arg("grad"), py::arg("input"), py::arg("dx"), py::arg("dbias") = py::none(),
      py::arg("activation") = 0, py::arg("config") = py::none(), py::arg("stream") = 0,
      py::arg("act_config") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def(
      "dbias_quantize",
      [](const te_tensor& input, te_quantized_tensor& output, te_tensor& dbias,
         const std::optional<te_quant_config>& config, uintptr_t stream) {
        check(te_dbias_quantize(&input, &output, &dbias, config ? &*config : nullptr,
                                as_stream(stream)));
      },
      py::arg("input"), py::arg("output"), py::arg("dbias"), py::arg("config") = py::none(),
      py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>());
  m.def(
      "quantize_flat",
      [](uintptr_t x_ptr, int32_t x_dtype, py::handle shape, int64_t device, int32_t scaling_mode,
         int32_t out_dtype, uintptr_t rd_ptr, uintptr_t rs_ptr, py::handle rs_shape,
         uintptr_t cd_ptr, py::handle cd_shape, uintptr_t cs_ptr, py::handle cs_shape,
         py::handle amax, py::handle scale, const te_quant_config* config, uintptr_t stream,
         bool columnwise_rht) {
        const te_device dev = device_of(device);
        te_tensor x{};
        x.data = reinterpret_cast<void*>(x_ptr);
        x.dtype = x_dtype;
        fill_shape(x, shape, "shape");
        x.device = dev;
        te_quantized_tensor q = te_quantized_tensor_init(scaling_mode);
        // Scales are fp32 but for MXFP8 (E8M0) and NVFP4 (E4M3); te validates the rest.
        const int32_t scale_dtype = scaling_mode == TE_SCALING_MXFP8_1D   ? TE_DTYPE_FLOAT8_E8M0
                                    : scaling_mode == TE_SCALING_NVFP4_1D ? TE_DTYPE_FLOAT8_E4M3
                                                                          : TE_DTYPE_FLOAT32;
        if (!rs_shape.is_none()) {  // the row-wise data has x's shape
          q.rowwise_data = x;
          q.rowwise_data.data = reinterpret_cast<void*>(rd_ptr);
          q.rowwise_data.dtype = out_dtype;
          q.rowwise_scale_inv = part(rs_ptr, scale_dtype, rs_shape, dev, "rs_shape");
        }
        q.columnwise_data = part(cd_ptr, out_dtype, cd_shape, dev, "cd_shape");
        q.columnwise_scale_inv = part(cs_ptr, scale_dtype, cs_shape, dev, "cs_shape");
        q.amax = spec(amax, "amax");
        q.scale = spec(scale, "scale");
        q.columnwise_rht = columnwise_rht;
        check(without_gil([&] { return te_quantize(&x, &q, config, as_stream(stream)); }));
      },
      py::arg("x_ptr"), py::arg("x_dtype"), py::arg("shape"), py::arg("device"),
      py::arg("scaling_mode"), py::arg("out_dtype"), py::arg("rd_ptr"), py::arg("rs_ptr"),
      py::arg("rs_shape").none(true), py::arg("cd_ptr"), py::arg("cd_shape").none(true),
      py::arg("cs_ptr"), py::arg("cs_shape").none(true), py::arg("amax").none(true),
      py::arg("scale").none(true), py::arg("config").none(true), py::arg("stream"),
      py::arg("columnwise_rht") = false,
      "te_quantize on plain ints: x (x_ptr, x_dtype, shape, device: -1 CPU, else the CUDA "
      "ordinal) into out_dtype row-wise data [x's shape] + scale_inv of rs_shape (absent if "
      "rs_shape is None) and column-wise data of cd_shape + scale_inv of cs_shape (absent "
      "if None), all on x's device; scale_inv is fp32, E8M0 for mxfp8_1d, E4M3 for nvfp4_1d. "
      "amax/scale: None, a Tensor or a (ptr, dtype, shape, device) tuple.");
  m.def(
      "dequantize_flat",
      [](int32_t scaling_mode, py::handle rowwise_data, py::handle rowwise_scale_inv,
         py::handle columnwise_data, py::handle columnwise_scale_inv, py::handle output,
         uintptr_t stream, py::handle amax, bool columnwise_rht) {
        te_quantized_tensor q = te_quantized_tensor_init(scaling_mode);
        q.rowwise_data = spec(rowwise_data, "rowwise_data");
        q.rowwise_scale_inv = spec(rowwise_scale_inv, "rowwise_scale_inv");
        q.columnwise_data = spec(columnwise_data, "columnwise_data");
        q.columnwise_scale_inv = spec(columnwise_scale_inv, "columnwise_scale_inv");
        q.amax = spec(amax, "amax");
        q.columnwise_rht = columnwise_rht;
        te_tensor out = spec(output, "output");
        check(without_gil([&] { return te_dequantize(&q, &out, as_stream(stream)); }));
      },
      py::arg("scaling_mode"), py::arg("rowwise_data").none(true),
      py::arg("rowwise_scale_inv").none(true), py::arg("columnwise_data").none(true),
      py::arg("columnwise_scale_inv").none(true), py::arg("output").none(true),
      py::arg("stream") = 0, py::arg("amax").none(true) = py::none(),
      py::arg("columnwise_rht") = false,
      "te_dequantize with each tensor given as None, a Tensor or a (ptr, dtype, shape, device) "
      "tuple (device -1: CPU); amax: nvfp4_1d's fp32 [2] global amaxes.");
  m.def(
      "gemm_flat",
      [](int32_t a_mode, py::handle a_rd, py::handle a_rs, py::handle a_cd, py::handle a_cs,
         int32_t b_mode, py::handle b_rd, py::handle b_rs, py::handle b_cd, py::handle b_cs,
         py::handle d, const te_gemm_config* config, py::handle bias, py::handle aux,
         py::handle bias_grad, uintptr_t stream, py::handle a_amax, py::handle b_amax,
         bool a_rht, bool b_rht, py::handle d_scale, py::handle d_amax, py::handle d_scale_inv) {
        te_quantized_tensor a = te_quantized_tensor_init(a_mode);
        a.rowwise_data = spec(a_rd, "a_rd");
        a.rowwise_scale_inv = spec(a_rs, "a_rs");
        a.columnwise_data = spec(a_cd, "a_cd");
        a.columnwise_scale_inv = spec(a_cs, "a_cs");
        a.amax = spec(a_amax, "a_amax");
        a.columnwise_rht = a_rht;
        te_quantized_tensor b = te_quantized_tensor_init(b_mode);
        b.rowwise_data = spec(b_rd, "b_rd");
        b.rowwise_scale_inv = spec(b_rs, "b_rs");
        b.columnwise_data = spec(b_cd, "b_cd");
        b.columnwise_scale_inv = spec(b_cs, "b_cs");
        b.amax = spec(b_amax, "b_amax");
        b.columnwise_rht = b_rht;
        te_quantized_tensor out = te_quantized_tensor_init(TE_SCALING_PER_TENSOR);
        out.rowwise_data = spec(d, "d");
        out.scale = spec(d_scale, "d_scale");
        out.amax = spec(d_amax, "d_amax");
        out.rowwise_scale_inv = spec(d_scale_inv, "d_scale_inv");
        te_gemm_config c = config ? *config : te_gemm_config_init();
        c.bias = spec(bias, "bias");
        c.aux = spec(aux, "aux");
        c.bias_grad = spec(bias_grad, "bias_grad");
        check(without_gil([&] { return te_gemm(&a, &b, &out, &c, as_stream(stream)); }));
      },
      py::arg("a_mode"), py::arg("a_rd").none(true), py::arg("a_rs").none(true),
      py::arg("a_cd").none(true), py::arg("a_cs").none(true), py::arg("b_mode"),
      py::arg("b_rd").none(true), py::arg("b_rs").none(true), py::arg("b_cd").none(true),
      py::arg("b_cs").none(true), py::arg("d").none(true), py::arg("config").none(true),
      py::arg("bias").none(true), py::arg("aux").none(true), py::arg("bias_grad").none(true),
      py::arg("stream") = 0, py::arg("a_amax").none(true) = py::none(),
      py::arg("b_amax").none(true) = py::none(), py::arg("a_rht") = false,
      py::arg("b_rht") = false, py::arg("d_scale").none(true) = py::none(),
      py::arg("d_amax").none(true) = py::none(), py::arg("d_scale_inv").none(true) = py::none(),
      "te_gemm with operands as parts (each None, a Tensor or a (ptr, dtype, shape, device) "
      "tuple, device -1: CPU). config: a GemmConfig whose scalar fields are used (its "
      "bias/aux/bias_grad are replaced by the arguments), or None for the defaults. "
      "a_amax/b_amax, a_rht/b_rht: nvfp4_1d operands' global amaxes and columnwise_rht. "
      "d_scale/d_amax/d_scale_inv: a per-tensor FP8 output's fp32 [1] scale (read), amax "
      "(updated: max(amax, max |result|) before the cast) and scale_inv (written: 1/scale).");
  m.def(
      "norm_fwd_flat",
      [](bool rms, py::handle x, py::handle gamma, py::handle beta, int32_t out_mode,
         py::handle rd, py::handle rs, py::handle cd, py::handle cs, py::handle amax,
         py::handle scale, py::handle mu, py::handle rsigma, const te_norm_config* config,
         const te_quant_config* quant_config, uintptr_t stream) {
        if (rms) {
          require_none(beta, "beta", "for RMSNorm (it has no bias)");
          require_none(mu, "mu", "for RMSNorm (it has no mean)");
        }
        const te_tensor xt = spec(x, "x"), g = spec(gamma, "gamma"), b = spec(beta, "beta");
        te_quantized_tensor out = quantized(out_mode, rd, rs, cd, cs, amax, scale);
        te_tensor mu_t = spec(mu, "mu"), rsigma_t = spec(rsigma, "rsigma");
        void* s = as_stream(stream);
        check(without_gil([&] {
          if (rms) return te_rmsnorm_fwd(&xt, &g, &out, &rsigma_t, config, quant_config, s);
          return te_layernorm_fwd(&xt, &g, &b, &out, &mu_t, &rsigma_t, config, quant_config, s);
        }));
      },
      py::arg("rms"), py::arg("x"), py::arg("gamma"), py::arg("beta").none(true),
      py::arg("out_mode"), py::arg("rd").none(true), py::arg("rs").none(true),
      py::arg("cd").none(true), py::arg("cs").none(true), py::arg("amax").none(true),
      py::arg("scale").none(true), py::arg("mu").none(true), py::arg("rsigma").none(true),
      py::arg("config").none(true) = py::none(),
      py::arg("quant_config").none(true) = py::none(), py::arg("stream") = 0,
      "te_layernorm_fwd (te_rmsnorm_fwd with rms) with every tensor a spec (None, a Tensor or a "
      "(ptr, dtype, shape, device) tuple, device -1: CPU) and the output given as its parts in "
      "out_mode.");
  m.def(
      "norm_bwd_flat",
      [](bool rms, py::handle dz, py::handle x, py::handle mu, py::handle rsigma,
         py::handle gamma, py::handle dx, py::handle dgamma, py::handle dbeta, py::handle add,
         const te_norm_config* config, uintptr_t stream) {
        if (rms) {
          require_none(mu, "mu", "for RMSNorm (it has no mean)");
          require_none(dbeta, "dbeta", "for RMSNorm (it has no bias)");
        } else {
          require_none(add, "add", "for LayerNorm (te_rmsnorm_bwd_add is RMSNorm's)");
        }
        const te_tensor dzt = spec(dz, "dz"), xt = spec(x, "x"), mu_t = spec(mu, "mu");
        const te_tensor rsigma_t = spec(rsigma, "rsigma"), g = spec(gamma, "gamma");
        const te_tensor add_t = spec(add, "add");
        te_tensor dx_t = spec(dx, "dx"), dg = spec(dgamma, "dgamma"), db = spec(dbeta, "dbeta");
        void* s = as_stream(stream);
        check(without_gil([&] {
          if (!rms) {
            return te_layernorm_bwd(&dzt, &xt, &mu_t, &rsigma_t, &g, &dx_t, &dg, &db, config, s);
          }
          if (add.is_none()) return te_rmsnorm_bwd(&dzt, &xt, &rsigma_t, &g, &dx_t, &dg, config, s);
          return te_rmsnorm_bwd_add(&dzt, &xt, &add_t, &rsigma_t, &g, &dx_t, &dg, config, s);
        }));
      },
      py::arg("rms"), py::arg("dz"), py::arg("x"), py::arg("mu").none(true), py::arg("rsigma"),
      py::arg("gamma"), py::arg("dx"), py::arg("dgamma"), py::arg("dbeta").none(true),
      py::arg("add").none(true), py::arg("config").none(true) = py::none(), py::arg("stream") = 0,
      "te_layernorm_bwd / te_rmsnorm_bwd (te_rmsnorm_bwd_add with add) with every tensor a "
      "spec (None, a Tensor or a (ptr, dtype, shape, device) tuple, device -1: CPU).");
  m.def(
      "activation_fwd_flat",
      [](py::handle x, int32_t activation, int32_t out_mode, py::handle rd, py::handle rs,
         py::handle cd, py::handle cs, py::handle amax, py::handle scale,
         const te_quant_config* config, uintptr_t stream, const te_activation_config* act) {
        const te_tensor xt = spec(x, "x");
        te_quantized_tensor out = quantized(out_mode, rd, rs, cd, cs, amax, scale);
        void* s = as_stream(stream);
        check(without_gil([&] {
          return act ? te_activation_fwd_v2(&xt, &out, activation, act, config, s)
                     : te_activation_fwd(&xt, &out, activation, config, s);
        }));
      },
      py::arg("x"), py::arg("activation"), py::arg("out_mode"), py::arg("rd").none(true),
      py::arg("rs").none(true), py::arg("cd").none(true), py::arg("cs").none(true),
      py::arg("amax").none(true), py::arg("scale").none(true),
      py::arg("config").none(true) = py::none(),
      py::arg("stream") = 0, py::arg("act_config").none(true) = py::none(),
      "te_activation_fwd (te_activation_fwd_v2 with act_config) with every tensor a spec and "
      "the output given as its parts in out_mode.");
  m.def(
      "activation_bwd_flat",
      [](py::handle grad, py::handle x, int32_t activation, int32_t dx_mode, py::handle rd,
         py::handle rs, py::handle cd, py::handle cs, py::handle amax, py::handle scale,
         py::handle dbias, const te_quant_config* config, uintptr_t stream,
         const te_activation_config* act) {
        const te_tensor gt = spec(grad, "grad"), xt = spec(x, "x");
        te_quantized_tensor dx = quantized(dx_mode, rd, rs, cd, cs, amax, scale);
        te_tensor db = spec(dbias, "dbias");
        void* s = as_stream(stream);
        check(without_gil([&] {
          return act ? te_activation_bwd_v2(&gt, &xt, &dx, &db, activation, act, config, s)
                     : te_activation_bwd(&gt, &xt, &dx, &db, activation, config, s);
        }));
      },
      py::arg("grad"), py::arg("x"), py::arg("activation"), py::arg("dx_mode"),
      py::arg("rd").none(true), py::arg("rs").none(true), py::arg("cd").none(true),
      py::arg("cs").none(true), py::arg("amax").none(true), py::arg("scale").none(true),
      py::arg("dbias").none(true), py::arg("config").none(true) = py::none(), py::arg("stream") = 0,
      py::arg("act_config").none(true) = py::none(),
      "te_activation_bwd (te_activation_bwd_v2 with act_config) with every tensor a spec and dx "
      "given as its parts in dx_mode.");
  m.def(
      "dbias_quantize_flat",
      [](py::handle x, int32_t mode, py::handle rd, py::handle rs, py::handle cd, py::handle cs,
         py::handle amax, py::handle scale, py::handle dbias, const te_quant_config* config,
         uintptr_t stream) {
        const te_tensor xt = spec(x, "x");
        te_quantized_tensor out = quantized(mode, rd, rs, cd, cs, amax, scale);
        te_tensor db = spec(dbias, "dbias");
        void* s = as_stream(stream);
        check(without_gil([&] { return te_dbias_quantize(&xt, &out, &db, config, s); }));
      },
      py::arg("x"), py::arg("mode"), py::arg("rd").none(true), py::arg("rs").none(true),
      py::arg("cd").none(true), py::arg("cs").none(true), py::arg("amax").none(true),
      py::arg("scale").none(true), py::arg("dbias"), py::arg("config").none(true) = py::none(),
      py::arg("stream") = 0,
      "te_dbias_quantize with every tensor a spec and the output given as its parts in mode.");
  m.def("last_error", &te_last_error);
  m.def(
      "forward_log_to_python",
      [] { te_set_log_handler(&forward_log, nullptr); },
      "Sends te-core's log messages (te/log.h) to Python's logging, logger 'te'.");
  m.def("cuda_device_count", [] {
    int32_t count = 0;
    check(te_cuda_device_count(&count));
    return count;
  });

  register_xla_ffi(m);
  register_linear_step(m);
  register_layernorm_linear_step(m);
  register_layernorm_mlp_step(m);
}
