"""The quantized LayerNormMLP as an autograd Function.

Forward (c1, c2: the FP8Contexts of FC1 and FC2):

    lnq, mu, rsigma = norm(x)        the norm kernel writes FC1's quantized input (both copies)
    h   = gemm(lnq, w1q) (+ b1)      the pre-activation, high precision (x's dtype), kept
    aq  = act(h)                     the activation kernel writes FC2's quantized input
    y   = gemm(aq, w2q) (+ b2)

Backward:

    g2q, db2 = dbias_quantize(dy)            FC2's grad-output copies + its bias grad, one pass
    da  = gemm_dgrad(g2q, w2q)               high precision
    dw2 = gemm_wgrad(g2q, aq)
    g1q, db1 = act_bwd(da, h)                the activation backward writes FC1's quantized
                                             grad-output and FC1's bias grad (fp32 column sums)
    dln = gemm_dgrad(g1q, w1q)  (+ the gradient of the returned norm output)
    dw1 = gemm_wgrad(g1q, lnq)
    dx, dgamma, dbeta = norm_bwd(dln, x, mu, rsigma, gamma)

Weight gradients go into ``main_grad`` with fuse_wgrad_accumulation, as te.Linear's.

Eagerly, without ``return_layernorm_output`` and for the formats te.Linear's fused step takes,
each direction is one fused call (_layernorm_mlp_step) with the same C calls; what it does not
cover runs op by op as above.
"""

from __future__ import annotations

import torch

from te_torch import _fused, _layernorm_mlp_step
from te_torch._linear_fn import any_requires_grad, column_sums, quantize_grad, wgrad
from te_torch._linear_step import gemm_bias
from te_torch.functional import gemm, gemm_dgrad


def needs(inp, ln_w, ln_b, w1, b1, w2) -> tuple[bool, bool, bool, bool]:
    """(need_dln, need_dw1, need_dh, need_dw2) of an op-by-op step."""
    need_dln = any_requires_grad(inp, ln_w, ln_b)
    need_dw1 = w1.requires_grad
    # FC1's grad-output exists when anything below the activation needs a gradient.
    need_dh = need_dln or need_dw1 or any_requires_grad(b1)
    return need_dln, need_dw1, need_dh, w2.requires_grad


def op_by_op_forward(
    inp, ln_w, ln_b, w1, b1, w2, b2, c1, c2, first, cfg, need_dln, need_dw1, need_dh, need_dw2
):
    """The op-by-op forward's calls: (out, ln_out or None, mu, rsigma, lnq, w1q, h, aq, w2q),
    the quantized copies made with what backward will need (``need_*``, from ``needs``)."""
    rms, eps, zcg, kind, return_ln, act_params = cfg
    dtype = inp.dtype
    x1_q = c1.x_q[2 + need_dw1]
    ln_out = None
    if return_ln:
        ln_out, mu, rsigma = _fused.norm_fwd(inp, ln_w, ln_b, rms, eps, zcg)
        lnq = x1_q(ln_out)
    else:
        lnq, mu, rsigma = _fused.norm_fwd(inp, ln_w, ln_b, rms, eps, zcg, x1_q)
    w1q = c1.weight(w1, first, need_dln)
    h = gemm(lnq, w1q, bias=gemm_bias(b1, dtype), out_dtype=dtype, use_split_accumulator=c1.split[0])
    aq = _fused.activation_fwd(h, kind, c2.x_q[2 + need_dw2], act_params)
    w2q = c2.weight(w2, first, need_dh)
    out = gemm(aq, w2q, bias=gemm_bias(b2, dtype), out_dtype=dtype, use_split_accumulator=c2.split[0])
    return out, ln_out, mu, rsigma, lnq, w1q, h, aq, w2q


def keep_config(ctx, c1, c2, fuse_wgrad, cfg, w1, b1, w2, b2, ln_b) -> None:
    """What the op-by-op backward reads from ctx besides its saved tensors."""
    ctx.set_materialize_grads(False)
    ctx.c, ctx.fuse, ctx.cfg = (c1, c2), fuse_wgrad, cfg
    ctx.weights = (w1, w2) if fuse_wgrad else (None, None)
    ctx.w_dtypes = (w1.dtype, w2.dtype)
    ctx.b_dtypes = (None if b1 is None else b1.dtype, None if b2 is None else b2.dtype)
    ctx.has_ln_bias = ln_b is not None


