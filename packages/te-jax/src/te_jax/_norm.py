"""layernorm / rmsnorm: a jax.custom_vjp over te-core's norm kernels (te/normalization.h).

Forward runs te_norm_fwd_ffi and keeps (x, mu, rsigma, gamma) for the backward, which runs
te_norm_bwd_ffi (dx, dgamma, dbeta in one kernel); nothing is recomputed in JAX. The FP8-output
forward (te's fused norm + quantize, bit-identical to a norm followed by te_jax.quantize) is
``norm_fwd(..., fp8=Fp8Out(...))``, which te_jax's fused layernorm_dense / layernorm_mlp use.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from te_core import _ops

from te_jax import _dtypes, _ffi, _fused, _sharding

_NAMES = ", ".join(repr(n) for n in _ops.NORM_TYPES)


@dataclasses.dataclass(frozen=True)
class _Config:
    norm_type: int
    eps: float
    zero_centered_gamma: bool


def _array(value, name):
    if not isinstance(value, jax.Array):
        try:
            value = jnp.asarray(value)
        except (TypeError, ValueError):
            raise TypeError(f"{name}: expected a jax array, got {type(value).__name__}") from None
    _dtypes.as_dtype(value.dtype, f"{name}.dtype", _dtypes.SOURCE)
    return value


def _check(x, gamma, beta, epsilon, zero_centered_gamma, layernorm_type):
    if not isinstance(layernorm_type, str) or layernorm_type not in _ops.NORM_TYPES:
        raise ValueError(f"layernorm_type: expected one of {_NAMES}, got {layernorm_type!r}")
    norm_type = _ops.NORM_TYPES[layernorm_type]
    if not isinstance(zero_centered_gamma, (bool, np.bool_)):
        raise TypeError(f"zero_centered_gamma: expected True or False, got {zero_centered_gamma!r}")
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
        raise TypeError(f"epsilon: expected a Python float >= 0, got {type(epsilon).__name__}")
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon: expected a finite float >= 0, got {epsilon}")
    x = _array(x, "x")
    gamma = _array(gamma, "gamma")
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"x: expected shape [..., H] with H >= 1, got {tuple(x.shape)}")
    h = x.shape[-1]
    if tuple(gamma.shape) != (h,):
        raise ValueError(f"gamma: expected shape ({h},) (x's last dim), got {tuple(gamma.shape)}")
    if beta is None and norm_type != _ops.NORM_TYPES["rmsnorm"]:
        raise ValueError(
            f"beta: expected shape ({h},) for layernorm_type='layernorm' (LayerNorm's bias; pass "
            "zeros for none), got None"
        )
    if beta is not None:
        if norm_type == _ops.NORM_TYPES["rmsnorm"]:
            raise ValueError("beta: expected None for layernorm_type='rmsnorm' (RMSNorm has no bias)")
        beta = _array(beta, "beta")
        if tuple(beta.shape) != (h,):
            raise ValueError(f"beta: expected shape ({h},) (x's last dim), got {tuple(beta.shape)}")
    cfg = _Config(norm_type, float(epsilon), bool(zero_centered_gamma))
    return cfg, x, gamma, beta


def layernorm(
    x,
    gamma,
    beta=None,
    *,
    epsilon: float = 1e-6,
    zero_centered_gamma: bool = False,
    layernorm_type: str = "layernorm",
    input_spec: P | None = None,
):
    """LayerNorm or RMSNorm over the last dim of ``x`` [..., H], through te-core.

    layernorm: ``(x - mean) / sqrt(var + epsilon) * g + beta``; rmsnorm:
    ``x / sqrt(mean(x^2) + epsilon) * g`` (``beta`` must be None); ``g = gamma``, or ``1 + gamma``
    with ``zero_centered_gamma`` (TE's option; gamma then initialises to zeros). Statistics and
    math are fp32 whatever the dtypes (float32, bfloat16, float16; x, gamma, beta may differ);
    the result has x's dtype. Differentiable (jax.grad: dx, dgamma, dbeta from te's fused
    backward kernel) and works under jax.jit. Defaults are TE Flax's (epsilon 1e-6).
    ``input_spec``: x's PartitionSpec over the mesh set with jax.set_mesh (default: the first dim
    over te_jax.autocast's MeshResource batch axes); its rows may be split, H may not. Each
    device normalizes its own rows; dgamma and dbeta are psum-reduced over the rows' axes.
    """
    cfg, x, gamma, beta = _check(x, gamma, beta, epsilon, zero_centered_gamma, layernorm_type)
    if input_spec is None:
        input_spec = _sharding.default_input_spec(x.ndim)
    lay = _sharding.layout([(x.shape, input_spec, "input_spec")])
    xs = lay.specs[0]
    if xs[-1] is not None:
        raise ValueError(
            f"input_spec: the normalized dim H may not be split (the norm reduces over it), got {P(*xs)}"
        )
    rows = tuple(a for e in xs[:-1] for a in _sharding.entry_axes(e))
    return _layernorm(_Sharded(cfg, lay, P(*xs), rows), x, gamma, beta)


def norm_fwd(x, gamma, beta, cfg: _Config, fp8: _fused.Fp8Out | None = None, scale=None):
    """(y, mu, rsigma): y high precision (x's dtype) or a ScaledTensor per ``fp8`` (``scale``:
    the delayed scale when ``fp8.delayed``; y.amax is then amax(y))."""
    parts = _norm_fwd(x, gamma, beta, scale, cfg=cfg, fp8=fp8)
    return _fused.assemble(parts[:6], x.shape, x.dtype, fp8, scale), parts[6], parts[7]


@functools.partial(jax.jit, static_argnames=("cfg", "fp8"))
def _norm_fwd(x, gamma, beta, scale, *, cfg, fp8):
    specs = _ops.norm_fwd_outputs(tuple(x.shape), cfg.norm_type, _fused.output_specs(x.shape, x.dtype, fp8))
    scale, amax = _fused.stat_operands(fp8, scale)
    return _ffi.call(
        _ffi.NORM_FWD,
        specs,
        x,
        gamma,
        jnp.zeros(_ops.ABSENT_SHAPE, jnp.float32) if beta is None else beta,  # [0]: no beta
        scale,
        amax,
        norm_type=np.int32(cfg.norm_type),
        eps=np.float32(cfg.eps),
        zero_centered_gamma=np.bool_(cfg.zero_centered_gamma),
        **_fused.attrs(fp8),
    )


@functools.partial(jax.jit, static_argnames=("cfg",))
def norm_bwd(dz, x, mu, rsigma, gamma, *, cfg):
    specs = _ops.norm_bwd_outputs(
        tuple(x.shape), cfg.norm_type, _dtypes.to_te(x.dtype), _dtypes.to_te(gamma.dtype)
    )
    return _ffi.call(
        _ffi.NORM_BWD,
        specs,
        dz,
        x,
        mu,
        rsigma,
        gamma,
        norm_type=np.int32(cfg.norm_type),
        zero_centered_gamma=np.bool_(cfg.zero_centered_gamma),
    )


@dataclasses.dataclass(frozen=True)
class _Sharded:
    cfg: _Config
    layout: _sharding.Layout
    x_spec: P | None
    rows: tuple[str, ...]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _layernorm(st, x, gamma, beta):
    return _layernorm_fwd(st, x, gamma, beta)[0]


def _layernorm_fwd(st, x, gamma, beta):
    def local(x, gamma, beta):
        y, mu, rsigma = norm_fwd(x, gamma, beta, st.cfg)
        return y, st.layout.pack((x, mu, rsigma, gamma))

    y, res = st.layout.run(
        local,
        (x, gamma, beta),
        in_specs=(st.x_spec, P(None), P(None)),
        out_specs=(st.x_spec, st.layout.residual_spec),
    )
    return y, (res, None if beta is None else jnp.zeros((0,), beta.dtype))


def _layernorm_bwd(st, saved, dy):
    res, beta_tag = saved

    def local(res, dy):
        x, mu, rsigma, gamma = st.layout.unpack(res)
        dx, dgamma, dbeta = norm_bwd(dy.astype(x.dtype), x, mu, rsigma, gamma, cfg=st.cfg)
        return dx, _sharding.psum(dgamma, st.rows), _sharding.psum(dbeta, st.rows)

    dx, dgamma, dbeta = st.layout.run(
        local,
        (res, dy),
        in_specs=(st.layout.residual_spec, st.x_spec),
        out_specs=(st.x_spec, P(None), P(None)),
    )
    return dx, dgamma, None if beta_tag is None else dbeta.astype(beta_tag.dtype)


_layernorm.defvjp(_layernorm_fwd, _layernorm_bwd)
