"""Tensor and sequence parallelism of te modules (TE's ``tp_group``, ``tp_size``,
``parallel_mode``, ``sequence_parallel``) over torch.distributed: NCCL on GPUs, gloo on CPU.

Megatron-LM's scheme, as Transformer Engine runs it, for a layer split over the ``tp_size`` ranks
of ``tp_group``:

    column  each rank holds W's rows [out / tp, in] (and those of the bias) and computes its
            columns of y from the whole input; backward all-reduces the input's gradient (each
            rank's dgrad is a partial sum over its rows of W)
    row     each rank holds W's columns [out, in / tp] and takes its slice of the input's last
            dimension (a column-parallel layer's output); the partial products are all-reduced
            and the bias (whole on every rank) added after the sum

``sequence_parallel``: outside such a pair the activations are split along their first dimension
(the sequence in Megatron's [s, b, h] layout) instead of repeated on every rank: a column-parallel
layer all-gathers its input along it (backward: reduce-scatters the gradient) and a row-parallel
layer reduce-scatters its output (backward: all-gathers the gradient). A sequence-parallel row
layer's bias then gets each rank's part of its gradient; it is marked ``sequence_parallel = True``
(TE's attribute) for the training loop to all-reduce over the group, as Megatron does.

Every GEMM is local, so each rank quantizes its own operands (its own scales) inside
``te.autocast``; the collectives move high-precision tensors (TE's moves a column layer's
sequence-parallel input in FP8: not yet here). Under ``torch.compile`` these steps run eagerly.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from te_torch._module_base import check_size, split_sizes
from te_torch._quantized_tensor import QuantizedTensor

__all__ = [
    "SplitModule",
    "TensorParallel",
    "local_features",
    "mark_norm_parallel",
    "mark_parallel",
    "rng_fork",
    "split_linear",
    "split_module",
]

PARALLEL_MODES = (None, "column", "row")

# torch 2.13 names them *_single (the *_tensor names warn); torch 2.11 has only the latter; a torch
# built without distributed support has neither (and no group to pass)
_all_gather = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or getattr(dist, "reduce_scatter_tensor", None)


def parallel_config(owner: str, tp_group, tp_size, parallel_mode, sequence_parallel) -> tuple:
    """(tp_group, tp_size, parallel_mode, sequence_parallel) checked as TE reads them: a group
    sets the size (a ``tp_size`` other than 1 must match it); without one, ``tp_size`` is the size
    a later ``set_tensor_parallel_group`` must bring; sequence parallelism needs a size above 1."""
    if parallel_mode not in PARALLEL_MODES:
        raise ValueError(f"{owner}: parallel_mode: expected None, 'column' or 'row', got {parallel_mode!r}")
    tp_size = check_size(owner, "tp_size", tp_size)
    if tp_group is not None:
        size = group_size(owner, "tp_group", tp_group)
        if tp_size not in (1, size):
            raise ValueError(
                f"{owner}: tp_size={tp_size} but tp_group has {size} ranks; pass one or the other"
            )
        tp_size = size
    return tp_group, tp_size, parallel_mode, bool(sequence_parallel) and tp_size > 1


def split_module(module, owner: str, tp_group, tp_size, mode, sequence_parallel, rng) -> tuple:
    """Checks the split (parallel_config) and sets TE's ``tp_group``, ``tp_size`` and
    ``sequence_parallel`` on ``module``, its ``_tp`` (a TensorParallel, or None where nothing is
    split) and ``_rng`` (get_rng_state_tracker, rng_tracker_name: reset_parameters' rng_fork).
    Returns (mode, tp_size)."""
    group, size, mode, sp = parallel_config(owner, tp_group, tp_size, mode, sequence_parallel)
    module.tp_group, module.tp_size, module.sequence_parallel = group, size, sp
    module._tp = TensorParallel(owner, group, size, mode, sp) if mode is not None and size > 1 else None
    module._rng = rng
    return mode, size


def split_linear(
    module,
    owner: str,
    in_features: int,
    out_features: int,
    parameters_split,
    tp_group,
    tp_size,
    mode,
    sequence_parallel,
    rng,
) -> tuple:
    """split_module for a linear layer (``module.parallel_mode`` set too): this rank's
    (in_features, out_features, parameters_split sizes), a column split dividing the output
    sizes and a row split the input's."""
    mode, size = split_module(module, owner, tp_group, tp_size, mode, sequence_parallel, rng)
    module.parallel_mode = mode
    split = split_sizes(owner, parameters_split, out_features)
    if mode == "column":
        out_features = local_features(owner, "out_features", out_features, size, mode)
        if split is not None:
            split = {
                n: local_features(owner, f"parameters_split[{n!r}]", v, size, mode) for n, v in split.items()
            }
    elif mode == "row":
        in_features = local_features(owner, "in_features", in_features, size, mode)
    return in_features, out_features, split


def mark_norm_parallel(module) -> None:
    """TE's ``sequence_parallel`` attribute on a module's norm parameters: with sequence
    parallelism each rank's gradient of them is its rows' part."""
    for n in ("layer_norm_weight", "layer_norm_bias"):
        p = getattr(module, n, None)
        if p is not None:
            p.sequence_parallel = module.sequence_parallel


class SplitModule:
    """TE's ``set_tensor_parallel_group`` for a module that split_module set up."""

    def set_tensor_parallel_group(self, tp_group) -> None:
        """The group of a layer built with ``tp_size`` and no ``tp_group`` (its size must be
        ``tp_size``). A layer that is not split only keeps it."""
        if self._tp is not None:
            self._tp.set_group(tp_group)
        elif tp_group is not None:
            group_size(type(self).__name__, "set_tensor_parallel_group", tp_group)
        self.tp_group = tp_group


def group_size(owner: str, arg: str, group) -> int:
    """The size of ``group``, a torch.distributed ProcessGroup (TypeError naming ``arg`` else)."""
    if not (dist.is_available() and isinstance(group, dist.ProcessGroup)):
        raise TypeError(f"{owner}: {arg}: expected a torch.distributed ProcessGroup or None, got {group!r}")
    return dist.get_world_size(group)


def local_features(owner: str, arg: str, n: int, tp_size: int, mode: str) -> int:
    """``n`` split over ``tp_size`` ranks (a column layer's out_features, a row layer's
    in_features, a parameters_split size)."""
    if n % tp_size:
        raise ValueError(
            f"{owner}: {arg}={n} does not split over tp_size={tp_size} ranks (parallel_mode={mode!r}): "
            f"expected a multiple of {tp_size}"
        )
    return n // tp_size


def rng_fork(get_rng_state_tracker, name):
    """TE's weight initialization under the model-parallel RNG: ``get_rng_state_tracker().fork()``
    (``fork(name)`` with ``rng_tracker_name``), or nothing without a tracker."""
    if get_rng_state_tracker is None:
        return contextlib.nullcontext()
    tracker = get_rng_state_tracker()
    return tracker.fork() if name is None else tracker.fork(name)


def mark_parallel(weights, biases, mode: str | None, sequence_parallel: bool) -> None:
    """TE's (Megatron's) attributes on the parameters: a split weight's ``tensor_model_parallel``,
    ``partition_dim`` (0 column, 1 row) and ``partition_stride``; a column layer's bias split the
    same way; a row layer's whole bias ``sequence_parallel`` (its gradient a per-rank part)."""
    for w in weights:
        w.tensor_model_parallel = mode is not None
        w.partition_dim = 1 if mode == "row" else 0
        w.partition_stride = 1
    for b in biases:
        if mode == "column":
            b.tensor_model_parallel, b.partition_dim, b.partition_stride = True, 0, 1
        elif mode == "row":
            b.sequence_parallel = sequence_parallel


# -- collectives with their gradients -------------------------------------------------------------


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    x = x.contiguous()
    dist.all_reduce(x, group=group)
    return x


def _gather_rows(x: torch.Tensor, group) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((x.shape[0] * dist.get_world_size(group), *x.shape[1:]))
    _all_gather(out, x, group=group)
    return out


def _scatter_rows(x: torch.Tensor, group) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // dist.get_world_size(group), *x.shape[1:]))
    _reduce_scatter(out, x, group=group)
    return out


class _CopyToGroup(torch.autograd.Function):
    """Forward: the input as it is; backward: the gradient all-reduced."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.group), None


class _ReduceInGroup(torch.autograd.Function):
    """Forward: the input all-reduced (in place); backward: the gradient as it is."""

    @staticmethod
    def forward(ctx, x, group):
        if x.is_contiguous():
            ctx.mark_dirty(x)
        else:
            x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherRows(torch.autograd.Function):
    """Forward: the ranks' inputs concatenated along dim 0; backward: reduce-scattered."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_rows(x, group)

    @staticmethod
    def backward(ctx, g):
        return _scatter_rows(g, ctx.group), None


class _ScatterRows(torch.autograd.Function):
    """Forward: the input summed over the ranks, each keeping its slice of dim 0; backward: the
    slices all-gathered."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _scatter_rows(x, group)

    @staticmethod
    def backward(ctx, g):
        return _gather_rows(g, ctx.group), None


class TensorParallel:
    """A module's tensor-parallel step around its local computation (``mode`` 'column' or 'row'
    with ``size`` > 1; ``group`` None until set)."""

    __slots__ = ("owner", "group", "size", "mode", "sequence_parallel")

    def __init__(self, owner: str, group, size: int, mode: str, sequence_parallel: bool) -> None:
        self.owner, self.group, self.size = owner, group, size
        self.mode, self.sequence_parallel = mode, sequence_parallel

    def set_group(self, group) -> None:
        size = group_size(self.owner, "set_tensor_parallel_group", group)
        if size != self.size:
            raise ValueError(
                f"{self.owner}: set_tensor_parallel_group: the group has {size} ranks, but the module "
                f"was built for tp_size={self.size}"
            )
        self.group = group

    @torch.compiler.disable
    def run(self, local, inp, first, fp8_output: bool, fp8_grad: bool, return_bias: bool) -> tuple:
        """(out, bias) of ``local(inp, first, fp8_output, fp8_grad)`` (the module's own step on
        its shard, which leaves a row layer's bias to this: added after the sum unless
        ``return_bias``) with the collectives around it."""
        quantized = type(inp) is not torch.Tensor and isinstance(inp, QuantizedTensor)
        if self.mode == "column":
            if quantized or fp8_grad:
                raise NotImplementedError(
                    f"{self.owner}: a quantized input or fp8_grad with parallel_mode='column' is not "
                    "implemented yet (the input's gradient is all-reduced in high precision)"
                )
            return local(self.column_input(inp), first, fp8_output, fp8_grad)
        if fp8_output:
            raise NotImplementedError(
                f"{self.owner}: fp8_output with parallel_mode='row' is not implemented yet (the output "
                "is summed over the ranks in high precision)"
            )
        self._group()
        out, bias = local(inp, first, False, fp8_grad)
        return self.row_output(out, bias, return_bias), bias

    def column_input(self, inp: torch.Tensor) -> torch.Tensor:
        """A column layer's input: all-gathered along dim 0 (sequence parallel), else as it is
        (its gradient all-reduced)."""
        group = self._group()
        if self.sequence_parallel:
            self._check_rows(inp, "the input", 1)
            return _GatherRows.apply(inp, group)
        return _CopyToGroup.apply(inp, group)

    def row_output(self, out: torch.Tensor, bias, return_bias: bool) -> torch.Tensor:
        """A row layer's output: summed over the ranks (each keeping its rows, sequence
        parallel), then the bias added unless ``return_bias``."""
        if self.sequence_parallel:
            self._check_rows(out, "the output", self.size)
            out = _ScatterRows.apply(out, self.group)
        else:
            out = _ReduceInGroup.apply(out, self.group)
        if bias is not None and not return_bias:
            out = out + bias.to(out.dtype)
        return out

    def _group(self):
        if self.group is None:
            raise RuntimeError(
                f"{self.owner}: tp_size={self.size} but no tensor-parallel group: pass tp_group= or "
                "call set_tensor_parallel_group(group) before the forward"
            )
        return self.group

    def _check_rows(self, t: torch.Tensor, what: str, multiple: int) -> None:
        if t.dim() == 0 or t.shape[0] % multiple:
            raise ValueError(
                f"{self.owner}: sequence_parallel splits {what}'s first dimension over {self.size} "
                f"ranks: expected a size divisible by {multiple}, got shape {tuple(t.shape)}"
            )
