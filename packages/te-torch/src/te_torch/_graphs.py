"""``te.make_graphed_callables``: te modules replayed as CUDA graphs, TE's name and arguments.

torch.cuda.make_graphed_callables does the capture and the autograd plumbing; te adds the FP8
region. Each callable's forward is captured inside a te.autocast region of its own, so one replay
of the forward graph is the whole forward: the quantize and GEMM kernels and, under
DelayedScaling, the update of the forward amax histories and scales that the region's exit
launches. The backward graph ends likewise with the backward update (queued by the autograd
engine at the end of the captured backward). A replay costs one graph launch of host time instead
of the Python, allocations and ~10 kernel launches of an eager step.

Decisions (the TE issues they answer are in docs/graphs.rst):
- The warmup steps before capture really run the callables. Their effect on delayed-scaling state
  and on ``main_grad`` (fuse_wgrad_accumulation) is undone afterwards, so graphing a module does
  not change how it trains.
- A graphed callable replays its graphs when it is called outside any te.autocast region, or in a
  region with the captured enabled / calibrating / recipe (not changed in place since), with the
  captured argument shapes, dtypes and non-tensor keyword values, and (a module) in the captured
  train / eval mode.
  Otherwise it runs its ordinary forward eagerly, under the caller's region (outside any: the
  captured one), and says so once at INFO: a region with ``enabled=False`` around a graphed FP8
  model evaluates it in high precision, and a smaller last batch runs rather than being
  broadcast into the static input.
- Without CUDA (CPU tensors) nothing can be captured: the callables run eagerly with the same
  rules (INFO once), so one script runs on both.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Callable

import torch

from te_torch._autocast import STATE, autocast
from te_torch._gemm_state import recipe_fields
from te_torch._info_once import info_once as _info_once
from te_torch._module_base import QuantizedModule
from te_torch._recipe_state import UpdateRegistry

__all__ = ["make_graphed_callables"]


class _OwnRegion:
    """A te.autocast region that is outermost whatever encloses it: its forward delayed-scaling
    updates run at its own exit (inside the capture), not at the enclosing region's."""

    __slots__ = ("_ac", "_saved")

    def __init__(self, enabled: bool, calibrating: bool, recipe, group) -> None:
        self._ac = autocast(enabled, calibrating, recipe, group)
        self._saved = None

    def __enter__(self) -> None:
        s = STATE
        self._saved = (s.depth, s.fwd_registry)
        s.depth, s.fwd_registry = 0, UpdateRegistry()
        self._ac.__enter__()

    def __exit__(self, *exc) -> None:
        try:
            self._ac.__exit__(*exc)
        finally:
            STATE.depth, STATE.fwd_registry = self._saved


class _Captured(torch.nn.Module):
    """What torch captures for one callable: positional tensors only (the call's arguments, then
    the tensors of its keyword arguments), run inside an _OwnRegion. A module callable is this
    module's child, so its parameters are the graph's parameter inputs, in the same order."""

    def __init__(self, fn: Callable, n_args: int, kw_tensors: tuple, kw_fixed: dict, region: tuple) -> None:
        super().__init__()
        if isinstance(fn, torch.nn.Module):
            self.inner = fn
            self._call = fn.forward
        else:
            self._call = fn
        self._n, self._kw_tensors, self._kw_fixed, self._region = n_args, kw_tensors, kw_fixed, region

    def forward(self, *flat):
        kwargs = dict(self._kw_fixed)
        kwargs.update(zip(self._kw_tensors, flat[self._n :], strict=True))
        with _OwnRegion(*self._region):
            return self._call(*flat[: self._n], **kwargs)


