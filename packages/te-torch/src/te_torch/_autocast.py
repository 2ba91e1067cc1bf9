"""``te.autocast``: the region in which te's modules run their GEMMs quantized.

A class-based context manager (cheap to enter and leave, as in TE). Entering sets the process-
wide ``STATE`` that modules read once per call (``STATE.fp8``, ``STATE.recipe``...); leaving
restores the enclosing region's values. Regions nest: an inner region overrides ``enabled``,
``calibrating``, ``recipe`` and the group for what runs inside it. When the outermost region
exits, the forward delayed-scaling state of every module quantized anywhere inside is updated in
one batched call (te_torch._recipe_state). One instance cannot be entered again while it is
active (RuntimeError), as in TE.

Backward state is updated once per backward pass, as in TE, but launched later: a backward pass
only marks its states deferred, and their update runs in the same call (one launch) as the next
outermost region's forward update, or earlier, before anything reads them: a later backward pass
quantizing with one of them again (interleaved microbatches), ``state_dict()``, moving or
resizing the state, ``te.make_graphed_callables``. So every reader sees the updated state, and a
training step makes one update call instead of two (each a C call and a launch, a sizeable part
of a small layer's host time: benchmarks/NOTES.md). A state is deferred as it registers, with no
end-of-pass callback (the engine's callback and its bookkeeping were ~8k instructions of a small
Linear step); each state remembers the pass that registered it and the flush count then, which
is how a later pass finds it still pending. Where torch.distributed is initialized (the update
may all-reduce amaxes across ranks) or the pass runs on a CUDA side stream (graph capture and its
warmup steps), the states wait for the pass's end in an end-of-pass callback instead, which
updates them there when it must: every rank must reach the collective at the same point, and a
captured update must be inside the graph.
"""

from __future__ import annotations

import warnings

import torch
from te_core.recipe import Recipe

from te_torch._availability import get_default_recipe
from te_torch._kernels import _raw_stream
from te_torch._recipe_state import (
    UpdateRegistry,
    dist_initialized,
    needs_collective,
    plan_for,
    run_plan,
    run_updates,
)

__all__ = ["autocast", "fp8_autocast", "is_fp8_enabled", "get_fp8_recipe"]


class _State:
    """What modules read per call. ``fp8``: quantize GEMMs; ``calibrating``: record amaxes
    of high-precision GEMMs; ``recipe``/``group``: the active recipe and amax reduction group."""

    __slots__ = (
        "fp8",
        "calibrating",
        "recipe",
        "group",
        "depth",
        "fwd_registry",
        "bwd_registry",
        "bwd_task",
        "outer_task",
        "deferred",
        "flushes",
    )

    def __init__(self) -> None:
        self.fp8 = False
        self.calibrating = False
        self.recipe = None
        self.group = None
        self.depth = 0
        self.fwd_registry = UpdateRegistry()
        self.bwd_registry = UpdateRegistry()
        self.bwd_task = None  # the backward pass (graph task id) whose end _end_backward awaits
        self.outer_task = None  # a pass running a reentrant recomputation's nested one (note_replay)
        self.deferred: list = []  # the registry entries of backward passes, awaiting their update
        self.flushes = 0  # how many times ``deferred`` was updated and emptied


STATE = _State()
_default_recipe = None


def _resolve(recipe, owner: str = "autocast"):
    """``recipe``, or the default recipe for None (made once); a TypeError naming ``owner`` for
    anything but a te recipe."""
    global _default_recipe
    if recipe is None:
        if _default_recipe is None:
            _default_recipe = get_default_recipe()
        return _default_recipe
    if not isinstance(recipe, Recipe):
        raise TypeError(
            f"{owner}: recipe: expected a te.recipe recipe (DelayedScaling(), "
            f"Float8CurrentScaling(), Float8BlockScaling(), ...) or None, got {type(recipe).__name__}"
        )
    return recipe


