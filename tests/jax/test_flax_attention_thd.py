"""Packed sequences (TE-JAX's THD layouts) and te_jax.attention.SequenceDescriptor on the CPU
backend: DotProductAttention against a plain fp64 numpy reference that cuts every segment out
of its row and attends within it alone (so it never builds a packed mask), forward and, with the
softmax's backward written out, gradients for one random cotangent; the descriptor's constructors against each other; BSHD descriptors
and the bottom-right causal masks against masks written element by element; MultiHeadAttention
and TransformerLayer on packed rows against each segment run alone in BSHD with the same
parameters; errors.

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_flax_attention_thd.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _refs import rel
from te_jax.attention import SequenceDescriptor
from te_jax.flax import DotProductAttention, MultiHeadAttention, TransformerLayer
from test_flax_attention import F32, TIGHT, _check, _rand, attention_ref, jit, mask_ref, padding_mask

B, SQ, SKV, H, D = 4, 12, 14, 4, 8


# ---- packed batches ----


def packed(rows, s):
    """(segment ids [b, s], positions [b, s]) of rows given as [(segment id, padding before, length)]."""
    ids = np.zeros((len(rows), s), np.int32)
    pos = np.zeros((len(rows), s), np.int32)
    for r, segments in enumerate(rows):
        t = 0
        for seg, gap, n in segments:
            t += gap
            ids[r, t : t + n], pos[r, t : t + n] = seg, np.arange(n)
            t += n
        assert t <= s, (r, t, s)
    return ids, pos


def random_row(rng, s, ids):
    """Segments of random lengths 1..5 with the given ids, sometimes padding between them."""
    out, t = [], 0
    for seg in ids:
        gap, n = int(rng.integers(0, 2)), int(rng.integers(1, 6))
        if t + gap + n > s:
            break
        out.append((seg, gap, n))
        t += gap + n
    return out


def batches(seed=0):
    """Self attention (ids, pos) [B, SQ], and cross attention's query [B, SQ] and key/value
    [B, SKV] sides: a length-1 segment, segments ending at the row's end, padding between
    segments and after them, a row of padding only, a query segment without keys (id 3 of row
    1) and keys without queries (id 4 of row 1), one random row."""
    rng = np.random.default_rng(seed)
    self_rows = [
        [(1, 0, 1), (2, 0, 4), (3, 0, 7)],
        [(1, 1, 5), (2, 2, 1), (3, 0, 2)],
        [],
        random_row(rng, SQ, [1, 2, 3, 4]),
    ]
    q_rows = [
        [(1, 0, 1), (2, 0, 4), (3, 0, 7)],
        [(1, 1, 5), (2, 2, 1), (3, 0, 2)],
        [],
        random_row(rng, SQ, [1, 2, 3]),
    ]
    kv_rows = [
        [(1, 0, 3), (2, 0, 4), (3, 0, 7)],
        [(1, 0, 6), (2, 1, 3), (4, 0, 2)],
        [],
        random_row(rng, SKV, [1, 2, 3]),
    ]
    return packed(self_rows, SQ), packed(q_rows, SQ), packed(kv_rows, SKV)


SELF, CROSS_Q, CROSS_KV = batches()


def attend(q, k, v, masked, bias=None, bias_type=None, scale=None, offset=None, dout=None):
    """One sequence in fp64 numpy: q [l_q, h, d], k [l_kv, g, d], v [l_kv, g, d_v], masked
    [l_q, l_kv] (True = hidden), bias [h or 1, l_q, l_kv], offset [h] (a sink logit: exp(offset)
    joins the denominator), dout [l_q, h, d_v] -> (out, (dq, dk, dv)): the softmax's backward
    written out, not differentiated by jax. A query that sees no key gets 0."""
    h, g = q.shape[1], k.shape[1]
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    kh, vh = np.repeat(k, h // g, axis=1), np.repeat(v, h // g, axis=1)  # head i reads kv head i // (h/g)
    s = np.einsum("qhd,khd->hqk", q, kh)
    s = (s + bias) * scale if bias_type == "pre" else s * scale + (0.0 if bias is None else bias)
    s = np.where(masked, -np.inf, s)
    sink = np.full((h, 1, 1), -np.inf) if offset is None else np.reshape(offset, (h, 1, 1))
    m = np.maximum(s.max(-1, keepdims=True, initial=-np.inf), sink)
    m = np.where(np.isfinite(m), m, 0.0)
    e, e_sink = np.exp(s - m), np.exp(sink - m)
    denom = e.sum(-1, keepdims=True) + e_sink
    p = np.where(denom > 0, e / np.where(denom > 0, denom, 1.0), 0.0)
    out = np.einsum("hqk,khd->qhd", p, vh)
    if dout is None:
        return out, None
    dp = np.einsum("qhd,khd->hqk", dout, vh)
    ds = p * (dp - np.sum(dp * p, -1, keepdims=True)) * scale  # the sink has no value: no dp
    dq = np.einsum("hqk,khd->qhd", ds, kh)
    dk = np.einsum("hqk,qhd->khd", ds, q).reshape(k.shape[0], g, h // g, -1).sum(2)
    dv = np.einsum("hqk,qhd->khd", p, dout).reshape(v.shape[0], g, h // g, -1).sum(2)
    return out, (dq, dk, dv)


def thd_ref(q, k, v, ids_q, ids_kv, *, causal=False, bottom_right=False, window=None, bias=None,
            bias_type=None, offset=None, dout=None):  # fmt: skip
    """(out [b, s_q, h, d_v], (dq, dk, dv) or None) in fp64: each segment of each row cut out
    and attended alone (top-left or bottom-right causal, window by position in the segment);
    padding queries, and queries whose segment has no key, stay 0."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    bias = None if bias is None else np.asarray(bias, np.float64)
    offset = None if offset is None else np.asarray(offset, np.float64)
    out = np.zeros(q.shape[:3] + (v.shape[-1],))
    grads = (np.zeros_like(q), np.zeros_like(k), np.zeros_like(v))
    for r in range(q.shape[0]):
        for seg in sorted(set(ids_q[r].tolist()) - {0}):
            iq, ik = np.flatnonzero(ids_q[r] == seg), np.flatnonzero(ids_kv[r] == seg)
            if not len(ik):
                continue
            i, j = np.arange(len(iq))[:, None], np.arange(len(ik))[None, :]
            past = j - i - (len(ik) - len(iq) if bottom_right else 0)
            masked = (past > 0) if causal else np.zeros(past.shape, bool)
            if window is not None:
                masked |= ((window[0] >= 0) & (past < -window[0])) | ((window[1] >= 0) & (past > window[1]))
            seg_bias = None if bias is None else bias[min(r, bias.shape[0] - 1)][:, iq][:, :, ik]
            seg_dout = None if dout is None else np.asarray(dout, np.float64)[r, iq]
            o, g = attend(q[r, iq], k[r, ik], v[r, ik], masked, seg_bias, bias_type, None, offset, seg_dout)
            out[r, iq] = o
            if g is not None:
                for acc, idx, part in zip(grads, (iq, ik, ik), g, strict=True):
                    acc[r, idx] += part
    return out if dout is None else (out, grads)