class _Dispatch:
    """The graphed callable's call: the graphs when the call matches the capture, else the
    original forward (module docstring)."""

    def __init__(
        self, name: str, eager: Callable, graphed: Callable, module, sample: tuple, kw: tuple, region: tuple
    ) -> None:
        self.name, self.eager, self.graphed, self.module = name, eager, graphed, module
        self.specs = tuple((t.shape, t.dtype) for t in sample)
        self.n_args = len(sample) - len(kw[0])
        self.kw_tensors, self.kw_fixed = kw
        self.kw_keys = frozenset(kw[0]) | frozenset(kw[1])
        self.training = module.training if module is not None else None
        self.region = region
        self.enabled, self.calibrating, self.recipe, _ = region
        self.fields = recipe_fields(self.recipe) if self.recipe is not None else None
        self.generation = self.recipe._generation if self.recipe is not None else None

    def __call__(self, *args, **kwargs):
        why = self._mismatch(args, kwargs)
        if why is None:
            return self.graphed(*args, *(kwargs[k] for k in self.kw_tensors))
        _info_once(
            f"{self.name}:{why}",
            f"te.make_graphed_callables: {self.name} runs eagerly: {why} differs from the capture",
        )
        if STATE.depth:
            return self.eager(*args, **kwargs)
        with _OwnRegion(*self.region):
            return self.eager(*args, **kwargs)

    def _mismatch(self, args: tuple, kwargs: dict) -> str | None:
        s = STATE
        if self.generation is not None and self.recipe._generation != self.generation:
            return "the recipe, changed in place since,"
        if s.depth and (s.fp8 != self.enabled or s.calibrating != self.calibrating):
            return "te.autocast's enabled / calibrating"
        if s.depth and (s.fp8 or s.calibrating) and s.recipe is not self.recipe:
            if recipe_fields(s.recipe) != self.fields:
                return "te.autocast's recipe"
        if self.module is not None and self.module.training != self.training:
            return "train / eval mode"
        if len(args) != self.n_args or kwargs.keys() != self.kw_keys:
            return "the arguments"
        for k, v in self.kw_fixed.items():
            if kwargs[k] is not v and kwargs[k] != v:
                return f"keyword argument {k!r}"
        tensors = (*args, *(kwargs[k] for k in self.kw_tensors))
        for t, (shape, dtype) in zip(tensors, self.specs, strict=True):
            if not isinstance(t, torch.Tensor) or t.shape != shape or t.dtype != dtype:
                return "an argument's shape or dtype"
        return None


def _per_callable(value, n: int, name: str) -> tuple:
    if isinstance(value, tuple):
        if len(value) != n:
            raise ValueError(
                f"make_graphed_callables: {name}: expected one value per callable ({n}), got {len(value)}"
            )
        return value
    return (value,) * n


