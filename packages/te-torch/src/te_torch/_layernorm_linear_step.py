"""te.LayerNormLinear's eager FP8 step as two calls into te_core._C
(csrc/python/layernorm_linear_step.cpp), as te.Linear's (_linear_step):

    forward   _C.layernorm_linear_fwd: the norm writes the GEMM's packed input copies and
              mu / rsigma, the weight is quantized (or read as stored / cached), fprop GEMM
              tmp   = [norm out row-wise | W row-wise]                 dead once fprop has run
              saved = [norm out column-wise | W column-wise | mu | rsigma]
              (each only when a gradient reads it; mu / rsigma go to tmp when none does)
    backward  _C.layernorm_linear_bwd: linear_bwd's dy quantization (+ bias gradient) and
              GEMMs, the dgrad GEMM writing dln, then the norm backward from it
              tmp   = [dy row-wise | dy column-wise | dln]

The numerics are the op-by-op path's (LayerNormLinearFn): the same te_layernorm_fwd /
te_rmsnorm_fwd, te_quantize, te_dbias_quantize, te_gemm and norm-backward calls with the same
arguments. LayerNormLinearFn takes this path eagerly for the formats te.Linear's step takes
(``FP8Context.packed_ok``: per-tensor and block FP8, not MXFP8 / NVFP4) and runs op by op under
torch.compile tracing, with ``return_layernorm_output``, and with ``fp8_output`` / ``fp8_grad``.
A quantized dy (the next layer's ``fp8_grad``) is read as it is (_linear_step.given_grad).
An odd token count is padded here as in _linear_step: the norm runs on x with its last row
copied (the padding rows' outputs, mu and rsigma are the last row's), fprop and dgrad read the
first rows, and the norm backward runs on the real rows alone (dz = dln has them only).
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch._dtypes import TE_DTYPE
from te_torch._fused_kernels import norm_config
from te_torch._kernels import _raw_stream, give_tmp, spec, take_tmp
from te_torch._linear_step import (
    StepPlan,
    bwd_weight,
    check_not_released,
    column_sums,
    gemm_bias,
    given_grad,
    grad_plan,
    mark_main_grad,
    padded_grad,
    quantized_here,
    release_saved,
    remember,
    step_plan,
    weight_operands,
    weight_plan,
    wgrad_target,
)
from te_torch._token_pad import padded_source

_U8, _F32 = torch.uint8, TE_DTYPE[torch.float32]
_empty = torch.empty
_fwd = _C.layernorm_linear_fwd
_bwd = _C.layernorm_linear_bwd


def scratch(nbytes: int) -> int:
    """Bytes reserved for a high-precision part in a packed buffer: whole 256-byte blocks (the
    parts after it stay aligned), at least one (an empty part still gets its own address)."""
    return max((nbytes + 255) & ~255, 256)


def contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.is_contiguous() else t.contiguous()


def stats_bytes(rows: int, rms: bool) -> int:
    """The bytes of the norm's fp32 [rows] statistics (mu, rsigma; RMSNorm: rsigma alone)."""
    return scratch(4 * rows) * (1 if rms else 2)


def stats(rows: int, rms: bool, base: int, dev: int) -> tuple[tuple | None, tuple]:
    """(mu, rsigma) placed at ``base`` (mu None for RMSNorm)."""
    if rms:
        return None, (base, _F32, (rows,), dev)
    return (base, _F32, (rows,), dev), (base + scratch(4 * rows), _F32, (rows,), dev)


def real_rows_stats(mu, rsigma, rows: int) -> tuple:
    """stats() of a padded norm as the norm backward reads them: the real rows', the first
    ``rows`` of each (its dz, dln, has no padding rows)."""
    return tuple(None if t is None else (t[0], t[1], (rows,), t[3]) for t in (mu, rsigma))


