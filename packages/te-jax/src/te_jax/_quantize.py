"""quantize / dequantize (and te's amax and transpose) over te-core's FFI handlers.

Arguments are checked here, in Python, at trace time (cheap and never per step under jit), and
each error names the argument and what it accepts; te-core's C layer checks everything again and
its messages come back through the FFI error for anything missed. Shapes and dtypes of results
come from te_core._ops, the op table te_torch uses too.
"""

from __future__ import annotations

import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from te_core import _ops

from te_jax import _dtypes, _ffi
from te_jax._scaled_tensor import ScaledTensor

_PER_TENSOR = _ops.SCALING_MODES["per_tensor"]
_MODE_NAMES = ", ".join(repr(m) for m in _ops.SCALING_MODES)
_F32 = np.dtype(jnp.float32)


def _check_source(x, name: str = "x") -> jax.Array:
    if not isinstance(x, jax.Array):
        x = jnp.asarray(x)
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
    dtype=jnp.float8_e4m3fn,
    scale=None,
    amax=None,
    scaling_mode: str = "per_tensor",
    rowwise: bool = True,
    columnwise: bool = False,
    force_pow2_scales: bool | None = None,
    amax_epsilon: float = 0.0,
) -> ScaledTensor:
    """Quantizes ``x`` (float32/float16/bfloat16, shape [..., K]) to FP8 in te's layouts.

    Args:
      dtype: jnp.float8_e4m3fn (max 448) or jnp.float8_e5m2 (max 57344).
      scale: per_tensor only. None: current scaling, the scale comes from amax(x) (below).
        An fp32 (1,) array: delayed scaling, ``q = convert(x * scale)``.
      amax: delayed scaling only: the running amax to max-accumulate into (default zeros), so
        the result's ``amax`` is ``max(amax, amax(x))``.
      scaling_mode: "per_tensor" (one scale), "block_1d" (1x128 blocks along rows) or
        "block_2d" (128x128 tiles); block modes always compute their scales.
      rowwise, columnwise: which copies to produce: the source-shaped one and/or the transposed
        [K, M] one (for block_1d, the 1x128 quantization of x.T).
      force_pow2_scales: round computed scales down to powers of two; default False for
        per_tensor, True for block modes (Float8BlockScaling's default).
      amax_epsilon: computed scales use max(amax, amax_epsilon).

    Computed scales: amax 0, inf or NaN gives scale 1; else fp8_max / amax (inf -> FLT_MAX).
    Returns a ScaledTensor; it works under jax.jit (all arguments but x, scale, amax are static).
    """
    x = _check_source(x)
    fp8_dtype = _dtypes.as_dtype(dtype, "dtype", _dtypes.FP8)
    if not isinstance(scaling_mode, str) or scaling_mode not in _ops.SCALING_MODES:
        raise ValueError(f"scaling_mode: expected one of {_MODE_NAMES}, got {scaling_mode!r}")
    mode = _ops.SCALING_MODES[scaling_mode]
    rowwise = _check_flag(rowwise, "rowwise")
    columnwise = _check_flag(columnwise, "columnwise")
    if not (rowwise or columnwise):
        raise ValueError("rowwise, columnwise: expected at least one of them True, got both False")
    if force_pow2_scales is None:
        force_pow2_scales = mode != _PER_TENSOR
    force_pow2_scales = _check_flag(force_pow2_scales, "force_pow2_scales")
    if isinstance(amax_epsilon, jax.core.Tracer) or not isinstance(amax_epsilon, numbers.Real):
        raise TypeError(
            "amax_epsilon: expected a Python float >= 0 (a static attribute), "
            f"got {type(amax_epsilon).__name__}"
        )
    amax_epsilon = float(amax_epsilon)
    if not amax_epsilon >= 0.0:
        raise ValueError(f"amax_epsilon: expected a float >= 0, got {amax_epsilon}")

    delayed = scale is not None
    if delayed:
        if mode != _PER_TENSOR:
            raise ValueError(
                f"scale: scaling_mode {scaling_mode!r} computes a scale per block; "
                "expected scale=None (a given scale is delayed per-tensor scaling)"
            )
        scale = _check_stat(scale, "scale")
        amax = jnp.zeros((1,), _F32) if amax is None else _check_stat(amax, "amax")
    elif amax is not None:
        raise ValueError(
            "amax: expected None without a scale (current scaling computes amax "
            "from x); pass scale= as well for delayed scaling"
        )

    parts = _quantize(
        x,
        scale,
        amax,
        mode=mode,
        fp8=_dtypes.to_te(fp8_dtype),
        rowwise=rowwise,
        columnwise=columnwise,
        force_pow2_scales=force_pow2_scales,
        amax_epsilon=amax_epsilon,
    )
    rw_data, rw_sinv, cw_data, cw_sinv, q_amax, q_scale = parts
    per_tensor = mode == _PER_TENSOR
    return ScaledTensor(
        data=rw_data if rowwise else None,
        scale_inv=rw_sinv if rowwise else None,
        columnwise_data=cw_data if columnwise else None,
        columnwise_scale_inv=cw_sinv if columnwise else None,
        amax=q_amax if per_tensor else None,
        scale=q_scale if per_tensor else None,
        scaling_mode=scaling_mode,
        fp8_dtype=fp8_dtype,
        shape=tuple(x.shape),
        dq_dtype=np.dtype(x.dtype),
    )


