"""Intermediate dropout (te_jax.flax.LayerNormMLP's intermediate_dropout_rate, TransformerLayer's
intermediate_dropout, te_jax.layernorm_mlp's dropout_rate) on the CPU backend, against a plain
fp32 jnp reference written here: norm, FC1, activation, mask * 1/keep, FC2.

Which mask the module drew: the mask depends only on the key and the shape, so an apply with
wi_kernel = 0, wi_bias = 1 and wo_kernel = I (intermediate_dim = hidden) returns act(1) / keep
where an element is kept and exactly 0 where it is dropped; the same key then masks any other
parameters the same way (were the mask to depend on anything else, the comparisons with the
reference would fail). At the op level the mask is flax.linen.Dropout's own, drawn from the
same key.

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_mlp_dropout.py
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from _refs import LOOSE, LOOSE_DEFAULT, RECIPES, rel
from te_jax.flax import LayerNormMLP, TransformerLayer

F32 = jnp.float32
HI = jax.lax.Precision.HIGHEST
TIGHT = 1e-5
H = 64  # hidden = intermediate_dim, so wo_kernel = I shows the mask
SHAPE = (4, 32, H)
# XLA's compile dominates these small graphs; its cheaper CPU settings (same numerics)
jit = functools.partial(
    jax.jit,
    compiler_options={"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True},
)


def _rand(seed, shape, scale=1.0, shift=0.0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale + shift, F32)


def _key(i):
    return jax.random.PRNGKey(i)


# ---- the reference (plain fp32 jnp) ----

_ACTS = {"gelu": lambda v: jax.nn.gelu(v, approximate=True), "silu": jax.nn.silu, "relu": jax.nn.relu}


def act_ref(pre, acts):
    out = _ACTS[acts[0]](pre[..., 0, :])
    return out * pre[..., 1, :] if len(acts) == 2 else out


def mlp_ref(p, x, acts, mask=None, keep=1.0):
    """LayerNorm (eps 1e-6) -> x @ wi_kernel + wi_bias -> act -> mask * (1 / keep) -> @ wo_kernel
    + wo_bias; mask None: no dropout."""
    a = act_ref(pre_ref(p, x), acts)
    if mask is not None:
        a = a * mask.astype(F32) * (1.0 / keep)
    return jnp.einsum("...f,fh->...h", a, p["wo_kernel"], precision=HI) + p.get("wo_bias", 0.0)


def pre_ref(p, x):
    """FC1's output [..., A, F] after the LayerNorm."""
    mu = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
    ln = (x - mu) * jax.lax.rsqrt(var + 1e-6) * p["scale"] + p["ln_bias"]
    return jnp.einsum("...h,haf->...af", ln, p["wi_kernel"], precision=HI) + p.get("wi_bias", 0.0)


def random_params(acts, seed=0):
    a = len(acts)
    return {
        "scale": _rand(seed, (H,), 0.1, 1.0),
        "ln_bias": _rand(seed + 1, (H,), 0.1),
        "wi_kernel": _rand(seed + 2, (H, a, H), 1 / np.sqrt(H)),
        "wi_bias": _rand(seed + 3, (a, H), 0.3),
        "wo_kernel": _rand(seed + 4, (H, H), 1 / np.sqrt(H)),
        "wo_bias": _rand(seed + 5, (H,), 0.3),
    }


ORDER = ("scale", "ln_bias", "wi_kernel", "wi_bias", "wo_kernel", "wo_bias")  # the op's arguments


def probe_params(acts):
    """pre = 1 everywhere, wo_kernel = I: the output is act(1) / keep where kept, 0 where dropped."""
    a = len(acts)
    return {
        "scale": jnp.ones((H,), F32),
        "ln_bias": jnp.zeros((H,), F32),
        "wi_kernel": jnp.zeros((H, a, H), F32),
        "wi_bias": jnp.ones((a, H), F32),
        "wo_kernel": jnp.eye(H, dtype=F32),
        "wo_bias": jnp.zeros((H,), F32),
    }


def model_of(acts=("gelu",), rate=0.3, dims=()):
    return LayerNormMLP(
        intermediate_dim=H,
        activations=acts,
        use_bias=True,
        intermediate_dropout_rate=rate,
        intermediate_hidden_dropout_dims=dims,
    )


