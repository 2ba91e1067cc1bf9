"""te_jax.layernorm_dense and te_jax.layernorm_mlp on the CPU backend: forward and jax.grad in
high precision and under each recipe.

References (_refs.py; normwise relative error): high precision against plain jnp fp32, <= 1e-5;
under a recipe, against the emulated reference (the same quantized operands, fp32 GEMMs),
<= 1e-5, and against unquantized fp32, loose (0.15 for E4M3/E5M2, 0.35 for NVFP4).

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_fused_ops.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from _refs import (
    HI,
    LOOSE,
    LOOSE_DEFAULT,
    RECIPES,
    emulated_linear,
    emulated_mlp,
    make_mlp,
    mlp_ref,
    norm_ref,
    rel,
)
from te_jax import recipe

TIGHT = 1e-5
# The emulation's GEMMs (jnp.matmul) round differently from te's scaled FP8 GEMM in the last fp32
# bit, and a 1-ulp change in a value that current scaling then quantizes to E4M3 can flip that
# element's rounding (1/16 of it): the few flips in dpre of current_e4m3's case move the gradients
# upstream of it by ~2.5e-4 of their norm. Recipes with E4M3 current-scaled gradients get room
# for that, no more (a wrong scale or layout is >= 1e-2).
FLIP_TOLERANT = {"current_e4m3": 2e-3}
GRADS = ("dx", "dgamma", "dbeta", "dkernel_1", "dbias_1", "dkernel_2", "dbias_2")


def _mlp(r, acts, kind="layernorm", **kw):
    state = te_jax.init_recipe_state(r, "layernorm_mlp")

    def f(x, g, b, k1, b1, k2, b2):
        y, _ = te_jax.layernorm_mlp(
            x, g, b, k1, b1, k2, b2, activations=acts, layernorm_type=kind, recipe=r, recipe_state=state, **kw
        )
        return y

    return f


def _value_and_vjp(f, args, dy):
    def run(*args):
        y, vjp = jax.vjp(f, *args)
        return y, vjp(dy)

    return jax.jit(run)(*args)


@pytest.mark.parametrize(
    "acts,kind,bias",
    [
        (("gelu",), "layernorm", True),
        (("gelu", "linear"), "layernorm", False),
        (("silu", "linear"), "rmsnorm", True),
    ],
)
def test_mlp_high_precision(acts, kind, bias):
    x, g, b, k1, b1, k2, b2, dy = make_mlp(acts=acts, bias=bias)
    b = None if kind == "rmsnorm" else b
    args = (x, g, b, k1, b1, k2, b2)
    y, grads = _value_and_vjp(_mlp(None, acts, kind), args, dy)
    y_ref, vjp_ref = jax.vjp(lambda *a: mlp_ref(*a, acts, kind=kind), *args)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert rel(y, y_ref) <= TIGHT, rel(y, y_ref)
    for name, a, r in zip(GRADS, grads, vjp_ref(dy), strict=True):
        if r is None:
            assert a is None, name
            continue
        assert a.shape == r.shape, name
        assert rel(a, r) <= TIGHT, (name, rel(a, r))


# every recipe, plain and gated activations among them; the emulated formats (slow to compile) once
MLP_RECIPE_CASES = [
    ("delayed", ("gelu",)),
    ("delayed", ("silu", "linear")),
    ("current", ("gelu",)),
    ("block", ("silu", "linear")),
    ("current_e4m3", ("gelu", "linear")),
    ("mxfp8", ("gelu",)),
    ("nvfp4", ("silu", "linear")),
]


@pytest.mark.parametrize("name,acts", MLP_RECIPE_CASES)
def test_mlp_recipes(name, acts):
    r = RECIPES[name]
    x, g, b, k1, b1, k2, b2, dy = make_mlp(acts=acts, seed=3)
    args = (x, g, b, k1, b1, k2, b2)
    y, grads = _value_and_vjp(_mlp(r, acts), args, dy)
    scales = te_jax.init_recipe_state(r, "layernorm_mlp")
    ey, egrads = emulated_mlp(*args, dy, r, acts, scales=scales)
    assert rel(y, ey) <= TIGHT, rel(y, ey)
    tight = FLIP_TOLERANT.get(name, TIGHT)
    for gname, a, e in zip(GRADS, grads, egrads, strict=True):
        assert rel(a, e) <= tight, (gname, rel(a, e))
    y_ref, vjp_ref = jax.vjp(lambda *a: mlp_ref(*a, acts), *args)
    loose = LOOSE.get(name, LOOSE_DEFAULT)
    assert rel(y, y_ref) <= loose, rel(y, y_ref)
    for gname, a, e in zip(GRADS, grads, vjp_ref(dy), strict=True):
        assert rel(a, e) <= loose, (gname, rel(a, e))


def test_mlp_bfloat16_against_fp32():
    acts = ("gelu", "linear")
    x, g, b, k1, b1, k2, b2, dy = make_mlp(acts=acts, seed=4)
    args16 = [None if a is None else a.astype(jnp.bfloat16) for a in (x, g, b, k1, b1, k2, b2)]
    y, vjp = jax.vjp(_mlp(RECIPES["current"], acts), *args16)
    assert y.dtype == jnp.bfloat16
    grads = vjp(dy.astype(jnp.bfloat16))
    for a, p in zip(grads, args16, strict=True):
        assert a.dtype == p.dtype
    args32 = [None if a is None else a.astype(jnp.float32) for a in args16]
    y_ref, vjp_ref = jax.vjp(lambda *a: mlp_ref(*a, acts), *args32)
    assert rel(y, y_ref) <= 0.15
    for gname, a, e in zip(GRADS, grads, vjp_ref(dy.astype(jnp.bfloat16).astype(jnp.float32)), strict=True):
        assert rel(a, e) <= 0.15, gname


@pytest.mark.parametrize("r", [None, RECIPES["delayed"]], ids=["hp", "delayed"])
def test_mlp_return_layernorm_output(r):
    acts = ("gelu",)
    x, g, b, k1, b1, k2, b2, dy = make_mlp(acts=acts, seed=5)
    state = te_jax.init_recipe_state(r, "layernorm_mlp")
    w = jax.random.normal(jax.random.PRNGKey(9), x.shape)

    def loss(x, g, b, ret):
        y, ln = te_jax.layernorm_mlp(
            x,
            g,
            b,
            k1,
            b1,
            k2,
            b2,
            activations=acts,
            return_layernorm_output=ret,
            recipe=r,
            recipe_state=state,
        )
        total = jnp.sum(y * dy)
        return total + jnp.sum(ln * w) if ret else total

    _, ln = te_jax.layernorm_mlp(
        x, g, b, k1, b1, k2, b2, return_layernorm_output=True, recipe=r, recipe_state=state
    )
    assert rel(ln, norm_ref(x, g, b)) <= TIGHT
    # ln_out's own cotangent reaches x, gamma and beta through the norm's backward
    g_both = jax.grad(loss, argnums=(0, 1, 2))(x, g, b, True)
    g_mlp = jax.grad(loss, argnums=(0, 1, 2))(x, g, b, False)
    g_ln = jax.grad(lambda x, g, b: jnp.sum(norm_ref(x, g, b) * w), argnums=(0, 1, 2))(x, g, b)
    for a, m, n in zip(g_both, g_mlp, g_ln, strict=True):
        assert rel(a, m + n) <= 1e-5


def _mlp_step(r, acts):
    """jit of (y, grads of the seven arrays, the next recipe state) of layernorm_mlp."""

    def f(x, g, b, k1, b1, k2, b2, state, dy):
        def op(x, g, b, k1, b1, k2, b2, state):
            return te_jax.layernorm_mlp(
                x, g, b, k1, b1, k2, b2, activations=acts, recipe=r, recipe_state=state
            )[0]

        y, vjp = jax.vjp(op, x, g, b, k1, b1, k2, b2, state)
        return y, vjp(dy)

    return jax.jit(f)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_mlp_delayed_gelu_runs_in_the_gemms(dtype, bias, monkeypatch):
    """DelayedScaling with ("gelu",): FC1's GEMM writes gelu's FP8 copies and FC2's dgrad the
    gelu backward's (te_gemm_act_ffi, te/gemm.h's fused forms, one call each), with the bytes
    of the separate GEMM and activation calls: y, every gradient and the next state alike."""
    r, acts = RECIPES["delayed"], ("gelu",)
    x, g, b, k1, b1, k2, b2, dy = make_mlp(acts=acts, bias=bias, seed=8, dtype=dtype)
    state = te_jax.init_recipe_state(r, "layernorm_mlp")
    # a non-trivial state, so the scales the fused calls take matter
    state = jax.tree_util.tree_map(lambda v: v * 2.0 if v.shape == (1,) else v, state)
    args = (x, g, b, k1, b1, k2, b2, state, dy)

    def infer(*a):  # the primal alone: the inference forward, no column-wise copies
        return te_jax.layernorm_mlp(*a[:7], activations=acts, recipe=r, recipe_state=a[7])[0]

    fused = _mlp_step(r, acts)
    assert fused.lower(*args).as_text().count("te_gemm_act_ffi") == 2
    y, grads = fused(*args)
    y_infer = jax.jit(infer)(*args[:8])
    monkeypatch.setattr(te_jax._layernorm_mlp, "gelu_in_gemm", lambda q, kind: False)
    separate = _mlp_step(r, acts)
    assert separate.lower(*args).as_text().count("te_gemm_act_ffi") == 0
    y0, grads0 = separate(*args)
    np.testing.assert_array_equal(np.asarray(y_infer.astype(jnp.float32)), np.asarray(y0.astype(jnp.float32)))
    leaves, leaves0 = jax.tree_util.tree_leaves((y, grads)), jax.tree_util.tree_leaves((y0, grads0))
    assert len(leaves) == len(leaves0) == 1 + 5 + (2 if bias else 0) + len(state)
    for a, c in zip(leaves, leaves0, strict=True):
        np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(c.astype(jnp.float32)))
    assert float(jnp.abs(grads[3]).sum()) > 0


@pytest.mark.parametrize("name,acts", [("current", ("gelu",)), ("delayed", ("gelu", "linear"))])
def test_mlp_other_recipes_and_activations_run_separately(name, acts):
    """Only delayed scaling's plain gelu has its scale before the GEMM runs: the rest call the
    activation kernels."""
    r = RECIPES[name]
    x, g, b, k1, b1, k2, b2, dy = make_mlp(acts=acts, seed=9)
    state = te_jax.init_recipe_state(r, "layernorm_mlp")
    text = _mlp_step(r, acts).lower(x, g, b, k1, b1, k2, b2, state, dy).as_text()
    assert text.count("te_gemm_act_ffi") == 0 and text.count("te_act_fwd_ffi") == 1


@pytest.mark.parametrize(
    "name,kind",
    [
        ("hp", "layernorm"),
        ("hp", "rmsnorm"),
        ("current", "rmsnorm"),
        ("block", "layernorm"),
        ("delayed", "layernorm"),
        ("mxfp8", "rmsnorm"),
    ],
)
def test_layernorm_dense(name, kind):
    r = None if name == "hp" else RECIPES[name]
    x, g, b, k1, b1, _, _, dy = make_mlp(seed=6, f=192)
    b = None if kind == "rmsnorm" else b
    kernel, bias = k1[:, 0, :], b1[0]
    dy = dy[..., :1].repeat(192, -1) * jax.random.normal(jax.random.PRNGKey(2), (192,))
    state = te_jax.init_recipe_state(r, "layernorm_dense")

    def f(x, g, b, k, bias):
        return te_jax.layernorm_dense(x, g, b, k, bias, layernorm_type=kind, recipe=r, recipe_state=state)[0]

    y, grads = _value_and_vjp(f, (x, g, b, kernel, bias), dy)

    def ref(x, g, b, k, bias):
        return jnp.matmul(norm_ref(x, g, b, kind=kind), k, precision=HI) + bias

    y_ref, vjp_ref = jax.vjp(ref, x, g, b, kernel, bias)
    if r is None:
        assert rel(y, y_ref) <= TIGHT
        for a, e in zip(grads, vjp_ref(dy), strict=True):
            assert (a is None and e is None) or rel(a, e) <= TIGHT
        return
    # emulated: te's norm output quantized, fp32 GEMMs; the norm's backward from te's kernel
    ln, ln_vjp = jax.vjp(lambda x, g, b: te_jax.layernorm(x, g, b, layernorm_type=kind), x, g, b)
    ey, edln, edk = emulated_linear(ln.reshape(-1, 128), kernel, dy.reshape(-1, 192), r, state)
    assert rel(y, ey.reshape(y.shape) + bias) <= TIGHT
    edx, edg, edb = ln_vjp(edln.reshape(x.shape))
    for a, e in zip(grads, (edx, edg, edb, edk, jnp.sum(dy, (0, 1))), strict=True):
        assert (a is None and e is None) or rel(a, e) <= TIGHT
    for a, e in zip((y,) + tuple(grads), (y_ref,) + tuple(vjp_ref(dy)), strict=True):
        assert (a is None and e is None) or rel(a, e) <= LOOSE_DEFAULT


@pytest.mark.parametrize("r", [RECIPES["current"], RECIPES["delayed"]], ids=["current", "delayed"])
def test_jit_matches_eager(r):
    acts = ("gelu", "linear")
    x, g, b, k1, b1, k2, b2, dy = make_mlp(acts=acts, seed=7)
    f = _mlp(r, acts)

    def loss(*a):
        return jnp.sum(f(*a) * dy)

    grad = jax.grad(loss, argnums=tuple(range(7)))
    for a, c in zip(grad(x, g, b, k1, b1, k2, b2), jax.jit(grad)(x, g, b, k1, b1, k2, b2), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-6, atol=1e-6)
        assert float(jnp.abs(a).sum()) > 0


def test_errors():
    acts = ("gelu", "linear")
    x, g, b, k1, b1, k2, b2, _ = make_mlp(acts=acts)
    mlp = te_jax.layernorm_mlp
    with pytest.raises(ValueError, match=r"kernel_1: expected shape \(128, 2, F\)"):
        mlp(x, g, b, k1[:, :1], b1, k2, b2, activations=acts)
    with pytest.raises(ValueError, match=r"kernel_2: expected shape \(256, 128\)"):
        mlp(x, g, b, k1, b1, k2[:100], b2, activations=acts)
    with pytest.raises(ValueError, match=r"bias_1: expected shape \(2, 256\)"):
        mlp(x, g, b, k1, b1[0], k2, b2, activations=acts)
    with pytest.raises(ValueError, match="activations: expected one of"):
        mlp(x, g, b, k1, b1, k2, b2, activations=("tanh", "linear"))
    with pytest.raises(TypeError, match="kernel_1.dtype: expected x's dtype float32"):
        mlp(x, g, b, k1.astype(jnp.bfloat16), b1, k2, b2, activations=acts)
    with pytest.raises(TypeError, match="x.dtype: expected one of"):
        mlp(x.astype(jnp.int32), g, b, k1, b1, k2, b2, activations=acts)
    with pytest.raises(ValueError, match="recipe_state: DelayedScaling needs its state"):
        mlp(x, g, b, k1, b1, k2, b2, activations=acts, recipe=recipe.DelayedScaling())
    bad = te_jax.init_recipe_state(recipe.DelayedScaling(amax_history_len=4), "layernorm_mlp")
    with pytest.raises(ValueError, match=r"recipe_state\['fc1_x_amax_history'\]: expected shape \(16,\)"):
        mlp(
            x,
            g,
            b,
            k1,
            b1,
            k2,
            b2,
            activations=acts,
            recipe=recipe.DelayedScaling(amax_history_len=16),
            recipe_state=bad,
        )
    with pytest.raises(ValueError, match="recipe_state: expected None"):
        mlp(x, g, b, k1, b1, k2, b2, activations=acts, recipe=recipe.Float8CurrentScaling(), recipe_state=bad)
    with pytest.raises(TypeError, match="recipe: expected None or a te_jax.recipe recipe"):
        mlp(x, g, b, k1, b1, k2, b2, activations=acts, recipe="fp8")
    with pytest.raises(ValueError, match="rng: NVFP4BlockScaling rounds gradients stochastically"):
        jax.jit(
            jax.grad(
                lambda x: jnp.sum(
                    mlp(x, g, b, k1, b1, k2, b2, activations=acts, recipe=recipe.NVFP4BlockScaling())[0]
                )
            )
        ).lower(x)
    with pytest.raises(ValueError, match=r"kernel: expected shape \[128, N\]"):
        te_jax.layernorm_dense(x, g, b, k2)
    with pytest.raises(ValueError, match="beta: expected None for layernorm_type='rmsnorm'"):
        te_jax.layernorm_dense(x, g, b, k1[:, 0], layernorm_type="rmsnorm")


def test_fused_gelu_pieces_refuse_a_split_sum():
    """gelu (and its backward) inside a GEMM must see the whole sum: the pieces refuse a
    row-parallel FC1 / column-parallel FC2 dgrad rather than apply gelu to partial sums."""
    from te_jax import _linear
    from te_jax._quantizer import plan_for

    plan = plan_for(RECIPES["delayed"])
    with pytest.raises(ValueError, match="axes.k: expected no row-parallel split"):
        _linear.linear_gelu_fwd(
            plan, _linear.Roles(), _linear.LinearAxes(k=("model",)), *[None] * 4, "x", (), None
        )
    with pytest.raises(ValueError, match="axes.n: expected no column-parallel split"):
        _linear.linear_dgelu_bwd(
            plan, "grad", _linear.LinearAxes(n=("model",)), (None, None), None, None, False, (), {}, None
        )
