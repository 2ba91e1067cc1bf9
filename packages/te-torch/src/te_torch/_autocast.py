"""``te.autocast``: the region in which te's modules run their GEMMs quantized.

A class-based context manager (cheap to enter and leave, as in TE). Entering sets the process-
wide ``STATE`` that modules read once per call (``STATE.fp8``, ``STATE.recipe``...); leaving
restores the enclosing region's values. Regions nest: an inner region overrides ``enabled``,
``calibrating``, ``recipe`` and the group for what runs inside it. When the outermost region
exits, the forward delayed-scaling state of every module quantized anywhere inside is updated in
one batched call (te_torch._recipe_state); backward state is updated once after each backward
pass. One instance cannot be entered again while it is active (RuntimeError), as in TE.
"""

from __future__ import annotations

import warnings

import torch
from te_core.recipe import Recipe

from te_torch._availability import get_default_recipe
from te_torch._recipe_state import UpdateRegistry

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
        "bwd_queued",
    )

    def __init__(self) -> None:
        self.fp8 = False
        self.calibrating = False
        self.recipe = None
        self.group = None
        self.depth = 0
        self.fwd_registry = UpdateRegistry()
        self.bwd_registry = UpdateRegistry()
        self.bwd_queued = False


STATE = _State()
_default_recipe = None


def _resolve(recipe):
    global _default_recipe
    if recipe is None:
        if _default_recipe is None:
            _default_recipe = get_default_recipe()
        return _default_recipe
    if not isinstance(recipe, Recipe):
        raise TypeError(
            f"autocast: recipe: expected a te.recipe recipe (DelayedScaling(), "
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
        return self

    def __exit__(self, *exc) -> None:
        s = STATE
        s.fp8, s.calibrating, s.recipe, s.group = self._saved
        self._saved = None
        s.depth -= 1
        if s.depth == 0 and exc[0] is None:
            s.fwd_registry.flush()
        elif s.depth == 0:  # an exception escaped: drop this step's amaxes from the update list
            s.fwd_registry.pending.clear()
            s.fwd_registry.recipes.clear()


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


def register_forward(key: tuple, recipe, state) -> None:
    STATE.fwd_registry.add(key, recipe, state)


def register_backward(key: tuple, recipe, state) -> None:
    """Queues ``state`` for the update that runs once the current backward pass finishes."""
    s = STATE
    s.bwd_registry.add(key, recipe, state)
    if not s.bwd_queued:
        s.bwd_queued = True
        torch.autograd.Variable._execution_engine.queue_callback(_flush_backward)


def _flush_backward() -> None:
    STATE.bwd_queued = False
    STATE.bwd_registry.flush()
