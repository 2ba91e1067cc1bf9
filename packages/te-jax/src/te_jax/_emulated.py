"""MXFP8 and NVFP4 emulated in JAX (NUMERICS.md): each operand copy is quantized exactly as the
formats define and dequantized to fp32, and the GEMMs run in fp32 on the dequantized values.

te-core has no MXFP8/NVFP4 kernels yet, and Hopper has no native GEMM for either, so on every
device te_jax runs the formats' numerics this way: correct, not fast (a log line says so once).

Both copies are quantized from the high-precision source: the row-wise one with blocks along the
last dim of the [M, K] view, the column-wise one with blocks along the first (for MXFP8 the
column-wise copy is not the transpose of the row-wise one). "2d" weights use square tiles, so
both copies are equal. Edge blocks use only their valid elements.
NVFP4 choices NUMERICS.md leaves open, stated here: the random Hadamard transform multiplies each
run of 16 elements (a row vector v along the reduction dim) as ``v @ ((1/4) diag(s) H16)``,
computed as the butterfly in _rht (its fp32 rounding order is part of the contract); an
element whose block scale is 0 in E4M3 quantizes to 0; stochastic rounding draws one uniform
[0, 1) per element from the caller's jax.random key.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np

from te_jax import _sharding

_F32 = jnp.float32
_FLT_MAX = float(np.finfo(np.float32).max)
_FP8_MAX = {np.dtype(jnp.float8_e4m3fn): 448.0, np.dtype(jnp.float8_e5m2): 57344.0}
MX_BLOCK = 32
NVFP4_BLOCK = 16
E2M1_MAX = 6.0
_RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)
_log = logging.getLogger("te_jax")
_announced: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Emulated:
    """An emulated operand: its row-wise and column-wise copies (None when not made), each
    quantized and dequantized to fp32, source-shaped [M, K]."""

    rowwise: jax.Array | None
    columnwise: jax.Array | None


jax.tree_util.register_dataclass(Emulated, data_fields=["rowwise", "columnwise"], meta_fields=[])


def _announce(kind: str) -> None:
    if kind not in _announced:
        _announced.add(kind)
        _log.warning(
            "te_jax: %s runs emulated (quantize-dequantize, fp32 GEMMs): correct numerics, not "
            "FP8/FP4 speed; te-core has no native %s kernels yet",
            kind.upper(),
            kind.upper(),
        )


def _blocks(x, rows: int, cols: int):
    """x [M, K] zero-padded to whole blocks, viewed [M/rows, rows, K/cols, cols]."""
    m, k = x.shape
    pm, pk = -m % rows, -k % cols
    xp = jnp.pad(x, ((0, pm), (0, pk)))
    return xp.reshape((m + pm) // rows, rows, (k + pk) // cols, cols)


def _unblock(b, shape):
    m, k = shape
    return b.reshape(b.shape[0] * b.shape[1], b.shape[2] * b.shape[3])[:m, :k]


def _block_amax(b):
    return jnp.max(jnp.abs(b), axis=(1, 3), keepdims=True)


def _e8m0_scale_inv(amax, fp8_max: float):
    """MX scale: E8M0 of amax / fp8_max rounded up, as the fp32 value 2^(e - 127)."""
    bits = jax.lax.bitcast_convert_type(amax / _F32(fp8_max), jnp.uint32)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).astype(jnp.uint32)
    e = jnp.minimum(e, jnp.uint32(0xFE))
    # 2^(e - 127) built from its bits: a normal for e >= 1, the subnormal 2^-127 for e == 0
    value = jax.lax.bitcast_convert_type(jnp.where(e == 0, jnp.uint32(0x00400000), e << 23), _F32)
    return jnp.where(jnp.isnan(amax), jnp.float32(jnp.nan), value)


def _mxfp8(x, dtype, square: bool):
    """MXFP8 quantize-dequantize of x [M, K] along its rows (1x32), or 32x32 tiles."""
    fp8_max = _FP8_MAX[np.dtype(dtype)]
    b = _blocks(x, MX_BLOCK if square else 1, MX_BLOCK)
    sinv = _e8m0_scale_inv(_block_amax(b), fp8_max)
    q = jnp.clip(b / sinv, -fp8_max, fp8_max).astype(dtype)
    return _unblock(q.astype(_F32) * sinv, x.shape)


def _e2m1_spacing(a):
    """The E2M1 grid spacing at |v| = a (0 <= a <= 6): 0.5 below 2, 1 below 4, else 2."""
    return jnp.where(a < 2.0, _F32(0.5), jnp.where(a < 4.0, _F32(1.0), _F32(2.0)))


def _e2m1_rne(v):
    """|v| <= 6 to the nearest E2M1 value, ties to the even mantissa: within each binade the
    grid is a multiple of its spacing, and an even multiple has an even mantissa, so rounding
    v / spacing half-to-even (jnp.round) is E2M1's RNE."""
    a = jnp.abs(v)
    step = _e2m1_spacing(a)
    return jnp.sign(v) * jnp.minimum(jnp.round(a / step) * step, _F32(E2M1_MAX))