def _pack(layout, q, k, v):
    if layout == "t3hd":
        return jnp.stack([q, k, v], axis=2), None, None
    if layout == "thd_t2hd":
        return q, jnp.stack([k, v], axis=2), None
    return q, k, v


def vjp_all(cases):
    """[(fn(*args), the gradients of sum(fn(*args) * cotangent) w.r.t. args)] for (fn, args,
    cotangent) in cases, in one jitted call (XLA's compile dominates)."""

    def run(all_args, cts):
        res = []
        for (fn, *_), args, ct in zip(cases, all_args, cts, strict=True):
            y, vjp = jax.vjp(fn, *args)
            res.append((y, vjp(ct)))
        return res

    return jit(run)([tuple(c[1]) for c in cases], [c[2] for c in cases])


def _qkv(sq=SQ, skv=SKV, g=H, dv=D, seed=0):
    return _rand(seed, (B, sq, H, D)), _rand(seed + 1, (B, skv, g, D)), _rand(seed + 2, (B, skv, g, dv))


# ---- DotProductAttention, THD ----

# (layout, mask type, window, kv heads, bias type, softmax type, transpose_batch_sequence)
THD_CASES = {
    "t3hd-padding": ("t3hd", "padding", None, H, None, "vanilla", False),
    "t3hd-padding_causal-window": ("t3hd", "padding_causal", (3, 0), H, None, "vanilla", False),
    "t2hd-padding_causal-gqa": ("thd_t2hd", "padding_causal", None, 2, None, "vanilla", False),
    "thd-bottom_right-mqa": ("thd_thd_thd", "padding_causal_bottom_right", None, 1, None, "vanilla", False),
    "thd-bottom_right-window": (
        "thd_thd_thd",
        "padding_causal_bottom_right",
        (1, 0),
        2,
        None,
        "vanilla",
        False,
    ),
    "thd-padding-window-both-sides": ("thd_thd_thd", "padding", (2, 1), H, None, "vanilla", False),
    "thd-post_scale_bias-off_by_one": ("thd_thd_thd", "padding", (-1, 2), 2, "post", "off_by_one", False),
    "t2hd-pre_scale_bias-learnable": ("thd_t2hd", "padding_causal", None, H, "pre", "learnable", False),
    "thd-transposed": ("thd_thd_thd", "causal_padding", None, 2, None, "vanilla", True),
}