def norm_grads(ctx, shape, device, need_dlnb: bool) -> tuple:
    """(dx, dgamma, dbeta, the norm-backward tuple) of the saved forward; dbeta None for RMSNorm
    or when not needed (as _fused.norm_bwd)."""
    inp, ln_w = ctx.saved_tensors
    dx = _empty(shape, dtype=inp.dtype, device=device)
    dlnw = _empty(ln_w.shape, dtype=ln_w.dtype, device=device)
    dlnb = None
    if ctx.has_ln_bias and need_dlnb and not ctx.rms:
        dlnb = _empty(ln_w.shape, dtype=ln_w.dtype, device=device)
    mu, rsigma = ctx.stats
    norm = (
        ctx.rms, spec(inp), mu, rsigma, spec(ln_w), spec(dx), spec(dlnw), spec(dlnb),
        norm_config(1e-5, ctx.zcg),  # the backward reads only zero_centered_gamma
    )  # fmt: skip
    return dx, dlnw, dlnb, norm


def save_norm(ctx, inp, ln_w, ln_b, rms: bool, zcg: bool, mu, rsigma, need_dln: bool) -> None:
    if need_dln:
        ctx.save_for_backward(inp, ln_w)
    ctx.stats = mu, rsigma
    ctx.rms, ctx.zcg = rms, zcg
    ctx.has_ln_bias = ln_b is not None


class LnLinearPlan(StepPlan):
    """te.Linear's StepPlan for this step, plus the real token count (``rows``), the norm
    statistics' bytes (``sn``) and the norm config."""

    __slots__ = ("rows", "sn", "norm")


def forward(ctx, inp, ln_w, ln_b, weight, bias, c, first, fuse_wgrad: bool, norm: tuple):
    """LayerNormLinearFn.forward, eagerly (see the module docstring); ``norm`` = (rms, eps,
    zero_centered_gamma). With ``ctx`` None, the module's forward under torch.no_grad(), called
    without an autograd Function (as _linear_step.forward)."""
    rms, eps, zcg = norm
    need_dln = ctx is not None and (
        inp.requires_grad or ln_w.requires_grad or (ln_b is not None and ln_b.requires_grad)
    )
    need_dw = ctx is not None and weight.requires_grad
    inp, ln_w, ln_b = contiguous(inp), contiguous(ln_w), contiguous(ln_b)
    dev = inp.get_device()
    fresh = quantized_here(first, weight)
    # inp.device, not dev: a meta tensor's index is -1 as the CPU's (its plan allocates on meta)
    key = (inp.shape, inp.dtype, inp.device, weight.shape, weight.dtype, weight.get_device(), need_dln,
           need_dw, fresh, bias is None, norm)  # fmt: skip
    p = c.plans.get(key)
    if p is None:
        p = step_plan(c, inp, weight, need_dln, need_dw, fresh, bias, LnLinearPlan)
        p.rows = inp.numel() // inp.shape[-1] if inp.shape[-1] else 0
        p.sn = stats_bytes(p.rows + p.pad, rms)
        p.norm = norm_config(eps, zcg)
        remember(c, key, p)
    device = p.device
    rows, pad, sn = p.rows, p.pad, p.sn
    src = padded_source(inp, pad) if pad else inp
    lr, lc = p.xr, p.xc
    w_plan = p.w if fresh else weight_plan(c, weight, first, need_dln, dev)
    _, wr, wc, keep = w_plan
    tmp = _empty(lr + wr + (0 if need_dln else sn), dtype=_U8, device=device)
    tp = tmp.data_ptr()
    saved = None
    sp = 0
    if lc + wc + (sn if need_dln else 0):
        saved = _empty(lc + wc + (sn if need_dln else 0), dtype=_U8, device=device)
        sp = saved.data_ptr()
    mu, rsigma = stats(rows + pad, rms, sp + lc + wc if need_dln else tp + lr + wr, dev)
    w_fwd, w_bwd = weight_operands(weight, w_plan, dev, tp + lr, sp + lc)
    b_dtype = None if bias is None else bias.dtype
    bias = gemm_bias(bias, inp.dtype)
    xq = p.xq
    out = _empty(p.out_shape, dtype=inp.dtype, device=device)
    _fwd(
        rms, (src.data_ptr(), p.out_dt, p.src_shape, dev), spec(ln_w), spec(ln_b), (xq, tp, sp if lc else 0),
        mu, rsigma, p.norm, w_fwd, spec(bias), (out.data_ptr(), p.out_dt, p.out_shape, dev), p.fprop,
        _raw_stream(dev) if dev >= 0 else 0,
    )  # fmt: skip
    if ctx is None:
        return out
    ctx.packed = True
    ctx.plan = p
    ctx.saved_buf, ctx.keep = saved, keep
    ctx.ln_bwd = (1, xq[0], xq[1], p.src_shape, dev, 0, sp) if lc else None
    ctx.w_bwd = w_bwd if need_dln else None
    if pad:
        mu, rsigma = real_rows_stats(mu, rsigma, rows)
    save_norm(ctx, inp, ln_w, ln_b, rms, zcg, mu, rsigma, need_dln)
    ctx.c = c
    ctx.fuse = fuse_wgrad
    ctx.weight = weight if fuse_wgrad else None
    ctx.w_dtype = weight.dtype
    ctx.b_dtype = b_dtype
    return out


