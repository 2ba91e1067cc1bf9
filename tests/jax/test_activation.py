"""te_jax.activation (TE Flax's activation tuples) on the CPU backend, forward and jax.grad.

Reference: plain jnp in fp32 with te's formulas (te/activation.h: tanh-approximate GELU, gated
kinds act(first half) * second half); <= 1e-5 normwise relative error. The fused backward with
dbias and the fused dbias + quantize (te_jax's private act_bwd / dbias_quantize, which dense's
backward uses) are checked against the same reference and te_jax.quantize, bit for bit.

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_activation.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from te_jax import _activation, _fused

F32 = jnp.float32

PLAIN = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "squared_relu": lambda x: jax.nn.relu(x) ** 2,
    "sigmoid": jax.nn.sigmoid,
}
TYPES = [(n,) for n in PLAIN if n != "sigmoid"] + [(n, "linear") for n in PLAIN]


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def ref(x, activation_type):
    act = PLAIN[activation_type[0]]
    if len(activation_type) == 1:
        return act(x)
    n = x.shape[-1] // 2
    return act(x[..., :n]) * x[..., n:]


@pytest.mark.parametrize("activation_type", TYPES, ids=lambda t: "-".join(t))
@pytest.mark.parametrize("shape", [(8, 64), (2, 3, 20)])
def test_forward_and_grad(activation_type, shape):
    kx, kg = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, shape, F32) * 2
    y = te_jax.activation(x, activation_type)
    want = ref(x, activation_type)
    gated = len(activation_type) == 2
    assert y.shape == (shape[:-1] + (shape[-1] // 2,) if gated else shape)
    assert rel(y, want) <= 1e-5
    dy = jax.random.normal(kg, y.shape, F32)
    (dx,) = jax.vjp(lambda x: te_jax.activation(x, activation_type), x)[1](dy)
    (dx_ref,) = jax.vjp(lambda x: ref(x, activation_type), x)[1](dy)
    assert dx.shape == x.shape
    assert rel(dx, dx_ref) <= 1e-5


def test_jit_matches_eager():
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 32), F32)

    def loss(x):
        return jnp.sum(te_jax.activation(x, ("silu", "linear")) ** 2)

    np.testing.assert_array_equal(np.asarray(jax.grad(loss)(x)), np.asarray(jax.jit(jax.grad(loss))(x)))
    np.testing.assert_array_equal(
        np.asarray(te_jax.activation(x, ("gelu",))),
        np.asarray(jax.jit(lambda x: te_jax.activation(x, ("gelu",)))(x)),
    )


def test_bare_string_is_a_one_tuple():
    x = jax.random.normal(jax.random.PRNGKey(2), (4, 8), F32)
    np.testing.assert_array_equal(
        np.asarray(te_jax.activation(x, "relu")), np.asarray(te_jax.activation(x, ("relu",)))
    )


def test_bwd_dbias_and_fused_quantize():
    k1, k2 = jax.random.split(jax.random.PRNGKey(3))
    x = jax.random.normal(k1, (128, 256), F32)
    g = jax.random.normal(k2, (128, 128), F32)
    kind = _activation.activation_kind(("gelu", "linear"))
    dx, dbias = _activation.act_bwd(g, x, kind, dbias=True)
    (dx_ref,) = jax.vjp(lambda x: ref(x, ("gelu", "linear")), x)[1](g)
    assert rel(dx, dx_ref) <= 1e-5
    assert rel(dbias, dx_ref.sum(0)) <= 1e-5
    fp8 = _fused.Fp8Out(jnp.float8_e5m2, "per_tensor", True, True)
    q, dbias_q = _activation.act_bwd(g, x, kind, fp8=fp8, dbias=True)
    want = te_jax.quantize(dx, dtype=jnp.float8_e5m2, columnwise=True)
    np.testing.assert_array_equal(np.asarray(q.data).view(np.uint8), np.asarray(want.data).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(q.scale_inv), np.asarray(want.scale_inv))
    np.testing.assert_array_equal(np.asarray(dbias_q), np.asarray(dbias))
    # dbias + quantize (the identity case), per-tensor and block.
    for mode in ("per_tensor", "block_1d"):
        fp8 = _fused.Fp8Out(jnp.float8_e4m3fn, mode, True, True, mode != "per_tensor")
        q, db = _activation.dbias_quantize(x, fp8)
        want = te_jax.quantize(x, scaling_mode=mode, columnwise=True)
        for part in ("data", "scale_inv", "columnwise_data", "columnwise_scale_inv"):
            np.testing.assert_array_equal(
                np.asarray(getattr(q, part)).view(np.uint8),
                np.asarray(getattr(want, part)).view(np.uint8),
                err_msg=f"{mode} {part}",
            )
        assert rel(db, x.sum(0)) <= 1e-5


def test_fp8_forward_equals_act_then_quantize():
    x = jax.random.normal(jax.random.PRNGKey(4), (64, 256), F32)
    kind = _activation.activation_kind(("silu", "linear"))
    fp8 = _fused.Fp8Out(jnp.float8_e4m3fn, "per_tensor", True, True)
    q = _activation.act_fwd(x, kind, fp8)
    want = te_jax.quantize(_activation.act_fwd(x, kind), columnwise=True)
    assert q.shape == (64, 128)
    np.testing.assert_array_equal(np.asarray(q.data).view(np.uint8), np.asarray(want.data).view(np.uint8))
    np.testing.assert_array_equal(
        np.asarray(q.columnwise_data).view(np.uint8), np.asarray(want.columnwise_data).view(np.uint8)
    )
    np.testing.assert_array_equal(np.asarray(q.amax), np.asarray(want.amax))


def test_errors():
    x = jnp.ones((4, 7), F32)
    with pytest.raises(ValueError, match="activation_type: expected one of"):
        te_jax.activation(x, ("swish",))
    with pytest.raises(ValueError, match="activation_type: expected one of"):
        te_jax.activation(x, ("gelu", "gelu"))
    with pytest.raises(ValueError, match=r"gated activation expects an even last dim .* \(4, 7\)"):
        te_jax.activation(x, ("gelu", "linear"))
    with pytest.raises(TypeError, match="x.dtype: expected one of"):
        te_jax.activation(x.astype(jnp.int32), ("relu",))
    with pytest.raises(ValueError, match="x: expected shape"):
        te_jax.activation(jnp.float32(1.0), ("relu",))
