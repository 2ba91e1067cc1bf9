"""layernorm_mlp: norm -> fc1 -> activation -> fc2 as one jax.custom_vjp, TE Flax's LayerNormMLP.

Forward (each quantization fused into the kernel before it where the recipe allows):
    ln_out = norm(x)                 te's norm writes fc1's quantized input (role "fc1_x")
    pre    = ln_out @ kernel_1 + b1  kernel_1 [H, A, F] viewed [H, A*F] (A = 2 for gated kinds:
                                     the activation's input columns, then the gate's)
    act    = act(pre)                te's activation writes fc2's quantized input ("fc2_x")
    y      = act @ kernel_2 + b2     kernel_2 [F, H]
Backward: dy quantized ("fc2_grad", dbias fused), d act = dy @ kernel_2^T, te's activation
backward writes d pre quantized ("fc1_grad", dbias fused), d ln_out = d pre @ kernel_1^T, te's
norm backward gives dx, dgamma, dbeta. A plain gelu under DelayedScaling, whose output scales
are known before the GEMMs run, makes fc1 + gelu and fc2's dgrad + gelu's backward one te_gemm
call each (GELU_AUX / DGELU with an FP8 output, te/gemm.h: the same bytes as the two calls, one
kernel where the backend fuses them). Kept for the backward: x, mu, rsigma, gamma, pre, the
column-wise copies of ln_out and act, and the row-wise copies of both kernels.

Intermediate dropout (TE Flax's intermediate_dropout_rate > 0, not deterministic): act =
drop(act(pre)), drop(a) = a / keep where the mask keeps a, else 0 (flax.linen.Dropout's). The
mask must sit between the activation and fc2's quantization (dropped values set no amax or
scale), so te's activation then writes high precision, the mask is applied and the result
quantized ("fc2_x"); the backward multiplies d act by the same mask / keep before the
activation's backward (no gelu inside the GEMMs then). The mask is drawn outside the
shard_map over the global [..., F], so a mesh changes no number, and kept as a bool residual
(F bytes a token, beside pre's A x F x 2-4): regenerating it in the backward would repeat the
global draw. Rate 0 or deterministic: none of this runs, the path above is unchanged.

Sharding, Megatron-style: x's rows split (data parallel); F split over the tensor-parallel axes
named by kernel_1_spec's last entry (fc1 column-parallel, fc2 row-parallel: y psum-reduced);
H, A never split.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from te_jax import _delayed, _op_common, _sharding, _token_pad
from te_jax._activation import act_fwd, activation_kind
from te_jax._linear import (
    LinearAxes,
    Roles,
    act_grad_quantize,
    act_quantize,
    gelu_in_gemm,
    linear_bwd,
    linear_dgelu_bwd,
    linear_fwd,
    linear_gelu_fwd,
    norm_backward,
    norm_quantize,
    quantize_grad,
)
from te_jax._norm import _check as _check_norm
from te_jax._norm import _Config as NormConfig
from te_jax._quantizer import Plan, plan_for, quantize_operand
from te_jax._sharding import Layout, entry_axes

FC1 = Roles("fc1_x", "fc1_kernel", "fc1_grad")
FC2 = Roles("fc2_x", "fc2_kernel", "fc2_grad")


def roles_of(plan: Plan) -> dict:
    """{state name: quantizer} of the MLP's six roles (empty in high precision)."""
    if not plan.quantized:
        return {}
    out = {}
    for r in (FC1, FC2):
        out.update({r.x: plan.x, r.kernel: plan.w, r.grad: plan.grad})
    return out


@dataclasses.dataclass(frozen=True)
class _Static:
    plan: Plan
    norm: NormConfig
    kind: int
    layout: Layout
    rows: tuple[str, ...]
    tp: tuple[str, ...]
    x_spec: P | None
    k1_spec: P | None
    b1_spec: P | None
    k2_spec: P | None
    h: int
    a: int
    f_local: int
    x_dtype: np.dtype
    g_dtype: np.dtype
    beta_dtype: np.dtype | None
    k1_dtype: np.dtype
    k2_dtype: np.dtype
    b1_dtype: np.dtype | None
    b2_dtype: np.dtype | None
    return_ln: bool
    # the intermediate's spec ([..., F]: x's rows, F split as kernel_1's) and dropout's keep
    # probability (None: no dropout)
    mid_spec: P | None = None
    keep: float | None = None
    # False: the primal (no jax.grad), an inference forward: no column-wise copies, no padding
    # under per-tensor scaling (_token_pad)
    train: bool = True


