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
(quantizers, delayed-scaling state) are _gemm_state.FP8Context. MXFP8 / NVFP4 run the same
steps (their quantizers return te_gemm operand tuples too; an NVFP4 one also carries its global
amaxes and whether its column-wise copy holds the Hadamard transform), except that dy is
quantized on its own and the bias gradient summed beside it (_fused.dbias_quantize_operand).

LinearFn is the default call. LinearIOFn adds TE's ``fp8_output`` / ``fp8_grad`` and a quantized
input used as it is (_fp8_io): y and/or dx are returned quantized, and xq is the input's own
bytes. Both backward passes read a quantized dy (the next layer's ``fp8_grad``) as it is.
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch import _fused, _linear_step
from te_torch._fp8_io import gemm_quantized, grad_operand, input_operand
from te_torch._gemm_state import FP8Context
from te_torch._high_precision import main_grad_of
from te_torch._linear_step import column_sums, gemm_bias
from te_torch._quantized_tensor import QuantizedTensor, is_eager
from te_torch._quantizers import Quantizer
from te_torch.functional import _gemm, gemm_wgrad

_Tensor = torch.Tensor


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
        out=main_grad_of(weight, quantized=True),
        accumulate=not getattr(weight, "overwrite_main_grad", False),
        use_split_accumulator=c.split[2],
    )
    if hasattr(weight, "grad_added_to_main_grad"):
        weight.grad_added_to_main_grad = True
    return None


def any_requires_grad(*ts) -> bool:
    return any(t is not None and t.requires_grad for t in ts)


# te_gemm operand layouts of the three GEMMs (functional.gemm / gemm_dgrad / gemm_wgrad call the
# same): fprop x W^T reads both row-wise copies, dgrad dy W reads W's column-wise copy, wgrad
# dy^T x reads both column-wise copies.
_FPROP, _DGRAD, _WGRAD = (False, True), (False, False), (True, False)
_DEFAULT_EPILOGUE, _BIAS_EPILOGUE = int(_C.Epilogue.DEFAULT), int(_C.Epilogue.BIAS)


def _row(op: tuple) -> tuple:
    """The operand with only its row-wise copy (an NVFP4 operand keeps its amax and rht)."""
    if len(op) == 5:
        return op[0], op[1], op[2], None, None
    return op[0], op[1], op[2], None, None, op[5], op[6]


def _col(op: tuple) -> tuple:
    """The operand with only its column-wise copy."""
    if len(op) == 5:
        return op[0], None, None, op[3], op[4]
    return op[0], None, None, op[3], op[4], op[5], op[6]


def _saved_col(mode: int, data, scale_inv, amax, rht: bool) -> tuple:
    """A column-wise copy saved for backward as an operand again (NVFP4: with amax, rht)."""
    if amax is None:
        return mode, None, None, data, scale_inv
    return mode, None, None, data, scale_inv, amax, rht


def _amax_rht(op: tuple, keep: bool) -> tuple:
    """(amax, rht) of an NVFP4 operand to save (``keep``), else (None, False)."""
    return (op[5], op[6]) if keep and len(op) > 5 else (None, False)


def _split(flag) -> int:
    return -1 if flag is None else int(bool(flag))


def _backward(ctx, dy, gi_q: Quantizer | None = None) -> tuple:
    """(dx, dw, db, None, None, None): LinearFn's backward (``gi_q`` None), and LinearIOFn's.

    ``dy`` may be quantized (the next layer's fp8_grad): its copies are the dgrad / wgrad
    operands as they are, and db the column sums of its dequantized values (the unquantized dy
    does not exist here; TE does the same). ``gi_q``: dx is returned as its quantized tensor
    (fp8_grad)."""
    c = ctx.c
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    dx = dw = db = gq = None
    if type(dy) is not _Tensor and isinstance(dy, QuantizedTensor):  # type() first: see te.Linear
        gq = grad_operand(dy, c, need_dx, need_dw) if need_dx or need_dw else None
        if gq is None:  # another recipe's format (or no GEMM reads it): as a plain gradient
            dy = dy.dequantize()
        else:
            c.register_backward()
            if need_db:
                db = column_sums(dy.dequantize(torch.float32), ctx.b_dtype)
    if gq is None:
        if not (need_dx or need_dw):
            if need_db:
                db = column_sums(dy, ctx.b_dtype)
            return dx, dw, db, None, None, None
        if not dy.is_contiguous():
            dy = dy.contiguous()
        q = c.g_q[2 * need_dx + need_dw]
        c.register_backward()
        if need_db:
            gq, db = _fused.dbias_quantize_operand(dy, q, ctx.b_dtype)
        else:
            gq = q._operand(dy)
    xcd, xcs, wcd, wcs, x_amax, w_amax = ctx.saved_tensors
    x_mode, w_mode = ctx.modes
    x_rht, w_rht = ctx.rht
    if need_dx:
        shape, split = (*dy.shape[:-1], ctx.in_features), _split(c.split[1])
        wc = _saved_col(w_mode, wcd, wcs, w_amax, w_rht)
        if gi_q is None:
            dx = _gemm(
                _row(gq), wc, *_DGRAD, shape, dy.dtype, None, False, _DEFAULT_EPILOGUE, None, None, split
            )[0]
        else:
            dx = gemm_quantized(c, gi_q, _row(gq), wc, *_DGRAD, shape, dy.dtype, None, split)
    if need_dw:
        xc = _saved_col(x_mode, xcd, xcs, x_amax, x_rht)
        shape = (dy.shape[-1], ctx.in_features)
        if ctx.fuse:
            w = ctx.weight
            _gemm(
                _col(gq), xc, *_WGRAD, shape, torch.float32, main_grad_of(w, quantized=True),
                not getattr(w, "overwrite_main_grad", False), _DEFAULT_EPILOGUE, None, None,
                _split(c.split[2]),
            )  # fmt: skip
            if hasattr(w, "grad_added_to_main_grad"):
                w.grad_added_to_main_grad = True
        else:
            dw = _gemm(
                _col(gq), xc, *_WGRAD, shape, ctx.w_dtype, None, False, _DEFAULT_EPILOGUE,
                None, None, _split(c.split[2]),
            )[0]  # fmt: skip
    return dx, dw, db, None, None, None