def _thd_pair(name, n):
    seed = 10 * n
    layout, mask_type, window, g, bias_kind, softmax, transposed = THD_CASES[name]
    self_attn = layout == "t3hd"
    (ids_q, pos_q), (ids_kv, pos_kv) = (SELF, SELF) if self_attn else (CROSS_Q, CROSS_KV)
    skv = SQ if self_attn else SKV
    # explicit positions for half the cases, the default (from the ids) for the others
    pos = (pos_q, pos_kv) if n % 2 else None
    desc = SequenceDescriptor.from_segment_ids_and_pos((jnp.asarray(ids_q), jnp.asarray(ids_kv)), pos)
    bias = None
    if bias_kind == "post":
        bias = _rand(seed + 5, (1, H, SQ, skv))
    elif bias_kind == "pre":
        bias = _rand(seed + 5, (B, 1, SQ, skv))
    variables, offset = {}, None
    if softmax == "off_by_one":
        offset = jnp.zeros(H)
    elif softmax == "learnable":
        offset = _rand(seed + 6, (H,))
        variables = {"params": {"softmax_offset": offset}}
    # (attn_bias_type None: post-scale when a bias is passed)
    model = DotProductAttention(D, H, num_gqa_groups=g, attn_mask_type=mask_type, qkv_layout=layout,
                                window_size=window, softmax_type=softmax, transpose_batch_sequence=transposed,
                                attn_bias_type="pre_scale_bias" if bias_kind == "pre" else None,
                                max_segments_per_seq=4)  # fmt: skip

    def fn(q, k, v):
        if transposed:
            q, k, v = (jnp.swapaxes(t, 0, 1) for t in (q, k, v))
        y = model.apply(variables, *_pack(layout, q, k, v), desc, bias, deterministic=True)
        return jnp.swapaxes(y, 0, 1) if transposed else y

    dv = 6 if layout == "thd_thd_thd" else D
    qkv = _qkv(skv=skv, g=g, dv=dv, seed=seed)
    dout = _rand(seed + 7, (B, SQ, H, dv))
    want = thd_ref(*qkv, ids_q, ids_kv, causal="causal" in mask_type, bottom_right="bottom_right" in mask_type,
                   window=window, bias=bias, bias_type=bias_kind, offset=offset, dout=dout)  # fmt: skip
    return (fn, qkv, dout), want, ids_q, ids_kv


