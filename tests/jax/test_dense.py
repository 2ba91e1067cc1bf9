"""te_jax.dense on the CPU backend: forward and jax.grad, high precision and under each recipe.

References (NUMERICS.md "How to test numerics"), normwise relative error:
  - high precision: plain jnp in fp32, <= 1e-5;
  - FP8 recipes: tight (<= 1e-5) against the emulated reference: the very copies te's GEMMs read,
    quantized with te_jax.quantize and dequantized, then jnp fp32 math (dy in the backward format:
    E5M2 under Format.HYBRID); loose (<= 0.1) against the unquantized fp32 reference;
  - NVFP4BlockScaling's defaults (stochastic rounding): tight against the numpy oracle's copies
    (_jax_oracle.py, te's Philox bits for the key), rounded to BF16 as te_gemm multiplies them.

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_dense.py
"""

from __future__ import annotations

import dataclasses
import re

import _jax_oracle as oracle
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from te_jax import recipe

F32 = jnp.float32
E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
HI = jax.lax.Precision.HIGHEST


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def make(m=256, k=256, n=128, lead=(2,), seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    x = jax.random.normal(ks[0], lead + (m // max(1, int(np.prod(lead))), k), F32)
    w = jax.random.normal(ks[1], (k, n), F32) / np.sqrt(k)
    b = jax.random.normal(ks[2], (n,), F32)
    dy = jax.random.normal(ks[3], x.shape[:-1] + (n,), F32)
    return x, w, b, dy


def ref_dense(x, w, b):
    y = jnp.matmul(x, w, precision=HI)
    return y if b is None else y + b


@pytest.mark.parametrize("use_bias", [True, False])
def test_high_precision(use_bias):
    x, w, b, dy = make()
    b = b if use_bias else None
    y, vjp = jax.vjp(te_jax.dense, x, w, b)
    y_ref, vjp_ref = jax.vjp(ref_dense, x, w, b)
    assert y.shape == y_ref.shape and rel(y, y_ref) <= 1e-5
    for name, a, r in zip(("dx", "dkernel", "dbias"), vjp(dy), vjp_ref(dy), strict=False):
        if r is None:
            assert a is None
            continue
        assert a.shape == r.shape, name
        assert rel(a, r) <= 1e-5, (name, rel(a, r))


def _q(t, mode, dtype, pow2, copy):
    q = te_jax.quantize(t, dtype=dtype, scaling_mode=mode, columnwise=True, force_pow2_scales=pow2)
    if copy == "columnwise":
        q = dataclasses.replace(q, data=None, scale_inv=None)
    return q.dequantize(F32)


def emulated(x, w, b, dy, r):
    """The emulated reference of dense under recipe r: (y, dx, dw, db)."""
    if isinstance(r, recipe.Float8BlockScaling):
        mode = {1: "block_1d", 2: "block_2d"}
        xm, wm, gm = (
            mode[r.x_block_scaling_dim],
            mode[r.w_block_scaling_dim],
            mode[r.grad_block_scaling_dim],
        )
        fwd = bwd = E4M3
        pow2 = not r.use_f32_scales
    else:
        xm = wm = gm = "per_tensor"
        fwd, bwd = E4M3, (E5M2 if r.fp8_format == recipe.Format.HYBRID else E4M3)
        pow2 = r.use_power_2_scales
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    y = jnp.matmul(_q(x2, xm, fwd, pow2, "rowwise"), _q(w, wm, fwd, pow2, "columnwise"), precision=HI)
    y = y + (0 if b is None else b)
    dx = jnp.matmul(_q(dy2, gm, bwd, pow2, "rowwise"), _q(w, wm, fwd, pow2, "rowwise").T, precision=HI)
    dw = jnp.matmul(_q(x2, xm, fwd, pow2, "columnwise").T, _q(dy2, gm, bwd, pow2, "columnwise"), precision=HI)
    return y.reshape(dy.shape), dx.reshape(x.shape), dw, dy2.sum(0)


RECIPES = {
    "current_hybrid": recipe.Float8CurrentScaling(),
    "current_e4m3": recipe.Float8CurrentScaling(fp8_format=recipe.Format.E4M3),
    "current_pow2": recipe.Float8CurrentScaling(use_power_2_scales=True),
    "block": recipe.Float8BlockScaling(),
    "block_f32": recipe.Float8BlockScaling(use_f32_scales=True),
}


# (tokens, leading dims): 21 and 37 tokens run padded to 32 and 48 (te_jax._token_pad)
TOKENS = {"256": (256, (2,)), "21": (21, (3,)), "37": (37, (1,))}


@pytest.mark.parametrize("tokens", list(TOKENS))
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("name", list(RECIPES))
def test_recipe_against_emulated_and_fp32(name, use_bias, tokens):
    r = RECIPES[name]
    m, lead = TOKENS[tokens]
    x, w, b, dy = make(m=m, lead=lead, seed=1)
    b = b if use_bias else None
    f = lambda x, w, b: te_jax.dense(x, w, b, recipe=r)  # noqa: E731
    y, vjp = jax.vjp(f, x, w, b)
    dx, dw, db = vjp(dy)
    ey, edx, edw, edb = emulated(x, w, b, dy, r)
    assert rel(y, ey) <= 1e-5, rel(y, ey)
    assert rel(dx, edx) <= 1e-5, rel(dx, edx)
    assert rel(dw, edw) <= 1e-5, rel(dw, edw)
    y_ref, vjp_ref = jax.vjp(ref_dense, x, w, b)
    rdx, rdw, rdb = vjp_ref(dy)
    assert rel(y, y_ref) <= 0.1 and rel(dx, rdx) <= 0.1 and rel(dw, rdw) <= 0.1
    if use_bias:
        assert rel(db, edb) <= 1e-5
    else:
        assert db is None


def _seed_offset(key):
    """te_jax's map of a key to te's Philox (seed, offset) (te_jax.quantize's rng)."""
    b = [int(v) for v in np.asarray(jax.random.bits(key, (4,), jnp.uint32))]
    return b[0] | b[1] << 32, b[2] | b[3] << 32


def test_nvfp4_default_recipe_stochastic_rounding():
    """NVFP4BlockScaling() as a user gets it (stochastic rounding and Hadamard transform of the
    gradient, 16x16 weight tiles, the input's transform), jitted with the key as an argument: tight
    against the numpy oracle's quantization of every operand copy (dy's drawing te's Philox bits
    for the key), each rounded to BF16 as te_gemm multiplies it; loose against fp32."""
    r = recipe.NVFP4BlockScaling()
    x, w, _, dy = make(m=64, k=96, n=48, seed=3)
    traces = []

    @jax.jit
    def run(x, w, key):
        traces.append(key)
        y, vjp = jax.vjp(lambda x, w: te_jax.dense(x, w, recipe=r, rng=key), x, w)
        return (y, *vjp(dy))

    bf16 = lambda v: np.asarray(v, np.float32).astype(jnp.bfloat16).astype(np.float64)  # noqa: E731
    x2, dy2 = np.asarray(x).reshape(-1, 96), np.asarray(dy).reshape(-1, 48)
    m, n = dy2.shape
    words = np.arange(m * n, dtype=np.uint64)
    results = []
    for key in (jax.random.PRNGKey(0), jax.random.PRNGKey(1)):
        y, dx, dw = run(x, w, key)
        seed, offset = _seed_offset(key)
        wq = bf16(oracle.nvfp4(np.asarray(w), square=True))  # one 16x16 quantization, both copies
        dy_row = bf16(oracle.nvfp4(dy2, words=words.reshape(m, n), seed=seed, offset=offset))
        dy_col = bf16(
            oracle.nvfp4(oracle.rht(dy2.T), words=(m * n + words).reshape(n, m), seed=seed, offset=offset)
        )
        x_col = bf16(oracle.nvfp4(oracle.rht(x2.T)))
        assert rel(y, (bf16(oracle.nvfp4(x2)) @ wq).reshape(y.shape)) <= 1e-5
        assert rel(dx, (dy_row @ wq.T).reshape(x.shape)) <= 1e-5
        assert rel(dw, x_col @ dy_col.T) <= 1e-5  # the transforms cancel in the product
        y_ref, vjp_ref = jax.vjp(lambda x, w: ref_dense(x, w, None), x, w)
        for a, e in zip((y, dx, dw), (y_ref, *vjp_ref(dy)), strict=True):
            assert rel(a, e) <= 0.35
        results.append(np.asarray(dx))
    assert len(traces) == 1  # the key is data: one trace serves every step
    assert not np.array_equal(results[0], results[1])


@pytest.mark.parametrize(
    "r", [None, RECIPES["current_hybrid"], RECIPES["block"]], ids=["hp", "current", "block"]
)
def test_jit_matches_eager(r):
    x, w, b, _ = make(seed=2)

    def loss(x, w, b):
        return jnp.sum(te_jax.dense(x, w, b, recipe=r) ** 2)

    g = jax.grad(loss, argnums=(0, 1, 2))
    for a, c in zip(g(x, w, b), jax.jit(g)(x, w, b), strict=False):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-6, atol=1e-6)
        assert float(jnp.abs(a).sum()) > 0


def test_errors():
    x, w, b, _ = make()
    with pytest.raises(ValueError, match=r"x: expected shape \[\.\.\., 256\]"):
        te_jax.dense(x[..., :100], w)
    with pytest.raises(ValueError, match=r"kernel: expected shape \[K, N\]"):
        te_jax.dense(x, w[None])
    with pytest.raises(ValueError, match=r"bias: expected shape \(128,\)"):
        te_jax.dense(x, w, b[:5])
    with pytest.raises(TypeError, match="kernel.dtype: expected x's dtype float32"):
        te_jax.dense(x, w.astype(jnp.bfloat16))
    with pytest.raises(TypeError, match="x.dtype: expected one of"):
        te_jax.dense(x.astype(jnp.int32), w)
    with pytest.raises(
        ValueError, match="recipe_state: DelayedScaling needs its state: a dict with grad_amax_history"
    ):
        te_jax.dense(x, w, recipe=recipe.DelayedScaling())
    with pytest.raises(ValueError, match=r"recipe_state: missing 'x_scale'"):
        te_jax.dense(x, w, recipe=recipe.DelayedScaling(), recipe_state={"scale": 1.0})
    with pytest.raises(
        ValueError, match=r"recipe_state: expected None \(only DelayedScaling keeps scaling state\)"
    ):
        te_jax.dense(x, w, recipe=recipe.Float8CurrentScaling(), recipe_state={"scale": 1.0})
    with pytest.raises(TypeError, match="recipe: expected None or a te_jax.recipe recipe"):
        te_jax.dense(x, w, recipe="fp8")
    # per-tensor and block FP8: K and N multiples of 16 on every platform (cuBLASLt's rule)
    for r in (recipe.Float8CurrentScaling(), recipe.Float8BlockScaling()):
        with pytest.raises(ValueError, match=r"kernel's K \(x's last dim\): .* and it is 40;"):
            te_jax.dense(x[..., :40], w[:40], recipe=r)
        with pytest.raises(ValueError, match=r"kernel's N \(the output's last dim\): .* and it is 24;"):
            te_jax.dense(x, w[:, :24], recipe=r)
    assert te_jax.dense(x[..., :40], w[:40]).shape == x.shape[:-1] + (128,)  # high precision: any size
    h = 256
    g = jnp.ones((h,), F32)
    with pytest.raises(ValueError, match=r"F \(kernel_1's last dim\): .* and it is 40;"):
        te_jax.layernorm_mlp(
            x,
            g,
            g,
            jnp.ones((h, 1, 40), F32),
            None,
            jnp.ones((40, h), F32),
            None,
            recipe=recipe.Float8CurrentScaling(),
        )
    with pytest.raises(NotImplementedError, match="recipe: CustomRecipe is not supported by te_jax"):
        te_jax.dense(x, w, recipe=recipe.CustomRecipe(qfactory=lambda role: None))


@pytest.mark.parametrize("name", ["current", "block"])
def test_float32_bias_is_added_in_the_output_dtype(name):
    # TE's rule (and cuBLASLt's fused FP8 epilogue): a float32 bias beside bf16 activations is
    # rounded to bf16 and then added, so it gives exactly the bf16-stored bias's output; its
    # gradient stays float32.
    r = {"current": recipe.Float8CurrentScaling(), "block": recipe.Float8BlockScaling()}[name]
    x, w, b, dy = make()
    x, w, dy = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), dy.astype(jnp.bfloat16)
    y32, vjp32 = jax.vjp(lambda x, w, b: te_jax.dense(x, w, b, recipe=r), x, w, b)
    b16 = b.astype(jnp.bfloat16)
    y16, vjp16 = jax.vjp(lambda x, w, b: te_jax.dense(x, w, b, recipe=r), x, w, b16)
    assert y32.dtype == jnp.bfloat16 and np.array_equal(np.asarray(y32, F32), np.asarray(y16, F32))
    g32, g16 = vjp32(dy), vjp16(dy)
    assert np.array_equal(np.asarray(g32[0], F32), np.asarray(g16[0], F32))
    assert np.array_equal(np.asarray(g32[1], F32), np.asarray(g16[1], F32))
    assert g32[2].dtype == F32 and g16[2].dtype == jnp.bfloat16
    assert np.array_equal(np.asarray(g32[2].astype(jnp.bfloat16), F32), np.asarray(g16[2], F32))


_FAST = recipe.MMParams(use_split_accumulator=False)


@pytest.mark.parametrize(
    "r, want",
    [
        (recipe.DelayedScaling(), ("0", "1", "1")),
        (recipe.DelayedScaling(fp8_gemm_dgrad=_FAST, fp8_gemm_wgrad=_FAST), ("0", "0", "0")),
        (recipe.Float8CurrentScaling(fp8_gemm_dgrad=_FAST), ("0", "0", "1")),
    ],
    ids=["delayed", "delayed_fast_bwd", "current_fast_dgrad"],
)
def test_recipe_split_accumulation_reaches_each_gemm(r, want):
    """DenseGeneral's three te_gemm calls carry the recipe's fp8_gemm_fprop / _dgrad / _wgrad
    (the CPU backend accumulates exactly either way, so the lowered calls are what can be
    checked here)."""
    m = te_jax.flax.DenseGeneral(features=32)
    x = jnp.ones((16, 32), F32)
    with te_jax.autocast(enabled=True, recipe=r):
        v = m.init(jax.random.PRNGKey(0), x)
        text = (
            jax.jit(jax.grad(lambda v, x: jnp.sum(m.apply(v, x) ** 2), argnums=(0, 1))).lower(v, x).as_text()
        )
    pattern = r"trans_a = (\w+).*trans_b = (\w+).*use_split_accumulator = (-?\d+)"
    flags = {}
    for line in text.splitlines():
        if "te_gemm" in line:
            a, b, split = re.search(pattern, line).groups()
            flags[(a, b)] = split
    # fprop x w, dgrad dy w^T, wgrad x^T dy
    assert (flags[("false", "false")], flags[("false", "true")], flags[("true", "false")]) == want
