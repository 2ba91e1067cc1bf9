"""``te_jax.autocast``: the region in which te_jax.flax modules quantize their GEMMs, and
``MeshResource``, the mesh axes those modules shard over.

JAX reads the region while it traces: a module called inside ``autocast(enabled=True, ...)``
traces FP8 ops, one called outside traces high-precision ones. ``jax.jit`` caches a trace, so a
jitted step keeps the recipe it was first traced with: trace (call) it inside the region it is
meant for, as with TE. Regions nest; leaving one restores the enclosing one's settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

from te_core import recipe as _recipe

__all__ = ["MeshResource", "autocast", "fp8_autocast", "get_autocast_state", "AutocastState"]


def _axis(value, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name}: expected a mesh axis name (str) or None, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class MeshResource:
    """The names of the mesh axes te_jax shards over (TE's ``MeshResource``); None: not used.

    Attributes:
      dp_resource: data parallelism: activations' batch (leading) dimension is split over it, and
        delayed-scaling amaxes are reduced (max) across it.
      tp_resource: tensor parallelism: the feature dimensions named by the logical axes that
        map to it (``'mlp'``, ``'heads'``, ``'joined_kv'`` by default) are split over it.
      fsdp_resource: fully sharded data parallelism: splits the batch like ``dp_resource``
        (weights are stored split over it and gathered for the GEMM).
      tpsp_resource, pp_resource, cp_resource, ep_resource: accepted for TE compatibility;
        te_jax's ops do not shard over them yet (sequence, pipeline, context, expert
        parallelism).
    """

    dp_resource: str | None = None
    tp_resource: str | None = None
    tpsp_resource: str | None = None
    fsdp_resource: str | None = None
    pp_resource: str | None = None
    cp_resource: str | None = None
    ep_resource: str | None = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            _axis(getattr(self, f.name), f"MeshResource.{f.name}")

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The axes that split activations' batch dimension: dp then fsdp."""
        return tuple(a for a in (self.dp_resource, self.fsdp_resource) if a is not None)


@dataclasses.dataclass(frozen=True)
class AutocastState:
    """What the innermost active ``autocast`` region set (``enabled`` False outside any)."""

    enabled: bool = False
    recipe: _recipe.Recipe | None = None
    mesh_resource: MeshResource | None = None


_local = threading.local()


def get_autocast_state() -> AutocastState:
    """The settings of the innermost active ``te_jax.autocast`` region in this thread."""
    return getattr(_local, "state", None) or AutocastState()


def _check_recipe(recipe) -> _recipe.Recipe:
    if recipe is None:
        return _recipe.DelayedScaling()  # TE JAX's default recipe
    if not isinstance(recipe, _recipe.Recipe):
        raise TypeError(
            "recipe: expected a te_jax.recipe recipe (DelayedScaling(), Float8CurrentScaling(), "
            f"Float8BlockScaling(), MXFP8BlockScaling(), NVFP4BlockScaling()) or None, got "
            f"{type(recipe).__name__}"
        )
    if isinstance(recipe, _recipe.CustomRecipe):
        raise NotImplementedError("recipe: CustomRecipe is not supported by te_jax")
    return recipe


@contextlib.contextmanager
def autocast(
    enabled: bool = False,
    recipe: _recipe.Recipe | None = None,
    mesh_resource: MeshResource | None = None,
) -> Iterator[AutocastState]:
    """Run te_jax.flax modules' GEMMs quantized (``enabled``) under ``recipe`` inside the region.

    Args:
      enabled: quantize (FP8, MXFP8 or NVFP4) inside the region; False runs the
        modules in high precision (the recipe is still recorded).
      recipe: a ``te_jax.recipe`` recipe; None means ``DelayedScaling()`` (TE JAX's default).
      mesh_resource: the mesh axes te_jax's ops shard over (``MeshResource``); None keeps the
        enclosing region's (default: no sharding). The mesh itself is the one set with
        ``jax.set_mesh``.

    Yields the region's ``AutocastState``. DelayedScaling keeps state: initialise the model
    (``model.init``) inside the same region so its ``"fp8_metas"`` variables exist.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled: expected True or False, got {enabled!r}")
    recipe = _check_recipe(recipe)
    if mesh_resource is not None and not isinstance(mesh_resource, MeshResource):
        raise TypeError(
            f"mesh_resource: expected a te_jax.MeshResource or None, got {type(mesh_resource).__name__}"
        )
    outer = get_autocast_state()
    state = AutocastState(
        enabled=enabled,
        recipe=recipe,
        mesh_resource=mesh_resource if mesh_resource is not None else outer.mesh_resource,
    )
    _local.state = state
    try:
        yield state
    finally:
        _local.state = outer


def fp8_autocast(
    enabled: bool = False,
    fp8_recipe: _recipe.Recipe | None = None,
    mesh_resource: MeshResource | None = None,
):
    """TE's older name for ``autocast`` (``fp8_recipe`` is ``recipe``)."""
    return autocast(enabled=enabled, recipe=fp8_recipe, mesh_resource=mesh_resource)