def test_thd_layouts_against_segments_attended_alone():
    built = [_thd_pair(name, n) for n, name in enumerate(THD_CASES)]
    res = vjp_all([case for case, *_ in built])
    outs = []
    for name, (_, (ref, g_ref), ids_q, ids_kv), (out, g) in zip(THD_CASES, built, res, strict=True):
        assert out.shape == ref.shape and out.dtype == F32, name
        assert rel(out, ref) <= TIGHT, (name, rel(out, ref))
        _check(g, g_ref)
        assert all(bool(jnp.all(jnp.isfinite(a))) for a in g), name
        # padding queries: exactly zero output and zero gradient; so are the padding keys' gradients
        pad_q, pad_kv = ids_q == 0, ids_kv == 0
        assert float(jnp.abs(out[pad_q]).max()) == 0.0 and float(jnp.abs(g[0][pad_q]).max()) == 0.0, name
        assert float(jnp.abs(g[1][pad_kv]).max()) == 0.0 and float(jnp.abs(g[2][pad_kv]).max()) == 0.0, name
        outs.append(out)
    # the row of padding only, and row 1's query segment 3 that has no key, are zeros; the
    # queries whose segment has keys are not
    cross, (ids_q, _), (ids_kv, _) = outs[2], CROSS_Q, CROSS_KV
    assert float(jnp.abs(cross[2]).max()) == 0.0 and float(jnp.abs(cross[1, 9:11]).max()) == 0.0
    seen = np.array([[t != 0 and t in ids_kv[r] for t in ids_q[r]] for r in range(B)])
    assert float(jnp.min(jnp.max(jnp.abs(cross[seen]), axis=(-2, -1)))) > 0.0


def test_thd_dropout_keeps_padding_zero():
    (ids_q, _), (ids_kv, _) = CROSS_Q, CROSS_KV
    desc = SequenceDescriptor.from_segment_ids_and_pos((jnp.asarray(ids_q), jnp.asarray(ids_kv)))
    model = DotProductAttention(
        D, H, attention_dropout=0.5, attn_mask_type="padding", qkv_layout="thd_thd_thd"
    )
    q, k, v = _qkv(seed=7)

    @jit
    def run(q, k, v):
        rngs = {"dropout": jax.random.PRNGKey(3)}
        return (model.apply({}, q, k, v, desc, deterministic=False, rngs=rngs),
                model.apply({}, q, k, v, desc, deterministic=True))  # fmt: skip

    dropped, plain = run(q, k, v)
    pad = ids_q == 0
    assert float(jnp.abs(dropped[pad]).max()) == 0.0 and bool(jnp.all(jnp.isfinite(dropped)))
    assert rel(plain, thd_ref(q, k, v, ids_q, ids_kv)) <= TIGHT
    assert rel(dropped, plain) > 0.1


# ---- SequenceDescriptor ----


def seqlens_and_offsets(ids, slots):
    """TE's (seqlens [b, slots], seq_offsets [b, slots + 1]) of contiguous segments, -1 in the
    unused slots."""
    lens = -np.ones((ids.shape[0], slots), np.int32)
    offs = -np.ones((ids.shape[0], slots + 1), np.int32)
    for r in range(ids.shape[0]):
        starts = [t for t in range(ids.shape[1]) if ids[r, t] and (t == 0 or ids[r, t - 1] != ids[r, t])]
        for n, t in enumerate(starts):
            offs[r, n] = t
            lens[r, n] = int(np.sum(ids[r] == ids[r, t]))
    return lens, offs


def by_slot(ids):
    """The ids renumbered 1, 2, ... in each row's order: from_seqlens_and_offsets pairs a query
    segment with the key/value segment of the same slot."""
    out = np.zeros_like(ids)
    for r in range(ids.shape[0]):
        n = 0
        for t in range(ids.shape[1]):
            if ids[r, t] and (t == 0 or ids[r, t - 1] != ids[r, t]):
                n += 1
            out[r, t] = n if ids[r, t] else 0
    return out


