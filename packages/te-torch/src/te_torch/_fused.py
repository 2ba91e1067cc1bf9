"""The fused ops on torch tensors and te quantizers: what te's modules call.

Each function takes an optional quantizer for its main output: None gives a high-precision
tensor; a quantizer gives the quantized tensor that quantizer would make of the fp32 result
(its usage flags pick the copies), written by the fused kernel in the same pass. Eager calls go
straight into te_core._C (_fused_kernels); traced calls (torch.compile) go through the
registered ``torch.ops.te.*`` ops, whose results are the same.

Nothing here is differentiable by itself: the modules' autograd Functions call these from their
forward and backward.

MXFP8 / NVFP4 quantizers (``quantizer._fusable`` False): te's fused kernels write only per-tensor
and block FP8 (te-core rejects an MXFP8/NVFP4 output of a fused op), so the kernel writes its
fp32 result and te_quantize quantizes that: the same values a fused kernel would quantize ("fp32
op, then quantize"), for one more pass over the tensor. A bias gradient beside such a
quantization is the fp32 column sums of the unquantized input, summed by torch.
"""

from __future__ import annotations

import torch

from te_torch import _fused_kernels
from te_torch._quantized_tensor import QuantizedTensor, is_eager
from te_torch._quantizers import Quantizer

_F32 = torch.float32


def _unfused(q: Quantizer | None, x: torch.Tensor) -> bool:
    """Whether ``q`` quantizes outside the fused kernel (MXFP8 / NVFP4; eager only)."""
    if q is None or q._fusable:
        return False
    q._source(x)  # raises NotImplementedError under tracing, naming the quantizer
    return True


def _column_sums(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).float().sum(0).to(dtype)


def _op_args(q: Quantizer | None, out_dtype: torch.dtype) -> tuple:
    """(amax, scale, scaling_mode, out_dtype, rowwise, columnwise, compute_scale, pow2, eps)."""
    if q is None:
        return None, None, -1, out_dtype, False, False, False, False, 0.0
    if getattr(q, "use_existing_amax", False):
        raise NotImplementedError("Float8CurrentScalingQuantizer: use_existing_amax is eager-only for now")
    s = q._fused_spec(eager=False)
    return s.amax, s.scale, s.mode, s.fp8_dtype, s.rowwise, s.columnwise, s.compute_scale, s.pow2, s.eps


def _present(parts, q: Quantizer | None) -> tuple:
    """An op's four output parts with the ones not asked for as None."""
    rd, rs, cd, cs = parts
    if q is None:
        return rd, None, None, None
    row, col = q.rowwise_usage, q.columnwise_usage
    return (rd if row else None, rs if row else None, cd if col else None, cs if col else None)


def _result(parts, q: Quantizer | None, shape: torch.Size, dtype: torch.dtype):
    return parts[0] if q is None else q._wrap(*parts, shape, dtype)


def norm_fwd(
    x: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor | None,
    rms: bool,
    eps: float,
    zero_centered_gamma: bool,
    quantizer: Quantizer | None = None,
    stats: bool = True,
) -> tuple[torch.Tensor | QuantizedTensor, torch.Tensor | None, torch.Tensor]:
    """(y, mu, rsigma): LayerNorm (RMSNorm if ``rms``) of x [..., H] over its last dim.

    y [..., H] has x's dtype, or is ``quantizer``'s quantized tensor of it; mu (None for
    RMSNorm) and rsigma are fp32 [M], M = numel / H, what norm_bwd needs. ``stats`` False
    (inference): eager calls skip mu and rsigma (None), traced ones may return them."""
    if _unfused(quantizer, x):
        y32, _, _, _, mu, rsigma = _fused_kernels.norm_fwd(
            x, gamma, beta, rms, eps, zero_centered_gamma, None, _F32
        )
        return quantizer._quantize(y32, x.dtype), mu, rsigma
    if is_eager(x):
        spec = None if quantizer is None else quantizer._fused_spec()
        rd, rs, cd, cs, mu, rsigma = _fused_kernels.norm_fwd(
            x, gamma, beta, rms, eps, zero_centered_gamma, spec, x.dtype, stats
        )
        parts = (rd, rs, cd, cs)
    else:
        a = _op_args(quantizer, x.dtype)
        rd, rs, cd, cs, mu, rsigma = torch.ops.te.norm_fwd(
            x, gamma, beta, a[0], a[1], rms, eps, zero_centered_gamma, *a[2:]
        )
        parts = _present((rd, rs, cd, cs), quantizer)
        mu = None if rms else mu
    return _result(parts, quantizer, x.shape, x.dtype), mu, rsigma


