"""How te_jax's fused ops run on a device mesh: shard_map inside the ops' custom_vjp rules.

An XLA custom call has no partitioning rule, so XLA would gather every sharded operand of a te
FFI call onto each device and replicate the result. te_jax's ops instead say where each operand
lives (a PartitionSpec per operand, from the caller or from ``autocast``'s ``MeshResource``), and
run their forward and backward rules per shard under ``jax.shard_map`` with the collectives
written out: amaxes max-reduced over the axes a tensor is split on (so per-tensor scales equal
the unsharded ones), partial GEMM sums (row-parallel outputs, column-parallel input gradients,
weight gradients over the batch) psum-reduced. Nothing is gathered that the declared layout
does not need; arrays sharded otherwise are resharded to it at the op's boundary by XLA.

Residuals the forward keeps for the backward (quantized copies, norm statistics) stay on the
device that made them: each is given a leading device axis split over every mesh axis, so the
backward's shard_map hands every device its own piece back.

The mesh is the one set with ``jax.set_mesh`` (or the older ``with mesh:``). Without a mesh, or
when nothing is sharded, the ops call their per-shard rules on the whole arrays.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import jax
from jax.sharding import PartitionSpec as P

from te_jax._autocast import get_autocast_state

Axes = tuple[str, ...]


def entry_axes(entry) -> Axes:
    """The mesh axes of one PartitionSpec entry (None, a name, or a tuple of names)."""
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def spec_entry(axes: Axes):
    """The PartitionSpec entry for ``axes``: None, one name, or a tuple."""
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else tuple(axes)


def _context_mesh():
    """The mesh ops should shard over: jax.set_mesh's, else the legacy ``with mesh:`` one."""
    get_mesh = getattr(jax.sharding, "get_mesh", None)
    if get_mesh is not None:
        try:
            mesh = get_mesh()
        except (RuntimeError, ValueError):
            mesh = None
        if mesh is not None and not mesh.empty:
            return mesh
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is not None and not mesh.empty:
        return mesh
    try:  # `with mesh:` (deprecated in jax 0.10), kept working while jax has it
        from jax._src import mesh as _mesh_lib

        physical = _mesh_lib.thread_resources.env.physical_mesh
    except (ImportError, AttributeError):
        return None
    return None if physical.empty else physical


def _check_spec(spec, ndim: int, name: str, mesh) -> tuple:
    if spec is None:
        return (None,) * ndim
    if not isinstance(spec, P):
        raise TypeError(f"{name}: expected a jax.sharding.PartitionSpec or None, got {type(spec).__name__}")
    entries = tuple(spec)
    if len(entries) > ndim:
        raise ValueError(f"{name}: expected at most {ndim} entries (one per dim), got {spec}")
    entries = entries + (None,) * (ndim - len(entries))
    seen: list[str] = []
    for e in entries:
        for a in entry_axes(e):
            if not isinstance(a, str):
                raise TypeError(f"{name}: expected mesh axis names (str), got {a!r} in {spec}")
            if mesh is None:
                raise ValueError(
                    f"{name}: {spec} names mesh axes but no mesh is set; call the op under jax.set_mesh(mesh)"
                )
            if a not in mesh.axis_names:
                raise ValueError(f"{name}: axis {a!r} of {spec} is not in the mesh's axes {mesh.axis_names}")
            if a in seen:
                raise ValueError(f"{name}: axis {a!r} appears twice in {spec}")
            seen.append(a)
    return entries


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static: the mesh (None: run on whole arrays) and each operand's spec entries."""

    mesh: object | None
    specs: tuple[tuple, ...]

    @property
    def sharded(self) -> bool:
        return self.mesh is not None

    def size(self, axes: Axes) -> int:
        return math.prod(self.mesh.shape[a] for a in axes) if self.mesh is not None else 1

    def run(self, fn, args, in_specs, out_specs):
        """``fn(*args)`` per shard (shard_map), or on the whole arrays without a mesh."""
        if self.mesh is None:
            return fn(*args)
        if _explicit(self.mesh):
            # shard_map takes explicitly sharded arrays only in the specs it is given
            args = jax.tree_util.tree_map(
                lambda spec, sub: jax.tree_util.tree_map(lambda a: jax.sharding.reshard(a, spec), sub),
                tuple(in_specs),
                tuple(args),
                is_leaf=lambda s: isinstance(s, P),
            )
        return jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(
            *args
        )

    @property
    def residual_spec(self):
        """The spec of a packed residual: its leading device axis split over every mesh axis."""
        return P(tuple(self.mesh.axis_names)) if self.mesh is not None else None

    def pack(self, tree):
        """Per-shard residuals -> arrays with a leading device axis (identity without a mesh)."""
        if self.mesh is None:
            return tree
        return jax.tree_util.tree_map(lambda a: a[None], tree)

    def unpack(self, tree):
        if self.mesh is None:
            return tree
        return jax.tree_util.tree_map(lambda a: a[0], tree)