def _shape(value, expected: tuple, name: str, what: str):
    if tuple(value.shape) != expected:
        raise ValueError(f"{name}: expected shape {expected} ({what}), got {tuple(value.shape)}")


def layernorm_mlp(
    x,
    gamma,
    beta,
    kernel_1,
    bias_1,
    kernel_2,
    bias_2,
    *,
    activations=("gelu",),
    layernorm_type: str = "layernorm",
    epsilon: float = 1e-6,
    zero_centered_gamma: bool = False,
    return_layernorm_output: bool = False,
    recipe=None,
    recipe_state: dict | None = None,
    input_spec: P | None = None,
    kernel_1_spec: P | None = None,
    rng=None,
    dropout_rate: float = 0.0,
    dropout_rng=None,
    dropout_broadcast_dims=(),
):
    """TE Flax's LayerNormMLP as a function: x [..., H] -> (y [..., H] in x's dtype, ln_out or
    None).

    Args:
      gamma, beta: the norm's [H] parameters (beta None for rmsnorm).
      kernel_1: [H, A, F], A = len(activations) (1 plain, 2 gated); bias_1: [A, F] or None.
      kernel_2: [F, H]; bias_2: [H] or None.
      activations: TE's tuple, e.g. ("gelu",), ("gelu", "linear") (GeGLU), ("silu", "linear")
        (SwiGLU), ("relu",), ("squared_relu",), ("quick_gelu", "linear"), ("sigmoid", "linear").
      recipe, recipe_state (roles fc1_x, fc1_kernel, fc1_grad, fc2_x, fc2_kernel, fc2_grad),
        input_spec, rng: as in te_jax.dense; the norm arguments as in te_jax.layernorm.
      kernel_1_spec: kernel_1's PartitionSpec: only its F entry (the last) may name mesh axes
        (tensor parallel); kernel_2 is split alike on F, bias_1 on F.
      dropout_rate: TE Flax's intermediate dropout on act(pre) [..., F] before fc2, in [0, 1):
        each element kept with probability 1 - rate and scaled by 1 / (1 - rate), the mask
        flax.linen.Dropout(rate, broadcast_dims) draws from ``dropout_rng`` (a jax.random
        key, needed when rate > 0); 0 (the default): no dropout.
      dropout_broadcast_dims: dims of [..., F] sharing one draw (flax's broadcast_dims).
    """
    plan = plan_for(recipe)
    kind = activation_kind(activations, "activations")
    n_act = 1 if isinstance(activations, str) else len(tuple(activations))
    cfg, x, gamma, beta = _check_norm(x, gamma, beta, epsilon, zero_centered_gamma, layernorm_type)
    if not isinstance(return_layernorm_output, bool):
        raise TypeError(f"return_layernorm_output: expected True or False, got {return_layernorm_output!r}")
    if x.ndim < 2:
        raise ValueError(f"x: expected shape [..., H] with at least one leading dim, got {tuple(x.shape)}")
    h = x.shape[-1]
    kernel_1 = _op_common.array(kernel_1, "kernel_1")
    kernel_2 = _op_common.array(kernel_2, "kernel_2")
    if kernel_1.ndim != 3 or kernel_1.shape[:2] != (h, n_act):
        raise ValueError(
            f"kernel_1: expected shape ({h}, {n_act}, F) (H = x's last dim, one slice per activation of "
            f"{tuple(activations) if not isinstance(activations, str) else activations!r}), got "
            f"{tuple(kernel_1.shape)}"
        )
    f = kernel_1.shape[2]
    _shape(kernel_2, (f, h), "kernel_2", "F = kernel_1's last dim, H")
    for name, k in (("kernel_1", kernel_1), ("kernel_2", kernel_2)):
        if not plan.quantized and k.dtype != x.dtype:
            raise TypeError(
                f"{name}.dtype: expected x's dtype {np.dtype(x.dtype).name} (a high-precision GEMM "
                f"reads one dtype), got {np.dtype(k.dtype).name}"
            )
    if bias_1 is not None:
        bias_1 = _op_common.array(bias_1, "bias_1")
        _shape(bias_1, (n_act, f), "bias_1", "one row per activation, F")
    if bias_2 is not None:
        bias_2 = _op_common.array(bias_2, "bias_2")
        _shape(bias_2, (h,), "bias_2", "H")
    roles = roles_of(plan)
    state = _op_common.check_state(plan, recipe_state, roles)
    rng = _op_common.check_rng(plan, rng)
    keep, mask = _dropout_mask(dropout_rate, dropout_rng, dropout_broadcast_dims, x.shape[:-1] + (f,))

    if input_spec is None:
        input_spec = _sharding.default_input_spec(x.ndim)
    lay = _sharding.layout(
        [(x.shape, input_spec, "input_spec"), (kernel_1.shape, kernel_1_spec, "kernel_1_spec")]
    )
    xs, k1s = lay.specs
    if xs[-1] is not None:
        raise ValueError(
            f"input_spec: the normalized dim H may not be split (the norm reduces over it), got {P(*xs)}"
        )
    if k1s[0] is not None or k1s[1] is not None:
        raise ValueError(f"kernel_1_spec: only F (the last entry) may be split, got {P(*k1s)}")
    rows = _op_common.row_axes(xs)
    tp = entry_axes(k1s[2])
    if set(rows) & set(tp):
        raise ValueError(
            f"kernel_1_spec: mesh axes {sorted(set(rows) & set(tp))} split both F and input_spec's rows"
        )
    _op_common.check_blocks(
        plan,
        lay,
        [
            ("x", x.shape, xs, True),
            ("kernel_1", (h, f), (None, k1s[2]), False),
            ("kernel_2", (f, h), (k1s[2], None), False),
            ("intermediate", x.shape[:-1] + (f,), xs[:-1] + (k1s[2],), True),
        ],
    )
    sizes = [("H (x's last dim)", h), ("F (kernel_1's last dim)", f // lay.size(tp))]
    _op_common.check_fp8_sizes(plan, sizes)
    st = _Static(
        plan=plan,
        norm=cfg,
        kind=kind,
        layout=lay,
        rows=rows,
        tp=tp,
        x_spec=P(*xs),
        k1_spec=P(*k1s),
        b1_spec=P(None, k1s[2]),
        k2_spec=P(k1s[2], None),
        h=h,
        a=n_act,
        f_local=f // lay.size(tp),
        x_dtype=np.dtype(x.dtype),
        g_dtype=np.dtype(gamma.dtype),
        beta_dtype=_op_common.dtype_of(beta),
        k1_dtype=np.dtype(kernel_1.dtype),
        k2_dtype=np.dtype(kernel_2.dtype),
        b1_dtype=_op_common.dtype_of(bias_1),
        b2_dtype=_op_common.dtype_of(bias_2),
        return_ln=return_layernorm_output,
        mid_spec=P(*xs[:-1], k1s[2]),
        keep=keep,
    )
    return _layernorm_mlp(st, x, gamma, beta, kernel_1, bias_1, kernel_2, bias_2, state, rng, mask)


def _dropout_mask(rate, key, dims, shape):
    """(keep probability or None, the bool mask [..., F] or None): flax.linen.Dropout's draw,
    bernoulli(key, 1 - rate) over ``shape`` with ``dims`` of size 1, then broadcast."""
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout_rate: expected a float in [0, 1), got {rate!r}")
    ndim = len(shape)
    if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence) or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and -ndim <= d < ndim for d in dims
    ):  # fmt: skip
        raise ValueError(
            f"dropout_broadcast_dims: expected a tuple of dims of the intermediate {tuple(shape)} "
            f"(one draw shared along each), got {dims!r}"
        )
    if rate == 0.0:
        return None, None
    if key is None:
        raise ValueError(f"dropout_rng: expected a jax.random key for dropout_rate={rate!r}, got None")
    if not isinstance(key, jax.Array):
        raise TypeError(f"dropout_rng: expected a jax.random key, got {type(key).__name__}")
    keep = 1.0 - float(rate)
    shared = {int(d) % ndim for d in dims}
    drawn = tuple(1 if d in shared else n for d, n in enumerate(shape))
    return keep, jnp.broadcast_to(jax.random.bernoulli(key, keep, drawn), shape)


