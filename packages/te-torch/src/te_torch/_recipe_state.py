"""Delayed-scaling state of a module, and the batched update of many modules' state.

A module that runs a GEMM under ``recipe.DelayedScaling`` owns two ``DelayedState`` objects
(NUMERICS.md "DelayedScaling"; TE's layout):

    forward   amax_history fp32 [L, 3]  scale fp32 [3]   roles: input, weight, output
    backward  amax_history fp32 [L, 2]  scale fp32 [2]   roles: grad_output, grad_input

Row 0 of a history is this step's staging slot: te's delayed quantizers (Float8Quantizer) read
``scale[i]`` and max-accumulate their amax into ``amax_history[0, i]`` (a [1] view), so a module
used twice in one step records the larger amax. A ``Plan`` turns registered histories into
new scales and rolls them, in one ``_C.DelayedScalingUpdate`` call (one launch on CUDA) built once
per unchanged list of registrations: te_torch._autocast decides when (forward states when the outermost
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

    __slots__ = ("amax_history", "scale", "_descs", "pending")

    def __init__(self, history_len: int, n: int, device: torch.device) -> None:
        self.amax_history = torch.zeros(history_len, n, dtype=torch.float32, device=device)
        self.scale = torch.ones(n, dtype=torch.float32, device=device)
        self._descs = None
        # (flush count, backward pass) of its last backward registration (te_torch._autocast):
        # its update is pending while the flush count is still the current one
        self.pending = None

    def __deepcopy__(self, memo) -> DelayedState:
        new = DelayedState.__new__(DelayedState)
        new.amax_history = self.amax_history.clone()
        new.scale = self.scale.clone()
        new._descs = None  # descriptors point at the original's buffers
        new.pending = None
        return new

    def __getstate__(self) -> dict:
        """Pickling (``torch.save`` of a whole module): the buffers, not their C descriptors."""
        return {"amax_history": self.amax_history, "scale": self.scale}

    def __setstate__(self, state: dict) -> None:
        self.amax_history, self.scale = state["amax_history"], state["scale"]
        self._descs = None
        self.pending = None

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
    (one update call reaches one device). Last, the device's CUDA index (-1: not CUDA), which the
    per-step stream checks read: torch.device.type costs ~0.25 us a read on the CPU."""
    fmt = recipe.fp8_format
    fp8_max = float(fmt.max_bwd if backward else fmt.max_fwd)
    dev = torch.device(device)
    cuda_index = -1
    if dev.type == "cuda":
        cuda_index = torch.cuda.current_device() if dev.index is None else dev.index
    return (
        fp8_max,
        float(recipe.margin),
        recipe.amax_compute_algo,
        recipe.scaling_factor_compute_algo,
        bool(recipe.reduce_amax),
        group,
        dev,
        cuda_index,
    )


class UpdateRegistry:
    """The ``(recipe_key, recipe, state)`` entries quantized with since the last update, in
    call order. A state used twice appears twice: its plan (``plan_for``) keeps it once, and is
    built once per distinct list, so registering costs one append per call."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list = []

    def add(self, entry: tuple) -> None:
        self.entries.append(entry)

    def take(self) -> list:
        """The entries, forgetting them."""
        entries = self.entries
        if entries:
            self.entries = []
        return entries


_dist = torch.distributed if torch.distributed.is_available() else None
# torch.distributed.is_initialized() is three Python calls deep; its answer is this attribute
_world = getattr(getattr(_dist, "distributed_c10d", None), "_world", None)
if not hasattr(_world, "_default_pg"):
    _world = None


def dist_initialized() -> bool:
    """torch.distributed.is_initialized(), read directly where this torch allows."""
    if _world is not None:
        return _world._default_pg is not None
    return _dist is not None and _dist.is_initialized()


def _reduce_amax(states: tuple, group) -> None:
    """All-reduce (max) the staging rows of ``states`` over ``group``, in one collective (run_plan
    calls it only where torch.distributed is initialized)."""
    dist = _dist
    if dist.get_world_size(group) == 1:
        return
    rows = [s.amax_history[0] for s in states]
    flat = torch.cat(rows)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)
    for row, new in zip(rows, flat.split([r.numel() for r in rows]), strict=True):
        row.copy_(new)


class Plan:
    """The update of one list of entries, prepared once: ``calls`` the built-in algorithms as
    one ``_C.DelayedScalingUpdate`` per device (with the device index its stream is read from),
    ``hooks`` the states with user callables (TE's hooks), ``reduce`` the (states, group) pairs
    whose amaxes are all-reduced first, ``devices`` the indices of the CUDA devices the entries'
    keys name."""

    __slots__ = ("entries", "calls", "hooks", "reduce", "devices")

    def __init__(self, entries: tuple) -> None:
        self.entries = entries  # held, so no id in the plan's key is reused while it lives
        groups: dict[tuple, tuple] = {}
        seen = set()
        for key, recipe, st in entries:
            if id(st) in seen:
                continue
            seen.add(id(st))
            g = groups.get(key)
            if g is None:
                g = groups[key] = (recipe, [])
            g[1].append(st)
        fast: dict[torch.device, list] = {}
        hooks, reduce = [], []
        for key, (recipe, states) in groups.items():
            fp8_max, margin, algo, sf_algo, reduce_amax, group, dev, _ = key
            if reduce_amax:
                reduce.append((tuple(states), group))
            if callable(algo) or sf_algo is not None:
                hooks.extend((s, fp8_max, margin, algo, sf_algo, recipe) for s in states)
            else:
                fast.setdefault(dev, []).append((fp8_max, margin, _ALGO[algo], states))
        self.calls = tuple(_prepare(gs) for gs in fast.values())
        self.hooks, self.reduce = tuple(hooks), tuple(reduce)
        self.devices = tuple(dict.fromkeys(key[7] for key in groups if key[7] >= 0))


def _prepare(groups: list) -> tuple:
    args = []
    for fp8_max, margin, algo, states in groups:
        hists, scales = zip(*(s.descs() for s in states), strict=True)
        args.append((list(hists), list(scales), fp8_max, margin, algo))
    return _C.DelayedScalingUpdate(args), groups[0][3][0].scale.get_device()


# Plans by the ids of the entries they update: a training loop registers the same entry objects
# (each FP8Context keeps its own) every step, so after the first step an update is one lookup and
# one C call per device. DelayedState.replace clears the table when buffers move.
_PLANS: dict[tuple, Plan] = {}
_MAX_PLANS = 16


def plan_for(entries: list) -> Plan:
    key = tuple(map(id, entries))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = Plan(tuple(entries))
    return plan


def needs_collective(plan: Plan) -> bool:
    """Whether running ``plan`` all-reduces amaxes across ranks (reduce_amax, several ranks):
    such an update must run at the same point on every rank."""
    if not plan.reduce or not dist_initialized():
        return False
    return any(_dist.get_world_size(group) > 1 for _, group in plan.reduce)


def run_plan(plan: Plan) -> None:
    """NUMERICS.md's delayed-scaling update of every state of ``plan``: amaxes all-reduced first
    where the key says so, user callables in Python, the built-in algorithms in one C call per
    device."""
    if plan.reduce and dist_initialized():
        for states, group in plan.reduce:
            _reduce_amax(states, group)
    for hook in plan.hooks:
        _update_python(*hook)
    for update, dev in plan.calls:
        update(_raw_stream(dev) if dev >= 0 else 0)


def run_updates(entries: list) -> None:
    """Updates the states of ``entries`` (``UpdateRegistry.take``) now."""
    if entries:
        run_plan(plan_for(entries))


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
