"""te's torch.library ops: what torch.compile / torch.export see.

Registered once, with ``torch.library.Library("te", "DEF")`` define + impl (CPU and CUDA kernels)
+ ``register_fake`` (shapes from te_core's op table). The kernels are _kernels' functions, the
same ones eager code calls directly: eager code does not go through the dispatcher
(DESIGN.md "The hot path"); only traced code calls ``torch.ops.te.*``.

Argument names avoid ``mode``: torch's auto_functionalized (mutable ops under torch.compile)
takes a ``mode`` argument of its own and fails on ops that have one.

Absent parts (a copy not requested) come back as empty [0] tensors, because an op returning
``Tensor?`` cannot be auto-functionalized; callers know statically which parts they asked for.
"""

from __future__ import annotations

import functools

import torch
from te_core import _C
from te_core._ops import ABSENT_SHAPE, fused_output, gemm_dims, gemm_outputs, quantize_outputs

from te_torch import _fused_kernels, _kernels
from te_torch._dtypes import TE_DTYPE

_lib = torch.library.Library("te", "DEF")  # noqa: TOR901 - one definition site per op

_lib.define(
    "quantize(Tensor x, Tensor(a!)? amax, Tensor(b!)? scale, int scaling_mode, ScalarType fp8_dtype, "
    "bool rowwise, bool columnwise, bool compute_scale, bool force_pow2_scales, "
    "float amax_epsilon) -> (Tensor, Tensor, Tensor, Tensor)"
)
_lib.define(
    "dequantize(Tensor? rowwise_data, Tensor? rowwise_scale_inv, Tensor? columnwise_data, "
    "Tensor? columnwise_scale_inv, int scaling_mode, SymInt[] shape, ScalarType dtype) -> Tensor"
)
_lib.define("transpose(Tensor x) -> Tensor")
# te_gemm (te/gemm.h) on two operands given as their parts (te_quantized_tensor's fields; a
# high-precision operand is its rowwise_data alone). Returns (d, aux, bias_grad): d is [M, N],
# or absent when written into ``out``; aux [M, N] for GELU_AUX; bias_grad [M] for BGRAD.
_lib.define(
    "gemm(Tensor? a_rowwise_data, Tensor? a_rowwise_scale_inv, Tensor? a_columnwise_data, "
    "Tensor? a_columnwise_scale_inv, int a_scaling_mode, Tensor? b_rowwise_data, "
    "Tensor? b_rowwise_scale_inv, Tensor? b_columnwise_data, Tensor? b_columnwise_scale_inv, "
    "int b_scaling_mode, bool trans_a, bool trans_b, Tensor(a!)? out, ScalarType out_dtype, "
    "bool accumulate, int epilogue, Tensor? bias, Tensor? gelu_input, int use_split_accumulator"
    ") -> (Tensor, Tensor, Tensor)"
)
# The fused ops (te/normalization.h, te/activation.h). Their main output is four tensors, the
# quantize op's (rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv):
# scaling_mode -1 is high precision in out_dtype (rowwise_data alone), otherwise FP8 of
# out_dtype, quantized as te.quantize would with the other arguments.
_QUANT_ARGS = (
    "int scaling_mode, ScalarType out_dtype, bool rowwise, bool columnwise, bool compute_scale, "
    "bool force_pow2_scales, float amax_epsilon"
)
_lib.define(
    "norm_fwd(Tensor x, Tensor gamma, Tensor? beta, Tensor(a!)? amax, Tensor(b!)? scale, "
    f"bool rms, float eps, bool zero_centered_gamma, {_QUANT_ARGS}) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"  # + mu (absent for RMSNorm), rsigma
)
_lib.define(
    "norm_bwd(Tensor dz, Tensor x, Tensor? mu, Tensor rsigma, Tensor gamma, Tensor? add, bool rms, "
    "bool zero_centered_gamma, bool with_dbeta) -> (Tensor, Tensor, Tensor)"  # dx, dgamma, dbeta
)
# act_params: a parameterized activation's (limit, alpha, glu_linear_offset); None: defaults.
_lib.define(
    "activation_fwd(Tensor x, Tensor(a!)? amax, Tensor(b!)? scale, int activation, "
    f"{_QUANT_ARGS}, float[]? act_params=None) -> (Tensor, Tensor, Tensor, Tensor)"
)
_lib.define(
    "activation_bwd(Tensor grad, Tensor x, Tensor(a!)? amax, Tensor(b!)? scale, int activation, "
    f"{_QUANT_ARGS}, ScalarType? dbias_dtype, float[]? act_params=None) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)
_lib.define(
    "dbias_quantize(Tensor x, Tensor(a!)? amax, Tensor(b!)? scale, "
    f"{_QUANT_ARGS}, ScalarType dbias_dtype) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)


@functools.lru_cache(maxsize=256)
def quant_config(compute_scale: bool, force_pow2_scales: bool, amax_epsilon: float) -> _C.QuantConfig:
    """A cached te_quant_config (configs are immutable once built; never mutate the result)."""
    return _C.QuantConfig(compute_scale, False, force_pow2_scales, amax_epsilon)


def _absent(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(ABSENT_SHAPE, dtype=dtype, device=device)


def _quantize_kernel(x, amax, scale, mode, fp8_dtype, rowwise, columnwise, compute_scale, pow2, eps):
    config = quant_config(compute_scale, pow2, eps)
    rd, rs, cd, cs = _kernels.quantize(x, amax, scale, mode, fp8_dtype, rowwise, columnwise, config)
    dev = x.device
    return (
        rd if rd is not None else _absent(fp8_dtype, dev),
        rs if rs is not None else _absent(torch.float32, dev),
        cd if cd is not None else _absent(fp8_dtype, dev),
        cs if cs is not None else _absent(torch.float32, dev),
    )


def _quantize_fake(x, amax, scale, mode, fp8_dtype, rowwise, columnwise, compute_scale, pow2, eps):
    # int() specializes symbolic sizes: block layouts are piecewise in the shape, and the op
    # table computes them from concrete shapes (te_quantized_shape).
    shape = tuple(int(d) for d in x.shape)
    specs = quantize_outputs(shape, mode, TE_DTYPE[fp8_dtype], rowwise, columnwise, False)
    dtypes = (fp8_dtype, torch.float32, fp8_dtype, torch.float32)
    return tuple(x.new_empty(s.shape, dtype=d) for s, d in zip(specs[:4], dtypes, strict=True))


def _dequantize_kernel(rd, rs, cd, cs, mode, shape, dtype):
    return _kernels.dequantize(rd, rs, cd, cs, mode, shape, dtype)


def _dequantize_fake(rd, rs, cd, cs, mode, shape, dtype):
    src = rd if rd is not None else cd
    return src.new_empty(shape, dtype=dtype)


def _transpose_fake(x):
    k = x.shape[-1] if x.dim() else 1
    m = x.numel() // k if x.dim() else 1
    return x.new_empty((k, m))


def _matrix_source(rowwise_data, columnwise_data):
    # The source shape of an operand: its row-wise copy's, or [M, K] from the [K, M] copy.
    if rowwise_data is not None:
        return tuple(rowwise_data.shape)
    return (columnwise_data.shape[1], columnwise_data.shape[0])


def _gemm_specs(ard, acd, brd, bcd, trans_a, trans_b, out_dtype, epilogue):
    m, n, _ = gemm_dims(_matrix_source(ard, acd), _matrix_source(brd, bcd), trans_a, trans_b)
    te_out = TE_DTYPE[out_dtype]
    return gemm_outputs(m, n, te_out, epilogue == _GELU_AUX, epilogue == _BGRAD, te_out)


_GELU_AUX = int(_C.Epilogue.GELU_AUX)
_BGRAD = int(_C.Epilogue.BGRAD)


def _gemm_kernel(
    ard, ars, acd, acs, a_mode, brd, brs, bcd, bcs, b_mode,
    trans_a, trans_b, out, out_dtype, accumulate, epilogue, bias, gelu_input, split,
):  # fmt: skip
    specs = _gemm_specs(ard, acd, brd, bcd, trans_a, trans_b, out_dtype, epilogue)
    d, aux, bias_grad = _kernels.gemm(
        (a_mode, ard, ars, acd, acs),
        (b_mode, brd, brs, bcd, bcs),
        trans_a,
        trans_b,
        out,
        specs[0].shape,
        out_dtype,
        accumulate,
        epilogue,
        bias,
        gelu_input,
        split,
    )
    dev = d.device
    return (
        _absent(out_dtype, dev) if out is not None else d,
        aux if aux is not None else _absent(out_dtype, dev),
        bias_grad if bias_grad is not None else _absent(out_dtype, dev),
    )


def _gemm_fake(
    ard, ars, acd, acs, a_mode, brd, brs, bcd, bcs, b_mode,
    trans_a, trans_b, out, out_dtype, accumulate, epilogue, bias, gelu_input, split,
):  # fmt: skip
    specs = _gemm_specs(ard, acd, brd, bcd, trans_a, trans_b, out_dtype, epilogue)
    src = ard if ard is not None else acd
    d, aux, bias_grad = (src.new_empty(s.shape, dtype=out_dtype) for s in specs)
    return (src.new_empty(ABSENT_SHAPE, dtype=out_dtype) if out is not None else d), aux, bias_grad


def _spec(amax, scale, mode, fp8_dtype, rowwise, columnwise, compute_scale, pow2, eps):
    if mode < 0:
        return None
    config = quant_config(compute_scale, pow2, eps)
    return _fused_kernels.QuantSpec(
        mode, fp8_dtype, rowwise, columnwise, config, amax, scale, None, None, compute_scale, pow2, eps
    )


def _op_parts(parts, out_dtype, device) -> tuple:
    """A fused output's parts as op results: absent ones empty, no two results aliased."""
    rd, rs, cd, cs = parts
    if cs is not None and cs is rs:
        cs = rs.clone()
    dtypes = (out_dtype, torch.float32, out_dtype, torch.float32)
    return tuple(
        p if p is not None else _absent(d, device) for p, d in zip((rd, rs, cd, cs), dtypes, strict=True)
    )


def _fake_parts(x, shape, mode, out_dtype, rowwise, columnwise) -> tuple:
    specs = fused_output(
        tuple(int(d) for d in shape), TE_DTYPE[out_dtype], None if mode < 0 else mode, rowwise, columnwise
    )
    dtypes = (out_dtype, torch.float32, out_dtype, torch.float32)
    return tuple(x.new_empty(s.shape, dtype=d) for s, d in zip(specs[:4], dtypes, strict=True))


def _rows(x) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def _norm_fwd_kernel(x, gamma, beta, amax, scale, rms, eps, zcg, mode, out_dtype, row, col, cs, pow2, qeps):
    q = _spec(amax, scale, mode, out_dtype, row, col, cs, pow2, qeps)
    *parts, mu, rsigma = _fused_kernels.norm_fwd(x, gamma, beta, rms, eps, zcg, q, out_dtype)
    mu = mu if mu is not None else _absent(torch.float32, x.device)
    return (*_op_parts(parts, out_dtype, x.device), mu, rsigma)


def _norm_fwd_fake(x, gamma, beta, amax, scale, rms, eps, zcg, mode, out_dtype, row, col, cs, pow2, qeps):
    m = _rows(x)
    mu = x.new_empty(ABSENT_SHAPE if rms else (m,), dtype=torch.float32)
    return (*_fake_parts(x, x.shape, mode, out_dtype, row, col), mu, x.new_empty((m,), dtype=torch.float32))


def _norm_bwd_kernel(dz, x, mu, rsigma, gamma, add, rms, zcg, with_dbeta):
    dx, dgamma, dbeta = _fused_kernels.norm_bwd(dz, x, mu, rsigma, gamma, rms, zcg, with_dbeta, add)
    return dx, dgamma, dbeta if dbeta is not None else _absent(gamma.dtype, gamma.device)


def _norm_bwd_fake(dz, x, mu, rsigma, gamma, add, rms, zcg, with_dbeta):
    dbeta_shape = gamma.shape if with_dbeta and not rms else ABSENT_SHAPE
    return x.new_empty(x.shape), gamma.new_empty(gamma.shape), gamma.new_empty(dbeta_shape)


def _act_params(p) -> tuple | None:
    return None if p is None else tuple(p)


def _act_fwd_kernel(x, amax, scale, kind, mode, out_dtype, row, col, cs, pow2, qeps, act_params=None):
    q = _spec(amax, scale, mode, out_dtype, row, col, cs, pow2, qeps)
    parts = _fused_kernels.activation_fwd(x, kind, q, out_dtype, _act_params(act_params))
    return _op_parts(parts, out_dtype, x.device)


def _act_fwd_fake(x, amax, scale, kind, mode, out_dtype, row, col, cs, pow2, qeps, act_params=None):
    shape = _fused_kernels.activation_out_shape(x.shape, kind)
    return _fake_parts(x, shape, mode, out_dtype, row, col)


def _act_bwd_kernel(
    grad, x, amax, scale, kind, mode, out_dtype, row, col, cs, pow2, qeps, dbias_dtype, act_params=None
):
    q = _spec(amax, scale, mode, out_dtype, row, col, cs, pow2, qeps)
    *parts, dbias = _fused_kernels.activation_bwd(
        grad, x, kind, q, out_dtype, dbias_dtype, _act_params(act_params)
    )
    dbias = dbias if dbias is not None else _absent(x.dtype, x.device)
    return (*_op_parts(parts, out_dtype, x.device), dbias)


def _act_bwd_fake(
    grad, x, amax, scale, kind, mode, out_dtype, row, col, cs, pow2, qeps, dbias_dtype, act_params=None
):
    dbias = x.new_empty(ABSENT_SHAPE if dbias_dtype is None else (x.shape[-1],), dtype=dbias_dtype or x.dtype)
    return (*_fake_parts(x, x.shape, mode, out_dtype, row, col), dbias)


def _dbias_quantize_kernel(x, amax, scale, mode, fp8_dtype, row, col, cs, pow2, qeps, dbias_dtype):
    q = _spec(amax, scale, mode, fp8_dtype, row, col, cs, pow2, qeps)
    *parts, dbias = _fused_kernels.dbias_quantize(x, q, dbias_dtype)
    return (*_op_parts(parts, fp8_dtype, x.device), dbias)


def _dbias_quantize_fake(x, amax, scale, mode, fp8_dtype, row, col, cs, pow2, qeps, dbias_dtype):
    return (
        *_fake_parts(x, x.shape, mode, fp8_dtype, row, col),
        x.new_empty((x.shape[-1],), dtype=dbias_dtype),
    )


_FUSED = {
    "norm_fwd": (_norm_fwd_kernel, _norm_fwd_fake),
    "norm_bwd": (_norm_bwd_kernel, _norm_bwd_fake),
    "activation_fwd": (_act_fwd_kernel, _act_fwd_fake),
    "activation_bwd": (_act_bwd_kernel, _act_bwd_fake),
    "dbias_quantize": (_dbias_quantize_kernel, _dbias_quantize_fake),
}

for _key in ("CPU", "CUDA"):
    _lib.impl("quantize", _quantize_kernel, _key)
    _lib.impl("dequantize", _dequantize_kernel, _key)
    _lib.impl("transpose", _kernels.transpose, _key)
    _lib.impl("gemm", _gemm_kernel, _key)
    for _name, (_kernel, _) in _FUSED.items():
        _lib.impl(_name, _kernel, _key)
torch.library.register_fake("te::quantize", _quantize_fake, lib=_lib)
torch.library.register_fake("te::dequantize", _dequantize_fake, lib=_lib)
torch.library.register_fake("te::transpose", _transpose_fake, lib=_lib)
torch.library.register_fake("te::gemm", _gemm_fake, lib=_lib)
for _name, (_, _fake) in _FUSED.items():
    torch.library.register_fake(f"te::{_name}", _fake, lib=_lib)
