"""te.Linear's eager FP8 step as two calls into te_core._C (csrc/python/linear_step.cpp).

LinearFn's traced path (torch.compile) runs quantize / GEMM ops one by one; eagerly the same
work is one ``_C.linear_fwd`` and one ``_C.linear_bwd`` call, with every quantized copy packed
into one byte buffer per lifetime:

    forward   tmp   = [x row-wise | W row-wise]        dead once fprop has run
              saved = [x column-wise | W column-wise]  kept for wgrad / dgrad (only what they read)
    backward  tmp   = [dy row-wise | dy column-wise]

so a step allocates 3 + 4 tensors instead of ~13 and crosses into C++ twice instead of ~6 times;
on the H200 host the Python frames, allocations and argument conversions of the unfused path cost
more than its kernels at small sizes (benchmarks/NOTES.md). The numerics are the unfused path's:
the same te_quantize / te_dbias_quantize / te_gemm calls with the same arguments.
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch._dtypes import TE_DTYPE
from te_torch._fp8_io import grad_operand
from te_torch._kernels import _raw_stream, gemm_config, packed, spec
from te_torch._quantized_tensor import QuantizedTensor

_U8 = torch.uint8
_empty = torch.empty
_linear_fwd = _C.linear_fwd
_linear_bwd = _C.linear_bwd
_DEFAULT, _BIAS = int(_C.Epilogue.DEFAULT), int(_C.Epilogue.BIAS)


def _stored_operand(op: tuple) -> tuple:
    """A stored quantized weight's (mode, rd, rs, cd, cs) as a kind-2 operand."""
    return (2, op[0], spec(op[1]), spec(op[2]), spec(op[3]), spec(op[4]))


