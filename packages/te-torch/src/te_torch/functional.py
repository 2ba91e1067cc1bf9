"""te_torch.functional: te's fused ops as plain functions (``import te_torch as te``, then
``te.functional.gemm(...)``).

The three matrix products of a Linear layer ``y = x w^T``, each one call of te_gemm (te/gemm.h)
with its training epilogues:

=====================================  ==================================  =====================
function                               computes                            epilogues
=====================================  ==================================  =====================
``gemm(x, w)``                         ``y = x @ w.T`` (like F.linear)     ``bias``, ``gelu``
``gemm_dgrad(dy, w)``                  ``dx = dy @ w``                     ``gelu_input`` (dgelu)
``gemm_wgrad(dy, x)``                  ``dw = dy^T @ x``                   ``bias_grad``
=====================================  ==================================  =====================

Shapes: x [..., K], w [N, K], dy [..., N]; leading dims flatten into rows (wgrad sums over
them). Operands are plain torch tensors (float32 / bfloat16 / float16, both the same dtype) or
te quantized tensors (``Float8Tensor``, ``Float8BlockwiseQTensor``, ``MXFP8Tensor``,
``NVFP4Tensor``; both quantized, of one family). An FP8
GEMM reads each operand with K contiguous, so each function reads a fixed copy:

    gemm        x row-wise,        w row-wise
    gemm_dgrad  dy row-wise,       w column-wise
    gemm_wgrad  dy column-wise,    x column-wise

A quantized operand missing that copy is te's ValueError naming it (quantize with that usage).
Supported FP8 pairs are te_gemm's: per-tensor E4M3 x E4M3 / E4M3 x E5M2 / E5M2 x E4M3; block
1x128 x 128x128 and 1x128 x 1x128 (at most one 128x128 operand); MXFP8 x MXFP8 (not E5M2 x
E5M2) and NVFP4 x NVFP4 (the Hadamard transform on both column-wise copies or neither). MXFP8 and
NVFP4 run emulated on every device te has (block-dequantized to BF16, then the BF16 GEMM with fp32
accumulation; te-core logs this once, at INFO, to the ``te`` logger) and eagerly only.

Common keyword arguments:
    out_dtype: float32, bfloat16 or float16; default the first operand's (high-precision) dtype,
        or ``out``'s.
    out: a contiguous tensor of the output's shape to write into (returned).
    accumulate: add the product into ``out`` (beta = 1; e.g. an fp32 ``main_grad``); needs out.
    use_split_accumulator: FP8 only: True promotes partial sums to fp32 often (accurate), False
        is fast accumulation; None is te's default (True).

te's own checks (shapes, dtypes, copies, devices) raise ValueError with te_gemm's message, which
names its operands: ``a`` is the first argument, ``b`` the second.

These functions are not differentiable: they raise if grad mode is on and an input requires
grad. te's modules call them from their autograd Functions. Eager calls go straight into
te_core._C; under torch.compile they trace as ``torch.ops.te.gemm``.
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch import _kernels
from te_torch._blockwise_tensor import Float8BlockwiseQTensor
from te_torch._dtypes import TE_DTYPE, te_dtype
from te_torch._float8_tensor import Float8Tensor
from te_torch._mx_tensor import _MXTensor, not_traceable
from te_torch._quantized_tensor import QuantizedTensor, is_eager

__all__ = ["gemm", "gemm_dgrad", "gemm_wgrad"]

_PER_TENSOR = int(_C.ScalingMode.PER_TENSOR)
_BLOCK_1D = int(_C.ScalingMode.BLOCK_1D)
_BLOCK_2D = int(_C.ScalingMode.BLOCK_2D)
_DEFAULT = int(_C.Epilogue.DEFAULT)
_BIAS = int(_C.Epilogue.BIAS)
_GELU_AUX = int(_C.Epilogue.GELU_AUX)
_DGELU = int(_C.Epilogue.DGELU)
_BGRAD = int(_C.Epilogue.BGRAD)
_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor


def gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    gelu: bool = False,
    use_split_accumulator: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``x @ w.T (+ bias)``, like F.linear: x [..., K], w [N, K] -> [..., N].

    bias: [N], in the output dtype or float32, added to every row (te's BIAS epilogue).
    gelu: also apply the tanh-approximate gelu; returns ``(gelu(pre), pre)``, where
        ``pre = x @ w.T (+ bias)`` is the pre-activation the backward needs (GELU_AUX).
    See the module docstring for the operands, out_dtype, out, accumulate and
    use_split_accumulator.
    """
    a, b = _operand(x, True, "x"), _operand(w, True, "w")
    if _grad_enabled() and (x.requires_grad or w.requires_grad or (bias is not None and bias.requires_grad)):
        raise _not_differentiable("gemm")
    if out_dtype is None:
        out_dtype = x.dtype if out is None else out.dtype
    w_shape = w.shape
    if len(w_shape) != 2:
        raise _bad_shape("gemm", "w", w_shape, "a 2-D weight [N, K]")
    epilogue = _GELU_AUX if gelu else (_DEFAULT if bias is None else _BIAS)
    d, aux, _ = _gemm(
        a,
        b,
        False,
        True,
        (*x.shape[:-1], w_shape[0]),
        out_dtype,
        out,
        accumulate,
        epilogue,
        bias,
        None,
        use_split_accumulator,
    )
    return (d, aux) if gelu else d


