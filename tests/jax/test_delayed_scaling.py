"""DelayedScaling state in te_jax: step by step against a hand-computed history / scale sequence
(NUMERICS.md "DelayedScaling"), the scale each step quantizes with, and the Flax collection.

The expected sequence is computed here in numpy from the rule: history[0] = max(history[0],
amax of the step); amax' = max(history) ("max") or history[0] ("most_recent"); scale =
(fp8_max * 2^-margin) / amax' in fp32, kept when amax' is 0, inf or NaN; roll by one; [0] = 0.

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_delayed_scaling.py
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from _refs import emulated_linear, rel
from te_jax import recipe

ROLES = ("x", "kernel", "grad")


def expected_sequence(amaxes: dict, fp8_max: dict, length: int, margin=0.0, algo="max"):
    """[(state after step k)] from per-role lists of step amaxes."""
    hist = {r: np.zeros(length, np.float32) for r in amaxes}
    scale = {r: np.float32(1.0) for r in amaxes}
    out = []
    steps = len(next(iter(amaxes.values())))
    for k in range(steps):
        state = {}
        for r in amaxes:
            h = hist[r]
            a = np.float32(amaxes[r][k])
            h[0] = np.float32(np.nan) if np.isnan(a) or np.isnan(h[0]) else max(h[0], a)
            window = h[0] if algo == "most_recent" else (np.float32(np.nan) if np.isnan(h).any() else h.max())
            if np.isfinite(window) and window > 0:
                scaled_max = np.float32(np.float32(fp8_max[r]) * np.float32(2.0) ** np.float32(-margin))
                scale[r] = np.float32(scaled_max / np.float32(window))
            hist[r] = np.roll(h, -1)
            hist[r][0] = 0.0
            state[f"{r}_scale"] = np.array([scale[r]], np.float32)
            state[f"{r}_amax_history"] = hist[r].copy()
        out.append(state)
    return out


def unit_max(key, shape):
    """Random values in (-1, 1) with max |v| exactly 1 (so c * v has amax c)."""
    v = jax.random.uniform(key, shape, minval=-0.99, maxval=0.99)
    return v.at[(0,) * len(shape)].set(1.0)


def run_steps(r, factors_x, factors_dy, length):
    """Runs dense for each step with x = fx * base, dy = fd * base_dy; returns per step the
    (y, state after the step, state before it)."""
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    x0, dy0 = unit_max(ks[0], (64, 128)), unit_max(ks[1], (64, 32))
    w = unit_max(ks[2], (128, 32)) * 0.5
    state = te_jax.init_recipe_state(r, "dense")
    step = jax.jit(
        lambda x, st, dy: jax.vjp(lambda x, st: te_jax.dense(x, w, recipe=r, recipe_state=st), x, st)
    )
    out = []
    for fx, fd in zip(factors_x, factors_dy, strict=True):
        x = x0 * fx
        y, vjp = step(x, state, None)
        _, new_state = vjp(dy0 * fd)
        out.append((x, w, dy0 * fd, y, new_state, state))
        state = new_state
    return out


@pytest.mark.parametrize(
    "algo,margin,fmt",
    [
        ("max", 0.0, recipe.Format.HYBRID),
        ("most_recent", 0.0, recipe.Format.HYBRID),
        ("max", 1.0, recipe.Format.E4M3),
    ],
)
def test_state_sequence(algo, margin, fmt):
    length = 3
    r = recipe.DelayedScaling(amax_history_len=length, amax_compute_algo=algo, margin=margin, fp8_format=fmt)
    fx = [2.0, 0.5, 8.0, 1.0, 0.25]
    fd = [1e-3, 4.0, 0.5, 0.5, 2.0]
    steps = run_steps(r, fx, fd, length)
    grad_max = 57344.0 if fmt == recipe.Format.HYBRID else 448.0
    want = expected_sequence(
        {"x": fx, "kernel": [0.5] * 5, "grad": fd},
        {"x": 448.0, "kernel": 448.0, "grad": grad_max},
        length,
        margin,
        algo,
    )
    for k, (x, w, _dy, y, new_state, old_state) in enumerate(steps):
        for key, value in want[k].items():
            np.testing.assert_array_equal(np.asarray(new_state[key]), value, err_msg=f"step {k}: {key}")
        # step k quantizes with the scales the previous step left
        ey, _, _ = emulated_linear(x, w, None, r, old_state)
        assert rel(y, ey) <= 1e-6, (k, rel(y, ey))


def test_zero_and_nan_amax_keep_the_scale():
    r = recipe.DelayedScaling(amax_history_len=2)
    steps = run_steps(r, [4.0, 0.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0], 2)
    scales = [float(s[4]["x_scale"][0]) for s in steps]
    assert scales[0] == np.float32(448.0) / np.float32(4.0)
    assert scales[1] == scales[0]  # history still holds 4.0
    assert scales[2] == scales[0]  # window all zeros: the old scale stays
    assert scales[3] == np.float32(448.0) / np.float32(2.0)

    steps = run_steps(r, [4.0, float("nan"), 1.0, 1.0], [1.0] * 4, 2)
    scales = [float(s[4]["x_scale"][0]) for s in steps]
    assert np.isnan(np.asarray(steps[1][4]["x_amax_history"])).any()
    assert scales[1] == scales[0] and scales[2] == scales[0]  # NaN in the window: kept
    assert scales[3] == np.float32(448.0)  # the NaN has rolled out


def test_callables():
    seen = {}

    def amax_algo(history):
        return jnp.mean(history)

    def scale_algo(amax, scale, fp8_max, rec):
        seen["recipe"] = rec
        return jnp.float32(fp8_max) / (2 * amax)

    r = recipe.DelayedScaling(
        amax_history_len=2, amax_compute_algo=amax_algo, scaling_factor_compute_algo=scale_algo
    )
    steps = run_steps(r, [2.0, 6.0], [1.0, 1.0], 2)
    assert seen["recipe"] is r
    np.testing.assert_allclose(float(steps[0][4]["x_scale"][0]), 448.0 / (2 * 1.0), rtol=1e-7)  # mean(2, 0)
    np.testing.assert_allclose(float(steps[1][4]["x_scale"][0]), 448.0 / (2 * 4.0), rtol=1e-7)  # mean(6, 2)


def test_callables_and_state_of_the_wrong_kind_are_clear_errors():
    x, w = jnp.ones((16, 32)), jnp.ones((32, 16))

    def grads(r):
        state = te_jax.init_recipe_state(r, "dense")
        return jax.grad(lambda s: jnp.sum(te_jax.dense(x, w, recipe=r, recipe_state=s)))(state)

    r = recipe.DelayedScaling(amax_compute_algo=lambda h: h[:2])
    with pytest.raises(
        ValueError, match=r"DelayedScaling.amax_compute_algo: expected the callable to return one"
    ):
        grads(r)
    r = recipe.DelayedScaling(scaling_factor_compute_algo=lambda amax, scale, fp8_max, rec: jnp.ones(3))
    with pytest.raises(ValueError, match=r"scaling_factor_compute_algo: .*got shape \(3,\)"):
        grads(r)
    r = recipe.DelayedScaling()
    state = {k: np.asarray(v).tolist() for k, v in te_jax.init_recipe_state(r, "dense").items()}
    with pytest.raises(
        TypeError, match=r"recipe_state\['x_scale'\]: expected a float32 array of shape \(1,\), got list"
    ):
        te_jax.dense(x, w, recipe=r, recipe_state=state)  # was "expected shape (1,), got ()"


class _Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        y, _ = te_jax.flax.LayerNormMLP(intermediate_dim=128, activations=("gelu", "linear"))(x)
        return te_jax.flax.DenseGeneral(16)(y)


def test_flax_collection_updates():
    r = recipe.DelayedScaling(amax_history_len=4)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 32, 64))
    model = _Block()
    with te_jax.autocast(enabled=True, recipe=r):
        variables = model.init(jax.random.PRNGKey(0), x)
        metas = variables[te_jax.flax.FP8_COLLECTION_NAME]
        assert set(metas) == {"LayerNormMLP_0", "DenseGeneral_0"}
        assert set(metas["DenseGeneral_0"]) == {
            f"{r_}_{s}" for r_ in ROLES for s in ("scale", "amax_history")
        }
        params = nn.unbox(variables["params"])

        @jax.jit
        def step(params, metas, x):
            def loss(params, metas):
                y = model.apply({"params": params, "fp8_metas": metas}, x)
                return jnp.mean(y**2)

            return jax.grad(loss, argnums=(0, 1))(params, metas)

        for k in range(3):
            scale = jnp.asarray(metas["LayerNormMLP_0"]["fc1_x_scale"])
            grads, new_metas = step(params, metas, x)
            variables = te_jax.update_collections(
                {"fp8_metas": new_metas}, {"params": params, "fp8_metas": metas}
            )
            metas = variables["fp8_metas"]
            # fc1's input is the norm's output: its amax is the history's newest entry
            ln = te_jax.layernorm(x, params["LayerNormMLP_0"]["scale"], params["LayerNormMLP_0"]["ln_bias"])
            hist = np.asarray(metas["LayerNormMLP_0"]["fc1_x_amax_history"])
            assert hist[0] == 0 and hist[-1] == np.float32(jnp.max(jnp.abs(ln)))
            assert float(metas["LayerNormMLP_0"]["fc1_x_scale"][0]) == np.float32(448.0) / hist[-1]
            if k == 0:
                assert float(scale[0]) == 1.0
    # outside the region the module runs in high precision and needs no fp8_metas
    y_hp = model.apply({"params": params}, x)
    assert y_hp.shape == (2, 32, 16)


def test_compiled_step_copies_no_state_and_updates_in_one_call():
    """The jitted training step of a delayed-scaled block: XLA inserts no copy (of the state, or
    of a zeroed amax operand) ahead of te's custom calls, and each op's state update is one
    te_delayed_update_ffi call (not a few XLA fusions per role)."""
    r = recipe.DelayedScaling(amax_history_len=16)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 32, 64))
    model = _Block()
    with te_jax.autocast(enabled=True, recipe=r):
        variables = model.init(jax.random.PRNGKey(0), x)
        params, metas = nn.unbox(variables["params"]), variables[te_jax.flax.FP8_COLLECTION_NAME]

        def loss(params, metas):
            return jnp.mean(model.apply({"params": params, "fp8_metas": metas}, x) ** 2)

        hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, metas).compile().as_text()
    entry = hlo[hlo.index("ENTRY") :]
    copies = [line.strip() for line in entry.splitlines() if " copy(" in line]
    assert not copies, f"XLA copies in the step: {copies[:3]}"
    assert hlo.count('custom_call_target="te_delayed_update_ffi"') == 2  # LayerNormMLP, DenseGeneral


def test_update_call_errors_name_what_is_wrong():
    """te_delayed_update_ffi (te_jax's one update call) refuses mismatched operands with the C
    API's message naming the role's argument."""
    from te_core import _ops
    from te_jax import _ffi

    h, s = jnp.zeros((4,), jnp.float32), jnp.ones((1,), jnp.float32)
    specs = [_ops.TensorSpec((4,), _ops.FLOAT32), _ops.TensorSpec((1,), _ops.FLOAT32)]
    attrs = dict(margin=np.float32(0.0), amax_compute_algo=np.int32(0))

    def call(amax, fp8_max):
        return jax.block_until_ready(
            _ffi.call(_ffi.DELAYED_UPDATE, specs, h, s, amax, fp8_max=fp8_max, **attrs)
        )

    new_h, new_s = call(jnp.full((1,), 2.0, jnp.float32), np.array([448.0], np.float32))
    assert np.asarray(new_h).tolist() == [0.0, 0.0, 0.0, 2.0] and float(new_s[0]) == 224.0
    with pytest.raises(Exception, match=r"next\[0\]\.amaxes\[0\]\.shape: expected 1 element"):
        call(jnp.ones((2,), jnp.float32), np.array([448.0], np.float32))
    with pytest.raises(Exception, match="expected 3 operands .* per role"):
        call(jnp.ones((1,), jnp.float32), np.array([448.0, 57344.0], np.float32))
    with pytest.raises(Exception, match=r"role 0 \(groups\[0\]\) amax: expected an element type te knows"):
        call(jnp.ones((1,), jnp.int8), np.array([448.0], np.float32))


def test_missing_collection_is_a_clear_error():
    x = jnp.ones((2, 8, 32))
    model = te_jax.flax.DenseGeneral(16)
    params = model.init(jax.random.PRNGKey(0), x)["params"]
    with te_jax.autocast(enabled=True, recipe=recipe.DelayedScaling()):
        with pytest.raises(ValueError, match="DelayedScaling needs the variable fp8_metas/x_scale"):
            model.apply({"params": params}, x)
    with te_jax.autocast(enabled=True, recipe=recipe.DelayedScaling(amax_history_len=8)):
        variables = model.init(jax.random.PRNGKey(0), x)
    with te_jax.autocast(enabled=True, recipe=recipe.DelayedScaling(amax_history_len=16)):
        with pytest.raises(ValueError, match=r"fp8_metas/x_amax_history: expected shape \(16,\)"):
            model.apply(variables, x)
