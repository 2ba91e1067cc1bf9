"""``te.GroupedLinear``: ``num_gemms`` linear maps over consecutive row groups of one input (a
mixture-of-experts layer's experts after the tokens are sorted by expert), TE's module and names.

Rows ``m_splits[0]`` of the input go through ``weight0`` / ``bias0``, the next ``m_splits[1]``
through ``weight1`` / ``bias1``, and so on; the outputs are concatenated in the same order. Each
GEMM is a te.Linear step of its own (``_linear.linear_step``): inside ``te.autocast`` it has its
own quantizers and, under DelayedScaling, its own amax history and scales (TE's layout: GEMM i's
input, weight and output in forward columns 3i..3i+2, its grad_output and grad_input in backward
columns 2i..2i+1, so a TE checkpoint's ``_extra_state`` loads). The GEMMs run one after another
on the current stream; TE's grouped GEMM kernel is not used. Eagerly under the per-tensor and
block recipes the groups' steps run inside one autograd Function (GroupedStepFn), each as
te.Linear's fused step (_linear_step) writing its rows of one output (and, in backward, of one
input gradient): no autograd node, split or concatenation per group.

Tensor parallelism (``parallel_mode``, ``tp_group``, ``tp_size``, ``sequence_parallel``) only
sizes and labels the parameters, as in TE: a column split keeps ``out_features / tp_size`` rows of
each weight, a row split ``in_features / tp_size`` columns, and the module runs no collective
(a mixture-of-experts layer's token dispatcher does them).
"""

from __future__ import annotations

import numbers

import torch

from te_torch import _autocast, _linear_step
from te_torch._availability import default_device
from te_torch._fast_apply import raw_apply, transforms_active, wrapper_needed
from te_torch._gemm_state import GemmState
from te_torch._high_precision import linear
from te_torch._info_once import info_once
from te_torch._linear import linear_step
from te_torch._model_init import quantize_module_weights
from te_torch._module_base import (
    FLOAT_DTYPES,
    UNSUPPORTED_KWARGS,
    QuantizedModule,
    bad_input,
    check_init_method,
    check_params_dtype,
    check_size,
    init_weight,
    parameter,
    reject_kwargs,
)
from te_torch._quantized_tensor import QuantizedTensor, is_eager
from te_torch._tensor_parallel import SplitModule, mark_parallel, rng_fork, split_linear
from te_torch._token_pad import ALIGN

__all__ = ["GroupedLinear", "check_m_splits"]

_OWNER = "GroupedLinear"
# TE's GroupedLinear options te takes as given: a preference for TE's grouped-tensor GEMM path
# (te has one path), and its single-parameter layouts only when off
_ACCEPTED = (*UNSUPPORTED_KWARGS, "single_grouped_weight", "single_grouped_bias")


def check_m_splits(owner: str, m_splits, num_gemms: int, rows: int | None) -> list[int]:
    """``m_splits`` as a list of ``num_gemms`` ints >= 0 summing to ``rows`` (any sum for None):
    a sequence of ints or a 1-D integer tensor (read on the host: a CUDA tensor costs a
    synchronization)."""
    if isinstance(m_splits, torch.Tensor):
        if m_splits.dim() != 1 or m_splits.dtype.is_floating_point or m_splits.dtype == torch.bool:
            raise TypeError(
                f"{owner}: m_splits: expected a list of ints or a 1-D integer tensor, got a "
                f"{m_splits.dtype} tensor of shape {tuple(m_splits.shape)}"
            )
        m_splits = m_splits.tolist()
    try:
        splits = list(m_splits)
    except TypeError:
        raise TypeError(
            f"{owner}: m_splits: expected a list of ints, got {type(m_splits).__name__}"
        ) from None
    if len(splits) != num_gemms:
        raise ValueError(f"{owner}: m_splits: expected {num_gemms} sizes (one per GEMM), got {len(splits)}")
    for i, m in enumerate(splits):
        if not isinstance(m, numbers.Integral) or isinstance(m, bool) or m < 0:
            raise ValueError(f"{owner}: m_splits[{i}]: expected an int >= 0, got {m!r}")
    splits = [int(m) for m in splits]
    if rows is not None and sum(splits) != rows:
        raise ValueError(
            f"{owner}: m_splits: sizes {splits} sum to {sum(splits)}, expected the input's rows "
            f"(the product of its leading dims) = {rows}"
        )
    return splits