@functools.partial(
    jax.jit, static_argnames=("mode", "fp8", "rowwise", "columnwise", "force_pow2_scales", "amax_epsilon")
)
def _quantize(x, scale, amax, *, mode, fp8, rowwise, columnwise, force_pow2_scales, amax_epsilon):
    # Per-tensor results always carry amax and scale (fp32 [1]); for delayed scaling they are
    # the caller's, passed in and aliased to the results (operand 1 -> result 5, 2 -> 4) so the
    # handler max-accumulates amax in place of a functional copy.
    per_tensor = mode == _PER_TENSOR
    specs = _ops.quantize_outputs(tuple(x.shape), mode, fp8, rowwise, columnwise, per_tensor)
    delayed = scale is not None
    if not delayed:
        scale = amax = jnp.zeros((0,), _F32)
    return _ffi.call(
        _ffi.QUANTIZE,
        specs,
        x,
        scale,
        amax,
        aliases={1: 5, 2: 4} if delayed else None,
        scaling_mode=np.int32(mode),
        rowwise=np.bool_(rowwise),
        columnwise=np.bool_(columnwise),
        compute_scale=np.bool_(not delayed),
        force_pow2_scales=np.bool_(force_pow2_scales),
        amax_epsilon=np.float32(amax_epsilon),
    )


def dequantize(t: ScaledTensor, dtype=None) -> jax.Array:
    """``t``'s source-shaped value in ``dtype`` (default ``t.dq_dtype``), through te-core."""
    dtype = t.dq_dtype if dtype is None else _dtypes.as_dtype(dtype, "dtype", _dtypes.SOURCE)
    columnwise = t.data is None
    data = t.columnwise_data if columnwise else t.data
    scale_inv = t.columnwise_scale_inv if columnwise else t.scale_inv
    if data is None:
        raise ValueError("t: expected a ScaledTensor with row-wise or column-wise data, got neither")
    return _dequantize(
        data,
        scale_inv,
        mode=_ops.SCALING_MODES[t.scaling_mode],
        columnwise=columnwise,
        shape=tuple(t.shape),
        out=_dtypes.to_te(dtype),
    )


@functools.partial(jax.jit, static_argnames=("mode", "columnwise", "shape", "out"))
def _dequantize(data, scale_inv, *, mode, columnwise, shape, out):
    (y,) = _ffi.call(
        _ffi.DEQUANTIZE,
        [_ops.dequantize_output(shape, out)],
        data,
        scale_inv,
        scaling_mode=np.int32(mode),
        columnwise=np.bool_(columnwise),
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