@functools.cache
def _probe(acts, rate, dims, seed):
    model = model_of(acts, rate, dims)
    x = _rand(99, SHAPE)
    y = jit(lambda p, k: model.apply({"params": p}, x, rngs={"dropout": k})[0])(
        probe_params(acts), _key(seed)
    )
    return np.asarray(y)


def module_mask(acts=("gelu",), rate=0.3, dims=(), seed=1):
    """The mask the module draws from rngs={"dropout": PRNGKey(seed)} (bool, SHAPE)."""
    return jnp.asarray(_probe(tuple(acts), rate, tuple(dims), seed) != 0)


def fwd_bwd(fn, dy):
    """p, x -> (fn(p, x), its vjp with dy: (d params, dx))."""

    def run(p, x):
        y, vjp = jax.vjp(fn, p, x)
        return y, vjp(dy)

    return run


def init_det(model):
    return functools.partial(model.init, deterministic=True)


def _assert_close(got, want, tol):
    gl, wl = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(gl) == len(wl)
    for a, b in zip(gl, wl, strict=True):
        assert a.shape == b.shape and bool(jnp.all(jnp.isfinite(a))), a.shape
        assert rel(a, b) <= tol, (a.shape, rel(a, b))


# ---- the module against the reference, with the module's mask ----


@pytest.mark.parametrize("acts,dims", [(("gelu",), ()), (("silu", "linear"), (1,))])
def test_output_and_gradients_match_the_reference(acts, dims):
    rate = 0.3
    model = model_of(acts, rate, dims)
    mask = module_mask(acts, rate, dims, seed=1)
    p, x, dy = random_params(acts, 10), _rand(11, SHAPE, 1.5, 0.2), _rand(12, SHAPE)

    def fn(p, x):
        return model.apply({"params": p}, x, rngs={"dropout": _key(1)})[0]

    got = jit(fwd_bwd(fn, dy))(p, x)
    want = fwd_bwd(lambda p, x: mlp_ref(p, x, acts, mask, 1 - rate), dy)(p, x)
    _assert_close(got, want, TIGHT)  # y, then d params (every one) and dx
    # the dropout really acted: without the mask the reference is far off
    assert rel(got[0], mlp_ref(p, x, acts)) > 0.1


def test_probe_values_are_act_one_over_keep():
    """The probe's kept values are gelu(1) / keep (the 1/keep scaling), dropped ones exactly 0."""
    for rate in (0.3, 0.75):
        y = _probe(("gelu",), rate, (), 1)
        kept = y[y != 0]
        want = float(jax.nn.gelu(1.0, approximate=True)) / (1 - rate)
        np.testing.assert_allclose(kept, want, rtol=1e-6)


def test_op_mask_is_flax_dropouts():
    """te_jax.layernorm_mlp(dropout_rate, dropout_rng, dropout_broadcast_dims) masks as
    flax.linen.Dropout(rate, broadcast_dims) does with the same key."""
    acts, rate, dims, key = ("gelu",), 0.25, (0,), _key(7)
    p, x = random_params(acts, 20), _rand(21, SHAPE)
    kw = dict(activations=acts, dropout_rate=rate, dropout_broadcast_dims=dims)

    @jit
    def op(p, x, k):
        return te_jax.layernorm_mlp(x, *(p[n] for n in ORDER), dropout_rng=k, **kw)[0]

    y = op(p, x, key)
    flax_out = nn.Dropout(rate, broadcast_dims=dims).apply({}, jnp.ones(SHAPE), deterministic=False, rng=key)
    mask = flax_out != 0
    assert rel(y, mlp_ref(p, x, acts, mask, 1 - rate)) <= TIGHT
    assert bool(jnp.all(mask == mask[:1]))  # dims (0,): one draw for the whole batch


def test_deterministic_and_rate_zero_keep_the_fused_path():
    """deterministic=True (and no 'dropout' key) equals rate 0 bit for bit, under each recipe
    state path (high precision; DelayedScaling's gelu inside the GEMMs; current scaling), and
    the no-dropout reference."""
    acts = ("gelu",)
    p, x, dy = random_params(acts, 30), _rand(31, SHAPE, 1.5, 0.2), _rand(32, SHAPE)
    drop, plain = model_of(acts, 0.5), model_of(acts, 0.0)
    for name in (None, "delayed", "current"):
        r = RECIPES.get(name)
        with te_jax.autocast(enabled=r is not None, recipe=r):
            v = jit(plain.init)(_key(0), x)
            metas = v.get("fp8_metas")

            def run(model, det, p, x, metas=metas):
                v = {"params": p} if metas is None else {"params": p, "fp8_metas": metas}
                fn = functools.partial(model.apply, deterministic=det)
                y, vjp = jax.vjp(lambda v, x: fn(v, x)[0], v, x)
                return y, vjp(dy)

            got = jit(functools.partial(run, drop, True))(p, x)
            want = jit(functools.partial(run, plain, False))(p, x)
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        if name is None:
            assert rel(got[0], mlp_ref(p, x, acts)) <= TIGHT


