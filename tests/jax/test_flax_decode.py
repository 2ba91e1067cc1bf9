"""Autoregressive decoding (decode=True, the KV cache in the "cache" collection) through
te_jax.flax.MultiHeadAttention and a 2-layer stack of TransformerLayers on the CPU backend.

The oracle is the module itself without decode: fed one token per call, or several per call
in varying chunks (chunked prefill), after a first decode=True call sized the cache (model.init
or apply on a full-length dummy input), the outputs at every position equal the full-sequence
causal forward's in fp32 (that forward is checked against plain references in
test_flax_attention.py / test_flax_transformer.py); under 'no_mask' / 'padding' a step's equal
the forward over the tokens cached by the step's end. The cache's collection has TE's
structure, names, shapes and dtypes, derived here from each module's configuration; its keys
are the projected (rotated) keys. Error paths name the argument.

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_flax_decode.py
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _refs import HI, norm_ref
from te_jax.attention import SequenceDescriptor
from te_jax.flax import MultiHeadAttention, TransformerLayer, TransformerLayerType
from test_flax_attention import _rand, jit, random_params, rope_ref

F32, BF16 = jnp.float32, jnp.bfloat16
B, L, HIDDEN, HEADS = 2, 7, 32, 4
HEAD_DIM = HIDDEN // HEADS
TOL = dict(rtol=2e-5, atol=2e-5)  # fp32; a step's GEMMs have other shapes, so another summation order


def _x(shape=(B, L, HIDDEN), seed=0, dtype=F32, tbs=False):
    x = _rand(seed, shape, dtype, 1.5, 0.2)
    return jnp.swapaxes(x, 0, 1) if tbs else x


def expected_cache(*, g, dtype, tbs, b=B, length=L, d=HEAD_DIM):
    """TE's cache variables of one attention module: cached_key / cached_value [b, L, g, d]
    ([L, b, g, d] with transpose_batch_sequence) in the keys' dtype, cache_index int32 ()."""
    kv = ((length, b) if tbs else (b, length)) + (g, d)
    return {
        "cached_key": (kv, jnp.dtype(dtype)),
        "cached_value": (kv, jnp.dtype(dtype)),
        "cache_index": ((), jnp.dtype(jnp.int32)),
    }


def _structure(tree):
    return jax.tree_util.tree_map(lambda a: (tuple(a.shape), jnp.dtype(a.dtype)), nn.unbox(tree))


def decode_each(apply_step, cache, x, tbs):
    """apply_step(cache, token) -> (out, new cache) over x's tokens in order (lax.scan, so the
    cache index is traced as in a jitted generation loop); the outputs stacked back in x's
    layout, and the final cache."""
    seq_axis = 0 if tbs else 1

    def body(c, t):
        out, c = apply_step(c, jnp.expand_dims(t, seq_axis))
        return c, jnp.squeeze(out, seq_axis)

    cache, outs = jax.lax.scan(body, cache, jnp.moveaxis(x, seq_axis, 0))
    return jnp.moveaxis(outs, 0, seq_axis), cache


# ---- MultiHeadAttention ----

PAD = np.zeros((B, 1, L, L), bool)
PAD[1, :, :, 5:] = True  # row 1: its last two keys are padding
PAD[1, :, 5:, :] = True  # and so are its last two queries (outputs zero in both paths)
MHA_CASES = {
    # self attention with TE's defaults: the fused qkv projection (TE's decode asserts against it
    # unless rotary embeddings are on)
    "bshd_fused_qkv": dict(),
    "sbhd_fused_qkv": dict(transpose_batch_sequence=True),
    "gqa_fused_kv": dict(num_gqa_groups=2),
    "mqa_rope_unfused": dict(num_gqa_groups=1, enable_rotary_pos_emb=True, fuse_qkv_params=False),
    "sbhd_gqa_rope_alternate": dict(
        transpose_batch_sequence=True, num_gqa_groups=2, enable_rotary_pos_emb=True,
        rotary_pos_emb_group_method="alternate", rotary_pos_emb_windows=(2, 500),
    ),
    "window_learnable_softmax_bias": dict(
        window_size=(2, 0), softmax_type="learnable", scale_attn_logits=True, use_bias=True,
        layernorm_type="rmsnorm",
    ),
    # a full-length [b, 1, L, L] mask and [1, h, L, L] bias: each step reads row cache_index
    "padding_causal_mask_and_bias": dict(attn_mask_type="padding_causal", attn_bias_type="post_scale_bias"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MHA_CASES))
