"""``te.Linear``: y = x W^T + b, quantized inside ``te.autocast`` (TE's module and names).

Outside autocast the layer is a plain high-precision linear through torch's own F.linear
(on CPU, MKL beats te's reference GEMM; te's CUDA GEMM will take over there once it is on by
default). Inside, te_torch._linear_fn.LinearFn runs fprop/dgrad/wgrad as quantized GEMMs.

Per-module state (NUMERICS.md "DelayedScaling"): the GEMM's _gemm_state.GemmState, i.e. under
DelayedScaling forward (amax_history [L, 3], scale [3]: input, weight, output) and backward
(amax_history [L, 2], scale [2]: grad_output, grad_input) fp32 buffers, created on first use,
saved in ``state_dict()`` under ``_extra_state`` as a dict of plain tensors (``fwd_amax_history``,
``fwd_scale``, ``bwd_amax_history``, ``bwd_scale``; empty before any delayed-scaling step), so
``torch.load(..., weights_only=True)`` reads a checkpoint. Using one module twice in an
autocast region is allowed: both uses quantize with the same scale and the amax slot keeps the
larger amax (delayed quantizers max-accumulate), so the update sees the step's true maximum.

``fp8_output`` / ``fp8_grad`` and quantized inputs (TE's semantics, _fp8_io) go through
``_forward_io`` and LinearIOFn: the default call pays one ``type()`` check for them.
"""

from __future__ import annotations

import torch

from te_torch import _autocast, _linear_step
from te_torch._availability import default_device
from te_torch._fast_apply import raw_apply, transforms_active, wrapper_needed
from te_torch._fp8_io import check_flags, io_quantizers
from te_torch._gemm_state import GemmState, check_dims
from te_torch._high_precision import DequantizeFn, linear
from te_torch._linear_fn import LinearFn, LinearIOFn, LinearStepFn
from te_torch._model_init import quantize_module_weights
from te_torch._module_base import (
    FLOAT_DTYPES,
    SingleGemmModule,
    bad_input,
    check_init_method,
    check_params_dtype,
    check_size,
    detached,
    init_weight,
    parameter,
    reject_kwargs,
    warn_if_recomputed,
)
from te_torch._quantized_tensor import QuantizedTensor, is_eager
from te_torch._tensor_parallel import (
    SplitModule,
    mark_parallel,
    rng_fork,
    split_linear,
)
from te_torch._token_pad import pad, pad_count, unpad

__all__ = ["Linear"]

_Tensor = torch.Tensor

_STATE = _autocast.STATE
_LINEAR_APPLY = raw_apply(LinearFn)
_STEP_APPLY = raw_apply(LinearStepFn)


def register_linear_params(module, in_features, out_features, bias, split, params_dtype, device) -> None:
    """TE's weight / bias parameters of a linear map: ``weight`` [out, in] and ``bias`` [out]
    (zeros), or with ``split`` (name -> rows) ``{name}_weight`` / ``{name}_bias`` along dim 0.
    Sets ``module._weight_names`` / ``module._bias_names``; with a split ``module.bias`` is None."""
    weight = torch.empty(out_features, in_features, dtype=params_dtype, device=device)
    b = torch.zeros(out_features, dtype=params_dtype, device=device) if bias else None
    if split is None:
        module.weight = torch.nn.Parameter(weight)
        module.bias = None if b is None else torch.nn.Parameter(b)
        module._weight_names, module._bias_names = ("weight",), ("bias",) if bias else ()
        return
    sizes = list(split.values())
    module._weight_names = tuple(f"{n}_weight" for n in split)
    module._bias_names = tuple(f"{n}_bias" for n in split) if bias else ()
    for i, (n, w) in enumerate(zip(module._weight_names, weight.split(sizes), strict=True)):
        module.register_parameter(n, torch.nn.Parameter(w))
        if bias:
            module.register_parameter(module._bias_names[i], torch.nn.Parameter(b.split(sizes)[i]))
    module.bias = None


