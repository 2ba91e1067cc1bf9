"""References for te_jax's fused ops and Flax modules, shared by the tests beside it.

- Plain fp32 jnp math (norms, activations, dense, MLP): the unquantized reference.
- The emulated reference of a recipe (NUMERICS.md "How to test numerics"): every GEMM operand
  quantized and dequantized exactly as the recipe says (the copy each GEMM reads, in its
  format: te_jax.quantize for te's FP8 modes, the numpy oracle in _jax_oracle.py for MXFP8 and
  NVFP4, whose values te_gemm multiplies rounded to BF16, te/gemm.h), then the GEMMs in fp32
  with jnp. Norm and activation outputs come from te_jax's
  high-precision ops (tested against jnp in test_layernorm.py / test_activation.py), so the
  quantized values are the ones te quantizes.
"""

from __future__ import annotations

import dataclasses

import _jax_oracle as oracle
import jax
import jax.numpy as jnp
import numpy as np
import te_jax
from te_jax import recipe

F32 = jnp.float32
E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
HI = jax.lax.Precision.HIGHEST

RECIPES = {
    "delayed": recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling(),
    "current_e4m3": recipe.Float8CurrentScaling(fp8_format=recipe.Format.E4M3),
    "block": recipe.Float8BlockScaling(),
    "mxfp8": recipe.MXFP8BlockScaling(),
    "nvfp4": recipe.NVFP4BlockScaling(disable_stochastic_rounding=True),
}
# normwise relative error against unquantized fp32: E4M3/E5M2 operands, or FP4 ones
LOOSE = {"nvfp4": 0.35}
LOOSE_DEFAULT = 0.15


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def norm_ref(x, gamma, beta, eps=1e-6, kind="layernorm", zcg=False):
    x = x.astype(F32)
    g = (1.0 + gamma.astype(F32)) if zcg else gamma.astype(F32)
    if kind == "layernorm":
        mu = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + eps) * g + (0.0 if beta is None else beta.astype(F32))
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * g