def test_mha_decode_equals_full_causal_forward(case):
    kw = MHA_CASES[case]
    tbs = kw.get("transpose_batch_sequence", False)
    g = kw.get("num_gqa_groups", HEADS)
    model = MultiHeadAttention(HEAD_DIM, HEADS, **kw)
    x = _x(seed=1, tbs=tbs)
    padded = kw.get("attn_mask_type") == "padding_causal"
    mask = jnp.asarray(PAD) if padded else None
    bias = _rand(2, (1, HEADS, L, L), scale=0.5) if "attn_bias_type" in kw else None
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x, x, mask, bias, decode=True))
    assert _structure(shapes["cache"]) == expected_cache(g=g, dtype=F32, tbs=tbs)
    params = random_params(shapes["params"], seed=3)

    def call(variables, inputs, **kw):
        return model.apply(variables, inputs, inputs, mask, bias, deterministic=True, **kw)

    @jit
    def run(params, x):
        full, _ = call({"params": params}, x)
        # the cache sized by a full-length dummy input (TE's init); its output is the forward's
        (init_out, _), mut = call({"params": params}, jnp.zeros_like(x), decode=True, mutable=["cache"])
        plain_out, _ = call({"params": params}, jnp.zeros_like(x))

        def step(cache, token):
            (out, _), mut = call({"params": params, "cache": cache}, token, decode=True, mutable=["cache"])
            return out, mut["cache"]

        steps, cache = decode_each(step, mut["cache"], x, tbs)
        return full, steps, cache, init_out, plain_out

    full, steps, cache, init_out, plain_out = run(params, x)
    np.testing.assert_allclose(np.asarray(init_out), np.asarray(plain_out), rtol=1e-6, atol=1e-6)
    assert _structure(cache) == expected_cache(g=g, dtype=F32, tbs=tbs)
    assert int(cache["cache_index"]) == L
    if padded:
        assert float(jnp.max(jnp.abs(full[1, 5:]))) == 0.0  # padded queries: zeros in both paths
    for i in range(L):  # every position, so a failure says where
        got, want = (steps[i], full[i]) if tbs else (steps[:, i], full[:, i])
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), err_msg=f"position {i}", **TOL)


def test_cache_holds_the_rotated_projected_keys_and_values():
    model = MultiHeadAttention(
        HEAD_DIM, HEADS, num_gqa_groups=2, enable_rotary_pos_emb=True, fuse_qkv_params=False
    )
    x = _x(seed=4)
    params = random_params(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x, x))["params"], seed=5)

    @jit
    def run(params, x):
        def call(variables, t, **kw):
            return model.apply(variables, t, t, decode=True, deterministic=True, mutable=["cache"], **kw)

        _, mut = call({"params": params}, x)

        def step(cache, token):
            (out, _), mut = call({"params": params, "cache": cache}, token)
            return out, mut["cache"]

        return decode_each(step, mut["cache"], x, tbs=False)[1]

    cache = run(params, x)
    q = params["query"]
    ln = norm_ref(x, q["scale"], q["ln_bias"])
    k = jnp.tensordot(ln, params["key"]["kernel"], axes=1, precision=HI).reshape(B, L, 2, HEAD_DIM)
    v = jnp.tensordot(ln, params["value"]["kernel"], axes=1, precision=HI).reshape(B, L, 2, HEAD_DIM)
    np.testing.assert_allclose(np.asarray(cache["cached_key"]), np.asarray(rope_ref(k)), **TOL)
    np.testing.assert_allclose(np.asarray(cache["cached_value"]), np.asarray(v), **TOL)


@pytest.mark.parametrize(
    "kw,dtype,tbs",
    [(dict(), BF16, False), (dict(num_gqa_groups=1), F32, True), (dict(num_gqa_groups=2, fuse_qkv_params=False), BF16, True)],
)  # fmt: skip
def test_cache_structure_is_te_and_params_do_not_change(kw, dtype, tbs):
    model = MultiHeadAttention(HEAD_DIM, HEADS, **kw)
    x = _x((B, 5, HIDDEN), dtype=dtype, tbs=tbs)
    with_cache = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x, x, decode=True))
    plain = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x, x))
    assert set(with_cache) == {"params", "cache"} and set(plain) == {"params"}
    assert _structure(with_cache["params"]) == _structure(plain["params"])
    assert _structure(with_cache["cache"]) == expected_cache(
        g=kw.get("num_gqa_groups", HEADS), dtype=dtype, tbs=tbs, length=5
    )


