"""te_jax.flax.DotProductAttention and MultiHeadAttention on the CPU backend, against plain fp32
jnp references written here (explicit masks built element by element, softmax with the
off-by-one / learnable sink as an extra logit column, GQA by repeating k/v heads, rotary
embedding through complex multiplication): every layout, mask type, window, bias and softmax
type, gradients, dropout, errors; MultiHeadAttention's parameter tree and its output against a
composition of the reference pieces from that tree, and under FP8 recipes.

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_flax_attention.py
"""

from __future__ import annotations

import functools
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import te_jax
from _refs import HI, LOOSE_DEFAULT, RECIPES, norm_ref, rel
from te_jax.flax import DotProductAttention, MultiHeadAttention
from te_jax.flax import _attention as attention_impl

TIGHT = 1e-5
F32 = jnp.float32
# XLA's compile dominates these small graphs; its cheaper CPU settings halve it (same numerics:
# no fast-math either way)
jit = functools.partial(
    jax.jit,
    compiler_options={"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True},
)


# ---- references (plain fp32 jnp; none of the module's helpers) ----


def mask_ref(sq, skv, causal=False, window=None, pad=None):
    """True = masked out, [1 or b, 1, sq, skv], built element by element."""
    m = np.zeros((1, 1, sq, skv), bool)
    for i in range(sq):
        for j in range(skv):
            if causal and j > i:
                m[0, 0, i, j] = True
            if window is not None:
                left, right = window
                if (left >= 0 and j < i - left) or (right >= 0 and j > i + right):
                    m[0, 0, i, j] = True
    return m if pad is None else (m | np.asarray(pad))


def padding_mask(lens_q, lens_kv, sq, skv):
    """[b, 1, sq, skv]: query rows and key columns past each sequence's length are masked."""
    m = np.zeros((len(lens_q), 1, sq, skv), bool)
    for b, (lq, lk) in enumerate(zip(lens_q, lens_kv, strict=True)):
        m[b, 0, lq:, :] = True
        m[b, 0, :, lk:] = True
    return m


def attention_ref(q, k, v, masked=None, bias=None, bias_type=None, scale=None, offset=None):
    """q [b, sq, h, d], k [b, skv, g, d], v [b, skv, g, dv] -> [b, sq, h, dv]; masked rows -> 0."""
    b, sq, h, d = q.shape
    g, skv = k.shape[2], k.shape[1]
    k, v = jnp.repeat(k, h // g, axis=2), jnp.repeat(v, h // g, axis=2)  # head i reads kv head i // (h/g)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(F32), k.astype(F32), precision=HI)
    if bias_type == "pre":
        s = (s + bias) * scale
    elif bias_type == "post":
        s = s * scale + bias
    else:
        s = s * scale
    masked = jnp.broadcast_to(jnp.zeros((1, 1, sq, skv), bool) if masked is None else masked, s.shape)
    if offset is not None:  # the sink: one more logit per head that attends to nothing
        s = jnp.concatenate([s, jnp.broadcast_to(jnp.reshape(offset, (1, h, 1, 1)), (b, h, sq, 1))], -1)
        masked = jnp.concatenate([masked, jnp.zeros((b, h, sq, 1), bool)], -1)
    p = jax.nn.softmax(jnp.where(masked, -1e30, s), axis=-1)
    p = jnp.where(masked, 0.0, p)[..., :skv]
    return jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(F32), precision=HI)


def rope_ref(x, windows=(1, 10000), method="consecutive", seq_dim=1):
    """Rotary embedding as a complex rotation of coordinate pairs by pos / timescale_i."""
    d = x.shape[-1]
    i = np.arange(d // 2)
    timescale = windows[0] * (windows[1] / windows[0]) ** (2 * i / d)
    shape = [1] * x.ndim
    shape[seq_dim] = x.shape[seq_dim]
    pos = np.arange(x.shape[seq_dim]).reshape(shape)
    rot = np.exp(1j * pos / timescale)
    if method == "consecutive":
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * rot
        return jnp.stack([z.real, z.imag], -1).reshape(x.shape).astype(x.dtype)
    z = (x[..., : d // 2] + 1j * x[..., d // 2 :]) * rot
    return jnp.concatenate([z.real, z.imag], -1).astype(x.dtype)


def mha_ref(p, xq, xkv, *, h, g, d, masked=None, bias=None, rope=None, scale=1.0, kind="layernorm",
            zcg=False, input_ln=True, offset=None):  # fmt: skip
    """MultiHeadAttention composed from reference pieces and the params tree ``p``."""
    self_attn = xkv is None
    xkv = xq if self_attn else xkv
    first = p["qkv"] if "qkv" in p else p["query"]
    ln = norm_ref(xq, first["scale"], first.get("ln_bias"), 1e-6, kind, zcg) if input_ln else xq

    def proj(x, mod):
        y = jnp.tensordot(x, mod["kernel"], axes=1, precision=HI)
        return y + mod["bias"] if "bias" in mod else y

    lead = xq.shape[:2]
    if "qkv" in p:
        qkv = proj(ln, p["qkv"]).reshape(lead + (3, h, d))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
        q = proj(ln, p["query"]).reshape(lead + (h, d))
        src = ln if self_attn else xkv
        if "kv" in p:
            kv = proj(src, p["kv"]).reshape(src.shape[:2] + (2, g, d))
            k, v = kv[:, :, 0], kv[:, :, 1]
        else:
            k = proj(src, p["key"]).reshape(src.shape[:2] + (g, d))
            v = proj(src, p["value"]).reshape(src.shape[:2] + (g, d))
    if rope is not None:
        q, k = rope_ref(q, method=rope), rope_ref(k, method=rope)
    bt = None if bias is None else "post"
    o = attention_ref(q, k, v, masked, bias, bt, scale=scale, offset=offset)
    return proj(o.reshape(lead + (h * d,)), p["out"])


def _rand(seed, shape, dtype=F32, scale=1.0, shift=0.0):
    # numpy's generator: no XLA compile per shape
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale + shift, dtype)


def _qkv(b=2, sq=6, skv=8, h=4, g=4, d=16, dv=None, seed=0):
    return _rand(seed, (b, sq, h, d)), _rand(seed + 1, (b, skv, g, d)), _rand(seed + 2, (b, skv, g, dv or d))


def _leaves(t):
    return jax.tree_util.tree_leaves(t)


def _check(got, want, tol=TIGHT):
    gl, wl = _leaves(got), _leaves(want)
    assert len(gl) == len(wl)
    for a, b in zip(gl, wl, strict=True):
        assert a.shape == b.shape and rel(a, b) <= tol, (a.shape, rel(a, b))


def _pack(layout, q, k, v):
    if layout == "bs3hd":
        return jnp.stack([q, k, v], axis=2), None, None
    if layout == "bshd_bs2hd":
        return q, jnp.stack([k, v], axis=2), None
    return q, k, v


def fwd_bwd(cases):
    """[(fn(*args), the gradients of sum(sin(fn(*args))) w.r.t. each of args) for (fn, args) in
    cases], all in one jitted call: XLA's per-compile cost dominates these small graphs."""

    def one(fn, args):
        def loss(*a):
            y = fn(*a)
            return jnp.sum(jnp.sin(y)), y

        (_, y), g = jax.value_and_grad(loss, argnums=tuple(range(len(args))), has_aux=True)(*args)
        return y, g

    fns = [fn for fn, _ in cases]
    return jit(lambda all_args: [one(fn, a) for fn, a in zip(fns, all_args, strict=True)])(
        [tuple(a) for _, a in cases]
    )


def _dpa(model, variables=None, **kw):
    return lambda *a: model.apply(variables or {}, *a, deterministic=True, **kw)


# ---- DotProductAttention ----

MASK_TYPES = ["no_mask", "padding", "causal", "padding_causal", "causal_padding"]


@pytest.mark.parametrize("layout", ["bs3hd", "bshd_bs2hd", "bshd_bshd_bshd"])
def test_layouts_and_mask_types_forward_and_gradients(layout):
    sq, skv = (8, 8) if layout == "bs3hd" else (6, 8)
    q, k, v = _qkv(sq=sq, skv=skv)
    # the second sequence pads its last 3 queries (rows with every key masked) and 2 keys
    pad = padding_mask([sq, sq - 3], [skv, skv - 2], sq, skv)
    cases = []
    for mask_type in MASK_TYPES:
        model = DotProductAttention(16, 4, attn_mask_type=mask_type, qkv_layout=layout)
        want = mask_ref(sq, skv, causal="causal" in mask_type, pad=pad if "padding" in mask_type else None)
        # a mask is ignored by 'no_mask' and 'causal' (TE): pass one anyway to show it;
        # gradients w.r.t. q, k, v flow through the packing
        cases.append(
            (lambda q, k, v, m=model: _dpa(m, mask=jnp.asarray(pad))(*_pack(layout, q, k, v)), (q, k, v))
        )
        cases.append((lambda q, k, v, w=want: attention_ref(q, k, v, w), (q, k, v)))
    res = fwd_bwd(cases)
    for i, mask_type in enumerate(MASK_TYPES):
        (out, g), (ref, g_ref) = res[2 * i], res[2 * i + 1]
        assert out.shape == (2, sq, 4, 16) and out.dtype == F32, mask_type
        assert rel(out, ref) <= TIGHT, mask_type
        _check(g, g_ref)
        assert all(bool(jnp.all(jnp.isfinite(a))) for a in g), mask_type
        if "padding" in mask_type:  # the padded queries: zero output, zero gradient
            assert float(jnp.abs(out[1, sq - 3 :]).max()) == 0.0
            assert float(jnp.abs(g[0][1, sq - 3 :]).max()) == 0.0
    # the mask types differ from each other on these inputs
    outs = [res[2 * i][0] for i in range(len(MASK_TYPES))]
    assert min(rel(outs[a], outs[b]) for a in range(4) for b in range(a + 1, 4)) > 1e-3
    assert rel(outs[3], outs[4]) == 0.0  # 'padding_causal' is 'causal_padding'


def test_gqa():
    cases = []
    for g, layout in [(1, "bshd_bshd_bshd"), (2, "bshd_bs2hd"), (2, "bshd_bshd_bshd")]:
        model = DotProductAttention(16, 4, num_gqa_groups=g, qkv_layout=layout, attn_mask_type="causal")
        qkv = _qkv(g=g, seed=3)
        cases.append((lambda q, k, v, m=model, lay=layout: _dpa(m)(*_pack(lay, q, k, v)), qkv))
        cases.append((lambda q, k, v: attention_ref(q, k, v, mask_ref(6, 8, causal=True)), qkv))
    res = fwd_bwd(cases)
    for i in range(0, len(res), 2):
        (out, g), (ref, g_ref) = res[i], res[i + 1]
        assert out.shape == (2, 6, 4, 16) and rel(out, ref) <= TIGHT
        _check(g, g_ref)


def test_sliding_window():
    q, k, v = _qkv(sq=8, skv=8, seed=5)
    pad = padding_mask([8, 5], [8, 6], 8, 8)
    configs = [("causal", (2, 0)), ("no_mask", (1, 1)), ("padding", (-1, 2)), ("causal", (3, -1))]
    cases = []
    for mask_type, window in configs:
        model = DotProductAttention(16, 4, attn_mask_type=mask_type, window_size=window)
        padded = pad if mask_type == "padding" else None
        want = mask_ref(8, 8, causal=mask_type == "causal", window=window, pad=padded)
        unwindowed = mask_ref(8, 8, causal=mask_type == "causal", pad=padded)
        cases.append((_dpa(model, mask=jnp.asarray(pad)), (q, k, v)))
        cases.append((lambda q, k, v, w=want: attention_ref(q, k, v, w), (q, k, v)))
        cases.append((lambda q, k, v, w=unwindowed: attention_ref(q, k, v, w), (q, k, v)))
    res = fwd_bwd(cases)
    for i, config in enumerate(configs):
        (out, g), (ref, g_ref), (plain, _) = res[3 * i : 3 * i + 3]
        assert rel(out, ref) <= TIGHT, config
        _check(g, g_ref)
        assert rel(out, plain) > 1e-3, config  # the window really masks something here


def test_bias_types():
    q, k, v = _qkv(seed=7)
    configs = [(None, (1, 4, 6, 8)), ("post_scale_bias", (2, 1, 6, 8)), ("pre_scale_bias", (2, 4, 6, 8))]
    cases = []
    for bias_type, shape in configs:
        bias = _rand(9, shape)
        model = DotProductAttention(
            16, 4, attn_mask_type="no_mask", attn_bias_type=bias_type, scale_factor=0.3
        )
        kind = "pre" if bias_type == "pre_scale_bias" else "post"  # None + a bias: post_scale_bias (TE)
        other = "post" if kind == "pre" else "pre"
        cases.append(
            (lambda q, k, v, b, m=model: m.apply({}, q, k, v, None, b, deterministic=True), (q, k, v, bias))
        )
        cases.append(
            (lambda q, k, v, b, t=kind: attention_ref(q, k, v, None, b, t, scale=0.3), (q, k, v, bias))
        )
        cases.append(
            (lambda q, k, v, b, t=other: attention_ref(q, k, v, None, b, t, scale=0.3), (q, k, v, bias))
        )
    res = fwd_bwd(cases)
    for i, config in enumerate(configs):
        (out, g), (ref, g_ref), (wrong, _) = res[3 * i : 3 * i + 3]
        assert rel(out, ref) <= TIGHT, config
        _check(g, g_ref)  # including the bias gradient
        assert rel(out, wrong) > 1e-3, config


def test_softmax_types():
    q, k, v = _qkv(seed=11)
    pad = jnp.asarray(padding_mask([6, 3], [8, 5], 6, 8))
    want = mask_ref(6, 8, causal=True, pad=pad)
    learned = jnp.array([-1.0, 0.5, 2.0, 0.0])
    kinds = ["vanilla", "off_by_one", "off-by-one", "learnable"]
    cases = []
    for kind in kinds:
        model = DotProductAttention(16, 4, attn_mask_type="padding_causal", softmax_type=kind)
        variables = jax.eval_shape(lambda m=model: m.init(jax.random.PRNGKey(0), q, k, v, mask=pad))
        offset = {"vanilla": None, "learnable": learned}.get(kind, jnp.zeros(4))
        if kind == "learnable":
            assert _shapes(variables) == {"params": {"softmax_offset": (4,)}}
            init = jit(lambda m=model: m.init(jax.random.PRNGKey(0), q, k, v, mask=pad))
            off = nn.unbox(init())["params"]["softmax_offset"]
            assert float(jnp.abs(off).max()) == 0.0  # starts as off-by-one
        else:
            assert variables == {}

        def f(off, q, k, v, m=model, learnable=kind == "learnable"):
            return m.apply(
                {"params": {"softmax_offset": off}} if learnable else {},
                q,
                k,
                v,
                mask=pad,
                deterministic=True,
            )

        cases.append((f, (offset, q, k, v)))
        cases.append((lambda off, q, k, v: attention_ref(q, k, v, want, offset=off), (offset, q, k, v)))
    res = fwd_bwd(cases)
    vanilla = res[0][0]
    for i, kind in enumerate(kinds):
        (out, g), (ref, g_ref) = res[2 * i], res[2 * i + 1]
        assert rel(out, ref) <= TIGHT, kind
        _check(g[1:], g_ref[1:])
        if kind == "learnable":  # the sink logits' gradient
            assert rel(g[0], g_ref[0]) <= TIGHT and float(jnp.abs(g[0]).min()) > 0
        if kind != "vanilla":  # the sink changes the numbers
            assert rel(out, vanilla) > 1e-3, kind
        assert float(jnp.abs(out[1, 3:]).max()) == 0.0  # fully masked rows stay zero with a sink


def test_fully_masked_rows_are_zero_with_finite_gradients():
    q, k, v = _qkv(seed=13)
    mask = np.zeros((2, 1, 6, 8), bool)
    mask[0, 0, 2] = True  # one query sees no key
    mask[1] = True  # a whole sequence sees nothing
    model = DotProductAttention(16, 4, attn_mask_type="padding")
    [(out, g)] = fwd_bwd([(_dpa(model, mask=jnp.asarray(mask)), (q, k, v))])
    assert float(jnp.abs(out[0, 2]).max()) == 0.0 and float(jnp.abs(out[1]).max()) == 0.0
    assert rel(out, attention_ref(q, k, v, mask)) <= TIGHT
    assert all(bool(jnp.all(jnp.isfinite(a))) for a in g)
    assert float(jnp.abs(g[0][1]).max()) == 0.0 and float(jnp.abs(g[2][1]).max()) == 0.0
    assert float(jnp.abs(g[0][0, 2]).max()) == 0.0 and float(jnp.abs(g[0][0, 1]).max()) > 0


def test_bfloat16_inputs_and_float32_logits():
    q, k, v = (t.astype(jnp.bfloat16) for t in _qkv(seed=17))
    models = [DotProductAttention(16, 4, float32_logits=f) for f in (False, True)]
    outs = jit(lambda q, k, v: [_dpa(m)(q, k, v) for m in models])(q, k, v)
    ref = attention_ref(q.astype(F32), k.astype(F32), v.astype(F32), mask_ref(6, 8, causal=True))
    for out in outs:
        assert out.dtype == jnp.bfloat16 and rel(out, ref) <= 1e-2


def test_dropout():
    q, k = _qkv(sq=32, skv=32, seed=19)[:2]
    v = jnp.ones((2, 32, 4, 16))
    model = DotProductAttention(16, 4, attention_dropout=0.5, attn_mask_type="no_mask")
    renamed = DotProductAttention(
        16, 4, attention_dropout=0.5, attn_mask_type="no_mask", dropout_rng_name="attn"
    )

    @jit
    def run(k1, k2):
        def drop(key, m=model, name="dropout"):
            return m.apply({}, q, k, v, rngs={name: key})

        return _dpa(model)(q, k, v), drop(k1), drop(k1), drop(k2), drop(k1, renamed, "attn")

    det, a, b, c, d = run(jax.random.PRNGKey(1), jax.random.PRNGKey(2))
    assert rel(det, attention_ref(q, k, v)) <= TIGHT  # deterministic: no dropout
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # same key, same draw
    np.testing.assert_array_equal(np.asarray(a), np.asarray(d))  # from the named rng stream
    assert rel(a, c) > 0.1 and rel(a, det) > 0.1
    # each output is sum_j p_j keep_j / 0.5 with v = 1: mean 1 (std of the mean ~0.01 here)
    assert abs(float(jnp.mean(a)) - 1.0) < 0.05


def test_transpose_batch_sequence_and_sequence_descriptor():
    q, k, v = _qkv(seed=23)
    pad = jnp.asarray(padding_mask([6, 4], [8, 5], 6, 8))
    bshd = DotProductAttention(16, 4, attn_mask_type="padding")
    sbhd = DotProductAttention(16, 4, attn_mask_type="padding", transpose_batch_sequence=True)

    @jit
    def run(q, k, v, pad):
        t = (jnp.swapaxes(a, 0, 1) for a in (q, k, v))
        # an array passed as sequence_descriptor is the mask (TE's newer spelling)
        return _dpa(bshd, mask=pad)(q, k, v), _dpa(sbhd, mask=pad)(*t), _dpa(bshd)(q, k, v, pad)

    want, got, by_descriptor = run(q, k, v, pad)
    assert rel(want, attention_ref(q, k, v, pad)) <= TIGHT
    np.testing.assert_allclose(np.asarray(jnp.swapaxes(got, 0, 1)), np.asarray(want), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(by_descriptor), np.asarray(want))


def test_fp8_dpa_says_once_that_attention_stays_high_precision(caplog, monkeypatch):
    monkeypatch.setattr(attention_impl, "_told_fp8_attention", False)
    q, k, v = _qkv(seed=29)
    model = DotProductAttention(16, 4)

    def run(q, k, v):
        with te_jax.autocast(enabled=True, recipe=te_jax.recipe.DelayedScaling()):
            plain = _dpa(model)(q, k, v)
        assert not [r for r in caplog.records if "fp8_dpa" in r.getMessage()]
        with te_jax.autocast(enabled=True, recipe=te_jax.recipe.DelayedScaling(fp8_dpa=True)):
            return plain, _dpa(model)(q, k, v), _dpa(model)(q, k, v)

    with caplog.at_level(logging.INFO, logger="te"):
        plain, out, _ = jit(run)(q, k, v)
        jax.eval_shape(run, q, k, v)  # traced again: still said once
    said = [r for r in caplog.records if "fp8_dpa" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    np.testing.assert_array_equal(np.asarray(out), np.asarray(plain))  # attention itself is unquantized


def _dpa_error(model, *args, **kw):
    return model.apply({}, *args, deterministic=True, **kw)


@pytest.mark.parametrize(
    "make,error,message",
    [
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 3), q, k, v), ValueError,
         r"query: expected \[b, s, h, d\] = \('\*', '\*', 3, 16\), got shape \(2, 6, 4, 16\)"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, num_gqa_groups=2), q, k, v), ValueError,
         r"key: expected \[b, s, g, d\] = \('\*', '\*', 2, 16\), got shape \(2, 8, 4, 16\)"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, num_gqa_groups=3), q, k, v), ValueError,
         "DotProductAttention.num_gqa_groups: expected None or an int >= 1 dividing num_attention_heads=4, got 3"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, qkv_layout="bhsd"), q, k, v), ValueError,
         r"DotProductAttention.qkv_layout: expected one of \['bs3hd', .*\], got 'bhsd'"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, qkv_layout="thd_thd_thd"), q, k, v),
         ValueError, "DotProductAttention.attn_mask_type: qkv_layout='thd_thd_thd' \\(packed sequences\\) "
         "takes a padding mask type"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, attn_mask_type="padding"), q, k, v,
                                    mask=jnp.zeros((2, 1, 8, 8), bool)), ValueError,
         r"mask: expected a shape broadcastable to \[b, 1, s_q, s_kv\] = \(2, 1, 6, 8\), got shape \(2, 1, 8, 8\)"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, attn_mask_type="padding"), q, k, v), ValueError,
         r"mask: attn_mask_type='padding' needs a mask \[b, 1, s_q, s_kv\] = \[2, 1, 6, 8\]"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, attn_mask_type="padding"), q, k, v,
                                    mask=jnp.zeros((2, 1, 6, 8))), TypeError, "mask: expected a boolean"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, attn_mask_type="lower"), q, k, v), ValueError,
         r"DotProductAttention.attn_mask_type: expected one of \[.*'causal', .*got 'lower'"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, softmax_type="sparse"), q, k, v), ValueError,
         r"DotProductAttention.softmax_type: expected one of .*got 'sparse'"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, attn_bias_type="no_bias"), q, k, v, None,
                                    jnp.zeros((1, 4, 6, 8))), ValueError,
         "bias: attn_bias_type='no_bias' expects bias=None"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, attn_bias_type="pre_scale_bias"), q, k, v),
         ValueError, "bias: attn_bias_type='pre_scale_bias' expects a bias array, got NoneType"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4), q, k, v, None, jnp.zeros((4, 6, 8))), ValueError,
         r"bias: expected a shape broadcastable to \[b, h, s_q, s_kv\] = \(2, 4, 6, 8\), got shape \(4, 6, 8\)"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, qkv_layout="bs3hd"), jnp.stack([q, q, q], 2), k, None),
         ValueError, "key: qkv_layout='bs3hd' packs q, k and v in query; expected key=None"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4), q, k.astype(jnp.bfloat16), v), TypeError,
         r"key: expected a floating dtype equal to the query's \(float32\), got bfloat16"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4), q, k[:1], v), ValueError,
         "key, value: expected batch 2 \\(the query's\\)"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, window_size=3), q, k, v), ValueError,
         r"DotProductAttention.window_size: expected None or \(left, right\) ints"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, attention_dropout=1.0), q, k, v), ValueError,
         r"DotProductAttention.attention_dropout: expected a float in \[0, 1\), got 1.0"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, context_parallel_axis="cp"), q, k, v),
         NotImplementedError, "context_parallel_axis='cp' is not supported by te_jax yet"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, score_mod=lambda s: s), q, k, v),
         NotImplementedError, "score_mod is not supported by te_jax yet"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4), q, k, v, object()), TypeError,
         "sequence_descriptor: expected a te_jax.attention.SequenceDescriptor or a boolean mask "
         r"\[b, 1, s_q, s_kv\], got object"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4), q, k, v, jnp.zeros((2, 1, 6, 8), bool),
                                    mask=jnp.zeros((2, 1, 6, 8), bool)), ValueError,
         "pass the mask as mask or as sequence_descriptor, not both"),
        (lambda q, k, v: _dpa_error(DotProductAttention(16, 4, context_parallel_strategy="tree"), q, k, v),
         ValueError, "DotProductAttention.context_parallel_strategy: expected one of"),
    ],
)  # fmt: skip
def test_dpa_errors_name_the_argument(make, error, message):
    q, k, v = _qkv()
    with pytest.raises(error, match=message):
        make(q, k, v)


