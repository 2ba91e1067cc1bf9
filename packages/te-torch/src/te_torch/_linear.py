"""``te.Linear``: y = x W^T + b, quantized inside ``te.autocast`` (TE's module and names).

Outside autocast the layer is a plain high-precision linear through torch's own F.linear
(on CPU, MKL beats te's reference GEMM; te's CUDA GEMM will take over there once it is on by
default). Inside, te_torch._linear_fn.LinearFn runs fprop/dgrad/wgrad as quantized GEMMs.

Per-module state (NUMERICS.md "DelayedScaling"): under DelayedScaling the module owns forward
(amax_history [L, 3], scale [3]: input, weight, output) and backward (amax_history [L, 2],
scale [2]: grad_output, grad_input) fp32 buffers, created on first use. They are saved in
``state_dict()`` under ``_extra_state`` as a dict of plain tensors (``fwd_amax_history``,
``fwd_scale``, ``bwd_amax_history``, ``bwd_scale``; empty before any delayed-scaling step), so
``torch.load(..., weights_only=True)`` reads a checkpoint. Using one module twice in an
autocast region is allowed: both uses quantize with the same scale and the amax slot keeps the
larger amax (delayed quantizers max-accumulate), so the update sees the step's true maximum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from te_torch import _autocast
from te_torch._availability import default_device
from te_torch._linear_fn import _BWD_ROLES, _FWD_ROLES, FP8Context, LinearFn
from te_torch._recipe_state import DelayedState, recipe_key

__all__ = ["Linear"]


class _MainGradLinear(torch.autograd.Function):
    """High-precision y = x W^T + b whose weight gradient goes into ``weight.main_grad`` (fp32,
    accumulated unless ``weight.overwrite_main_grad``) instead of ``weight.grad``, as TE does
    for ``fuse_wgrad_accumulation`` outside FP8 too."""

    @staticmethod
    def forward(ctx, inp, weight, bias):
        w = weight if weight.dtype == inp.dtype else weight.to(inp.dtype)
        ctx.save_for_backward(inp, w)
        ctx.weight = weight
        ctx.has_bias = bias is not None
        return F.linear(inp, w, bias)

    @staticmethod
    def backward(ctx, dy):
        inp, w = ctx.saved_tensors
        weight = ctx.weight
        dy2 = dy.reshape(-1, dy.shape[-1])
        dw = dy2.t().float() @ inp.reshape(-1, inp.shape[-1]).float()
        if getattr(weight, "overwrite_main_grad", False):
            weight.main_grad.copy_(dw)
        else:
            weight.main_grad.add_(dw)
        if hasattr(weight, "grad_added_to_main_grad"):
            weight.grad_added_to_main_grad = True
        dx = dy @ w if ctx.needs_input_grad[0] else None
        db = dy2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, None, db


_FLOAT = (torch.float32, torch.bfloat16, torch.float16)
_STATE = _autocast.STATE
_UNSUPPORTED = (
    "ub_overlap_ag",
    "ub_overlap_rs",
    "ub_overlap_rs_dgrad",
    "ub_bulk_dgrad",
    "ub_bulk_wgrad",
    "ub_name",
    "symmetric_ar_type",
    "delay_wgrad_compute",
    "save_original_input",
)


class Linear(torch.nn.Module):
    """TE's ``Linear``: ``y = x W^T + b`` for x [..., in_features] -> [..., out_features].

    Args:
        in_features, out_features: sizes of the last dimension of input and output.
        bias: learn an additive bias (``self.bias``, [out_features], initialised to zero).
        params_dtype: dtype of the parameters (default torch.get_default_dtype()).
        device: where the parameters live (default: CUDA when te can run there, else CPU).
        init_method: callable(weight) initialising the weight; default normal(0, 0.023) (TE's).
        return_bias: return ``(x W^T, b)`` instead of adding b (for a later fused bias add).
        fuse_wgrad_accumulation: the weight gradient is accumulated into ``weight.main_grad``
            (an fp32 buffer you attach; ``weight.overwrite_main_grad = True`` overwrites it)
            and ``weight.grad`` stays None.
        parameters_split: a tuple of names (equal parts) or a dict name -> size: the weight
            (and bias) are registered as separate parameters ``{name}_weight`` / ``{name}_bias``
            along dim 0, concatenated in forward.
        name: a label (TE's; not used in computation).
    Tensor/sequence parallelism, userbuffers and delayed wgrad are not implemented yet; setting
    them raises NotImplementedError.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group=None,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        rng_tracker_name=None,
        init_method=None,
        return_bias: bool = False,
        params_dtype: torch.dtype | None = None,
        parallel_mode: str | None = None,
        parameters_split=None,
        device=None,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__()
        for key, value in kwargs.items():
            if key not in _UNSUPPORTED:
                raise TypeError(f"Linear: unexpected keyword argument {key!r}")
            if value:
                raise NotImplementedError(f"Linear: {key}={value!r} is not implemented in te yet")
        if sequence_parallel or tp_size != 1 or tp_group is not None or parallel_mode is not None:
            raise NotImplementedError(
                "Linear: tensor/sequence parallelism (tp_group, tp_size, parallel_mode, "
                "sequence_parallel) is not implemented in te yet"
            )
        for arg, v in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Linear: {arg}: expected an int >= 1, got {v!r}")
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        if params_dtype not in _FLOAT:
            raise TypeError(
                f"Linear: params_dtype: expected float32, bfloat16 or float16, got {params_dtype}"
            )
        device = default_device() if device is None else torch.device(device)
        self.in_features, self.out_features = in_features, out_features
        self.use_bias, self.return_bias = bool(bias), bool(return_bias)
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self.init_method, self.name = init_method, name
        self.params_dtype = params_dtype
        self._split = _split_sizes(parameters_split, out_features)
        if self._split is not None and self.fuse_wgrad_accumulation:
            raise NotImplementedError(
                "Linear: fuse_wgrad_accumulation with parameters_split is not implemented yet"
            )
        weight = torch.empty(out_features, in_features, dtype=params_dtype, device=device)
        b = torch.zeros(out_features, dtype=params_dtype, device=device) if bias else None
        if self._split is None:
            self.weight = torch.nn.Parameter(weight)
            self.bias = None if b is None else torch.nn.Parameter(b)
            self._weight_names, self._bias_names = ("weight",), ("bias",) if bias else ()
        else:
            self._weight_names = tuple(f"{n}_weight" for n in self._split)
            self._bias_names = tuple(f"{n}_bias" for n in self._split) if bias else ()
            for i, (n, w) in enumerate(
                zip(self._weight_names, weight.split(list(self._split.values())), strict=True)
            ):
                self.register_parameter(n, torch.nn.Parameter(w))
                if bias:
                    self.register_parameter(
                        self._bias_names[i], torch.nn.Parameter(b.split(list(self._split.values()))[i])
                    )
            self.bias = None
        self._fp8: FP8Context | None = None
        self._fwd_state: DelayedState | None = None
        self._bwd_state: DelayedState | None = None
        self.reset_parameters()

    def reset_parameters(self, defer_init: bool = False) -> None:
        """Weight from ``init_method`` (default normal(0, 0.023)), bias zero."""
        if defer_init:
            return
        with torch.no_grad():
            for n in self._weight_names:
                w = getattr(self, n)
                if w.device.type == "meta":
                    continue
                if self.init_method is not None:
                    self.init_method(w)
                else:
                    w.normal_(0.0, 0.023)
            for n in self._bias_names:
                b = getattr(self, n)
                if b.device.type != "meta":
                    b.zero_()
        self._fp8 = None

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.use_bias}"

    # -- forward ---------------------------------------------------------------------------------

    def forward(
        self,
        inp: torch.Tensor,
        is_first_microbatch: bool | None = None,
        fp8_output: bool = False,
        fp8_grad: bool = False,
    ):
        """y = inp W^T + b; quantized inside te.autocast. See the class docstring.

        is_first_microbatch: None: quantize the weight every call; True: quantize it and cache
            the quantized copy; False: reuse the cached copy (gradient-accumulation microbatches).
        fp8_output / fp8_grad: not implemented yet (NotImplementedError).
        """
        if inp.shape[-1] != self.in_features or inp.dtype not in _FLOAT:
            self._bad_input(inp)
        if fp8_output or fp8_grad:
            raise NotImplementedError("Linear: fp8_output / fp8_grad are not implemented in te yet")
        if self._split is None:
            weight, bias = self.weight, self.bias
        else:
            weight = torch.cat([getattr(self, n) for n in self._weight_names])
            bias = torch.cat([getattr(self, n) for n in self._bias_names]) if self._bias_names else None
        gemm_bias = None if self.return_bias else bias
        s = _STATE
        if s.fp8:
            c = self._fp8
            if c is None or c.recipe is not s.recipe or c.device != weight.device:
                c = self._fp8_context(s.recipe, s.group, weight.device)
            if c.delayed:
                _autocast.register_forward(c.fwd_key, c.recipe, c.fwd)
            out = LinearFn.apply(inp, weight, gemm_bias, c, is_first_microbatch, self.fuse_wgrad_accumulation)
        else:
            if s.calibrating:
                self._calibrate(inp, weight, s)
            if gemm_bias is not None and gemm_bias.dtype != inp.dtype:
                gemm_bias = gemm_bias.to(inp.dtype)
            if self.fuse_wgrad_accumulation and weight.requires_grad and torch.is_grad_enabled():
                out = _MainGradLinear.apply(inp, weight, gemm_bias)
            else:
                w = weight if weight.dtype == inp.dtype else weight.to(inp.dtype)
                out = F.linear(inp, w, gemm_bias)
        return (out, bias) if self.return_bias else out

    def _bad_input(self, inp) -> None:
        if not isinstance(inp, torch.Tensor):
            raise TypeError(f"Linear: inp: expected a torch.Tensor, got {type(inp).__name__}")
        if inp.dtype not in _FLOAT:
            raise TypeError(
                f"Linear: inp: expected float32, bfloat16 or float16 (the output and the GEMMs use "
                f"the input's dtype), got {inp.dtype}; cast it, e.g. inp.to(torch.bfloat16)"
            )
        raise ValueError(
            f"Linear: inp: expected the last dimension to be in_features={self.in_features}, got "
            f"shape {tuple(inp.shape)}; reshape the input to [..., {self.in_features}]"
        )

    # -- recipe state ----------------------------------------------------------------------------

    def _fp8_context(self, recipe, group, device) -> FP8Context:
        fwd = bwd = None
        if recipe.delayed():
            fwd, bwd = self._delayed_states(recipe.amax_history_len, device)
        self._fp8 = FP8Context(recipe, device, fwd, bwd, group)
        return self._fp8

    def _delayed_states(self, history_len: int, device) -> tuple[DelayedState, DelayedState]:
        if self._fwd_state is None:
            self._fwd_state = DelayedState(history_len, _FWD_ROLES, device)
            self._bwd_state = DelayedState(history_len, _BWD_ROLES, device)
        elif self._fwd_state.amax_history.shape[0] != history_len:
            self._fwd_state.resize(history_len)
            self._bwd_state.resize(history_len)
            self._fp8 = None  # its quantizers view the old buffers
        return self._fwd_state, self._bwd_state

    def adjust_amax_history_length(self, length: int, fwd: bool | None = None) -> None:
        """Changes the DelayedScaling history length (keeps the newest rows), as TE's."""
        for st, is_fwd in ((self._fwd_state, True), (self._bwd_state, False)):
            if st is not None and (fwd is None or fwd == is_fwd):
                st.resize(length)
        self._fp8 = None

    def _calibrate(self, inp, weight, s) -> None:
        """calibrating=True: record input/weight amaxes into the delayed-scaling state."""
        r = s.recipe
        if r is None or not r.delayed():
            return
        fwd, _ = self._delayed_states(r.amax_history_len, weight.device)
        with torch.no_grad():
            for i, t in ((0, inp), (1, weight)):
                a = fwd.amax(i)
                torch.maximum(a, t.detach().abs().amax().float().reshape(1), out=a)
        _autocast.register_forward(recipe_key(r, False, s.group), r, fwd)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        dev = getattr(self, self._weight_names[0]).device
        for st in (self._fwd_state, self._bwd_state):
            if st is not None and st.scale.device != dev:
                st.amax_history, st.scale, st._descs = st.amax_history.to(dev), st.scale.to(dev), None
        self._fp8 = None
        return out

    def get_extra_state(self) -> dict[str, torch.Tensor]:
        """DelayedScaling state as plain tensors (see the module docstring)."""
        if self._fwd_state is None:
            return {}
        f, b = self._fwd_state, self._bwd_state
        return {
            "fwd_amax_history": f.amax_history.clone(),
            "fwd_scale": f.scale.clone(),
            "bwd_amax_history": b.amax_history.clone(),
            "bwd_scale": b.scale.clone(),
        }

    def set_extra_state(self, state) -> None:
        self._fp8 = None
        if (
            state is None
            or (isinstance(state, torch.Tensor) and state.numel() == 0)
            or (isinstance(state, dict) and not state)
        ):
            self._fwd_state = self._bwd_state = None
            return
        if not isinstance(state, dict):
            raise TypeError(
                f"Linear: _extra_state: expected a dict of tensors written by te.Linear, got "
                f"{type(state).__name__} (a Transformer Engine checkpoint's pickled FP8 metadata "
                "is not read; drop the _extra_state keys to start from fresh scales)"
            )
        dev = getattr(self, self._weight_names[0]).device
        fh = state["fwd_amax_history"]
        self._fwd_state = DelayedState(fh.shape[0], _FWD_ROLES, dev)
        self._bwd_state = DelayedState(state["bwd_amax_history"].shape[0], _BWD_ROLES, dev)
        for st, pre in ((self._fwd_state, "fwd"), (self._bwd_state, "bwd")):
            st.amax_history.copy_(state[f"{pre}_amax_history"])
            st.scale.copy_(state[f"{pre}_scale"])


def _split_sizes(split, out_features: int) -> dict[str, int] | None:
    if split is None:
        return None
    if isinstance(split, dict):
        sizes = {str(k): int(v) for k, v in split.items()}
    else:
        names = tuple(split)
        if not names or out_features % len(names):
            raise ValueError(
                f"Linear: parameters_split: {len(names)} names do not divide out_features="
                f"{out_features}; pass a dict name -> size"
            )
        sizes = dict.fromkeys((str(n).rstrip("_") for n in names), out_features // len(names))
    if sum(sizes.values()) != out_features:
        raise ValueError(
            f"Linear: parameters_split: sizes {list(sizes.values())} sum to "
            f"{sum(sizes.values())}, expected out_features={out_features}"
        )
    return {k.rstrip("_"): v for k, v in sizes.items()}
