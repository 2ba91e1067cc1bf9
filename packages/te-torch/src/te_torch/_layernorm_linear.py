"""``te.LayerNormLinear``: a norm then a linear layer, fused (TE's module and names).

Outside ``te.autocast`` it runs te's norm kernel and torch's F.linear in high precision. Inside,
te_torch._layernorm_linear_fn.LayerNormLinearFn has the norm kernel write the GEMM's quantized
input (both copies) directly, then runs the quantized GEMMs as te.Linear does (same recipes,
quantizers, delayed-scaling state, weight cache, main_grad fusion and ``_extra_state`` format),
and TE's ``fp8_output`` / ``fp8_grad`` as te.Linear's (_fp8_io). Eagerly each direction is
one fused call into te-core (_layernorm_linear_step), as te.Linear's step.
"""

from __future__ import annotations

import torch

from te_torch import _autocast, _layernorm_linear_step
from te_torch._availability import default_device
from te_torch._fast_apply import raw_apply, wrapper_needed
from te_torch._fp8_io import check_flags, io_quantizers
from te_torch._gemm_state import GemmState, check_dims
from te_torch._high_precision import DequantizeFn, linear, norm
from te_torch._layernorm_linear_fn import LayerNormLinearFn
from te_torch._linear import linear_params, linear_step, register_linear_params, reset_linear_params
from te_torch._model_init import quantize_module_weights
from te_torch._module_base import (
    FLOAT_DTYPES,
    UNSUPPORTED_KWARGS,
    SingleGemmModule,
    bad_input,
    check_eps,
    check_init_method,
    check_normalization,
    check_params_dtype,
    check_size,
    detached,
    norm_module_outputs,
    parameter,
    register_norm_params,
    reject_kwargs,
    reset_norm_params,
    warn_if_recomputed,
)
from te_torch._quantized_tensor import QuantizedTensor, is_eager
from te_torch._tensor_parallel import (
    SplitModule,
    mark_norm_parallel,
    split_linear,
)
from te_torch._token_pad import pad, pad_count, unpad

__all__ = ["LayerNormLinear"]

_Tensor = torch.Tensor

_STATE = _autocast.STATE
_APPLY = raw_apply(LayerNormLinearFn)


