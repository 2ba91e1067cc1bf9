"""te_jax._token_pad: under per-tensor and block FP8 each shard's token count is padded to a
multiple of 16 before te's GEMMs (copies of the last row forward, zero rows backward) and the
outputs are sliced back. The numerics with such counts are checked against the emulated
references in test_dense.py; here: the GEMMs really see padded counts, every op pads, the
padding is exact, and it is said once at INFO."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from te_jax import _linear, _token_pad, recipe
from te_jax._quantizer import plan_for

F32 = jnp.float32


@pytest.mark.parametrize(
    ("r", "rows", "count"),
    [
        (recipe.Float8CurrentScaling(), 21, 11),
        (recipe.DelayedScaling(), 32, 0),
        (recipe.Float8BlockScaling(), 1, 15),
        (None, 21, 0),
        (recipe.MXFP8BlockScaling(), 21, 0),
    ],
)
def test_count(r, rows, count):
    assert _token_pad.count(plan_for(r), rows) == count


def test_pad_copies_and_zeros():
    plan = plan_for(recipe.Float8CurrentScaling())
    x = jnp.arange(21 * 3, dtype=F32).reshape(21, 3)
    p, m = _token_pad.pad_copies(plan, x)
    assert m == 21 and p.shape == (32, 3)
    assert np.array_equal(p[:21], x) and np.array_equal(p[21:], np.broadcast_to(x[-1:], (11, 3)))
    z, m = _token_pad.pad_zeros(plan, x)
    assert m == 21 and np.array_equal(z[:21], x) and not np.asarray(z[21:]).any()


def _spy(monkeypatch):
    """The row count of every weight-gradient GEMM's operands (their reduction dim)."""
    seen = []
    real = _linear.mm

    def mm(a, b, **kw):
        if kw.get("trans_a"):
            seen.append((a.shape[0], b.shape[0]))
        return real(a, b, **kw)

    monkeypatch.setattr(_linear, "mm", mm)
    return seen


def _ops(h=64, f=96):
    ks = jax.random.split(jax.random.PRNGKey(3), 4)
    kernel = jax.random.normal(ks[0], (h, h), F32) / 8
    gamma = jnp.ones((h,), F32)
    beta = jax.random.normal(ks[3], (h,), F32) / 4
    k1 = jax.random.normal(ks[1], (h, 1, f), F32) / 8
    k2 = jax.random.normal(ks[2], (f, h), F32) / 8
    return {
        "dense": lambda x, r: te_jax.dense(x, kernel, recipe=r),
        "layernorm_dense": lambda x, r: te_jax.layernorm_dense(x, gamma, beta, kernel, recipe=r)[0],
        "layernorm_mlp": lambda x, r: te_jax.layernorm_mlp(x, gamma, beta, k1, None, k2, None, recipe=r)[0],
    }


@pytest.mark.parametrize("op", ["dense", "layernorm_dense", "layernorm_mlp"])
def test_every_op_pads_and_slices_back_exactly(op, monkeypatch):
    r = recipe.Float8CurrentScaling()
    f = _ops()[op]
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 7, 64), F32)
    loss = lambda x: (f(x, r) * jnp.arange(64, dtype=F32)).sum()  # noqa: E731
    seen = _spy(monkeypatch)
    y = f(x, r)
    g = jax.grad(loss)(x)
    assert y.shape == x.shape and g.shape == x.shape
    assert seen and all(rows == (32, 32) for rows in seen), seen
    # Exact: the 21 rows give what they give inside 32 real rows whose last 11 repeat row 20
    # (same amaxes, so the same scales), with zero gradient on the repeats.
    full = jnp.concatenate([x.reshape(21, 64), jnp.broadcast_to(x.reshape(21, 64)[-1:], (11, 64))])
    y_full = f(full, r)
    assert np.array_equal(np.asarray(y).reshape(21, 64), np.asarray(y_full)[:21])
    w = jnp.concatenate([jnp.ones((21, 1), F32), jnp.zeros((11, 1), F32)])
    g_full = jax.grad(lambda z: (f(z, r) * jnp.arange(64, dtype=F32) * w).sum())(full)
    assert np.array_equal(np.asarray(g).reshape(21, 64), np.asarray(g_full)[:21])


def test_said_once_at_info(caplog, monkeypatch):
    monkeypatch.setattr(_token_pad, "_told", False)
    f = _ops()["dense"]
    with caplog.at_level(logging.INFO, logger="te"):
        for n in (21, 22):
            jax.grad(lambda x: f(x, recipe.Float8CurrentScaling()).sum())(jnp.ones((n, 64), F32))
    said = [rec for rec in caplog.records if "multiple of 16" in rec.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO


@pytest.mark.parametrize("name", ["current", "block"])
@pytest.mark.parametrize("op", ["dense", "layernorm_dense", "layernorm_mlp"])
def test_inference_forward_makes_nothing_for_a_backward(op, name, monkeypatch):
    """Without jax.grad (the custom_vjp's primal) the forward quantizes no column-wise copy and,
    under per-tensor scaling, pads nothing (its GEMMs take 21 rows; cuBLASLt's 1x128 block GEMMs
    need a multiple of 4, so block pads), with the training forward's output bit for bit."""
    r = {"current": recipe.Float8CurrentScaling(), "block": recipe.Float8BlockScaling()}[name]
    f = _ops()[op]
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 7, 64), F32)
    y_train, _ = jax.vjp(lambda x: f(x, r), x)
    seen = []
    real = _linear.mm

    def mm(a, b, **kw):
        seen.append((a.shape[0], a.columnwise_data is None, b.data is None))
        return real(a, b, **kw)

    monkeypatch.setattr(_linear, "mm", mm)
    y = f(x, r)
    assert np.array_equal(np.asarray(y), np.asarray(y_train))
    rows = 21 if name == "current" else 32
    assert seen and all(s == (rows, True, True) for s in seen), seen