# ---- a 2-layer TransformerLayer stack ----


class Stack(nn.Module):
    """Two TransformerLayers, decoder-only (causal self attention) unless layer_type=DECODER."""

    kw: dict

    @nn.compact
    def __call__(self, x, encoded=None, enc_mask=None, *, decode=False, max_decode_length=None):
        for i in range(2):
            x = TransformerLayer(HIDDEN, 64, HEADS, hidden_dropout=0.0, attention_dropout=0.0,
                                 intermediate_dropout=0.0, name=f"layer_{i}", **self.kw)(
                x, encoded, None, enc_mask, deterministic=True, decode=decode, max_decode_length=max_decode_length
            )  # fmt: skip
        return x


STACK_CASES = {
    # TE's defaults: T5 relative position biases (bidirectional buckets for ENCODER layers)
    "relpos": dict(),
    "sbhd_relpos_unfused": dict(transpose_batch_sequence=True, fuse_qkv_params=False),
    "gqa_rope_rmsnorm": dict(
        num_gqa_groups=2,
        enable_rotary_pos_emb=True,
        enable_relative_embedding=False,
        layernorm_type="rmsnorm",
        mlp_activations=("silu", "linear"),
    ),
    # T5X's decoder: unidirectional biases sized by max_decode_length, cross attention each step
    "decoder_cross_attention": dict(layer_type=TransformerLayerType.DECODER),
}


@pytest.mark.parametrize("case", list(STACK_CASES))
def test_transformer_stack_decode_equals_full_causal_forward(case):
    kw = STACK_CASES[case]
    tbs = kw.get("transpose_batch_sequence", False)
    decoder = kw.get("layer_type") == TransformerLayerType.DECODER
    model = Stack(kw)
    x = _x(seed=6, tbs=tbs)
    enc = _x((B, 5, HIDDEN), seed=7, tbs=tbs) if decoder else None
    enc_mask = np.zeros((B, 1, 1, 5), bool)
    enc_mask[1, ..., 3:] = True
    enc_mask = jnp.asarray(enc_mask) if decoder else None
    extra = dict(max_decode_length=L) if decoder else {}
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x, enc, enc_mask, decode=True, **extra))
    attn = "self_attention" if decoder else "attention"
    want = expected_cache(g=kw.get("num_gqa_groups", HEADS), dtype=F32, tbs=tbs)
    assert _structure(shapes["cache"]) == {f"layer_{i}": {attn: want} for i in range(2)}
    params = random_params(shapes["params"], seed=8)

    @jit
    def run(params, x, enc):
        full = model.apply({"params": params}, x, enc, enc_mask)
        _, mut = model.apply({"params": params}, jnp.zeros_like(x), enc, enc_mask, decode=True, mutable=["cache"],
                             **extra)  # fmt: skip

        def step(cache, token):
            out, mut = model.apply({"params": params, "cache": cache}, token, enc, enc_mask, decode=True,
                                   mutable=["cache"], **extra)  # fmt: skip
            return out, mut["cache"]

        return full, *decode_each(step, mut["cache"], x, tbs)

    full, steps, cache = run(params, x, enc)
    assert _structure(cache) == {f"layer_{i}": {attn: want} for i in range(2)}
    assert [int(cache[f"layer_{i}"][attn]["cache_index"]) for i in range(2)] == [L, L]
    for i in range(L):
        got, ref = (steps[i], full[i]) if tbs else (steps[:, i], full[:, i])
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), err_msg=f"position {i}", **TOL)


def test_greedy_generation_matches_recomputing_the_full_sequence():
    """A greedy loop (tokens embedded, the hidden state's logits through an output head, argmax
    fed back), jitted as one lax.scan over the cache: the tokens it picks are the argmax
    of the full forward over the generated sequence, position by position."""
    vocab = 11
    model = Stack(dict(num_gqa_groups=2, enable_rotary_pos_emb=True))
    dummy = jnp.zeros((B, L, HIDDEN))
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), dummy, decode=True))
    params = random_params(shapes["params"], seed=9)
    table, head = _rand(10, (vocab, HIDDEN), scale=2.0), _rand(11, (HIDDEN, vocab))

    @jit
    def generate(params, first):
        _, mut = model.apply({"params": params}, dummy, decode=True, mutable=["cache"])

        def body(carry, _):
            cache, tok = carry
            h, mut = model.apply(
                {"params": params, "cache": cache}, table[tok][:, None], decode=True, mutable=["cache"]
            )
            nxt = jnp.argmax(h[:, 0] @ head, axis=-1)
            return (mut["cache"], nxt), (tok, h[:, 0])

        _, (toks, hs) = jax.lax.scan(body, (mut["cache"], first), None, length=L)
        toks, hs = toks.T, jnp.swapaxes(hs, 0, 1)
        return toks, hs, model.apply({"params": params}, table[toks])

    toks, hs, full = generate(params, jnp.array([1, 4]))
    np.testing.assert_allclose(np.asarray(hs), np.asarray(full), **TOL)
    picked = np.asarray(jnp.argmax(full @ head, axis=-1))
    np.testing.assert_array_equal(np.asarray(toks)[:, 1:], picked[:, :-1])
    assert len(np.unique(np.asarray(toks))) > 2  # the loop did generate, not repeat one token