def test_te_enums_are_accepted():
    from te_jax.flax import AttnBiasType, AttnMaskType, AttnSoftmaxType, QKVLayout

    q, k, v = _qkv(seed=31)
    bias = _rand(3, (1, 4, 6, 8))
    a = DotProductAttention(16, 4, attn_mask_type=AttnMaskType.CAUSAL_MASK, qkv_layout=QKVLayout.BSHD_BSHD_BSHD,
                            attn_bias_type=AttnBiasType.PRE_SCALE_BIAS, softmax_type=AttnSoftmaxType.OFF_BY_ONE_SOFTMAX)  # fmt: skip
    b = DotProductAttention(16, 4, attn_mask_type="CAUSAL", qkv_layout="BSHD_BSHD_BSHD",
                            attn_bias_type="pre_scale_bias", softmax_type="off_by_one")  # fmt: skip
    ya, yb = jit(
        lambda q, k, v, bias: [m.apply({}, q, k, v, None, bias, deterministic=True) for m in (a, b)]
    )(q, k, v, bias)
    np.testing.assert_array_equal(np.asarray(ya), np.asarray(yb))
    want = attention_ref(q, k, v, mask_ref(6, 8, causal=True), bias, "pre", offset=jnp.zeros(4))
    assert rel(ya, want) <= TIGHT