def test_descriptors_from_offsets_ids_and_default_positions_agree():
    (ids_q, pos_q), (ids_kv, pos_kv) = CROSS_Q, CROSS_KV
    ids_q, ids_kv = by_slot(ids_q), by_slot(ids_kv)
    (lq, oq), (lkv, okv) = seqlens_and_offsets(ids_q, 5), seqlens_and_offsets(ids_kv, 4)
    descs = [
        SequenceDescriptor.from_segment_ids_and_pos((jnp.asarray(ids_q), jnp.asarray(ids_kv)),
                                                    (jnp.asarray(pos_q), jnp.asarray(pos_kv))),
        SequenceDescriptor.from_segment_ids_and_pos((jnp.asarray(ids_q), jnp.asarray(ids_kv))),
        SequenceDescriptor.from_seqlens_and_offsets((jnp.asarray(lq), jnp.asarray(lkv)),
                                                    (jnp.asarray(oq), jnp.asarray(okv))),
    ]  # fmt: skip
    real = ids_q != 0  # (a padding token's position is not used)
    np.testing.assert_array_equal(np.asarray(descs[1].segment_pos[0])[real], pos_q[real])
    model = DotProductAttention(D, H, num_gqa_groups=2, attn_mask_type="padding_causal_bottom_right",
                                qkv_layout="thd_thd_thd", window_size=(2, 0))  # fmt: skip
    q, k, v = _qkv(g=2, seed=11)

    # the descriptors go through jit as arguments (a pytree of their arrays)
    @jit
    def run(descs, q, k, v):
        return [model.apply({}, q, k, v, d, deterministic=True) for d in descs]

    outs = run(descs, q, k, v)
    want = thd_ref(q, k, v, ids_q, ids_kv, causal=True, bottom_right=True, window=(2, 0))
    assert rel(outs[0], want) <= TIGHT
    for out in outs[1:]:
        np.testing.assert_array_equal(np.asarray(out), np.asarray(outs[0]))
    # one array stands for both sides
    same = SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids_q))
    assert same.segment_ids[0] is same.segment_ids[1] and descs[2].seqlens[1].shape == (B, 4)
    leaves, tree = jax.tree_util.tree_flatten(descs[2])
    assert len(leaves) == 4 and isinstance(jax.tree_util.tree_unflatten(tree, leaves), SequenceDescriptor)


def test_bshd_descriptors_are_padding_masks():
    q, k, v = _qkv(sq=6, skv=8, seed=13)
    lq, lkv = np.array([6, 3, 1, 0]), np.array([8, 5, 2, 4])
    pad = jnp.asarray(padding_mask(lq, lkv, 6, 8))
    by_lens = SequenceDescriptor.from_seqlens((jnp.asarray(lq), jnp.asarray(lkv)))
    ids = tuple(
        jnp.asarray((np.arange(s)[None] < n[:, None]).astype(np.int32)) for s, n in ((6, lq), (8, lkv))
    )
    by_ids = SequenceDescriptor.from_segment_ids_and_pos(ids)
    models = [DotProductAttention(D, H, attn_mask_type=t) for t in ("padding", "padding_causal")]

    @jit
    def run(q, k, v):
        return [[m.apply({}, q, k, v, s, deterministic=True) for s in (pad, by_lens, by_ids)] for m in models]

    for m, outs in zip(models, run(q, k, v), strict=True):
        want = attention_ref(q, k, v, mask_ref(6, 8, causal=m.attn_mask_type == "padding_causal", pad=pad))
        assert rel(outs[0], want) <= TIGHT
        for out in outs[1:]:
            np.testing.assert_array_equal(np.asarray(out), np.asarray(outs[0]))


def bottom_right_ref(lq, lkv, sq, skv, window=None):
    """[b, 1, sq, skv], True = masked: query i of row r sees key j < lkv[r] when
    j <= i + lkv[r] - lq[r] (and within the window around that diagonal), i < lq[r]."""
    m = np.ones((len(lq), 1, sq, skv), bool)
    for r, (nq, nk) in enumerate(zip(lq, lkv, strict=True)):
        for i in range(nq):
            for j in range(nk):
                diag = i + nk - nq
                m[r, 0, i, j] = j > diag or (window is not None and j < diag - window[0])
    return m


