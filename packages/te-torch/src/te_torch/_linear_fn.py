"""The quantized Linear as an autograd Function.

Forward (one quantization per operand, no re-quantization in backward):

    xq = quantize(x)   row-wise for fprop + column-wise (wgrad), in the same pass
    wq = quantize(w)   row-wise for fprop + column-wise (dgrad); or the cached copy
    y  = gemm(xq, wq) (+ bias)                       split accumulator: recipe.fp8_gemm_fprop

Backward:

    gq, db = quantize(dy) row-wise (dgrad) + column-wise (wgrad), backward format (HYBRID: E5M2),
             and with a bias its gradient (the column sums of the unquantized dy, in fp32) in the
             same pass (te_dbias_quantize)
    dx = gemm_dgrad(gq, wq)                          split accumulator: recipe.fp8_gemm_dgrad
    dw = gemm_wgrad(gq, xq)  (or += into weight.main_grad, returning None)      ... _wgrad

Each copy is produced only when a gradient needs it (``needs_input_grad``). The recipe objects
(quantizers, delayed-scaling state) are _gemm_state.FP8Context.
"""

from __future__ import annotations

import torch

from te_torch import _fused
from te_torch._gemm_state import FP8Context
from te_torch.functional import gemm, gemm_dgrad, gemm_wgrad


def quantize_grad(c: FP8Context, dy: torch.Tensor, need_dgrad: bool, need_wgrad: bool, db_dtype):
    """(gq, db): dy quantized with the copies the dgrad / wgrad GEMMs read, and with ``db_dtype``
    (not None) the bias gradient from the same pass. Registers the backward delayed-scaling
    update."""
    q = c.g_q[2 * need_dgrad + need_wgrad]
    c.register_backward()
    if db_dtype is None:
        return q(dy), None
    return _fused.dbias_quantize(dy, q, db_dtype)


def wgrad(c: FP8Context, gq, xq, weight: torch.Tensor, fuse: bool, w_dtype: torch.dtype):
    """dw = gq^T xq, or (``fuse``) accumulated into ``weight.main_grad`` by the GEMM (None)."""
    if not fuse:
        return gemm_wgrad(gq, xq, out_dtype=w_dtype, use_split_accumulator=c.split[2])
    gemm_wgrad(
        gq,
        xq,
        out=weight.main_grad,
        accumulate=not getattr(weight, "overwrite_main_grad", False),
        use_split_accumulator=c.split[2],
    )
    if hasattr(weight, "grad_added_to_main_grad"):
        weight.grad_added_to_main_grad = True
    return None


def any_requires_grad(*ts) -> bool:
    return any(t is not None and t.requires_grad for t in ts)


def column_sums(dy: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bias gradient when dy is not quantized at all (no other gradient needed)."""
    return dy.reshape(-1, dy.shape[-1]).float().sum(0).to(dtype)


class LinearFn(torch.autograd.Function):
    """y = x w^T + b with quantized GEMMs; see the module docstring."""

    @staticmethod
    def forward(ctx, inp, weight, bias, c: FP8Context, first, fuse_wgrad: bool):
        need_dx, need_dw = inp.requires_grad, weight.requires_grad
        xq = c.x_q[2 + need_dw](inp)
        wq = c.weight(weight, first, need_dx)
        if bias is not None and bias.dtype != inp.dtype and bias.dtype != torch.float32:
            bias = bias.to(inp.dtype)
        out = gemm(xq, wq, bias=bias, out_dtype=inp.dtype, use_split_accumulator=c.split[0])
        ctx.save_for_backward(xq if need_dw else None, wq if need_dx else None)
        ctx.c = c
        ctx.fuse = fuse_wgrad
        ctx.weight = weight if fuse_wgrad else None
        ctx.w_dtype = weight.dtype
        ctx.b_dtype = None if bias is None else bias.dtype
        return out

    @staticmethod
    def backward(ctx, dy):
        c = ctx.c
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        xq, wq = ctx.saved_tensors
        dx = dw = db = None
        if need_dx or need_dw:
            if not dy.is_contiguous():
                dy = dy.contiguous()
            gq, db = quantize_grad(c, dy, need_dx, need_dw, ctx.b_dtype if need_db else None)
            if need_dx:
                dx = gemm_dgrad(gq, wq, out_dtype=dy.dtype, use_split_accumulator=c.split[1])
            if need_dw:
                dw = wgrad(c, gq, xq, ctx.weight, ctx.fuse, ctx.w_dtype)
        elif need_db:
            db = column_sums(dy, ctx.b_dtype)
        return dx, dw, db, None, None, None