def _drop(a, mask, keep: float):
    """flax.linen.Dropout's output: a / keep where the mask keeps it, else 0 (a's dtype)."""
    return jnp.where(mask, a / keep, jnp.zeros_like(a))


def _rngs(rng):
    if rng is None:
        return None, None
    return jax.random.fold_in(rng, 1), jax.random.fold_in(rng, 2)


def _fwd_local(st: _Static, x, gamma, beta, k1, b1, k2, b2, scales, rng, mask):
    plan = st.plan
    ax1 = LinearAxes(rows=st.rows, n=st.tp)
    ax2 = LinearAxes(rows=st.rows, k=st.tp)
    rng1, rng2 = _rngs(rng)
    lead = x.shape[:-1]
    width = st.a * st.f_local
    x2, m = _token_pad.pad_copies(plan, jnp.reshape(x, (-1, st.h)), st.train)
    lnq, ln_out, mu, rsigma, a1 = norm_quantize(
        x2,
        gamma,
        beta,
        st.norm,
        plan.x,
        st.rows,
        scale=scales.get(FC1.x),
        rng=rng1,
        hp_out=st.return_ln,
        train=st.train,
    )
    b1 = None if b1 is None else jnp.reshape(b1, (width,))
    k1 = jnp.reshape(k1, (st.h, width))
    if mask is not None:  # the padded rows (copies of the last token, sliced off) dropped
        mask = jnp.reshape(mask, (-1, st.f_local))
        mask = jnp.pad(mask, ((0, x2.shape[0] - m), (0, 0)))
    if mask is None and gelu_in_gemm(plan.x, st.kind):
        actq, pre, res1, amaxes = linear_gelu_fwd(
            plan, FC1, ax1, lnq, k1, b1, scales, FC2.x, st.rows + st.tp, st.x_dtype, rng1, st.train
        )
    else:
        pre, res1, amaxes = linear_fwd(plan, FC1, ax1, lnq, k1, b1, scales, st.x_dtype, rng1, st.train)
        if mask is None:
            actq, a2 = act_quantize(
                pre, st.kind, plan.x, st.rows + st.tp, scale=scales.get(FC2.x), rng=rng2, train=st.train
            )
        else:  # the activation in high precision, dropped, then quantized for fc2
            actq, a2 = quantize_operand(
                _drop(act_fwd(pre, st.kind), mask, st.keep),
                plan.x,
                rowwise=True,
                columnwise=st.train,
                reduce_axes=st.rows + st.tp,
                scale=scales.get(FC2.x),
                rng=rng2,
            )
        if a2 is not None:
            amaxes[FC2.x] = a2
    y, res2, amaxes2 = linear_fwd(plan, FC2, ax2, actq, k2, b2, scales, st.x_dtype, rng2, st.train)
    amaxes.update(amaxes2)
    if a1 is not None:
        amaxes[FC1.x] = a1
    ln_out = None if ln_out is None else jnp.reshape(ln_out[:m], x.shape)
    res = (x2, mu, rsigma, gamma, pre, res1, res2, mask)
    return (jnp.reshape(y[:m], lead + (st.h,)), ln_out), st.layout.pack(res), amaxes


