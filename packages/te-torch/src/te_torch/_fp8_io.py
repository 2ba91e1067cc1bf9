"""Quantized tensors across module boundaries: ``fp8_output``, ``fp8_grad``, and quantized inputs
and gradients consumed as they are (TE's semantics; docs/linear.rst "FP8 outputs and gradients").

- ``fp8_output=True`` (inside ``te.autocast``): the GEMM's result is returned as the quantized
  tensor of the recipe's forward format (Float8Tensor for the per-tensor recipes,
  Float8BlockwiseQTensor for block scaling, MXFP8Tensor / NVFP4Tensor for MXFP8BlockScaling /
  NVFP4BlockScaling), made by the output quantizer of the GEMM's FP8Context.
  ``fp8_grad=True``: the input gradient is returned quantized in the backward format by the
  grad-input quantizer. Outside autocast both flags are ignored, as in TE (its
  ``_get_quantizers`` hands out no quantizers when FP8 is off).
- A quantized tensor arriving as a module's input (or as the gradient of its output) is read by
  the GEMMs as it is, bytes and scales, when the recipe's GEMM can multiply its format
  (quantized_operand); it is never quantized again.

This module is off the default path: a module reaches it only when a flag is set or a quantized
tensor arrives.
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch import _kernels
from te_torch._blockwise_tensor import Float8BlockwiseQTensor
from te_torch._float8_tensor import Float8Tensor, _transpose
from te_torch._gemm_state import FP8Context
from te_torch._mx_tensor import MXFP8Tensor, NVFP4Tensor
from te_torch._quantized_tensor import QuantizedTensor, is_eager
from te_torch._quantizers import Quantizer
from te_torch.functional import _gemm

_PER_TENSOR = int(_C.ScalingMode.PER_TENSOR)
_PART_RS = int(_C.Part.ROWWISE_SCALE_INV)
_PART_CS = int(_C.Part.COLUMNWISE_SCALE_INV)
_DEFAULT, _BIAS = int(_C.Epilogue.DEFAULT), int(_C.Epilogue.BIAS)


def check_flags(owner: str, fp8_output, fp8_grad) -> None:
    """fp8_output / fp8_grad must be bools (None counts as False, TE's Optional[bool])."""
    for name, v in (("fp8_output", fp8_output), ("fp8_grad", fp8_grad)):
        if v is not None and not isinstance(v, bool):
            raise TypeError(f"{owner}: {name}: expected a bool, got {v!r} ({type(v).__name__})")


def io_quantizers(c: FP8Context, fp8_output, fp8_grad) -> tuple[Quantizer | None, Quantizer | None]:
    """(output quantizer or None, grad-input quantizer or None) for a call with these flags. As in
    TE, the grad-input quantizer exists only with grad enabled (no backward will use it else)."""
    grad = torch.is_grad_enabled()
    return (
        c.output_quantizer(grad) if fp8_output else None,
        c.grad_input_quantizer() if fp8_grad and grad else None,
    )


def gemm_quantized(
    c: FP8Context,
    q: Quantizer,
    a: tuple,
    b: tuple,
    trans_a: bool,
    trans_b: bool,
    out_shape: tuple[int, ...],
    dtype: torch.dtype,
    bias: torch.Tensor | None,
    split: int,
) -> QuantizedTensor:
    """``op(a) op(b) (+ bias)`` of te_gemm operand tuples, returned as ``q``'s quantized tensor of
    the logical ``out_shape`` and nominal high-precision ``dtype``.

    Every recipe quantizes the fp32 result (one rounding, to FP8):
    - DelayedScaling (eager): te_gemm writes the FP8 D itself, with the scale of ``q``'s slot
      (te/gemm.h's per-tensor FP8 output: no high-precision D in memory), and max-accumulates
      the result's amax into the slot, as te's delayed quantizers do (so a module used twice in
      a step records the larger amax).
    - Current scaling: the scale comes from the result's own amax, unknown until the product is
      complete, and block scaling / MXFP8: te_gemm writes no block-scaled D. Both run the GEMM to fp32
      and quantize that (TE quantizes its activation-dtype result here; fp32 avoids a second
      rounding, so every recipe's FP8 value is the rounding of the same fp32 result).
    - Traced (torch.compile), where te's registered gemm op has no FP8 D: as current scaling.
    """
    if c.delayed and is_eager(a[1] if a[1] is not None else a[3]):
        if bias is not None and bias.dtype == torch.float16:
            bias = bias.float()  # te_gemm's FP8 D takes a bf16 or fp32 bias; fp32 holds fp16 exactly
        data, scale_inv = _kernels.gemm_fp8_output(
            a, b, trans_a, trans_b, out_shape, q.dtype, _DEFAULT if bias is None else _BIAS,
            bias, split, q.scale, q.amax,
        )  # fmt: skip
        return q._wrap(data, scale_inv, None, None, torch.Size(out_shape), dtype)
    if bias is not None and bias.dtype != torch.float32:
        bias = bias.float()  # te_gemm: the output's dtype or fp32
    out = _gemm(
        a, b, trans_a, trans_b, out_shape, torch.float32, None, False,
        _DEFAULT if bias is None else _BIAS, bias, None, split,
    )[0]  # fmt: skip
    return q.quantize(out, dtype=dtype)


def _needed(mode: int, rd, rs, cd, cs, need_row: bool, need_col: bool) -> tuple:
    """te_gemm's operand tuple with only the needed copies (the others None)."""
    return (
        mode,
        rd if need_row else None,
        rs if need_row else None,
        cd if need_col else None,
        cs if need_col else None,
    )


def quantized_operand(
    t: QuantizedTensor, c: FP8Context, block_dim: int, need_row: bool, need_col: bool, role=None
) -> tuple[tuple | None, str]:
    """(operand, "") with ``t``'s copies as te_gemm's operand tuple (scaling_mode, rowwise_data,
    rowwise_scale_inv, columnwise_data, columnwise_scale_inv), the ones not needed None; or
    (None, why) when the recipe's GEMMs cannot read ``t`` as it is.

    ``block_dim``: the block scaling dim the recipe uses for this role (x or grad); ``role``: the
    role's quantizer, whose FP8 dtype an MXFP8Tensor must have (MXFP8BlockScaling) and whose
    Hadamard transform an NVFP4Tensor's column-wise copy must match when the wgrad reads it
    (te_gemm takes the transform on both wgrad operands or on neither). A missing copy
    that needed is made without quantizing: per-tensor FP8 and 128x128 tiles by an exact
    transpose (data and tile scales); a 1x128 or MXFP8 copy cannot be made from the other one.
    ``t`` is not changed."""
    r = c.recipe
    if isinstance(t, Float8Tensor):
        if not (r.delayed() or r.float8_current_scaling()):
            return None, f"a Float8Tensor (per-tensor FP8), which {type(r).__name__} GEMMs do not take"
        rd, cd, s = t._data, t._transpose, t._scale_inv
        if need_row and rd is None:
            rd = _transpose(cd).view(t.shape)
        if need_col and cd is None:
            cd = _transpose(rd)
        return _needed(_PER_TENSOR, rd, s, cd, s, need_row, need_col), ""
    if isinstance(t, Float8BlockwiseQTensor):
        dim = 2 if t._is_2D_scaled else 1
        if not r.float8_block_scaling() or dim != block_dim:
            return None, (
                f"a Float8BlockwiseQTensor with {'128x128' if dim == 2 else '1x128'} blocks, which "
                f"{type(r).__name__}"
                + (f" (block_scaling_dim={block_dim} for this tensor)" if r.float8_block_scaling() else "")
                + " GEMMs do not take"
            )
        rd, rs, cd, cs = t._parts()
        for want, have, which in ((need_row, rd, "row-wise"), (need_col, cd, "column-wise")):
            if want and have is None and dim == 1:
                return None, (
                    f"a 1x128-block Float8BlockwiseQTensor without its {which} copy, which cannot "
                    "be made from the other copy (each has its own blocks)"
                )
        if need_row and rd is None:
            rd, rs = t._transposed_2d(cd, cs, _PART_RS)
            rd = rd.view(t.shape)
        if need_col and cd is None:
            cd, cs = t._transposed_2d(rd, rs, _PART_CS)
        return _needed(t._mode, rd, rs, cd, cs, need_row, need_col), ""
    if isinstance(t, MXFP8Tensor):
        if not r.mxfp8():
            return None, f"an MXFP8Tensor, which {type(r).__name__} GEMMs do not take"
        if role is not None and t._fp8_dtype != role.dtype:
            return None, (
                f"an MXFP8Tensor of {t._fp8_dtype}, while {type(r).__name__}"
                f"(fp8_format={r.fp8_format.name}) quantizes this tensor to {role.dtype}"
            )
        return _own_block_copies(t, need_row, need_col)
    if isinstance(t, NVFP4Tensor):
        if not r.nvfp4():
            return None, f"an NVFP4Tensor, which {type(r).__name__} GEMMs do not take"
        if need_col and role is not None and t._columnwise_rht != role.with_rht:
            return None, (
                f"an NVFP4Tensor whose column-wise copy {'has' if t._columnwise_rht else 'lacks'} "
                f"the random Hadamard transform, while {type(r).__name__} quantizes this tensor "
                f"{'with' if role.with_rht else 'without'} it (the wgrad GEMM needs it on both "
                "operands or on neither)"
            )
        op, why = _own_block_copies(t, need_row, need_col)
        return (None, why) if op is None else ((*op, t._amax, t._columnwise_rht), "")
    return None, f"a {type(t).__name__}, which te's GEMMs do not take"


def _own_block_copies(t, need_row: bool, need_col: bool) -> tuple[tuple | None, str]:
    """An MXFP8 / NVFP4 tensor's needed copies as (mode, rd, rs, cd, cs), or (None, why) when one
    is missing: each copy has its own blocks, so neither can be made from the other."""
    rd, rs, cd, cs = t._parts()
    for want, have, which in ((need_row, rd, "row-wise"), (need_col, cd, "column-wise")):
        if want and have is None:
            return None, (
                f"an {type(t).__name__} without its {which} copy, which cannot be made from the "
                "other copy (each has its own blocks)"
            )
    return _needed(t._mode, rd, rs, cd, cs, need_row, need_col), ""


def input_operand(inp: QuantizedTensor, c: FP8Context, need_col: bool) -> tuple:
    """A quantized module input as the fprop operand (row-wise) and, with ``need_col``, the wgrad
    one (column-wise): used as given, or te's error saying what to do."""
    r = c.recipe
    block_dim = r.x_block_scaling_dim if r.float8_block_scaling() else 0
    op, why = quantized_operand(inp, c, block_dim, True, need_col, c.x_q[3])
    if op is None:
        raise ValueError(
            f"{c.owner}: inp: got {why}. A quantized input is used as it is (not quantized again), "
            "so it must be in the format of the autocast recipe's inputs: produce it under the same "
            "recipe (e.g. the previous layer's fp8_output=True), quantize it with "
            "columnwise_usage=True when the weight needs a gradient, or pass inp.dequantize()"
        )
    return op


def grad_tensor(dy: QuantizedTensor, c: FP8Context, need_row: bool, need_col: bool) -> QuantizedTensor | None:
    """grad_operand as a quantized tensor sharing dy's buffers (plus any copy made for it), for
    code that passes tensors to te_torch.functional; None when it cannot be read as it is."""
    op = grad_operand(dy, c, need_row, need_col)
    if op is None:
        return None
    _, rd, rs, cd, cs = op
    if isinstance(dy, Float8Tensor):
        return dy._like(rd, cd, dy._scale_inv)
    return dy._like(rd, rs, cd, cs)


def grad_operand(dy: QuantizedTensor, c: FP8Context, need_row: bool, need_col: bool) -> tuple | None:
    """A quantized output gradient (the next layer's fp8_grad) as the dgrad (row-wise) / wgrad
    (column-wise) operand, used as it is; None when the recipe's GEMMs cannot read it (it was
    made under another recipe): the caller dequantizes it and quantizes it like any gradient."""
    r = c.recipe
    block_dim = r.grad_block_scaling_dim if r.float8_block_scaling() else 0
    return quantized_operand(dy, c, block_dim, need_row, need_col, c.g_q[3])[0]
