"""te.DotProductAttention on the CPU against the independent reference of _attention_ref.py
(fp64 scores, masks built by loops from TE's documented rules, never te's own mask helpers)."""

from __future__ import annotations

import io
import logging
import math

import pytest
import te_torch as te
import torch
from _attention_ref import (
    F32_TOL,
    LOW_TOL,
    MASK_TYPES,
    alibi_add,
    assert_dead_rows_zero,
    check,
    cu_of,
    dense_ref,
    dpa,
    make_qkv,
    make_thd,
    pad_mask,
    random_mask,
    ref_keep,
    rules,
    setup,
    split,
    thd_ref,
    to_bhsd,
)
from te_torch import _info_once

# ----------------------------------------------------------------------------------------------
# Layouts, mask types, alignment, windows
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sq,skv", [(6, 6), (4, 7), (7, 4)])
@pytest.mark.parametrize("mask_type", MASK_TYPES)
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_mask_types_and_layouts(fmt, mask_type, sq, skv):
    b, h, d = 2, 2, 8
    q, k, v = make_qkv(fmt, b, sq, skv, h, h, d, seed=sq * 10 + skv)
    lens = ([sq, sq - 2], [skv, skv - 2]) if sq == skv else ([sq - 1, sq - 3], [skv, skv - 2])
    masked = random_mask(b, 1, sq, skv, seed=3) if mask_type == "arbitrary" else None
    keep, fwd, _ = setup(mask_type, b, sq, skv, lens, masked, pair=sq != skv)
    m = dpa(h, d, qkv_format=fmt, attn_mask_type=mask_type, attention_type="self" if sq == skv else "cross")
    out = check(m, q, k, v, dense_ref(fmt, keep, 1 / math.sqrt(d)), **fwd)
    assert out.shape == ((sq, b, h * d) if fmt == "sbhd" else (b, sq, h * d))
    assert_dead_rows_zero(out, keep, fmt, h)


@pytest.mark.parametrize("mask_type", ["padding", "padding_causal", "padding_causal_bottom_right"])
def test_forward_overrides_the_modules_format_and_mask_type(mask_type):
    b, h, d, s = 2, 2, 8, 5
    q, k, v = make_qkv("bshd", b, s, s, h, h, d)
    keep, fwd, _ = setup(mask_type, b, s, s, ([5, 3], [5, 3]), pair=False)
    m = dpa(h, d)  # sbhd, causal
    check(
        m,
        q,
        k,
        v,
        dense_ref("bshd", keep, 1 / math.sqrt(d)),
        qkv_format="bshd",
        attn_mask_type=mask_type,
        **fwd,
    )


CAUSAL_TYPES = ("causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right")


@pytest.mark.parametrize("mask_type, override", [(t, o) for t in CAUSAL_TYPES for o in (None, True, False)])
@pytest.mark.parametrize("sq,skv", [(3, 7), (7, 3)])
@pytest.mark.parametrize("where", ["init", "forward"])
def test_causal_alignment_and_bottom_right_diagonal(mask_type, override, sq, skv, where):
    b, h, d = 2, 2, 8
    q, k, v = make_qkv("sbhd", b, sq, skv, h, h, d, seed=4)
    keep, fwd, _ = setup(
        mask_type, b, sq, skv, ([sq, sq - 1], [skv - 1, skv]), bottom_right_diagonal=override
    )
    kw = {"bottom_right_diagonal": override}
    m = dpa(h, d, attn_mask_type=mask_type, **(kw if where == "init" else {}))
    check(m, q, k, v, dense_ref("sbhd", keep, 1 / math.sqrt(d)), **fwd, **(kw if where == "forward" else {}))


WINDOW_CASES = [
    (t, w) for t in ("no_mask", "padding", "arbitrary") for w in ((2, -1), (-1, 1), (2, 1), (0, 0), (1, 3))
]
WINDOW_CASES += [(t, w) for t in CAUSAL_TYPES for w in ((2, 0), (0, 0), (3, -1), (-1, 0))]


@pytest.mark.parametrize("mask_type, window", WINDOW_CASES)
@pytest.mark.parametrize("sq,skv", [(6, 6), (4, 7), (7, 4)])
def test_sliding_windows(mask_type, window, sq, skv):
    b, h, d = 2, 2, 8
    q, k, v = make_qkv("bshd", b, sq, skv, h, h, d, seed=5)
    masked = random_mask(1, 1, sq, skv, p=0.3, seed=9) if mask_type == "arbitrary" else None
    keep, fwd, _ = setup(mask_type, b, sq, skv, ([sq, sq - 2], [skv - 1, skv]), masked, window)
    ref = dense_ref("bshd", keep, 1 / math.sqrt(d))
    check(dpa(h, d, qkv_format="bshd", attn_mask_type=mask_type, window_size=window), q, k, v, ref, **fwd)
    check(dpa(h, d, qkv_format="bshd", attn_mask_type=mask_type), q, k, v, ref, window_size=window, **fwd)


@pytest.mark.parametrize("override", [None, False, True])
def test_window_shift_per_sequence_under_padding(override):
    """Two sequences with different real lengths: each one's own s_kv - s_q moves its band."""
    b, h, d, sq, skv = 2, 2, 8, 5, 8
    q, k, v = make_qkv("sbhd", b, sq, skv, h, h, d, seed=6)
    keep, fwd, _ = setup(
        "padding", b, sq, skv, ([5, 2], [8, 6]), window=(1, 1), bottom_right_diagonal=override
    )
    m = dpa(h, d, attn_mask_type="padding", window_size=(1, 1), bottom_right_diagonal=override)
    check(m, q, k, v, dense_ref("sbhd", keep, 1 / math.sqrt(d)), **fwd)


# ----------------------------------------------------------------------------------------------
# Padding
# ----------------------------------------------------------------------------------------------

PAD_LENS = [([6, 4, 1], [6, 4, 1]), ([6, 0, 3], [6, 0, 3]), ([5, 2, 6], [3, 6, 0])]


@pytest.mark.parametrize("mask_type", ["padding", "padding_causal", "padding_causal_bottom_right"])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("lens_q, lens_kv", PAD_LENS)
def test_padding_by_cu_seqlens(mask_type, fmt, lens_q, lens_kv):
    """Padded sbhd / bshd batches described by cu_seqlens (each sequence's first tokens are real),
    with an empty sequence: its queries and every padding query give zeros."""
    b, h, d, s = 3, 2, 8, 6
    q, k, v = make_qkv(fmt, b, s, s, h, h, d, seed=sum(lens_q) + 7 * sum(lens_kv))
    keep, _, _ = setup(mask_type, b, s, s, (lens_q, lens_kv))
    m = dpa(h, d, qkv_format=fmt, attn_mask_type=mask_type)
    ref = dense_ref(fmt, keep, 1 / math.sqrt(d))
    out = check(m, q, k, v, ref, cu_seqlens_q=cu_of(lens_q), cu_seqlens_kv=cu_of(lens_kv))
    assert assert_dead_rows_zero(out, keep, fmt, h).any()


