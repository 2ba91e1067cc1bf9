"""What te_jax.flax's modules share: the recipe autocast set, DelayedScaling state in the
``fp8_metas`` collection, logical axis names -> PartitionSpecs, parameter helpers."""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from te_jax import _dtypes, _sharding
from te_jax._autocast import get_autocast_state
from te_jax._quantizer import Plan, plan_for

FP8_COLLECTION_NAME = "fp8_metas"


def active_plan() -> tuple[object, Plan]:
    """(recipe, Plan) of the innermost autocast region: (None, high precision) outside one or
    with ``enabled=False``."""
    state = get_autocast_state()
    recipe = state.recipe if state.enabled else None
    return recipe, plan_for(recipe)


def recipe_state(module: nn.Module, roles: dict, plan: Plan) -> dict | None:
    """The module's DelayedScaling variables for ``roles`` ({"<role>_scale": [1],
    "<role>_amax_history": [amax_history_len]} in FP8_COLLECTION_NAME), created at init; None
    for recipes without state."""
    if plan.delayed is None:
        return None
    n = plan.delayed.amax_history_len
    out = {}
    for role in roles:
        for suffix, init, shape in (("scale", jnp.ones, (1,)), ("amax_history", jnp.zeros, (n,))):
            name = f"{role}_{suffix}"
            if not module.is_initializing() and not module.has_variable(FP8_COLLECTION_NAME, name):
                raise ValueError(
                    f"{type(module).__name__}: DelayedScaling needs the variable "
                    f"{FP8_COLLECTION_NAME}/{name}, which the variables passed to apply lack; "
                    "initialise the model (model.init) inside te_jax.autocast(enabled=True, "
                    "recipe=DelayedScaling(...)) and pass its 'fp8_metas' collection along with 'params'"
                )
            value = module.variable(FP8_COLLECTION_NAME, name, init, shape, jnp.float32).value
            if tuple(value.shape) != shape:
                raise ValueError(
                    f"{type(module).__name__}: {FP8_COLLECTION_NAME}/{name}: expected shape {shape} "
                    f"(the recipe's amax_history_len={n}), got {tuple(value.shape)}; re-initialise "
                    "the fp8_metas collection under this recipe"
                )
            out[name] = value
    return out


def sr_rng(module: nn.Module, plan: Plan):
    """NVFP4's stochastic-rounding key from the 'sr_rng' stream (None when not needed or not
    given: the op then says what is missing)."""
    if plan.grad is None or not plan.grad.stochastic_rounding or not module.has_rng("sr_rng"):
        return None
    return module.make_rng("sr_rng")


def _te_rules() -> list[tuple[str, object]]:
    """Logical axis rules from autocast's MeshResource, after the user's own rules."""
    resource = get_autocast_state().mesh_resource
    if resource is None:
        return []
    batch = _sharding.spec_entry(resource.batch_axes)
    tp = resource.tp_resource
    return [
        ("batch", batch),
        ("mlp", tp),
        ("heads", tp),
        ("joined_kv", tp),
        ("act", None),
        ("embed", None),
        ("length", None),
    ]


def to_spec(axes: Sequence[str | None] | None, ndim: int, name: str) -> P | None:
    """The PartitionSpec of logical ``axes`` under the user's flax logical axis rules (then
    te_jax's from MeshResource); None without axes or outside a mesh."""
    check_axes_names(axes, name)
    if not axes:
        return None
    axes = tuple(axes)
    if len(axes) != ndim:
        raise ValueError(f"{name}: expected {ndim} logical axis names (one per dim), got {axes}")
    if _sharding.context_mesh() is None:
        return None
    rules = list(nn.get_logical_axis_rules()) + _te_rules()
    return nn.logical_to_mesh_axes(axes, rules)


def merge(entries: Sequence, name: str):
    """The spec entry of dims flattened into one: the major split dim's axes, provided every
    later (minor) dim is whole; otherwise a ValueError (the flattened dim's pieces would not
    be contiguous)."""
    split = [i for i, e in enumerate(entries) if e is not None]
    if not split:
        return None
    if len(split) > 1:
        raise ValueError(
            f"{name}: dims flattened into one GEMM dim may split only one of them, got {tuple(entries)}"
        )
    return entries[split[0]]