def test_same_key_same_mask_other_keys_differ():
    acts = ("gelu",)
    model, p, x = model_of(acts, 0.3), random_params(acts, 40), _rand(41, SHAPE)
    f = jit(lambda k: model.apply({"params": p}, x, rngs={"dropout": k})[0])
    a, b, c = f(_key(1)), f(_key(1)), f(_key(2))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert rel(a, c) > 0.05
    assert float(jnp.mean(module_mask(seed=1) != module_mask(seed=2))) > 0.2


def test_broadcast_dims_share_one_draw():
    none, seq, batch_seq = module_mask(dims=()), module_mask(dims=(1,)), module_mask(dims=(0, 1))
    assert bool(jnp.all(seq == seq[:, :1, :]))  # constant along dim 1
    assert not bool(jnp.all(seq == seq[:1]))  # but drawn per batch row
    assert bool(jnp.all(batch_seq == batch_seq[:1, :1, :]))
    assert not bool(jnp.all(none == none[:, :1, :]))
    np.testing.assert_array_equal(np.asarray(module_mask(dims=(-2,))), np.asarray(seq))


@pytest.mark.parametrize("rate", [0.3, 0.75])
def test_kept_fraction_is_one_minus_rate(rate):
    mask = module_mask(rate=rate)  # 8192 draws: the fraction's standard deviation is <= 0.006
    assert abs(float(jnp.mean(mask)) - (1 - rate)) < 0.03


# ---- quantized ----


@pytest.mark.parametrize("name", ["delayed", "current"])
def test_fp8_recipes_close_to_the_reference(name):
    """Finite and loosely the high-precision reference with the same mask (and far from one
    with another mask); jit and grad."""
    acts, rate = ("gelu",), 0.3
    r = RECIPES[name]
    model = model_of(acts, rate)
    p, x, dy = random_params(acts, 50), _rand(51, SHAPE, 1.5, 0.2), _rand(52, SHAPE)
    with te_jax.autocast(enabled=True, recipe=r):
        metas = jit(init_det(model))(_key(0), x).get("fp8_metas")

        def fn(p, x):
            v = {"params": p} if metas is None else {"params": p, "fp8_metas": metas}
            return model.apply(v, x, rngs={"dropout": _key(1)})[0]

        got = jit(fwd_bwd(fn, dy))(p, x)
    mask = module_mask(acts, rate, seed=1)
    want = fwd_bwd(lambda p, x: mlp_ref(p, x, acts, mask, 1 - rate), dy)(p, x)
    _assert_close(got, want, LOOSE_DEFAULT)
    y_ref = want[0]
    assert rel(got[0], y_ref) > 1e-4  # quantized
    other = mlp_ref(p, x, acts, module_mask(acts, rate, seed=2), 1 - rate)
    assert rel(got[0], other) > 2 * LOOSE_DEFAULT


def test_padded_tokens_under_fp8():
    """40 tokens, padded to 48 for the FP8 GEMMs (_token_pad): the mask is padded alike (op
    level, flax.linen.Dropout's mask from the same key as the oracle)."""
    acts, rate, key, shape = ("gelu",), 0.3, _key(8), (2, 20, H)
    p, x, dy = random_params(acts, 22), _rand(23, shape, 1.5, 0.2), _rand(24, shape)

    def op(p, x):
        args = (x, *(p[n] for n in ORDER))
        return te_jax.layernorm_mlp(
            *args, activations=acts, recipe=RECIPES["current"], dropout_rate=rate, dropout_rng=key
        )[0]

    got = jit(fwd_bwd(op, dy))(p, x)
    mask = nn.Dropout(rate).apply({}, jnp.ones(shape), deterministic=False, rng=key) != 0
    _assert_close(got, fwd_bwd(lambda p, x: mlp_ref(p, x, acts, mask, 1 - rate), dy)(p, x), LOOSE_DEFAULT)