def test_padding_mask_anywhere_and_fully_padded_rows():
    """A padding mask need not be trailing; a fully padded sequence and padded queries give zeros
    with finite gradients."""
    b, h, d, s = 3, 2, 8, 6
    mask = torch.tensor([[0, 1, 0, 0, 1, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    valid = (~mask).tolist()
    keep = ref_keep(b, s, s, valid_q=valid, valid_kv=valid)
    q, k, v = make_qkv("bshd", b, s, s, h, h, d, seed=11)
    m = dpa(h, d, qkv_format="bshd", attn_mask_type="padding")
    out = check(m, q, k, v, dense_ref("bshd", keep, 1 / math.sqrt(d)), attention_mask=mask.view(b, 1, 1, s))
    assert (out[1] == 0).all() and (out[0, 1] == 0).all() and (out[0, 0] != 0).any()


# ----------------------------------------------------------------------------------------------
# thd
# ----------------------------------------------------------------------------------------------

THD_CASES = {
    # name: (cu_q, cu_kv, cu_q_padded, cu_kv_padded, t_q, t_kv)
    "self": ([0, 3, 8, 10], [0, 3, 8, 10], None, None, 10, 10),
    "cross": ([0, 2, 6, 7], [0, 4, 5, 9], None, None, 7, 9),
    "empty_seq": ([0, 3, 3, 7], [0, 3, 3, 7], None, None, 7, 7),
    "padded": ([0, 3, 5, 9], [0, 3, 5, 9], [0, 4, 8, 12], [0, 4, 8, 12], 14, 14),
    "padded_cross": ([0, 2, 4], [0, 3, 8], [0, 3, 7], [0, 5, 9], 9, 15),
    "tail": ([0, 3, 6], [0, 3, 6], None, None, 8, 8),
    "empty_first": ([0, 0, 3, 7], [0, 0, 3, 7], None, None, 7, 7),
    "empty_last": ([0, 3, 7, 7], [0, 4, 8, 9], None, None, 7, 9),
    "padded_empty": ([0, 2, 2, 5], [0, 2, 2, 5], [0, 3, 4, 6], [0, 3, 4, 6], 9, 9),
    "empty_kv": ([0, 2, 5], [0, 0, 4], None, None, 5, 4),
}


@pytest.mark.parametrize("case", list(THD_CASES))
@pytest.mark.parametrize(
    "mask_type", ["padding", "padding_causal", "padding,causal", "padding_causal_bottom_right"]
)
@pytest.mark.parametrize("window", [None, (1, 0)])
@pytest.mark.parametrize("max_seqlen", [False, True])
def test_thd(case, mask_type, window, max_seqlen):
    cu_q, cu_kv, pad_q, pad_kv, t_q, t_kv = THD_CASES[case]
    h, g, d = 4, 2, 8
    causal, _, br = rules(mask_type)
    if window is not None and not causal:
        window = (1, 1)
    cu_q, cu_kv = (torch.tensor(x, dtype=torch.int32) for x in (cu_q, cu_kv))
    pad_q, pad_kv = (None if x is None else torch.tensor(x, dtype=torch.int32) for x in (pad_q, pad_kv))
    q, k, v = make_thd(t_q, t_kv, h, g, d, seed=len(case))
    fwd = {
        "cu_seqlens_q": cu_q,
        "cu_seqlens_kv": cu_kv,
        "cu_seqlens_q_padded": pad_q,
        "cu_seqlens_kv_padded": pad_kv,
    }
    if window is not None:
        fwd["window_size"] = window
    if max_seqlen:
        fwd["max_seqlen_q"] = int((cu_q[1:] - cu_q[:-1]).max())
        fwd["max_seqlen_kv"] = int((cu_kv[1:] - cu_kv[:-1]).max()) + 3  # larger than needed is fine
    scale = 1 / math.sqrt(d)
    ref = thd_ref(
        cu_q, cu_kv, scale, causal=causal, br=br, window=window or (-1, -1), start_q=pad_q, start_kv=pad_kv
    )
    m = dpa(h, d, num_gqa_groups=g, qkv_format="thd", attn_mask_type=mask_type)
    out = check(m, q, k, v, ref, **fwd)
    assert out.shape == (t_q, h * d)
    # Tokens outside every sequence (between padded starts, past the end) are zero.
    starts = (cu_q if pad_q is None else pad_q)[:-1].tolist()
    lens = (cu_q[1:] - cu_q[:-1]).tolist()
    inside = {s + j for s, n in zip(starts, lens, strict=True) for j in range(n)}
    assert (out[[t for t in range(t_q) if t not in inside]] == 0).all()


@pytest.mark.parametrize("mask_type", ["padding", "padding_causal", "padding_causal_bottom_right"])
def test_thd_alibi(mask_type):
    """ALiBi in packed sequences: the distance is measured inside each sequence, from its own
    diagonal."""
    h, d = 4, 8
    causal, _, br = rules(mask_type)
    cu_q, cu_kv = cu_of([2, 4, 1]), cu_of([4, 1, 4])
    q, k, v = make_thd(7, 9, h, h, d, seed=70)
    m = dpa(h, d, qkv_format="thd", attn_mask_type=mask_type)
    fwd = {"cu_seqlens_q": cu_q, "cu_seqlens_kv": cu_kv, "core_attention_bias_type": "alibi"}
    default = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]
    check(m, q, k, v, thd_ref(cu_q, cu_kv, 1 / math.sqrt(d), causal=causal, br=br, slopes=default), **fwd)
    given = torch.tensor([0.3, 0.1, 0.7, 0.05])
    ref = thd_ref(cu_q, cu_kv, 1 / math.sqrt(d), causal=causal, br=br, slopes=given.tolist())
    check(m, q, k, v, ref, alibi_slopes=given, **fwd)


# ----------------------------------------------------------------------------------------------
# Arbitrary masks, GQA / MQA, MLA head dims, softmax scale, strided inputs
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 1), (1, 3), (2, 3)], ids=["b1ss", "1hss", "bhss"])
def test_arbitrary_mask_shapes(shape):
    b, h, d, sq, skv = 2, 3, 8, 5, 6
    masked = random_mask(*shape, sq, skv, p=0.5, seed=2)
    masked[0, 0, 1] = True  # a query that sees nothing
    masked[-1, -1, 3, :] = False  # one that sees everything
    keep = ref_keep(b, sq, skv, masked=masked, h=h)
    q, k, v = make_qkv("sbhd", b, sq, skv, h, h, d, seed=3)
    m = dpa(h, d, attn_mask_type="arbitrary")
    out = check(m, q, k, v, dense_ref("sbhd", keep, 1 / math.sqrt(d)), attention_mask=masked)
    assert (split(out, "sbhd", h)[0, 0, 1] == 0).all()