# ---- errors ----
# Steps on a cache built here with the structure checked above (no eager init to pay for); the
# checks that need the step's projections run traced (jax.jit raises before compiling).


def _params(model, *args, **kw):
    return random_params(jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *args, **kw))["params"], 1)


def _cache(g, index, length=3):
    kv = jnp.zeros((B, length, g, HEAD_DIM))
    return {"cached_key": kv, "cached_value": kv, "cache_index": jnp.asarray(index, jnp.int32)}


def _step(model, params, cache, token, other=None, **kw):
    return model.apply({"params": params, "cache": cache}, token, token if other is None else other,
                       decode=True, deterministic=True, mutable=["cache"], **kw)  # fmt: skip


def test_decode_errors_name_the_argument():
    model = MultiHeadAttention(HEAD_DIM, HEADS, num_gqa_groups=2)
    one = _x((B, 1, HIDDEN), seed=2)
    params, cache = _params(model, one, one), _cache(2, 1)
    with pytest.raises(ValueError, match=r"MultiHeadAttention: the 'cache' holds 3 tokens per row and cache_index=1: "
                       r"a step of n=3 tokens would write past its end \(cache_index \+ n = 4 > 3\)"):  # fmt: skip
        _step(model, params, cache, _x((B, 3, HIDDEN)))
    with pytest.raises(ValueError, match=r"inputs_q: decode=True with a filled cache takes a step of n >= 1 tokens "
                       r"per row: expected \[b, n, hidden\] = \[2, n, \*\] \(b from the cache\), got shape "
                       r"\(1, 1, 32\)"):  # fmt: skip
        _step(model, params, cache, one[:1])  # another batch size
    with pytest.raises(ValueError, match=r"inputs_kv: .* got shape \(2, 3, 32\)"):
        _step(model, params, cache, one, other=_x((B, 3, HIDDEN)))
    with pytest.raises(
        ValueError, match=r"inputs_q: the cache holds float32 keys/values .* this step's are bfloat16"
    ):
        jax.jit(lambda t: _step(model, params, cache, t))(one.astype(BF16))
    with pytest.raises(ValueError, match=r"decode=True writes the step's key and value into the 'cache' "
                       r"collection; call apply\(\.\.\., mutable=\['cache'\]\)"):  # fmt: skip
        model.apply({"params": params, "cache": cache}, one, one, decode=True)
    with pytest.raises(ValueError, match=r"the 'cache' holds 3 tokens per row and cache_index=3: a step of n=1 "
                       r"tokens would write past its end \(cache_index \+ n = 4 > 3\)"):  # fmt: skip
        _step(model, params, _cache(2, 3), one)
    # jitted, the index is traced: a step past the end says so with NaNs, one within does not
    outs = jax.jit(lambda caches: [_step(model, params, c, one)[0][0] for c in caches])(
        [_cache(2, 2), _cache(2, 3)]
    )
    assert bool(jnp.all(jnp.isfinite(outs[0]))) and bool(jnp.all(jnp.isnan(outs[1])))