def norm_bwd(
    dz: torch.Tensor,
    x: torch.Tensor,
    mu: torch.Tensor | None,
    rsigma: torch.Tensor,
    gamma: torch.Tensor,
    rms: bool,
    zero_centered_gamma: bool,
    with_dbeta: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dx, dgamma, dbeta) of norm_fwd: dx [..., H] in x's dtype, dgamma / dbeta [H] in gamma's
    dtype (dbeta None for RMSNorm or without ``with_dbeta``)."""
    if is_eager(x) and is_eager(dz):
        return _fused_kernels.norm_bwd(dz, x, mu, rsigma, gamma, rms, zero_centered_gamma, with_dbeta)
    dx, dgamma, dbeta = torch.ops.te.norm_bwd(
        dz, x, mu, rsigma, gamma, None, rms, zero_centered_gamma, with_dbeta
    )
    return dx, dgamma, (dbeta if with_dbeta and not rms else None)


def activation_fwd(
    x: torch.Tensor, kind: int, quantizer: Quantizer | None = None, params: tuple | None = None
):
    """act(x) for te_activation ``kind``: x [..., K] -> [..., K] ([..., 2N] -> [..., N] for
    gated kinds), x's dtype or ``quantizer``'s quantized tensor. ``params``: a parameterized
    kind's (limit, alpha, glu_linear_offset) (te_core._ops.activation_params), None: defaults."""
    if _unfused(quantizer, x):
        y32 = _fused_kernels.activation_fwd(x, kind, None, _F32, params)[0]
        return quantizer._quantize(y32, x.dtype)
    shape = _fused_kernels.activation_out_shape(x.shape, kind)
    if is_eager(x):
        spec = None if quantizer is None else quantizer._fused_spec()
        parts = _fused_kernels.activation_fwd(x, kind, spec, x.dtype, params)
    else:
        a = _op_args(quantizer, x.dtype)
        parts = _present(torch.ops.te.activation_fwd(x, a[0], a[1], kind, *a[2:], params), quantizer)
    return _result(parts, quantizer, shape, x.dtype)


def activation_bwd(
    grad: torch.Tensor,
    x: torch.Tensor,
    kind: int,
    quantizer: Quantizer | None = None,
    dbias_dtype: torch.dtype | None = None,
    params: tuple | None = None,
):
    """(dx, dbias): the gradient through act at the pre-activation x [..., K] of grad (act's
    output shape). dx [..., K] has x's dtype or is ``quantizer``'s quantized tensor; dbias [K]
    (``dbias_dtype``; None without) is the column sums of the fp32 dx. ``params`` as
    activation_fwd's."""
    if _unfused(quantizer, x):
        dx32, _, _, _, dbias = _fused_kernels.activation_bwd(grad, x, kind, None, _F32, dbias_dtype, params)
        return quantizer._quantize(dx32, x.dtype), dbias
    if is_eager(x) and is_eager(grad):
        spec = None if quantizer is None else quantizer._fused_spec()
        *parts, dbias = _fused_kernels.activation_bwd(grad, x, kind, spec, x.dtype, dbias_dtype, params)
    else:
        a = _op_args(quantizer, x.dtype)
        *parts, dbias = torch.ops.te.activation_bwd(grad, x, a[0], a[1], kind, *a[2:], dbias_dtype, params)
        parts = _present(parts, quantizer)
        dbias = dbias if dbias_dtype is not None else None
    return _result(parts, quantizer, x.shape, x.dtype), dbias


def dbias_quantize_operand(x: torch.Tensor, quantizer: Quantizer, dbias_dtype: torch.dtype):
    """dbias_quantize with the quantized x as te_gemm's operand tuple (Quantizer._operand)."""
    if _unfused(quantizer, x):
        return quantizer._operand(x), _column_sums(x, dbias_dtype)
    if is_eager(x):
        *parts, dbias = _fused_kernels.dbias_quantize(x, quantizer._fused_spec(), dbias_dtype)
    else:
        a = _op_args(quantizer, x.dtype)
        *parts, dbias = torch.ops.te.dbias_quantize(x, a[0], a[1], *a[2:], dbias_dtype)
    return quantizer._parts_operand(*parts), dbias


def dbias_quantize(x: torch.Tensor, quantizer: Quantizer, dbias_dtype: torch.dtype):
    """(``quantizer``'s quantized x, the column sums of x [K] in ``dbias_dtype``) in one pass:
    a gradient's cast(-transpose) fused with its bias gradient."""
    if _unfused(quantizer, x):
        return quantizer._quantize(x), _column_sums(x, dbias_dtype)
    if is_eager(x):
        *parts, dbias = _fused_kernels.dbias_quantize(x, quantizer._fused_spec(), dbias_dtype)
    else:
        a = _op_args(quantizer, x.dtype)
        *parts, dbias = torch.ops.te.dbias_quantize(x, a[0], a[1], *a[2:], dbias_dtype)
        parts = _present(parts, quantizer)
    return quantizer._wrap(*parts, x.shape, x.dtype), dbias
