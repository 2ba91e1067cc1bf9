"""Delayed-scaling state of a module, and the batched update of many modules' state.

A module that runs a GEMM under ``recipe.DelayedScaling`` owns two ``DelayedState`` objects
(NUMERICS.md "DelayedScaling"; TE's layout):

    forward   amax_history fp32 [L, 3]  scale fp32 [3]   roles: input, weight, output
    backward  amax_history fp32 [L, 2]  scale fp32 [2]   roles: grad_output, grad_input

Row 0 of a history is this step's staging slot: te's delayed quantizers (Float8Quantizer) read
``scale[i]`` and max-accumulate their amax into ``amax_history[0, i]`` (a [1] view), so a module
used twice in one step records the larger amax. At the update, one ``_C.delayed_scaling_update``
call (one launch on CUDA) turns every registered history into new scales and rolls it:
forward states when the outermost ``autocast`` exits, backward states once the autograd engine
finishes the backward pass (a queued callback). Before it, when the recipe says ``reduce_amax``
and torch.distributed is initialized, the staging rows are all-reduced (max) over the amax
reduction group in one collective.
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch import _kernels

_ALGO = {"max": int(_C.AmaxComputeAlgo.MAX), "most_recent": int(_C.AmaxComputeAlgo.MOST_RECENT)}
_FLT_MAX = torch.finfo(torch.float32).max


class DelayedState:
    """amax_history [L, n] and scale [n] (fp32) of one direction of one module."""

    __slots__ = ("amax_history", "scale", "_descs")

    def __init__(self, history_len: int, n: int, device: torch.device) -> None:
        self.amax_history = torch.zeros(history_len, n, dtype=torch.float32, device=device)
        self.scale = torch.ones(n, dtype=torch.float32, device=device)
        self._descs = None

    def __deepcopy__(self, memo) -> DelayedState:
        new = DelayedState.__new__(DelayedState)
        new.amax_history = self.amax_history.clone()
        new.scale = self.scale.clone()
        new._descs = None  # descriptors point at the original's buffers
        return new

    def amax(self, i: int) -> torch.Tensor:
        """The [1] staging slot of role i (what a Float8Quantizer max-accumulates into)."""
        return self.amax_history[0, i : i + 1]

    def scale_of(self, i: int) -> torch.Tensor:
        return self.scale[i : i + 1]

    def descs(self) -> tuple:
        """Descriptors of (amax_history, scale), built once (the buffers never move)."""
        if self._descs is None:
            self._descs = (_kernels.desc(self.amax_history), _kernels.desc(self.scale))
        return self._descs

    def resize(self, history_len: int) -> None:
        """Changes L in place, keeping the newest min(L, old L) rows (TE's adjust_amax_history_length)."""
        old = self.amax_history
        if old.shape[0] == history_len:
            return
        new = torch.zeros(history_len, old.shape[1], dtype=old.dtype, device=old.device)
        k = min(history_len, old.shape[0])
        new[:k] = old[:k]
        self.amax_history = new
        self._descs = None


def recipe_key(recipe, backward: bool, group) -> tuple:
    """States updated together share fp8_max, margin, amax algorithm and reduction group."""
    fmt = recipe.fp8_format
    fp8_max = float(fmt.max_bwd if backward else fmt.max_fwd)
    return (
        fp8_max,
        float(recipe.margin),
        recipe.amax_compute_algo,
        recipe.scaling_factor_compute_algo,
        bool(recipe.reduce_amax),
        group,
    )


class UpdateRegistry:
    """The states quantized with since the last update, grouped by ``recipe_key``."""

    __slots__ = ("pending", "recipes")

    def __init__(self) -> None:
        self.pending: dict[tuple, dict[int, DelayedState]] = {}
        self.recipes: dict[tuple, object] = {}

    def add(self, key: tuple, recipe, state: DelayedState) -> None:
        group = self.pending.get(key)
        if group is None:
            group = self.pending[key] = {}
            self.recipes[key] = recipe
        group[id(state)] = state

    def flush(self) -> None:
        """Updates every pending state (one batched call per recipe key) and forgets them."""
        pending, recipes = self.pending, self.recipes
        if not pending:
            return
        self.pending, self.recipes = {}, {}
        for key, group in pending.items():
            update(list(group.values()), key, recipes[key])


_dist = torch.distributed if torch.distributed.is_available() else None


def _reduce_amax(states: list[DelayedState], group) -> None:
    """All-reduce (max) the staging rows of ``states`` over ``group``, in one collective."""
    dist = _dist
    if dist is None or not dist.is_initialized():
        return
    if dist.get_world_size(group) == 1:
        return
    rows = [s.amax_history[0] for s in states]
    flat = torch.cat(rows)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)
    for row, new in zip(rows, flat.split([r.numel() for r in rows]), strict=True):
        row.copy_(new)


def update(states: list[DelayedState], key: tuple, recipe) -> None:
    """NUMERICS.md's delayed-scaling update of ``states`` (all of one recipe key)."""
    fp8_max, margin, algo, sf_algo, reduce_amax, group = key
    if reduce_amax:
        _reduce_amax(states, group)
    if callable(algo) or sf_algo is not None:
        for s in states:
            _update_python(s, fp8_max, margin, algo, sf_algo, recipe)
        return
    hists, scales = zip(*(s.descs() for s in states), strict=True)
    stream = _kernels.stream_of(states[0].scale)
    _C.delayed_scaling_update(list(hists), list(scales), fp8_max, margin, _ALGO[algo], stream)


def _update_python(s: DelayedState, fp8_max, margin, algo, sf_algo, recipe) -> None:
    """The same update with a user callable for the amax and/or the scale (TE's hooks)."""
    h = s.amax_history
    if callable(algo):
        amax = algo(h)
    elif algo == "max":
        amax = h.amax(dim=0)
    else:
        amax = h[0]
    amax = amax.to(torch.float32)
    if sf_algo is not None:
        new = sf_algo(amax, s.scale, fp8_max, recipe)
    else:
        new = (fp8_max / amax) / (2.0**margin)
        new = torch.where(torch.isinf(new), torch.full_like(new, _FLT_MAX), new)
        ok = torch.isfinite(amax) & (amax > 0)
        new = torch.where(ok, new, s.scale)
    s.scale.copy_(new)
    rolled = torch.roll(h, -1, dims=0)
    rolled[0] = 0
    h.copy_(rolled)