def _split_kwargs(kwargs: dict | None, name: str) -> tuple[tuple[str, ...], dict]:
    """(names of the tensor kwargs, the other kwargs fixed at capture)."""
    if kwargs is None:
        return (), {}
    if not isinstance(kwargs, dict):
        raise TypeError(
            f"make_graphed_callables: {name}: expected a dict or None, got {type(kwargs).__name__}"
        )
    tensors = tuple(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    return tensors, {k: v for k, v in kwargs.items() if k not in tensors}


def _check_args(args, name: str) -> tuple:
    if not isinstance(args, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in args):
        raise TypeError(
            f"make_graphed_callables: {name}: expected a tuple of tensors (the callable's positional "
            f"arguments), got {args!r:.200}"
        )
    return tuple(args)


def _recipe_states(callables) -> list:
    """(GemmState, "fwd" | "bwd") of every te module in ``callables``: where each delayed-scaling
    state is or will be (a state may not exist before the module first runs quantized)."""
    out = []
    for c in callables:
        if isinstance(c, torch.nn.Module):
            for m in c.modules():
                if isinstance(m, QuantizedModule):
                    out.extend((g, d) for g in m._gemms.values() for d in ("fwd", "bwd"))
    return out


class _Undo:
    """Snapshots what warmup steps change (delayed-scaling state, main_grad) and puts it back in
    place (the graphs read and write those very buffers)."""

    def __init__(self, callables) -> None:
        self.states = [(g, d, self._clone(getattr(g, d))) for g, d in _recipe_states(callables)]
        params = {id(p): p for c in callables if isinstance(c, torch.nn.Module) for p in c.parameters()}
        self.grads = [
            (p, p.main_grad.clone()) for p in params.values() if getattr(p, "main_grad", None) is not None
        ]

    @staticmethod
    def _clone(st):
        return None if st is None else (st.amax_history.clone(), st.scale.clone())

    def restore(self) -> None:
        with torch.no_grad():
            for g, d, saved in self.states:
                st = getattr(g, d)
                if st is None:
                    continue
                if saved is None or saved[0].shape != st.amax_history.shape:
                    st.amax_history.zero_()  # created by the warmup: back to a fresh state
                    st.scale.fill_(1.0)
                else:
                    st.amax_history.copy_(saved[0])
                    st.scale.copy_(saved[1])
            for p, saved in self.grads:
                p.main_grad.copy_(saved)


@contextlib.contextmanager
def _no_collection_inside():
    """Garbage collected before the warmup and capture, and the cyclic collector paused through
    them. A dropped graphed callable (te's or torch's) is freed only by the cyclic collector
    (torch's graphed autograd Function is a class holding the graphs), torch.cuda.graph no longer
    collects before capturing, and a collection that frees a CUDA graph inside another capture
    invalidates that capture (measured on the H200: cudaErrorStreamCaptureInvalidated at the next
    kernel launch, whoever made the dropped graph)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# torch.cuda.make_graphed_callables runs its warm-up steps on a side stream and then captures on
# another, so the parameters' AccumulateGrad nodes made in the warm-up receive the captured
# backward's gradients from a different stream, and torch (2.10 on) warns of it. The warning is
# torch's own protocol's (torch.cuda.make_graphed_callables alone raises it), a te user can do
# nothing about it, and the replays raise none: twenty graphed steps of a te.Linear on an H100
# warned nothing after the capture (benchmarks/NOTES.md, fortieth session). Ignored during the
# capture only, so the same mismatch in the user's own steps still warns.
_WARMUP_STREAM_WARNING = r"The AccumulateGrad node's stream does not match"


_LEGACY = {
    "fp8_enabled": "enabled",
    "fp8_calibrating": "calibrating",
    "fp8_recipe": "recipe",
    "fp8_group": "amax_reduction_group",
    "fp8_weight_caching": "cache_quantized_params",
}


def make_graphed_callables(
    modules,
    sample_args,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    sample_kwargs=None,
    enabled=None,
    calibrating=None,
    recipe=None,
    amax_reduction_group=None,
    cache_quantized_params=None,
    pool=None,
    retain_graph_in_backward: bool = False,
    _order=None,
    _num_layers_per_chunk=None,
    pre_warmup_hook: Callable | None = None,
    post_warmup_hook: Callable | None = None,
    capture_time_hooks=None,
    **legacy,
):
    """Capture the forward and backward of each callable (a te module, a model of them, or a
    function of tensors) as CUDA graphs, replayed on every later call (TE's function).

    Args:
        modules: a callable or a tuple of callables, in the order a step runs them.
        sample_args: each callable's positional arguments (a tuple of tensors; a tuple of such
            tuples for several callables). Their shapes, dtypes and ``requires_grad`` are the
            graph's: later calls with other shapes or dtypes run eagerly.
        num_warmup_iters: eager steps before capture (their effect on delayed-scaling state and
            on ``main_grad`` is undone).
        allow_unused_input: as torch.cuda.make_graphed_callables.
        sample_kwargs: each callable's keyword arguments (dict, or a tuple of dicts): tensors are
            graph inputs, other values are fixed at capture.
        enabled / calibrating / recipe / amax_reduction_group: the te.autocast region each
            forward is captured in (bool or a tuple of bools per callable for enabled /
            calibrating; None: False); the DelayedScaling update runs inside the graphs.
        pool: a graph memory pool handle shared with other graphs (torch.cuda.graph_pool_handle()).
        pre_warmup_hook / post_warmup_hook: called with no arguments before / after the warmup.
        cache_quantized_params, retain_graph_in_backward, _order, _num_layers_per_chunk,
        capture_time_hooks: not implemented in te yet (NotImplementedError when set).
        fp8_enabled, fp8_calibrating, fp8_recipe, fp8_group, fp8_weight_caching: TE's old
            names (deprecated).

    Returns:
        The callables graphed: modules are returned themselves with their ``forward`` replaced,
        functions as new functions; a single callable when one was given.
    """
    for old, new in _LEGACY.items():
        if old in legacy:
            warnings.warn(
                f"make_graphed_callables: {old} is deprecated; use {new}", DeprecationWarning, stacklevel=2
            )
            value = legacy.pop(old)
            if new == "enabled":
                enabled = value
            elif new == "calibrating":
                calibrating = value
            elif new == "recipe":
                recipe = value
            elif new == "amax_reduction_group":
                amax_reduction_group = value
            else:
                cache_quantized_params = value
    if legacy:
        raise TypeError(f"make_graphed_callables: unexpected keyword argument {next(iter(legacy))!r}")
    for name, value in (
        ("cache_quantized_params", cache_quantized_params),
        ("retain_graph_in_backward", retain_graph_in_backward),
        ("_order", _order),
        ("_num_layers_per_chunk", _num_layers_per_chunk),
        ("capture_time_hooks", capture_time_hooks),
    ):
        if value:
            raise NotImplementedError(
                f"make_graphed_callables: {name}={value!r} is not implemented in te yet"
            )
    if not isinstance(num_warmup_iters, int) or num_warmup_iters < 0:
        raise ValueError(
            f"make_graphed_callables: num_warmup_iters: expected an int >= 0, got {num_warmup_iters!r}"
        )

    single = not isinstance(modules, tuple)
    callables = (modules,) if single else modules
    if not callables or not all(callable(c) for c in callables):
        raise TypeError(
            "make_graphed_callables: modules: expected a callable or a tuple of callables, got "
            f"{modules!r:.200}"
        )
    n = len(callables)
    if single:
        sample_args = (sample_args,)
    elif not isinstance(sample_args, tuple) or len(sample_args) != n:
        raise ValueError(
            f"make_graphed_callables: sample_args: expected a tuple of {n} tuples of tensors "
            "(one per callable)"
        )
    args = [
        _check_args(a, "sample_args" if single else f"sample_args[{i}]") for i, a in enumerate(sample_args)
    ]
    kw_list = (sample_kwargs,) if single else _per_callable(sample_kwargs, n, "sample_kwargs")
    kws = [_split_kwargs(k, "sample_kwargs") for k in kw_list]
    enabled_t = tuple(bool(e) for e in _per_callable(enabled, n, "enabled"))
    calibrating_t = tuple(bool(c) for c in _per_callable(calibrating, n, "calibrating"))
    regions = []
    for e, c in zip(enabled_t, calibrating_t, strict=True):
        region = autocast(e, c, recipe, amax_reduction_group)  # resolves None, checks the type
        regions.append((e, c, region.recipe, amax_reduction_group))

    captured = [
        _Captured(c, len(a), kw[0], kw[1], r)
        for c, a, kw, r in zip(callables, args, kws, regions, strict=True)
    ]
    flat = [a + tuple(kw_list[i][k] for k in kws[i][0]) if kws[i][0] else a for i, a in enumerate(args)]
    on_cuda = torch.cuda.is_available() and any(
        t.is_cuda
        for t in (
            *(t for f in flat for t in f),
            *(p for c in callables if isinstance(c, torch.nn.Module) for p in c.parameters()),
        )
    )
    for cap, c in zip(captured, callables, strict=True):
        if isinstance(c, torch.nn.Module):
            cap.train(c.training)
    if on_cuda:
        undo = _Undo(callables)
        if pre_warmup_hook is not None:
            pre_warmup_hook()
        try:
            with _no_collection_inside(), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_WARMUP_STREAM_WARNING, category=UserWarning)
                graphed = torch.cuda.make_graphed_callables(
                    tuple(captured), tuple(flat), num_warmup_iters, allow_unused_input, pool
                )
        finally:  # a failed capture leaves the modules as they were too
            undo.restore()
        if post_warmup_hook is not None:
            post_warmup_hook()
    else:
        _info_once(
            "cpu", "te.make_graphed_callables: no CUDA tensors, so no CUDA graphs: the callables run eagerly"
        )
        graphed = captured
    out = []
    for i, (c, g) in enumerate(zip(callables, graphed, strict=True)):
        module = c if isinstance(c, torch.nn.Module) else None
        eager = c.forward if module is not None else c
        name = type(c).__name__ if module is not None else getattr(c, "__name__", "callable")
        d = _Dispatch(f"{name} #{i}", eager, g.forward, module, flat[i], kws[i], regions[i])
        if module is not None:
            module.forward = d
            out.append(module)
        else:
            out.append(d)
    return out[0] if single else tuple(out)
