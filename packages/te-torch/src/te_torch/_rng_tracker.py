"""``te.CudaRNGStatesTracker``: Megatron-LM's named RNG states, as Transformer Engine ships them.

Tensor-parallel ranks share the default generator's seed (data-parallel replicas draw the same
dropout outside the split layers) but need different streams inside them: a tracker holds extra
named generator states, and ``fork(name)`` runs its block on one of them, keeping the advanced
state when the block ends and restoring the state it found. ``te.checkpoint`` and
``make_graphed_callables`` callers pass ``get_rng_state_tracker`` (a callable returning the
tracker); ``te.checkpoint`` replays the tracker's states for its recomputation.

The states are the CUDA default generator's on a machine with a GPU and the CPU generator's
without one (te runs its models on the CPU too), chosen when the tracker is made (``device``).
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Iterator

import torch

__all__ = ["CudaRNGStatesTracker"]


class CudaRNGStatesTracker:
    """Named generator states (TE's / Megatron's tracker): ``add(name, seed)``, ``fork(name)``,
    ``get_states()`` / ``set_states()`` (what checkpointing saves and replays), ``reset()``,
    ``is_initialized()``."""

    def __init__(self, device: str | torch.device | None = None) -> None:
        """``device``: whose default generator the states are ('cuda' or 'cpu'; te's addition,
        default CUDA where it is available, else CPU)."""
        kind = (
            ("cuda" if torch.cuda.is_available() else "cpu") if device is None else torch.device(device).type
        )
        if kind not in ("cuda", "cpu"):
            raise ValueError(f"CudaRNGStatesTracker: device: expected 'cuda', 'cpu' or None, got {device!r}")
        self._cuda = kind == "cuda"
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def _get(self) -> torch.Tensor:
        return torch.cuda.get_rng_state() if self._cuda else torch.get_rng_state()

    def _set(self, state: torch.Tensor) -> None:
        if self._cuda:
            torch.cuda.set_rng_state(state)
        else:
            torch.set_rng_state(state)

    def is_initialized(self) -> bool:
        """Whether any state was added."""
        return bool(self.states_)

    def reset(self) -> None:
        """Drops every state and seed."""
        self.states_, self.seeds_ = {}, set()

    def get_states(self) -> dict[str, torch.Tensor]:
        """{name: state} (a new dict; a fork replaces a state's tensor rather than writing it)."""
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        """Sets the states get_states returned."""
        if not isinstance(states, dict) or not all(isinstance(v, torch.Tensor) for v in states.values()):
            raise TypeError(
                f"CudaRNGStatesTracker.set_states: states: expected a dict name -> state tensor (what "
                f"get_states returns), got {type(states).__name__}"
            )
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        """A new state ``name`` seeded with ``seed`` (names and seeds must be new)."""
        if not isinstance(name, str):
            raise TypeError(f"CudaRNGStatesTracker.add: name: expected a str, got {type(name).__name__}")
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
            raise TypeError(f"CudaRNGStatesTracker.add: seed: expected an int, got {seed!r}")
        if seed in self.seeds_:
            raise ValueError(
                f"CudaRNGStatesTracker.add: seed {seed} was already added (each state needs its own)"
            )
        if name in self.states_:
            raise ValueError(f"CudaRNGStatesTracker.add: a state named {name!r} was already added")
        self.seeds_.add(int(seed))
        outside = self._get()
        if self._cuda:
            torch.cuda.manual_seed(int(seed))
        else:
            torch.manual_seed(int(seed))
        self.states_[name] = self._get()
        self._set(outside)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        """Runs the block on state ``name``, which keeps what the block drew; the generator's
        own state is restored afterwards."""
        if name not in self.states_:
            raise KeyError(
                f"CudaRNGStatesTracker.fork: no state named {name!r}; add it first with "
                f"add({name!r}, seed) (states: {sorted(self.states_)})"
            )
        outside = self._get()
        self._set(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = self._get()
            self._set(outside)
