"""Direct calls into te_core._C for the fused ops: norms, activations, dbias + quantize.

The companions of _kernels.py (same rules: eager code calls these directly, the torch.library
ops in _ops.py call them from their CPU/CUDA kernels; the C layer validates; every tensor goes
to the *_flat entry points as a (ptr, dtype, shape, device) tuple, no descriptor objects). Each op writes its
main output either in high precision or quantized exactly as te_quantize would quantize the fp32
result (te/normalization.h, te/activation.h), so a norm or activation hands the next GEMM its
FP8 operand (row-wise and column-wise copies) without another pass.

An output is described by a ``QuantSpec`` (None: high precision in ``out_dtype``); results come
back as (rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, ...), None
where absent (a high-precision output is its rowwise_data alone).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from te_core import _C

from te_torch._dtypes import TE_DTYPE, te_dtype
from te_torch._kernels import part_shapes, spec, stream_of

_PER_TENSOR = int(_C.ScalingMode.PER_TENSOR)
_empty = torch.empty


class QuantSpec(NamedTuple):
    """How a fused op quantizes its output: what a quantizer would do with the fp32 result.

    mode: te scaling mode; fp8_dtype: torch.float8_e4m3fn / float8_e5m2; rowwise / columnwise:
    which copies; config: the te_quant_config; amax / scale: fp32 [1] buffers (per-tensor only,
    else None) with their cached descriptors; compute_scale / pow2 / eps: the config's fields
    (what the registered ops take instead of a config object)."""

    mode: int
    fp8_dtype: torch.dtype
    rowwise: bool
    columnwise: bool
    config: _C.QuantConfig
    amax: torch.Tensor | None
    scale: torch.Tensor | None
    amax_desc: _C.Tensor | None
    scale_desc: _C.Tensor | None
    compute_scale: bool
    pow2: bool
    eps: float


@functools.lru_cache(maxsize=64)
def norm_config(eps: float, zero_centered_gamma: bool) -> _C.NormConfig:
    """A cached te_norm_config (never mutate the result)."""
    return _C.NormConfig(eps=eps, zero_centered_gamma=zero_centered_gamma)


@functools.lru_cache(maxsize=64)
def act_config(params: tuple[float, ...] | None) -> _C.ActivationConfig | None:
    """A cached te_activation_config of te_core._ops.activation_params' tuple (limit, alpha,
    glu_linear_offset); None for None (never mutate the result)."""
    return None if params is None else _C.ActivationConfig(*params)


def _contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.is_contiguous() else t.contiguous()


def _output(shape, device: torch.device, q: QuantSpec | None, out_dtype: torch.dtype):
    """Allocates a fused op's main output of source ``shape``: returns (parts, args), args the
    output's (mode, rd, rs, cd, cs, amax, scale) as the *_flat entry points take them."""
    if q is None:
        rd = _empty(shape, dtype=out_dtype, device=device)
        d_te = TE_DTYPE.get(out_dtype)
        if d_te is None:
            te_dtype(out_dtype, "out_dtype")  # raises TypeError
        return (rd, None, None, None), (_PER_TENSOR, spec(rd), None, None, None, None, None)
    rs_shape, cd_shape, cs_shape = part_shapes(torch.Size(shape), q.mode)
    rd = rs = cd = cs = None
    if q.rowwise:
        rd = _empty(shape, dtype=q.fp8_dtype, device=device)
        rs = _empty(rs_shape, dtype=torch.float32, device=device)
    if q.columnwise:
        cd = _empty(cd_shape, dtype=q.fp8_dtype, device=device)
        # Per-tensor copies share one scale_inv (as _kernels.quantize's share_scale_inv).
        if rs is not None and q.mode == _PER_TENSOR:
            cs = rs
        else:
            cs = _empty(cs_shape, dtype=torch.float32, device=device)
    amax = q.amax_desc if q.amax_desc is not None else spec(q.amax)
    scale = q.scale_desc if q.scale_desc is not None else spec(q.scale)
    return (rd, rs, cd, cs), (q.mode, spec(rd), spec(rs), spec(cd), spec(cs), amax, scale)


def norm_fwd(
    x: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor | None,
    rms: bool,
    eps: float,
    zero_centered_gamma: bool,
    q: QuantSpec | None,
    out_dtype: torch.dtype,
    stats: bool = True,
) -> tuple:
    """LayerNorm (``rms`` False) or RMSNorm over the last dim of x [..., H] (te/normalization.h).

    gamma, beta: [H] (beta None: no bias; RMSNorm takes none). Returns
    (rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, mu, rsigma): the
    output y [..., H] per ``q``/``out_dtype``, mu (LayerNorm; None for RMSNorm) and rsigma fp32
    [M], M = numel / H; both None without ``stats`` (inference: the kernel writes none)."""
    x, gamma, beta = _contiguous(x), _contiguous(gamma), _contiguous(beta)
    device = x.device
    parts, out = _output(x.shape, device, q, out_dtype)
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    rsigma = _empty((rows,), dtype=torch.float32, device=device) if stats else None
    mu = None if rms or not stats else _empty((rows,), dtype=torch.float32, device=device)
    _C.norm_fwd_flat(
        rms, spec(x), spec(gamma), spec(beta), *out, spec(mu), spec(rsigma),
        norm_config(eps, zero_centered_gamma), None if q is None else q.config, stream_of(x),
    )  # fmt: skip
    return (*parts, mu, rsigma)


