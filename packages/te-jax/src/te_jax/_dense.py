"""dense: x @ kernel (+ bias) as a jax.custom_vjp over te's GEMMs, in high precision or under a
recipe, on one device or split over a mesh.

Layout. TE Flax's DenseGeneral kernel is [in, out] = [K, N] and y = x @ kernel:
    fprop  y  [M, N] = gemm(x, kernel, trans_b=False)              reads kernel's column-wise copy
    dgrad  dx [M, K] = gemm(dy, kernel, trans_b=True)              reads kernel's row-wise copy
    wgrad  dk [K, N] = gemm(x, dy, trans_a=True, trans_b=False)    reads x's and dy's column-wise
The forward quantizes x and the kernel once (both copies) and keeps for the backward only the
copies it reads there: x's column-wise copy and the kernel's row-wise one. The backward
quantizes dy once (both copies; fused with the bias gradient's column sums where te may).

Formats (NUMERICS.md): x and kernel in the recipe's forward format (E4M3), dy in its backward
format (E5M2 under Format.HYBRID); split accumulation off for fprop, on for dgrad and wgrad
(per the recipe's fp8_gemm_* where it has them). DelayedScaling's state (te_jax._delayed) comes
in as ``recipe_state`` and the next state comes back as its gradient.

Sharding (te_jax._sharding): ``input_spec`` splits x's leading dims (data parallel) and possibly
K; ``kernel_spec`` splits K (row-parallel: K split alike in x, y psum-reduced) or N (column-
parallel: y split on N, dx psum-reduced). The kernel gradient is psum-reduced over x's rows.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from te_jax import _delayed, _op_common, _sharding, _token_pad
from te_jax._linear import LinearAxes, Roles, linear_bwd, linear_fwd, quantize_grad
from te_jax._quantizer import Plan, plan_for, quantize_operand
from te_jax._sharding import Layout, entry_axes

_ROLES = Roles()


def roles_of(plan: Plan, roles: Roles = _ROLES) -> dict:
    """{state name: quantizer} of a linear layer's roles (empty in high precision)."""
    if not plan.quantized:
        return {}
    return {roles.x: plan.x, roles.kernel: plan.w, roles.grad: plan.grad}


@dataclasses.dataclass(frozen=True)
class _Static:
    plan: Plan
    layout: Layout
    axes: LinearAxes
    x_spec: P | None
    k_spec: P | None
    b_spec: P | None
    y_spec: P | None
    k_local: int
    n_local: int
    x_dtype: np.dtype
    k_dtype: np.dtype
    b_dtype: np.dtype | None
    # False: the primal (no jax.grad), an inference forward: no column-wise copies, no padding
    # under per-tensor scaling (_token_pad)
    train: bool = True