def test_bshd_bottom_right_causal_masks():
    q, k, v = _qkv(sq=6, skv=8, seed=17)
    lq, lkv = np.array([6, 4, 5, 2]), np.array([8, 7, 3, 2])
    pad = jnp.asarray(padding_mask(lq, lkv, 6, 8))
    desc = SequenceDescriptor.from_seqlens((jnp.asarray(lq), jnp.asarray(lkv)))
    full = DotProductAttention(D, H, attn_mask_type="causal_bottom_right")
    padded = DotProductAttention(D, H, attn_mask_type="padding_causal_bottom_right")
    windowed = DotProductAttention(D, H, attn_mask_type="bottom_right_causal_padding", window_size=(1, 0))

    @jit
    def run(q, k, v):
        return (full.apply({}, q, k, v, deterministic=True), padded.apply({}, q, k, v, desc, deterministic=True),
                padded.apply({}, q, k, v, mask=pad, deterministic=True),
                windowed.apply({}, q, k, v, desc, deterministic=True))  # fmt: skip

    out_full, out_desc, out_mask, out_window = run(q, k, v)
    assert rel(out_full, attention_ref(q, k, v, bottom_right_ref([6] * B, [8] * B, 6, 8))) <= TIGHT
    assert rel(out_desc, attention_ref(q, k, v, bottom_right_ref(lq, lkv, 6, 8))) <= TIGHT
    # a mask array: the real lengths are read off it (rows and columns not fully masked)
    np.testing.assert_array_equal(np.asarray(out_mask), np.asarray(out_desc))
    assert rel(out_window, attention_ref(q, k, v, bottom_right_ref(lq, lkv, 6, 8, (1, 0)))) <= TIGHT
    assert rel(out_full, out_desc) > 1e-2


# ---- MultiHeadAttention and TransformerLayer on packed rows ----


def per_segment(apply_bshd, x, ids):
    """[b, s, hidden]: every segment of x run alone through apply_bshd ([n, length, hidden] ->
    the same; the segments of one length go as one batch, each its own row), put back in place."""
    by_length = {}
    for r in range(x.shape[0]):
        for seg in sorted(set(ids[r].tolist()) - {0}):
            idx = np.flatnonzero(ids[r] == seg)
            by_length.setdefault(len(idx), []).append((r, idx))
    out = jnp.zeros_like(x)
    for group in by_length.values():
        ys = apply_bshd(jnp.stack([x[r, idx] for r, idx in group]))
        for (r, idx), y in zip(group, ys, strict=True):
            out = out.at[r, idx].set(y)
    return out


# name: (mask type on packed rows, the same on one segment alone, MultiHeadAttention's options)
MHA_THD = {
    "fused-qkv": ("padding_causal", "causal", {}),
    "gqa-kv": ("padding", "no_mask", dict(num_gqa_groups=2)),
    "separate-rotary": ("causal_padding", "causal", dict(fuse_qkv_params=False, enable_rotary_pos_emb=True)),
}


def test_mha_thd_matches_each_segment_alone():
    ids, _ = SELF
    desc = SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids))
    x = _rand(19, (B, SQ, 32), scale=1.5, shift=0.2)
    models = {
        name: (MultiHeadAttention(D, H, attn_mask_type=packed_mask, qkv_format="thd", **kw),
               MultiHeadAttention(D, H, attn_mask_type=alone_mask, **kw))
        for name, (packed_mask, alone_mask, kw) in MHA_THD.items()
    }  # fmt: skip

    @jit
    def run(x):
        res = {}
        for name, (thd, bshd) in models.items():
            variables = thd.init(jax.random.PRNGKey(1), x, x, desc)
            out, _ = thd.apply(variables, x, x, desc, deterministic=True)
            alone = per_segment(
                lambda xs, b=bshd, v=variables: b.apply(v, xs, xs, deterministic=True)[0], x, ids
            )
            res[name] = out, alone
        return res

    for name, (out, want) in run(x).items():
        real = ids != 0
        assert rel(out[real], want[real]) <= TIGHT, (name, rel(out[real], want[real]))
        assert float(jnp.abs(out[~real]).max()) == 0.0, name  # no bias: the attention's zeros, projected