# ---- MultiHeadAttention ----


def _x(shape=(2, 16, 64), seed=0, dtype=F32):
    return _rand(seed, shape, dtype, 1.5, 0.2)


def _shapes(tree):
    return jax.tree_util.tree_map(lambda a: tuple(a.shape), nn.unbox(tree))


def _init_shapes(model, *args):
    # the inputs closed over: inputs_q is inputs_kv (self attention) holds while tracing
    return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *args))


def random_params(shapes, seed):
    """Parameters of the given shapes: kernels ~ N(0, 1/fan_in), norms' scales ~ 1, the rest
    small; drawn with numpy (the reference tests the wiring, not the initializers)."""
    leaves, tree = jax.tree_util.tree_flatten_with_path(nn.unbox(shapes))
    out = []
    for i, (path, leaf) in enumerate(leaves):
        shape = leaf.shape
        name = jax.tree_util.keystr(path)
        if "kernel" in name:
            out.append(_rand(seed + i, shape, scale=1 / np.sqrt(shape[0])))
        elif "scale" in name:
            out.append(_rand(seed + i, shape, scale=0.1, shift=0.0 if "zcg" in name else 1.0))
        else:
            out.append(_rand(seed + i, shape, scale=0.3))
    return jax.tree_util.tree_unflatten(tree, out)


