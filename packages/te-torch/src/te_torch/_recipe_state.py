"""Delayed-scaling state of a module, and the batched update of many modules' state.

A module that runs a GEMM under ``recipe.DelayedScaling`` owns two ``DelayedState`` objects
(NUMERICS.md "DelayedScaling"; TE's layout):

    forward   amax_history fp32 [L, 3]  scale fp32 [3]   roles: input, weight, output
    backward  amax_history fp32 [L, 2]  scale fp32 [2]   roles: grad_output, grad_input

Row 0 of a history is this step's staging slot: te's delayed quantizers (Float8Quantizer) read
``scale[i]`` and max-accumulate their amax into ``amax_history[0, i]`` (a [1] view), so a module
used twice in one step records the larger amax. ``run_updates`` turns registered histories into
new scales and rolls them, in one ``_C.DelayedScalingUpdate`` call (one launch on CUDA) built once
per unchanged set of states: te_torch._autocast decides when (forward states when the outermost
``autocast`` exits, backward states with them or before anything reads them). Before it, when the
recipe says ``reduce_amax`` and torch.distributed is initialized, the staging rows are
all-reduced (max) over the amax reduction group in one collective.
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch import _kernels
from te_torch._kernels import _raw_stream

_ALGO = {"max": int(_C.AmaxComputeAlgo.MAX), "most_recent": int(_C.AmaxComputeAlgo.MOST_RECENT)}
_FLT_MAX = torch.finfo(torch.float32).max


class DelayedState:
    """amax_history [L, n] and scale [n] (fp32) of one direction of one module."""

    __slots__ = ("amax_history", "scale", "_descs", "deferred")

    def __init__(self, history_len: int, n: int, device: torch.device) -> None:
        self.amax_history = torch.zeros(history_len, n, dtype=torch.float32, device=device)
        self.scale = torch.ones(n, dtype=torch.float32, device=device)
        self._descs = None
        self.deferred = False  # its update waits in te_torch._autocast's deferred list

    def __deepcopy__(self, memo) -> DelayedState:
        new = DelayedState.__new__(DelayedState)
        new.amax_history = self.amax_history.clone()
        new.scale = self.scale.clone()
        new._descs = None  # descriptors point at the original's buffers
        new.deferred = False
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
        self.replace(new, self.scale)

    def move_to(self, device: torch.device) -> None:
        if self.scale.device != device:
            self.replace(self.amax_history.to(device), self.scale.to(device))

    def replace(self, amax_history: torch.Tensor, scale: torch.Tensor) -> None:
        """New buffers: the descriptors and every prepared update naming the old ones are dropped."""
        self.amax_history, self.scale, self._descs = amax_history, scale, None
        _PLANS.clear()


def recipe_key(recipe, backward: bool, group, device: torch.device) -> tuple:
    """States updated together share fp8_max, margin, amax algorithm, reduction group and device
    (one update call reaches one device)."""
    fmt = recipe.fp8_format
    fp8_max = float(fmt.max_bwd if backward else fmt.max_fwd)
    return (
        fp8_max,
        float(recipe.margin),
        recipe.amax_compute_algo,
        recipe.scaling_factor_compute_algo,
        bool(recipe.reduce_amax),
        group,
        torch.device(device),
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

    def take(self) -> list:
        """The pending states as ``run_updates`` groups, (key, recipe, states), forgetting them."""
        pending, recipes = self.pending, self.recipes
        if not pending:
            return []
        self.pending, self.recipes = {}, {}
        return [(key, recipes[key], tuple(group.values())) for key, group in pending.items()]


_dist = torch.distributed if torch.distributed.is_available() else None


def needs_collective(groups: list) -> bool:
    """Whether updating ``groups`` all-reduces amaxes across ranks (reduce_amax, several ranks):
    such an update must run at the same point on every rank."""
    if _dist is None or not _dist.is_initialized():
        return False
    return any(key[4] and _dist.get_world_size(key[5]) > 1 for key, _, _ in groups)


def _reduce_amax(states: tuple, group) -> None:
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


# Prepared updates (_C.DelayedScalingUpdate and the device of its states) by the groups they
# update: a training loop updates the same states every step, so after the first step an update
# is one lookup and one C call. Keys hold the states, so an id is never reused while its plan
# lives; DelayedState.replace clears the table when buffers move.
_PLANS: dict[tuple, tuple] = {}
_MAX_PLANS = 16


def _prepare(groups: tuple) -> tuple:
    args = []
    for key, states in groups:
        fp8_max, margin, algo = key[0], key[1], key[2]
        hists, scales = zip(*(s.descs() for s in states), strict=True)
        args.append((list(hists), list(scales), fp8_max, margin, _ALGO[algo]))
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    plan = _PLANS[groups] = (_C.DelayedScalingUpdate(args), groups[0][1][0].scale.get_device())
    return plan


def run_updates(groups: list) -> None:
    """NUMERICS.md's delayed-scaling update of every state in ``groups`` ((key, recipe, states)
    triples, ``UpdateRegistry.take``): amaxes all-reduced first where the key says so, the
    built-in algorithms in one C call, user callables (TE's hooks) in Python."""
    if not groups:
        return
    fast = []
    for key, recipe, states in groups:
        fp8_max, margin, algo, sf_algo, reduce_amax, group, _ = key
        if reduce_amax:
            _reduce_amax(states, group)
        if callable(algo) or sf_algo is not None:
            for s in states:
                _update_python(s, fp8_max, margin, algo, sf_algo, recipe)
        else:
            fast.append((key, states))
    if not fast:
        return
    device = fast[0][0][6]
    if any(key[6] != device for key, _ in fast):  # states on several devices: a call per device
        for dev in dict.fromkeys(key[6] for key, _ in fast):
            _run(tuple(g for g in fast if g[0][6] == dev))
        return
    _run(tuple(fast))


def _run(fast: tuple) -> None:
    plan = _PLANS.get(fast)
    if plan is None:
        plan = _prepare(fast)
    update, dev = plan
    update(_raw_stream(dev) if dev >= 0 else 0)


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
