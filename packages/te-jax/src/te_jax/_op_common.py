"""What te_jax's fused ops share around their custom_vjp rules: argument checks, the split of
their operands over the mesh (and the block alignment it needs), DelayedScaling state."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from te_jax import _delayed, _dtypes
from te_jax._quantizer import MX_BLOCK, Plan
from te_jax._sharding import Axes, Layout, entry_axes

FP8_BLOCK = 128  # Float8BlockScaling's 1x128 / 128x128


def array(value, name: str) -> jax.Array:
    """A jax array of a source dtype (float32, bfloat16, float16), else TypeError naming it."""
    if not isinstance(value, jax.Array):
        try:
            value = jnp.asarray(value)
        except (TypeError, ValueError):
            raise TypeError(f"{name}: expected a jax array, got {type(value).__name__}") from None
    _dtypes.as_dtype(value.dtype, f"{name}.dtype", _dtypes.SOURCE)
    return value


def block_length(plan: Plan) -> int | None:
    """The block length the plan's quantizers group elements in (None: per-tensor or high
    precision)."""
    q = plan.x
    if q is None or q.kind in ("current", "delayed"):
        return None
    if q.kind == "block":
        return FP8_BLOCK
    return MX_BLOCK[q.kind]


def row_axes(entries) -> Axes:
    """The mesh axes of an activation's leading (row) dims, in order."""
    return tuple(a for e in entries[:-1] for a in entry_axes(e))


def check_blocks(plan: Plan, lay: Layout, operands) -> None:
    """Blocks must not straddle shards, or sharded numbers would differ from unsharded ones.

    ``operands``: (name, global shape, spec entries, is_activation) each. A split dim's local
    size must be a multiple of the block length; for an activation's rows (the [M, K] view's
    M, flattened from the leading dims) the local rows form runs of consecutive global rows,
    and the run length must be the multiple.
    """
    block = block_length(plan)
    if block is None or not lay.sharded:
        return
    for name, shape, entries, activation in operands:
        lead = len(shape) - 1 if activation else 0
        for d in range(lead, len(shape)):
            axes = entry_axes(entries[d])
            if axes and (shape[d] // lay.size(axes)) % block:
                raise ValueError(
                    f"{name}: dim {d} is split over {axes} into pieces of {shape[d] // lay.size(axes)}; "
                    f"{_block_name(plan)} needs a multiple of {block} so blocks stay on one device"
                )
        if activation:
            split = [d for d in range(lead) if entry_axes(entries[d])]
            if split:
                j = split[-1]
                run = shape[j] // lay.size(entry_axes(entries[j])) * math.prod(shape[j + 1 : lead])
                if run % block:
                    raise ValueError(
                        f"{name}: its rows (leading dims {tuple(shape[:lead])}) are split into runs of "
                        f"{run} consecutive rows; {_block_name(plan)} needs a multiple of {block} so "
                        "blocks stay on one device"
                    )


# the per-tensor and block FP8 kinds (cuBLASLt's multiple-of-16 rule; _token_pad), by recipe
FP8_RECIPE_OF_KIND = {
    "delayed": "DelayedScaling",
    "current": "Float8CurrentScaling",
    "block": "Float8BlockScaling",
}


def check_fp8_sizes(plan: Plan, sizes) -> None:
    """Per-tensor and block FP8: each GEMM size in ``sizes`` ((description, size on one
    shard) pairs) must be a multiple of 16, as cuBLASLt's FP8 GEMMs need (TE has the rule too);
    checked on every platform, so what runs on the CPU backend runs on a GPU. Token counts are
    padded instead (_token_pad)."""
    name = None if plan.x is None else FP8_RECIPE_OF_KIND.get(plan.x.kind)
    if name is None:
        return
    for what, n in sizes:
        if n % 16:
            raise ValueError(
                f"{what}: {name} runs the GEMMs in FP8, whose cuBLASLt kernels need every dimension "
                f"a multiple of 16, and it is {n}; use a size that is (per shard where it is split), "
                "or run the layer without a recipe (high precision)"
            )


def _block_name(plan: Plan) -> str:
    return {"block": "Float8BlockScaling", "mxfp8": "MXFP8BlockScaling", "nvfp4": "NVFP4BlockScaling"}[
        plan.x.kind
    ]


def check_state(plan: Plan, state, roles: dict, name: str = "recipe_state"):
    return _delayed.check(state, roles, plan, name)


def check_rng(plan: Plan, rng):
    """NVFP4's stochastic-rounding key; None where no role rounds stochastically (a key given
    anyway is unused). A missing key is reported where the gradient is quantized."""
    if rng is None or plan.grad is None or not plan.grad.stochastic_rounding:
        return None
    if not isinstance(rng, jax.Array):
        raise TypeError(f"rng: expected a jax.random key, got {type(rng).__name__}")
    return rng


def dtype_of(value) -> np.dtype | None:
    return None if value is None else np.dtype(value.dtype)