def gemm_dgrad(
    dy: torch.Tensor,
    w: torch.Tensor,
    *,
    gelu_input: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    use_split_accumulator: bool | None = None,
) -> torch.Tensor:
    """``dy @ w``, the input gradient of ``gemm``: dy [..., N], w [N, K] -> [..., K].

    gelu_input: the pre-activation ``pre`` that ``gemm(..., gelu=True)`` returned (shape
        [..., K], the output dtype): returns ``(dy @ w) * gelu'(pre)`` (te's DGELU epilogue),
        the gradient through the activation that followed ``pre``.
    A quantized w is read through its column-wise copy. See the module docstring for the rest.
    """
    a, b = _operand(dy, True, "dy"), _operand(w, False, "w")
    if _grad_enabled() and (dy.requires_grad or w.requires_grad):
        raise _not_differentiable("gemm_dgrad")
    if out_dtype is None:
        out_dtype = dy.dtype if out is None else out.dtype
    w_shape = w.shape
    if len(w_shape) != 2:
        raise _bad_shape("gemm_dgrad", "w", w_shape, "a 2-D weight [N, K]")
    d, _, _ = _gemm(
        a,
        b,
        False,
        False,
        (*dy.shape[:-1], w_shape[1]),
        out_dtype,
        out,
        accumulate,
        _DEFAULT if gelu_input is None else _DGELU,
        None,
        gelu_input,
        use_split_accumulator,
    )
    return d