def test_mha_parameter_trees():
    x, enc = _x(), _x((2, 12, 64), seed=1)

    def shapes(model, kv=None):
        return _shapes(_init_shapes(model, x, x if kv is None else kv)["params"])

    ln = {"scale": (64,), "ln_bias": (64,)}
    assert shapes(MultiHeadAttention(16, 4)) == {
        "qkv": {**ln, "kernel": (64, 3, 64)},
        "out": {"kernel": (64, 64)},
    }
    assert shapes(MultiHeadAttention(16, 4, num_gqa_groups=2, use_bias=True)) == {
        "query": {**ln, "kernel": (64, 64), "bias": (64,)},
        "kv": {"kernel": (64, 2, 32), "bias": (2, 32)},
        "out": {"kernel": (64, 64), "bias": (64,)},
    }
    assert shapes(MultiHeadAttention(16, 4), enc) == {
        "query": {**ln, "kernel": (64, 64)},
        "kv": {"kernel": (64, 2, 64)},
        "out": {"kernel": (64, 64)},
    }
    assert shapes(MultiHeadAttention(8, 4, fuse_qkv_params=False, layernorm_type="rmsnorm")) == {
        "query": {"scale": (64,), "kernel": (64, 32)},
        "key": {"kernel": (64, 32)},
        "value": {"kernel": (64, 32)},
        "out": {"kernel": (32, 64)},
    }
    assert shapes(MultiHeadAttention(16, 4, input_layernorm=False, softmax_type="learnable")) == {
        "qkv": {"kernel": (64, 3, 64)},
        "out": {"kernel": (64, 64)},
        "DotProductAttention_0": {"softmax_offset": (4,)},
    }