def _save(ctx, c, xq, wq, need_dx, need_dw, inp, weight, bias, fuse_wgrad) -> None:
    # Only the column-wise copies are read again (wgrad: x's, dgrad: W's).
    # NVFP4 copies with their global amaxes and transform flags.
    (x_amax, x_rht), (w_amax, w_rht) = _amax_rht(xq, need_dw), _amax_rht(wq, need_dx)
    ctx.save_for_backward(
        xq[3] if need_dw else None, xq[4] if need_dw else None,
        wq[3] if need_dx else None, wq[4] if need_dx else None, x_amax, w_amax,
    )  # fmt: skip
    ctx.modes = xq[0], wq[0]
    ctx.rht = x_rht, w_rht
    ctx.c = c
    ctx.fuse = fuse_wgrad
    ctx.weight = weight if fuse_wgrad else None
    ctx.w_dtype = weight.dtype
    ctx.b_dtype = None if bias is None else bias.dtype
    ctx.in_features = inp.shape[-1]


class LinearFn(torch.autograd.Function):
    """y = x w^T + b with quantized GEMMs; see the module docstring.

    Eagerly (the hot path of every FP8 step) each direction is one fused call into te_core._C
    (_linear_step). Traced (torch.compile), or for formats those calls do not take, operands travel
    as te_gemm operand tuples (Quantizer._operand) through the registered ops, so no
    quantized-tensor object is built and no argument is re-checked that te_gemm checks anyway."""

    @staticmethod
    def forward(ctx, inp, weight, bias, c: FP8Context, first, fuse_wgrad: bool):
        if c.packed_ok and is_eager(inp):
            return _linear_step.forward(ctx, inp, weight, bias, c, first, fuse_wgrad)
        ctx.packed = False
        need_dx, need_dw = inp.requires_grad, weight.requires_grad
        xq = c.x_q[2 + need_dw]._operand(inp)
        wq = c.weight_operand(weight, first, need_dx)
        gb = gemm_bias(bias, inp.dtype)
        out = _gemm(
            _row(xq), _row(wq), *_FPROP, (*inp.shape[:-1], weight.shape[0]), inp.dtype, None, False,
            _DEFAULT_EPILOGUE if gb is None else _BIAS_EPILOGUE, gb, None, _split(c.split[0]),
        )[0]  # fmt: skip
        _save(ctx, c, xq, wq, need_dx, need_dw, inp, weight, bias, fuse_wgrad)
        return out

    @staticmethod
    def backward(ctx, dy):
        if ctx.packed:
            return _linear_step.backward(ctx, dy)
        return _backward(ctx, dy)


class LinearStepFn(torch.autograd.Function):
    """LinearFn where its eager branch is known to be taken (the caller checked FP8Context's
    packed_ok and is_eager): the fused step itself, without LinearFn's forward and backward
    frames and their second is_eager check in between (te.Linear's small eager step)."""

    forward = staticmethod(_linear_step.forward)
    backward = staticmethod(_linear_step.backward)


class LinearIOFn(torch.autograd.Function):
    """LinearFn with TE's ``fp8_output`` / ``fp8_grad`` and a quantized input (see the module
    docstring). ``out_q``: the output quantizer (None: y in high precision); ``gi_q``: the
    grad-input quantizer (None: dx in high precision). A quantized ``inp`` is the fprop operand
    as it is (and, when the weight needs a gradient, its column-wise copy the wgrad one)."""

    @staticmethod
    def forward(
        ctx, inp, weight, bias, c: FP8Context, first, fuse_wgrad: bool,
        out_q: Quantizer | None, gi_q: Quantizer | None,
    ):  # fmt: skip
        need_dx, need_dw = inp.requires_grad, weight.requires_grad
        if isinstance(inp, QuantizedTensor):
            xq = input_operand(inp, c, need_dw)
        else:
            xq = c.x_q[2 + need_dw]._operand(inp)
        wq = c.weight_operand(weight, first, need_dx)
        gb = gemm_bias(bias, inp.dtype)
        shape, split = (*inp.shape[:-1], weight.shape[0]), _split(c.split[0])
        if out_q is None:
            out = _gemm(
                _row(xq), _row(wq), *_FPROP, shape, inp.dtype, None, False,
                _DEFAULT_EPILOGUE if gb is None else _BIAS_EPILOGUE, gb, None, split,
            )[0]  # fmt: skip
        else:
            out = gemm_quantized(c, out_q, _row(xq), _row(wq), *_FPROP, shape, inp.dtype, gb, split)
        _save(ctx, c, xq, wq, need_dx, need_dw, inp, weight, bias, fuse_wgrad)
        ctx.gi_q = gi_q
        return out

    @staticmethod
    def backward(ctx, dy):
        return (*_backward(ctx, dy, ctx.gi_q), None, None)
