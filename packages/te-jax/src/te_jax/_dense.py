"""dense: x @ kernel (+ bias) as a jax.custom_vjp over te_jax.gemm, in high precision or FP8.

Layout. TE Flax's DenseGeneral kernel is [in, out] = [K, N] and y = x @ kernel. te_gemm is
row-major with op(B) [K, N] (te_jax/_gemm.py), so the kernel is B stored [K, N]:
    fprop  y  [M, N] = gemm(x, kernel, trans_b=False)              reads kernel's column-wise copy
    dgrad  dx [M, K] = gemm(dy, kernel, trans_b=True)              reads kernel's row-wise copy
    wgrad  dk [K, N] = gemm(x, dy, trans_a=True, trans_b=False)    reads x's and dy's column-wise
te's FP8 GEMM reads both operands with the reduction dim contiguous, so the forward quantizes x
(row-wise for fprop, column-wise for wgrad) and the kernel (both copies) once, and keeps for the
backward only the copies it reads there: x's column-wise copy and the kernel's row-wise one. The
backward quantizes dy once (both copies; fused with the bias gradient's column sums when there is
a bias, te_dbias_quantize) and never re-quantizes x.

Formats (NUMERICS.md): x and kernel in the recipe's forward format (E4M3), dy in its backward
format (E5M2 under Format.HYBRID); split accumulation per the recipe's fp8_gemm_fprop / _dgrad /
_wgrad (off / on / on for Float8CurrentScaling). Float8BlockScaling uses its x / w / grad block
dims (1: 1x128, 2: 128x128). DelayedScaling needs per-role state and comes with the next slice.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from te_core import recipe as _recipe

from te_jax import _dtypes
from te_jax._activation import dbias_quantize
from te_jax._fused import Fp8Out
from te_jax._gemm import gemm
from te_jax._quantize import quantize

_BLOCK_MODE = {1: "block_1d", 2: "block_2d"}


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Static: how each operand is quantized (None: high precision) and the GEMMs' options."""

    x: Fp8Out | None = None
    w: Fp8Out | None = None
    grad: Fp8Out | None = None
    split_fprop: bool | None = None
    split_dgrad: bool | None = None
    split_wgrad: bool | None = None


def _plan(recipe, recipe_state) -> _Plan:
    if recipe is None:
        if recipe_state is not None:
            raise ValueError("recipe_state: expected None without a recipe (high precision keeps no state)")
        return _Plan()
    if isinstance(recipe, _recipe.DelayedScaling):
        raise NotImplementedError(
            "recipe: DelayedScaling is not supported by te_jax.dense yet (its per-role scale and "
            "amax_history state arrives with the next slice); use Float8CurrentScaling or "
            "Float8BlockScaling"
        )
    if recipe_state is not None:
        raise ValueError(
            f"recipe_state: expected None with {type(recipe).__name__} (only DelayedScaling "
            "keeps scaling state)"
        )
    if isinstance(recipe, _recipe.Float8BlockScaling):
        fwd, bwd = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e4m3fn)
        modes = [
            _BLOCK_MODE[d]
            for d in (recipe.x_block_scaling_dim, recipe.w_block_scaling_dim, recipe.grad_block_scaling_dim)
        ]
    elif isinstance(recipe, _recipe.Float8CurrentScaling):
        fwd = np.dtype(jnp.float8_e4m3fn)
        hybrid = recipe.fp8_format == _recipe.Format.HYBRID
        bwd = np.dtype(jnp.float8_e5m2 if hybrid else jnp.float8_e4m3fn)
        modes = ["per_tensor"] * 3
    elif isinstance(recipe, _recipe.Recipe):
        raise NotImplementedError(
            f"recipe: {type(recipe).__name__} is not supported by te_jax.dense yet; use "
            "Float8CurrentScaling or Float8BlockScaling"
        )
    else:
        raise TypeError(
            f"recipe: expected None or a te_jax.recipe recipe (Float8CurrentScaling, "
            f"Float8BlockScaling), got {type(recipe).__name__}"
        )

    def role(dtype, mode, q):
        return Fp8Out(dtype, mode, True, True, bool(q.power_2_scale), float(q.amax_epsilon))

    return _Plan(
        x=role(fwd, modes[0], recipe.fp8_quant_fwd_inp),
        w=role(fwd, modes[1], recipe.fp8_quant_fwd_weight),
        grad=role(bwd, modes[2], recipe.fp8_quant_bwd_grad),
        split_fprop=bool(recipe.fp8_gemm_fprop.use_split_accumulator),
        split_dgrad=bool(recipe.fp8_gemm_dgrad.use_split_accumulator),
        split_wgrad=bool(recipe.fp8_gemm_wgrad.use_split_accumulator),
    )


def _array(value, name):
    if not isinstance(value, jax.Array):
        try:
            value = jnp.asarray(value)
        except TypeError:
            raise TypeError(f"{name}: expected a jax array, got {type(value).__name__}") from None
    _dtypes.as_dtype(value.dtype, f"{name}.dtype", _dtypes.SOURCE)
    return value