def test_mha_initializers():
    x = _x((2, 4, 256))
    models = [MultiHeadAttention(64, 4, scaled_query_init=s, use_bias=True) for s in (True, False)]
    scaled, plain = jit(lambda: [nn.unbox(m.init(jax.random.PRNGKey(0), x, x))["params"] for m in models])()
    for p, want in ((scaled, 1 / 8), (plain, 1.0)):  # the query slice divided by sqrt(head_dim)
        kernel = p["qkv"]["kernel"]
        ratio = float(jnp.std(kernel[:, 0]) / jnp.std(kernel[:, 1]))
        assert abs(ratio - want) < 0.1 * want
        assert abs(float(jnp.std(kernel[:, 2])) - 1 / 16) < 0.01  # variance_scaling(1, fan_in=256, normal)
        assert float(jnp.abs(kernel[:, 1] - kernel[:, 2]).max()) > 0  # slices drawn apart
        assert (
            float(jnp.abs(p["qkv"]["bias"]).max()) == 0.0 and float(jnp.abs(p["qkv"]["scale"] - 1).max()) == 0
        )


MHA_CASES = {
    "packed_rope": (dict(enable_rotary_pos_emb=True), {"rope": "consecutive"}),
    "gqa_bias_zcg_rope_alternate": (
        dict(num_gqa_groups=2, use_bias=True, zero_centered_gamma=True, enable_rotary_pos_emb=True,
             rotary_pos_emb_group_method="alternate"),
        {"rope": "alternate"},
    ),
    "cross_padding": (dict(attn_mask_type="padding"), {"cross": True}),
    "unfused_rmsnorm_scaled": (dict(fuse_qkv_params=False, layernorm_type="rmsnorm", scale_attn_logits=True), {}),
    "no_ln_bias_learnable": (dict(input_layernorm=False, attn_mask_type="no_mask", softmax_type="learnable"), {"bias": True}),  # noqa: E501
}  # fmt: skip


