"""te.LayerNormMLP's eager FP8 step as two calls into te_core._C
(csrc/python/layernorm_mlp_step.cpp), as te.Linear's (_linear_step):

    forward   _C.layernorm_mlp_fwd: the norm writes FC1's packed input copies and mu / rsigma,
              FC1 GEMM (+b1) into the pre-activation h, the activation writes FC2's packed input
              copies, FC2 GEMM (+b2); fresh weights are quantized into packed copies too
              tmp   = [ln row | W1 row | act row | W2 row]              dead once FC2 has run
              saved = [ln col | W1 col | act col | W2 col | h | mu | rsigma]
              (each only when a gradient reads it; h, mu / rsigma go to tmp when none does)
    backward  _C.layernorm_mlp_bwd: FC2's linear_bwd (dy quantized with db2, dgrad into da,
              wgrad), the activation backward writing FC1's packed grad copies and db1, FC1's
              GEMMs (dgrad into dln), the norm backward
              tmp   = [dy row | dy col | da | g1 row | g1 col | dln]

The numerics are the op-by-op path's (LayerNormMLPFn): the same C calls with the same arguments.
LayerNormMLPFn takes this path eagerly for the formats te.Linear's step takes
(``FP8Context.packed_ok``: per-tensor and block FP8, not MXFP8 / NVFP4) and runs op by op under
torch.compile tracing, with ``return_layernorm_output``, and when FC1's bias is the only thing
below the activation that needs a gradient. A quantized dy (a next layer's ``fp8_grad``) is
dequantized first. An odd token count is padded here as in _linear_step: norm, FC1, activation
and both weight gradients run on the padded rows (x's last row copied; dy's padding rows zero,
so the activation's gradient there is zero too), FC2's fprop and FC1's dgrad read the first
rows, and the norm backward runs on the real rows alone.
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch._dtypes import TE_DTYPE
from te_torch._fused_kernels import act_config, activation_out_shape, norm_config
from te_torch._kernels import _raw_stream, give_tmp, packed, spec, take_tmp
from te_torch._layernorm_linear_step import (
    contiguous,
    norm_grads,
    real_rows_stats,
    save_norm,
    scratch,
    stats,
    stats_bytes,
)
from te_torch._linear_step import (
    bwd_weight,
    check_not_released,
    column_sums,
    dgrad_config,
    fprop_config,
    gemm_bias,
    grad_plan,
    mark_main_grad,
    padded_grad,
    quantized_here,
    release_saved,
    remember,
    weight_operands,
    weight_plan,
    wgrad_target,
)
from te_torch._quantized_tensor import QuantizedTensor, is_eager
from te_torch._token_pad import padded_source, step_pad

_U8 = torch.uint8
_empty = torch.empty
_fwd = _C.layernorm_mlp_fwd
_bwd = _C.layernorm_mlp_bwd


def takes(inp, ln_w, ln_b, w1, b1) -> bool:
    """Whether the fused step covers this call's gradients: it always quantizes FC1's gradient,
    so not when FC1's bias is the only thing below the activation that needs one."""
    if b1 is None or not b1.requires_grad or w1.requires_grad or inp.requires_grad:
        return True
    return ln_w.requires_grad or (ln_b is not None and ln_b.requires_grad)


def eager(c1, c2, return_ln: bool, inp) -> bool:
    """Whether the fused step can run this call at all (then it does under torch.no_grad())."""
    return c1.packed_ok and c2.packed_ok and not return_ln and is_eager(inp)


def runs(c1, c2, return_ln: bool, inp, ln_w, ln_b, w1, b1) -> bool:
    """Whether LayerNormMLPFn runs this call as the fused step (which pads odd token counts
    itself; the module pads for the op-by-op path)."""
    return eager(c1, c2, return_ln, inp) and takes(inp, ln_w, ln_b, w1, b1)


class MlpPlan:
    """What the step derives from a kind of call and reuses (as _linear_step.StepPlan): the
    padded source shape, FC1's output and the activation's shapes, both GEMMs' input
    quantizations and packed sizes, fresh weights' plans (weight_plan), the scratch sizes, the
    output shape and the configs. Kept in FC1's FP8Context (``c1.plans``), keyed with FC2's
    context too; ``bwd`` is the backward's part (MlpGradPlan) for the gradient kind ``bwd_key``."""

    __slots__ = (
        "device", "x_shape", "rows", "pad", "src_shape", "h_shape", "a_shape", "xq1", "xq2", "lr", "lc", "ar",
        "ac", "w1", "w2", "hn", "sn", "out_shape", "dt", "norm", "act", "fprop1", "fprop2", "bwd_key", "bwd",
    )  # fmt: skip


