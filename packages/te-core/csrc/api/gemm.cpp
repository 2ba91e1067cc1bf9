// te_gemm: validates operands, output and config against te/gemm.h, picks the copy of each FP8
// operand that gives the K-contiguous layout (A as [M, K], B as [N, K]), and hands the kernel of
// the tensors' device a flat GemmArgs.
//
// Decisions where te/gemm.h is silent (each is an error with a message, never a silent guess):
//   - an operand is high precision or FP8 by the dtype of its data; high-precision operands take
//     no scale_inv, their column-wise copy is ignored;
//   - MXFP8 / NVFP4 operands (by scaling mode) are read like FP8 ones, from the copy with K
//     contiguous, even though the emulated path could read either;
//   - beta must be 0 for an FP8 output (there is no high-precision D to read back);
//   - with an FP8 output, bias / bias_grad may be bf16 or fp32 ("the output's dtype" has no FP8
//     meaning here);
//   - epilogue tensors that the chosen epilogue does not use must be absent, as must the output's
//     column-wise copy (except with GELU_AUX or DGELU and an FP8 output) and, for a
//     high-precision output, its scale, amax and scale_inv.
#include "te/gemm.h"

#include <cmath>
#include <cstddef>
#include <string>

#include "api/quantize_mx.h"
#include "api/quantize_output.h"
#include "common/error.h"
#include "common/kernels.h"
#include "common/kernels_mx.h"
#include "common/layout.h"
#include "common/log.h"
#include "common/validate.h"
#include "te/activation.h"