def test_decode_mask_and_bias_errors():
    model = MultiHeadAttention(HEAD_DIM, HEADS, attn_mask_type="padding_causal")
    one, full = _x((B, 1, HIDDEN), seed=2), jnp.zeros((B, 1, 3, 3), bool)
    params, cache = _params(model, one, one, full[:, :, :1, :1]), _cache(HEADS, 1)

    def step(**kw):
        return jax.jit(lambda t: _step(model, params, cache, t, **kw))(one)

    with pytest.raises(ValueError, match=r"mask: a decode step takes a boolean mask \[b, 1, 1 or n or L, L\] "
                       r"\(n=1 the step's tokens, L=3 the cache's length; True = masked out\)"):  # fmt: skip
        step(mask=SequenceDescriptor.from_seqlens(jnp.array([3, 2])))
    with pytest.raises(ValueError, match=r"mask: expected in a decode step \[b, 1, 1 or n or L, L\] \(n the step's "
                       r"tokens, L the cache's length; here n=1\) = \(2, 1, 3, 3\), got shape \(2, 1, 1, 5\)"):  # fmt: skip
        step(mask=jnp.zeros((B, 1, 1, 5), bool))
    with pytest.raises(
        ValueError,
        match=r"bias: expected in a decode step \[b, h, 1 or n or L, L\] .* got shape \(1, 4, 2, 3\)",
    ):
        step(mask=full, bias=jnp.zeros((1, HEADS, 2, 3)))


@pytest.mark.parametrize(
    "make,call,message",
    [
        (lambda: MultiHeadAttention(HEAD_DIM, HEADS, qkv_format="thd", attn_mask_type="padding"), "mha",
         r"MultiHeadAttention.qkv_format: decode=True \(the KV cache\) takes 'bshd' \(TE's decode runs "
         r"bshd_bshd_bshd only\), got 'thd'"),
        (lambda: TransformerLayer(HIDDEN, 64, HEADS, qkv_format="thd", self_attn_mask_type="padding"), "layer",
         r"TransformerLayer.qkv_format: decode=True \(the KV cache\) takes 'bshd'"),
        (lambda: TransformerLayer(HIDDEN, 64, HEADS), "max_len",
         r"max_decode_length: expected None or 3 \(the inputs' length, which sizes the cache\), got 8"),
    ],
)  # fmt: skip
def test_decode_refusals(make, call, message):
    x = _x((B, 3, HIDDEN))
    seqs = SequenceDescriptor.from_segment_ids_and_pos(jnp.ones((B, 3), jnp.int32))
    with pytest.raises(ValueError, match=message):
        if call == "mha":
            make().init(jax.random.PRNGKey(0), x, x, seqs, decode=True)
        elif call == "layer":
            make().init(jax.random.PRNGKey(0), x, attention_mask=seqs, deterministic=True, decode=True)
        else:
            make().init(jax.random.PRNGKey(0), x, deterministic=True, decode=True, max_decode_length=8)


def test_max_decode_length_must_be_the_cache_length_in_steps():
    layer = TransformerLayer(HIDDEN, 64, HEADS, layer_type=TransformerLayerType.DECODER)
    one, enc, emask = _x((B, 1, HIDDEN)), _x((B, 2, HIDDEN), seed=1), jnp.zeros((B, 1, 1, 2), bool)
    variables = {
        "params": _params(layer, one, enc, None, emask, True),
        "cache": {"self_attention": _cache(HEADS, 1)},
    }
    with pytest.raises(
        ValueError, match=r"max_decode_length: expected None or 3 \(the cache's length\), got 4"
    ):
        layer.apply(variables, one, enc, None, emask, True, True, 4, mutable=["cache"])


# ---- steps of several tokens per row (chunked prefill, speculative verification) ----
# After the cache-creating call, a step takes n >= 1 tokens per row: written at cache_index..
# cache_index+n-1, query i attending to 0..cache_index+i (causal types). Oracle as above: the
# module's full forward, at the step's positions.

SCHEDULES = {  # tokens per step, summing to L: a prompt's chunks then varying steps
    "prefill3_1_2_1": (3, 1, 2, 1),
    "1_3_1_2": (1, 3, 1, 2),
    "whole": (L,),
}
# (case, schedule, jitted): every case jitted (cache_index traced) in two schedules; one case as a
# single whole-length step and one eagerly (cache_index concrete; op by op, so slow on the CPU)
MHA_RUNS = [(c, s, True) for s in ("prefill3_1_2_1", "1_3_1_2") for c in MHA_CASES] + [
    ("padding_causal_mask_and_bias", "whole", True),
    ("sbhd_gqa_rope_alternate", "prefill3_1_2_1", False),
]
STACK_RUNS = [(c, "1_3_1_2", True) for c in STACK_CASES] + [("gqa_rope_rmsnorm", "prefill3_1_2_1", False)]


def _ids(runs):
    return [f"{c}-{s}-{'jit' if j else 'eager'}" for c, s, j in runs]