def mlp_plan(c1, c2, key: tuple, inp, w1, w2, b1, b2, cfg: tuple, needs: tuple, fresh: bool) -> MlpPlan:
    """A new ``c1.plans[key]`` (see MlpPlan)."""
    rms, eps, zcg, kind, _, act_params = cfg
    need_dln, need_dw1, need_dw2, need_dh = needs
    dev = inp.get_device()
    p = MlpPlan()
    p.device, p.x_shape = inp.device, inp.shape
    p.rows = rows = inp.numel() // inp.shape[-1] if inp.shape[-1] else 0
    p.pad = pad = step_pad(inp, c1.per_tensor, need_dw1 or need_dw2)
    p.src_shape = torch.Size((rows + pad, inp.shape[-1])) if pad else inp.shape
    p.h_shape = h_shape = torch.Size((*p.src_shape[:-1], w1.shape[0]))
    p.a_shape = a_shape = activation_out_shape(h_shape, kind)
    p.xq1, p.xq2 = xq1, xq2 = c1.x_q[3]._flat(), c2.x_q[3]._flat()
    lr, lc = packed(xq1[0], xq1[1], p.src_shape)
    ar, ac = packed(xq2[0], xq2[1], a_shape)
    p.lr, p.lc, p.ar, p.ac = lr, (lc if need_dw1 else 0), ar, (ac if need_dw2 else 0)
    p.w1 = weight_plan(c1, w1, None, need_dln, dev) if fresh else None
    p.w2 = weight_plan(c2, w2, None, need_dh, dev) if fresh else None
    p.hn, p.sn = scratch(h_shape.numel() * inp.element_size()), stats_bytes(rows + pad, rms)
    p.out_shape = torch.Size((*inp.shape[:-1], w2.shape[0]))
    p.dt = TE_DTYPE[inp.dtype]
    p.norm = norm_config(eps, zcg)
    p.act = act_config(act_params)
    p.fprop1, p.fprop2 = fprop_config(c1, b1), fprop_config(c2, b2)
    p.bwd_key = p.bwd = None
    return remember(c1, key, p)