def backward(ctx, dy: torch.Tensor) -> tuple:
    """LayerNormLinearFn.backward, eagerly: (dx, dgamma, dbeta, dw, db, None x 4)."""
    c, p = ctx.c, ctx.plan
    check_not_released(ctx, c.owner)
    need_dx, need_dlnw, need_dlnb, need_dw, need_db = ctx.needs_input_grad[:5]
    need_dln = need_dx or need_dlnw or need_dlnb
    if p.pad:
        dy = padded_grad(dy, p.pad)
    dy, g, db, parts = given_grad(dy, c, need_dln, need_dw, ctx.b_dtype if need_db else None)
    if not (need_dln or need_dw):
        db = column_sums(dy, ctx.b_dtype) if need_db else db
        return None, None, None, None, db, None, None, None, None
    if g is None and not dy.is_contiguous():
        dy = dy.contiguous()
    dev = dy.get_device()
    device = p.device
    stream = _raw_stream(dev) if dev >= 0 else 0
    c.register_backward()
    shape = p.x_shape
    key = (dy.shape, dy.dtype, need_dln, need_dw)
    gp = p.bwd
    if p.bwd_key != key:
        gp = p.bwd = grad_plan(c, dy, need_dln, need_dw)
        p.bwd_key = key
    dln_bytes = scratch(shape.numel() * dy.element_size()) if need_dln else 0
    if g is None:
        gr, gc = gp.gr, gp.gc
        tmp = take_tmp(gr + gc + dln_bytes, device, dev, stream)
        tp = tmp.data_ptr()
        g = (0, (dy.data_ptr(), gp.dy_dt, dy.shape, dev), gp.gq, tp if gr else 0, tp + gr if gc else 0)
        dln_ptr = tp + gr + gc
    else:
        need_db = False  # summed by given_grad
        tmp = take_tmp(dln_bytes, device, dev, stream)
        dln_ptr = tmp.data_ptr()
    if need_db:
        db = _empty(p.out_shape[-1:], dtype=ctx.b_dtype, device=device)
    dx = dlnw = dlnb = dln = dgrad = norm = None
    if need_dln:
        dln = (dln_ptr, gp.dy_dt, shape, dev)
        dgrad = gp.dgrad
        dx, dlnw, dlnb, norm = norm_grads(ctx, shape, device, need_dlnb)
    dw = dw_spec = wgrad = None
    if need_dw:
        dw, dw_spec, wgrad = wgrad_target(c, ctx.fuse, ctx.weight, p.w_shape, ctx.w_dtype, dev, device)
    _bwd(
        g, spec(db) if need_db else None, ctx.ln_bwd, bwd_weight(ctx.w_bwd, ctx.keep), dln, dgrad, dw_spec,
        wgrad, norm, stream,
    )  # fmt: skip
    give_tmp(dev, stream, tmp)
    del parts  # alive until here
    release_saved(ctx)
    if need_dw and ctx.fuse:
        mark_main_grad(ctx.weight)
    return (dx if need_dx else None), (dlnw if need_dlnw else None), dlnb, dw, db, None, None, None, None