class autocast:  # noqa: N801 (TE's name)
    """Run te modules' GEMMs in FP8 inside the region.

    Args:
        enabled: quantize GEMMs (FP8) inside the region.
        calibrating: with ``enabled=False``, run in high precision but record the amaxes of
            inputs and weights into the modules' DelayedScaling state (and update its scales on
            exit), so a later FP8 run starts from calibrated scales. With ``enabled=True`` the
            GEMMs are quantized anyway (TE's behaviour); FP8 quantization records amaxes itself.
        recipe: a ``te.recipe`` recipe; None uses ``te.get_default_recipe()``.
        amax_reduction_group: a torch.distributed process group over which DelayedScaling
            amaxes are all-reduced (max) before the update when ``recipe.reduce_amax``; None is
            the default group (used only when torch.distributed is initialized).
    """

    __slots__ = ("enabled", "calibrating", "recipe", "amax_reduction_group", "_saved")

    def __init__(
        self,
        enabled: bool = True,
        calibrating: bool = False,
        recipe: Recipe | None = None,
        amax_reduction_group=None,
        _graph: bool = False,
    ) -> None:
        self.enabled = bool(enabled)
        self.calibrating = bool(calibrating)
        self.recipe = _resolve(recipe) if (enabled or calibrating) else recipe
        self.amax_reduction_group = amax_reduction_group
        self._saved = None

    def __enter__(self) -> autocast:
        if self._saved is not None:
            raise RuntimeError(
                "autocast: this instance is already active; nest a new te.autocast(...) instead "
                "of entering the same one twice"
            )
        s = STATE
        self._saved = (s.fp8, s.calibrating, s.recipe, s.group)
        s.fp8 = self.enabled
        s.calibrating = self.calibrating
        if self.enabled or self.calibrating:
            s.recipe = self.recipe
            s.group = self.amax_reduction_group
        s.depth += 1
        if s.outer_task is not None and s.depth == 1 and _graph_task_id() == -1:
            s.outer_task = None  # that pass raised before its end (note_replay)
        return self

    def __exit__(self, *exc) -> None:
        s = STATE
        s.fp8, s.calibrating, s.recipe, s.group = self._saved
        self._saved = None
        s.depth -= 1
        if s.depth == 0 and exc[0] is None:
            entries = s.fwd_registry.take()
            if s.deferred:
                plan = plan_for(entries + s.deferred)
                if _on_default_streams(plan):
                    s.deferred = []
                    s.flushes += 1
                    run_plan(plan)
                    return
            if entries:
                run_plan(plan_for(entries))
        elif s.depth == 0:  # an exception escaped: drop this step's amaxes from the update list
            s.fwd_registry.take()


def fp8_autocast(
    enabled: bool = True,
    calibrating: bool = False,
    fp8_recipe: Recipe | None = None,
    fp8_group=None,
    _graph: bool = False,
) -> autocast:
    """TE's old spelling of ``autocast`` (``fp8_recipe`` -> recipe, ``fp8_group`` ->
    amax_reduction_group). Deprecated, as in TE."""
    warnings.warn(
        "fp8_autocast is deprecated; use te.autocast(enabled, calibrating, recipe, amax_reduction_group)",
        DeprecationWarning,
        stacklevel=2,
    )
    return autocast(enabled, calibrating, fp8_recipe, fp8_group, _graph)


def is_fp8_enabled() -> bool:
    """Whether the innermost active autocast region quantizes GEMMs."""
    return STATE.fp8


def get_fp8_recipe() -> Recipe | None:
    """The recipe of the innermost active autocast region (None outside any)."""
    return STATE.recipe


def register_forward(entry: tuple) -> None:
    """Queues a ``(recipe_key, recipe, DelayedState)`` entry for the update at the outermost
    region's exit. Callers keep their entry objects: the update's plan is cached by them."""
    STATE.fwd_registry.add(entry)


