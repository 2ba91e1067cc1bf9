"""te_jax.flax.TransformerLayer (and RelativePositionBiases) on the CPU backend: TE's defaults and
parameter tree, the layer against a composition of plain fp32 references from its params tree
(the attention references of test_flax_attention.py, _refs' norm and MLP, T5's bucketing written
with scalars), dropout and stochastic depth, FP8 recipes, a mesh, errors.

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_flax_transformer.py
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from _refs import LOOSE, LOOSE_DEFAULT, RECIPES, mlp_ref, norm_ref, rel
from te_jax.flax import (
    DotProductAttention,
    MultiHeadAttention,
    RelativePositionBiases,
    TransformerLayer,
    TransformerLayerType,
)
from test_flax_attention import (
    TIGHT,
    _check,
    _leaves,
    _rand,
    fwd_bwd,
    jit,
    mask_ref,
    mha_ref,
    padding_mask,
    random_params,
)

ENC, DEC = TransformerLayerType.ENCODER, TransformerLayerType.DECODER


def _x(shape=(2, 16, 64), seed=0):
    return _rand(seed, shape, scale=1.5, shift=0.2)


def _shapes(tree):
    return jax.tree_util.tree_map(lambda a: tuple(a.shape), nn.unbox(tree))


def _abstract(model, *args, **kw):
    # the inputs closed over (self attention is `inputs_q is inputs_kv` while tracing)
    return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *args, **kw))["params"]


def t5_bucket(key_minus_query, bidirectional, num_buckets=32, max_distance=128):
    """T5's relative position bucket of one distance, with scalars."""
    n = -key_minus_query
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return bucket + n
    far = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return bucket + min(far, num_buckets - 1)


def rel_bias_ref(table, sq, skv, bidirectional):
    idx = np.array([[t5_bucket(j - i, bidirectional) for j in range(skv)] for i in range(sq)])
    return table[:, idx][None]


def layer_ref(p, x, enc=None, *, heads, groups, self_mask, cross_mask=None, rel_bias=None, acts=("relu",),
              kind="layernorm", zcg=False, post_ln=False, output_ln=False, rope=None, branch=(1.0, 1.0)):  # fmt: skip
    """TransformerLayer composed from references: x [b, s, H]; ``branch`` scales the self
    attention's and the MLP's outputs per sample ([b, 1, 1] or scalars: stochastic depth)."""
    d = x.shape[-1] // heads
    decoder = enc is not None
    common = dict(h=heads, g=groups, d=d, kind=kind, zcg=zcg, rope=rope)

    def ln_of(mod):
        first = mod["qkv"] if "qkv" in mod else mod["query"]
        return norm_ref(x, first["scale"], first.get("ln_bias"), 1e-6, kind, zcg)

    attn = p["self_attention" if decoder else "attention"]
    y = mha_ref(attn, x, None, masked=self_mask, bias=rel_bias, input_ln=not output_ln, **common)
    res = (ln_of(attn) if not output_ln else x) if post_ln else x
    x = y * branch[0] + res
    if decoder:
        cross = p["encoder_decoder_attention"]
        y = mha_ref(cross, x, enc, masked=cross_mask, **common)
        x = y + (ln_of(cross) if post_ln else x)
    m = p["mlp"]
    y = mlp_ref(x, m["scale"], m.get("ln_bias"), m["wi_kernel"], m.get("wi_bias"), m["wo_kernel"], m.get("wo_bias"),
                acts, kind, 1e-6, zcg)  # fmt: skip
    res = norm_ref(x, m["scale"], m.get("ln_bias"), 1e-6, kind, zcg) if post_ln else x
    out = y * branch[1] + res
    if output_ln:
        o = p["output_layernorm"]
        out = norm_ref(out, o["scale"], o.get("ln_bias"), 1e-6, kind, zcg)
    return out


