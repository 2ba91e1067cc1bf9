"""The per-shard pieces dense, layernorm_dense and layernorm_mlp are made of: a quantized linear
layer's forward and backward, and the norm / activation forwards with their fused quantized
outputs.

Every function here runs on one shard (or the whole arrays without a mesh) and takes the mesh
axes it needs for its collectives (``LinearAxes``), so the ops' custom_vjp rules are these
pieces in sequence. Layouts: x [M, K] row-major, kernel [K, N] (TE Flax's), y [M, N].
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from te_core import _ops

from te_jax import _sharding
from te_jax._activation import act_bwd, act_fwd, dbias_quantize
from te_jax._gemm import gemm_gelu_fp8
from te_jax._norm import norm_bwd, norm_fwd
from te_jax._quantizer import Plan, Quantizer, bias_for, keep, mm, quantize_operand

Axes = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class LinearAxes:
    """The mesh axes splitting a linear layer's dims: rows (M, activations' batch), k (the
    reduction dim: row-parallel) and n (the output features: column-parallel)."""

    rows: Axes = ()
    k: Axes = ()
    n: Axes = ()


@dataclasses.dataclass(frozen=True)
class Roles:
    """The state names of a linear layer's three roles (DelayedScaling's variable prefixes)."""

    x: str = "x"
    kernel: str = "kernel"
    grad: str = "grad"


def _fused_ok(q: Quantizer | None, reduce_axes: Axes) -> bool:
    """Whether a te kernel may quantize its own output: per-tensor or block FP8 (te's fused
    kernels write no MXFP8/NVFP4), and a current-scaling tensor only when it is not split (its
    amax must cover the whole tensor)."""
    return q is not None and q.fusable and not (q.kind == "current" and reduce_axes)


def gelu_in_gemm(q: Quantizer | None, kind: int) -> bool:
    """Whether a GEMM writes gelu's quantized output itself (te_gemm's GELU_AUX / DGELU with an
    FP8 output, te/gemm.h): gelu into a delayed per-tensor output, whose scale is known before
    the GEMM runs (the GEMM's operands are then per-tensor FP8 too: one recipe)."""
    return q is not None and q.kind == "delayed" and kind == _ops.ACTIVATIONS["gelu"]


def _kernel_operand(plan: Plan, roles: Roles, axes: LinearAxes, kernel, scales, rng, train):
    wq, w_amax = quantize_operand(
        kernel,
        plan.w,
        rowwise=train,
        columnwise=True,
        reduce_axes=axes.k + axes.n,
        scale=scales.get(roles.kernel),
        rng=rng,
    )
    return wq, ({} if w_amax is None else {roles.kernel: w_amax})


def _residuals(xq, wq, train):
    return (keep(xq, rowwise=False), keep(wq, rowwise=True)) if train else None


def linear_fwd(
    plan: Plan, roles: Roles, axes: LinearAxes, xq, kernel, bias, scales, out_dtype, rng=None, train=True
):
    """y = x @ kernel (+ bias) from x's operand ``xq`` (quantize_operand's, both copies).

    Returns (y [M, N] in out_dtype, residuals (x's column-wise copy, the kernel's row-wise
    copy), {kernel role: amax} for delayed scaling). ``train`` False (an inference forward): the
    kernel gets only the copy fprop reads, the residuals hold no data.
    """
    wq, amaxes = _kernel_operand(plan, roles, axes, kernel, scales, rng, train)
    if axes.k:  # row-parallel: partial sums over the split K, the bias added once after them
        y = mm(xq, wq, trans_b=False, out_dtype=out_dtype, split=plan.split_fprop)
        y = _sharding.psum(y, axes.k)
        if bias is not None:
            y = y + bias.astype(out_dtype)
    else:
        y = mm(
            xq, wq, trans_b=False, out_dtype=out_dtype, bias=bias_for(bias, out_dtype), split=plan.split_fprop
        )
    return y, _residuals(xq, wq, train), amaxes


def linear_gelu_fwd(
    plan: Plan,
    roles: Roles,
    axes: LinearAxes,
    xq,
    kernel,
    bias,
    scales,
    act_role: str,
    act_axes: Axes,
    out_dtype,
    rng=None,
    train=True,
):
    """linear_fwd, then gelu quantized for the next GEMM as act_quantize's, in one te_gemm call
    (GELU_AUX with an FP8 output; needs gelu_in_gemm(plan.x, gelu) and no row-parallel split:
    gelu must see the whole sum).

    Returns (gelu's operand, pre [M, N] in out_dtype, residuals, {kernel role, ``act_role``:
    amax}, the latter max-reduced over ``act_axes``).
    """
    if axes.k:
        raise ValueError(f"axes.k: expected no row-parallel split before a fused gelu, got {axes.k}")
    wq, amaxes = _kernel_operand(plan, roles, axes, kernel, scales, rng, train)
    actq, pre, _ = gemm_gelu_fp8(
        xq,
        wq,
        plan.x.fp8_out(True, train),
        scales[act_role],
        bias=bias_for(bias, out_dtype),
        aux_dtype=out_dtype,
        use_split_accumulator=plan.split_fprop,
        trans_b=False,
    )
    amaxes[act_role] = _sharding.pmax(actq.amax, act_axes)
    return actq, pre, _residuals(xq, wq, train), amaxes


def quantize_grad(plan: Plan, roles: Roles, axes: LinearAxes, dy, has_bias: bool, scales, rng=None):
    """(dy's operand, dbias [N] float32 or None, {grad role: amax}) for the backward GEMMs."""
    q = plan.grad
    reduce_axes = axes.rows + axes.n
    dbias = None
    amaxes = {}
    if has_bias and _fused_ok(q, reduce_axes):
        dyq, dbias = dbias_quantize(dy, q.fp8_out(True, True), scale=scales.get(roles.grad))
        dbias = dbias.astype(jnp.float32)
        if q.kind == "delayed":
            amaxes[roles.grad] = _sharding.pmax(dyq.amax, reduce_axes)
    else:
        dyq, amax = quantize_operand(
            dy,
            q,
            rowwise=True,
            columnwise=True,
            reduce_axes=reduce_axes,
            scale=scales.get(roles.grad),
            rng=rng,
        )
        if amax is not None:
            amaxes[roles.grad] = amax
        if has_bias:
            dbias = jnp.sum(dy.astype(jnp.float32), axis=0)
    return dyq, dbias, amaxes


def _wgrad(plan: Plan, axes: LinearAxes, x_saved, dyq, k_dtype):
    dk = mm(x_saved, dyq, trans_a=True, trans_b=False, out_dtype=k_dtype, split=plan.split_wgrad)
    return _sharding.psum(dk, axes.rows)


def linear_bwd(plan: Plan, axes: LinearAxes, res, dyq, x_dtype, k_dtype):
    """(dx [M, K], dkernel [K, N]) from linear_fwd's residuals and dy's operand, with the
    partial sums reduced: dx over the split N (column-parallel), dkernel over the rows."""
    x_saved, w_saved = res
    dx = mm(dyq, w_saved, trans_b=True, out_dtype=x_dtype, split=plan.split_dgrad)
    dx = _sharding.psum(dx, axes.n)
    return dx, _wgrad(plan, axes, x_saved, dyq, k_dtype)


def linear_dgelu_bwd(
    plan: Plan,
    grad_role: str,
    axes: LinearAxes,
    res,
    dyq,
    pre,
    has_bias: bool,
    reduce_axes: Axes,
    scales,
    k_dtype,
):
    """linear_bwd, then act_grad_quantize's gelu backward of dx with pre, in one te_gemm call
    for dx (DGELU with an FP8 output; needs gelu_in_gemm(plan.grad, gelu) and no
    column-parallel split: the gelu backward must see the whole dx).

    Returns (d pre's operand, its dbias float32 or None, {``grad_role``: amax} max-reduced over
    ``reduce_axes``, dkernel).
    """
    if axes.n:
        raise ValueError(f"axes.n: expected no column-parallel split before a fused dgelu, got {axes.n}")
    x_saved, w_saved = res
    dq, _, dbias = gemm_gelu_fp8(
        dyq,
        w_saved,
        plan.grad.fp8_out(True, True),
        scales[grad_role],
        gelu_input=pre,
        bias_grad=has_bias,
        use_split_accumulator=plan.split_dgrad,
    )
    amaxes = {grad_role: _sharding.pmax(dq.amax, reduce_axes)}
    dbias = None if dbias is None else dbias.astype(jnp.float32)
    return dq, dbias, amaxes, _wgrad(plan, axes, x_saved, dyq, k_dtype)


def norm_quantize(
    x,
    gamma,
    beta,
    cfg,
    q: Quantizer | None,
    reduce_axes: Axes,
    scale=None,
    rng=None,
    hp_out=False,
    train=True,
):
    """LayerNorm/RMSNorm of x [M, H] with its output as the next GEMM's operand.

    Returns (operand, high-precision output or None, mu, rsigma, amax or None). te's fused
    norm + quantize kernel runs where it may (_fused_ok); otherwise the norm runs in high
    precision and quantize_operand follows. ``hp_out``: also return the high-precision output.
    ``train`` False: the operand without its column-wise (wgrad) copy.
    """
    if hp_out or not _fused_ok(q, reduce_axes):
        y, mu, rsigma = norm_fwd(x, gamma, beta, cfg)
        op, amax = quantize_operand(
            y, q, rowwise=True, columnwise=train, reduce_axes=reduce_axes, scale=scale, rng=rng
        )
        return op, (y if hp_out else None), mu, rsigma, amax
    yq, mu, rsigma = norm_fwd(x, gamma, beta, cfg, fp8=q.fp8_out(True, train), scale=scale)
    amax = _sharding.pmax(yq.amax, reduce_axes) if q.kind == "delayed" else None
    return yq, None, mu, rsigma, amax


def norm_backward(dz, x, mu, rsigma, gamma, cfg, row_axes: Axes):
    """(dx, dgamma, dbeta) with dgamma/dbeta summed over the rows' shards."""
    dx, dgamma, dbeta = norm_bwd(dz, x, mu, rsigma, gamma, cfg=cfg)
    return dx, _sharding.psum(dgamma, row_axes), _sharding.psum(dbeta, row_axes)


def act_quantize(pre, kind: int, q: Quantizer | None, reduce_axes: Axes, scale=None, rng=None, train=True):
    """(act(pre)'s operand for the next GEMM, amax or None): fused where te may (_fused_ok);
    ``train`` False: without its column-wise (wgrad) copy."""
    if not _fused_ok(q, reduce_axes):
        a = act_fwd(pre, kind)
        return quantize_operand(
            a, q, rowwise=True, columnwise=train, reduce_axes=reduce_axes, scale=scale, rng=rng
        )
    aq = act_fwd(pre, kind, fp8=q.fp8_out(True, train), scale=scale)
    return aq, (_sharding.pmax(aq.amax, reduce_axes) if q.kind == "delayed" else None)


def act_grad_quantize(
    plan: Plan, roles: Roles, grad, pre, kind: int, has_bias: bool, reduce_axes: Axes, scales, rng=None
):
    """(d pre's operand, dbias float32 or None, {grad role: amax}): the activation's backward
    with its output quantized for the GEMMs before it (fused where te may)."""
    q = plan.grad
    amaxes = {}
    if _fused_ok(q, reduce_axes):
        dq, dbias = act_bwd(
            grad, pre, kind, fp8=q.fp8_out(True, True), dbias=has_bias, scale=scales.get(roles.grad)
        )
        if q.kind == "delayed":
            amaxes[roles.grad] = _sharding.pmax(dq.amax, reduce_axes)
        return dq, (None if dbias is None else dbias.astype(jnp.float32)), amaxes
    d, _ = act_bwd(grad, pre, kind)
    dq, amax = quantize_operand(
        d, q, rowwise=True, columnwise=True, reduce_axes=reduce_axes, scale=scales.get(roles.grad), rng=rng
    )
    if amax is not None:
        amaxes[roles.grad] = amax
    return dq, (jnp.sum(d.astype(jnp.float32), axis=0) if has_bias else None), amaxes