def forward(ctx, inp, ln_w, ln_b, w1, b1, w2, b2, c1, c2, first, fuse_wgrad: bool, cfg: tuple):
    """LayerNormMLPFn.forward, eagerly (see the module docstring). With ``ctx`` None, the
    module's forward under torch.no_grad(), called without an autograd Function (as
    _linear_step.forward)."""
    rms, eps, zcg, kind, _, _ = cfg
    grad = ctx is not None
    need_dln = grad and (inp.requires_grad or ln_w.requires_grad or (ln_b is not None and ln_b.requires_grad))
    need_dw1, need_dw2 = grad and w1.requires_grad, grad and w2.requires_grad
    need_dh = need_dln or need_dw1 or (grad and b1 is not None and b1.requires_grad)
    inp, ln_w, ln_b = contiguous(inp), contiguous(ln_w), contiguous(ln_b)
    dev = inp.get_device()
    dtype = inp.dtype
    fresh = quantized_here(first, w1, w2)
    needs = (need_dln, need_dw1, need_dw2, need_dh)
    key = (
        c2, inp.shape, dtype, w1.shape, w1.dtype, w2.shape, w2.dtype, w1.get_device(), w2.get_device(),
        inp.device, needs, fresh, b1 is None, b2 is None, cfg,
    )  # fmt: skip
    p = c1.plans.get(key) or mlp_plan(c1, c2, key, inp, w1, w2, b1, b2, cfg, needs, fresh)
    device = p.device
    rows, pad = p.rows, p.pad
    src = padded_source(inp, pad) if pad else inp
    lr, lc, ar, ac = p.lr, p.lc, p.ar, p.ac
    if fresh:
        plan1, plan2 = p.w1, p.w2
    else:
        plan1, plan2 = weight_plan(c1, w1, first, need_dln, dev), weight_plan(c2, w2, first, need_dh, dev)
    w1r, w1c, w2r, w2c = plan1[1], plan1[2], plan2[1], plan2[2]
    hn, sn = p.hn, p.sn
    tn = lr + w1r + ar + w2r
    kn = lc + w1c + ac + w2c
    tmp = _empty(tn + (0 if need_dh else hn) + (0 if need_dln else sn), dtype=_U8, device=device)
    tp = tmp.data_ptr()
    saved = None
    sp = 0
    if kn + (hn if need_dh else 0) + (sn if need_dln else 0):
        saved = _empty(kn + (hn if need_dh else 0) + (sn if need_dln else 0), dtype=_U8, device=device)
        sp = saved.data_ptr()
    h_ptr = sp + kn if need_dh else tp + tn
    h = (h_ptr, p.dt, p.h_shape, dev)
    if need_dln:
        mu, rsigma = stats(rows + pad, rms, sp + kn + (hn if need_dh else 0), dev)
    else:
        mu, rsigma = stats(rows + pad, rms, tp + tn + (0 if need_dh else hn), dev)
    w1_fwd, w1_bwd = weight_operands(w1, plan1, dev, tp + lr, sp + lc)
    w2_fwd, w2_bwd = weight_operands(w2, plan2, dev, tp + lr + w1r + ar, sp + lc + w1c + ac)
    b_dtypes = (None if b1 is None else b1.dtype), (None if b2 is None else b2.dtype)
    b1, b2 = gemm_bias(b1, dtype), gemm_bias(b2, dtype)
    xq1, xq2 = p.xq1, p.xq2
    out = _empty(p.out_shape, dtype=dtype, device=device)
    _fwd(
        rms, (src.data_ptr(), p.dt, p.src_shape, dev), spec(ln_w), spec(ln_b), (xq1, tp, sp if lc else 0),
        mu, rsigma, p.norm, w1_fwd, spec(b1), h, p.fprop1, kind,
        (xq2, tp + lr + w1r, sp + lc + w1c if ac else 0), w2_fwd, spec(b2),
        (out.data_ptr(), p.dt, p.out_shape, dev), p.fprop2, _raw_stream(dev) if dev >= 0 else 0, p.act,
    )  # fmt: skip
    if ctx is None:
        return out
    ctx.packed = True
    ctx.plan = p
    ctx.saved_buf = saved
    ctx.keep = plan1[3], plan2[3]
    ctx.ln_bwd = (1, xq1[0], xq1[1], p.src_shape, dev, 0, sp) if lc else None
    ctx.a_bwd = (1, xq2[0], xq2[1], p.a_shape, dev, 0, sp + lc + w1c) if ac else None
    ctx.w_bwd = w1_bwd if need_dln else None, w2_bwd if need_dh else None
    ctx.h = h if need_dh else None
    if pad:
        mu, rsigma = real_rows_stats(mu, rsigma, rows)
    save_norm(ctx, inp, ln_w, ln_b, rms, zcg, mu, rsigma, need_dln)
    ctx.c, ctx.fuse, ctx.kind = (c1, c2), fuse_wgrad, kind
    ctx.weights = (w1, w2) if fuse_wgrad else (None, None)
    ctx.w_shapes, ctx.w_dtypes = (w1.shape, w2.shape), (w1.dtype, w2.dtype)
    ctx.b_dtypes = b_dtypes  # the bias gradients in the parameters' dtypes
    return out


class MlpGradPlan:
    """MlpPlan's backward part for one kind of output gradient: FC2's GradPlan (dy), FC1's
    gradient quantization and packed sizes (``g1q``, ``g1r``, ``g1c``), the activation
    gradient's and dln's scratch sizes (``an``, ``dn``) and FC1's dgrad config."""

    __slots__ = ("g2", "g1q", "an", "g1r", "g1c", "dn", "dgrad1")


def mlp_grad_plan(ctx, dy: torch.Tensor, need_dln: bool, need_dw1: bool, need_dh: bool, need_dw2: bool):
    c1, c2 = ctx.c
    p = ctx.plan
    gp = MlpGradPlan()
    gp.g2 = grad_plan(c2, dy, need_dh, need_dw2)
    gp.g1q = g1q = c1.g_q[3]._flat()
    gp.g1r = gp.g1c = gp.dn = gp.an = 0
    item = dy.element_size()
    if need_dh:
        gp.an = scratch(p.a_shape.numel() * item)
        g1r, g1c = packed(g1q[0], g1q[1], p.h_shape)
        gp.g1r, gp.g1c = (g1r if need_dln else 0), (g1c if need_dw1 else 0)
        gp.dn = scratch(p.x_shape.numel() * item) if need_dln else 0
    gp.dgrad1 = dgrad_config(c1)
    return gp


