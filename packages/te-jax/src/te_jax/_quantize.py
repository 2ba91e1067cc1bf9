"""quantize / dequantize (and te's amax and transpose) over te-core's FFI handlers, for every
scaling mode te-core has: per-tensor and block FP8, MXFP8 and NVFP4.

Arguments are checked here, in Python, at trace time (cheap and never per step under jit), and
each error names the argument and what it accepts; te-core's C layer checks everything again and
its messages come back through the FFI error for anything missed. Shapes and dtypes of results
come from te_core._ops, the op table te_torch uses too.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from te_core import _ops

from te_jax import _dtypes, _ffi, _fused
from te_jax._scaled_tensor import ScaledTensor

_MODES = {**_ops.SCALING_MODES, **_ops.MX_SCALING_MODES}
_PER_TENSOR = _MODES["per_tensor"]
_MODE_NAMES = ", ".join(repr(m) for m in _MODES)
_F32 = np.dtype(jnp.float32)
E2M1 = np.dtype(jnp.float4_e2m1fn)


def _check_source(x, name: str = "x") -> jax.Array:
    if not isinstance(x, jax.Array):
        try:
            x = jnp.asarray(x)
        except (TypeError, ValueError):
            raise TypeError(f"{name}: expected a jax array, got {type(x).__name__}") from None
    _dtypes.as_dtype(x.dtype, name, _dtypes.SOURCE)
    return x


def _check_stat(value, name: str) -> jax.Array:
    """A per-tensor scalar (scale or amax): a float, or a floating array of shape () or (1,)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return jnp.full((1,), value, _F32)
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise TypeError(
            f"{name}: expected a float32 array of shape (1,) or (), or a float, got {type(value).__name__}"
        )
    if tuple(value.shape) not in ((), (1,)):
        raise ValueError(
            f"{name}: expected shape (1,) or () (one per-tensor value), got {tuple(value.shape)}"
        )
    if not jnp.issubdtype(value.dtype, jnp.floating):
        raise TypeError(f"{name}: expected a floating array (float32), got {np.dtype(value.dtype)}")
    return jnp.reshape(jnp.asarray(value, _F32), (1,))


