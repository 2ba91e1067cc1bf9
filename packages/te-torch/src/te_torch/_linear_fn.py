"""The quantized Linear as an autograd Function, and the per-module objects it reuses.

Forward (one quantization per operand, no re-quantization in backward):

    xq = quantize(x)   row-wise for fprop + column-wise (wgrad), in the same pass
    wq = quantize(w)   row-wise for fprop + column-wise (dgrad); or the cached copy
    y  = gemm(xq, wq) (+ bias)                       split accumulator: recipe.fp8_gemm_fprop

Backward:

    gq = quantize(dy)  row-wise (dgrad) + column-wise (wgrad), backward format (HYBRID: E5M2)
    dx = gemm_dgrad(gq, wq)                          split accumulator: recipe.fp8_gemm_dgrad
    dw = gemm_wgrad(gq, xq)  (or += into weight.main_grad, returning None)      ... _wgrad
    db = dy summed over the leading dims in high precision (as TE: from the unquantized dy)

Each copy is produced only when a gradient needs it (``needs_input_grad``).
"""

from __future__ import annotations

import torch
from te_core.recipe import Format

from te_torch import _autocast
from te_torch._quantizers import Float8BlockQuantizer, Float8CurrentScalingQuantizer, Float8Quantizer
from te_torch._recipe_state import DelayedState, recipe_key
from te_torch.functional import gemm, gemm_dgrad, gemm_wgrad

_E4M3, _E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
_FWD_ROLES, _BWD_ROLES = 3, 2  # input, weight, output / grad_output, grad_input


def _dtypes(fmt: Format) -> tuple[torch.dtype, torch.dtype]:
    return _E4M3, (_E5M2 if fmt == Format.HYBRID else _E4M3)


def _variants(q) -> tuple:
    """``q`` in the four (rowwise, columnwise) usages, indexed ``2 * row + col`` (0 unused)."""
    out = [None]
    for row, col in ((False, True), (True, False), (True, True)):
        v = q.copy()
        v.set_usage(rowwise=row, columnwise=col)
        out.append(v)
    return tuple(out)


class FP8Context:
    """What a module's quantized call reuses for one recipe: quantizers (built once), the GEMMs'
    split-accumulator flags, the delayed-scaling states and their update keys, and the cached
    quantized weight (``is_first_microbatch``)."""

    __slots__ = (
        "recipe",
        "delayed",
        "x_q",
        "w_q",
        "g_q",
        "split",
        "fwd",
        "bwd",
        "fwd_key",
        "bwd_key",
        "weight_cache",
        "device",
    )

    def __init__(
        self, recipe, device: torch.device, fwd: DelayedState | None, bwd: DelayedState | None, group
    ) -> None:
        self.recipe, self.device, self.fwd, self.bwd = recipe, device, fwd, bwd
        self.delayed = recipe.delayed()
        self.weight_cache = None
        self.fwd_key = self.bwd_key = None
        if self.delayed:
            fdt, bdt = _dtypes(recipe.fp8_format)
            x = Float8Quantizer(fwd.scale_of(0), fwd.amax(0), fdt)
            w = Float8Quantizer(fwd.scale_of(1), fwd.amax(1), fdt)
            g = Float8Quantizer(bwd.scale_of(0), bwd.amax(0), bdt)
            self.fwd_key = recipe_key(recipe, False, group)
            self.bwd_key = recipe_key(recipe, True, group)
            self.split = (False, True, True)
        elif recipe.float8_current_scaling():
            fdt, bdt = _dtypes(recipe.fp8_format)

            def cs(dtype, qp):
                return Float8CurrentScalingQuantizer(
                    dtype, device, force_pow_2_scales=qp.power_2_scale, amax_epsilon=qp.amax_epsilon
                )

            x, w = cs(fdt, recipe.fp8_quant_fwd_inp), cs(fdt, recipe.fp8_quant_fwd_weight)
            g = cs(bdt, recipe.fp8_quant_bwd_grad)
            self.split = _splits(recipe)
        elif recipe.float8_block_scaling():

            def bq(dim, qp):
                return Float8BlockQuantizer(
                    _E4M3,
                    block_scaling_dim=dim,
                    force_pow_2_scales=qp.power_2_scale,
                    amax_epsilon=qp.amax_epsilon,
                )

            x = bq(recipe.x_block_scaling_dim, recipe.fp8_quant_fwd_inp)
            w = bq(recipe.w_block_scaling_dim, recipe.fp8_quant_fwd_weight)
            g = bq(recipe.grad_block_scaling_dim, recipe.fp8_quant_bwd_grad)
            self.split = _splits(recipe)
        else:
            raise NotImplementedError(
                f"te.Linear: {type(recipe).__name__} is not supported yet: te-core has no "
                "MXFP8 / NVFP4 quantization (or custom quantizer factories) yet. Use "
                "DelayedScaling, Float8CurrentScaling or Float8BlockScaling"
            )
        self.x_q, self.w_q, self.g_q = _variants(x), _variants(w), _variants(g)


def _splits(recipe) -> tuple[bool, bool, bool]:
    return (
        recipe.fp8_gemm_fprop.use_split_accumulator,
        recipe.fp8_gemm_dgrad.use_split_accumulator,
        recipe.fp8_gemm_wgrad.use_split_accumulator,
    )


class LinearFn(torch.autograd.Function):
    """y = x w^T + b with quantized GEMMs; see the module docstring."""

    @staticmethod
    def forward(ctx, inp, weight, bias, c: FP8Context, first, fuse_wgrad: bool):
        need_dx, need_dw = inp.requires_grad, weight.requires_grad
        xq = c.x_q[2 + need_dw](inp)
        if first is None:
            wq = c.w_q[2 + need_dx](weight)
        elif first or c.weight_cache is None:
            wq = c.weight_cache = c.w_q[3](weight)
        else:
            wq = c.weight_cache
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
            gq = c.g_q[2 * need_dx + need_dw](dy)
            if c.delayed:
                _autocast.register_backward(c.bwd_key, c.recipe, c.bwd)
            if need_dx:
                dx = gemm_dgrad(gq, wq, out_dtype=dy.dtype, use_split_accumulator=c.split[1])
            if need_dw:
                if ctx.fuse:
                    w = ctx.weight
                    gemm_wgrad(
                        gq,
                        xq,
                        out=w.main_grad,
                        accumulate=not getattr(w, "overwrite_main_grad", False),
                        use_split_accumulator=c.split[2],
                    )
                    if hasattr(w, "grad_added_to_main_grad"):
                        w.grad_added_to_main_grad = True
                else:
                    dw = gemm_wgrad(gq, xq, out_dtype=ctx.w_dtype, use_split_accumulator=c.split[2])
        if need_db:
            db = dy.reshape(-1, dy.shape[-1]).sum(0).to(ctx.b_dtype)
        return dx, dw, db, None, None, None