def decode_chunks(apply_step, cache, x, sizes, tbs):
    """apply_step(cache, chunk, start) -> (out, new cache) over x's tokens in steps of ``sizes``
    tokens per row (``start``: the chunk's first position, static); the outputs concatenated
    back in x's layout, and the final cache."""
    seq_axis = 0 if tbs else 1
    assert sum(sizes) == x.shape[seq_axis]
    outs, start = [], 0
    for n in sizes:
        out, cache = apply_step(cache, jax.lax.slice_in_dim(x, start, start + n, axis=seq_axis), start)
        outs.append(out)
        start += n
    return jnp.concatenate(outs, seq_axis), cache


def _positions(a, tbs, lo, hi):
    return a[lo:hi] if tbs else a[:, lo:hi]


@pytest.mark.parametrize("case,schedule,jitted", MHA_RUNS, ids=_ids(MHA_RUNS))
def test_mha_chunked_decode_equals_full_causal_forward(case, schedule, jitted):
    """Every MHA case of the one-token test (fused / unfused projections, GQA / MQA, rotary
    embeddings, transpose_batch_sequence, a window, a full-length padding mask and bias), its
    tokens fed in steps of several tokens; eagerly (cache_index concrete: the overflow check
    runs) and jitted (cache_index traced)."""
    kw = MHA_CASES[case]
    tbs = kw.get("transpose_batch_sequence", False)
    g = kw.get("num_gqa_groups", HEADS)
    model = MultiHeadAttention(HEAD_DIM, HEADS, **kw)
    x = _x(seed=11, tbs=tbs)
    mask = jnp.asarray(PAD) if kw.get("attn_mask_type") == "padding_causal" else None
    bias = _rand(12, (1, HEADS, L, L), scale=0.5) if "attn_bias_type" in kw else None
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x, x, mask, bias, decode=True))
    params = random_params(shapes["params"], seed=13)

    def call(variables, inputs, **kw):
        return model.apply(variables, inputs, inputs, mask, bias, deterministic=True, **kw)

    def run(params, x):
        full, _ = call({"params": params}, x)
        _, mut = call({"params": params}, jnp.zeros_like(x), decode=True, mutable=["cache"])

        def step(cache, chunk, start):
            (out, _), mut = call({"params": params, "cache": cache}, chunk, decode=True, mutable=["cache"])
            return out, mut["cache"]

        return full, *decode_chunks(step, mut["cache"], x, SCHEDULES[schedule], tbs)

    full, steps, cache = (jit(run) if jitted else run)(params, x)
    assert _structure(cache) == expected_cache(g=g, dtype=F32, tbs=tbs)
    assert int(cache["cache_index"]) == L
    for i in range(L):
        got, want = _positions(steps, tbs, i, i + 1), _positions(full, tbs, i, i + 1)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), err_msg=f"position {i}", **TOL)


@pytest.mark.parametrize("case,schedule,jitted", STACK_RUNS, ids=_ids(STACK_RUNS))
def test_transformer_stack_chunked_decode_equals_full_causal_forward(case, schedule, jitted):
    """The 2-layer stacks (T5 biases whose rows the steps take, GQA with rotary embeddings,
    transpose_batch_sequence, a DECODER's cross attention for several queries) in steps of
    several tokens."""
    kw = STACK_CASES[case]
    tbs = kw.get("transpose_batch_sequence", False)
    decoder = kw.get("layer_type") == TransformerLayerType.DECODER
    model = Stack(kw)
    x = _x(seed=14, tbs=tbs)
    enc = _x((B, 5, HIDDEN), seed=15, tbs=tbs) if decoder else None
    enc_mask = np.zeros((B, 1, 1, 5), bool)
    enc_mask[0, ..., 4:] = True
    enc_mask = jnp.asarray(enc_mask) if decoder else None
    extra = dict(max_decode_length=L) if decoder else {}
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x, enc, enc_mask, decode=True, **extra))
    params = random_params(shapes["params"], seed=16)
    attn = "self_attention" if decoder else "attention"

    def run(params, x, enc):
        full = model.apply({"params": params}, x, enc, enc_mask)
        _, mut = model.apply({"params": params}, jnp.zeros_like(x), enc, enc_mask, decode=True, mutable=["cache"],
                             **extra)  # fmt: skip

        def step(cache, chunk, start):
            out, mut = model.apply({"params": params, "cache": cache}, chunk, enc, enc_mask, decode=True,
                                   mutable=["cache"], **extra)  # fmt: skip
            return out, mut["cache"]

        return full, *decode_chunks(step, mut["cache"], x, SCHEDULES[schedule], tbs)

    full, steps, cache = (jit(run) if jitted else run)(params, x, enc)
    assert [int(cache[f"layer_{i}"][attn]["cache_index"]) for i in range(2)] == [L, L]
    for i in range(L):
        got, ref = _positions(steps, tbs, i, i + 1), _positions(full, tbs, i, i + 1)
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), err_msg=f"position {i}", **TOL)


