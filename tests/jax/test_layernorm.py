"""te_jax.layernorm (layernorm / rmsnorm) on the CPU backend, forward and jax.grad.

Reference: the same math in plain jnp, fp32 (and float64 via numpy for the tight forward check);
fp32 results agree to <= 1e-5 relative (normwise). The FP8-output forward (te's fused norm +
quantize, private until layernorm_dense) must equal te_jax.quantize of the high-precision output
bit for bit (te/normalization.h).

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_layernorm.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from te_jax import _fused, _norm

F32, BF16 = jnp.float32, jnp.bfloat16


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def ref_norm(x, gamma, beta, eps, zcg, kind):
    x = x.astype(F32)
    g = (1.0 + gamma.astype(F32)) if zcg else gamma.astype(F32)
    if kind == "layernorm":
        mu = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
        y = (x - mu) * jax.lax.rsqrt(var + eps) * g
        return y + (0.0 if beta is None else beta.astype(F32))
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * g


def make(shape, seed=0, dtype=F32):
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    h = shape[-1]
    x = (jax.random.normal(k[0], shape) * 2 + 0.5).astype(dtype)
    gamma = (1 + 0.1 * jax.random.normal(k[1], (h,))).astype(dtype)
    beta = (0.1 * jax.random.normal(k[2], (h,))).astype(dtype)
    dy = jax.random.normal(k[3], shape).astype(dtype)
    return x, gamma, beta, dy


CASES = [
    ("layernorm", False),
    ("layernorm", True),
    ("rmsnorm", False),
    ("rmsnorm", True),
]


@pytest.mark.parametrize("kind,zcg", CASES)
@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 48), (5, 1)])
def test_forward_and_grad_fp32(kind, zcg, shape):
    x, gamma, beta, dy = make(shape)
    if zcg:
        gamma = gamma - 1.0
    if kind == "rmsnorm":
        beta = None
    eps = 1e-6 if shape[-1] > 1 else 1e-2

    def f(x, g, b):
        return te_jax.layernorm(x, g, b, epsilon=eps, zero_centered_gamma=zcg, layernorm_type=kind)

    def r(x, g, b):
        return ref_norm(x, g, b, eps, zcg, kind)

    y = f(x, gamma, beta)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert rel(y, r(x, gamma, beta)) <= 1e-5
    y_te, vjp_te = jax.vjp(f, x, gamma, beta)
    _, vjp_ref = jax.vjp(r, x, gamma, beta)
    got, want = vjp_te(dy), vjp_ref(dy)
    for name, a, b in zip(("dx", "dgamma", "dbeta"), got, want, strict=False):
        if b is None:
            assert a is None, name
            continue
        assert a.shape == b.shape, name
        # H = 1: dx is pure cancellation (x-hat is +-1), both sides are fp32 rounding noise.
        tol = 1e-5 if shape[-1] > 1 else 1e-4
        assert rel(a, b) <= tol, (name, rel(a, b))


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_jit_matches_eager_and_grad(kind):
    x, gamma, beta, _ = make((8, 32), seed=1)
    beta = beta if kind == "layernorm" else None

    def loss(x, g, b):
        return jnp.sum(te_jax.layernorm(x, g, b, layernorm_type=kind) ** 2)

    eager = jax.grad(loss, argnums=(0, 1))(x, gamma, beta)
    jitted = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, gamma, beta)
    for a, b in zip(eager, jitted, strict=False):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(jnp.abs(eager[1]).sum()) > 0


def test_bf16_io():
    x, gamma, beta, _ = make((16, 64), seed=2, dtype=BF16)
    y = te_jax.layernorm(x, gamma, beta)
    assert y.dtype == BF16
    assert rel(y, ref_norm(x, gamma, beta, 1e-6, False, "layernorm")) <= 1e-2


@pytest.mark.parametrize("mode,columnwise", [("per_tensor", True), ("block_1d", True)])
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_fp8_output_equals_norm_then_quantize(mode, columnwise, kind):
    x, gamma, beta, _ = make((128, 256), seed=3)
    beta = beta if kind == "layernorm" else None
    cfg = _norm._Config(_norm._ops.NORM_TYPES[kind], 1e-6, False)
    fp8 = _fused.Fp8Out(jnp.float8_e4m3fn, mode, True, columnwise, mode != "per_tensor", 0.0)
    q, mu, rsigma = _norm.norm_fwd(x, gamma, beta, cfg, fp8)
    y, mu2, rsigma2 = _norm.norm_fwd(x, gamma, beta, cfg)
    want = te_jax.quantize(y, scaling_mode=mode, columnwise=columnwise)
    for part in ("data", "scale_inv", "columnwise_data", "columnwise_scale_inv", "amax", "scale"):
        a, b = getattr(q, part), getattr(want, part)
        assert (a is None) == (b is None), part
        if a is not None:
            np.testing.assert_array_equal(
                np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8), err_msg=part
            )
    np.testing.assert_array_equal(np.asarray(rsigma), np.asarray(rsigma2))


def test_errors():
    x, gamma, beta, _ = make((4, 16))
    with pytest.raises(ValueError, match="layernorm_type: expected one of 'layernorm', 'rmsnorm'"):
        te_jax.layernorm(x, gamma, beta, layernorm_type="batchnorm")
    with pytest.raises(ValueError, match=r"gamma: expected shape \(16,\)"):
        te_jax.layernorm(x, gamma[:8], beta)
    with pytest.raises(ValueError, match=r"beta: expected shape \(16,\)"):
        te_jax.layernorm(x, gamma, beta[:3])
    with pytest.raises(ValueError, match="beta: expected None for layernorm_type='rmsnorm'"):
        te_jax.layernorm(x, gamma, beta, layernorm_type="rmsnorm")
    with pytest.raises(ValueError, match=r"beta: expected shape \(16,\) for layernorm_type='layernorm'"):
        te_jax.layernorm(x, gamma)
    with pytest.raises(TypeError, match="x.dtype: expected one of"):
        te_jax.layernorm(x.astype(jnp.int32), gamma, beta)
    with pytest.raises(ValueError, match="epsilon: expected a finite float >= 0"):
        te_jax.layernorm(x, gamma, beta, epsilon=-1.0)
    with pytest.raises(TypeError, match="zero_centered_gamma: expected True or False"):
        te_jax.layernorm(x, gamma, beta, zero_centered_gamma=1)
