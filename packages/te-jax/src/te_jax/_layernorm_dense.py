"""layernorm_dense: LayerNorm/RMSNorm then dense, one jax.custom_vjp; te's norm kernel writes the
GEMM's quantized input itself (row-wise and column-wise copies) where the recipe allows.

Forward: (ln_out quantized, mu, rsigma) = norm(x); y = ln_out @ kernel (+ bias). Kept for the
backward: x, mu, rsigma, gamma, ln_out's column-wise copy and the kernel's row-wise copy.
Backward: dy quantized (dbias fused), d ln_out = dy @ kernel^T, dkernel = ln_out^T @ dy, then te's
norm backward gives dx, dgamma, dbeta. The norm's role in DelayedScaling state is "x" (the
GEMM's input), as in dense.

Sharding: x's rows may be split (data parallel); the normalized dim H is never split (the norm
reduces over it), so the kernel [H, N] may be split on N only (column-parallel). dgamma, dbeta
and dkernel are psum-reduced over the rows, d ln_out over N.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from te_jax import _delayed, _op_common, _sharding, _token_pad
from te_jax._dense import check_dense_blocks, dense_axes, roles_of
from te_jax._linear import (
    LinearAxes,
    Roles,
    linear_bwd,
    linear_fwd,
    norm_backward,
    norm_quantize,
    quantize_grad,
)
from te_jax._norm import _check as _check_norm
from te_jax._norm import _Config as NormConfig
from te_jax._quantizer import Plan, plan_for
from te_jax._sharding import Layout

_ROLES = Roles()


@dataclasses.dataclass(frozen=True)
class _Static:
    plan: Plan
    norm: NormConfig
    layout: Layout
    axes: LinearAxes
    x_spec: P | None
    h_spec: P | None
    k_spec: P | None
    b_spec: P | None
    y_spec: P | None
    h: int
    n_local: int
    x_dtype: np.dtype
    k_dtype: np.dtype
    g_dtype: np.dtype
    beta_dtype: np.dtype | None
    b_dtype: np.dtype | None
    return_ln: bool
    # False: the primal (no jax.grad), an inference forward: no column-wise copies, no padding
    # under per-tensor scaling (_token_pad)
    train: bool = True


def layernorm_dense(
    x,
    gamma,
    beta,
    kernel,
    bias=None,
    *,
    layernorm_type: str = "layernorm",
    epsilon: float = 1e-6,
    zero_centered_gamma: bool = False,
    return_layernorm_output: bool = False,
    recipe=None,
    recipe_state: dict | None = None,
    input_spec: P | None = None,
    kernel_spec: P | None = None,
    rng=None,
):
    """``norm(x) @ kernel (+ bias)``: x [..., H], gamma [H], beta [H] (None for rmsnorm),
    kernel [H, N], bias [N]; returns (y [..., N] in x's dtype, ln_out or None).

    ``ln_out`` (x's shape and dtype, the norm's high-precision output) is returned, and
    differentiable, with ``return_layernorm_output``. Norm arguments as in te_jax.layernorm;
    recipe, recipe_state (roles "x", "kernel", "grad"), specs and rng as in te_jax.dense, except
    that H may not be split (kernel_spec may split N only).
    """
    plan = plan_for(recipe)
    cfg, x, gamma, beta = _check_norm(x, gamma, beta, epsilon, zero_centered_gamma, layernorm_type)
    if not isinstance(return_layernorm_output, bool):
        raise TypeError(f"return_layernorm_output: expected True or False, got {return_layernorm_output!r}")
    kernel = _op_common.array(kernel, "kernel")
    h = x.shape[-1]
    if kernel.ndim != 2 or kernel.shape[0] != h:
        raise ValueError(
            f"kernel: expected shape [{h}, N] (x's last dim H = {h}, out), got {tuple(kernel.shape)}"
        )
    n = kernel.shape[1]
    if not plan.quantized and x.dtype != kernel.dtype:
        raise TypeError(
            f"kernel.dtype: expected x's dtype {np.dtype(x.dtype).name} (a high-precision GEMM "
            f"reads one dtype), got {np.dtype(kernel.dtype).name}"
        )
    if bias is not None:
        bias = _op_common.array(bias, "bias")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias: expected shape ({n},) (kernel's out dim), got {tuple(bias.shape)}")
    roles = roles_of(plan)
    state = _op_common.check_state(plan, recipe_state, roles)
    rng = _op_common.check_rng(plan, rng)
    if x.ndim < 2:
        raise ValueError(f"x: expected shape [..., {h}] with at least one leading dim, got {tuple(x.shape)}")

    if input_spec is None:
        input_spec = _sharding.default_input_spec(x.ndim)
    lay = _sharding.layout([(x.shape, input_spec, "input_spec"), (kernel.shape, kernel_spec, "kernel_spec")])
    xs, ks = lay.specs
    if xs[-1] is not None:
        raise ValueError(
            f"input_spec: the normalized dim H may not be split (the norm reduces over it), got {P(*xs)}"
        )
    axes = dense_axes(lay, x.ndim)
    check_dense_blocks(plan, lay, x.shape, kernel.shape)
    st = _Static(
        plan=plan,
        norm=cfg,
        layout=lay,
        axes=axes,
        x_spec=P(*xs),
        h_spec=P(None),
        k_spec=P(*ks),
        b_spec=P(ks[1]),
        y_spec=P(*xs[:-1], ks[1]),
        h=h,
        n_local=n // lay.size(axes.n),
        x_dtype=np.dtype(x.dtype),
        k_dtype=np.dtype(kernel.dtype),
        g_dtype=np.dtype(gamma.dtype),
        beta_dtype=_op_common.dtype_of(beta),
        b_dtype=_op_common.dtype_of(bias),
        return_ln=return_layernorm_output,
    )
    return _layernorm_dense(st, x, gamma, beta, kernel, bias, state, rng)


def _fwd_local(st: _Static, x, gamma, beta, kernel, bias, scales, rng):
    plan, axes = st.plan, st.axes
    lead = x.shape[:-1]
    x2, m = _token_pad.pad_copies(plan, jnp.reshape(x, (-1, st.h)), st.train)
    lnq, ln_out, mu, rsigma, x_amax = norm_quantize(
        x2,
        gamma,
        beta,
        st.norm,
        plan.x,
        axes.rows,
        scale=scales.get(_ROLES.x),
        rng=rng,
        hp_out=st.return_ln,
        train=st.train,
    )
    y, res, amaxes = linear_fwd(plan, _ROLES, axes, lnq, kernel, bias, scales, st.x_dtype, rng, st.train)
    if x_amax is not None:
        amaxes[_ROLES.x] = x_amax
    y = jnp.reshape(y[:m], lead + (st.n_local,))
    ln_out = None if ln_out is None else jnp.reshape(ln_out[:m], x.shape)
    return (y, ln_out), st.layout.pack((x2, mu, rsigma, gamma, res)), amaxes


def _bwd_local(st: _Static, res, dy, dln, scales, rng):
    plan, axes = st.plan, st.axes
    x2, mu, rsigma, gamma, lin_res = st.layout.unpack(res)
    lead = dy.shape[:-1]
    dy2, m = _token_pad.pad_zeros(plan, jnp.reshape(dy, (-1, st.n_local)).astype(st.x_dtype))
    dyq, dbias, amaxes = quantize_grad(plan, _ROLES, axes, dy2, st.b_dtype is not None, scales, rng)
    dln_out, dk = linear_bwd(plan, axes, lin_res, dyq, st.x_dtype, st.k_dtype)
    if dln is not None:
        dln2, _ = _token_pad.pad_zeros(plan, jnp.reshape(dln, (m, st.h)))
        dln_out = dln_out + dln2.astype(dln_out.dtype)
    dx, dgamma, dbeta = norm_backward(dln_out, x2, mu, rsigma, gamma, st.norm, axes.rows)
    if dbias is not None:
        dbias = _sharding.psum(dbias, axes.rows).astype(st.b_dtype)
    dbeta = None if st.beta_dtype is None else dbeta.astype(st.beta_dtype)
    return (
        jnp.reshape(dx[:m], lead + (st.h,)),
        dgamma.astype(st.g_dtype),
        dbeta,
        dk.astype(st.k_dtype),
        dbias,
        amaxes,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _layernorm_dense(st, x, gamma, beta, kernel, bias, state, rng):
    st = dataclasses.replace(st, train=False)
    return _layernorm_dense_fwd(st, x, gamma, beta, kernel, bias, state, rng)[0]


def _layernorm_dense_fwd(st, x, gamma, beta, kernel, bias, state, rng):
    lay = st.layout
    scales = _delayed.scales(state, roles_of(st.plan))
    out, res, amaxes = lay.run(
        functools.partial(_fwd_local, st),
        (x, gamma, beta, kernel, bias, scales, rng),
        in_specs=(st.x_spec, st.h_spec, st.h_spec, st.k_spec, st.b_spec, P(), P()),
        out_specs=((st.y_spec, st.x_spec), lay.residual_spec, P()),
    )
    return out, (res, state, amaxes, rng)


def _layernorm_dense_bwd(st, saved, cotangents):
    res, state, fwd_amaxes, rng = saved
    dy, dln = cotangents
    lay = st.layout
    roles = roles_of(st.plan)
    dx, dgamma, dbeta, dk, db, amaxes = lay.run(
        functools.partial(_bwd_local, st),
        (res, dy, dln if st.return_ln else None, _delayed.scales(state, roles), rng),
        in_specs=(lay.residual_spec, st.y_spec, st.x_spec, P(), P()),
        out_specs=(st.x_spec, st.h_spec, st.h_spec, st.k_spec, st.b_spec, P()),
    )
    new_state = None if state is None else _delayed.update(state, {**fwd_amaxes, **amaxes}, roles, st.plan)
    return dx, dgamma, dbeta, dk, db, new_state, None


_layernorm_dense.defvjp(_layernorm_dense_fwd, _layernorm_dense_bwd)