def gemm_wgrad(
    dy: torch.Tensor,
    x: torch.Tensor,
    *,
    bias_grad: bool = False,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    use_split_accumulator: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``dy^T @ x`` over the flattened leading dims, the weight gradient of ``gemm``:
    dy [..., N], x [..., K] -> [N, K].

    bias_grad: also return the bias gradient, the column sums of dy ([N], the output dtype;
        te's BGRAD epilogue, fresh even when ``accumulate``): returns ``(dw, dbias)``.
    Quantized dy and x are read through their column-wise copies. With ``accumulate=True`` and
    ``out`` an fp32 ``main_grad``, this is the fused weight-gradient accumulation.
    """
    a, b = _operand(dy, False, "dy"), _operand(x, False, "x")
    if _grad_enabled() and (dy.requires_grad or x.requires_grad):
        raise _not_differentiable("gemm_wgrad")
    if out_dtype is None:
        out_dtype = dy.dtype if out is None else out.dtype
    dy_shape, x_shape = dy.shape, x.shape
    if not (dy_shape and x_shape):
        name, shape = ("x", x_shape) if dy_shape else ("dy", dy_shape)
        raise _bad_shape("gemm_wgrad", name, shape, "at least 1 dim ([..., N] / [..., K])")
    d, _, db = _gemm(
        a,
        b,
        True,
        False,
        (dy_shape[-1], x_shape[-1]),
        out_dtype,
        out,
        accumulate,
        _BGRAD if bias_grad else _DEFAULT,
        None,
        None,
        use_split_accumulator,
    )
    return (d, db) if bias_grad else d


# -- shared ---------------------------------------------------------------------------------------


def _operand(t: torch.Tensor, rowwise: bool, name: str) -> _kernels.Operand:
    """``t`` as te_gemm's operand: a contiguous high-precision tensor, or the one copy of a
    quantized tensor this layout reads (``rowwise`` or column-wise) with its scale_inv."""
    if isinstance(t, QuantizedTensor):
        if isinstance(t, Float8Tensor):
            mode, rd, cd, rs = _PER_TENSOR, t._data, t._transpose, t._scale_inv
            cs = rs
        elif isinstance(t, Float8BlockwiseQTensor):
            mode = _BLOCK_2D if t._is_2D_scaled else _BLOCK_1D
            rd, rs, cd, cs = (
                t._rowwise_data,
                t._rowwise_scale_inv,
                t._columnwise_data,
                t._columnwise_scale_inv,
            )
        elif isinstance(t, _MXTensor):
            op = t._operand()  # NVFP4: (..., amax, rht) after the four parts
            mode, rd, rs, cd, cs = op[:5]
            if rowwise and rd is not None:
                return (mode, rd, rs, None, None, *op[5:])
            if not rowwise and cd is not None:
                return (mode, None, None, cd, cs, *op[5:])
            return op  # the copy this layout needs is missing: te's error names it
        else:
            raise TypeError(
                f"{name}: te_gemm takes Float8Tensor, Float8BlockwiseQTensor, MXFP8Tensor and "
                f"NVFP4Tensor operands, got {type(t).__name__}"
            )
        if rowwise:
            if rd is not None:
                return mode, rd, rs, None, None
        elif cd is not None:
            return mode, None, None, cd, cs
        # The copy this layout needs is missing: hand te what there is, so its error names it.
        return mode, rd, rs if rd is not None else None, cd, cs if cd is not None else None
    if not isinstance(t, _Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or a te quantized tensor, got {type(t).__name__}")
    if t.dtype not in TE_DTYPE:
        te_dtype(t.dtype, name)  # raises TypeError naming the argument
    if not t.is_contiguous():
        t = t.contiguous()
    return _PER_TENSOR, t, None, None, None


def _gemm(a, b, trans_a, trans_b, out_shape, out_dtype, out, accumulate, epilogue, bias, gelu_input, split):
    if out is not None:
        if out.dtype != out_dtype:
            raise ValueError(f"out: expected out_dtype {out_dtype}, got a {out.dtype} tensor")
        if not out.is_contiguous():
            raise ValueError(
                f"out: expected a contiguous tensor (te_gemm writes it densely), got strides "
                f"{tuple(out.stride())} for shape {tuple(out.shape)}"
            )
    elif accumulate:
        raise ValueError(
            "accumulate: True adds the product into out=, but out is None (pass the tensor to "
            "accumulate into, e.g. an fp32 main_grad)"
        )
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    if gelu_input is not None and not gelu_input.is_contiguous():
        gelu_input = gelu_input.contiguous()
    split = -1 if split is None else int(bool(split))
    if is_eager(a[1] if a[1] is not None else a[3]):
        return _kernels.gemm(
            a, b, trans_a, trans_b, out, out_shape, out_dtype, accumulate, epilogue, bias, gelu_input, split
        )
    if a[0] > _BLOCK_2D or b[0] > _BLOCK_2D:
        raise not_traceable("te_gemm")
    d, aux, bias_grad = torch.ops.te.gemm(
        *a[1:],
        a[0],
        *b[1:],
        b[0],
        trans_a,
        trans_b,
        out,
        out_dtype,
        accumulate,
        epilogue,
        bias,
        gelu_input,
        split,
    )
    # The op returns [M, N] (absent when written into out); give D and aux their [..., N] shape.
    return (
        out if out is not None else d.view(out_shape),
        aux.view(out_shape) if epilogue == _GELU_AUX else None,
        bias_grad if epilogue == _BGRAD else None,
    )


def _bad_shape(fn: str, name: str, shape, expected: str) -> ValueError:
    return ValueError(f"te_torch.functional.{fn}: {name}: expected {expected}, got shape {tuple(shape)}")


def _not_differentiable(fn: str) -> RuntimeError:
    return RuntimeError(
        f"te_torch.functional.{fn} is not differentiable, and an input requires grad: call it "
        "under torch.no_grad() or from an autograd.Function's forward/backward (as te's modules "
        "do), or detach the inputs"
    )