_ACTS = {
    "gelu": lambda v: jax.nn.gelu(v, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "quick_gelu": lambda v: v * jax.nn.sigmoid(1.702 * v),
    "squared_relu": lambda v: jnp.square(jax.nn.relu(v)),
    "sigmoid": jax.nn.sigmoid,
}


def act_ref(pre, acts):
    """TE's activations on pre [..., A, F] (A = len(acts); "linear" is the identity gate)."""
    if len(acts) == 1:
        return _ACTS[acts[0]](pre[..., 0, :])
    return _ACTS[acts[0]](pre[..., 0, :]) * pre[..., 1, :]


def mlp_ref(x, gamma, beta, k1, b1, k2, b2, acts, kind="layernorm", eps=1e-6, zcg=False):
    ln = norm_ref(x, gamma, beta, eps, kind, zcg)
    pre = jnp.einsum("...h,haf->...af", ln, k1, precision=HI) + (0.0 if b1 is None else b1)
    return jnp.einsum("...f,fh->...h", act_ref(pre, acts), k2, precision=HI) + (0.0 if b2 is None else b2)


# ---- the emulated reference ----


def _roles(r):
    """(x, w, grad) quantizer descriptions of recipe r: (kind, dtype, mode, pow2, eps)."""
    hybrid = getattr(r, "fp8_format", None) == recipe.Format.HYBRID
    bwd = E5M2 if hybrid else E4M3
    if isinstance(r, recipe.DelayedScaling):
        return ("delayed", E4M3, None), ("delayed", E4M3, None), ("delayed", bwd, None)
    if isinstance(r, recipe.Float8BlockScaling):
        m = {1: "block_1d", 2: "block_2d"}
        pow2 = not r.use_f32_scales
        dims = (r.x_block_scaling_dim, r.w_block_scaling_dim, r.grad_block_scaling_dim)
        return tuple(("native", E4M3, (m[d], pow2)) for d in dims)
    if isinstance(r, recipe.Float8CurrentScaling):
        p = ("per_tensor", r.use_power_2_scales)
        return ("native", E4M3, p), ("native", E4M3, p), ("native", bwd, p)
    if isinstance(r, recipe.MXFP8BlockScaling):
        w = "2d" if r.enable_2d_quantization else "1d"
        return ("mxfp8", E4M3, "1d"), ("mxfp8", E4M3, w), ("mxfp8", bwd, "1d")
    if isinstance(r, recipe.NVFP4BlockScaling):
        assert r.disable_stochastic_rounding, "the emulated reference rounds to nearest"
        rht = not r.disable_rht
        w = "1d" if r.disable_2d_quantization else "2d"
        return ("nvfp4", None, (rht, "1d")), ("nvfp4", None, (False, w)), ("nvfp4", None, (rht, "1d"))
    raise AssertionError(r)


def qdq(t2, role, copy: str, scale=None):
    """t2 [M, K] quantized for ``copy`` ("rowwise": blocks along K; "columnwise": along M) and
    dequantized to fp32, source-shaped; MXFP8/NVFP4 values rounded to BF16, the operands
    te_gemm multiplies (exact for MXFP8; NVFP4's (q * s_block) * s_global is not)."""
    kind, dtype, opts = role
    t2 = jnp.asarray(t2)
    if kind in ("native", "delayed"):
        if kind == "delayed":
            q = te_jax.quantize(t2, dtype=dtype, scale=scale, columnwise=True)
        else:
            mode, pow2 = opts
            q = te_jax.quantize(t2, dtype=dtype, scaling_mode=mode, columnwise=True, force_pow2_scales=pow2)
        if copy == "columnwise":
            q = dataclasses.replace(q, data=None, scale_inv=None)
        return q.dequantize(F32)
    src = np.asarray(t2, np.float32)
    if copy == "columnwise":
        src = src.T
    if kind == "mxfp8":
        out = oracle.mxfp8(src, dtype, square=opts == "2d")
    else:
        rht, mode = opts
        if rht and copy == "columnwise":
            src = oracle.rht(src)
        out = oracle.nvfp4(src, square=mode == "2d")
    out = out.astype(jnp.bfloat16).astype(np.float32)
    return jnp.asarray(out.T if copy == "columnwise" else out)


def _mm(a, b):
    return jnp.matmul(a, b, precision=HI)


def emulated_linear(x2, w, dy2, r, scales=None, prefix=""):
    """(y without bias, dx, dw) of one quantized linear layer under recipe r."""
    xr, wr, gr = _roles(r)
    s = scales or {}

    def sc(role):
        return s.get(prefix + role)

    y = _mm(qdq(x2, xr, "rowwise", sc("x_scale")), qdq(w, wr, "columnwise", sc("kernel_scale")))
    if dy2 is None:
        return y, None, None
    dx = _mm(qdq(dy2, gr, "rowwise", sc("grad_scale")), qdq(w, wr, "rowwise", sc("kernel_scale")).T)
    dw = _mm(qdq(x2, xr, "columnwise", sc("x_scale")).T, qdq(dy2, gr, "columnwise", sc("grad_scale")))
    return y, dx, dw


def emulated_mlp(x, gamma, beta, k1, b1, k2, b2, dy, r, acts, kind="layernorm", eps=1e-6, scales=None):
    """(y, (dx, dgamma, dbeta, dk1, db1, dk2, db2)) of layernorm_mlp under recipe r, emulated:
    te's high-precision norm and activation, quantize-dequantize at every GEMM operand."""
    h, a, f = k1.shape
    ln, ln_vjp = jax.vjp(
        lambda x, g, b: te_jax.layernorm(x, g, b, epsilon=eps, layernorm_type=kind), x, gamma, beta
    )
    ln2 = ln.reshape(-1, h)
    dy2 = dy.reshape(-1, h)
    k1m = k1.reshape(h, a * f)
    pre, _, _ = emulated_linear(ln2, k1m, None, r, scales, "fc1_")
    pre = pre + (0.0 if b1 is None else b1.reshape(-1))
    act, act_vjp = jax.vjp(lambda p: te_jax.activation(p, acts), pre)
    y, dact, dk2 = emulated_linear(act, k2, dy2, r, scales, "fc2_")
    y = y + (0.0 if b2 is None else b2)
    (dpre,) = act_vjp(dact)
    _, dln2, dk1 = emulated_linear(ln2, k1m, dpre, r, scales, "fc1_")
    dx, dgamma, dbeta = ln_vjp(dln2.reshape(x.shape))
    db1 = None if b1 is None else jnp.sum(dpre, 0).reshape(a, f)
    db2 = None if b2 is None else jnp.sum(dy2, 0)
    return y.reshape(x.shape[:-1] + (h,)), (dx, dgamma, dbeta, dk1.reshape(h, a, f), db1, dk2, db2)


def make_mlp(b=2, s=64, h=128, f=256, acts=("gelu",), bias=True, seed=0, dtype=F32):
    ks = jax.random.split(jax.random.PRNGKey(seed), 8)
    a = len(acts)
    x = (jax.random.normal(ks[0], (b, s, h)) * 2 + 0.3).astype(dtype)
    gamma = (1 + 0.1 * jax.random.normal(ks[1], (h,))).astype(dtype)
    beta = (0.1 * jax.random.normal(ks[2], (h,))).astype(dtype)
    k1 = (jax.random.normal(ks[3], (h, a, f)) / np.sqrt(h)).astype(dtype)
    k2 = (jax.random.normal(ks[4], (f, h)) / np.sqrt(f)).astype(dtype)
    b1 = (0.1 * jax.random.normal(ks[5], (a, f))).astype(dtype) if bias else None
    b2 = (0.1 * jax.random.normal(ks[6], (h,))).astype(dtype) if bias else None
    dy = jax.random.normal(ks[7], (b, s, h)).astype(dtype)
    return x, gamma, beta, k1, b1, k2, b2, dy