def gathered(entries: Sequence, x_entries: Sequence) -> tuple:
    """A kernel's spec entries without the axes that split the activations' rows: a weight
    stored split over the batch axes (FSDP) is gathered for the GEMM, as FSDP means."""
    rows = {a for e in x_entries[:-1] for a in _sharding.entry_axes(e)}
    out = []
    for e in entries:
        kept = tuple(a for a in _sharding.entry_axes(e) if a not in rows)
        out.append(_sharding.spec_entry(kept))
    return tuple(out)


def entries_of(spec: P | None, ndim: int) -> tuple:
    if spec is None:
        return (None,) * ndim
    e = tuple(spec)
    return e + (None,) * (ndim - len(e))


def param(module: nn.Module, name: str, init, shape, dtype, axes, axes_name: str):
    """A parameter, annotated with its logical axes (when given) for nn.get_partition_spec."""
    check_axes_names(axes, axes_name)
    if axes:
        if len(tuple(axes)) != len(shape):
            raise ValueError(
                f"{axes_name}: expected {len(shape)} logical axis names for {name} of shape "
                f"{tuple(shape)}, got {tuple(axes)}"
            )
        init = nn.with_logical_partitioning(init, tuple(axes))
    return module.param(name, init, shape, dtype)


def stacked_init(init, count: int):
    """An initializer of [H, count, F] that draws each [H, F] slice as ``init`` would (so each
    activation's slice keeps its own fan-in), as TE's LayerNormMLP does."""

    def fn(key, shape, dtype=jnp.float32):
        h, a, f = shape
        keys = jax.random.split(key, a)
        return jnp.stack([init(k, (h, f), dtype) for k in keys], axis=1)

    return fn


def canonical_axes(axis, ndim: int, name: str = "axis") -> tuple[int, ...]:
    """``axis`` (int or tuple) as sorted non-negative dims, which must be x's trailing dims."""
    if isinstance(axis, bool) or not isinstance(axis, (int, tuple, list)):
        raise ValueError(f"{name}: expected an int or a tuple of ints (dims of x), got {axis!r}")
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if not axes or not all(
        isinstance(a, int) and not isinstance(a, bool) and -ndim <= a < ndim for a in axes
    ):
        raise ValueError(f"{name}: expected dims of an input with {ndim} dims, got {axis!r}")
    axes = tuple(sorted(a % ndim for a in axes))
    if axes != tuple(range(ndim - len(axes), ndim)):
        raise ValueError(
            f"{name}: expected the input's trailing dims (te_jax contracts over them), got {axis!r}"
        )
    return axes


def default_kernel_init():
    return nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def check_axes_names(axes, name: str) -> None:
    """Logical axis names must come as a tuple: a bare string would be read name by character."""
    if isinstance(axes, str):
        raise TypeError(
            f"{name}: expected a tuple of logical axis names (one per dim), got the string {axes!r}; "
            f"write ({axes!r},) for one dim"
        )


def check_size(module: nn.Module, name: str, value, allow_tuple: bool = True) -> tuple[int, ...]:
    """A module's size argument (an int >= 1, or with ``allow_tuple`` a non-empty tuple of
    them) as a tuple."""

    def is_size(d):
        return isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) and d >= 1

    if is_size(value):
        return (int(value),)
    is_tuple = isinstance(value, (tuple, list)) and len(value) > 0
    if not (allow_tuple and is_tuple and all(is_size(d) for d in value)):
        what = "an int >= 1 or a non-empty tuple of them" if allow_tuple else "an int >= 1"
        raise ValueError(f"{type(module).__name__}.{name}: expected {what}, got {value!r}")
    return tuple(int(d) for d in value)


def check_param_dtype(module: nn.Module):
    """A module's ``dtype`` (its parameters'): float32, bfloat16 or float16 after JAX's
    canonicalization (float64 is float32 unless jax_enable_x64 is set)."""
    try:
        dtype = jax.dtypes.canonicalize_dtype(module.dtype)
    except TypeError:
        dtype = module.dtype
    return _dtypes.as_dtype(dtype, f"{type(module).__name__}.dtype (the parameters')", _dtypes.SOURCE)


def check_contracted(module: nn.Module, x_shape, axes) -> None:
    """The contracted dims of x must hold at least one element (K >= 1)."""
    k = math.prod(x_shape[a] for a in axes)
    if k < 1:
        raise ValueError(
            f"{type(module).__name__}: expected x's contracted dims {tuple(axes)} to hold at least "
            f"one element (K >= 1), got x of shape {tuple(x_shape)}"
        )