def column_sums(dy: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bias gradient when dy is not quantized here (no other gradient needed, or dy came
    quantized)."""
    return dy.reshape(-1, dy.shape[-1]).float().sum(0).to(dtype)


def _split(flag) -> int:
    return -1 if flag is None else int(bool(flag))


def forward(ctx, inp: torch.Tensor, weight: torch.Tensor, bias, c, first, fuse_wgrad: bool):
    """LinearFn.forward, eagerly (see the module docstring)."""
    need_dx, need_dw = inp.requires_grad, weight.requires_grad
    if not inp.is_contiguous():
        inp = inp.contiguous()
    dev = inp.get_device()
    device = inp.device
    xq = c.x_q[3]._flat()
    xr, xc = packed(xq[0], xq[1], inp.shape)
    if not need_dw:
        xc = 0
    keep = None  # what must outlive the forward besides `saved` (a cached or stored weight)
    if first is None and not isinstance(weight, QuantizedTensor):
        wq = c.w_q[3]._flat()
        wr, wc = packed(wq[0], wq[1], weight.shape)
        if not need_dx:
            wc = 0
    else:  # stored quantized, or is_first_microbatch's cached copy: its parts as they are
        keep = c.weight_operand(weight, first, need_dx)  # alive until backward, even if re-cached
        w_fwd = w_bwd = _stored_operand(keep)
        wr = wc = 0
    tmp = _empty(xr + wr, dtype=_U8, device=device)
    tp = tmp.data_ptr()
    saved = sp = None
    if xc + wc:
        saved = _empty(xc + wc, dtype=_U8, device=device)
        sp = saved.data_ptr()
    x_fwd = (0, (inp.data_ptr(), TE_DTYPE[inp.dtype], inp.shape, dev), xq, tp, sp if xc else 0)
    if wr:  # fresh weight: quantized here, its column-wise copy after x's in `saved`
        w_spec = (weight.data_ptr(), TE_DTYPE[weight.dtype], weight.shape, dev)
        w_fwd = (0, w_spec, wq, tp + xr, sp + xc if wc else 0)
        w_bwd = (1, wq[0], wq[1], weight.shape, dev, 0, sp + xc if wc else 0)
    if bias is not None:
        if bias.dtype != inp.dtype and bias.dtype != torch.float32:
            bias = bias.to(inp.dtype)
        elif not bias.is_contiguous():
            bias = bias.contiguous()
    out_shape = (*inp.shape[:-1], weight.shape[0])
    out = _empty(out_shape, dtype=inp.dtype, device=device)
    config = gemm_config(False, True, False, _DEFAULT if bias is None else _BIAS, False, _split(c.split[0]))
    _linear_fwd(
        x_fwd, w_fwd, spec(bias), (out.data_ptr(), TE_DTYPE[out.dtype], out_shape, dev), config,
        _raw_stream(dev) if dev >= 0 else 0,
    )  # fmt: skip
    ctx.packed = True
    ctx.saved_buf, ctx.keep = saved, keep
    ctx.x_bwd = (1, xq[0], xq[1], inp.shape, dev, 0, sp) if xc else None
    ctx.w_bwd = w_bwd if need_dx else None
    ctx.x_shape, ctx.x_dtype = inp.shape, inp.dtype
    ctx.c = c
    ctx.fuse = fuse_wgrad
    ctx.weight = weight if fuse_wgrad else None
    ctx.w_shape, ctx.w_dtype = weight.shape, weight.dtype
    ctx.b_dtype = None if bias is None else bias.dtype
    return out


def backward(ctx, dy: torch.Tensor) -> tuple:
    """LinearFn.backward, eagerly: (dx, dw, db, None, None, None). A quantized ``dy`` (the next
    layer's ``fp8_grad``) is the GEMMs' operand as it is, its bias gradient the column sums of
    its dequantized values (as in _linear_fn._backward)."""
    c = ctx.c
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    g = db = None
    if type(dy) is not torch.Tensor and isinstance(dy, QuantizedTensor):
        gq = grad_operand(dy, c, need_dx, need_dw) if need_dx or need_dw else None
        if gq is None:  # another recipe's format (or no GEMM reads it): as a plain gradient
            dy = dy.dequantize()
        else:
            g = _stored_operand(gq)
            if need_db:
                db = column_sums(dy.dequantize(torch.float32), ctx.b_dtype)
                need_db = False
    if not (need_dx or need_dw):
        return None, None, column_sums(dy, ctx.b_dtype) if need_db else db, None, None, None
    if g is None and not dy.is_contiguous():
        dy = dy.contiguous()
    dev = dy.get_device()
    device = dy.device
    c.register_backward()
    if g is None:
        gq = c.g_q[3]._flat()
        gr, gc = packed(gq[0], gq[1], dy.shape)
        if not need_dx:
            gr = 0
        if not need_dw:
            gc = 0
        tmp = _empty(gr + gc, dtype=_U8, device=device)
        tp = tmp.data_ptr()
        g = (0, (dy.data_ptr(), TE_DTYPE[dy.dtype], dy.shape, dev), gq, tp if gr else 0, tp + gr if gc else 0)
    if need_db:
        db = _empty((dy.shape[-1],), dtype=ctx.b_dtype, device=device)
    dx = dx_spec = dgrad = None
    if need_dx:
        dx = _empty(ctx.x_shape, dtype=dy.dtype, device=device)
        dx_spec = (dx.data_ptr(), TE_DTYPE[dx.dtype], ctx.x_shape, dev)
        dgrad = gemm_config(False, False, False, _DEFAULT, False, _split(c.split[1]))
    dw = dw_spec = wgrad = None
    if need_dw:
        split = _split(c.split[2])
        if ctx.fuse:
            w = ctx.weight
            main_grad = w.main_grad
            if main_grad.dtype != torch.float32 or not main_grad.is_contiguous():
                raise ValueError(
                    "weight.main_grad: expected a contiguous fp32 tensor (fuse_wgrad_accumulation "
                    f"accumulates into it), got {main_grad.dtype} with strides {tuple(main_grad.stride())}"
                )
            accumulate = not getattr(w, "overwrite_main_grad", False)
            dw_spec = (main_grad.data_ptr(), TE_DTYPE[torch.float32], main_grad.shape, dev)
            wgrad = gemm_config(True, False, accumulate, _DEFAULT, False, split)
        else:
            dw = _empty(ctx.w_shape, dtype=ctx.w_dtype, device=device)
            dw_spec = (dw.data_ptr(), TE_DTYPE[dw.dtype], ctx.w_shape, dev)
            wgrad = gemm_config(True, False, False, _DEFAULT, False, split)
    _linear_bwd(
        g, spec(db) if need_db else None, ctx.x_bwd, ctx.w_bwd, dx_spec, dgrad, dw_spec, wgrad,
        _raw_stream(dev) if dev >= 0 else 0,
    )  # fmt: skip
    if need_dw and ctx.fuse and hasattr(ctx.weight, "grad_added_to_main_grad"):
        ctx.weight.grad_added_to_main_grad = True
    return dx, dw, db, None, None, None