@pytest.mark.parametrize("g", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "causal_bottom_right", "padding", "arbitrary"])
def test_grouped_query_attention(g, mask_type):
    """Query head i uses key/value head i // (h / g)."""
    b, h, d, sq, skv = 2, 4, 8, 5, 7
    q, k, v = make_qkv("bshd", b, sq, skv, h, g, d, seed=g)
    masked = random_mask(b, h, sq, skv, p=0.3) if mask_type == "arbitrary" else None
    keep, fwd, _ = setup(mask_type, b, sq, skv, ([5, 3], [7, 4]), masked)
    m = dpa(h, d, num_gqa_groups=g, qkv_format="bshd", attn_mask_type=mask_type)
    check(m, q, k, v, dense_ref("bshd", keep, 1 / math.sqrt(d)), **fwd)


@pytest.mark.parametrize("mask_type", ["causal", "padding_causal_bottom_right", "no_mask"])
@pytest.mark.parametrize("fmt", ["sbhd", "thd"])
def test_mla_head_dims(mask_type, fmt):
    """kv_channels=(d_qk, d_v) with d_qk != d_v: the output has h * d_v channels and the default
    scale is 1 / sqrt(d_qk)."""
    h, g, dk, dv = 4, 2, 12, 6
    causal, _, br = rules(mask_type)
    m = dpa(h, (dk, dv), num_gqa_groups=g, qkv_format=fmt)
    scale = 1 / math.sqrt(dk)
    if fmt == "thd":
        mask_type = {"causal": "padding_causal", "no_mask": "padding"}.get(mask_type, mask_type)
        cu = cu_of([4, 5])
        gen = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(9, n, c, generator=gen) for n, c in ((h, dk), (g, dk), (g, dv)))
        ref = thd_ref(cu, cu, scale, causal=causal, br=br)
        out = check(m, q, k, v, ref, attn_mask_type=mask_type, cu_seqlens_q=cu, cu_seqlens_kv=cu)
        assert out.shape == (9, h * dv)
        return
    b, sq, skv = 2, 5, 6
    q, k, v = make_qkv(fmt, b, sq, skv, h, g, dk, dv, seed=2)
    keep, fwd, _ = setup(mask_type, b, sq, skv, ([5, 2], [6, 4]))
    out = check(m, q, k, v, dense_ref(fmt, keep, scale), attn_mask_type=mask_type, **fwd)
    assert out.shape == (sq, b, h * dv)


@pytest.mark.parametrize("mask_type", ["causal", "no_mask", "padding"])
def test_softmax_scale(mask_type):
    b, h, d, s = 2, 2, 8, 6
    q, k, v = make_qkv("sbhd", b, s, s, h, h, d, seed=8)
    keep, fwd, _ = setup(mask_type, b, s, s, ([6, 4], [6, 4]), pair=False)
    m = dpa(h, d, attn_mask_type=mask_type, softmax_scale=0.9)
    check(m, q, k, v, dense_ref("sbhd", keep, 0.9), **fwd)


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_strided_views_of_a_fused_projection(fmt):
    """q, k, v as views into one fused QKV projection (TE's sb3hd-like layouts), not contiguous."""
    b, h, d, s = 2, 2, 8, 5
    keep = ref_keep(b, s, s, causal=True)
    sb = (s, b) if fmt == "sbhd" else (b, s)
    for shape, chunk in (
        ((*sb, h, 3 * d), lambda x: x.split(d, dim=-1)),
        ((*sb, 3 * h, d), lambda x: x.chunk(3, 2)),
    ):
        q, k, v = chunk(torch.randn(shape, generator=torch.Generator().manual_seed(3)))
        assert not q.is_contiguous()
        check(dpa(h, d, qkv_format=fmt), q, k, v, dense_ref(fmt, keep, 1 / math.sqrt(d)))


# ----------------------------------------------------------------------------------------------
# Biases
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias_type", ["post_scale_bias", "pre_scale_bias"])
@pytest.mark.parametrize("shape", [(1, 3), (2, 1), (2, 3), (1, 1)], ids=["1hss", "b1ss", "bhss", "11ss"])
@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "padding_causal_bottom_right"])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_bias(bias_type, shape, mask_type, fmt):
    """The bias is added to the scaled scores (post) or to the scores before the scale (pre), and
    its gradient is the reference's (summed over broadcast dims)."""
    b, h, d, sq, skv, scale = 2, 3, 8, 5, 6, 0.4
    q, k, v = make_qkv(fmt, b, sq, skv, h, h, d, seed=12)
    keep, fwd, _ = setup(mask_type, b, sq, skv, ([5, 2], [6, 3]))
    bias = torch.randn(*shape, sq, skv, generator=torch.Generator().manual_seed(13)).mul(2).requires_grad_()
    bias_ref = bias.detach().double().requires_grad_()
    reference = dense_ref(fmt, keep, scale)

    def ref(q_, k_, v_):
        return reference(q_, k_, v_, add=bias_ref * scale if bias_type == "pre_scale_bias" else bias_ref)

    m = dpa(h, d, qkv_format=fmt, attn_mask_type=mask_type, softmax_scale=scale)
    fwd.update(core_attention_bias_type=bias_type, core_attention_bias=bias)
    check(m, q, k, v, ref, extra=[(bias, bias_ref)], **fwd)


ALIBI_DEFAULTS = [(8, [2.0**-k for k in range(1, 9)]), (6, [2.0**-k for k in (2, 4, 6, 8, 1, 3)])]


