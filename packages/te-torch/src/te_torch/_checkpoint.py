"""``te.checkpoint``: activation recomputation that replays te's FP8 state (TE's function).

torch.utils.checkpoint recomputes a segment's forward during backward, outside the te.autocast
region it first ran in: te's modules then recompute in high precision and the gradients are those
of another function (silently, with torch's reentrant checkpoint). And under DelayedScaling the
region's exit has already moved the scales on and rolled the amax histories by then.

te.checkpoint records, when the segment runs forward, the autocast region (enabled, calibrating,
recipe, amax reduction group) and the forward delayed-scaling states the segment quantized with,
with their scales. The recomputation then runs inside that region, with those scales put back
for its duration, and leaves no trace in the scaling state: the amaxes it records are undone and
its states are not queued for another update. Its gradients equal an uncheckpointed step's bit for
bit (tests/torch/test_checkpoint.py). RNG state is replayed by torch.utils.checkpoint, which does
the recomputation itself.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.utils.checkpoint as _ckpt

from te_torch._autocast import STATE, note_replay
from te_torch._recipe_state import UpdateRegistry
from te_torch._tensor_parallel import group_size

__all__ = ["checkpoint"]


class _Frame:
    """One checkpointed call: the region and delayed states of its forward."""

    __slots__ = ("region", "states", "scales")

    def __init__(self) -> None:
        self.region = None
        self.states: list = []
        self.scales: list = []


class _Recording(UpdateRegistry):
    """The segment's forward registry: also remembers every state it saw with its scale at
    first sight, i.e. the scale the segment quantized with, even if a te.autocast region inside
    the segment updated it before the segment returned."""

    __slots__ = ("frame",)

    def __init__(self, frame: _Frame) -> None:
        super().__init__()
        self.frame = frame

    def add(self, entry: tuple) -> None:
        state = entry[2]
        if not any(st is state for st in self.frame.states):
            self.frame.states.append(state)
            self.frame.scales.append(state.scale.clone())
        super().add(entry)


class _Record:
    """Around the segment's first forward: its delayed states are gathered in a _Recording, and
    those still pending at its end handed to the enclosing region's registry (which updates them
    at its exit, as always)."""

    __slots__ = ("frame", "outer")

    def __init__(self, frame: _Frame) -> None:
        self.frame, self.outer = frame, None

    def __enter__(self) -> None:
        s = STATE
        self.frame.region = (s.fp8, s.calibrating, s.recipe, s.group)
        self.frame.states, self.frame.scales = [], []
        self.outer, s.fwd_registry = s.fwd_registry, _Recording(self.frame)

    def __exit__(self, *exc) -> None:
        s = STATE
        mine, s.fwd_registry = s.fwd_registry, self.outer
        for entry in mine.entries:
            self.outer.add(entry)


class _Replay:
    """Around the recomputation: the recorded region, the recorded scales, and afterwards the
    scaling state as it was (the recorded amaxes are the forward's, already counted)."""

    __slots__ = ("frame", "saved", "now")

    def __init__(self, frame: _Frame) -> None:
        self.frame, self.saved, self.now = frame, None, None

    def __enter__(self) -> None:
        s, f = STATE, self.frame
        self.saved = (s.fp8, s.calibrating, s.recipe, s.group, s.fwd_registry, s.depth)
        s.fp8, s.calibrating, s.recipe, s.group = f.region
        s.fwd_registry = UpdateRegistry()  # dropped at exit: no second update
        s.depth += 1  # a region is active; its exit is this object's, which flushes nothing
        with torch.no_grad():
            self.now = [(st.scale.clone(), st.amax_history[0].clone()) for st in f.states]
            for st, scale in zip(f.states, f.scales, strict=True):
                st.scale.copy_(scale)

    def __exit__(self, *exc) -> None:
        s = STATE
        s.fp8, s.calibrating, s.recipe, s.group, s.fwd_registry, s.depth = self.saved
        with torch.no_grad():
            for st, (scale, row0) in zip(self.frame.states, self.now, strict=True):
                st.scale.copy_(scale)
                st.amax_history[0].copy_(row0)


def _replaying_tracker(function: Callable, tracker) -> Callable:
    """``function`` whose second call (the recomputation) runs with ``tracker``'s states as they
    were at its first, then puts back the states it found."""
    first: list = []

    def call(*a, **k):
        if not first:
            first.append(tracker.get_states())
            return function(*a, **k)
        now = tracker.get_states()
        tracker.set_states(first[0])
        try:
            return function(*a, **k)
        finally:
            tracker.set_states(now)

    return call


def checkpoint(
    function: Callable,
    *args,
    distribute_saved_activations: bool = False,
    get_rng_state_tracker=None,
    tp_group=None,
    use_reentrant: bool = True,
    **kwargs,
):
    """Run ``function(*args, **kwargs)`` without keeping its activations, recomputing them
    during backward under the FP8 state of this forward (TE's ``te.checkpoint``).

    Args:
        function: the segment (a module or a function of tensors), called once now and once more
            in backward.
        use_reentrant: True (TE's default) runs the segment under no_grad now and recomputes it
            all in backward: every activation of the segment, te's quantized copies included, is
            freed. False uses torch's non-reentrant checkpoint (keyword arguments, inputs that do
            not require grad); it frees what the segment saves with ``save_for_backward``, but
            te's fused steps keep their quantized copies as they are, so te modules in the
            segment save little memory that way.
        get_rng_state_tracker: a callable returning Megatron's RNG tracker (``fork()``,
            ``get_states()``, ``set_states()``): its states at this forward are set again for the
            recomputation (and the later ones restored after it), so dropout inside its forks
            draws the same masks, as torch's checkpoint does for its own RNG state.
        tp_group: TE's group for ``distribute_saved_activations``, which te does not implement
            yet (NotImplementedError when set); a group alone is accepted (Megatron passes it).

    Returns:
        What ``function`` returns.
    """
    if not callable(function):
        raise TypeError(f"te.checkpoint: function: expected a callable, got {type(function).__name__}")
    if distribute_saved_activations:
        raise NotImplementedError("te.checkpoint: distribute_saved_activations is not implemented in te yet")
    if tp_group is not None:
        group_size("te.checkpoint", "tp_group", tp_group)
    if get_rng_state_tracker is not None:
        if not callable(get_rng_state_tracker):
            raise TypeError(
                "te.checkpoint: get_rng_state_tracker: expected a callable returning the RNG tracker, "
                f"got {type(get_rng_state_tracker).__name__}"
            )
        function = _replaying_tracker(function, get_rng_state_tracker())
    frame = _Frame()
    if not use_reentrant:
        return _ckpt.checkpoint(
            function,
            *args,
            use_reentrant=False,
            context_fn=lambda: (_Record(frame), _Replay(frame)),
            **kwargs,
        )

    def run(*a):
        # torch's reentrant checkpoint calls this under no_grad for the forward and with grad
        # enabled for the recomputation, then runs the segment's backward as a nested pass
        if not torch.is_grad_enabled():
            with _Record(frame):
                return function(*a, **kwargs)
        note_replay()
        with _Replay(frame):
            return function(*a, **kwargs)

    return _ckpt.checkpoint(run, *args, use_reentrant=True)