@pytest.mark.parametrize("case", list(MHA_CASES))
def test_mha_against_reference_composition(case):
    kw, opts = MHA_CASES[case]
    h, d = 4, 16
    groups = kw.get("num_gqa_groups") or h
    x = _x(seed=3)
    enc = _x((2, 12, 64), seed=4) if opts.get("cross") else x
    model = MultiHeadAttention(d, h, **kw)
    sq, skv = x.shape[1], enc.shape[1]
    mask = jnp.asarray(padding_mask([16, 11], [skv, skv - 3], sq, skv))
    bias = _rand(5, (1, h, sq, skv)) if opts.get("bias") else None
    params = random_params(_init_shapes(model, x, enc, mask, bias)["params"], seed=6)
    mask_type = kw.get("attn_mask_type", "causal")
    want_mask = mask_ref(sq, skv, causal="causal" in mask_type, pad=mask if "padding" in mask_type else None)
    scale = 1 / np.sqrt(d) if kw.get("scale_attn_logits") else 1.0
    cross = opts.get("cross", False)

    def f(p, x, enc):
        return model.apply({"params": p}, x, enc if cross else x, mask, bias, deterministic=True)[0]

    def f_ref(p, x, enc):
        offset = p.get("DotProductAttention_0", {}).get("softmax_offset")
        return mha_ref(p, x, enc if cross else None, h=h, g=groups, d=d, masked=want_mask, bias=bias,
                       rope=opts.get("rope"), scale=scale, kind=kw.get("layernorm_type", "layernorm"),
                       zcg=kw.get("zero_centered_gamma", False), input_ln=kw.get("input_layernorm", True),
                       offset=offset)  # fmt: skip

    (y, g), (y_ref, g_ref) = fwd_bwd([(f, (params, x, enc)), (f_ref, (params, x, enc))])
    assert y.shape == x.shape and rel(y, y_ref) <= TIGHT
    _check(g, g_ref)  # every parameter, inputs_q and (cross attention) inputs_kv