@pytest.mark.parametrize("h, slopes", ALIBI_DEFAULTS, ids=["8heads", "6heads"])
@pytest.mark.parametrize(
    "mask_type", ["causal", "causal_bottom_right", "no_mask", "padding_causal_bottom_right"]
)
def test_alibi_default_slopes(h, slopes, mask_type):
    """ALiBi's geometric slopes (Press et al.; 8 heads: 2^-1 ... 2^-8), the distance measured from
    the mask's diagonal (per sequence under padding)."""
    b, d, sq, skv = 2, 4, 4, 6
    q, k, v = make_qkv("sbhd", b, sq, skv, h, h, d, seed=h)
    keep, fwd, shifts = setup(mask_type, b, sq, skv, ([4, 2], [6, 5]))
    add = alibi_add([slopes] * b, b, h, sq, skv, shifts)
    m = dpa(h, d, attn_mask_type=mask_type)
    check(
        m,
        q,
        k,
        v,
        dense_ref("sbhd", keep, 1 / math.sqrt(d), add=add),
        core_attention_bias_type="alibi",
        **fwd,
    )


@pytest.mark.parametrize("per_batch", [False, True], ids=["h", "bh"])
@pytest.mark.parametrize("mask_type", ["causal", "padding", "causal_bottom_right"])
def test_alibi_given_slopes(per_batch, mask_type):
    b, h, d, sq, skv = 2, 3, 8, 5, 7
    gen = torch.Generator().manual_seed(5)
    slopes = torch.rand(*((b, h) if per_batch else (h,)), generator=gen) + 0.1
    rows = slopes.tolist() if per_batch else [slopes.tolist()] * b
    q, k, v = make_qkv("bshd", b, sq, skv, h, h, d, seed=6)
    keep, fwd, shifts = setup(mask_type, b, sq, skv, ([5, 3], [4, 7]))
    ref = dense_ref("bshd", keep, 1 / math.sqrt(d), add=alibi_add(rows, b, h, sq, skv, shifts))
    m = dpa(h, d, qkv_format="bshd", attn_mask_type=mask_type)
    check(m, q, k, v, ref, core_attention_bias_type="alibi", alibi_slopes=slopes, **fwd)


# ----------------------------------------------------------------------------------------------
# Softmax variants, max logit, dtypes
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("softmax_type", ["off-by-one", "learnable"])
@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "padding_causal_bottom_right", "arbitrary"])
@pytest.mark.parametrize("g", [4, 2])
def test_softmax_types(softmax_type, mask_type, g):
    """off-by-one: + exp(0) in the denominator; learnable: + exp(softmax_offset[0, h, 0, 0]), and
    softmax_offset gets the reference's gradient. A query that sees no key gives zeros."""
    b, h, d, sq, skv = 2, 4, 8, 5, 6
    q, k, v = make_qkv("sbhd", b, sq, skv, h, g, d, seed=20)
    masked = None
    if mask_type == "arbitrary":
        masked = random_mask(b, 1, sq, skv)
        masked[1, 0, 2] = True
    keep, fwd, _ = setup(mask_type, b, sq, skv, ([5, 3], [6, 1]), masked)
    m = dpa(h, d, num_gqa_groups=g, attn_mask_type=mask_type, softmax_type=softmax_type)
    extra, sink = [], torch.zeros(h, dtype=torch.float64)
    if softmax_type == "learnable":
        offset = m.softmax_offset
        assert offset.shape == (1, h, 1, 1) and offset.dtype == torch.float32 and (offset == 0).all()
        with torch.no_grad():
            offset.copy_(torch.tensor([1.5, -1.0, 0.3, 3.0]).view(1, h, 1, 1))
        sink = offset.detach().double().view(h).requires_grad_()
        extra = [(offset, sink)]
    out = check(m, q, k, v, dense_ref("sbhd", keep, 1 / math.sqrt(d), sink=sink), extra=extra, **fwd)
    assert_dead_rows_zero(out, keep, "sbhd", h)


def test_learnable_sink_in_thd():
    h, g, d = 4, 2, 8
    cu = cu_of([3, 0, 5])
    q, k, v = make_thd(8, 8, h, g, d, seed=3)
    m = dpa(
        h, d, num_gqa_groups=g, qkv_format="thd", attn_mask_type="padding_causal", softmax_type="learnable"
    )
    with torch.no_grad():
        m.softmax_offset.copy_(torch.tensor([0.5, -2.0, 1.0, 0.0]).view(1, h, 1, 1))
    sink = m.softmax_offset.detach().double().view(h).requires_grad_()
    ref = thd_ref(cu, cu, 1 / math.sqrt(d), causal=True, br=False, sink=sink)
    check(m, q, k, v, ref, extra=[(m.softmax_offset, sink)], cu_seqlens_q=cu, cu_seqlens_kv=cu)