def test_every_recipe_runs_jits_and_grads():
    acts, rate = ("silu", "linear"), 0.2
    model = model_of(acts, rate)
    p, x = random_params(acts, 60), _rand(61, SHAPE, 1.5, 0.2)
    with te_jax.autocast(enabled=True, recipe=RECIPES["delayed"]):
        metas = jit(init_det(model))(_key(0), x)["fp8_metas"]

    @jit
    def run(p):
        out = {}
        for name, r in RECIPES.items():
            with te_jax.autocast(enabled=True, recipe=r):
                v = {"params": p, "fp8_metas": metas} if name == "delayed" else {"params": p}

                def loss(p, v=v):
                    y = model.apply({**v, "params": p}, x, rngs={"dropout": _key(3)})[0]
                    return jnp.sum(jnp.sin(0.1 * y)), y

                out[name] = jax.value_and_grad(loss, has_aux=True)(p)
        return out

    out = run(p)
    mask = module_mask(acts, rate, seed=3)

    def ref_loss(p):
        y = mlp_ref(p, x, acts, mask, 1 - rate)
        return jnp.sum(jnp.sin(0.1 * y)), y

    (_, y_ref), g_ref = jax.value_and_grad(ref_loss, has_aux=True)(p)
    for name, ((_, y), g) in out.items():
        tol = LOOSE.get(name, LOOSE_DEFAULT)
        assert bool(jnp.all(jnp.isfinite(y))) and rel(y, y_ref) <= tol, (name, rel(y, y_ref))
        for k in g:
            err = rel(g[k], g_ref[k])
            assert bool(jnp.all(jnp.isfinite(g[k]))) and err <= 2 * tol, (name, k, err)


def test_delayed_state_is_the_same_with_and_without_dropout():
    """The params and fp8_metas trees do not depend on dropout: init deterministic, train with
    dropout (and the other way round); the recorded fc2_x amax is the dropped activation's."""
    acts, rate = ("gelu",), 0.5
    model = model_of(acts, rate)
    x = _rand(71, SHAPE, 1.5, 0.2)
    r = RECIPES["delayed"]
    with te_jax.autocast(enabled=True, recipe=r):
        v_det = jit(init_det(model))(_key(0), x)
        v_drop = jit(model.init)({"params": _key(0), "dropout": _key(5)}, x)
        assert jax.tree_util.tree_structure(v_det) == jax.tree_util.tree_structure(v_drop)
        for a, b in zip(jax.tree_util.tree_leaves(v_det), jax.tree_util.tree_leaves(v_drop), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # params and initial state

        def step(v, det):
            def loss(v):
                return jnp.sum(model.apply(v, x, deterministic=det, rngs={"dropout": _key(1)})[0] ** 2)

            return jax.grad(loss)(v)

        g = jit(functools.partial(step, det=False))(nn.unbox(v_det))  # init deterministic, train dropping
        g_det = jit(functools.partial(step, det=True))(nn.unbox(v_drop))
    assert jax.tree_util.tree_structure(g) == jax.tree_util.tree_structure(nn.unbox(v_det))
    assert jax.tree_util.tree_structure(g_det) == jax.tree_util.tree_structure(g)
    for leaf in jax.tree_util.tree_leaves(g):
        assert bool(jnp.all(jnp.isfinite(leaf)))
    # the next state: fc2_x's amax is that of the dropped (x 1/keep) activation, not the plain one
    p = nn.unbox(v_det)["params"]
    mask = module_mask(acts, rate, seed=1)
    pre = pre_ref(p, x)
    want = float(jnp.max(jnp.abs(act_ref(pre, acts) * mask / (1 - rate))))
    plain = float(jnp.max(jnp.abs(act_ref(pre, acts))))
    # the step's amax, rolled to the history's end (its slot 0 is the next step's)
    got = float(g["fp8_metas"]["fc2_x_amax_history"][-1])
    got_det = float(g_det["fp8_metas"]["fc2_x_amax_history"][-1])
    assert abs(got - want) <= 0.05 * want, (got, want)
    assert abs(got_det - plain) <= 0.05 * plain, (got_det, plain)


# ---- on a mesh ----


def test_mesh_matches_one_device():
    """Data and tensor parallel (F split): the same mask, the same numbers."""
    acts = ("gelu",)
    model, p, x = model_of(acts, 0.3), random_params(acts, 80), _rand(81, SHAPE)

    def step(p, x):
        def loss(p):
            return jnp.sum(jnp.sin(model.apply({"params": p}, x, rngs={"dropout": _key(1)})[0]))

        return jax.value_and_grad(loss)(p)

    want = jit(step)(p, x)
    mesh = jax.make_mesh((2, 2), ("data", "model"))
    resource = te_jax.MeshResource(dp_resource="data", tp_resource="model")
    with jax.set_mesh(mesh), te_jax.autocast(enabled=False, mesh_resource=resource):
        got = jit(step)(p, x)
    _assert_close(got, want, TIGHT)


# ---- TransformerLayer ----


def test_transformer_layer_defaults_train_with_dropout():
    """TE's defaults (intermediate_dropout=0.1 among them): init and a training step with
    deterministic=False."""
    x = _rand(90, (2, 16, 64), 1.5, 0.2)
    model = TransformerLayer(64, 128, 4)
    params = nn.unbox(jit(model.init)(_key(0), x)["params"])  # deterministic=False: used to raise

    @jit
    def train_step(p, k):
        def loss(p):
            return jnp.mean(model.apply({"params": p}, x, rngs={"dropout": k}) ** 2)

        value, g = jax.value_and_grad(loss)(p)
        return value, jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g), g

    value, new, g = train_step(params, _key(1))
    assert np.isfinite(float(value))
    for leaf in jax.tree_util.tree_leaves(g):
        assert bool(jnp.all(jnp.isfinite(leaf)))
    assert float(jnp.abs(g["mlp"]["wo_kernel"]).max()) > 0
    assert float(train_step(new, _key(1))[0]) < float(value)


