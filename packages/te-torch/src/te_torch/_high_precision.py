"""The high-precision building blocks of te's modules (outside ``te.autocast``, and te.LayerNorm /
te.RMSNorm always): te's norm and activation kernels as autograd Functions, and the linear layer.

The GEMM is torch's own F.linear (on CPU, MKL beats te's reference GEMM; te's CUDA GEMM will take
over there once it is on by default), except that ``fuse_wgrad_accumulation`` sends the weight
gradient into ``weight.main_grad``, as TE does outside FP8 too. A quantized weight (from
``te.quantized_model_init``) is dequantized into the input's dtype; its gradient comes back in the
weight's nominal dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from te_torch import _fused
from te_torch._quantized_tensor import QuantizedTensor


class MainGradLinear(torch.autograd.Function):
    """High-precision y = x W^T + b whose weight gradient goes into ``weight.main_grad`` (fp32,
    accumulated unless ``weight.overwrite_main_grad``) instead of ``weight.grad``."""

    @staticmethod
    def forward(ctx, inp, weight, bias):
        if isinstance(weight, QuantizedTensor):
            w = weight.dequantize(inp.dtype)
        else:
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
        accumulate_main_grad(weight, dw)
        dx = dy @ w if ctx.needs_input_grad[0] else None
        db = dy2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, None, db


def main_grad_of(weight: torch.Tensor, quantized: bool = False) -> torch.Tensor:
    """``weight.main_grad``, where fuse_wgrad_accumulation puts the weight gradient; a
    ValueError naming it when it is missing or not of the weight's shape (else an
    AttributeError or te_gemm's error about its output ``d``), or, for a quantized GEMM
    (``quantized``), not a contiguous fp32 tensor."""
    mg = getattr(weight, "main_grad", None)
    if mg is None or mg.shape != weight.shape:
        got = "no main_grad" if mg is None else f"main_grad of shape {list(mg.shape)}"
        raise ValueError(
            f"weight.main_grad: fuse_wgrad_accumulation=True accumulates the weight gradient into "
            f"it, so it must be a tensor of the weight's shape {list(weight.shape)} (an fp32 "
            f"buffer you attach, e.g. weight.main_grad = torch.zeros_like(weight, "
            f"dtype=torch.float32)), got {got}"
        )
    if quantized and (mg.dtype != torch.float32 or not mg.is_contiguous()):
        # a quantized GEMM accumulates in fp32 into its output (the high-precision path adds in
        # main_grad's own dtype)
        raise ValueError(
            "weight.main_grad: expected a contiguous fp32 tensor under te.autocast "
            "(fuse_wgrad_accumulation: the quantized wgrad GEMM accumulates into it), got "
            f"{mg.dtype} with strides {tuple(mg.stride())}"
        )
    return mg


def accumulate_main_grad(weight: torch.Tensor, dw: torch.Tensor) -> None:
    """dw into ``weight.main_grad`` (overwritten with ``weight.overwrite_main_grad``)."""
    if getattr(weight, "overwrite_main_grad", False):
        main_grad_of(weight).copy_(dw)
    else:
        main_grad_of(weight).add_(dw)
    if hasattr(weight, "grad_added_to_main_grad"):
        weight.grad_added_to_main_grad = True


class DequantizeFn(torch.autograd.Function):
    """A quantized weight as a plain ``dtype`` tensor; the gradient passes through to it in its
    nominal dtype."""

    @staticmethod
    def forward(ctx, weight, dtype):
        ctx.w_dtype = weight.dtype
        return weight.dequantize(dtype)

    @staticmethod
    def backward(ctx, dy):
        return dy.to(ctx.w_dtype), None


def linear(
    inp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fuse_wgrad: bool
) -> torch.Tensor:
    """inp W^T + b in inp's dtype (weight and bias cast to it)."""
    if bias is not None and bias.dtype != inp.dtype:
        bias = bias.to(inp.dtype)
    if fuse_wgrad and weight.requires_grad and torch.is_grad_enabled():
        return MainGradLinear.apply(inp, weight, bias)
    if isinstance(weight, QuantizedTensor):
        return F.linear(inp, DequantizeFn.apply(weight, inp.dtype), bias)
    w = weight if weight.dtype == inp.dtype else weight.to(inp.dtype)
    return F.linear(inp, w, bias)


class NormFn(torch.autograd.Function):
    """LayerNorm / RMSNorm over the last dim through te's kernels: forward te_*norm_fwd in x's
    dtype, backward te_*norm_bwd (dx, dgamma, dbeta in one kernel)."""

    @staticmethod
    def forward(ctx, x, gamma, beta, rms: bool, eps: float, zero_centered_gamma: bool):
        y, mu, rsigma = _fused.norm_fwd(x, gamma, beta, rms, eps, zero_centered_gamma)
        ctx.save_for_backward(x, gamma, mu, rsigma)
        ctx.cfg = (rms, zero_centered_gamma, beta is not None)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, gamma, mu, rsigma = ctx.saved_tensors
        rms, zcg, has_beta = ctx.cfg
        want_dbeta = has_beta and ctx.needs_input_grad[2]
        dx, dgamma, dbeta = _fused.norm_bwd(dy, x, mu, rsigma, gamma, rms, zcg, want_dbeta)
        return dx, dgamma, dbeta, None, None, None


def norm(x, gamma, beta, rms: bool, eps: float, zero_centered_gamma: bool) -> torch.Tensor:
    if not torch.is_grad_enabled():  # inference: the kernel alone, no autograd Function or statistics
        return _fused.norm_fwd(x, gamma, beta, rms, eps, zero_centered_gamma, stats=False)[0]
    return NormFn.apply(x, gamma, beta, rms, eps, zero_centered_gamma)


class ActivationFn(torch.autograd.Function):
    """act(x) through te's activation kernels (te_activation ``kind``, a parameterized kind's
    ``params`` or None), x's dtype."""

    @staticmethod
    def forward(ctx, x, kind: int, params: tuple | None):
        ctx.save_for_backward(x)
        ctx.kind, ctx.params = kind, params
        return _fused.activation_fwd(x, kind, None, params)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx, _ = _fused.activation_bwd(dy, x, ctx.kind, None, None, ctx.params)
        return dx, None, None


def activation(x: torch.Tensor, kind: int, params: tuple | None = None) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return _fused.activation_fwd(x, kind, None, params)
    return ActivationFn.apply(x, kind, params)