@pytest.mark.parametrize("mask_type", ["padding", "padding_causal"])
def test_transformer_layer_thd_matches_each_segment_alone(mask_type):
    ids, pos = SELF
    desc = SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), jnp.asarray(pos))
    x = _rand(23, (B, SQ, 32), scale=1.5, shift=0.2)
    common = dict(hidden_size=32, mlp_hidden_size=64, num_attention_heads=H, num_gqa_groups=2, hidden_dropout=0.0,
                  attention_dropout=0.0, intermediate_dropout=0.0)  # fmt: skip
    thd = TransformerLayer(self_attn_mask_type=mask_type, qkv_format="thd", **common)
    bshd = TransformerLayer(self_attn_mask_type="causal" if "causal" in mask_type else "no_mask", **common)

    @jit
    def run(x):
        variables = thd.init(jax.random.PRNGKey(2), x, attention_mask=desc, deterministic=True)
        out = thd.apply(variables, x, attention_mask=desc, deterministic=True)
        return out, per_segment(lambda xs: bshd.apply(variables, xs, deterministic=True), x, ids)

    out, want = run(x)
    real = ids != 0
    assert rel(out[real], want[real]) <= TIGHT, rel(out[real], want[real])
    assert bool(jnp.all(jnp.isfinite(out)))


# ---- errors ----

_IDS = jnp.asarray(SELF[0])


def _dpa(layout="thd_thd_thd", mask_type="padding", **kw):
    q, k, v = _pack(layout.replace("bs3hd", "t3hd"), *_qkv(sq=SQ, skv=SQ))

    def call(seq):
        return DotProductAttention(D, H, qkv_layout=layout, attn_mask_type=mask_type, **kw).apply(
            {}, q, k, v, seq, deterministic=True
        )

    return call


