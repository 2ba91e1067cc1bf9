"""te_jax.flax modules on the CPU backend: parameters as TE names them, numbers against plain
Flax / jnp in fp32 (tight, normwise <= 1e-5), under each recipe against the functional op they
wrap (exactly: the wiring) and unquantized fp32 (loose), gradients through jax.grad, jit.

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_flax_modules.py
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from _refs import HI, LOOSE, LOOSE_DEFAULT, RECIPES, mlp_ref, norm_ref, rel
from te_jax import recipe
from te_jax.flax import DenseGeneral, LayerNorm, LayerNormDenseGeneral, LayerNormMLP

TIGHT = 1e-5


def _x(shape=(2, 32, 64), seed=0, dtype=jnp.float32):
    return (jax.random.normal(jax.random.PRNGKey(seed), shape) * 1.5 + 0.2).astype(dtype)


def _shapes(tree):
    return jax.tree_util.tree_map(lambda a: tuple(a.shape), nn.unbox(tree))


def _abstract_init(model, x):
    return jax.eval_shape(model.init, jax.random.PRNGKey(0), x)


def test_parameters_as_te_names_them():
    x = _x()
    v = _abstract_init(LayerNormMLP(intermediate_dim=96, activations=("silu", "linear"), use_bias=True), x)
    assert _shapes(v["params"]) == {
        "scale": (64,),
        "ln_bias": (64,),
        "wi_kernel": (64, 2, 96),
        "wi_bias": (2, 96),
        "wo_kernel": (96, 64),
        "wo_bias": (64,),
    }
    assert nn.get_partition_spec(v)["params"]["wi_kernel"] == jax.sharding.PartitionSpec(
        "embed", "act", "mlp"
    )
    assert nn.get_partition_spec(v)["params"]["wo_kernel"] == jax.sharding.PartitionSpec("mlp", "embed")
    v = _abstract_init(LayerNormDenseGeneral(48, layernorm_type="rmsnorm", use_bias=True), x)
    assert _shapes(v["params"]) == {"scale": (64,), "kernel": (64, 48), "bias": (48,)}
    v = _abstract_init(DenseGeneral((4, 8), kernel_axes=("embed", "heads", "kv")), x)
    assert _shapes(v["params"]) == {"kernel": (64, 4, 8), "bias": (4, 8)}
    v = LayerNorm(zero_centered_gamma=True).init(jax.random.PRNGKey(0), x)
    assert _shapes(v["params"]) == {"scale": (64,), "ln_bias": (64,)}
    assert float(jnp.abs(nn.unbox(v["params"])["scale"]).max()) == 0.0  # zero-centered: starts at 0


@pytest.mark.parametrize("features,axis", [(48, -1), ((4, 8), -1), (40, (-2, -1))])
def test_dense_general_against_flax(features, axis):
    x = _x()
    te_model = DenseGeneral(features, axis=axis)
    ref_model = nn.DenseGeneral(features, axis=axis, precision=HI)
    params = nn.unbox(te_model.init(jax.random.PRNGKey(1), x)["params"])

    def te_loss(p, x):
        return jnp.sum(jnp.sin(te_model.apply({"params": p}, x)))

    def ref_loss(p, x):
        return jnp.sum(jnp.sin(ref_model.apply({"params": p}, x)))

    y, y_ref = te_model.apply({"params": params}, x), ref_model.apply({"params": params}, x)
    assert y.shape == y_ref.shape and rel(y, y_ref) <= TIGHT
    g = jax.grad(te_loss, argnums=(0, 1))(params, x)
    g_ref = jax.grad(ref_loss, argnums=(0, 1))(params, x)
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_ref), strict=True):
        assert rel(a, b) <= TIGHT


@pytest.mark.parametrize("kind,zcg", [("layernorm", False), ("layernorm", True), ("rmsnorm", False)])
def test_layernorm_against_reference(kind, zcg):
    x = _x()
    model = LayerNorm(layernorm_type=kind, zero_centered_gamma=zcg, epsilon=1e-5)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), x)["params"])
    params = jax.tree_util.tree_map(
        lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(3), p.shape), params
    )

    def ref(p, x):
        return norm_ref(x, p["scale"], p.get("ln_bias"), 1e-5, kind, zcg)

    y, vjp = jax.vjp(lambda p, x: model.apply({"params": p}, x), params, x)
    y_ref, vjp_ref = jax.vjp(ref, params, x)
    assert rel(y, y_ref) <= TIGHT
    dy = _x(seed=4)
    for a, b in zip(jax.tree_util.tree_leaves(vjp(dy)), jax.tree_util.tree_leaves(vjp_ref(dy)), strict=True):
        assert rel(a, b) <= TIGHT
    if kind == "layernorm" and not zcg:
        flax_ref = nn.LayerNorm(epsilon=1e-5).apply(
            {"params": {"scale": params["scale"], "bias": params["ln_bias"]}}, x
        )
        assert rel(y, flax_ref) <= TIGHT


@pytest.mark.parametrize("ret", [False, True])
def test_layernorm_dense_general(ret):
    x = _x()
    model = LayerNormDenseGeneral(48, use_bias=True, return_layernorm_output=ret, depth_scaling=0.5)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), x)["params"])
    y, ln = model.apply({"params": params}, x)
    ln_ref = norm_ref(x, params["scale"], params["ln_bias"])
    y_ref = 0.5 * (jnp.matmul(ln_ref, params["kernel"], precision=HI) + params["bias"])
    assert rel(y, y_ref) <= TIGHT
    assert (ln is None) != ret and (not ret or rel(ln, ln_ref) <= TIGHT)
    no_ln = LayerNormDenseGeneral(48, enable_layernorm=False)
    p2 = nn.unbox(no_ln.init(jax.random.PRNGKey(0), x)["params"])
    assert set(p2) == {"kernel"}
    assert rel(no_ln.apply({"params": p2}, x)[0], jnp.matmul(x, p2["kernel"], precision=HI)) <= TIGHT


@pytest.mark.parametrize("acts", [("gelu",), ("silu", "linear")])
def test_layernorm_mlp_against_reference(acts):
    x = _x()
    model = LayerNormMLP(intermediate_dim=96, activations=acts, use_bias=True)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), x)["params"])

    def ref(p, x):
        return mlp_ref(
            x, p["scale"], p["ln_bias"], p["wi_kernel"], p["wi_bias"], p["wo_kernel"], p["wo_bias"], acts
        )

    y, vjp = jax.vjp(lambda p, x: model.apply({"params": p}, x)[0], params, x)
    y_ref, vjp_ref = jax.vjp(ref, params, x)
    assert rel(y, y_ref) <= TIGHT
    dy = _x(seed=5)
    for a, b in zip(jax.tree_util.tree_leaves(vjp(dy)), jax.tree_util.tree_leaves(vjp_ref(dy)), strict=True):
        assert rel(a, b) <= TIGHT


# the module wires the same op under every recipe; test_fused_ops covers each recipe's numerics
@pytest.mark.parametrize("name", ["delayed", "block"])
def test_layernorm_mlp_recipes(name):
    r = RECIPES[name]
    x = _x(seed=6)
    acts = ("gelu", "linear")
    model = LayerNormMLP(intermediate_dim=128, activations=acts)
    with te_jax.autocast(enabled=True, recipe=r):
        variables = model.init(jax.random.PRNGKey(0), x)
        params = nn.unbox(variables["params"])
        state = variables.get("fp8_metas")

        def module_loss(p, x):
            v = {"params": p} if state is None else {"params": p, "fp8_metas": state}
            return jnp.sum(jnp.sin(model.apply(v, x)[0]))

        g = jax.jit(jax.value_and_grad(module_loss, argnums=(0, 1)))(params, x)

    def op_loss(p, x):
        y, _ = te_jax.layernorm_mlp(
            x, p["scale"], p["ln_bias"], p["wi_kernel"], None, p["wo_kernel"], None,
            activations=acts, recipe=r, recipe_state=state,
        )  # fmt: skip
        return jnp.sum(jnp.sin(y))

    def ref_loss(p, x):
        return jnp.sum(
            jnp.sin(mlp_ref(x, p["scale"], p["ln_bias"], p["wi_kernel"], None, p["wo_kernel"], None, acts))
        )

    g_op = jax.jit(jax.value_and_grad(op_loss, argnums=(0, 1)))(params, x)
    g_ref = jax.value_and_grad(ref_loss, argnums=(0, 1))(params, x)
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_op), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    loose = LOOSE.get(name, LOOSE_DEFAULT)
    for a, b in zip(jax.tree_util.tree_leaves(g[1]), jax.tree_util.tree_leaves(g_ref[1]), strict=True):
        assert rel(a, b) <= loose


@pytest.mark.parametrize("name", ["current", "delayed"])
def test_dense_modules_recipes(name):
    r = RECIPES[name]
    x = _x(seed=7)
    for model in (DenseGeneral(64), LayerNormDenseGeneral(64)):
        with te_jax.autocast(enabled=True, recipe=r):
            variables = model.init(jax.random.PRNGKey(0), x)
            out = model.apply(variables, x)
        p = nn.unbox(variables["params"])
        y = out[0] if isinstance(out, tuple) else out
        state = variables.get("fp8_metas")
        if isinstance(model, DenseGeneral):
            want = te_jax.dense(x, p["kernel"], p["bias"], recipe=r, recipe_state=state)
            ref = jnp.matmul(x, p["kernel"], precision=HI) + p["bias"]
        else:
            want = te_jax.layernorm_dense(
                x, p["scale"], p["ln_bias"], p["kernel"], recipe=r, recipe_state=state
            )[0]
            ref = jnp.matmul(norm_ref(x, p["scale"], p["ln_bias"]), p["kernel"], precision=HI)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
        assert rel(y, ref) <= LOOSE_DEFAULT


def test_jit_matches_eager_and_bfloat16():
    x = _x(dtype=jnp.bfloat16)
    model = LayerNormMLP(intermediate_dim=64, dtype=jnp.bfloat16)
    with te_jax.autocast(enabled=True, recipe=recipe.Float8CurrentScaling()):
        params = nn.unbox(model.init(jax.random.PRNGKey(0), x)["params"])
        assert all(p.dtype == jnp.bfloat16 for p in jax.tree_util.tree_leaves(params))

        def loss(p, x):
            y, _ = model.apply({"params": p}, x)
            assert y.dtype == jnp.bfloat16
            return jnp.sum(y.astype(jnp.float32) ** 2)

        eager = jax.grad(loss)(params, x)
        jitted = jax.jit(jax.grad(loss))(params, x)
    for a, b in zip(jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(jitted), strict=True):
        assert a.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-2, atol=1e-2)


def test_errors():
    x = _x()
    with pytest.raises(ValueError, match="axis: expected the input's trailing dims"):
        DenseGeneral(8, axis=0).init(jax.random.PRNGKey(0), x)
    with pytest.raises(NotImplementedError, match="enable_low_rank_adaptation=True is not supported"):
        DenseGeneral(8, enable_low_rank_adaptation=True).init(jax.random.PRNGKey(0), x)
    with pytest.raises(
        ValueError, match=r"kernel_axes: expected 2 logical axis names for kernel of shape \(64, 8\)"
    ):
        DenseGeneral(8, kernel_axes=("embed",)).init(jax.random.PRNGKey(0), x)
    with pytest.raises(
        ValueError, match=r"LayerNormMLP.intermediate_dropout_rate: expected a float in \[0, 1\)"
    ):
        LayerNormMLP(intermediate_dim=8, intermediate_dropout_rate=1.0).init(jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match="axis: expected -1"):
        LayerNormDenseGeneral(8, axis=(-2, -1)).init(jax.random.PRNGKey(0), x)
    with pytest.raises(
        ValueError, match="layernorm_type: expected 'layernorm' or 'rmsnorm', got 'batchnorm'"
    ):
        LayerNorm(layernorm_type="batchnorm").init(jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match="LayerNormMLP.activations: expected one of"):
        LayerNormMLP(intermediate_dim=8, activations=("tanh",)).init(jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match=r"x: expected shape \[\.\.\., 64\]"):
        model = DenseGeneral(8)
        v = model.init(jax.random.PRNGKey(0), x)
        te_jax.dense(x[..., :32], nn.unbox(v["params"])["kernel"])


@pytest.mark.parametrize(
    "model,error,message",
    [
        (DenseGeneral(0), ValueError, r"DenseGeneral.features: expected an int >= 1 .*, got 0"),
        (DenseGeneral(-3), ValueError, r"DenseGeneral.features: expected an int >= 1 .*, got -3"),
        (DenseGeneral((4, 0)), ValueError, r"DenseGeneral.features: .*got \(4, 0\)"),
        (DenseGeneral(2.5), ValueError, r"DenseGeneral.features: .*got 2.5"),
        (DenseGeneral(8, axis=True), ValueError, "axis: expected an int or a tuple of ints"),
        (
            DenseGeneral(8, dtype=jnp.int32),
            TypeError,
            r"DenseGeneral.dtype \(the parameters'\): expected one",
        ),
        (DenseGeneral(8, kernel_axes="ab"), TypeError, "kernel_axes: expected a tuple of logical axis names"),
        (LayerNorm(dtype=jnp.complex64), TypeError, r"LayerNorm.dtype \(the parameters'\): .*got complex64"),
        (
            LayerNorm(scale_axes="embed"),
            TypeError,
            r"scale_axes: .*got the string 'embed'; write \('embed',\)",
        ),
        (LayerNormDenseGeneral(0), ValueError, "LayerNormDenseGeneral.features: expected an int >= 1"),
        (LayerNormDenseGeneral(8, depth_scaling="a"), TypeError, "depth_scaling: expected None or a float"),
        (
            LayerNormMLP(intermediate_dim=0),
            ValueError,
            "LayerNormMLP.intermediate_dim: expected an int >= 1, got 0",
        ),
        (
            LayerNormMLP(intermediate_dim=(8, 8)),
            ValueError,
            "LayerNormMLP.intermediate_dim: expected an int >= 1",
        ),
        (
            LayerNormMLP(intermediate_dim=8, activations=()),
            ValueError,
            r"LayerNormMLP.activations: .*got \(\)",
        ),
        (
            LayerNormMLP(intermediate_dim=8, activations=None),
            ValueError,
            "LayerNormMLP.activations: .*got None",
        ),
    ],
)
def test_module_argument_errors_name_the_argument(model, error, message):
    # each was a raw ZeroDivisionError / TypeError / ValueError from flax's initializers or jnp
    # (or, for a string of axis names, a silent split into one name per character)
    with pytest.raises(error, match=message):
        model.init(jax.random.PRNGKey(0), _x())


def test_input_shape_errors_name_the_module():
    with pytest.raises(ValueError, match=r"LayerNorm: expected x of shape \[\.\.\., H\]"):
        LayerNorm().init(jax.random.PRNGKey(0), jnp.ones(()))  # was an IndexError
    with pytest.raises(ValueError, match=r"DenseGeneral: expected x's contracted dims \(1,\) to hold"):
        DenseGeneral(8).init(jax.random.PRNGKey(0), jnp.ones((4, 0)))  # was a ZeroDivisionError
    with pytest.raises(TypeError, match="kernel: expected a jax array, got NoneType"):
        te_jax.dense(jnp.ones((4, 32)), None)