NONCAUSAL_CASES = {
    "no_mask": dict(attn_mask_type="no_mask"),
    "no_mask_window": dict(attn_mask_type="no_mask", window_size=(2, 1), num_gqa_groups=2),
    # the step's own mask rows [b, 1, n, L] and bias rows [1, h, n, L]
    "padding_rows_rope_bias": dict(
        attn_mask_type="padding", enable_rotary_pos_emb=True, fuse_qkv_params=False,
        attn_bias_type="post_scale_bias",
    ),
    # the full [b, 1, L, L] mask (rows sliced), and a one-row key-padding mask [b, 1, 1, L]
    "sbhd_padding_full_mask": dict(attn_mask_type="padding", transpose_batch_sequence=True),
    "padding_key_row": dict(attn_mask_type="padding", num_gqa_groups=1),
}  # fmt: skip


@pytest.mark.parametrize("case", list(NONCAUSAL_CASES))
def test_noncausal_chunked_decode_equals_the_forward_over_the_tokens_so_far(case):
    """'no_mask' / 'padding': a step's queries see every token cached by the step's end, so its
    outputs are the full forward (of that mask type, window and mask) over tokens
    0..cache_index+n-1, at the step's positions; one token per step is te's one-token step."""
    kw = NONCAUSAL_CASES[case]
    tbs = kw.get("transpose_batch_sequence", False)
    model = MultiHeadAttention(HEAD_DIM, HEADS, **kw)
    x = _x(seed=17, tbs=tbs)
    pad = None
    if kw["attn_mask_type"] == "padding":
        pad = jnp.asarray(PAD)
        if case == "padding_key_row":
            pad = jnp.asarray(PAD[:, :, :1] | PAD[:, :, -1:])  # [b, 1, 1, L]: row 1's last two keys
    bias = _rand(18, (1, HEADS, L, L), scale=0.5) if "attn_bias_type" in kw else None
    rows = case == "padding_rows_rope_bias"
    params = random_params(
        jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x, x, pad, bias, decode=True))["params"], 19
    )
    sizes = SCHEDULES["prefill3_1_2_1"]

    def crop(a, end):  # a mask or bias over the first `end` tokens
        return None if a is None else a[:, :, : min(a.shape[2], end), :end]

    @jit
    def run(params, x):
        def call(variables, inputs, mask, bias, **kw):
            return model.apply(variables, inputs, inputs, mask, bias, deterministic=True, **kw)

        _, mut = call({"params": params}, jnp.zeros_like(x), pad, bias, decode=True, mutable=["cache"])

        def step(cache, chunk, start):
            n = chunk.shape[0 if tbs else 1]
            m, bb = (pad[:, :, start : start + n], bias[:, :, start : start + n]) if rows else (pad, bias)
            (out, _), mut = call(
                {"params": params, "cache": cache}, chunk, m, bb, decode=True, mutable=["cache"]
            )
            return out, mut["cache"]

        steps, _ = decode_chunks(step, mut["cache"], x, sizes, tbs)
        prefixes = []  # the forward over the tokens up to each step's end
        for end in np.cumsum(sizes):
            prefixes.append(
                call({"params": params}, _positions(x, tbs, 0, end), crop(pad, end), crop(bias, end))[0]
            )
        return steps, prefixes

    steps, prefixes = run(params, x)
    start = 0
    for n, prefix in zip(sizes, prefixes, strict=True):
        for i in range(start, start + n):
            got, want = _positions(steps, tbs, i, i + 1), _positions(prefix, tbs, i, i + 1)
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), err_msg=f"position {i}", **TOL)
        start += n
    # the first chunk's first query saw the chunk's later tokens: not the causal forward's row
    causal = MultiHeadAttention(HEAD_DIM, HEADS, **{**kw, "attn_mask_type": "causal", "attn_bias_type": None})
    first = causal.apply({"params": params}, x, x, None, bias, deterministic=True)[0]
    assert not np.allclose(np.asarray(_positions(steps, tbs, 0, 1)), np.asarray(_positions(first, tbs, 0, 1)))