class LayerNormMLPFn(torch.autograd.Function):
    """(y) or (y, ln_out): see the module docstring. ``cfg`` = (rms, eps, zero_centered_gamma,
    activation kind, return_layernorm_output, the activation's params: te_core._ops.
    activation_params' tuple or None)."""

    @staticmethod
    def forward(ctx, inp, ln_w, ln_b, w1, b1, w2, b2, c1, c2, first, fuse_wgrad: bool, cfg: tuple):
        rms, eps, zcg, kind, return_ln, act_params = cfg
        if _layernorm_mlp_step.runs(c1, c2, return_ln, inp, ln_w, ln_b, w1, b1):
            return _layernorm_mlp_step.forward(
                ctx, inp, ln_w, ln_b, w1, b1, w2, b2, c1, c2, first, fuse_wgrad, cfg
            )
        ctx.packed = False
        need_dln, need_dw1, need_dh, need_dw2 = needs(inp, ln_w, ln_b, w1, b1, w2)
        out, ln_out, mu, rsigma, lnq, w1q, h, aq, w2q = op_by_op_forward(
            inp, ln_w, ln_b, w1, b1, w2, b2, c1, c2, first, cfg, need_dln, need_dw1, need_dh, need_dw2
        )
        ctx.save_for_backward(
            inp if need_dln else None,
            ln_w if need_dln else None,
            mu if need_dln else None,
            rsigma if need_dln else None,
            lnq if need_dw1 else None,
            w1q if need_dln else None,
            h if need_dh else None,
            aq if need_dw2 else None,
            w2q if need_dh else None,
        )
        keep_config(ctx, c1, c2, fuse_wgrad, cfg, w1, b1, w2, b2, ln_b)
        return (out, ln_out) if return_ln else out

    @staticmethod
    def backward(ctx, dy, d_ln_out=None):
        if ctx.packed:
            return _layernorm_mlp_step.backward(ctx, dy)
        c1, c2 = ctx.c
        rms, _, zcg, kind, _, act_params = ctx.cfg
        need_dx, need_dlnw, need_dlnb, need_dw1, need_db1, need_dw2, need_db2 = ctx.needs_input_grad[:7]
        need_dln = need_dx or need_dlnw or need_dlnb
        need_dh = need_dln or need_dw1 or need_db1
        inp, ln_w, mu, rsigma, lnq, w1q, h, aq, w2q = ctx.saved_tensors
        dx = dlnw = dlnb = dw1 = db1 = dw2 = db2 = dln = None
        if dy is not None:
            if not dy.is_contiguous():
                dy = dy.contiguous()
            if need_dh or need_dw2:
                g2q, db2 = quantize_grad(c2, dy, need_dh, need_dw2, ctx.b_dtypes[1] if need_db2 else None)
                if need_dw2:
                    dw2 = wgrad(c2, g2q, aq, ctx.weights[1], ctx.fuse, ctx.w_dtypes[1])
                if need_dh:
                    da = gemm_dgrad(g2q, w2q, out_dtype=dy.dtype, use_split_accumulator=c2.split[1])
                    db1_dtype = ctx.b_dtypes[0] if need_db1 else None
                    if need_dln or need_dw1:
                        c1.register_backward()
                        g1q, db1 = _fused.activation_bwd(
                            da, h, kind, c1.g_q[2 * need_dln + need_dw1], db1_dtype, act_params
                        )
                        if need_dw1:
                            dw1 = wgrad(c1, g1q, lnq, ctx.weights[0], ctx.fuse, ctx.w_dtypes[0])
                        if need_dln:
                            dln = gemm_dgrad(g1q, w1q, out_dtype=dy.dtype, use_split_accumulator=c1.split[1])
                    else:  # only FC1's bias needs a gradient
                        _, db1 = _fused.activation_bwd(da, h, kind, None, db1_dtype, act_params)
            elif need_db2:
                db2 = column_sums(dy, ctx.b_dtypes[1])
        if d_ln_out is not None and need_dln:
            dln = d_ln_out if dln is None else dln + d_ln_out
        if dln is not None:
            with_dbeta = ctx.has_ln_bias and need_dlnb
            dx, dlnw, dlnb = _fused.norm_bwd(dln, inp, mu, rsigma, ln_w, rms, zcg, with_dbeta)
            dx, dlnw = (dx if need_dx else None), (dlnw if need_dlnw else None)
        return dx, dlnw, dlnb, dw1, db1, dw2, db2, None, None, None, None, None