class LayerNormLinear(SingleGemmModule, SplitModule):
    """TE's ``LayerNormLinear``: ``y = norm(x) W^T + b`` for x [..., in_features].

    Args:
        in_features, out_features: sizes of the last dimension of input and output.
        eps: the norm's epsilon (default 1e-5).
        normalization: ``"LayerNorm"`` (parameters ``layer_norm_weight``, ``layer_norm_bias``,
            [in_features]) or ``"RMSNorm"`` (``layer_norm_weight`` only).
        zero_centered_gamma: the norm's scale is ``1 + layer_norm_weight`` (which starts at 0).
        return_layernorm_output: also return the norm's output (high precision, x's dtype).
        bias, return_bias, params_dtype, device, init_method, fuse_wgrad_accumulation,
        parameters_split, name: as ``te.Linear`` (parameters ``weight`` [out, in], ``bias``).
        parallel_mode, tp_group, tp_size, sequence_parallel, get_rng_state_tracker,
        rng_tracker_name: as ``te.Linear``'s, with 'column' the one split (a row split would
            normalize a slice of the features): the norm runs on the rank's input (its rows
            with ``sequence_parallel``, whose norm parameters' gradients are then each rank's
            part, marked ``sequence_parallel``), its output goes to the split GEMM through the
            column layer's collective, unfused (te_torch._tensor_parallel).
        return_layernorm_output_gathered: with ``sequence_parallel``, the norm output returned
            is the all-gathered one (TE's).
    ``forward`` returns ``out``, then ``bias`` if ``return_bias``, then the norm output if
    ``return_layernorm_output`` (a tuple when more than one). Userbuffers and delayed wgrad are
    not implemented yet (NotImplementedError).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        eps: float = 1e-5,
        *,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group=None,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        rng_tracker_name=None,
        init_method=None,
        bias: bool = True,
        normalization: str = "LayerNorm",
        return_bias: bool = False,
        params_dtype: torch.dtype | None = None,
        parallel_mode: str | None = None,
        return_layernorm_output: bool = False,
        return_layernorm_output_gathered: bool = False,
        parameters_split=None,
        zero_centered_gamma: bool = False,
        device=None,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__()
        owner = "LayerNormLinear"
        reject_kwargs(owner, kwargs, UNSUPPORTED_KWARGS)
        check_size(owner, "in_features", in_features)
        check_size(owner, "out_features", out_features)
        check_init_method(owner, "init_method", init_method)
        check_init_method(owner, "get_rng_state_tracker", get_rng_state_tracker)
        self.eps = check_eps(owner, eps)
        self._rms = check_normalization(owner, normalization)
        params_dtype = check_params_dtype(owner, params_dtype)
        device = default_device() if device is None else torch.device(device)
        if parallel_mode == "row":
            raise NotImplementedError(
                f"{owner}: parallel_mode='row' is not implemented (its norm would normalize a slice "
                "of the features); split it by columns, or use te.LayerNorm and a row te.Linear"
            )
        in_features, out_features, split = split_linear(
            self, owner, in_features, out_features, parameters_split, tp_group, tp_size, parallel_mode,
            sequence_parallel, (get_rng_state_tracker, rng_tracker_name),
        )  # fmt: skip
        self.in_features, self.out_features = in_features, out_features
        self.normalization = normalization
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.return_layernorm_output = bool(return_layernorm_output)
        self.return_layernorm_output_gathered = bool(return_layernorm_output_gathered)
        self.use_bias, self.return_bias = bool(bias), bool(return_bias)
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self.init_method, self.name = init_method, name
        self.params_dtype = params_dtype
        self._split = split
        if self._split is not None and self.fuse_wgrad_accumulation:
            raise NotImplementedError(
                f"{owner}: fuse_wgrad_accumulation with parameters_split is not implemented yet"
            )
        register_norm_params(self, in_features, self._rms, params_dtype, device)
        register_linear_params(self, in_features, out_features, bias, self._split, params_dtype, device)
        self._features = (("in_features", in_features), ("out_features", out_features))
        self._gemm = GemmState("te.LayerNormLinear", self._features)
        self._gemms = {"gemm": self._gemm}
        self.reset_parameters()
        quantize_module_weights(self, self._weight_names, "LayerNormLinear", self._split)

    def reset_parameters(self, defer_init: bool = False) -> None:
        """Norm weight ones (zeros with zero_centered_gamma) and bias zeros; weight from
        ``init_method`` (default normal(0, 0.023)), bias zero."""
        if defer_init:
            return
        reset_norm_params(self)
        reset_linear_params(self)
        mark_norm_parallel(self)
        self._gemm.ctx = None

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.use_bias}, "
            f"normalization={self.normalization}, eps={self.eps}"
        )

    def forward(
        self,
        inp: torch.Tensor,
        is_first_microbatch: bool | None = None,
        fp8_output: bool = False,
        fp8_grad: bool = False,
    ):
        """``norm(inp) W^T + b``; quantized inside te.autocast. See the class docstring.

        inp: [..., in_features], float32 / bfloat16 / float16, or a te quantized tensor, which is
            dequantized (differentiably) first: the norm reads high precision.
        is_first_microbatch: as ``te.Linear`` (None: quantize the weight every call; True:
            quantize and cache it; False: reuse the cache).
        fp8_output: inside autocast, return the output [..., out_features] quantized in the
            forward format by this module's output quantizer, as ``te.Linear`` (the norm output
            of ``return_layernorm_output`` stays high precision).
        fp8_grad: inside autocast (grad enabled), the gradient of inp (the norm backward's, in
            inp's dtype) is returned quantized in the backward format by the grad-input
            quantizer, as ``te.Linear``'s.
        Outside autocast both flags are ignored, as in TE. See docs/linear.rst.
        """
        try:  # free unless it raises: a 0-dim tensor or a non-tensor fails in shape[-1]
            if inp.shape[-1] != self.in_features or inp.dtype not in FLOAT_DTYPES:
                bad_input("LayerNormLinear", inp, self.in_features)
        except (AttributeError, IndexError):
            bad_input("LayerNormLinear", inp, self.in_features)
        if self._tp is not None:
            return self._forward_tp(inp, is_first_microbatch, fp8_output, fp8_grad)
        if fp8_output or fp8_grad or (type(inp) is not _Tensor and isinstance(inp, QuantizedTensor)):
            return self._forward_io(inp, is_first_microbatch, fp8_output, fp8_grad)
        weight, bias = linear_params(self)
        gemm_bias = None if self.return_bias else bias
        ln_w, ln_b = parameter(self, "layer_norm_weight"), parameter(self, "layer_norm_bias")
        s = _STATE
        if s.fp8:
            c = self._gemm.ctx_for(s.recipe, s.group, weight.device)
            if c.delayed:
                _autocast.register_forward(c.fwd_entry)
            elif c.block:
                check_dims("LayerNormLinear", c.recipe, c.block, inp, self._features)
            eager = c.packed_ok and not self.return_layernorm_output and is_eager(inp)
            x = inp
            grad = torch.is_grad_enabled()
            if not (grad or eager):
                x, ln_w, ln_b, weight, gemm_bias = detached(inp, ln_w, ln_b, weight, gemm_bias)
            n_pad = 0 if c.block else pad_count(inp, weight, any_rows=c.per_tensor)
            if n_pad and c.per_tensor and eager:
                n_pad = 0  # the eager per-tensor step pads inside (_layernorm_linear_step)
            x = pad(x, n_pad) if n_pad else x
            if grad or not eager:
                apply = LayerNormLinearFn.apply if wrapper_needed() else _APPLY
                res = apply(
                    x,
                    ln_w,
                    ln_b,
                    weight,
                    gemm_bias,
                    c,
                    is_first_microbatch,
                    self.fuse_wgrad_accumulation,
                    (self._rms, self.eps, self.zero_centered_gamma, self.return_layernorm_output, None, None),
                )
            else:  # no_grad: the step alone (_layernorm_linear_step.forward's ctx None)
                norm_cfg = (self._rms, self.eps, self.zero_centered_gamma)
                res = _layernorm_linear_step.forward(
                    None, x, ln_w, ln_b, weight, gemm_bias, c, is_first_microbatch, False, norm_cfg
                )
            out, ln_out = res if self.return_layernorm_output else (res, None)
            if n_pad:
                out = unpad(out, inp.shape[:-1])
                ln_out = None if ln_out is None else unpad(ln_out, inp.shape[:-1])
        else:
            warn_if_recomputed("LayerNormLinear", self._gemm)
            ln_out = norm(inp, ln_w, ln_b, self._rms, self.eps, self.zero_centered_gamma)
            if s.calibrating:
                self._gemm.calibrate(ln_out, weight, s.recipe, s.group)
            out = linear(ln_out, weight, gemm_bias, self.fuse_wgrad_accumulation)
        return norm_module_outputs(self, out, bias, ln_out)

    @torch.compiler.disable
    def _forward_tp(self, inp, first, fp8_output: bool, fp8_grad: bool):
        """forward() split by columns: the norm on this rank's input, the column collective (an
        all-gather along dim 0 with sequence_parallel), the GEMM on this rank's rows of W."""
        if fp8_output or fp8_grad or (type(inp) is not _Tensor and isinstance(inp, QuantizedTensor)):
            raise NotImplementedError(
                "LayerNormLinear: fp8_output, fp8_grad or a quantized input with tensor parallelism "
                "is not implemented yet"
            )
        weight, bias = linear_params(self)
        ln_w, ln_b = parameter(self, "layer_norm_weight"), parameter(self, "layer_norm_bias")
        ln_out = norm(inp, ln_w, ln_b, self._rms, self.eps, self.zero_centered_gamma)
        x = self._tp.column_input(ln_out)
        out = linear_step(
            "LayerNormLinear", self._gemm, self._features, x, weight, None if self.return_bias else bias,
            first, self.fuse_wgrad_accumulation,
        )  # fmt: skip
        ln_out = x if self.return_layernorm_output_gathered else ln_out
        return norm_module_outputs(self, out, bias, ln_out)

    # Under torch.compile this runs eagerly (a graph break): its quantized outputs and inputs
    # are not traced yet.
    @torch.compiler.disable
    def _forward_io(self, inp, first, fp8_output, fp8_grad):
        """forward() with fp8_output / fp8_grad set or a quantized input (TE's semantics)."""
        check_flags("LayerNormLinear", fp8_output, fp8_grad)
        if isinstance(inp, QuantizedTensor):
            inp = DequantizeFn.apply(inp, inp.dtype)  # the norm reads high precision
        s = _STATE
        if not s.fp8:  # TE ignores fp8_output / fp8_grad outside autocast
            return self.forward(inp, first)
        weight, bias = linear_params(self)
        c = self._gemm.ctx_for(s.recipe, s.group, weight.device)
        if c.block:
            check_dims("LayerNormLinear", c.recipe, c.block, inp, self._features)
        c.register_forward()
        out_q, gi_q = io_quantizers(c, fp8_output, fp8_grad)
        cfg = (self._rms, self.eps, self.zero_centered_gamma, self.return_layernorm_output, out_q, gi_q)
        res = LayerNormLinearFn.apply(
            inp,
            self.layer_norm_weight,
            self.layer_norm_bias,
            weight,
            None if self.return_bias else bias,
            c,
            first,
            self.fuse_wgrad_accumulation,
            cfg,
        )
        out, ln_out = res if self.return_layernorm_output else (res, None)
        return norm_module_outputs(self, out, bias, ln_out)
