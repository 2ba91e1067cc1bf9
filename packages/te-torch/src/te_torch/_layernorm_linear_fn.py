"""The quantized LayerNormLinear as an autograd Function.

Forward:

    lnq, mu, rsigma = norm(x)   the norm kernel writes the GEMM's quantized input directly:
                                row-wise (fprop) + column-wise (wgrad) copies, no separate cast
    wq  = quantize(w)           or the cached copy (is_first_microbatch)
    y   = gemm(lnq, wq) (+ bias)

With ``return_layernorm_output`` the norm output is also returned in high precision, so the norm
runs in x's dtype and its output is quantized afterwards (as TE does).

Backward (LinearFn's, then the norm's):

    gq, db = dbias_quantize(dy)          one pass: the copies dgrad / wgrad read + the bias grad
    dln    = gemm_dgrad(gq, wq)  (+ the gradient of the returned norm output)
    dw     = gemm_wgrad(gq, lnq)  (or += into weight.main_grad)
    dx, dgamma, dbeta = norm_bwd(dln, x, mu, rsigma, gamma)

TE's ``fp8_output`` / ``fp8_grad`` (_fp8_io): with an output quantizer y is returned quantized;
with a grad-input quantizer the returned dx (the norm backward's, in x's dtype) is quantized, so
the preceding te layer reads it as it is. A quantized dy (the next layer's ``fp8_grad``) is the
dgrad / wgrad operand as it is, its bias gradient the column sums of its dequantized values.

Eagerly, without ``return_layernorm_output`` / ``fp8_output`` / ``fp8_grad`` and for the formats
te.Linear's fused step takes, each direction is one fused call (_layernorm_linear_step) with the
same C calls; what it does not cover runs op by op as above.
"""

from __future__ import annotations

import torch

from te_torch import _fused, _layernorm_linear_step
from te_torch._fp8_io import gemm_quantized, grad_tensor
from te_torch._gemm_state import FP8Context
from te_torch._linear_fn import any_requires_grad, column_sums, quantize_grad, wgrad
from te_torch._linear_step import gemm_bias
from te_torch._quantized_tensor import QuantizedTensor, is_eager
from te_torch.functional import _operand, gemm, gemm_dgrad

_Tensor = torch.Tensor


class LayerNormLinearFn(torch.autograd.Function):
    """(y) or (y, ln_out): see the module docstring. ``cfg`` = (rms, eps, zero_centered_gamma,
    return_layernorm_output, output quantizer or None, grad-input quantizer or None)."""

    @staticmethod
    def forward(ctx, inp, ln_w, ln_b, weight, bias, c: FP8Context, first, fuse_wgrad: bool, cfg: tuple):
        rms, eps, zcg, return_ln, out_q, gi_q = cfg
        if c.packed_ok and not return_ln and out_q is None and gi_q is None and is_eager(inp):
            return _layernorm_linear_step.forward(
                ctx, inp, ln_w, ln_b, weight, bias, c, first, fuse_wgrad, cfg[:3]
            )
        ctx.packed = False
        need_dln = any_requires_grad(inp, ln_w, ln_b)
        need_dw = weight.requires_grad
        xq_q = c.x_q[2 + need_dw]
        ln_out = None
        if return_ln:
            ln_out, mu, rsigma = _fused.norm_fwd(inp, ln_w, ln_b, rms, eps, zcg)
            lnq = xq_q(ln_out)
        else:
            lnq, mu, rsigma = _fused.norm_fwd(inp, ln_w, ln_b, rms, eps, zcg, xq_q)
        wq = c.weight(weight, first, need_dln)
        b_dtype = None if bias is None else bias.dtype
        bias = gemm_bias(bias, inp.dtype)
        if out_q is None:
            out = gemm(lnq, wq, bias=bias, out_dtype=inp.dtype, use_split_accumulator=c.split[0])
        else:
            out = gemm_quantized(
                c, out_q, _operand(lnq, True, "x"), _operand(wq, True, "w"), False, True,
                (*inp.shape[:-1], weight.shape[0]), inp.dtype, bias,
                -1 if c.split[0] is None else int(c.split[0]),
            )  # fmt: skip
        ctx.save_for_backward(
            inp if need_dln else None,
            ln_w if need_dln else None,
            mu if need_dln else None,
            rsigma if need_dln else None,
            lnq if need_dw else None,
            wq if need_dln else None,
        )
        ctx.set_materialize_grads(False)
        ctx.c, ctx.fuse, ctx.cfg = c, fuse_wgrad, cfg
        ctx.weight = weight if fuse_wgrad else None
        ctx.w_dtype = weight.dtype
        ctx.b_dtype = b_dtype
        ctx.has_ln_bias = ln_b is not None
        return (out, ln_out) if return_ln else out

    @staticmethod
    def backward(ctx, dy, d_ln_out=None):
        if ctx.packed:
            return _layernorm_linear_step.backward(ctx, dy)
        c = ctx.c
        rms, _, zcg, _, _, gi_q = ctx.cfg
        need_dx, need_dlnw, need_dlnb, need_dw, need_db = ctx.needs_input_grad[:5]
        need_dln = need_dx or need_dlnw or need_dlnb
        inp, ln_w, mu, rsigma, lnq, wq = ctx.saved_tensors
        dx = dlnw = dlnb = dw = db = None
        dln = None
        if type(dy) is not _Tensor and isinstance(dy, QuantizedTensor):  # the next layer's fp8_grad
            gq = grad_tensor(dy, c, need_dln, need_dw) if need_dln or need_dw else None
            if gq is not None:
                c.register_backward()
                if need_dln:
                    dln = gemm_dgrad(gq, wq, out_dtype=dy.dtype, use_split_accumulator=c.split[1])
                if need_dw:
                    dw = wgrad(c, gq, lnq, ctx.weight, ctx.fuse, ctx.w_dtype)
                if need_db:
                    db = column_sums(dy.dequantize(torch.float32), ctx.b_dtype)
                dy = None  # done
            else:  # another recipe's format (or no GEMM needs it): as a plain gradient
                dy = dy.dequantize()
        if dy is not None:
            if not dy.is_contiguous():
                dy = dy.contiguous()
            if need_dln or need_dw:
                gq, db = quantize_grad(c, dy, need_dln, need_dw, ctx.b_dtype if need_db else None)
                if need_dln:
                    dln = gemm_dgrad(gq, wq, out_dtype=dy.dtype, use_split_accumulator=c.split[1])
                if need_dw:
                    dw = wgrad(c, gq, lnq, ctx.weight, ctx.fuse, ctx.w_dtype)
            elif need_db:
                db = column_sums(dy, ctx.b_dtype)
        if d_ln_out is not None and need_dln:
            dln = d_ln_out if dln is None else dln + d_ln_out
        if dln is not None:
            with_dbeta = ctx.has_ln_bias and need_dlnb
            dx, dlnw, dlnb = _fused.norm_bwd(dln, inp, mu, rsigma, ln_w, rms, zcg, with_dbeta)
            dx, dlnw = (dx if need_dx else None), (dlnw if need_dlnw else None)
            if dx is not None and gi_q is not None:
                dx = gi_q(dx)  # fp8_grad: the norm backward writes x's dtype, quantized here
        return dx, dlnw, dlnb, dw, db, None, None, None, None