def check_dense_blocks(plan: Plan, lay: Layout, x_shape, kernel_shape) -> None:
    """check_blocks for a dense layer's x [..., K], kernel [K, N] and gradient dy [..., N], and
    check_fp8_sizes for K and N on one shard."""
    xs, ks = lay.specs[0], lay.specs[1]
    _op_common.check_fp8_sizes(
        plan,
        [
            ("kernel's K (x's last dim)", kernel_shape[0] // lay.size(entry_axes(ks[0]))),
            ("kernel's N (the output's last dim)", kernel_shape[1] // lay.size(entry_axes(ks[1]))),
        ],
    )
    _op_common.check_blocks(
        plan,
        lay,
        [
            ("x", x_shape, xs, True),
            ("kernel", kernel_shape, ks, False),
            ("dy", x_shape[:-1] + (kernel_shape[1],), xs[:-1] + ks[1:], True),
        ],
    )


def dense_axes(lay: Layout, x_ndim: int, name_x="input_spec", name_k="kernel_spec") -> LinearAxes:
    """A linear layer's LinearAxes from its layout's (x, kernel) spec entries, checked."""
    xs, ks = lay.specs[0], lay.specs[1]
    rows = _op_common.row_axes(xs)
    k = entry_axes(xs[-1])
    if entry_axes(ks[0]) != k:
        raise ValueError(
            f"{name_k}: its first (K) entry {ks[0]!r} must split K as {name_x}'s last entry {xs[-1]!r} "
            "does (row-parallel layers split both alike; else both None)"
        )
    n = entry_axes(ks[1])
    shared = set(rows) & set(k + n)
    if shared:
        raise ValueError(
            f"{name_k}: mesh axes {sorted(shared)} split both the kernel and {name_x}'s rows; a kernel "
            "split over the batch axes (FSDP) must be gathered before the GEMM: pass its spec without them"
        )
    return LinearAxes(rows, k, n)


def dense(
    x,
    kernel,
    bias=None,
    *,
    recipe=None,
    recipe_state: dict | None = None,
    input_spec: P | None = None,
    kernel_spec: P | None = None,
    rng=None,
):
    """``x @ kernel (+ bias)`` through te's GEMM: x [..., K], kernel [K, N] (TE Flax's
    DenseGeneral layout), bias [N]; returns [..., N] in x's dtype.

    Args:
      recipe: None (high precision: x and kernel of one dtype, float32/bfloat16/float16) or a
        te_jax.recipe recipe: DelayedScaling, Float8CurrentScaling, Float8BlockScaling,
        MXFP8BlockScaling or NVFP4BlockScaling (te-core's kernels; MXFP8/NVFP4 GEMMs by BF16
        block dequantization). x and kernel are quantized in the forward, dy in the backward.
      recipe_state: DelayedScaling only: {"x_scale", "x_amax_history", "kernel_scale", ...,
        "grad_amax_history"} (te_jax.init_recipe_state(recipe, "dense")); jax.grad with respect
        to it returns the next step's state.
      input_spec, kernel_spec: jax.sharding.PartitionSpecs of x and kernel over the mesh set
        with jax.set_mesh (see the module notes). input_spec defaults to x's first dim split
        over te_jax.autocast's MeshResource batch axes (dp, fsdp); kernel_spec to replicated.
      rng: a jax.random key for NVFP4's stochastic rounding of gradients (data, not a static
        argument: a jitted step takes a new key without retracing).

    Differentiable in x, kernel and bias (jax.grad; te's GEMMs in the backward), and jit-able.
    """
    plan = plan_for(recipe)
    x = _op_common.array(x, "x")
    kernel = _op_common.array(kernel, "kernel")
    if kernel.ndim != 2:
        raise ValueError(f"kernel: expected shape [K, N] (in, out), got {tuple(kernel.shape)}")
    k, n = kernel.shape
    if x.ndim < 1 or x.shape[-1] != k:
        raise ValueError(f"x: expected shape [..., {k}] (kernel's in dim K = {k}), got {tuple(x.shape)}")
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
    if x.ndim == 1:
        return dense(
            x[None], kernel, bias, recipe=recipe, recipe_state=recipe_state, kernel_spec=kernel_spec, rng=rng
        )[0]

    if input_spec is None:
        input_spec = _sharding.default_input_spec(x.ndim)
    lay = _sharding.layout([(x.shape, input_spec, "input_spec"), (kernel.shape, kernel_spec, "kernel_spec")])
    axes = dense_axes(lay, x.ndim)
    xs, ks = lay.specs
    check_dense_blocks(plan, lay, x.shape, kernel.shape)
    st = _Static(
        plan=plan,
        layout=lay,
        axes=axes,
        x_spec=P(*xs),
        k_spec=P(*ks),
        b_spec=P(ks[1]),
        y_spec=P(*xs[:-1], ks[1]),
        k_local=k // lay.size(axes.k),
        n_local=n // lay.size(axes.n),
        x_dtype=np.dtype(x.dtype),
        k_dtype=np.dtype(kernel.dtype),
        b_dtype=_op_common.dtype_of(bias),
    )
    return _dense(st, x, kernel, bias, state, rng)


def _fwd_local(st: _Static, x, kernel, bias, scales, rng):
    plan, axes = st.plan, st.axes
    lead = x.shape[:-1]
    x2, m = _token_pad.pad_copies(plan, jnp.reshape(x, (-1, st.k_local)), st.train)
    xq, x_amax = quantize_operand(
        x2,
        plan.x,
        rowwise=True,
        columnwise=st.train,
        reduce_axes=axes.rows + axes.k,
        scale=scales.get(_ROLES.x),
        rng=rng,
    )
    y, res, amaxes = linear_fwd(plan, _ROLES, axes, xq, kernel, bias, scales, st.x_dtype, rng, st.train)
    if x_amax is not None:
        amaxes[_ROLES.x] = x_amax
    return jnp.reshape(y[:m], lead + (st.n_local,)), st.layout.pack(res), amaxes


def _bwd_local(st: _Static, res, dy, scales, rng):
    plan, axes = st.plan, st.axes
    res = st.layout.unpack(res)
    lead = dy.shape[:-1]
    dy2, m = _token_pad.pad_zeros(plan, jnp.reshape(dy, (-1, st.n_local)).astype(st.x_dtype))
    dyq, dbias, amaxes = quantize_grad(plan, _ROLES, axes, dy2, st.b_dtype is not None, scales, rng)
    dx, dk = linear_bwd(plan, axes, res, dyq, st.x_dtype, st.k_dtype)
    if dbias is not None:
        dbias = _sharding.psum(dbias, axes.rows).astype(st.b_dtype)
    return jnp.reshape(dx[:m], lead + (st.k_local,)), dk.astype(st.k_dtype), dbias, amaxes


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _dense(st, x, kernel, bias, state, rng):
    return _dense_fwd(dataclasses.replace(st, train=False), x, kernel, bias, state, rng)[0]


def _dense_fwd(st, x, kernel, bias, state, rng):
    lay = st.layout
    scales = _delayed.scales(state, roles_of(st.plan))
    y, res, amaxes = lay.run(
        functools.partial(_fwd_local, st),
        (x, kernel, bias, scales, rng),
        in_specs=(st.x_spec, st.k_spec, st.b_spec, P(), P()),
        out_specs=(st.y_spec, lay.residual_spec, P()),
    )
    return y, (res, state, amaxes, rng)


def _dense_bwd(st, saved, dy):
    res, state, fwd_amaxes, rng = saved
    lay = st.layout
    roles = roles_of(st.plan)
    dx, dk, db, amaxes = lay.run(
        functools.partial(_bwd_local, st),
        (res, dy, _delayed.scales(state, roles), rng),
        in_specs=(lay.residual_spec, st.y_spec, P(), P()),
        out_specs=(st.x_spec, st.k_spec, st.b_spec, P()),
    )
    new_state = None if state is None else _delayed.update(state, {**fwd_amaxes, **amaxes}, roles, st.plan)
    return dx, dk, db, new_state, None


_dense.defvjp(_dense_fwd, _dense_bwd)