class _GroupCtx:
    """One group's part of GroupedStepFn's context: what _linear_step.forward keeps for its
    backward, and the gradients its backward is asked for."""

    __slots__ = (
        "needs_input_grad", "packed", "plan", "c", "fuse", "saved_buf", "keep", "sp", "w_bwd", "x_dtype",
        "weight", "w_dtype", "b_dtype",
    )  # fmt: skip


def grouped_forward(ctx, x, splits, first, fuse: bool, cs, weights, biases) -> torch.Tensor:
    """Every group's fused step (_linear_step.forward) into its rows of one output [M, N]; with
    ``ctx`` (GroupedStepFn's) ``ctx.groups`` holds each non-empty group's _GroupCtx and each empty
    group's parameter (shape, dtype)s, for its zero gradients."""
    out = torch.empty((x.shape[0], weights[0].shape[0]), dtype=x.dtype, device=x.device)
    need_dx = ctx is not None and ctx.needs_input_grad[0]
    groups = []
    r0 = 0
    for m, c, w, b in zip(splits, cs, weights, biases, strict=True):
        g = None
        if m:
            need = None
            if ctx is not None:
                g = _GroupCtx()
                g.needs_input_grad = (need_dx, w.requires_grad, b is not None and b.requires_grad)
                need = g.needs_input_grad[:2]
            _linear_step.forward(g, x[r0 : r0 + m], w, b, c, first, fuse, need, out[r0 : r0 + m])
        elif ctx is not None:
            g = ((w.shape, w.dtype), None if b is None else (b.shape, b.dtype))
        groups.append(g)
        r0 += m
    if ctx is not None:
        ctx.groups = groups
    return out


class GroupedStepFn(torch.autograd.Function):
    """Eager per-tensor / block FP8 steps of every group in one Function (see the module
    docstring): forward(x [M, K] contiguous, splits, first, fuse, contexts, *weights, *biases)."""

    @staticmethod
    def forward(ctx, x, splits, first, fuse, cs, *params):
        n = len(splits)
        out = grouped_forward(ctx, x, splits, first, fuse, cs, params[:n], params[n:])
        ctx.splits, ctx.fuse = splits, fuse
        ctx.x_shape = x.shape
        return out

    @staticmethod
    def backward(ctx, dy):
        if type(dy) is not torch.Tensor and isinstance(dy, QuantizedTensor):
            dy = dy.dequantize()
        if not dy.is_contiguous():
            dy = dy.contiguous()
        n = len(ctx.splits)
        need = ctx.needs_input_grad
        dx = torch.empty(ctx.x_shape, dtype=dy.dtype, device=dy.device) if need[0] else None
        dws, dbs = [None] * n, [None] * n
        r0 = 0
        for i, (m, g) in enumerate(zip(ctx.splits, ctx.groups, strict=True)):
            if m:
                rows = slice(r0, r0 + m)
                _, dws[i], dbs[i], *_ = _linear_step.backward(g, dy[rows], None if dx is None else dx[rows])
            else:  # an empty product: zero gradients (main_grad left as it is)
                w_like, b_like = g
                if need[5 + i] and not ctx.fuse:
                    dws[i] = torch.zeros(w_like[0], dtype=w_like[1], device=dy.device)
                if need[5 + n + i]:
                    dbs[i] = torch.zeros(b_like[0], dtype=b_like[1], device=dy.device)
            r0 += m
        return (dx, None, None, None, None, *dws, *dbs)


_GROUPED_APPLY = raw_apply(GroupedStepFn)