namespace te {
namespace {


te_gemm_config read_config(const te_gemm_config* config) {
  te_gemm_config c = te_gemm_config_init();
  if (config == nullptr) return c;
  read_versioned(*config, offsetof(te_gemm_config, dgelu_product), "config", &c);
  TE_CHECK_ARG(c.trans_a == 0 || c.trans_a == 1, "config->trans_a: expected 0 or 1, got ",
               c.trans_a);
  TE_CHECK_ARG(c.trans_b == 0 || c.trans_b == 1, "config->trans_b: expected 0 or 1, got ",
               c.trans_b);
  TE_CHECK_ARG(std::isfinite(c.alpha), "config->alpha: expected a finite value, got ", c.alpha);
  TE_CHECK_ARG(std::isfinite(c.beta), "config->beta: expected a finite value, got ", c.beta);
  TE_CHECK_ARG(c.epilogue >= TE_EPILOGUE_DEFAULT && c.epilogue <= TE_EPILOGUE_BGRAD,
               "config->epilogue: expected a te_gemm_epilogue value 0..4, got ", c.epilogue);
  TE_CHECK_ARG(c.use_split_accumulator >= -1 && c.use_split_accumulator <= 1,
               "config->use_split_accumulator: expected -1 (default), 0 or 1, got ",
               c.use_split_accumulator);
  return c;
}

// One operand after validation: its source's matrix dims and the copy the kernel reads.
struct Operand {
  int64_t rows = 0, cols = 0;  // the source's matrix view (A: [M, K] or [K, M], ...)
  int32_t dtype = 0;
  bool fp8 = false;
  bool mx = false;   // MXFP8_1D / NVFP4_1D
  bool rht = false;  // the chosen copy carries NVFP4's Hadamard transform
  GemmOperand kernel{};
  const te_tensor* data = nullptr;  // the chosen copy
  std::string data_name;            // its name, for messages
};

// An MXFP8 / NVFP4 operand: like FP8, the copy with K contiguous (every backend dequantizes that
// copy, as Blackwell's native kernels would read it), its byte scales, and for NVFP4 the global
// amax entry of that copy.
Operand read_mx_operand(const te_quantized_tensor* q, const char* name, int32_t trans,
                        bool rowwise_wanted) {
  const std::string n(name);
  const int32_t mode = q->scaling_mode;
  const bool nvfp4 = mode == TE_SCALING_NVFP4_1D;
  const te_tensor& data = rowwise_wanted ? q->rowwise_data : q->columnwise_data;
  const te_tensor& scale_inv = rowwise_wanted ? q->rowwise_scale_inv : q->columnwise_scale_inv;
  Operand op;
  op.mx = true;
  op.data_name = n + (rowwise_wanted ? "->rowwise_data" : "->columnwise_data");
  const std::string scale_name =
      n + (rowwise_wanted ? "->rowwise_scale_inv" : "->columnwise_scale_inv");
  TE_CHECK_ARG(present(data), op.data_name, ": trans_", n, " = ", trans, " needs the ",
               rowwise_wanted ? "row-wise copy (quantize with rowwise usage)"
                              : "column-wise copy (quantize with columnwise usage)",
               ", got NULL");
  check_tensor(data, op.data_name);
  if (nvfp4) {
    check_dtype(data, op.data_name, {TE_DTYPE_FLOAT4_E2M1});
  } else {
    check_dtype(data, op.data_name, {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2});
  }
  if (rowwise_wanted) {
    matrix_dims(data, &op.rows, &op.cols);
  } else {
    TE_CHECK_ARG(data.ndim == 2, op.data_name,
                 ".shape: expected 2 dims (the [cols, rows] transposed copy), got ",
                 shape_string(data.shape, data.ndim));
    op.rows = data.shape[1];
    op.cols = data.shape[0];
  }
  // The chosen copy is stored with K contiguous: [M, K] for A, [N, K] for B.
  if (nvfp4) check_e2m1_rows(op.data_name, rowwise_wanted ? op.cols : op.rows, "K");
  const int64_t source[2] = {op.rows, op.cols};
  const int32_t part = rowwise_wanted ? TE_PART_ROWWISE_SCALE_INV : TE_PART_COLUMNWISE_SCALE_INV;
  check_tensor(scale_inv, scale_name);
  check_dtype(scale_inv, scale_name, {mx_scale_dtype(mode)});
  check_same_device(scale_inv, scale_name, data.device, op.data_name);
  check_shape(scale_inv, scale_name, quantized_shape(mode, part, source, 2),
              "the block-scale layout of te/tensor.h for this operand");
  op.dtype = data.dtype;
  op.data = &data;
  op.kernel.data = data.data;
  op.kernel.dtype = data.dtype;
  op.kernel.scaling_mode = mode;
  op.kernel.trans = n == "b";
  op.kernel.scale_inv = nullptr;
  op.kernel.scale_ld = scale_inv.shape[1];
  op.kernel.mx_scale_inv = static_cast<const uint8_t*>(scale_inv.data);
  if (nvfp4) {
    const std::string amax_name = n + "->amax";
    TE_CHECK_ARG(present(q->amax), amax_name,
                 ": nvfp4_1d needs the fp32 [2] global amaxes (row-wise, column-wise), got NULL");
    check_tensor(q->amax, amax_name);
    check_dtype(q->amax, amax_name, {TE_DTYPE_FLOAT32});
    check_numel(q->amax, amax_name, 2);
    check_same_device(q->amax, amax_name, data.device, op.data_name);
    op.kernel.global_amax = static_cast<const float*>(q->amax.data) + (rowwise_wanted ? 0 : 1);
    op.rht = !rowwise_wanted && columnwise_rht_of(*q) != 0;
  } else {
    TE_CHECK_ARG(!columnwise_rht_of(*q), n, "->columnwise_rht: only for nvfp4_1d, got 1");
  }
  return op;
}

// `name` is "a" or "b"; `trans` its config flag; `rowwise_wanted`: for FP8, whether this layout
// reads the row-wise copy (A: trans_a = 0, B: trans_b = 1).
Operand read_operand(const te_quantized_tensor* q, const char* name, int32_t trans,
                     bool rowwise_wanted) {
  const std::string n(name);
  const std::string tname = "trans_" + n;
  TE_CHECK_ARG(q != nullptr, n, ": expected a quantized tensor descriptor, got NULL");
  check_struct_size(q->struct_size, kQuantizedTensorV1Size, name);
  const int32_t mode = q->scaling_mode;
  TE_CHECK_ARG(mode >= TE_SCALING_PER_TENSOR && mode <= TE_SCALING_NVFP4_1D, n,
               "->scaling_mode: expected a te_scaling_mode value 0..4, got ", mode);
  if (is_mx_mode(mode)) return read_mx_operand(q, name, trans, rowwise_wanted);
  const bool has_row = present(q->rowwise_data);
  const bool has_col = present(q->columnwise_data);
  TE_CHECK_ARG(has_row || has_col, n,
               ": expected rowwise_data and/or columnwise_data, got neither");

  Operand op;
  // The dtype of whichever copy is there says what kind of operand this is.
  const te_tensor& probe = has_row ? q->rowwise_data : q->columnwise_data;
  const std::string probe_name = n + (has_row ? "->rowwise_data" : "->columnwise_data");
  check_tensor(probe, probe_name);
  check_dtype(probe, probe_name,
              {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT8_E4M3,
               TE_DTYPE_FLOAT8_E5M2});
  op.fp8 = is_fp8(probe.dtype);

  if (!op.fp8) {
    // High precision: the row-wise data alone, read in the layout trans says.
    op.data_name = n + "->rowwise_data";
    TE_CHECK_ARG(has_row, op.data_name, ": a high-precision (", dtype_name(probe.dtype),
                 ") operand is its row-wise data, got NULL");
    TE_CHECK_ARG(mode == TE_SCALING_PER_TENSOR, n, "->scaling_mode: expected per_tensor for a ",
                 dtype_name(probe.dtype), " operand (block modes hold FP8 data), got ",
                 scaling_mode_name(mode));
    TE_CHECK_ARG(!present(q->rowwise_scale_inv), n, "->rowwise_scale_inv: expected NULL for a ",
                 dtype_name(probe.dtype), " operand (high precision has no scale), got a buffer");
    matrix_dims(q->rowwise_data, &op.rows, &op.cols);
    op.dtype = q->rowwise_data.dtype;
    op.data = &q->rowwise_data;
    op.kernel.data = q->rowwise_data.data;
    op.kernel.dtype = op.dtype;
    op.kernel.scaling_mode = TE_SCALING_PER_TENSOR;
    op.kernel.trans = trans != 0;
    op.kernel.scale_inv = nullptr;
    op.kernel.scale_ld = 0;
    return op;
  }

  // FP8: K must be contiguous, so the layout decides the copy.
  const te_tensor& data = rowwise_wanted ? q->rowwise_data : q->columnwise_data;
  const te_tensor& scale_inv = rowwise_wanted ? q->rowwise_scale_inv : q->columnwise_scale_inv;
  op.data_name = n + (rowwise_wanted ? "->rowwise_data" : "->columnwise_data");
  const std::string scale_name =
      n + (rowwise_wanted ? "->rowwise_scale_inv" : "->columnwise_scale_inv");
  TE_CHECK_ARG(present(data), op.data_name, ": ", tname, " = ", trans, " needs the ",
               rowwise_wanted ? "row-wise copy (quantize with rowwise usage)"
                              : "column-wise copy (quantize with columnwise usage)",
               ", got NULL");
  check_tensor(data, op.data_name);
  check_dtype(data, op.data_name, {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2});
  // The source's matrix view: the row-wise copy has its shape, the column-wise copy is [K, M].
  if (has_row) {
    matrix_dims(q->rowwise_data, &op.rows, &op.cols);
  } else {
    TE_CHECK_ARG(data.ndim == 2, op.data_name,
                 ".shape: expected 2 dims (the [cols, rows] transposed copy), got ",
                 shape_string(data.shape, data.ndim));
    op.rows = data.shape[1];
    op.cols = data.shape[0];
  }
  const int64_t source[2] = {op.rows, op.cols};
  if (!rowwise_wanted && has_row) {
    check_shape(data, op.data_name, {op.cols, op.rows},
                "[K, M]: the transposed copy of the row-wise data's matrix");
  }
  check_tensor(scale_inv, scale_name);
  check_dtype(scale_inv, scale_name, {TE_DTYPE_FLOAT32});
  check_same_device(scale_inv, scale_name, data.device, op.data_name);
  if (mode == TE_SCALING_PER_TENSOR) {
    check_numel(scale_inv, scale_name, 1);
  } else {
    const int32_t part = rowwise_wanted ? TE_PART_ROWWISE_SCALE_INV : TE_PART_COLUMNWISE_SCALE_INV;
    check_shape(scale_inv, scale_name, quantized_shape(mode, part, source, 2),
                "the block-scale layout of te/tensor.h for this operand");
  }
  op.dtype = data.dtype;
  op.data = &data;
  op.kernel.data = data.data;
  op.kernel.dtype = data.dtype;
  op.kernel.scaling_mode = mode;
  // A's chosen copy is [M, K] (not transposed); B's is [N, K] (transposed).
  op.kernel.trans = n == "b";
  op.kernel.scale_inv = static_cast<const float*>(scale_inv.data);
  op.kernel.scale_ld = mode == TE_SCALING_PER_TENSOR ? 0 : scale_inv.shape[1];
  return op;
}

void check_pair(const Operand& a, const Operand& b, int32_t a_mode, int32_t b_mode) {
  if (a.mx || b.mx) {
    TE_CHECK_ARG(a_mode == b_mode, "b->scaling_mode: expected ", scaling_mode_name(a_mode),
                 " like a's (te_gemm does not mix MXFP8 or NVFP4 operands with other scaling "
                 "modes: both operands are mxfp8_1d, or both nvfp4_1d), got ",
                 scaling_mode_name(b_mode));
    TE_CHECK_ARG(!(a.dtype == TE_DTYPE_FLOAT8_E5M2 && b.dtype == TE_DTYPE_FLOAT8_E5M2),
                 b.data_name, ".dtype: expected float8_e4m3 when a is float8_e5m2 (E5M2 x E5M2 "
                 "is not a supported MXFP8 GEMM), got float8_e5m2");
    TE_CHECK_ARG(a.rht == b.rht, a.rht ? "b" : "a",
                 ": the other operand's column-wise copy carries the Hadamard transform "
                 "(columnwise_rht) and this one's ", a.rht ? b.data_name : a.data_name,
                 " does not; the transforms cancel in the product only when both operands of "
                 "the contraction carry them (quantize both column-wise copies with it, or "
                 "neither)");
    return;
  }
  if (!a.fp8 || !b.fp8) {
    TE_CHECK_ARG(a.fp8 == b.fp8, b.data_name, ".dtype: expected ",
                 a.fp8 ? "an FP8 dtype like a's " : "a high-precision dtype like a's ",
                 dtype_name(a.dtype),
                 " (te_gemm does not mix high-precision and FP8 operands), got ",
                 dtype_name(b.dtype));
    TE_CHECK_ARG(a.dtype == b.dtype, b.data_name, ".dtype: expected a's ", dtype_name(a.dtype),
                 " (high-precision operands share one dtype), got ", dtype_name(b.dtype));
    return;
  }
  TE_CHECK_ARG(!(a.dtype == TE_DTYPE_FLOAT8_E5M2 && b.dtype == TE_DTYPE_FLOAT8_E5M2),
               b.data_name, ".dtype: expected float8_e4m3 when a is float8_e5m2 (E5M2 x E5M2 is "
               "not a supported FP8 GEMM; E4M3 x E4M3, E4M3 x E5M2 and E5M2 x E4M3 are), got "
               "float8_e5m2");
  const bool a_block = a_mode != TE_SCALING_PER_TENSOR;
  const bool b_block = b_mode != TE_SCALING_PER_TENSOR;
  TE_CHECK_ARG(a_block == b_block, "b->scaling_mode: expected ",
               a_block ? "a block mode like a's " : "per_tensor like a's ",
               scaling_mode_name(a_mode),
               " (both FP8 operands are per-tensor or both block-scaled), got ",
               scaling_mode_name(b_mode));
  TE_CHECK_ARG(!(a_mode == TE_SCALING_BLOCK_2D && b_mode == TE_SCALING_BLOCK_2D),
               "b->scaling_mode: a GEMM may have at most one block_2d (128x128) operand, got "
               "block_2d for both a and b (quantize one of them, usually the activation or "
               "gradient, with 1x128 blocks)");
}

// An fp32 [1] buffer on `device`.
void check_scalar(const te_tensor& t, const std::string& name, const te_device& device,
                  const std::string& device_name) {
  check_tensor(t, name);
  check_dtype(t, name, {TE_DTYPE_FLOAT32});
  check_numel(t, name, 1);
  check_same_device(t, name, device, device_name);
}

// bias / bias_grad: `side_dtype` (the output's, or bf16 for an FP8 output) or fp32.
void check_side_dtype(const te_tensor& t, const std::string& name, int32_t side_dtype) {
  if (side_dtype == TE_DTYPE_FLOAT32) {
    check_dtype(t, name, {TE_DTYPE_FLOAT32});
  } else {
    check_dtype(t, name, {side_dtype, TE_DTYPE_FLOAT32});
  }
}

// A [M, N]-like matrix (any shape whose matrix view is [m, n]).
void check_matrix(const te_tensor& t, const std::string& name, int64_t m, int64_t n,
                  const char* what) {
  int64_t rows, cols;
  matrix_dims(t, &rows, &cols);
  TE_CHECK_ARG(t.ndim >= 1 && rows == m && cols == n, name, ".shape: expected [", m, ", ", n,
               "] (", what, ", or any shape with last dim ", n, " and ", m, " rows), got ",
               shape_string(t.shape, t.ndim));
}

// GELU_AUX or DGELU with an FP8 output (te/gemm.h): `args` as validated (operands, aux, bias,
// bias_grad, dgelu_product), d's copies planned exactly as te_activation_fwd / _bwd plan their
// output (delayed scaling: d->scale read, d->amax max-accumulated); the backend runs the GEMM and
// the activation pass, or one kernel that does both. aux, d's copies, bias_grad and dgelu_product are read or
// written in between: none may overlap another or the operands.
void gemm_act_fp8(GemmArgs args, const te_gemm_config& cfg, te_quantized_tensor* d_desc,
                  const Operand& a, const Operand& b, const te_device& device,
                  const std::string& device_name, void* stream) {
  const bool dgelu = cfg.epilogue == TE_EPILOGUE_DGELU;
  struct Named {
    const te_tensor* t;
    const char* name;
  };
  Named written[4] = {{&d_desc->rowwise_data, "d->rowwise_data"},
                      {&d_desc->columnwise_data, "d->columnwise_data"},
                      {&cfg.bias_grad, "config->bias_grad"},
                      {&cfg.dgelu_product, "config->dgelu_product"}};
  if (present(d_desc->columnwise_data)) check_tensor(d_desc->columnwise_data, "d->columnwise_data");
  for (int i = 0; i < 4; ++i) {
    if (!present(*written[i].t)) continue;
    if (i > 0) {  // d->rowwise_data against the operands: gemm() checked that
      check_no_overlap(*a.data, a.data_name, *written[i].t, written[i].name);
      check_no_overlap(*b.data, b.data_name, *written[i].t, written[i].name);
    }
    check_no_overlap(cfg.aux, "config->aux", *written[i].t, written[i].name);
    for (int j = 0; j < i; ++j) {
      if (present(*written[j].t)) {
        check_no_overlap(*written[j].t, written[j].name, *written[i].t, written[i].name);
      }
    }
  }
  if (!dgelu) {  // GELU_AUX writes aux
    check_no_overlap(*a.data, a.data_name, cfg.aux, "config->aux");
    check_no_overlap(*b.data, b.data_name, cfg.aux, "config->aux");
  }
  te_tensor result = d_desc->rowwise_data;  // the activation's [M, N] on the operands' device
  result.data = cfg.aux.data;
  result.dtype = cfg.aux.dtype;
  const FusedOutput out = plan_fused_output(result, d_desc, nullptr, "d", "config");
  args.d_dtype = cfg.aux.dtype;
  args.aux = nullptr;
  args.bias_grad = nullptr;
  // What te_activation_fwd / _bwd read: gelu of aux, [M, N].
  auto gelu_of_aux = [&](auto& act) {
    act.activation = TE_ACTIVATION_GELU;
    act.input = cfg.aux.data;
    act.in_dtype = cfg.aux.dtype;
    act.rows = args.m;
    act.cols = args.n;
    act.in_cols = args.n;
  };
  if (dgelu) {
    // The product is te_activation_bwd's grad, rounded to aux's dtype; the backend holds it.
    ActivationBwdArgs act{};
    gelu_of_aux(act);
    act.grad = nullptr;
    act.grad_dtype = cfg.aux.dtype;
    act.dx = out;
    act.dbias = present(cfg.bias_grad) ? cfg.bias_grad.data : nullptr;
    act.dbias_dtype = cfg.bias_grad.dtype;
    args.d = present(cfg.dgelu_product) ? cfg.dgelu_product.data : nullptr;
    args.epilogue = TE_EPILOGUE_DEFAULT;
    dispatch(device, device_name, [&] { cpu::gemm_dgelu(args, act, stream); },
             [&] { cuda::gemm_dgelu(args, act, stream); });
    return;
  }
  ActivationFwdArgs act{};
  gelu_of_aux(act);
  act.out = out;
  args.d = cfg.aux.data;
  args.epilogue = present(cfg.bias) ? TE_EPILOGUE_BIAS : TE_EPILOGUE_DEFAULT;
  dispatch(device, device_name, [&] { cpu::gemm_gelu(args, act, stream); },
           [&] { cuda::gemm_gelu(args, act, stream); });
}

void gemm(const te_quantized_tensor* a_desc, const te_quantized_tensor* b_desc,
          te_quantized_tensor* d_desc, const te_gemm_config* config, void* stream) {
  const te_gemm_config cfg = read_config(config);
  const Operand a = read_operand(a_desc, "a", cfg.trans_a, cfg.trans_a == 0);
  const Operand b = read_operand(b_desc, "b", cfg.trans_b, cfg.trans_b == 1);
  check_pair(a, b, a_desc->scaling_mode, b_desc->scaling_mode);
  // Everything runs on the device of A's data.
  const te_device device = a.data->device;
  const std::string device_name = a.data_name;
  check_same_device(*b.data, b.data_name, device, device_name);

  // Shapes: op(A) [M, K], op(B) [K, N].
  const int64_t m = cfg.trans_a ? a.cols : a.rows;
  const int64_t k = cfg.trans_a ? a.rows : a.cols;
  const int64_t kb = cfg.trans_b ? b.cols : b.rows;
  const int64_t n = cfg.trans_b ? b.rows : b.cols;
  TE_CHECK_ARG(kb == k, "b: expected K = ", k, " (op(A) is [M, K] = [", m, ", ", k,
               "] with trans_a = ", cfg.trans_a, "), got K = ", kb, " (b's source is [", b.rows,
               ", ", b.cols, "], read as ", cfg.trans_b ? "[N, K]" : "[K, N]", " with trans_b = ",
               cfg.trans_b, ")");

  // The output.
  TE_CHECK_ARG(d_desc != nullptr, "d: expected a quantized tensor descriptor, got NULL");
  check_struct_size(d_desc->struct_size, kQuantizedTensorV1Size, "d");
  const te_tensor& d = d_desc->rowwise_data;
  TE_CHECK_ARG(d_desc->scaling_mode == TE_SCALING_PER_TENSOR,
               "d->scaling_mode: expected per_tensor (te_gemm writes a high-precision or a "
               "per-tensor FP8 output), got ", scaling_mode_name(d_desc->scaling_mode));
  TE_CHECK_ARG(present(d), "d->rowwise_data: expected the [", m, ", ", n, "] output, got NULL");
  check_tensor(d, "d->rowwise_data");
  check_dtype(d, "d->rowwise_data",
              {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT8_E4M3,
               TE_DTYPE_FLOAT8_E5M2});
  check_same_device(d, "d->rowwise_data", device, device_name);
  check_matrix(d, "d->rowwise_data", m, n, "[M, N]");
  // D is written while A and B are read (cuBLASLt does not support D aliasing an operand).
  check_no_overlap(*a.data, a.data_name, d, "d->rowwise_data");
  check_no_overlap(*b.data, b.data_name, d, "d->rowwise_data");
  const bool d_fp8 = is_fp8(d.dtype);
  const int32_t ep = cfg.epilogue;
  // An MLP's activation fused with FC1's GEMM (GELU_AUX) or FC2's dgrad (DGELU), quantized for
  // the next GEMMs (te/gemm.h): the GEMM, then te_activation_fwd / _bwd into d's copies.
  const bool act_fp8 = d_fp8 && (ep == TE_EPILOGUE_GELU_AUX || ep == TE_EPILOGUE_DGELU);
  TE_CHECK_ARG(!present(d_desc->columnwise_data) || act_fp8,
               "d->columnwise_data: expected NULL (te_gemm writes a column-wise copy only with "
               "epilogue GELU_AUX or DGELU and an FP8 output), got a buffer");
  GemmArgs args{};
  if (d_fp8) {
    TE_CHECK_ARG(a_desc->scaling_mode == TE_SCALING_PER_TENSOR, "d->rowwise_data.dtype: "
                 "expected float32, float16 or bfloat16 with block-scaled operands (a is ",
                 scaling_mode_name(a_desc->scaling_mode), "), got ", dtype_name(d.dtype));
    TE_CHECK_ARG(cfg.beta == 0.0f, "config->beta: expected 0 with an FP8 output (",
                 dtype_name(d.dtype), " cannot be accumulated into), got ", cfg.beta);
  }
  if (d_fp8 && !act_fp8) {  // act_fp8's output is te_activation_fwd / _bwd's: planned as there
    TE_CHECK_ARG(present(d_desc->scale), "d->scale: an FP8 output (", dtype_name(d.dtype),
                 ") needs the fp32 [1] scale to quantize with, got NULL");
    check_scalar(d_desc->scale, "d->scale", device, device_name);
    if (present(d_desc->amax)) check_scalar(d_desc->amax, "d->amax", device, device_name);
    if (present(d_desc->rowwise_scale_inv)) {
      check_scalar(d_desc->rowwise_scale_inv, "d->rowwise_scale_inv", device, device_name);
    }
    args.d_scale = static_cast<const float*>(d_desc->scale.data);
    args.d_amax = static_cast<float*>(d_desc->amax.data);
    args.d_scale_inv = static_cast<float*>(d_desc->rowwise_scale_inv.data);
  } else if (!d_fp8) {
    const char* parts[] = {"scale", "amax", "rowwise_scale_inv"};
    const te_tensor* tensors[] = {&d_desc->scale, &d_desc->amax, &d_desc->rowwise_scale_inv};
    for (int i = 0; i < 3; ++i) {
      TE_CHECK_ARG(!present(*tensors[i]), "d->", parts[i], ": expected NULL for a ",
                   dtype_name(d.dtype), " output (only an FP8 output has one), got a buffer");
    }
  }

  // Epilogue tensors.
  const bool wants_bias = ep == TE_EPILOGUE_BIAS || ep == TE_EPILOGUE_GELU_AUX;
  const bool wants_aux = ep == TE_EPILOGUE_GELU_AUX || ep == TE_EPILOGUE_DGELU;
  const bool wants_bgrad = ep == TE_EPILOGUE_BGRAD;
  if (present(cfg.aux)) {
    TE_CHECK_ARG(wants_aux, "config->aux: expected NULL with epilogue ", epilogue_name(ep),
                 " (aux is written by GELU_AUX and read by DGELU), got a buffer");
  } else {
    TE_CHECK_ARG(!wants_aux, "config->aux: epilogue ", epilogue_name(ep), " needs the [", m, ", ",
                 n, "] aux (", ep == TE_EPILOGUE_GELU_AUX ? "written" : "read",
                 ": the pre-activation), got NULL");
  }
  if (wants_aux) {
    check_tensor(cfg.aux, "config->aux");
    if (act_fp8) {
      check_dtype(cfg.aux, "config->aux",
                  {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16});
    } else {
      check_dtype(cfg.aux, "config->aux", {d.dtype});
    }
    check_same_device(cfg.aux, "config->aux", device, device_name);
    check_matrix(cfg.aux, "config->aux", m, n, "[M, N], like the output");
  }
  // bias / bias_grad: this dtype or fp32. An FP8 output has no dtype of its own for them: the
  // pre-activation's with GELU_AUX (the GEMM's own output), else bf16.
  const int32_t side_dtype =
      act_fp8 ? cfg.aux.dtype : (d_fp8 ? TE_DTYPE_BFLOAT16 : d.dtype);
  if (present(cfg.bias)) {
    TE_CHECK_ARG(wants_bias, "config->bias: expected NULL with epilogue ", epilogue_name(ep),
                 " (bias is read by BIAS and GELU_AUX), got a buffer");
    check_tensor(cfg.bias, "config->bias");
    check_side_dtype(cfg.bias, "config->bias", side_dtype);
    check_same_device(cfg.bias, "config->bias", device, device_name);
    check_shape(cfg.bias, "config->bias", {n}, "[N]: one per output column");
  } else {
    TE_CHECK_ARG(ep != TE_EPILOGUE_BIAS, "config->bias: epilogue BIAS needs the [", n,
                 "] bias, got NULL");
  }
  // DGELU with an FP8 output: te_activation_bwd's dbias in bias_grad, optional.
  const bool dgelu_fp8 = act_fp8 && ep == TE_EPILOGUE_DGELU;
  if (present(cfg.bias_grad)) {
    TE_CHECK_ARG(wants_bgrad || dgelu_fp8, "config->bias_grad: expected NULL with epilogue ",
                 epilogue_name(ep), d_fp8 ? " and an FP8 output" : "",
                 " (bias_grad is written by BGRAD, and by DGELU with an FP8 output), got a buffer");
    check_tensor(cfg.bias_grad, "config->bias_grad");
    if (dgelu_fp8) {
      check_dtype(cfg.bias_grad, "config->bias_grad",
                  {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16});
    } else {
      check_side_dtype(cfg.bias_grad, "config->bias_grad", side_dtype);
    }
    check_same_device(cfg.bias_grad, "config->bias_grad", device, device_name);
    if (dgelu_fp8) {
      check_shape(cfg.bias_grad, "config->bias_grad", {n},
                  "[N]: the pre-activation's bias gradient, one per column");
    } else {
      check_shape(cfg.bias_grad, "config->bias_grad", {m}, "[M]: one per row of op(A)");
    }
  } else {
    TE_CHECK_ARG(!wants_bgrad, "config->bias_grad: epilogue BGRAD needs the [", m,
                 "] bias_grad, got NULL");
  }
  if (present(cfg.dgelu_product)) {
    TE_CHECK_ARG(dgelu_fp8, "config->dgelu_product: expected NULL except with epilogue DGELU "
                 "and an FP8 output (it holds the product between the GEMM and the activation "
                 "pass), got a buffer");
    check_tensor(cfg.dgelu_product, "config->dgelu_product");
    check_dtype(cfg.dgelu_product, "config->dgelu_product", {cfg.aux.dtype});
    check_same_device(cfg.dgelu_product, "config->dgelu_product", device, device_name);
    check_matrix(cfg.dgelu_product, "config->dgelu_product", m, n, "[M, N], like the output");
  }
  if (present(cfg.workspace)) {
    check_tensor(cfg.workspace, "config->workspace");
    check_dtype(cfg.workspace, "config->workspace", {TE_DTYPE_UINT8});
    TE_CHECK_ARG(cfg.workspace.ndim == 1, "config->workspace.shape: expected 1 dim (bytes), got ",
                 shape_string(cfg.workspace.shape, cfg.workspace.ndim));
    check_same_device(cfg.workspace, "config->workspace", device, device_name);
  }

  args.m = m;
  args.n = n;
  args.k = k;
  args.a = a.kernel;
  args.b = b.kernel;
  args.alpha = cfg.alpha;
  args.beta = cfg.beta;
  args.d = d.data;
  args.d_dtype = d.dtype;
  args.epilogue = ep;
  args.bias = present(cfg.bias) ? cfg.bias.data : nullptr;
  args.bias_dtype = cfg.bias.dtype;
  args.aux = wants_aux ? cfg.aux.data : nullptr;
  args.aux_dtype = cfg.aux.dtype;
  args.bias_grad = wants_bgrad ? cfg.bias_grad.data : nullptr;
  args.bias_grad_dtype = cfg.bias_grad.dtype;
  args.split_accumulator = cfg.use_split_accumulator != 0;
  args.workspace = present(cfg.workspace) ? cfg.workspace.data : nullptr;
  args.workspace_bytes = present(cfg.workspace) ? cfg.workspace.shape[0] : 0;
  if (act_fp8) {
    gemm_act_fp8(args, cfg, d_desc, a, b, device, device_name, stream);
    return;
  }
  if (a.mx) {
    const std::string mode = scaling_mode_name(a.kernel.scaling_mode);
    dispatch(device, device_name,
             [&] {
               log_info_once(concat("gemm-mx-cpu ", mode), [&] {
                 return concat("te_gemm: ", mode, " operands on the CPU run by block "
                               "dequantization to BF16 and an fp32-accumulated product (the "
                               "reference numerics; not fast). Logged once.");
               });
               cpu::gemm(args, stream);
             },
             [&] { cuda::gemm_mx(args, stream); });
  } else {
    dispatch(device, device_name, [&] { cpu::gemm(args, stream); },
             [&] { cuda::gemm(args, stream); });
  }
}

}  // namespace
}  // namespace te

extern "C" te_status te_gemm(const te_quantized_tensor* a, const te_quantized_tensor* b,
                             te_quantized_tensor* d, const te_gemm_config* config, void* stream) {
  return te::guard("te_gemm", [&] { te::gemm(a, b, d, config, stream); });
}