def _e2m1_stochastic(v, u):
    """|v| <= 6 to one of its two E2M1 neighbours, up with probability (|v| - lo) / spacing."""
    a = jnp.abs(v)
    step = _e2m1_spacing(a)
    lo = jnp.floor(a / step) * step
    up = u < (a - lo) / step
    return jnp.sign(v) * jnp.minimum(jnp.where(up, lo + step, lo), _F32(E2M1_MAX))


def _rht(x):
    """Each run of 16 along the last dim of x [M, K] (K % 16 == 0), as a row vector v, to
    v @ ((1/4) diag(s) H16): signs first, then H16 by the fast Walsh-Hadamard butterfly in fp32
    (four stages of a + b, a - b: a fixed rounding order), then the exact 1/4."""
    m, k = x.shape
    v = x.reshape(m, k // NVFP4_BLOCK, NVFP4_BLOCK) * jnp.asarray(_RHT_SIGNS)
    h = 1
    while h < NVFP4_BLOCK:
        v = v.reshape(m, k // NVFP4_BLOCK, NVFP4_BLOCK // (2 * h), 2, h)
        a, b = v[..., 0, :], v[..., 1, :]
        v = jnp.stack([a + b, a - b], axis=-2)
        h *= 2
    return (v.reshape(m, k) * _F32(0.25)).astype(_F32)


def _nvfp4(x, square: bool, global_amax, u=None):
    """NVFP4 quantize-dequantize of x [M, K] along its rows (1x16) or 16x16 tiles, given the
    tensor's global amax (fp32 scalar); ``u``: uniforms for stochastic rounding."""
    s_enc = _F32(448.0 * E2M1_MAX) / jnp.where(global_amax > 0, global_amax, 1.0)
    s_enc = jnp.where(jnp.isinf(s_enc), _F32(_FLT_MAX), s_enc)
    s_enc = jnp.where(global_amax > 0, s_enc, _F32(1.0))
    b = _blocks(x, NVFP4_BLOCK if square else 1, NVFP4_BLOCK)
    s_block = jnp.clip(_block_amax(b) / _F32(E2M1_MAX) * s_enc, -448.0, 448.0)
    s_block = s_block.astype(jnp.float8_e4m3fn).astype(_F32)
    v = jnp.clip(b * s_enc / jnp.where(s_block > 0, s_block, 1.0), -E2M1_MAX, E2M1_MAX)
    if u is None:
        q = _e2m1_rne(v)
    else:
        q = _e2m1_stochastic(v, _blocks(u, NVFP4_BLOCK if square else 1, NVFP4_BLOCK))
    q = jnp.where(s_block > 0, q, 0.0)
    return _unblock(q * s_block * (_F32(1.0) / s_enc), x.shape)


def _copy(x, q, reduce_axes, rng, along_rows: bool):
    """One copy of x [M, K]: blocks along its last dim (row-wise) or first (column-wise)."""
    src = x.astype(_F32)
    if not along_rows:
        src = src.T
    square = q.scaling_mode == "2d"
    if q.kind == "mxfp8":
        out = _mxfp8(src, q.dtype, square)
    else:
        rht = q.rht and not along_rows
        if rht:
            if src.shape[1] % NVFP4_BLOCK:
                raise ValueError(
                    f"x: NVFP4's random Hadamard transform runs over 16 elements of the reduction "
                    f"dim; expected a multiple of 16, got {src.shape[1]}"
                )
            src = _rht(src)
        amax = _sharding.pmax(jnp.max(jnp.abs(src)), reduce_axes)
        u = None
        if q.stochastic_rounding:
            if rng is None:
                raise ValueError(
                    "rng: NVFP4BlockScaling rounds gradients stochastically and needs a jax.random "
                    "key (te_jax.flax modules take it from the 'sr_rng' stream: "
                    "apply(..., rngs={'sr_rng': key})); or set disable_stochastic_rounding=True"
                )
            u = jax.random.uniform(jax.random.fold_in(rng, int(along_rows)), src.shape, _F32)
        out = _nvfp4(src, square, amax, u)
    return out if along_rows else out.T


def quantize(x, q, rowwise: bool, columnwise: bool, reduce_axes=(), rng=None) -> Emulated:
    """The emulated operand of x [M, K] for quantizer ``q`` (te_jax._quantizer.Quantizer)."""
    _announce(q.kind)
    if x.ndim != 2:
        raise ValueError(f"x: expected a [M, K] matrix, got shape {tuple(x.shape)}")
    if q.kind == "nvfp4" and q.scaling_mode == "2d":
        # 16x16 tiles: both copies are the same numbers (NUMERICS.md)
        both = _copy(x, q, reduce_axes, rng, True)
        return Emulated(both if rowwise else None, both if columnwise else None)
    return Emulated(
        _copy(x, q, reduce_axes, rng, True) if rowwise else None,
        _copy(x, q, reduce_axes, rng, False) if columnwise else None,
    )


def block_of(q) -> int:
    """The block length of an emulated quantizer (32 MXFP8, 16 NVFP4)."""
    return MX_BLOCK if q.kind == "mxfp8" else NVFP4_BLOCK