def linear_params(module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of register_linear_params' parameters (joined along dim 0 when split)."""
    if module._split is None:
        return parameter(module, "weight"), parameter(module, "bias")
    weight = _join([parameter(module, n) for n in module._weight_names])
    bias = _join([parameter(module, n) for n in module._bias_names]) if module._bias_names else None
    return weight, bias


class _JoinFn(torch.autograd.Function):
    """The split parameters as the one tensor whose consecutive views they are; the gradient
    splits back."""

    @staticmethod
    def forward(ctx, *parts):
        ctx.rows = [p.shape[0] for p in parts]
        return _span(parts)

    @staticmethod
    def backward(ctx, grad):
        return grad.split(ctx.rows)


def _span(parts) -> torch.Tensor:
    first = parts[0]
    rows = sum(p.shape[0] for p in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())


def _join(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(parts) without the copy while the parts still are consecutive views of one
    buffer (as register_linear_params makes them, and load_state_dict keeps them): a QKV
    weight is read whole every forward, and the copy cost a decode step a launch and the
    weight's bytes twice per layer."""
    first = parts[0]
    kind, dtype, row = type(first), first.dtype, first.shape[1:]
    if kind in (torch.Tensor, torch.nn.Parameter) and not torch.compiler.is_compiling():
        end = first.data_ptr()
        for p in parts:
            if type(p) is not kind or p.data_ptr() != end or p.dtype != dtype or p.shape[1:] != row:
                break
            if not p.is_contiguous():
                break
            end += p.numel() * p.element_size()
        else:
            # adjacent parts inside first's allocation are views of it (allocations never overlap)
            storage = first.untyped_storage()
            if end <= storage.data_ptr() + storage.nbytes():
                if torch.is_grad_enabled() and any(p.requires_grad for p in parts):
                    return _JoinFn.apply(*parts)
                return _span(parts)
    return torch.cat(parts)


def reset_linear_params(module) -> None:
    """register_linear_params' weights from ``module.init_method`` under the module's RNG tracker
    fork (``module._rng``, rng_fork), biases zero, and TE's tensor-parallel attributes on both."""
    weights = [getattr(module, n) for n in module._weight_names]
    biases = [getattr(module, n) for n in module._bias_names]
    with rng_fork(*module._rng):
        for w in weights:
            init_weight(w, module.init_method)
    with torch.no_grad():
        for b in biases:
            if b.device.type != "meta":
                b.zero_()
    mark_parallel(weights, biases, module.parallel_mode, module.sequence_parallel)


def linear_step(owner: str, gemm: GemmState, features, inp, weight, gemm_bias, first, fuse: bool):
    """``inp W^T`` (+ ``gemm_bias``) as a te module's GEMM runs it: quantized inside te.autocast
    with the module's state ``gemm`` (``features``: its sizes, for block scaling's checks), else in
    high precision (recording amaxes when calibrating); ``first`` is is_first_microbatch,
    ``fuse`` fuse_wgrad_accumulation. te.Linear's forward, and a tensor-parallel LayerNormLinear's
    GEMM after its norm and collective."""
    s = _STATE
    if s.fp8:
        c = gemm.ctx_for(s.recipe, s.group, weight.device)
        if c.delayed:
            _autocast.register_forward(c.fwd_entry)
        elif c.block:
            check_dims(owner, c.recipe, c.block, inp, features)
        eager = c.packed_ok and is_eager(inp)
        x = inp
        grad = torch.is_grad_enabled()
        if not (grad or eager):
            x, weight, gemm_bias = detached(inp, weight, gemm_bias)
        # the eager per-tensor step pads inside, with no output slice (_linear_step)
        n_pad = 0
        if not (c.block or (eager and c.per_tensor)):
            n_pad = pad_count(inp, weight, any_rows=c.per_tensor)
        x = pad(x, n_pad) if n_pad else x
        if grad or not eager:
            if eager and not transforms_active():
                apply = _STEP_APPLY
            else:
                apply = LinearFn.apply if wrapper_needed() else _LINEAR_APPLY
            out = apply(x, weight, gemm_bias, c, first, fuse)
        else:
            out = _linear_step.forward(None, x, weight, gemm_bias, c, first, False)
        if n_pad:
            out = unpad(out, inp.shape[:-1])
    else:
        if s.calibrating:
            gemm.calibrate(inp, weight, s.recipe, s.group)
        warn_if_recomputed(owner, gemm)
        out = linear(inp, weight, gemm_bias, fuse)
    return out


class Linear(SingleGemmModule, SplitModule):
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
        parallel_mode: None, or 'column' / 'row' to split the layer over the ranks of
            ``tp_group`` (tensor parallelism, Megatron-LM's scheme; te_torch._tensor_parallel):
            'column' keeps this rank's out_features / tp_size rows of the weight and bias and
            returns its columns of y ([..., out_features / tp_size]); 'row' keeps in_features /
            tp_size columns of the weight, takes that slice of the input's last dimension, and
            returns y summed over the ranks (the whole bias added after the sum).
            ``in_features`` / ``out_features`` then read the local sizes, as in TE.
        tp_group: the torch.distributed group of the split (its size is the split's), or None
            with ``tp_size`` and ``set_tensor_parallel_group(group)`` before the first forward.
        sequence_parallel: with a split over more than one rank, the activations outside the
            layer are split along their first dimension: a column layer all-gathers its input
            and a row layer reduce-scatters its output (that dimension must divide by tp_size).
        get_rng_state_tracker, rng_tracker_name: the weight is initialised under
            ``get_rng_state_tracker().fork()`` (``fork(rng_tracker_name)``), as TE does.
        delay_wgrad_compute: taken; the weight gradient is still computed in backward (logged
            once at INFO), so ``backward_dw()`` has nothing to do (docs/linear.rst).
    Userbuffers are not implemented yet; setting them raises NotImplementedError.
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
        owner = "Linear"
        reject_kwargs(owner, kwargs)
        check_size(owner, "in_features", in_features)
        check_size(owner, "out_features", out_features)
        check_init_method(owner, "init_method", init_method)
        check_init_method(owner, "get_rng_state_tracker", get_rng_state_tracker)
        params_dtype = check_params_dtype(owner, params_dtype)
        device = default_device() if device is None else torch.device(device)
        in_features, out_features, split = split_linear(
            self, owner, in_features, out_features, parameters_split, tp_group, tp_size, parallel_mode,
            sequence_parallel, (get_rng_state_tracker, rng_tracker_name),
        )  # fmt: skip
        self.in_features, self.out_features = in_features, out_features
        self.use_bias, self.return_bias = bool(bias), bool(return_bias)
        # a row split adds the bias after the sum over the ranks, not in the GEMM
        self._gemm_adds_bias = not (
            self.return_bias or (self._tp is not None and self.parallel_mode == "row")
        )
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self.init_method, self.name = init_method, name
        self.params_dtype = params_dtype
        self._split = split
        if self._split is not None and self.fuse_wgrad_accumulation:
            raise NotImplementedError(
                "Linear: fuse_wgrad_accumulation with parameters_split is not implemented yet"
            )
        register_linear_params(self, in_features, out_features, bias, self._split, params_dtype, device)
        self._features = (("in_features", in_features), ("out_features", out_features))
        self._gemm = GemmState("te.Linear", self._features)
        self._gemms = {"gemm": self._gemm}
        self.reset_parameters()
        quantize_module_weights(self, self._weight_names, "Linear", self._split)

    def reset_parameters(self, defer_init: bool = False) -> None:
        """Weight from ``init_method`` (default normal(0, 0.023)), under the RNG tracker's fork
        where one was given; bias zero; the tensor-parallel attributes set (TE's)."""
        if defer_init:
            return
        reset_linear_params(self)
        self._gemm.ctx = None

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

        inp: [..., in_features], float32 / bfloat16 / float16, or a te quantized tensor of that
            logical shape (e.g. another layer's ``fp8_output``): inside autocast its bytes and
            scales are the fprop operand as they are (never quantized again; its format must be
            the recipe's input format, else ValueError); outside autocast it is dequantized.
        is_first_microbatch: None: quantize the weight every call; True: quantize it and cache
            the quantized copy; False: reuse the cached copy (gradient-accumulation microbatches).
        fp8_output: inside autocast, return y [..., out_features] quantized in the forward format
            (Float8Tensor for DelayedScaling / Float8CurrentScaling, Float8BlockwiseQTensor for
            Float8BlockScaling, MXFP8Tensor / NVFP4Tensor for MXFP8BlockScaling /
            NVFP4BlockScaling) by this module's output quantizer (DelayedScaling: the output
            slot of its state), with y's nominal dtype; its gradient arrives in high precision.
        fp8_grad: inside autocast (and with grad enabled), the gradient of inp is returned
            quantized in the backward format (HYBRID: E5M2) by the grad-input quantizer
            (DelayedScaling: the grad-input slot), for a preceding te layer to use as it is.
        Outside autocast both flags are ignored, as in TE. See docs/linear.rst.
        """
        tp = self._tp
        if tp is None:
            out, bias = self._forward_local(inp, is_first_microbatch, fp8_output, fp8_grad)
        else:
            out, bias = tp.run(
                self._forward_local, inp, is_first_microbatch, fp8_output, fp8_grad, self.return_bias
            )
        return (out, bias) if self.return_bias else out

    def _forward_local(self, inp, is_first_microbatch, fp8_output, fp8_grad) -> tuple:
        """(y, bias) of this rank's weight (the whole layer's without tensor parallelism), the
        bias added where ``_gemm_adds_bias``."""
        try:  # free unless it raises: a 0-dim tensor or a non-tensor fails in shape[-1]
            if inp.shape[-1] != self.in_features or inp.dtype not in FLOAT_DTYPES:
                bad_input("Linear", inp, self.in_features)
        except (AttributeError, IndexError):
            bad_input("Linear", inp, self.in_features)
        # type() first: isinstance against a Tensor subclass goes through torch's metaclass
        # __instancecheck__ (~0.3 us), too slow to pay on every call for a plain tensor
        if fp8_output or fp8_grad or (type(inp) is not _Tensor and isinstance(inp, QuantizedTensor)):
            return self._forward_io(inp, is_first_microbatch, fp8_output, fp8_grad)
        weight, bias = linear_params(self)
        gemm_bias = bias if self._gemm_adds_bias else None
        out = linear_step(
            "Linear", self._gemm, self._features, inp, weight, gemm_bias, is_first_microbatch,
            self.fuse_wgrad_accumulation,
        )  # fmt: skip
        return out, bias

    # Under torch.compile this runs eagerly (a graph break): its quantized outputs and inputs
    # are not traced yet.
    @torch.compiler.disable
    def _forward_io(self, inp, first, fp8_output, fp8_grad):
        """forward() with fp8_output / fp8_grad set or a quantized input (TE's semantics)."""
        check_flags("Linear", fp8_output, fp8_grad)
        s = _STATE
        if not s.fp8:  # TE ignores fp8_output / fp8_grad outside autocast: high precision
            if isinstance(inp, QuantizedTensor):
                inp = DequantizeFn.apply(inp, inp.dtype)
            return self._forward_local(inp, first, False, False)
        weight, bias = linear_params(self)
        c = self._gemm.ctx_for(s.recipe, s.group, weight.device)
        if c.block:
            check_dims("Linear", c.recipe, c.block, inp, self._features)
        c.register_forward()
        out_q, gi_q = io_quantizers(c, fp8_output, fp8_grad)
        out = LinearIOFn.apply(
            inp, weight, bias if self._gemm_adds_bias else None, c, first, self.fuse_wgrad_accumulation,
            out_q, gi_q,
        )  # fmt: skip
        return out, bias