def test_te_defaults_and_parameter_tree():
    # TE Flax's defaults (transformer_engine/jax/flax/transformer.py)
    want = dict(hidden_size=512, mlp_hidden_size=2048, num_attention_heads=8, num_gqa_groups=None,
                layernorm_type="layernorm", layernorm_epsilon=1e-6, zero_centered_gamma=False, hidden_dropout=0.1,
                attention_dropout=0.1, intermediate_dropout=0.1, mlp_activations=("relu",), use_bias=False,
                apply_residual_connection_post_layernorm=False, output_layernorm=False,
                float32_attention_logits=False, layer_type=ENC, self_attn_mask_type="causal",
                enable_relative_embedding=True, enable_rotary_pos_emb=False, rotary_pos_emb_windows=(1, 10000),
                rotary_pos_emb_group_method="consecutive", dtype=jnp.float32, drop_path=0.0, fuse_qkv_params=True,
                transpose_batch_sequence=False, scale_attn_logits=False, scaled_query_init=True, window_size=None,
                softmax_type="vanilla")  # fmt: skip
    fields = {f.name: f.default for f in dataclasses.fields(TransformerLayer)}
    assert {k: fields[k] for k in want} == want
    mha = {f.name: f.default for f in dataclasses.fields(MultiHeadAttention)}
    assert {k: mha[k] for k in ("num_gqa_groups", "attention_dropout", "input_layernorm", "attn_mask_type",
                                "attn_bias_type", "fuse_qkv_params", "scale_attn_logits", "scaled_query_init",
                                "transpose_batch_sequence", "use_bias")} == dict(
        num_gqa_groups=None, attention_dropout=0.0, input_layernorm=True, attn_mask_type="causal",
        attn_bias_type=None, fuse_qkv_params=True, scale_attn_logits=False, scaled_query_init=True,
        transpose_batch_sequence=None, use_bias=False)  # fmt: skip
    dpa = {f.name: f.default for f in dataclasses.fields(DotProductAttention)}
    assert (dpa["attn_mask_type"], dpa["qkv_layout"], dpa["softmax_type"], dpa["dropout_rng_name"]) == (
        "causal",
        "bshd_bshd_bshd",
        "vanilla",
        "dropout",
    )

    x = jnp.ones((1, 4, 512))
    assert _shapes(_abstract(TransformerLayer(), x, deterministic=True)) == {
        "attention": {"qkv": {"scale": (512,), "ln_bias": (512,), "kernel": (512, 3, 512)}, "out": {"kernel": (512, 512)}},
        "mlp": {"scale": (512,), "ln_bias": (512,), "wi_kernel": (512, 1, 2048), "wo_kernel": (2048, 512)},
        "relpos_bias": {"rel_embedding": (8, 32)},
    }  # fmt: skip
    x, enc = jnp.ones((2, 8, 64)), jnp.ones((2, 6, 64))
    dec = TransformerLayer(64, 128, 4, num_gqa_groups=2, layer_type=DEC, output_layernorm=True, use_bias=True,
                           layernorm_type="rmsnorm", enable_relative_embedding=False)  # fmt: skip
    tree = _shapes(_abstract(dec, x, enc, None, jnp.zeros((2, 1, 8, 6), bool), deterministic=True))
    assert set(tree) == {"self_attention", "encoder_decoder_attention", "mlp", "output_layernorm"}
    assert tree["self_attention"] == {  # GQA self attention: query + kv; no input norm with output_layernorm
        "query": {"kernel": (64, 64), "bias": (64,)},
        "kv": {"kernel": (64, 2, 32), "bias": (2, 32)},
        "out": {"kernel": (64, 64), "bias": (64,)},
    }
    assert tree["encoder_decoder_attention"]["query"]["scale"] == (64,)
    assert tree["output_layernorm"] == {"scale": (64,)}
    assert tree["mlp"]["wi_bias"] == (1, 128) and tree["mlp"]["wo_bias"] == (64,)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_biases(bidirectional):
    model = RelativePositionBiases(num_buckets=32, max_distance=128, num_attention_heads=4)
    variables = nn.unbox(jit(lambda: model.init(jax.random.PRNGKey(0), 200, 190, bidirectional))())
    table = variables["params"]["rel_embedding"]
    assert table.shape == (4, 32)
    got = model.apply({"params": {"rel_embedding": table}}, 200, 190, bidirectional)
    assert got.shape == (1, 4, 200, 190)
    np.testing.assert_array_equal(np.asarray(got), rel_bias_ref(np.asarray(table), 200, 190, bidirectional))