class GroupedLinear(QuantizedModule, SplitModule):
    """TE's ``GroupedLinear``: ``y[rows of group i] = x[rows of group i] W_i^T + b_i`` for
    ``num_gemms`` weights, x [..., in_features] -> y [..., out_features], the groups being
    consecutive runs of x's rows (its leading dims flattened) of sizes ``m_splits``.

    Args:
        num_gemms: the number of weights (experts).
        in_features, out_features: sizes of the last dimension of input and output.
        bias: learn additive biases ``bias0`` ... (each [out_features], initialised to zero).
        params_dtype, device, init_method, fuse_wgrad_accumulation, name: as ``te.Linear``
            (each ``weight{i}`` initialised by ``init_method``; with fuse_wgrad_accumulation each
            weight's gradient is accumulated into its own ``main_grad``).
        return_bias: return ``(x W_i^T, [bias0, ...])`` instead of adding the biases.
        parallel_mode, tp_group, tp_size, sequence_parallel, get_rng_state_tracker,
        rng_tracker_name: as ``te.Linear``'s for the parameters' sizes, attributes and
            initialization; no collective runs in the module (see the module docstring).
    Parameters: ``weight{i}`` [out_features, in_features] and ``bias{i}`` [out_features] for i
    in range(num_gemms) (TE's names, so TE checkpoints load); ``bias{i}`` is None without bias.
    TE's ``single_grouped_weight`` / ``single_grouped_bias`` layouts raise NotImplementedError;
    ``use_grouped_tensor`` is accepted (te runs one path), ``delay_wgrad_compute`` as by every te
    module (weight gradients in backward; docs/linear.rst).
    """

    def __init__(
        self,
        num_gemms: int,
        in_features: int,
        out_features: int,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group=None,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        rng_tracker_name=None,
        init_method=None,
        bias: bool = True,
        return_bias: bool = False,
        params_dtype: torch.dtype | None = None,
        parallel_mode: str | None = None,
        device=None,
        name: str | None = None,
        use_grouped_tensor: bool | None = None,
        **kwargs,
    ) -> None:
        super().__init__()
        reject_kwargs(_OWNER, kwargs, _ACCEPTED)
        check_size(_OWNER, "num_gemms", num_gemms)
        check_size(_OWNER, "in_features", in_features)
        check_size(_OWNER, "out_features", out_features)
        check_init_method(_OWNER, "init_method", init_method)
        check_init_method(_OWNER, "get_rng_state_tracker", get_rng_state_tracker)
        params_dtype = check_params_dtype(_OWNER, params_dtype)
        device = default_device() if device is None else torch.device(device)
        if use_grouped_tensor:
            info_once(
                "GroupedLinear use_grouped_tensor",
                "te.GroupedLinear: use_grouped_tensor=True asks for Transformer Engine's grouped-GEMM "
                "path; te runs each group's GEMM in turn on the current stream",
            )
        in_features, out_features, _ = split_linear(
            self, _OWNER, in_features, out_features, None, tp_group, tp_size, parallel_mode,
            sequence_parallel, (get_rng_state_tracker, rng_tracker_name),
        )  # fmt: skip
        # the module runs no collective: the row split's sum is its caller's
        self._tp = None
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.use_bias, self.return_bias = bool(bias), bool(return_bias)
        # TE adds a row split's biases after the GEMMs (where the caller's sum would come first)
        self._gemm_adds_bias = not (self.return_bias or self.parallel_mode == "row")
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self.init_method, self.name, self.params_dtype = init_method, name, params_dtype
        self._weight_names = tuple(f"weight{i}" for i in range(num_gemms))
        self._bias_names = tuple(f"bias{i}" for i in range(num_gemms))
        for w, b in zip(self._weight_names, self._bias_names, strict=True):
            weight = torch.empty(out_features, in_features, dtype=params_dtype, device=device)
            self.register_parameter(w, torch.nn.Parameter(weight))
            self.register_parameter(
                b,
                torch.nn.Parameter(torch.zeros(out_features, dtype=params_dtype, device=device))
                if bias
                else None,
            )
        self._features = (("in_features", in_features), ("out_features", out_features))
        self._gemm_states = tuple(GemmState("te.GroupedLinear", self._features) for _ in range(num_gemms))
        self._gemms = {f"gemm{i}": g for i, g in enumerate(self._gemm_states)}
        self.reset_parameters()
        quantize_module_weights(self, self._weight_names, _OWNER, None)

    def reset_parameters(self, defer_init: bool = False) -> None:
        """Each weight from ``init_method`` (default normal(0, 0.023)) under the RNG tracker's
        fork where one was given; biases zero; TE's tensor-parallel attributes set."""
        if defer_init:
            return
        weights = [getattr(self, n) for n in self._weight_names]
        biases = [b for b in (getattr(self, n) for n in self._bias_names) if b is not None]
        with rng_fork(*self._rng):
            for w in weights:
                init_weight(w, self.init_method)
        with torch.no_grad():
            for b in biases:
                if b.device.type != "meta":
                    b.zero_()
        mark_parallel(weights, biases, self.parallel_mode, self.sequence_parallel)
        for g in self._gemm_states:
            g.ctx = None

    def _state_device(self) -> torch.device:
        return getattr(self, self._weight_names[0]).device

    def extra_repr(self) -> str:
        return (
            f"num_gemms={self.num_gemms}, in_features={self.in_features}, "
            f"out_features={self.out_features}, bias={self.use_bias}"
        )

    def forward(self, inp: torch.Tensor, m_splits, is_first_microbatch: bool | None = None):
        """y [..., out_features] of ``inp`` [..., in_features] (float32 / bfloat16 / float16),
        quantized inside te.autocast, each GEMM with its own scales.

        m_splits: ``num_gemms`` row counts (ints >= 0, or a 1-D integer tensor) summing to the
            input's rows (its leading dims flattened); group i's rows follow group i - 1's. A
            group of 0 rows gets zero gradients. Per-tensor FP8 pads each group's rows inside,
            as te.Linear does; MXFP8 / NVFP4 need each group's rows a multiple of the block
            (te.Fp8Padding pads them).
        is_first_microbatch: as ``te.Linear``'s, for every weight.
        Returns y, or ``(y, [bias0, ...])`` with ``return_bias``.
        """
        try:  # free unless it raises: a 0-dim tensor or a non-tensor fails in shape[-1]
            if inp.shape[-1] != self.in_features or inp.dtype not in FLOAT_DTYPES:
                bad_input(_OWNER, inp, self.in_features)
        except (AttributeError, IndexError):
            bad_input(_OWNER, inp, self.in_features)
        k = self.in_features
        splits = check_m_splits(_OWNER, m_splits, self.num_gemms, inp.numel() // k)
        fuse, adds = self.fuse_wgrad_accumulation, self._gemm_adds_bias
        biases = [parameter(self, n) for n in self._bias_names]
        s = _autocast.STATE
        # a row split's biases are added after the GEMMs: the per-group path below does that
        row_bias = self.use_bias and not (adds or self.return_bias)
        if s.fp8 and not row_bias and is_eager(inp) and not transforms_active():
            weights = [parameter(self, n) for n in self._weight_names]
            states = zip(self._gemm_states, weights, strict=True)
            cs = [g.ctx_for(s.recipe, s.group, w.device) for g, w in states]
            # per-tensor steps pad a group's rows inside; block-scaled GEMMs need them aligned
            # (cuBLASLt's refuse M=37), which the per-group path pads
            if all(c.packed_ok and (c.per_tensor or m % ALIGN == 0) for c, m in zip(cs, splits, strict=True)):
                gb = biases if adds else None
                out = self._forward_grouped(inp, splits, is_first_microbatch, cs, weights, gb)
                return (out, biases) if self.return_bias else out
        chunks = torch.split(inp.reshape(-1, k), splits)
        outs = []
        for i, (x, m) in enumerate(zip(chunks, splits, strict=True)):
            w, b = parameter(self, self._weight_names[i]), biases[i]
            gemm_bias = b if adds else None
            if m == 0:  # nothing to quantize: an empty product whose gradients are zeros
                y = linear(x, w, gemm_bias, fuse)
            else:
                owner = f"{_OWNER} (GEMM {i}, m_splits[{i}]={m})"
                y = linear_step(
                    owner, self._gemm_states[i], self._features, x, w, gemm_bias, is_first_microbatch, fuse
                )
            if b is not None and not adds and not self.return_bias:
                y = y + b.to(y.dtype)
            outs.append(y)
        out = torch.cat(outs).view(*inp.shape[:-1], self.out_features)
        return (out, biases) if self.return_bias else out

    def _forward_grouped(self, inp, splits, first, cs, weights, biases) -> torch.Tensor:
        """forward() through GroupedStepFn (every context packed_ok, eager): y [..., N]."""
        for m, c in zip(splits, cs, strict=True):
            if m and c.delayed:
                _autocast.register_forward(c.fwd_entry)
        x = inp.reshape(-1, self.in_features)
        if not x.is_contiguous():
            x = x.contiguous()
        gb = [None] * self.num_gemms if biases is None else biases
        fuse = self.fuse_wgrad_accumulation
        if torch.is_grad_enabled():
            apply = GroupedStepFn.apply if wrapper_needed() else _GROUPED_APPLY
            out = apply(x, tuple(splits), first, fuse, cs, *weights, *gb)
        else:
            out = grouped_forward(None, x, splits, first, fuse, cs, weights, gb)
        return out if inp.dim() == 2 else out.view(*inp.shape[:-1], self.out_features)