def test_chunked_decode_errors():
    model = MultiHeadAttention(HEAD_DIM, HEADS, num_gqa_groups=2)
    two = _x((B, 2, HIDDEN), seed=2)
    params = _params(model, two, two)
    # eager (cache_index concrete): a step that would run past the end names cache_index, n, L
    with pytest.raises(ValueError, match=r"MultiHeadAttention: the 'cache' holds 5 tokens per row and cache_index=4: "
                       r"a step of n=2 tokens would write past its end \(cache_index \+ n = 6 > 5\); initialise a "
                       r"longer cache"):  # fmt: skip
        _step(model, params, _cache(2, 4, length=5), two)
    out, mut = _step(model, params, _cache(2, 3, length=5), two)  # the last two slots: fits
    assert bool(jnp.all(jnp.isfinite(out[0]))) and int(mut["cache"]["cache_index"]) == 5
    # jitted (cache_index traced): a step past the end outputs NaN, one that fits does not
    outs = jax.jit(lambda caches: [_step(model, params, c, two)[0][0] for c in caches])(
        [_cache(2, 3, length=5), _cache(2, 4, length=5)]
    )
    assert bool(jnp.all(jnp.isfinite(outs[0]))) and bool(jnp.all(jnp.isnan(outs[1])))
    # more tokens than the cache holds: at any cache_index, traced or not
    with pytest.raises(ValueError, match=r"the 'cache' holds 3 tokens per row: a step of n=4 tokens would write past "
                       r"its end \(n = 4 > 3\)"):  # fmt: skip
        jax.jit(lambda c, t: _step(model, params, c, t))(_cache(2, 0), _x((B, 4, HIDDEN)))
    # another batch size, either layout; inputs_kv with another token count than inputs_q's
    with pytest.raises(ValueError, match=r"inputs_q: decode=True with a filled cache takes a step of n >= 1 tokens "
                       r"per row: expected \[b, n, hidden\] = \[2, n, \*\] \(b from the cache\), got shape "
                       r"\(1, 2, 32\)"):  # fmt: skip
        _step(model, params, _cache(2, 1, length=5), two[:1])
    tbs_model = MultiHeadAttention(HEAD_DIM, HEADS, num_gqa_groups=2, transpose_batch_sequence=True)
    kv = jnp.zeros((5, B, 2, HEAD_DIM))
    tbs_cache = {"cached_key": kv, "cached_value": kv, "cache_index": jnp.asarray(1, jnp.int32)}
    with pytest.raises(ValueError, match=r"inputs_q: .* expected \[n, b, hidden\] = \[n, 2, \*\] \(b from the "
                       r"cache\), got shape \(2, 3, 32\)"):  # fmt: skip
        _step(tbs_model, params, tbs_cache, _x((2, 3, HIDDEN)))
    with pytest.raises(ValueError, match=r"inputs_q: .* got shape \(2, 0, 32\)"):
        _step(model, params, _cache(2, 1, length=5), two[:, :0])
    with pytest.raises(ValueError, match=r"inputs_kv: .* expected \[b, n, hidden\] = \[2, 2, \*\] \(b from the "
                       r"cache, n from inputs_q\), got shape \(2, 1, 32\)"):  # fmt: skip
        _step(model, params, _cache(2, 1, length=5), two, other=two[:, :1])
    # a mask / bias whose query dim is neither 1, n nor L
    padded = MultiHeadAttention(HEAD_DIM, HEADS, attn_mask_type="padding_causal")
    pparams = _params(padded, two, two, jnp.zeros((B, 1, 2, 2), bool))
    with pytest.raises(ValueError, match=r"mask: expected in a decode step \[b, 1, 1 or n or L, L\] \(n the step's "
                       r"tokens, L the cache's length; here n=2\) = \(2, 1, 5, 5\), got shape \(2, 1, 3, 5\)"):  # fmt: skip
        _step(padded, pparams, _cache(HEADS, 1, length=5), two, mask=jnp.zeros((B, 1, 3, 5), bool))
    with pytest.raises(ValueError, match=r"bias: expected in a decode step \[b, h, 1 or n or L, L\] .* got shape "
                       r"\(1, 4, 4, 5\)"):  # fmt: skip
        _step(padded, pparams, _cache(HEADS, 1, length=5), two, mask=jnp.zeros((B, 1, 5, 5), bool),
              bias=jnp.zeros((1, HEADS, 4, 5)))  # fmt: skip
