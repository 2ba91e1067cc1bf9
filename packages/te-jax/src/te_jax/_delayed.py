"""DelayedScaling state: a scale and an amax history per quantized tensor role, updated
functionally (NUMERICS.md "DelayedScaling").

State is a flat dict, the names TE Flax gives its ``fp8_metas`` variables:
``{role}_scale`` fp32 [1] (initially 1) and ``{role}_amax_history`` fp32 [amax_history_len]
(initially 0). An op quantizes each role with its ``scale`` and records the role's amax (max-
reduced over the devices the tensor is split on). The op's backward rule returns the next
state as the "gradient" of the state it was given, so one ``jax.grad`` over (params, state)
yields both the parameter gradients and the next step's state; the update is:
  history[0] = max(history[0], amax); amax' = max(history) ("max") or history[0]
  ("most_recent") or the recipe's callable; scale = (fp8_max * 2^-margin) / amax' (or the
  recipe's scaling_factor_compute_algo), the old scale kept when amax' is 0, inf or NaN, inf ->
  FLT_MAX; then the history rolls by one (new[i] = old[i + 1], new[-1] = old[0]), new[0] = 0.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from te_core import _C, _ops

from te_jax import _ffi
from te_jax._quantizer import FLT_MAX, Plan, Quantizer

_F32 = np.dtype(jnp.float32)


def init(roles: dict[str, Quantizer], plan: Plan) -> dict:
    """The initial state of ``roles`` under ``plan`` (scales 1, histories 0)."""
    n = plan.delayed.amax_history_len
    state = {}
    for role in roles:
        state[f"{role}_scale"] = jnp.ones((1,), _F32)
        state[f"{role}_amax_history"] = jnp.zeros((n,), _F32)
    return state


def check(state, roles: dict[str, Quantizer], plan: Plan, name: str = "recipe_state") -> dict | None:
    """``state`` validated against the roles an op quantizes; None when the plan keeps none."""
    if plan.delayed is None:
        if state is not None:
            raise ValueError(f"{name}: expected None (only DelayedScaling keeps scaling state)")
        return None
    if state is None:
        raise ValueError(
            f"{name}: DelayedScaling needs its state: a dict with "
            f"{', '.join(sorted(init(roles, plan)))} (te_jax.init_recipe_state)"
        )
    if not isinstance(state, dict):
        raise TypeError(f"{name}: expected a dict of arrays, got {type(state).__name__}")
    n = plan.delayed.amax_history_len
    out = {}
    for role in roles:
        for key, shape in ((f"{role}_scale", (1,)), (f"{role}_amax_history", (n,))):
            if key not in state:
                raise ValueError(f"{name}: missing {key!r} (expected keys {sorted(init(roles, plan))})")
            v = state[key]
            if not hasattr(v, "shape") or not hasattr(v, "dtype"):
                raise TypeError(
                    f"{name}[{key!r}]: expected a float32 array of shape {shape}, got {type(v).__name__}"
                )
            if tuple(v.shape) != shape:
                raise ValueError(
                    f"{name}[{key!r}]: expected shape {shape} (amax_history_len={n}), got {tuple(v.shape)}"
                )
            if np.dtype(v.dtype) != _F32:
                raise TypeError(f"{name}[{key!r}]: expected float32, got {np.dtype(v.dtype).name}")
            out[key] = v
    return out


def scales(state: dict | None, roles) -> dict:
    """{role: scale} for the ops' quantizers (empty without state)."""
    if state is None:
        return {}
    return {role: state[f"{role}_scale"] for role in roles}


def _nan_max(history):
    # jnp.max propagates NaN, as te-core's update does: a NaN amax never moves a scale
    return jnp.max(history)


_ALGOS = {"max": int(_C.AmaxComputeAlgo.MAX), "most_recent": int(_C.AmaxComputeAlgo.MOST_RECENT)}


def update(state: dict, amaxes: dict, roles: dict[str, Quantizer], plan: Plan) -> dict:
    """The next state after one step whose amaxes (fp32 [1], reduced) are ``amaxes[role]``:
    te-core's update of every role in one kernel for the recipe's own rules, the same rule in
    jnp for a recipe's callables."""
    p = plan.delayed
    if p.scaling_factor_compute_algo is None and p.amax_compute_algo in _ALGOS:
        return _update_fused(state, amaxes, roles, p)
    new = {}
    for role, q in roles.items():
        history = state[f"{role}_amax_history"]
        scale = state[f"{role}_scale"]
        a = jnp.reshape(amaxes[role], ())
        first = jnp.where(jnp.isnan(a) | jnp.isnan(history[0]), jnp.nan, jnp.maximum(history[0], a))
        # A select, not history.at[0].set: updating the state operand in place makes XLA copy it
        # first (one device copy per role before the step's first kernel)
        history = jnp.where(jnp.arange(history.shape[0]) == 0, first, history)
        if callable(p.amax_compute_algo):
            amax = _one_value(p.amax_compute_algo(history), "amax_compute_algo", "the amax history")
        elif p.amax_compute_algo == "most_recent":
            amax = history[0]
        else:
            amax = _nan_max(history)
        if p.scaling_factor_compute_algo is not None:
            new_scale = _one_value(
                p.scaling_factor_compute_algo(amax, scale, q.fp8_max, p.recipe),
                "scaling_factor_compute_algo",
                "(amax, scale, fp8_max, recipe)",
            )
        else:
            scaled_max = np.float32(np.float32(q.fp8_max) * np.exp2(np.float32(-p.margin)))
            ok = jnp.isfinite(amax) & (amax > 0)
            s = jnp.float32(scaled_max) / jnp.where(ok, amax, jnp.float32(1.0))
            s = jnp.where(jnp.isinf(s), jnp.float32(FLT_MAX), s)
            new_scale = jnp.where(ok, s, scale)
        new[f"{role}_scale"] = jnp.reshape(new_scale, (1,)).astype(_F32)
        new[f"{role}_amax_history"] = jnp.roll(history, -1).at[0].set(0.0)
    return new


def _one_value(value, algo: str, args: str):
    """A DelayedScaling callable's result as an fp32 scalar; it must hold one value."""
    value = jnp.asarray(value, _F32)
    if value.size != 1:
        raise ValueError(
            f"DelayedScaling.{algo}: expected the callable to return one value (shape () or (1,)) "
            f"from {args}, got shape {tuple(value.shape)}"
        )
    return jnp.reshape(value, ())


def _update_fused(state: dict, amaxes: dict, roles: dict[str, Quantizer], p) -> dict:
    # One custom call with fresh results: updating the state operands in place would make XLA
    # copy them (they are the step's parameters) before the call.
    operands, results = [], []
    for role in roles:
        history = state[f"{role}_amax_history"]
        operands += [history, state[f"{role}_scale"], jnp.reshape(amaxes[role], (1,)).astype(_F32)]
        results += [
            _ops.TensorSpec(tuple(history.shape), _ops.FLOAT32),
            _ops.TensorSpec((1,), _ops.FLOAT32),
        ]
    out = _ffi.call(
        _ffi.DELAYED_UPDATE,
        results,
        *operands,
        fp8_max=np.array([q.fp8_max for q in roles.values()], np.float32),
        margin=np.float32(p.margin),
        amax_compute_algo=np.int32(_ALGOS[p.amax_compute_algo]),
    )
    new = {}
    for i, role in enumerate(roles):
        new[f"{role}_amax_history"] = out[2 * i]
        new[f"{role}_scale"] = out[2 * i + 1]
    return new