def test_transformer_layer_intermediate_dropout_is_the_mlps():
    """Only intermediate_dropout on: deterministic=False changes the output (same key: the same
    output); at rate 0 it changes nothing."""
    x = _rand(91, (2, 16, 64), 1.5, 0.2)
    kw = dict(hidden_dropout=0.0, attention_dropout=0.0)
    on = TransformerLayer(64, 128, 4, intermediate_dropout=0.5, **kw)
    off = TransformerLayer(64, 128, 4, intermediate_dropout=0.0, **kw)
    params = nn.unbox(jit(init_det(on))(_key(0), x)["params"])

    @jit
    def run(p):
        def f(m, det, k=1):
            return m.apply({"params": p}, x, deterministic=det, rngs={"dropout": _key(k)})

        return f(on, True), f(on, False), f(on, False), f(on, False, 2), f(off, False)

    det, a, b, c, zero = run(params)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert rel(a, det) > 0.02 and rel(a, c) > 0.02
    np.testing.assert_array_equal(np.asarray(zero), np.asarray(det))


# ---- errors ----


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"intermediate_dropout_rate": 1.0},
         r"LayerNormMLP.intermediate_dropout_rate: expected a float in \[0, 1\), got 1.0"),
        ({"intermediate_dropout_rate": -0.1},
         r"LayerNormMLP.intermediate_dropout_rate: expected a float in \[0, 1\), got -0.1"),
        ({"intermediate_dropout_rate": 0.1, "intermediate_hidden_dropout_dims": (3,)},
         r"LayerNormMLP.intermediate_hidden_dropout_dims: expected a tuple of dims .* got \(3,\)"),
    ],
)  # fmt: skip
def test_module_errors_name_the_attribute(kw, message):
    with pytest.raises(ValueError, match=message):
        LayerNormMLP(intermediate_dim=H, **kw).init(_key(0), _rand(0, SHAPE), deterministic=True)


def test_op_errors_name_the_argument():
    acts = ("gelu",)
    p, x = random_params(acts), _rand(0, SHAPE)
    args = (x, *(p[n] for n in ORDER))
    with pytest.raises(
        ValueError, match="dropout_rng: expected a jax.random key for dropout_rate=0.1, got None"
    ):
        te_jax.layernorm_mlp(*args, dropout_rate=0.1)
    with pytest.raises(ValueError, match=r"dropout_rate: expected a float in \[0, 1\), got 1.5"):
        te_jax.layernorm_mlp(*args, dropout_rate=1.5, dropout_rng=_key(0))
    with pytest.raises(ValueError, match=r"dropout_broadcast_dims: expected a tuple of dims"):
        te_jax.layernorm_mlp(*args, dropout_rate=0.1, dropout_rng=_key(0), dropout_broadcast_dims=(3,))