def norm_bwd(
    dz: torch.Tensor,
    x: torch.Tensor,
    mu: torch.Tensor | None,
    rsigma: torch.Tensor,
    gamma: torch.Tensor,
    rms: bool,
    zero_centered_gamma: bool,
    with_dbeta: bool,
    add: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dx [..., H] in x's dtype, dgamma [H] and dbeta [H] (LayerNorm with ``with_dbeta``, else
    None) in gamma's dtype) from dz [..., H] and the forward's x, mu, rsigma, gamma.
    ``add`` (RMSNorm only): a [..., H] tensor added into dx in fp32 (te_rmsnorm_bwd_add)."""
    dz, x, gamma, add = _contiguous(dz), _contiguous(x), _contiguous(gamma), _contiguous(add)
    dx = _empty(x.shape, dtype=x.dtype, device=x.device)
    dgamma = _empty(gamma.shape, dtype=gamma.dtype, device=gamma.device)
    dbeta = None
    if with_dbeta and not rms:
        dbeta = _empty(gamma.shape, dtype=gamma.dtype, device=gamma.device)
    _C.norm_bwd_flat(
        rms, spec(dz), spec(x), spec(mu), spec(rsigma), spec(gamma), spec(dx), spec(dgamma),
        spec(dbeta), spec(add), norm_config(1e-5, zero_centered_gamma), stream_of(x),
    )  # fmt: skip
    # (the backward reads only zero_centered_gamma from the config)
    return dx, dgamma, dbeta


def activation_out_shape(shape: torch.Size, kind: int) -> torch.Size:
    """act(x)'s shape: gated kinds (te_activation >= 100) halve the last dim."""
    return shape if kind < 100 else torch.Size((*shape[:-1], shape[-1] // 2))


def activation_fwd(
    x: torch.Tensor, kind: int, q: QuantSpec | None, out_dtype: torch.dtype, params: tuple | None = None
) -> tuple:
    """act(x) (te_activation ``kind``): x [..., K] -> [..., K] (gated: [..., 2N] -> [..., N]).
    ``params``: a parameterized kind's (limit, alpha, glu_linear_offset), None for the defaults.
    Returns (rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv)."""
    x = _contiguous(x)
    parts, out = _output(activation_out_shape(x.shape, kind), x.device, q, out_dtype)
    _C.activation_fwd_flat(
        spec(x), kind, *out, None if q is None else q.config, stream_of(x), act_config(params)
    )
    return parts


def activation_bwd(
    grad: torch.Tensor,
    x: torch.Tensor,
    kind: int,
    q: QuantSpec | None,
    out_dtype: torch.dtype,
    dbias_dtype: torch.dtype | None,
    params: tuple | None = None,
) -> tuple:
    """dx = d act(x) . grad: grad [..., N], x the pre-activation [..., K]; dx [..., K] per
    ``q``/``out_dtype``; ``params`` as activation_fwd's. Returns (rowwise_data,
    rowwise_scale_inv, columnwise_data, columnwise_scale_inv, dbias): dbias [K] in
    ``dbias_dtype`` (the column sums of the fp32 dx, the gradient of a bias added before the
    activation), None when ``dbias_dtype`` is None."""
    grad, x = _contiguous(grad), _contiguous(x)
    parts, out = _output(x.shape, x.device, q, out_dtype)
    dbias = None if dbias_dtype is None else _empty((x.shape[-1],), dtype=dbias_dtype, device=x.device)
    _C.activation_bwd_flat(
        spec(grad), spec(x), kind, *out, spec(dbias), None if q is None else q.config, stream_of(x),
        act_config(params),
    )  # fmt: skip
    return (*parts, dbias)


def dbias_quantize(x: torch.Tensor, q: QuantSpec, dbias_dtype: torch.dtype) -> tuple:
    """x [..., K] quantized per ``q`` (FP8 only) and its column sums [K] (fp32 sums, rounded to
    ``dbias_dtype``) in one pass: (rowwise_data, rowwise_scale_inv, columnwise_data,
    columnwise_scale_inv, dbias)."""
    x = _contiguous(x)
    parts, out = _output(x.shape, x.device, q, x.dtype)
    dbias = _empty((x.shape[-1],), dtype=dbias_dtype, device=x.device)
    _C.dbias_quantize_flat(spec(x), *out, spec(dbias), q.config, stream_of(x))
    return (*parts, dbias)
