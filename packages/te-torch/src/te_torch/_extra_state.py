"""ExtraState: the value a te module puts under ``_extra_state`` in ``state_dict()``.

It reads as the module's DelayedScaling state, a dict of tensors (_module_base's docstring), but
is no ``Mapping``: ``torch.distributed.checkpoint`` (DCP) then keeps it one object, saved and
loaded whole, instead of flattening it into tensors that it can only load into tensors of the
saved shapes. A model built fresh for a resume has no scaling state yet (it is made at the first
DelayedScaling step, with the recipe's history length), so flattened entries would have nothing
to load into and DCP would skip them without a word; whole, the saved state replaces the empty
one whatever its shape.

Pickled (``torch.save``, DCP), it is an OrderedDict of CPU tensors, which
``torch.load(..., weights_only=True)`` reads; ``load_state_dict`` takes that, or this object,
and moves the tensors to the module's device.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Iterator

__all__ = ["ExtraState", "as_dict"]


def _on_cpu(state: dict) -> collections.OrderedDict:
    return collections.OrderedDict(
        (k, _on_cpu(v) if isinstance(v, dict) else v.detach().cpu()) for k, v in state.items()
    )


class ExtraState:
    """A te module's ``_extra_state``: a read-only dict of its DelayedScaling tensors (empty
    before any DelayedScaling step; LayerNormMLP's is ``{"fc1": {...}, "fc2": {...}}``)."""

    __slots__ = ("_state",)

    def __init__(self, state: dict) -> None:
        self._state = state

    def __getitem__(self, key: str):
        return self._state[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def __contains__(self, key: object) -> bool:
        return key in self._state

    def keys(self):
        return self._state.keys()

    def values(self):
        return self._state.values()

    def items(self):
        return self._state.items()

    def get(self, key: str, default=None):
        return self._state.get(key, default)

    def __eq__(self, other: object) -> bool:
        return self._state == (other._state if isinstance(other, ExtraState) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ExtraState({self._state!r})"

    def __copy__(self) -> ExtraState:
        return ExtraState(dict(self._state))

    def __deepcopy__(self, memo: dict) -> ExtraState:
        return ExtraState(copy.deepcopy(self._state, memo))

    def __reduce_ex__(self, protocol: int):
        # what torch.save writes: an OrderedDict (weights_only loads it), built item by item
        return (collections.OrderedDict, (), None, None, iter(_on_cpu(self._state).items()))


def as_dict(state) -> object:
    """``state`` (set_extra_state's argument) with an ExtraState unwrapped to its dict."""
    return dict(state._state) if isinstance(state, ExtraState) else state