CASES = {
    # encoder: T5 relative bias (bidirectional), padding mask, GeGLU with biases; deterministic
    # with TE's default dropouts (0.1) on
    "encoder_relpos_padding": (
        dict(self_attn_mask_type="padding", mlp_activations=("gelu", "linear"), use_bias=True),
        dict(relpos=True, acts=("gelu", "linear")),
    ),
    # decoder: causal self attention (unidirectional bias) + padded cross attention, GQA,
    # residuals from the norms, output norm, RMSNorm
    "decoder_post_ln_output_ln": (
        dict(
            layer_type=DEC,
            num_gqa_groups=2,
            apply_residual_connection_post_layernorm=True,
            output_layernorm=True,
            layernorm_type="rmsnorm",
            mlp_activations=("silu", "linear"),
        ),
        dict(relpos=True, acts=("silu", "linear"), kind="rmsnorm", post_ln=True, output_ln=True),
    ),  # fmt: skip
    # rotary instead of the relative bias, unfused q/k/v, zero-centered gamma, [s, b, H] inputs
    "rope_unfused_zcg_transposed": (
        dict(
            enable_relative_embedding=False,
            enable_rotary_pos_emb=True,
            fuse_qkv_params=False,
            zero_centered_gamma=True,
            transpose_batch_sequence=True,
            apply_residual_connection_post_layernorm=True,
        ),
        dict(rope="consecutive", zcg=True, transposed=True, post_ln=True),
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", list(CASES))
def test_layer_against_reference_composition(case):
    kw, opts = CASES[case]
    heads, groups = 4, kw.get("num_gqa_groups") or 4
    decoder = kw.get("layer_type") == DEC
    model = TransformerLayer(64, 128, heads, **kw)
    x, enc = _x(seed=1), (_x((2, 12, 64), seed=2) if decoder else None)
    attn_mask = jnp.asarray(padding_mask([16, 13], [16, 13], 16, 16))
    cross_mask = jnp.asarray(padding_mask([16, 16], [12, 9], 16, 12))
    transposed = opts.get("transposed", False)

    def layout(t):
        return None if t is None else (jnp.swapaxes(t, 0, 1) if transposed else t)

    params = random_params(
        _abstract(model, layout(x), layout(enc), attn_mask, cross_mask, deterministic=True), 3
    )
    self_type = kw.get("self_attn_mask_type", "causal")
    self_mask = mask_ref(
        16, 16, causal="causal" in self_type, pad=attn_mask if "padding" in self_type else None
    )
    rel_bias = None
    if opts.get("relpos"):
        rel_bias = jnp.asarray(
            rel_bias_ref(np.asarray(params["relpos_bias"]["rel_embedding"]), 16, 16, not decoder)
        )

    def f(p, x, enc):
        y = model.apply({"params": p}, layout(x), layout(enc), attn_mask, cross_mask, deterministic=True)
        return layout(y)

    def f_ref(p, x, enc):
        rb = rel_bias
        if rb is not None:  # the table's gradient flows through the reference's gather too
            idx = np.array([[t5_bucket(j - i, not decoder) for j in range(16)] for i in range(16)])
            rb = p["relpos_bias"]["rel_embedding"][:, idx][None]
        return layer_ref(p, x, enc, heads=heads, groups=groups, self_mask=self_mask, cross_mask=cross_mask,
                         rel_bias=rb, acts=opts.get("acts", ("relu",)), kind=opts.get("kind", "layernorm"),
                         zcg=opts.get("zcg", False), post_ln=opts.get("post_ln", False),
                         output_ln=opts.get("output_ln", False), rope=opts.get("rope"))  # fmt: skip

    args = (params, x) if enc is None else (params, x, enc)
    (y, g), (y_ref, g_ref) = fwd_bwd(
        [
            (lambda *a: f(*a, None) if enc is None else f(*a), args),
            (lambda *a: f_ref(*a, None) if enc is None else f_ref(*a), args),
        ]  # noqa: E501
    )
    assert y.shape == x.shape and rel(y, y_ref) <= TIGHT
    _check(g, g_ref)
    if rel_bias is not None:  # the bias really entered
        assert float(jnp.abs(rel_bias).max()) > 0.1


def test_dropout_and_drop_path():
    x = _x((8, 16, 64), seed=5)
    kw = dict(attention_dropout=0.0, intermediate_dropout=0.0, enable_relative_embedding=False)
    hidden = TransformerLayer(64, 128, 4, hidden_dropout=0.5, **kw)
    depth = TransformerLayer(64, 128, 4, hidden_dropout=0.0, drop_path=0.5, **kw)
    params = random_params(_abstract(hidden, x, deterministic=True), 7)

    causal = mask_ref(16, 16, causal=True)

    @jit
    def run(p, k1, k2):
        def drop(m, key):
            return m.apply({"params": p}, x, rngs={"dropout": key})

        plain = hidden.apply({"params": p}, x, deterministic=True)
        # stochastic depth: each sample's attention and MLP branches dropped whole or doubled
        combos = {
            (ma, mm): layer_ref(p, x, heads=4, groups=4, self_mask=causal, branch=(ma, mm))
            for ma in (0.0, 2.0)
            for mm in (0.0, 2.0)
        }
        ref = layer_ref(p, x, heads=4, groups=4, self_mask=causal)
        return plain, ref, drop(hidden, k1), drop(hidden, k1), drop(hidden, k2), drop(depth, k1), combos

    plain, ref, a, b, c, d, combos = run(params, jax.random.PRNGKey(1), jax.random.PRNGKey(2))
    assert rel(plain, ref) <= TIGHT  # deterministic: no dropout
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert rel(a, c) > 0.05 and rel(a, plain) > 0.05
    seen = set()
    for i in range(8):
        match = [c for c, want in combos.items() if rel(d[i], want[i]) <= TIGHT]
        assert len(match) == 1, (i, {c: rel(d[i], w[i]) for c, w in combos.items()})
        seen.add(match[0])
    assert len(seen) > 1


@pytest.mark.parametrize("name", ["delayed", "current"])
def test_layer_under_fp8_recipes(name):
    r = RECIPES[name]
    x, enc = _x(seed=9), _x((2, 16, 64), seed=10)
    mask = jnp.zeros((2, 1, 16, 16), bool)
    model = TransformerLayer(
        64,
        128,
        4,
        layer_type=DEC,
        mlp_activations=("gelu", "linear"),
        intermediate_dropout=0.0,
        scale_attn_logits=True,
    )
    with te_jax.autocast(enabled=True, recipe=r):
        shapes = jax.eval_shape(
            lambda: model.init(jax.random.PRNGKey(0), x, enc, None, mask, deterministic=True)
        )
    variables = {"params": random_params(shapes["params"], 15)}
    if "fp8_metas" in shapes:  # DelayedScaling's initial state: scales 1, amax histories 0
        variables["fp8_metas"] = jax.tree_util.tree_map_with_path(
            lambda path, a: (jnp.ones if jax.tree_util.keystr(path).endswith("_scale']") else jnp.zeros)(
                a.shape
            ),
            shapes["fp8_metas"],
        )
    metas = variables.get("fp8_metas")
    assert (metas is not None) == (name == "delayed")
    if metas is not None:
        assert set(metas) == {"self_attention", "encoder_decoder_attention", "mlp"}

    def f(quantized):
        # scaled down: the loss's sin stays near linear, so the gradients measure FP8's error
        # rather than sin's sensitivity to the output's rounding
        def fn(p, x, enc):
            if not quantized:
                return 0.05 * model.apply({"params": p}, x, enc, None, mask, deterministic=True)
            v = {"params": p} if metas is None else {"params": p, "fp8_metas": metas}
            with te_jax.autocast(enabled=True, recipe=r):
                return 0.05 * model.apply(v, x, enc, None, mask, deterministic=True)

        return fn

    args = (variables["params"], x, enc)
    got, want = fwd_bwd([(f(True), args), (f(False), args)])
    for a, b in zip(_leaves(got), _leaves(want), strict=True):
        assert bool(jnp.all(jnp.isfinite(a))) and rel(a, b) <= LOOSE_DEFAULT
    assert rel(got[0], want[0]) > 1e-4  # quantized: not the high-precision numbers


def test_layer_forward_under_every_recipe():
    x = _x(seed=11)
    model = TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0, intermediate_dropout=0.0)
    params = random_params(_abstract(model, x), 12)
    with te_jax.autocast(enabled=True, recipe=RECIPES["delayed"]):
        metas = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x))["fp8_metas"]
    metas = jax.tree_util.tree_map(lambda s: jnp.ones(s.shape, s.dtype), metas)  # scales 1, histories 1

    @jit
    def run(p):
        out = {"hp": model.apply({"params": p}, x)}
        for name, r in RECIPES.items():
            with te_jax.autocast(enabled=True, recipe=r):
                v = {"params": p, "fp8_metas": metas} if name == "delayed" else {"params": p}
                out[name] = model.apply(v, x)
        return out

    out = run(params)
    for name in RECIPES:
        assert bool(jnp.all(jnp.isfinite(out[name]))), name
        assert 1e-5 < rel(out[name], out["hp"]) <= LOOSE.get(name, LOOSE_DEFAULT), name