def backward(ctx, dy: torch.Tensor) -> tuple:
    """LayerNormMLPFn.backward, eagerly: (dx, dgamma, dbeta, dw1, db1, dw2, db2, None x 5)."""
    c1, c2 = ctx.c
    p = ctx.plan
    check_not_released(ctx, c1.owner)
    need_dx, need_dlnw, need_dlnb, need_dw1, need_db1, need_dw2, need_db2 = ctx.needs_input_grad[:7]
    need_dln = need_dx or need_dlnw or need_dlnb
    need_dh = need_dln or need_dw1 or need_db1
    if p.pad:
        dy = padded_grad(dy, p.pad)
    elif type(dy) is not torch.Tensor and isinstance(dy, QuantizedTensor):
        dy = dy.dequantize()
    if not (need_dh or need_dw2):
        db2 = column_sums(dy, ctx.b_dtypes[1]) if need_db2 else None
        return None, None, None, None, None, None, db2, None, None, None, None, None
    if not dy.is_contiguous():
        dy = dy.contiguous()
    dev = dy.get_device()
    device = p.device
    c2.register_backward()
    key = (dy.shape, dy.dtype, need_dln, need_dw1, need_dh, need_dw2)
    gp = p.bwd
    if p.bwd_key != key:
        gp = p.bwd = mlp_grad_plan(ctx, dy, need_dln, need_dw1, need_dh, need_dw2)
        p.bwd_key = key
    g2p, an, g1r, g1c = gp.g2, gp.an, gp.g1r, gp.g1c
    stream = _raw_stream(dev) if dev >= 0 else 0
    gr, gc = g2p.gr, g2p.gc
    tmp = take_tmp(gr + gc + an + g1r + g1c + gp.dn, device, dev, stream)
    tp = tmp.data_ptr()
    ep = tp + gr + gc
    g2 = (0, (dy.data_ptr(), g2p.dy_dt, dy.shape, dev), g2p.gq, tp if gr else 0, tp + gr if gc else 0)
    db2 = _empty(p.out_shape[-1:], dtype=ctx.b_dtypes[1], device=device) if need_db2 else None
    fuse, (w1, w2) = ctx.fuse, ctx.weights
    (w1_shape, w2_shape), (w1_dtype, w2_dtype) = ctx.w_shapes, ctx.w_dtypes
    dw2 = dw2_spec = wgrad2 = None
    if need_dw2:
        dw2, dw2_spec, wgrad2 = wgrad_target(c2, fuse, w2, w2_shape, w2_dtype, dev, device)
    w1_bwd, w2_bwd = (bwd_weight(w, k) for w, k in zip(ctx.w_bwd, ctx.keep, strict=True))
    fc1 = norm = dx = dlnw = dlnb = dw1 = db1 = da = None
    if need_dh:
        da = (ep, g2p.dy_dt, p.a_shape, dev)
        c1.register_backward()
        db1 = _empty(p.h_shape[-1:], dtype=ctx.b_dtypes[0], device=device) if need_db1 else None
        dln = dgrad1 = None
        if need_dln:
            dln = (ep + an + g1r + g1c, g2p.dy_dt, p.x_shape, dev)
            dgrad1 = gp.dgrad1
            dx, dlnw, dlnb, norm = norm_grads(ctx, p.x_shape, device, need_dlnb)
        dw1_spec = wgrad1 = None
        if need_dw1:
            dw1, dw1_spec, wgrad1 = wgrad_target(c1, fuse, w1, w1_shape, w1_dtype, dev, device)
        g1 = (gp.g1q, ep + an if g1r else 0, ep + an + g1r if g1c else 0)
        fc1 = (g1, spec(db1), ctx.ln_bwd, w1_bwd, dln, dgrad1, dw1_spec, wgrad1)
    fc2 = (g2, spec(db2), ctx.a_bwd, w2_bwd, da, g2p.dgrad if need_dh else None, dw2_spec, wgrad2)
    _bwd(fc2, ctx.kind, ctx.h, fc1, norm, stream, p.act)
    give_tmp(dev, stream, tmp)
    release_saved(ctx)
    if fuse:
        if need_dw1:
            mark_main_grad(w1)
        if need_dw2:
            mark_main_grad(w2)
    dx, dlnw = (dx if need_dx else None), (dlnw if need_dlnw else None)
    return dx, dlnw, dlnb, dw1, db1, dw2, db2, None, None, None, None, None
