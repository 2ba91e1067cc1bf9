"""activation: TE Flax's activation tuples as a jax.custom_vjp over te-core's kernels
(te/activation.h).

``activation_type`` is TE's tuple: one name for a plain activation, (name, "linear") for the
gated one. Gated inputs are [..., 2N] with the activation's input first and the linear gate
second (te-core's and TE's convention), and give [..., N]. The forward keeps x (the
pre-activation); the backward runs te_act_bwd_ffi on it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from te_core import _ops

from te_jax import _dtypes, _ffi, _fused, _sharding

# TE Flax's names -> te_activation (te_core._ops.ACTIVATIONS).
_KINDS = {
    ("gelu",): "gelu",
    ("relu",): "relu",
    ("silu",): "silu",
    ("quick_gelu",): "qgelu",
    ("squared_relu",): "srelu",
    ("gelu", "linear"): "geglu",
    ("relu", "linear"): "reglu",
    ("silu", "linear"): "swiglu",
    ("quick_gelu", "linear"): "qgeglu",
    ("squared_relu", "linear"): "sreglu",
    ("sigmoid", "linear"): "glu",
}
_ACCEPTED = ", ".join(repr(k) for k in _KINDS)


def activation_kind(activation_type, name: str = "activation_type") -> int:
    """The te_activation of a TE Flax tuple (a bare string means a 1-tuple); ``name``: the
    argument an error names."""
    key = (activation_type,) if isinstance(activation_type, str) else activation_type
    try:
        key = tuple(key)
        kind = _KINDS[key]
    except (TypeError, KeyError):
        raise ValueError(f"{name}: expected one of {_ACCEPTED}, got {activation_type!r}") from None
    return _ops.ACTIVATIONS[kind]


def activation(x, activation_type=("gelu",), *, input_spec: P | None = None):
    """TE Flax's activation on the last dim of ``x``, through te-core.

    Plain kinds (("gelu",) tanh-approximate GELU, ("relu",), ("silu",), ("quick_gelu",) =
    x*sigmoid(1.702x), ("squared_relu",)) keep the shape. Gated kinds (("gelu", "linear") GeGLU,
    ("silu", "linear") SwiGLU, ("relu", "linear"), ("quick_gelu", "linear"), ("squared_relu",
    "linear"), ("sigmoid", "linear") GLU) take x [..., 2N] and return
    ``act(x[..., :N]) * x[..., N:]`` [..., N]. Math is fp32; the result has x's dtype
    (float32, bfloat16, float16). Differentiable (te's backward kernel) and jit-able.
    ``input_spec``: x's PartitionSpec over the mesh set with jax.set_mesh (default: the first dim
    over te_jax.autocast's MeshResource batch axes); each device runs its own piece (a gated
    kind's last dim may not be split: its two halves must stay together).
    """
    kind = activation_kind(activation_type)
    if not isinstance(x, jax.Array):
        try:
            x = jnp.asarray(x)
        except (TypeError, ValueError):
            raise TypeError(f"x: expected a jax array, got {type(x).__name__}") from None
    _dtypes.as_dtype(x.dtype, "x.dtype", _dtypes.SOURCE)
    if x.ndim < 1:
        raise ValueError(f"x: expected shape [..., K] with at least one dim, got {tuple(x.shape)}")
    _ops.activation_out_shape(tuple(x.shape), kind)  # raises for an odd gated width
    if input_spec is None:
        input_spec = _sharding.default_input_spec(x.ndim)
    lay = _sharding.layout([(x.shape, input_spec, "input_spec")])
    xs = lay.specs[0]
    if kind >= 100 and xs[-1] is not None:
        raise ValueError(
            f"input_spec: a gated activation's last dim may not be split (its input and gate halves "
            f"must stay together), got {P(*xs)}"
        )
    return _activation(kind, lay, P(*xs), x)


def act_fwd(x, kind: int, fp8: _fused.Fp8Out | None = None, scale=None):
    """act(x): high precision (x's dtype) or a ScaledTensor per ``fp8`` (``scale``: the delayed
    scale when ``fp8.delayed``)."""
    out_shape = _ops.activation_out_shape(tuple(x.shape), kind)
    parts = _act_fwd(x, scale, kind=kind, fp8=fp8)
    return _fused.assemble(parts, out_shape, x.dtype, fp8, scale)


def act_bwd(grad, x, kind: int, fp8: _fused.Fp8Out | None = None, dbias: bool = False, scale=None):
    """(dx, dbias or None): dx high precision (x's dtype) or a ScaledTensor per ``fp8``."""
    parts = _act_bwd(grad, x, scale, kind=kind, fp8=fp8, dbias=dbias)
    dx = _fused.assemble(parts[:6], x.shape, x.dtype, fp8, scale)
    return dx, (parts[6] if dbias else None)


def dbias_quantize(x, fp8: _fused.Fp8Out, scale=None):
    """(x quantized per ``fp8``, the column sums of x [K] in x's dtype), one te kernel."""
    parts = _dbias_quantize(x, scale, fp8=fp8)
    return _fused.assemble(parts[:6], x.shape, x.dtype, fp8, scale), parts[6]


@functools.partial(jax.jit, static_argnames=("kind", "fp8"))
def _act_fwd(x, scale, *, kind, fp8):
    out_shape = _ops.activation_out_shape(tuple(x.shape), kind)
    scale, amax = _fused.stat_operands(fp8, scale)
    return _ffi.call(
        _ffi.ACT_FWD,
        _fused.output_specs(out_shape, x.dtype, fp8),
        x,
        scale,
        amax,
        activation=np.int32(kind),
        **_fused.attrs(fp8),
    )


@functools.partial(jax.jit, static_argnames=("kind", "fp8", "dbias"))
def _act_bwd(grad, x, scale, *, kind, fp8, dbias):
    specs = _fused.output_specs(x.shape, x.dtype, fp8) + (
        _ops.dbias_output(tuple(x.shape), _dtypes.to_te(x.dtype), dbias),
    )
    scale, amax = _fused.stat_operands(fp8, scale)
    return _ffi.call(
        _ffi.ACT_BWD,
        specs,
        grad,
        x,
        scale,
        amax,
        activation=np.int32(kind),
        has_dbias=np.bool_(dbias),
        **_fused.attrs(fp8),
    )


@functools.partial(jax.jit, static_argnames=("fp8",))
def _dbias_quantize(x, scale, *, fp8):
    specs = _fused.output_specs(x.shape, x.dtype, fp8) + (
        _ops.dbias_output(tuple(x.shape), _dtypes.to_te(x.dtype), True),
    )
    scale, amax = _fused.stat_operands(fp8, scale)
    return _ffi.call(
        _ffi.DBIAS_QUANTIZE,
        specs,
        x,
        scale,
        amax,
        **_fused.attrs(fp8, with_quantized=False),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _activation(kind, lay, spec, x):
    return lay.run(lambda x: act_fwd(x, kind), (x,), in_specs=(spec,), out_specs=spec)


def _activation_fwd(kind, lay, spec, x):
    return _activation(kind, lay, spec, x), x


def _activation_bwd(kind, lay, spec, x, dy):
    def local(x, dy):
        return act_bwd(dy.astype(x.dtype), x, kind)[0]

    return (lay.run(local, (x, dy), in_specs=(spec, spec), out_specs=spec),)


_activation.defvjp(_activation_fwd, _activation_bwd)