@pytest.mark.parametrize(
    "make,error,message",
    [
        (lambda: SequenceDescriptor.from_seqlens(jnp.zeros((B, 2), jnp.int32)), ValueError,
         r"SequenceDescriptor: seqlens\[0\] \(query\): expected an array of one length per row \[b\] = "
         r"\('\*',\), got shape \(4, 2\)"),
        (lambda: SequenceDescriptor.from_seqlens(jnp.zeros(B)), TypeError,
         r"seqlens\[0\] \(query\): expected an integer array, got dtype float32"),
        (lambda: SequenceDescriptor.from_seqlens([3, 4]), TypeError,
         "SequenceDescriptor: seqlens: expected a jax array, got list"),
        (lambda: SequenceDescriptor.from_seqlens((jnp.zeros(2, int),) * 3), ValueError,
         r"seqlens: expected an array or a \(query, key/value\) tuple of two arrays, got a tuple of 3"),
        (lambda: SequenceDescriptor.from_seqlens((jnp.zeros(2, int), jnp.zeros(3, int))), ValueError,
         "seqlens: expected the same batch size for query and key/value, got 2 and 3"),
        (lambda: SequenceDescriptor.from_seqlens_and_offsets(jnp.zeros((B, 3), int), jnp.zeros((B, 3), int)),
         ValueError, r"seq_offsets\[0\] \(query\): expected segment starts per row \[b, n \+ 1\] = \(4, 4\), "
         r"got shape \(4, 3\)"),
        (lambda: SequenceDescriptor.from_seqlens_and_offsets(jnp.zeros((B, 3), int), None), ValueError,
         "SequenceDescriptor: seq_offsets: expected the segments' starts"),
        (lambda: SequenceDescriptor.from_segment_ids_and_pos(_IDS, jnp.zeros((B, SQ - 1), jnp.int32)), ValueError,
         r"segment_pos\[0\] \(query\): expected the shape of its segment_ids \(4, 12\), got shape \(4, 11\)"),
        (lambda: SequenceDescriptor.from_segment_ids_and_pos(_IDS.astype(F32)), TypeError,
         r"segment_ids\[0\] \(query\): expected an integer or boolean array, got dtype float32"),
        (lambda: SequenceDescriptor(seqlens=jnp.zeros(B, int), segment_ids=_IDS), ValueError,
         r"SequenceDescriptor: expected seqlens \(from_seqlens\), .* got \['seqlens', 'segment_ids'\]"),
        (lambda: SequenceDescriptor(), ValueError, "got nothing"),
        # the layout and the descriptor must agree
        (lambda: _dpa()(SequenceDescriptor.from_seqlens(jnp.full(B, 5))), ValueError,
         r"sequence_descriptor: SequenceDescriptor.from_seqlens describes one sequence per row \(BSHD layouts\); "
         "qkv_layout='thd_thd_thd' needs"),
        (lambda: _dpa("bshd_bshd_bshd")(SequenceDescriptor.from_seqlens_and_offsets(
            jnp.ones((B, 2), int), jnp.zeros((B, 3), int))), ValueError,
         r"from_seqlens_and_offsets describes packed sequences \(THD layouts.*qkv_layout='bshd_bshd_bshd' takes"),
        (lambda: _dpa("t3hd")(jnp.zeros((B, 1, SQ, SQ), bool)), ValueError,
         r"sequence_descriptor: qkv_layout='t3hd' \(packed sequences\) needs a SequenceDescriptor .* got a mask"),
        (lambda: _dpa()(None), ValueError, r"qkv_layout='thd_thd_thd' \(packed sequences\) needs .* got None"),
        (lambda: _dpa(mask_type="causal_bottom_right")(SequenceDescriptor.from_segment_ids_and_pos(_IDS)), ValueError,
         "DotProductAttention.attn_mask_type: qkv_layout='thd_thd_thd' .* takes a padding mask type"),
        (lambda: _dpa()(SequenceDescriptor.from_segment_ids_and_pos(_IDS[:, :-1])), ValueError,
         r"sequence_descriptor.segment_ids\[0\] \(query\): expected \[b, s_q\] of the attention's inputs = "
         r"\(4, 12\), got shape \(4, 11\)"),
        (lambda: _dpa("bshd_bshd_bshd")(SequenceDescriptor.from_seqlens(jnp.full(B - 1, 5))), ValueError,
         r"sequence_descriptor.seqlens\[0\] \(query\): expected \[b\] of the attention's inputs = \(4,\)"),
        (lambda: _dpa(max_segments_per_seq=0)(SequenceDescriptor.from_segment_ids_and_pos(_IDS)), ValueError,
         "DotProductAttention.max_segments_per_seq: expected an int >= 1, got 0"),
        (lambda: MultiHeadAttention(D, H, qkv_format="sbhd").apply({}, *(_rand(0, (B, SQ, 32)),) * 2), ValueError,
         r"MultiHeadAttention.qkv_format: expected 'bshd' or 'thd', got 'sbhd'"),
        (lambda: MultiHeadAttention(D, H, qkv_format="thd").init(jax.random.PRNGKey(0), *(_rand(0, (B, SQ, 32)),) * 2),
         ValueError, "MultiHeadAttention.attn_mask_type: qkv_format='thd' .* takes a padding mask type"),
        (lambda: TransformerLayer(32, 64, H, qkv_format="thd").init(jax.random.PRNGKey(0), _rand(0, (B, SQ, 32))),
         ValueError, "TransformerLayer.self_attn_mask_type: qkv_format='thd' .* got 'causal'"),
    ],
)  # fmt: skip
def test_errors_name_the_argument(make, error, message):
    with pytest.raises(error, match=message):
        make()