def _bwd_local(st: _Static, res, dy, dln, scales, rng):
    plan = st.plan
    ax1 = LinearAxes(rows=st.rows, n=st.tp)
    ax2 = LinearAxes(rows=st.rows, k=st.tp)
    rng1, rng2 = _rngs(rng)
    x2, mu, rsigma, gamma, pre, res1, res2, mask = st.layout.unpack(res)
    lead = dy.shape[:-1]
    dy2, m = _token_pad.pad_zeros(plan, jnp.reshape(dy, (-1, st.h)).astype(st.x_dtype))
    dyq, db2, amaxes = quantize_grad(plan, FC2, ax2, dy2, st.b2_dtype is not None, scales, rng2)
    has_b1 = st.b1_dtype is not None
    if mask is None and gelu_in_gemm(plan.grad, st.kind):
        dpreq, db1, amaxes1, dk2 = linear_dgelu_bwd(
            plan, FC1.grad, ax2, res2, dyq, pre, has_b1, st.rows + st.tp, scales, st.k2_dtype
        )
    else:
        dact, dk2 = linear_bwd(plan, ax2, res2, dyq, st.x_dtype, st.k2_dtype)
        if mask is not None:  # the forward's mask: d act(pre) = d act * mask / keep
            dact = _drop(dact, mask, st.keep)
        dpreq, db1, amaxes1 = act_grad_quantize(
            plan, FC1, dact, pre, st.kind, has_b1, st.rows + st.tp, scales, rng1
        )
    amaxes.update(amaxes1)
    dln_out, dk1 = linear_bwd(plan, ax1, res1, dpreq, st.x_dtype, st.k1_dtype)
    if dln is not None:
        dln2, _ = _token_pad.pad_zeros(plan, jnp.reshape(dln, (m, st.h)))
        dln_out = dln_out + dln2.astype(dln_out.dtype)
    dx, dgamma, dbeta = norm_backward(dln_out, x2, mu, rsigma, gamma, st.norm, st.rows)
    if db1 is not None:
        db1 = jnp.reshape(_sharding.psum(db1, st.rows), (st.a, st.f_local)).astype(st.b1_dtype)
    if db2 is not None:
        db2 = _sharding.psum(db2, st.rows).astype(st.b2_dtype)
    return (
        jnp.reshape(dx[:m], lead + (st.h,)),
        dgamma.astype(st.g_dtype),
        None if st.beta_dtype is None else dbeta.astype(st.beta_dtype),
        jnp.reshape(dk1, (st.h, st.a, st.f_local)).astype(st.k1_dtype),
        db1,
        dk2.astype(st.k2_dtype),
        db2,
        amaxes,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _layernorm_mlp(st, x, gamma, beta, k1, b1, k2, b2, state, rng, mask):
    st = dataclasses.replace(st, train=False)
    return _layernorm_mlp_fwd(st, x, gamma, beta, k1, b1, k2, b2, state, rng, mask)[0]


def _layernorm_mlp_fwd(st, x, gamma, beta, k1, b1, k2, b2, state, rng, mask):
    lay = st.layout
    scales = _delayed.scales(state, roles_of(st.plan))
    mid = st.mid_spec
    out, res, amaxes = lay.run(
        functools.partial(_fwd_local, st),
        (x, gamma, beta, k1, b1, k2, b2, scales, rng, mask),
        in_specs=(st.x_spec, P(None), P(None), st.k1_spec, st.b1_spec, st.k2_spec, P(None), P(), P(), mid),
        out_specs=((st.x_spec, st.x_spec), lay.residual_spec, P()),
    )
    return out, (res, state, amaxes, rng)


def _layernorm_mlp_bwd(st, saved, cotangents):
    res, state, fwd_amaxes, rng = saved
    dy, dln = cotangents
    lay = st.layout
    roles = roles_of(st.plan)
    grads = lay.run(
        functools.partial(_bwd_local, st),
        (res, dy, dln if st.return_ln else None, _delayed.scales(state, roles), rng),
        in_specs=(lay.residual_spec, st.x_spec, st.x_spec, P(), P()),
        out_specs=(st.x_spec, P(None), P(None), st.k1_spec, st.b1_spec, st.k2_spec, P(None), P()),
    )
    *grads, amaxes = grads
    new_state = None if state is None else _delayed.update(state, {**fwd_amaxes, **amaxes}, roles, st.plan)
    return (*grads, new_state, None, None)


_layernorm_mlp.defvjp(_layernorm_mlp_fwd, _layernorm_mlp_bwd)
