"""Public helpers for DelayedScaling state: its initial value per op, and TE's
``update_collections`` for carrying it from one training step to the next."""

from __future__ import annotations

from collections.abc import Mapping

from te_jax import _delayed, _dense, _layernorm_mlp
from te_jax._quantizer import plan_for

_OPS = {
    "dense": _dense.roles_of,
    "layernorm_dense": _dense.roles_of,
    "layernorm_mlp": _layernorm_mlp.roles_of,
}


def init_recipe_state(recipe, op: str) -> dict | None:
    """The initial ``recipe_state`` of te_jax ``op`` ("dense", "layernorm_dense",
    "layernorm_mlp") under ``recipe``: {"<role>_scale": ones (1,), "<role>_amax_history": zeros
    (amax_history_len,)} per quantized role for DelayedScaling; None for every other recipe
    (they keep no state)."""
    if op not in _OPS:
        raise ValueError(f"op: expected one of {', '.join(map(repr, _OPS))}, got {op!r}")
    plan = plan_for(recipe)
    if plan.delayed is None:
        return None
    return _delayed.init(_OPS[op](plan), plan)


def update_collections(new: Mapping, original: Mapping) -> dict:
    """``original`` with every collection (and nested entry) present in ``new`` replaced by
    ``new``'s; e.g. ``update_collections({"fp8_metas": grads["fp8_metas"]}, variables)`` carries
    DelayedScaling state into the next step. Returns a new dict; neither argument changes."""
    if not isinstance(new, Mapping) or not isinstance(original, Mapping):
        raise TypeError(
            f"new, original: expected mappings (Flax variable dicts), got {type(new).__name__} and "
            f"{type(original).__name__}"
        )
    out = dict(original)
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = update_collections(value, out[key])
        else:
            out[key] = value
    return out