def dense(x, kernel, bias=None, *, recipe=None, recipe_state=None):
    """``x @ kernel (+ bias)`` through te's GEMM: x [..., K], kernel [K, N] (TE Flax's
    DenseGeneral layout), bias [N]; returns [..., N] in x's dtype.

    Args:
      recipe: None (high precision: x and kernel of one dtype, float32/bfloat16/float16), or
        te_jax.recipe.Float8CurrentScaling / Float8BlockScaling: x and kernel are quantized in
        the forward, dy in the backward (see the module notes for formats and layouts).
        DelayedScaling raises NotImplementedError (next slice); so do MXFP8/NVFP4.
      recipe_state: reserved for DelayedScaling's state; must be None.

    Differentiable in x, kernel and bias (jax.grad; te's GEMMs in the backward), and jit-able.
    """
    plan = _plan(recipe, recipe_state)
    x = _array(x, "x")
    kernel = _array(kernel, "kernel")
    if kernel.ndim != 2:
        raise ValueError(f"kernel: expected shape [K, N] (in, out), got {tuple(kernel.shape)}")
    k, n = kernel.shape
    if x.ndim < 1 or x.shape[-1] != k:
        raise ValueError(f"x: expected shape [..., {k}] (kernel's in dim K = {k}), got {tuple(x.shape)}")
    if plan.x is None and x.dtype != kernel.dtype:
        raise TypeError(
            f"kernel.dtype: expected x's dtype {np.dtype(x.dtype).name} (a high-precision GEMM "
            f"reads one dtype), got {np.dtype(kernel.dtype).name}"
        )
    if bias is not None:
        bias = _array(bias, "bias")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias: expected shape ({n},) (kernel's out dim), got {tuple(bias.shape)}")
    lead = x.shape[:-1]
    y = _dense(plan, jnp.reshape(x, (-1, k)), kernel, bias)
    return jnp.reshape(y, tuple(lead) + (n,))


def _bias_for(bias, dtype):
    # te_gemm's bias epilogue takes the output's dtype or float32.
    if bias is None or bias.dtype in (np.dtype(dtype), np.dtype(jnp.float32)):
        return bias
    return bias.astype(dtype)


def _forward(plan: _Plan, x, kernel, bias):
    if plan.x is None:
        y = gemm(x, kernel, bias=_bias_for(bias, x.dtype), trans_b=False)
        return y, (x, kernel)
    xq = quantize(
        x,
        dtype=plan.x.dtype,
        scaling_mode=plan.x.scaling_mode,
        rowwise=True,
        columnwise=True,
        force_pow2_scales=plan.x.force_pow2_scales,
        amax_epsilon=plan.x.amax_epsilon,
    )
    wq = quantize(
        kernel,
        dtype=plan.w.dtype,
        scaling_mode=plan.w.scaling_mode,
        rowwise=True,
        columnwise=True,
        force_pow2_scales=plan.w.force_pow2_scales,
        amax_epsilon=plan.w.amax_epsilon,
    )
    y = gemm(
        xq,
        wq,
        bias=_bias_for(bias, x.dtype),
        trans_b=False,
        out_dtype=x.dtype,
        use_split_accumulator=plan.split_fprop,
    )
    # Keep only what the backward reads: x's column-wise copy (wgrad), kernel's row-wise (dgrad).
    x_saved = dataclasses.replace(xq, data=None, scale_inv=None)
    w_saved = dataclasses.replace(wq, columnwise_data=None, columnwise_scale_inv=None)
    return y, (x_saved, w_saved)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _dense(plan, x, kernel, bias):
    return _forward(plan, x, kernel, bias)[0]


def _dense_fwd(plan, x, kernel, bias):
    y, saved = _forward(plan, x, kernel, bias)
    # Zero-size tags carry the cotangents' dtypes (residuals must be JAX values).
    return y, (
        saved,
        jnp.zeros((0,), x.dtype),
        jnp.zeros((0,), kernel.dtype),
        None if bias is None else jnp.zeros((0,), bias.dtype),
    )


def _dense_bwd(plan, res, dy):
    (x_saved, w_saved), x_tag, k_tag, b_tag = res
    x_dtype, k_dtype = x_tag.dtype, k_tag.dtype
    has_bias = b_tag is not None
    dy = dy.astype(x_dtype)
    dbias = None
    if plan.grad is None:
        x, kernel = x_saved, w_saved
        dx = gemm(dy, kernel, trans_b=True)
        dk = gemm(x, dy, trans_a=True, trans_b=False)
        if has_bias:
            dbias = jnp.sum(dy.astype(jnp.float32), axis=0)
    else:
        if has_bias:
            dyq, dbias = dbias_quantize(dy, plan.grad)
        else:
            g = plan.grad
            dyq = quantize(
                dy,
                dtype=g.dtype,
                scaling_mode=g.scaling_mode,
                rowwise=True,
                columnwise=True,
                force_pow2_scales=g.force_pow2_scales,
                amax_epsilon=g.amax_epsilon,
            )
        dx = gemm(dyq, w_saved, trans_b=True, out_dtype=x_dtype, use_split_accumulator=plan.split_dgrad)
        dk = gemm(
            x_saved,
            dyq,
            trans_a=True,
            trans_b=False,
            out_dtype=k_dtype,
            use_split_accumulator=plan.split_wgrad,
        )
    return dx, dk.astype(k_dtype), None if dbias is None else dbias.astype(b_tag.dtype)


_dense.defvjp(_dense_fwd, _dense_bwd)