def ref_max_logit(q, k, keep, scale):
    """Per-head max over (batch, query, key) of the masked scaled scores, [h]."""
    h, g = q.shape[1], k.shape[1]
    k = k[:, [i // (h // g) for i in range(h)]]
    s = torch.einsum("bhid,bhjd->bhij", q.double(), k.double()) * scale
    return s.masked_fill(~keep, float("-inf")).amax(dim=(0, 2, 3))


@pytest.mark.parametrize("mask_type", ["causal", "padding_causal", "no_mask"])
@pytest.mark.parametrize("g", [4, 2])
def test_return_max_logit(mask_type, g):
    b, h, d, s = 2, 4, 8, 6
    q, k, v = make_qkv("bshd", b, s, s, h, g, d, seed=30)
    keep, fwd, _ = setup(mask_type, b, s, s, ([6, 2], [6, 2]), pair=False)
    kw = {"num_gqa_groups": g, "qkv_format": "bshd", "attn_mask_type": mask_type, "softmax_scale": 0.5}
    m = dpa(h, d, return_max_logit=True, **kw)
    out, max_logit = m(q, k, v, **fwd)
    assert max_logit.shape == (h,) and max_logit.dtype == torch.float32
    want = ref_max_logit(to_bhsd(q, "bshd"), to_bhsd(k, "bshd"), keep, 0.5)
    torch.testing.assert_close(max_logit.double(), want, **F32_TOL)
    unmasked = ref_max_logit(
        to_bhsd(q, "bshd"), to_bhsd(k, "bshd"), torch.ones(1, 1, s, s, dtype=torch.bool), 0.5
    )
    if mask_type != "no_mask":
        assert (unmasked > want).any()  # the mask matters for this data
    check(m, q, k, v, dense_ref("bshd", keep, 0.5), **fwd)
    assert torch.equal(out, dpa(h, d, **kw)(q, k, v, **fwd))  # the output is the same without it


def test_return_max_logit_thd():
    h, d = 2, 8
    cu = cu_of([4, 5])
    q, k, v = make_thd(9, 9, h, h, d, seed=31)
    m = dpa(h, d, qkv_format="thd", attn_mask_type="padding_causal", return_max_logit=True)
    out, max_logit = m(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    want = torch.full((h,), float("-inf"), dtype=torch.float64)
    for a, e in ((0, 4), (4, 9)):
        qi, ki = q[a:e].permute(1, 0, 2)[None], k[a:e].permute(1, 0, 2)[None]
        keep = ref_keep(1, e - a, e - a, causal=True)
        want = torch.maximum(want, ref_max_logit(qi, ki, keep, 1 / math.sqrt(d)))
    torch.testing.assert_close(max_logit.double(), want, **F32_TOL)
    ref = thd_ref(cu, cu, 1 / math.sqrt(d), causal=True, br=False)(q, k, v)
    torch.testing.assert_close(out.double(), ref, **F32_TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask_type", ["causal", "padding_causal_bottom_right", "arbitrary"])
def test_low_precision(dtype, mask_type):
    b, h, d, sq, skv = 2, 2, 16, 6, 8
    q, k, v = make_qkv("bshd", b, sq, skv, h, 1, d, dtype=dtype, seed=40)
    masked = random_mask(b, 1, sq, skv) if mask_type == "arbitrary" else None
    keep, fwd, _ = setup(mask_type, b, sq, skv, ([6, 4], [8, 5]), masked)
    m = dpa(h, d, num_gqa_groups=1, qkv_format="bshd", attn_mask_type=mask_type)
    tol = LOW_TOL[dtype]
    grad_tol = {key: 2 * x for key, x in tol.items()}
    out = check(m, q, k, v, dense_ref("bshd", keep, 1 / math.sqrt(d)), tol=tol, grad_tol=grad_tol, **fwd)
    assert out.dtype == dtype


# ----------------------------------------------------------------------------------------------
# Dropout, RNG trackers, recomputation
# ----------------------------------------------------------------------------------------------


def test_dropout_off_in_eval_and_at_zero():
    b, h, d, s = 2, 2, 8, 6
    q, k, v = make_qkv("sbhd", b, s, s, h, h, d, seed=50)
    ref = dense_ref("sbhd", ref_keep(b, s, s, causal=True), 1 / math.sqrt(d))
    check(dpa(h, d, attention_dropout=0.5).eval(), q, k, v, ref)
    check(dpa(h, d, attention_dropout=0.0).train(), q, k, v, ref)


def test_dropout_is_seeded_by_torch():
    b, h, d, s = 2, 2, 8, 6
    q, k, v = make_qkv("sbhd", b, s, s, h, h, d, seed=51)
    m = dpa(h, d, attention_dropout=0.3, attn_mask_type="no_mask")
    outs = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        outs.append(m(q, k, v))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    ref = dense_ref("sbhd", ref_keep(b, s, s), 1 / math.sqrt(d))(q, k, v)
    assert not torch.allclose(outs[0].double(), ref, atol=1e-3)


@pytest.mark.parametrize("mask_type", ["causal", "no_mask", "padding"])
def test_dropout_drops_probabilities_and_rescales(mask_type):
    """Uniform scores (q = 0) and one-hot values (v = identity) expose each attention probability:
    out[i, j] = keep_ij * p_ij / (1 - p) with p_ij = 1 / (keys query i sees). Masked keys stay 0,
    the kept fraction is 1 - p and the expectation is the probability."""
    b, h, s, p = 4, 4, 16, 0.25
    keep, fwd, _ = setup(mask_type, b, s, s, ([16, 10, 5, 16], [16, 10, 5, 16]), pair=False)
    keep = keep[:, 0]  # [b, s, s]
    q, k = torch.zeros(b, s, h, 8), torch.randn(b, s, h, 8)
    v = torch.eye(s).view(1, s, 1, s).expand(b, s, h, s).contiguous()
    m = dpa(h, (8, s), qkv_format="bshd", attention_dropout=p, attn_mask_type=mask_type)
    torch.manual_seed(3)
    out = split(m(q, k, v, **fwd), "bshd", h)  # [b, h, s_q, s_kv]
    n = keep.sum(-1, keepdim=True).clamp(min=1).double()[:, None]  # keys each query sees
    scaled = out.double() * n * (1 - p)  # 1 where kept, 0 where dropped or masked
    assert torch.allclose(scaled, scaled.round(), atol=1e-4)
    assert ((scaled.round() == 0) | (scaled.round() == 1)).all()
    kept_mask = keep[:, None].expand_as(scaled)
    assert (scaled[~kept_mask].abs() < 1e-6).all()
    assert abs(scaled.round()[kept_mask].mean().item() - (1 - p)) < 0.03  # ~2500 draws: 3 sigma ~0.026
    # The mean over many rows of sum_j out[i, j] is 1 (an unbiased estimate of sum_j p_ij).
    rows = out.double().sum(-1)[keep.any(-1)[:, None].expand(b, h, s)]
    assert abs(rows.mean().item() - 1) < 0.05


def _tracker(seed):
    t = te.CudaRNGStatesTracker(device="cpu")
    t.add("model-parallel-rng", seed)
    return t


def test_rng_tracker_draws_the_dropout_and_leaves_the_global_state():
    b, h, d, s = 2, 2, 8, 6
    q, k, v = make_qkv("sbhd", b, s, s, h, h, d, seed=52)

    def run(tracker):
        return dpa(h, d, attention_dropout=0.4, get_rng_state_tracker=lambda: tracker)(q, k, v)

    t1 = _tracker(123)
    torch.manual_seed(0)
    outside = torch.get_rng_state()
    before = t1.get_states()["model-parallel-rng"].clone()
    a = run(t1)
    assert torch.equal(torch.get_rng_state(), outside)  # the global generator is untouched
    assert not torch.equal(t1.get_states()["model-parallel-rng"], before)  # the tracker's advanced
    # The draws are the tracker's: the plain module after torch.manual_seed(123) draws the same.
    torch.manual_seed(123)
    assert torch.equal(a, dpa(h, d, attention_dropout=0.4)(q, k, v))
    assert torch.equal(a, run(_tracker(123))) and not torch.equal(a, run(_tracker(124)))
    # Without dropout the tracker is not drawn from.
    t4 = _tracker(5)
    s4 = t4.get_states()["model-parallel-rng"].clone()
    dpa(h, d, get_rng_state_tracker=lambda: t4)(q, k, v)
    assert torch.equal(t4.get_states()["model-parallel-rng"], s4)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("with_tracker", [False, True])
@pytest.mark.parametrize("mask_type", ["causal", "padding_causal_bottom_right"])
def test_checkpoint_core_attention_matches(dropout, with_tracker, mask_type):
    b, h, d, s = 2, 2, 8, 6
    q, k, v = make_qkv("sbhd", b, s, s, h, h, d, seed=53)
    keep, fwd, _ = setup(mask_type, b, s, s, ([6, 3], [6, 3]), pair=False)
    results = []
    for ckpt in (False, True):
        t = _tracker(77)
        kw = {"get_rng_state_tracker": lambda t=t: t} if with_tracker else {}
        m = dpa(h, d, attention_dropout=dropout, attn_mask_type=mask_type, **kw)
        torch.manual_seed(11)
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = m(*leaves, checkpoint_core_attention=ckpt, **fwd)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        results.append((out.detach(), [x.grad for x in leaves]))
    (o1, g1), (o2, g2) = results
    assert torch.equal(o1, o2)
    for a, c in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, c, atol=0, rtol=0)
    if dropout == 0:
        torch.testing.assert_close(o1.double(), dense_ref("sbhd", keep, 1 / math.sqrt(d))(q, k, v), **F32_TOL)


# ----------------------------------------------------------------------------------------------
# Tensor parallel heads, FP8 recipes, torch.compile, state dicts
# ----------------------------------------------------------------------------------------------


def test_tp_size_divides_the_heads():
    h, g, d, tp, b, s = 8, 4, 8, 2, 2, 5
    m = dpa(h, d, num_gqa_groups=g, tp_size=tp, attn_mask_type="causal")
    assert m.num_attention_heads == h and m.hidden_size_per_partition == h // tp * d
    q, k, v = make_qkv("sbhd", b, s, s, h // tp, g // tp, d, seed=60)
    keep = ref_keep(b, s, s, causal=True)
    out = check(m, q, k, v, dense_ref("sbhd", keep, 1 / math.sqrt(d)))
    assert out.shape == (s, b, h // tp * d)
    with pytest.raises(ValueError, match="query_layer"):
        m(*make_qkv("sbhd", b, s, s, h, g, d))
    with pytest.raises(ValueError, match="tp_size"):
        dpa(8, d, tp_size=3)
    with pytest.raises(ValueError, match="num_gqa_groups=2: expected a multiple of tp_size=4"):
        dpa(8, d, num_gqa_groups=2, tp_size=4)
    assert dpa(h, d, tp_size=tp, softmax_type="learnable").softmax_offset.shape == (1, h // tp, 1, 1)
    # ALiBi's default slopes are those of all 8 heads; this rank (0, no tp_group) has the first 4.
    add = alibi_add([[2.0**-1, 2.0**-2, 2.0**-3, 2.0**-4]] * b, b, h // tp, s, s, [0] * b)
    check(m, q, k, v, dense_ref("sbhd", keep, 1 / math.sqrt(d), add=add), core_attention_bias_type="alibi")


@pytest.mark.parametrize("flag", ["fp8_dpa", "fp8_mha"])
def test_fp8_attention_recipe_stays_high_precision_and_says_so_once(flag, caplog):
    _info_once.told.discard("fp8_dpa")
    b, h, d, s = 2, 2, 8, 6
    q, k, v = make_qkv("sbhd", b, s, s, h, h, d, seed=61)
    m = dpa(h, d)
    ref = dense_ref("sbhd", ref_keep(b, s, s, causal=True), 1 / math.sqrt(d))(q, k, v)
    with caplog.at_level(logging.INFO, logger="te"):
        for _ in range(2):
            with te.autocast(recipe=te.recipe.DelayedScaling(**{flag: True})):
                out = m(q, k, v)
            torch.testing.assert_close(out.double(), ref, **F32_TOL)
    said = [r for r in caplog.records if r.name == "te" and "fp8_dpa" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    caplog.clear()
    _info_once.told.discard("fp8_dpa")
    with caplog.at_level(logging.INFO, logger="te"), te.autocast(recipe=te.recipe.DelayedScaling()):
        m(q, k, v)
    assert not [r for r in caplog.records if "fp8_dpa" in r.getMessage()]


def test_torch_compile_gives_the_same_output():
    torch._dynamo.reset()
    b, h, d, s = 2, 2, 8, 6
    q, k, v = make_qkv("bshd", b, s, s, h, h, d, seed=62)
    keep, fwd, _ = setup("padding_causal", b, s, s, ([6, 4], [6, 4]), pair=False)
    m = dpa(h, d, qkv_format="bshd", attn_mask_type="padding_causal")
    got = torch.compile(m, fullgraph=False)(q, k, v, **fwd)
    torch.testing.assert_close(got.double(), dense_ref("bshd", keep, 1 / math.sqrt(d))(q, k, v), **F32_TOL)
    torch.testing.assert_close(got, m(q, k, v, **fwd), atol=1e-6, rtol=1e-6)


def test_state_dict_holds_no_parameters_but_the_learnable_offset():
    m = dpa(4, 8)
    assert list(m.named_parameters()) == [] and list(m.named_buffers()) == []
    assert set(m.state_dict()) <= {"_extra_state"}
    lm = dpa(4, 8, softmax_type="learnable")
    assert [n for n, _ in lm.named_parameters()] == ["softmax_offset"]
    assert set(lm.state_dict()) - {"_extra_state"} == {"softmax_offset"}
    other = dpa(4, 8, softmax_type="learnable")
    with torch.no_grad():
        lm.softmax_offset.fill_(0.7)
    other.load_state_dict(lm.state_dict(), strict=True)
    assert (other.softmax_offset == 0.7).all()


class _Parent(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.core_attention = dpa(4, 8, **kw)


TE_EXTRA_STATES = [
    lambda: io.BytesIO(b"te fp8 meta"),
    lambda: torch.tensor([1, 2, 3], dtype=torch.uint8),
    lambda: None,
]


@pytest.mark.parametrize("extra", TE_EXTRA_STATES, ids=["bytesio", "uint8", "none"])
def test_a_te_checkpoints_extra_state_loads_strictly(extra):
    parent = _Parent()
    parent.load_state_dict({"core_attention._extra_state": extra()}, strict=True)
    learnable = _Parent(softmax_type="learnable")
    offset = torch.full((1, 4, 1, 1), 0.25)
    learnable.load_state_dict(
        {"core_attention._extra_state": extra(), "core_attention.softmax_offset": offset}, strict=True
    )
    assert (learnable.core_attention.softmax_offset == 0.25).all()
    _Parent().load_state_dict(parent.state_dict(), strict=True)  # te's own state dict round-trips


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------

# fmt: off
CONSTRUCTOR_ERRORS = [
    ({"num_attention_heads": 0}, ValueError, "num_attention_heads"),
    ({"kv_channels": 0}, ValueError, "kv_channels"),
    ({"kv_channels": (8, 8, 8)}, ValueError, "kv_channels"),
    ({"num_gqa_groups": 3}, ValueError, "num_gqa_groups: expected a divisor of num_attention_heads=4, got 3"),
    ({"qkv_format": "sb3hd"}, ValueError, "qkv_format: expected one of"),
    ({"attn_mask_type": "causal_top_left"}, ValueError, "attn_mask_type: expected one of"),
    ({"window_size": (-2, 0)}, ValueError, "window_size"),
    ({"window_size": (1,)}, ValueError, "window_size"),
    ({"window_size": (1.5, 2)}, ValueError, "window_size"),
    ({"window_size": (2, 2)}, ValueError, "window_size: a causal mask"),
    ({"softmax_type": "sigmoid"}, ValueError, "softmax_type: expected one of"),
    ({"attention_dropout": 1.0}, ValueError, "attention_dropout"),
    ({"softmax_scale": 0.0}, ValueError, "softmax_scale"),
    ({"attention_type": "both"}, ValueError, "attention_type"),
]
# fmt: on


@pytest.mark.parametrize("kwargs, err, match", CONSTRUCTOR_ERRORS)
def test_constructor_errors(kwargs, err, match):
    args = {"num_attention_heads": 4, "kv_channels": 8, "device": "cpu", **kwargs}
    with pytest.raises(err, match=match):
        te.DotProductAttention(**args)


def test_cp_group_of_several_ranks_is_not_implemented(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    with pytest.raises(NotImplementedError, match="cp_group"):
        dpa(4, 8, cp_group=object())
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 1)
    dpa(4, 8, cp_group=object())  # one rank: nothing to split


CU = torch.tensor([0, 2, 5], dtype=torch.int32)
PAD = pad_mask([5, 3], 5)
Z = torch.zeros

# (id, call(m, q, k, v) on sbhd q [5, 2, 4, 8], k / v [5, 2, 2, 8] with m = dpa(4, 8, num_gqa_groups=2), error, match)
# fmt: off
FORWARD_ERRORS = [
    ("q_heads", lambda m, q, k, v: m(q[:, :, :3], k, v), ValueError, r"query_layer: expected a 4-d sbhd tensor with 4 heads of 8 channels"),
    ("k_heads", lambda m, q, k, v: m(q, torch.cat([k, k], 2), v), ValueError, r"key_layer: expected a 4-d sbhd tensor with 2 heads"),
    ("v_dim", lambda m, q, k, v: m(q, k, v[..., :4]), ValueError, r"value_layer: expected a 4-d sbhd tensor with 2 heads of 8 channels"),
    ("q_ndim", lambda m, q, k, v: m(q[0], k, v), ValueError, r"query_layer: expected a 4-d"),
    ("k_dtype", lambda m, q, k, v: m(q, k.half(), v), TypeError, r"key_layer: expected fp32, bf16 or fp16 like query_layer"),
    ("q_int", lambda m, q, k, v: m(q.long(), k.long(), v.long()), TypeError, r"query_layer: expected fp32, bf16 or fp16"),
    ("q_list", lambda m, q, k, v: m(q.tolist(), k, v), TypeError, r"query_layer: expected a torch.Tensor"),
    ("k_device", lambda m, q, k, v: m(q, k.to("meta"), v), ValueError, r"key_layer: expected it on query_layer's device"),
    ("batch", lambda m, q, k, v: m(q, k[:, :1], v[:, :1]), ValueError, r"key_layer: expected query_layer's batch size"),
    ("kv_len", lambda m, q, k, v: m(q, k, v[:4]), ValueError, r"value_layer: expected key_layer's shape"),
    ("fmt", lambda m, q, k, v: m(q, k, v, qkv_format="bhsd"), ValueError, r"qkv_format: expected one of"),
    ("mask_type", lambda m, q, k, v: m(q, k, v, attn_mask_type="full"), ValueError, r"attn_mask_type: expected one of"),
    ("window", lambda m, q, k, v: m(q, k, v, window_size=(3, 1)), ValueError, r"window_size"),
    ("mask_with_causal", lambda m, q, k, v: m(q, k, v, attention_mask=PAD), ValueError, r"attention_mask: given with attn_mask_type='causal'"),
    ("mask_with_no_mask", lambda m, q, k, v: m(q, k, v, attn_mask_type="no_mask", attention_mask=PAD), ValueError, r"attention_mask: given with attn_mask_type='no_mask'"),
    ("pad_mask_shape", lambda m, q, k, v: m(q, k, v, attn_mask_type="padding", attention_mask=Z(2, 5, dtype=torch.bool)), ValueError, r"attention_mask: a padding mask"),
    ("pad_mask_dtype", lambda m, q, k, v: m(q, k, v, attn_mask_type="padding", attention_mask=PAD.int()), ValueError, r"attention_mask: a padding mask"),
    ("arbitrary_float", lambda m, q, k, v: m(q, k, v, attn_mask_type="arbitrary", attention_mask=Z(2, 1, 5, 5)), ValueError, r"attention_mask: attn_mask_type='arbitrary' takes a bool tensor"),
    ("arbitrary_shape", lambda m, q, k, v: m(q, k, v, attn_mask_type="arbitrary", attention_mask=Z(2, 3, 5, 5, dtype=torch.bool)), ValueError, r"attention_mask: expected a shape broadcastable"),
    ("arbitrary_none", lambda m, q, k, v: m(q, k, v, attn_mask_type="arbitrary"), ValueError, r"attention_mask: attn_mask_type='arbitrary'"),
    ("bias_type", lambda m, q, k, v: m(q, k, v, core_attention_bias_type="mul_bias"), ValueError, r"core_attention_bias_type: expected one of"),
    ("bias_shape", lambda m, q, k, v: m(q, k, v, core_attention_bias_type="post_scale_bias", core_attention_bias=Z(1, 4, 5, 6)), ValueError, r"core_attention_bias: expected \[1 or b=2, 1 or h=4, s_q=5, s_kv=5\]"),
    ("bias_heads", lambda m, q, k, v: m(q, k, v, core_attention_bias_type="pre_scale_bias", core_attention_bias=Z(1, 2, 5, 5)), ValueError, r"core_attention_bias: expected \[1 or b=2, 1 or h=4"),
    ("bias_3d", lambda m, q, k, v: m(q, k, v, core_attention_bias_type="post_scale_bias", core_attention_bias=Z(4, 5, 5)), ValueError, r"core_attention_bias: post_scale_bias takes a float tensor"),
    ("bias_missing", lambda m, q, k, v: m(q, k, v, core_attention_bias_type="post_scale_bias"), ValueError, r"core_attention_bias: post_scale_bias takes a float tensor"),
    ("bias_with_no_bias", lambda m, q, k, v: m(q, k, v, core_attention_bias=Z(1, 4, 5, 5)), ValueError, r"core_attention_bias: given with core_attention_bias_type='no_bias'"),
    ("bias_with_alibi", lambda m, q, k, v: m(q, k, v, core_attention_bias_type="alibi", core_attention_bias=Z(1, 4, 5, 5)), ValueError, r"core_attention_bias: not taken with core_attention_bias_type='alibi'"),
    ("alibi_shape", lambda m, q, k, v: m(q, k, v, core_attention_bias_type="alibi", alibi_slopes=torch.ones(3)), ValueError, r"alibi_slopes: expected a tensor \[h=4\]"),
    ("cu_dtype", lambda m, q, k, v: m(q, k, v, attn_mask_type="padding", cu_seqlens_q=CU.float(), cu_seqlens_kv=CU), ValueError, r"cu_seqlens_q: expected an int32 tensor"),
    ("cu_shape", lambda m, q, k, v: m(q, k, v, attn_mask_type="padding", cu_seqlens_q=CU, cu_seqlens_kv=CU[:2]), ValueError, r"cu_seqlens_kv: expected an int32 tensor \[b \+ 1 = 3\]"),
    ("unknown_kwarg", lambda m, q, k, v: m(q, k, v, foo=1), TypeError, r"unexpected keyword argument 'foo'"),
    ("inference_params", lambda m, q, k, v: m(q, k, v, inference_params=object()), TypeError, r"inference_params: expected a te.InferenceParams, got object"),
    ("fp8_output", lambda m, q, k, v: m(q, k, v, fp8_output=True), NotImplementedError, r"fp8_output=True is not implemented"),
    ("qkv_layer", lambda m, q, k, v: m(q, k, v, qkv_layer=q), NotImplementedError, r"qkv_layer=torch\.float32 \([0-9, ]+\) is not implemented"),
    ("score_mod", lambda m, q, k, v: m(q, k, v, score_mod=lambda s: s), NotImplementedError, r"score_mod=.* is not implemented"),
]
# fmt: on


@pytest.mark.parametrize(
    "call, err, match", [c[1:] for c in FORWARD_ERRORS], ids=[c[0] for c in FORWARD_ERRORS]
)
def test_forward_errors(call, err, match):
    m = dpa(4, 8, num_gqa_groups=2)
    with pytest.raises(err, match=match):
        call(m, *make_qkv("sbhd", 2, 5, 5, 4, 2, 8))


TWO = {"cu_seqlens_q": CU, "cu_seqlens_kv": CU}

# (id, call(m, q, k, v) on thd q [5, 4, 8], k / v [5, 2, 8] with a "padding" thd module, error, match)
# fmt: off
THD_ERRORS = [
    ("no_cu", lambda m, q, k, v: m(q, k, v), ValueError, r"cu_seqlens_q, cu_seqlens_kv: both needed with qkv_format='thd'"),
    ("causal", lambda m, q, k, v: m(q, k, v, attn_mask_type="causal", **TWO), ValueError, r"attn_mask_type='causal': qkv_format='thd' takes a padding type"),
    ("no_mask", lambda m, q, k, v: m(q, k, v, attn_mask_type="no_mask", **TWO), ValueError, r"attn_mask_type='no_mask': qkv_format='thd' takes a padding type"),
    ("arbitrary", lambda m, q, k, v: m(q, k, v, attn_mask_type="arbitrary", **TWO), ValueError, r"attn_mask_type='arbitrary': qkv_format='thd' takes a padding type"),
    ("mask", lambda m, q, k, v: m(q, k, v, attention_mask=Z(2, 1, 1, 5, dtype=torch.bool), **TWO), ValueError, r"attention_mask: qkv_format='thd' takes cu_seqlens_q"),
    ("cu_2d", lambda m, q, k, v: m(q, k, v, cu_seqlens_q=CU.view(1, 3), cu_seqlens_kv=CU), ValueError, r"cu_seqlens_q: expected an int32 tensor"),
    ("cu_float", lambda m, q, k, v: m(q, k, v, cu_seqlens_q=CU.float(), cu_seqlens_kv=CU), ValueError, r"cu_seqlens_q: expected an int32 tensor"),
    ("cu_kv_len", lambda m, q, k, v: m(q, k, v, cu_seqlens_q=CU, cu_seqlens_kv=CU[1:]), ValueError, r"cu_seqlens_kv: expected an int32 tensor \[b \+ 1 = 3\]"),
    ("cu_pad_len", lambda m, q, k, v: m(q, k, v, cu_seqlens_q_padded=CU[:2], **TWO), ValueError, r"cu_seqlens_q_padded: expected an int32 tensor \[b \+ 1 = 3\]"),
    ("q_4d", lambda m, q, k, v: m(q[None], k, v, **TWO), ValueError, r"query_layer: expected a 3-d thd tensor"),
]
# fmt: on


@pytest.mark.parametrize("call, err, match", [c[1:] for c in THD_ERRORS], ids=[c[0] for c in THD_ERRORS])
def test_thd_errors(call, err, match):
    m = dpa(4, 8, num_gqa_groups=2, qkv_format="thd", attn_mask_type="padding")
    with pytest.raises(err, match=match):
        call(m, *make_thd(5, 5, 4, 2, 8))


def test_te_forward_arguments_taken_at_their_defaults():
    """TE's forward arguments that change nothing here are accepted (at their defaults, or
    ignored where TE's own value only picks a kernel)."""
    q, k, v = make_qkv("sbhd", 2, 5, 5, 2, 2, 8)
    m = dpa(2, 8)
    defaults = {
        "inference_params": None,
        "fp8_output": False,
        "score_mod": None,
        "qkv_layer": None,
        "kv_layer": None,
    }
    ignored = {"fast_zero_fill": True, "pad_between_seqs": False, "num_splits": 1, "bf16_backward": False}
    assert torch.equal(m(q, k, v), m(q, k, v, **defaults, **ignored, qkv_interleave_dim=-3))


def test_thd_max_seqlen_shorter_than_a_sequence_is_refused_when_the_bounds_are_on_the_cpu():
    m = dpa(2, 8, qkv_format="thd", attn_mask_type="padding")
    q, k, v = make_thd(9, 9, 2, 2, 8)
    cu = torch.tensor([0, 6, 9], dtype=torch.int32)
    with pytest.raises(
        ValueError, match="max_seqlen_q / max_seqlen_kv: 4 is shorter than the longest sequence, 6"
    ):
        m(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=4, max_seqlen_kv=4)
    want = m(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    torch.testing.assert_close(
        m(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=6, max_seqlen_kv=8), want
    )