def test_mha_return_layernorm_output_and_transpose():
    x = _x(seed=8)
    model = MultiHeadAttention(16, 4, return_layernorm_output=True, enable_rotary_pos_emb=True)
    sb = MultiHeadAttention(16, 4, transpose_batch_sequence=True, enable_rotary_pos_emb=True)
    params = random_params(_init_shapes(model, x, x)["params"], seed=9)

    @jit
    def run(p, x):
        xt = jnp.swapaxes(x, 0, 1)
        return model.apply({"params": p}, x, x), sb.apply({"params": p}, xt, xt)[0]

    (y, ln), y_sb = run(params, x)
    assert rel(ln, norm_ref(x, params["qkv"]["scale"], params["qkv"]["ln_bias"])) <= TIGHT
    np.testing.assert_allclose(np.asarray(jnp.swapaxes(y_sb, 0, 1)), np.asarray(y), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["delayed", "current"])
def test_mha_under_fp8_recipes(name):
    r = RECIPES[name]
    x = _x(seed=9)
    model = MultiHeadAttention(16, 4, num_gqa_groups=2, use_bias=True)
    with te_jax.autocast(enabled=True, recipe=r):
        variables = nn.unbox(jit(lambda: model.init(jax.random.PRNGKey(0), x, x))())
    metas = variables.get("fp8_metas")
    assert (metas is not None) == (name == "delayed")
    if metas is not None:
        assert set(metas) == {"query", "kv", "out"}

    def f(quantized):
        def fn(p, x):
            v = {"params": p} if metas is None else {"params": p, "fp8_metas": metas}
            if not quantized:  # scaled down: sin stays near linear (the gradients measure FP8's error)
                return 0.1 * model.apply({"params": p}, x, x, deterministic=True)[0]
            with te_jax.autocast(enabled=True, recipe=r):
                return 0.1 * model.apply(v, x, x, deterministic=True)[0]

        return fn

    got, want = fwd_bwd([(f(True), (variables["params"], x)), (f(False), (variables["params"], x))])
    for a, b in zip(_leaves(got), _leaves(want), strict=True):
        assert bool(jnp.all(jnp.isfinite(a))) and rel(a, b) <= LOOSE_DEFAULT
    assert rel(got[0], want[0]) > 1e-4  # quantized: not the high-precision numbers