def _explicit(mesh) -> bool:
    explicit = getattr(jax.sharding.AxisType, "Explicit", None)
    return explicit is not None and any(t == explicit for t in getattr(mesh, "axis_types", ()))


_warned_unsharded = False


def layout(shapes_and_specs: list[tuple[tuple[int, ...], object, str]]) -> Layout:
    """The Layout of an op's operands: (global shape, spec or None, argument name) each.

    Checks each spec against the mesh (axes exist, each named once per operand, dims divisible
    by the product of their axes). Nothing sharded: a Layout without a mesh (the op runs as is,
    replicated if its inputs were sharded: warned once, since XLA then gathers them).
    """
    global _warned_unsharded
    mesh = _context_mesh()
    specs = []
    for shape, spec, name in shapes_and_specs:
        entries = _check_spec(spec, len(shape), name, mesh)
        for d, (dim, e) in enumerate(zip(shape, entries, strict=True)):
            axes = entry_axes(e)
            n = math.prod(mesh.shape[a] for a in axes) if axes else 1
            if dim % n:
                raise ValueError(
                    f"{name}: dim {d} (size {dim}) is split over mesh axes {axes} ({n} devices); "
                    f"expected a multiple of {n}"
                )
        specs.append(entries)
    if not any(e is not None for s in specs for e in s):
        if mesh is not None and math.prod(mesh.shape.values()) > 1 and not _warned_unsharded:
            _warned_unsharded = True
            warnings.warn(
                "te_jax: an op runs under a mesh with no sharded operand (no PartitionSpec and no "
                "MeshResource in te_jax.autocast); XLA replicates it, gathering any sharded input. "
                "Pass te_jax.autocast(mesh_resource=te_jax.MeshResource(dp_resource=...)) or the "
                "op's *_spec arguments to run it sharded.",
                stacklevel=3,
            )
        return Layout(None, tuple(specs))
    return Layout(mesh, tuple(specs))


def default_input_spec(ndim: int, batch_dim: int = 0) -> P | None:
    """Activations' default spec: the batch dim (``batch_dim``) over autocast's MeshResource
    batch axes (dp, then fsdp); None without a MeshResource or mesh. A batch axis the mesh lacks
    is a ValueError (a misspelt name would otherwise run the op replicated)."""
    resource = get_autocast_state().mesh_resource
    mesh = _context_mesh()
    if resource is None or mesh is None or ndim < 2 or batch_dim >= ndim - 1:
        return None
    for field in ("dp_resource", "fsdp_resource"):
        a = getattr(resource, field)
        if a is not None and a not in mesh.axis_names:
            raise ValueError(
                f"MeshResource.{field}: axis {a!r} is not in the mesh's axes {tuple(mesh.axis_names)} "
                "(te_jax.autocast's mesh_resource names the axes of the mesh set with jax.set_mesh)"
            )
    axes = resource.batch_axes
    if not axes:
        return None
    entries = [None] * ndim
    entries[batch_dim] = spec_entry(axes)
    return P(*entries)


def context_mesh():
    """The mesh te_jax's ops shard over now (jax.set_mesh's), or None."""
    return _context_mesh()


def pmax(x, axes: Axes):
    return jax.lax.pmax(x, axes) if axes else x


def psum(x, axes: Axes):
    return jax.lax.psum(x, axes) if axes else x