def test_layer_on_a_mesh_matches_one_device():
    x = _x((4, 16, 64), seed=13)
    model = TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0, intermediate_dropout=0.0)
    params = random_params(_abstract(model, x), 14)

    def step(p, x):
        return jax.value_and_grad(lambda p: jnp.sum(jnp.sin(model.apply({"params": p}, x))))(p)

    want = jit(step)(params, x)
    mesh = jax.make_mesh((2, 2), ("data", "model"))
    resource = te_jax.MeshResource(dp_resource="data", tp_resource="model")
    with jax.set_mesh(mesh), te_jax.autocast(enabled=False, mesh_resource=resource):
        got = jit(step)(params, x)  # the MLP splits over "model", the batch over "data"
    for a, b in zip(_leaves(got), _leaves(want), strict=True):
        assert rel(a, b) <= TIGHT


@pytest.mark.parametrize(
    "model,call,error,message",
    [
        (TransformerLayer(64, 128, 4, intermediate_dropout=1.0), {}, ValueError,
         r"TransformerLayer.intermediate_dropout: expected a float in \[0, 1\), got 1.0"),
        (TransformerLayer(64, 128, 5), {"deterministic": True}, ValueError,
         "TransformerLayer.num_attention_heads: expected an int >= 1 dividing hidden_size=64, got 5"),
        (TransformerLayer(64, 128, 4, layer_type=DEC), {"deterministic": True}, ValueError,
         "encoded: layer_type=TransformerLayerType.DECODER needs the encoder's output"),
        (TransformerLayer(64, 128, 4, layer_type=DEC), {"deterministic": True, "encoded": "x"}, ValueError,
         r"encoder_decoder_mask: the DECODER's cross attention is 'padding' masked; expected a boolean \[b, 1, s, s_enc\]"),
        (TransformerLayer(64, 128, 4, layer_type="decoder"), {"deterministic": True}, ValueError,
         "TransformerLayer.layer_type: expected TransformerLayerType.ENCODER or .DECODER, got 'decoder'"),
        (TransformerLayer(64, 128, 4, qkv_format="thd", self_attn_mask_type="padding"),
         {"deterministic": True, "decode": True}, ValueError,
         r"TransformerLayer.qkv_format: decode=True \(the KV cache\) takes 'bshd'"),
        (TransformerLayer(64, 128, 4, mlp_activation_params={"limit": 7.0}), {"deterministic": True},
         NotImplementedError, "TransformerLayer: mlp_activation_params is not supported by te_jax yet"),
        (TransformerLayer(32, 128, 4), {"deterministic": True}, ValueError,
         r"inputs: expected \[batch, seq, hidden_size\] = \[\*, \*, 32\] \(3 dims\), got shape \(2, 16, 64\)"),
        (TransformerLayer(64, 128, 4, hidden_dropout=1.5), {"deterministic": True}, ValueError,
         r"TransformerLayer.hidden_dropout: expected a float in \[0, 1\), got 1.5"),
        (TransformerLayer(64, 128, 4, hidden_dropout_dims=(5,)), {"deterministic": True}, ValueError,
         "TransformerLayer.hidden_dropout_dims: expected a tuple of dims"),
        (TransformerLayer(64, 128, 4, low_rank_adaptation_scope="mlp"), {"deterministic": True}, NotImplementedError,
         "low_rank_adaptation_scope='mlp' is not supported"),
    ],
)  # fmt: skip
def test_errors_name_the_argument(model, call, error, message):
    x = _x()
    if call.get("encoded") == "x":
        call = {**call, "encoded": x}
    with pytest.raises(error, match=message):
        model.init(jax.random.PRNGKey(0), x, **call)