@pytest.mark.parametrize(
    "model,kv,error,message",
    [
        (MultiHeadAttention(16, 4, qkv_format="thd", attn_mask_type="padding"), None, ValueError,
         r"MultiHeadAttention.qkv_format: decode=True \(the KV cache\) takes 'bshd'"),
        (MultiHeadAttention(16, 4, low_rank_adaptation_scope="all"), "x", NotImplementedError,
         "low_rank_adaptation_scope='all' is not supported"),
        (MultiHeadAttention(16, 4, low_rank_adaptation_scope="some"), "x", ValueError,
         "MultiHeadAttention.low_rank_adaptation_scope: expected one of"),
        (MultiHeadAttention(16, 4, enable_rotary_pos_emb=True, rotary_pos_emb_group_method="pairs"), "x",
         ValueError, "MultiHeadAttention.rotary_pos_emb_group_method: expected 'consecutive' or 'alternate'"),
        (MultiHeadAttention(15, 4, enable_rotary_pos_emb=True), "x", ValueError, "expected an even head_dim, got 15"),
        (MultiHeadAttention(16, 4, attn_mask_type="diag"), "x", ValueError, "MultiHeadAttention.attn_mask_type"),
        (MultiHeadAttention(16, 4, attention_dropout=-0.1), "x", ValueError,
         r"MultiHeadAttention.attention_dropout: expected a float in \[0, 1\)"),
        (MultiHeadAttention(16, 4), "bf16", TypeError, "inputs_kv: expected inputs_q's dtype float32, got bfloat16"),
        (MultiHeadAttention(16, 4), "2d", ValueError, r"inputs_kv: expected \[batch, seq, hidden\] \(3 dims\)"),
        (MultiHeadAttention(16, 0), "x", ValueError, "MultiHeadAttention.num_attention_heads: expected an int >= 1"),
    ],
)  # fmt: skip
def test_mha_errors_name_the_argument(model, kv, error, message):
    x = _x()
    other = {"x": x, "bf16": x.astype(jnp.bfloat16), "2d": x[0]}.get(kv, x)
    with pytest.raises(error, match=message):
        model.init(jax.random.PRNGKey(0), x, x if kv is None else other, decode=kv is None)