def _check_flag(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return bool(value)


def quantize(
    x,
    *,
    dtype=None,
    scale=None,
    amax=None,
    scaling_mode: str = "per_tensor",
    rowwise: bool = True,
    columnwise: bool = False,
    force_pow2_scales: bool | None = None,
    amax_epsilon: float = 0.0,
    with_2d_quantization: bool = False,
    columnwise_rht: bool = False,
    rng=None,
) -> ScaledTensor:
    """Quantizes ``x`` (float32/float16/bfloat16, shape [..., K]) in te's layouts, through te-core.

    Args:
      dtype: the element format: jnp.float8_e4m3fn (max 448, the default) or jnp.float8_e5m2
        (max 57344); jnp.float4_e2m1fn for "nvfp4_1d" (its default and only choice).
      scale: per_tensor only. None: current scaling, the scale comes from amax(x) (below).
        An fp32 (1,) array: delayed scaling, ``q = convert(x * scale)``.
      amax: delayed scaling: the running amax to max-accumulate into (default zeros), so the
        result's ``amax`` is ``max(amax, amax(x))``. nvfp4_1d: fp32 (2,), the global amaxes to
        encode the row-wise and column-wise copies with (e.g. reduced over a mesh) instead of
        the copies' own.
      scaling_mode: "per_tensor" (one scale), "block_1d" (1x128 blocks along rows), "block_2d"
        (128x128 tiles), "mxfp8_1d" (OCP MXFP8: 1x32 blocks, E8M0 scales) or "nvfp4_1d" (1x16
        blocks of E2M1, E4M3 scales and a global scale from amax); NUMERICS.md. Block and MX
        modes always compute their scales.
      rowwise, columnwise: which copies to produce: the source-shaped one and/or the transposed
        [K, M] one (for block and MX modes, a quantization of x.T with blocks along M).
      force_pow2_scales: round computed scales down to powers of two; default False for
        per_tensor, True for block modes (Float8BlockScaling's default); MX modes fix their own
        scale rule (None or False).
      amax_epsilon: computed per-tensor and block scales use max(amax, amax_epsilon) (MX: 0).
      with_2d_quantization: MX modes: one scale per 32x32 (MXFP8) or 16x16 (NVFP4) tile, so
        both copies are the same quantization (weights).
      columnwise_rht: nvfp4_1d: the column-wise copy quantizes the random Hadamard transform of
        x.T along M (a multiple of 16); a GEMM multiplies it only with another such copy (the
        wgrad).
      rng: nvfp4_1d: a jax.random key; given, E2M1 rounding is stochastic, with Philox bits whose
        seed and offset are ``jax.random.bits(rng, (4,), uint32)`` (little-endian uint64 pairs),
        drawn on the device: the same key gives the same bits on every backend.

    Computed scales: amax 0, inf or NaN gives scale 1; else fp8_max / amax (inf -> FLT_MAX).
    Returns a ScaledTensor; it works under jax.jit (all arguments but x, scale, amax, rng are
    static).
    """
    x = _check_source(x)
    if not isinstance(scaling_mode, str) or scaling_mode not in _MODES:
        raise ValueError(f"scaling_mode: expected one of {_MODE_NAMES}, got {scaling_mode!r}")
    mode = _MODES[scaling_mode]
    nvfp4 = mode == _ops.NVFP4
    mx = scaling_mode in _ops.MX_SCALING_MODES
    if nvfp4:
        fp8_dtype = E2M1 if dtype is None else _dtypes.as_dtype(dtype, "dtype", {E2M1: "float4_e2m1fn"})
    else:
        fp8_dtype = _dtypes.as_dtype(jnp.float8_e4m3fn if dtype is None else dtype, "dtype", _dtypes.FP8)
    rowwise = _check_flag(rowwise, "rowwise")
    columnwise = _check_flag(columnwise, "columnwise")
    if not (rowwise or columnwise):
        raise ValueError("rowwise, columnwise: expected at least one of them True, got both False")
    if force_pow2_scales is None:
        force_pow2_scales = mode not in (_PER_TENSOR, _ops.MXFP8, _ops.NVFP4)
    force_pow2_scales = _check_flag(force_pow2_scales, "force_pow2_scales")
    if isinstance(amax_epsilon, jax.core.Tracer) or not isinstance(amax_epsilon, numbers.Real):
        raise TypeError(
            "amax_epsilon: expected a Python float >= 0 (a static attribute), "
            f"got {type(amax_epsilon).__name__}"
        )
    amax_epsilon = float(amax_epsilon)
    if not amax_epsilon >= 0.0:
        raise ValueError(f"amax_epsilon: expected a float >= 0, got {amax_epsilon}")
    tile_2d = _check_flag(with_2d_quantization, "with_2d_quantization")
    rht = _check_flag(columnwise_rht, "columnwise_rht")
    if mx and (force_pow2_scales or amax_epsilon):
        raise ValueError(
            f"force_pow2_scales, amax_epsilon: scaling_mode {scaling_mode!r} fixes its scale rule "
            f"(NUMERICS.md); expected None/False and 0.0, got {force_pow2_scales} and {amax_epsilon}"
        )
    if tile_2d and not mx:
        raise ValueError(
            f"with_2d_quantization: only for 'mxfp8_1d' and 'nvfp4_1d' (block_2d is its own scaling "
            f"mode), got True with {scaling_mode!r}"
        )
    if (rht or rng is not None) and not nvfp4:
        raise ValueError(
            f"{'columnwise_rht' if rht else 'rng'}: only for 'nvfp4_1d' (the Hadamard transform and "
            f"stochastic rounding are NVFP4's), got scaling_mode {scaling_mode!r}"
        )
    if nvfp4:
        _check_nvfp4_shape(x.shape, rowwise, columnwise, rht, tile_2d)
    rng_state = None
    if rng is not None:
        if not isinstance(rng, jax.Array):
            raise TypeError(f"rng: expected a jax.random key, got {type(rng).__name__}")
        rng_state = jax.random.bits(rng, (4,), jnp.uint32)

    delayed = scale is not None
    if delayed:
        if mode != _PER_TENSOR:
            raise ValueError(
                f"scale: scaling_mode {scaling_mode!r} computes a scale per block; "
                "expected scale=None (a given scale is delayed per-tensor scaling)"
            )
        scale = _check_stat(scale, "scale")
        amax = None if amax is None else _check_stat(amax, "amax")
    elif amax is not None:
        if not nvfp4:
            raise ValueError(
                "amax: expected None without a scale (current scaling computes amax "
                "from x); pass scale= as well for delayed scaling"
            )
        amax = _check_global_amax(amax)

    parts = _quantize(
        x,
        scale,
        amax,
        rng_state,
        mode=mode,
        fp8=_ops.FLOAT4_E2M1 if nvfp4 else _dtypes.to_te(fp8_dtype),
        rowwise=rowwise,
        columnwise=columnwise,
        force_pow2_scales=force_pow2_scales,
        amax_epsilon=amax_epsilon,
        tile_2d=tile_2d,
        rht=rht,
    )
    rw_data, rw_sinv, cw_data, cw_sinv, q_amax, q_scale = parts
    per_tensor = mode == _PER_TENSOR
    if delayed:
        q_scale = scale  # read in place by the handler, not returned
    return ScaledTensor(
        data=rw_data if rowwise else None,
        scale_inv=rw_sinv if rowwise else None,
        columnwise_data=cw_data if columnwise else None,
        columnwise_scale_inv=cw_sinv if columnwise else None,
        amax=q_amax if (per_tensor or nvfp4) else None,
        scale=q_scale if per_tensor else None,
        scaling_mode=scaling_mode,
        fp8_dtype=fp8_dtype,
        shape=tuple(x.shape),
        dq_dtype=np.dtype(x.dtype),
        columnwise_rht=rht and columnwise,
    )


def _check_nvfp4_shape(shape, rowwise: bool, columnwise: bool, rht: bool, tile_2d: bool) -> None:
    """What te's NVFP4 layout needs of x [..., K] viewed as [M, K] (te/tensor.h), said in Python."""
    k = shape[-1] if shape else 1
    m = math.prod(shape[:-1])
    if rowwise and k % 2:
        raise ValueError(
            f"x: nvfp4_1d packs two E2M1 elements a byte and each row of the row-wise copy starts "
            f"on a byte, so the last dim K must be even, got K = {k} (shape {tuple(shape)})"
        )
    if columnwise and m % 2:
        raise ValueError(
            f"x: nvfp4_1d's column-wise copy is [K, M] with M = {m} rows of x flattened; two E2M1 "
            f"elements a byte need M even (shape {tuple(shape)})"
        )
    if rht and tile_2d:
        raise ValueError(
            "columnwise_rht: not with with_2d_quantization (2-D tiles make the column-wise copy "
            "the row-wise one transposed; the transform would change it)"
        )
    if rht and columnwise and m % 16:
        raise ValueError(
            f"x: the random Hadamard transform runs over 16 of the M = {m} rows of x at a time "
            f"(the wgrad's reduction dim); expected M a multiple of 16 (shape {tuple(shape)})"
        )


def _check_global_amax(value) -> jax.Array:
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise TypeError(f"amax: expected a float32 array of shape (2,), got {type(value).__name__}")
    if tuple(value.shape) != _ops.NVFP4_AMAX_SHAPE:
        raise ValueError(
            f"amax: expected shape (2,) for nvfp4_1d (the row-wise and column-wise copies' global "
            f"amaxes), got {tuple(value.shape)}"
        )
    return jnp.asarray(value, _F32)


@functools.partial(
    jax.jit,
    static_argnames=(
        "mode",
        "fp8",
        "rowwise",
        "columnwise",
        "force_pow2_scales",
        "amax_epsilon",
        "tile_2d",
        "rht",
    ),
)
def _quantize(
    x,
    scale,
    amax,
    rng_state,
    *,
    mode,
    fp8,
    rowwise,
    columnwise,
    force_pow2_scales,
    amax_epsilon,
    tile_2d,
    rht,
):
    # Per-tensor results carry amax (fp32 [1]) and, for current scaling, the scale. A delayed
    # scale is read where it is (result 5 is [0]: aliasing it made XLA copy it first); a given
    # running amax is aliased to result 4 (operand 2 -> 4) so the handler max-accumulates into
    # it, and without one the handler writes amax(x) to a fresh result. NVFP4 results carry the
    # global amaxes [2]; given ones (use_existing_amax) are aliased the same way.
    per_tensor = mode == _PER_TENSOR
    specs = _ops.quantize_outputs(tuple(x.shape), mode, fp8, rowwise, columnwise, per_tensor)
    delayed = scale is not None
    if delayed:
        specs = _fused.without_scale(specs)
    existing = not delayed and amax is not None
    absent = jnp.zeros(_ops.ABSENT_SHAPE, _F32)
    aliases = {2: 4} if amax is not None else None
    return _ffi.call(
        _ffi.QUANTIZE,
        specs,
        x,
        scale if delayed else absent,
        absent if amax is None else amax,
        jnp.zeros(_ops.ABSENT_SHAPE, jnp.uint32) if rng_state is None else rng_state,
        aliases=aliases,
        scaling_mode=np.int32(mode),
        rowwise=np.bool_(rowwise),
        columnwise=np.bool_(columnwise),
        compute_scale=np.bool_(not delayed),
        force_pow2_scales=np.bool_(force_pow2_scales),
        amax_epsilon=np.float32(amax_epsilon),
        use_existing_amax=np.bool_(existing),
        with_2d_quantization=np.bool_(tile_2d),
        stochastic_rounding=np.bool_(rng_state is not None),
        columnwise_rht=np.bool_(rht),
    )


def dequantize(t: ScaledTensor, dtype=None) -> jax.Array:
    """``t``'s source-shaped value in ``dtype`` (default ``t.dq_dtype``), through te-core."""
    dtype = t.dq_dtype if dtype is None else _dtypes.as_dtype(dtype, "dtype", _dtypes.SOURCE)
    columnwise = t.data is None
    data = t.columnwise_data if columnwise else t.data
    scale_inv = t.columnwise_scale_inv if columnwise else t.scale_inv
    if data is None:
        raise ValueError("t: expected a ScaledTensor with row-wise or column-wise data, got neither")
    mode = _MODES[t.scaling_mode]
    return _dequantize(
        data,
        scale_inv,
        t.amax if mode == _ops.NVFP4 else None,
        mode=mode,
        columnwise=columnwise,
        rht=bool(columnwise and t.columnwise_rht),
        shape=tuple(t.shape),
        out=_dtypes.to_te(dtype),
    )


@functools.partial(jax.jit, static_argnames=("mode", "columnwise", "rht", "shape", "out"))
def _dequantize(data, scale_inv, amax, *, mode, columnwise, rht, shape, out):
    (y,) = _ffi.call(
        _ffi.DEQUANTIZE,
        [_ops.dequantize_output(shape, out)],
        data,
        scale_inv,
        jnp.zeros(_ops.ABSENT_SHAPE, _F32) if amax is None else amax,
        scaling_mode=np.int32(mode),
        columnwise=np.bool_(columnwise),
        columnwise_rht=np.bool_(rht),
    )
    return y


@jax.jit
def amax(x) -> jax.Array:
    """max |x| as fp32 (1,), through te-core (NaN if any element is NaN)."""
    x = _check_source(x)
    (a,) = _ffi.call(_ffi.AMAX, [_ops.TensorSpec((1,), _ops.FLOAT32)], x)
    return a


@jax.jit
def transpose(x) -> jax.Array:
    """x [..., K] viewed as [M, K] -> [K, M], through te-core (1-, 2- or 4-byte dtypes)."""
    spec = _ops.transpose_output(tuple(x.shape), _dtypes.to_te(x.dtype))
    (y,) = _ffi.call(_ffi.TRANSPOSE, [spec], x)
    return y