def register_backward(entry: tuple) -> None:
    """Queues a ``(recipe_key, recipe, DelayedState)`` entry for the update that follows the
    current backward pass (see the module docstring). A state still deferred from an earlier
    pass is updated first."""
    s = STATE
    task = _graph_task_id()
    nested = s.outer_task is not None and task != s.outer_task
    if nested:  # a reentrant recomputation's backward: part of the pass that runs it
        task = s.outer_task
    st = entry[2]
    pending = st.pending
    if pending is not None and pending[0] == s.flushes and pending[1] != task:
        flush_deferred()
    st.pending = (s.flushes, task)
    if _may_defer(entry[0][7]):
        s.deferred.append(entry)
        return
    s.bwd_registry.add(entry)
    # Once per pass. Compared by id, not a flag: a pass that raised never ran its callback, and a
    # flag would then stay set and leave every later pass's states unupdated. A nested pass's
    # callback would run at its own end, inside the outer one: note_replay's runs at the outer's.
    if s.bwd_task != task:
        s.bwd_task = task
        if not nested:
            _queue_callback(_end_backward)


def note_replay() -> None:
    """te.checkpoint's reentrant recomputation is about to run, inside the backward pass that
    needs it, and torch then runs the segment's backward as a nested pass of its own. Until the
    outer pass ends, states registered in the nested one count as the outer pass's: one update
    per pass, as without checkpointing (a module used inside and outside the segment would
    otherwise update its backward state in the middle of the pass, and once more after it). If
    the outer pass raises before its end, the next outermost region's entry forgets it."""
    s = STATE
    task = _graph_task_id()
    if task != -1 and s.outer_task != task:
        s.outer_task = task
        _queue_callback(_end_outer)


def _end_outer() -> None:
    s = STATE
    task, s.outer_task = s.outer_task, None
    if s.bwd_task == task:  # registered first from the nested pass: no callback of its own
        _end_backward()


def _queue_callback(fn) -> None:
    torch.autograd.Variable._execution_engine.queue_callback(fn)


_graph_task_id = torch._C._current_graph_task_id
_stream_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def _on_default_stream(cuda_index: int) -> bool:
    """Whether a key's device (recipe_key's CUDA index, -1: not CUDA) runs on its default stream,
    where eager training runs. Graph capture never does (it needs a side stream), nor do the
    warmup steps torch.cuda.make_graphed_callables and its users run before a capture: their
    updates run at once, so none is pending, or flushed inside a capture, when capture starts."""
    return cuda_index < 0 or not _raw_stream(cuda_index)


def _on_default_streams(plan) -> bool:
    """_on_default_stream for every CUDA device of ``plan``."""
    for index in plan.devices:
        if _raw_stream(index):
            return False
    return True


def _may_defer(cuda_index: int) -> bool:
    """Whether a backward state of a key on that device is deferred as it registers: no process
    group whose ranks the update might have to all-reduce across at the pass's end, and the
    default stream."""
    return not dist_initialized() and _on_default_stream(cuda_index)


def _end_backward() -> None:
    """The backward pass is over: its states' update is deferred, or run now where it must be."""
    s = STATE
    s.bwd_task = None
    entries = s.bwd_registry.take()
    if not entries:
        return
    plan = plan_for(entries)
    if needs_collective(plan) or not _on_default_streams(plan):
        run_plan(plan)
        return
    s.deferred += entries


def flush_deferred() -> None:
    """Runs the deferred backward updates now (on the current stream): before their states are
    read or changed. Refused during graph capture, where the update would be replayed with the
    graph rather than run once."""
    entries = STATE.deferred
    if not entries:
        return
    if any(key[7] >= 0 for key, _, _ in entries) and _stream_capturing():
        raise RuntimeError(
            "te: a CUDA graph capture reached te's delayed-scaling state while the update of an "
            "earlier backward pass was still pending: run a warmup step on the capture's side "
            "stream first (as torch.cuda.graph requires), or use te.make_graphed_callables"
        )
    STATE.deferred = []
    STATE.flushes += 1
    run_updates(entries)
