"""The independent reference of tests/torch/test_attention.py and its input builders.

The reference computes every score in fp64 with an explicit einsum, masks it with a boolean
keep-mask built by loops from TE's documented rules (True in a user's attention_mask = masked
out; query i of s_q sees key j iff j - i - shift <= 0 under a causal type and j - i - shift in
[-left, right] under a window, -1 = no bound; shift = 0 for "causal" / "padding_causal" and
s_kv - s_q, each sequence's real lengths under padding, for every other type or with
bottom_right_diagonal=True), adds the bias, softmaxes (plus exp(sink) in the denominator for
off-by-one / learnable) and multiplies by v; a query that sees no key gives zeros. It never calls
te's own mask helpers. Gradients are the reference's through torch.autograd in fp64.
"""

from __future__ import annotations

import te_torch as te
import torch

F32_TOL = {"atol": 2e-5, "rtol": 1e-4}
LOW_TOL = {torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}, torch.float16: {"atol": 4e-3, "rtol": 4e-3}}
TOP_LEFT = ("causal", "padding_causal", "padding,causal", "causal,padding")
MASK_TYPES = ("no_mask", "causal", "causal_bottom_right", "padding", "padding_causal", "padding,causal")
MASK_TYPES += ("causal,padding", "padding_causal_bottom_right", "arbitrary")

# ----------------------------------------------------------------------------------------------
# The reference
# ----------------------------------------------------------------------------------------------


def rules(mask_type: str, bottom_right_diagonal=None) -> tuple[bool, bool, bool]:
    """(causal, padding, bottom-right) of a mask type, by TE's documentation."""
    br = mask_type not in TOP_LEFT if bottom_right_diagonal is None else bottom_right_diagonal
    return "causal" in mask_type, "padding" in mask_type, br


def ref_keep(
    b, sq, skv, *, causal=False, window=(-1, -1), br=False, valid_q=None, valid_kv=None, masked=None, h=1
):
    """Keep-mask [b, h, s_q, s_kv] (True = attend) by loops. valid_q / valid_kv: per sequence lists
    of bools (True = a real token); masked: a user's bool mask (True = out) broadcastable to it."""
    m = None if masked is None else masked.tolist()
    keep = torch.zeros(b, h, sq, skv, dtype=torch.bool)
    for bi in range(b):
        vq = [True] * sq if valid_q is None else list(valid_q[bi])
        vk = [True] * skv if valid_kv is None else list(valid_kv[bi])
        shift = (sum(vk) - sum(vq)) if br else 0
        for hi in range(h):
            for i in range(sq):
                for j in range(skv):
                    ok = vq[i] and vk[j]
                    rel = j - i - shift
                    if causal:
                        ok = ok and rel <= 0
                    if window[0] >= 0:
                        ok = ok and rel >= -window[0]
                    if window[1] >= 0:
                        ok = ok and rel <= window[1]
                    if m is not None:
                        mb = m[bi if len(m) > 1 else 0]
                        mh = mb[hi if len(mb) > 1 else 0]
                        mi = mh[i if len(mh) > 1 else 0]
                        ok = ok and not mi[j if len(mi) > 1 else 0]
                    keep[bi, hi, i, j] = ok
    return keep


def ref_attention(q, k, v, keep, scale, add=None, sink=None):
    """q [b, h, s_q, d], k / v [b, g, s_kv, d]: softmax(q k^T * scale + add, masked) v in fp64;
    query head i uses key/value head i // (h / g); sink [h]: one more logit per head, with a zero
    value. Rows that see no key (and no sink) are zero."""
    q, k, v = q.double(), k.double(), v.double()
    h, g = q.shape[1], k.shape[1]
    heads = [i // (h // g) for i in range(h)]
    k, v = k[:, heads], v[:, heads]
    if k.shape[2] == 0:  # no keys at all
        return q.new_zeros(q.shape[0], h, q.shape[2], v.shape[3])
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if add is not None:
        s = s + add.double()
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink.double().view(1, -1, 1, 1))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    if sink is not None:
        den = den + torch.exp(sink.double().view(1, -1, 1, 1) - m)
    return torch.einsum("bhij,bhjd->bhid", e / den.clamp_min(1e-300), v)


def to_bhsd(x, fmt):
    return x.permute(1, 2, 0, 3) if fmt == "sbhd" else x.permute(0, 2, 1, 3)


def merge(o, fmt):
    """[b, h, s, d_v] -> the module's merged-heads layout."""
    b, h, s, dv = o.shape
    if fmt == "sbhd":
        return o.permute(2, 0, 1, 3).reshape(s, b, h * dv)
    return o.permute(0, 2, 1, 3).reshape(b, s, h * dv)


def split(out, fmt, h):
    """The module's merged output -> [b, h, s, d_v]."""
    if fmt == "sbhd":
        s, b, hd = out.shape
        return out.view(s, b, h, hd // h).permute(1, 2, 0, 3)
    b, s, hd = out.shape
    return out.view(b, s, h, hd // h).permute(0, 2, 1, 3)


def dense_ref(fmt, keep, scale, add=None, sink=None):
    def f(q, k, v, add=add, sink=sink):
        o = ref_attention(to_bhsd(q, fmt), to_bhsd(k, fmt), to_bhsd(v, fmt), keep, scale, add, sink)
        return merge(o, fmt)

    return f


def alibi_add(slopes, b, h, sq, skv, shifts):
    """-slope[b][h] * |j - i - shift[b]| by loops."""
    add = torch.zeros(b, h, sq, skv, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(sq):
                for j in range(skv):
                    add[bi, hi, i, j] = -slopes[bi][hi] * abs(j - i - shifts[bi])
    return add


def thd_ref(
    cu_q, cu_kv, scale, *, causal, br, window=(-1, -1), start_q=None, start_kv=None, sink=None, slopes=None
):
    """Packed sequences one by one: sequence i's tokens start at start_q[i] (default cu_q[i]) and
    attend to its own keys only; every other token is zero. slopes: ALiBi's, per head."""
    cu_q, cu_kv = cu_q.tolist(), cu_kv.tolist()
    start_q = cu_q[:-1] if start_q is None else start_q.tolist()
    start_kv = cu_kv[:-1] if start_kv is None else start_kv.tolist()

    def f(q, k, v, sink=sink):
        out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
        for i in range(len(cu_q) - 1):
            lq, lk = cu_q[i + 1] - cu_q[i], cu_kv[i + 1] - cu_kv[i]
            if lq == 0:
                continue
            qi = q[start_q[i] : start_q[i] + lq].permute(1, 0, 2)[None]
            ki = k[start_kv[i] : start_kv[i] + lk].permute(1, 0, 2)[None]
            vi = v[start_kv[i] : start_kv[i] + lk].permute(1, 0, 2)[None]
            keep = ref_keep(1, lq, lk, causal=causal, window=window, br=br)
            add = (
                None
                if slopes is None
                else alibi_add([slopes], 1, len(slopes), lq, lk, [lk - lq if br else 0])
            )
            out[start_q[i] : start_q[i] + lq] = ref_attention(qi, ki, vi, keep, scale, add, sink)[0].permute(
                1, 0, 2
            )
        return out.reshape(q.shape[0], -1)

    return f


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def make_qkv(fmt, b, sq, skv, h, g, dk, dv=None, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dv = dk if dv is None else dv

    def one(s, heads, d):
        shape = (s, b, heads, d) if fmt == "sbhd" else (b, s, heads, d)
        return torch.randn(shape, generator=gen).mul(1.5).to(dtype)

    return one(sq, h, dk), one(skv, g, dk), one(skv, g, dv)


def make_thd(t_q, t_kv, h, g, d, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(t, n, d, generator=gen).mul(1.5) for t, n in ((t_q, h), (t_kv, g), (t_kv, g)))


def pad_mask(lens, s):
    """TE's padding mask [b, 1, 1, s]: True where a token is padding (tokens first)."""
    return torch.tensor([[[[j >= n for j in range(s)]]] for n in lens], dtype=torch.bool)


def valid_of(lens, s):
    return [[j < n for j in range(s)] for n in lens]


def cu_of(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def setup(
    mask_type, b, sq, skv, lens=None, masked=None, window=(-1, -1), bottom_right_diagonal=None, pair=True
):
    """(reference keep-mask, forward kwargs, each sequence's diagonal shift) of one configuration:
    padding types get TE's padding mask for lens = (lens_q, lens_kv) (a (q, kv) pair, or one
    tensor when pair is False), masked goes in as the attention_mask of "arbitrary"."""
    causal, padding, br = rules(mask_type, bottom_right_diagonal)
    fwd, vq, vk, shifts = {}, None, None, [skv - sq if br else 0] * b
    if padding:
        lq, lk = lens
        vq, vk = valid_of(lq, sq), valid_of(lk, skv)
        fwd["attention_mask"] = (pad_mask(lq, sq), pad_mask(lk, skv)) if pair else pad_mask(lq, sq)
        shifts = [lk[i] - lq[i] if br else 0 for i in range(b)]
    if masked is not None:
        fwd["attention_mask"] = masked
    h = 1 if masked is None else masked.shape[1]
    keep = ref_keep(
        b, sq, skv, causal=causal, window=window, br=br, valid_q=vq, valid_kv=vk, masked=masked, h=h
    )
    return keep, fwd, shifts


def random_mask(*shape, p=0.4, seed=4):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < p


def check(m, q, k, v, reference, tol=F32_TOL, grad_tol=None, extra=(), **fwd):
    """Runs the module and the reference on the same values, compares the outputs and the
    gradients of q, k, v (and of ``extra``: (module leaf, reference leaf) pairs) for one random
    output gradient. Returns the module's output."""
    grad_tol = tol if grad_tol is None else grad_tol
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    refs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out = m(*leaves, **fwd)
    if isinstance(out, tuple):
        out = out[0]
    ref = reference(*refs)
    assert out.shape == ref.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), ref, **tol)
    dy = torch.randn(ref.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    (out.double() * dy).sum().backward()
    (ref * dy).sum().backward()
    for name, a, r in zip("qkv", leaves, refs, strict=True):
        assert torch.isfinite(a.grad).all(), name
        torch.testing.assert_close(a.grad.double(), r.grad, **grad_tol, msg=lambda s, n=name: f"d{n}: {s}")
    for a, r in extra:
        torch.testing.assert_close(a.grad.double().view(r.grad.shape), r.grad, **grad_tol)
    return out.detach()


def assert_dead_rows_zero(out, keep, fmt, h):
    """Queries that see no key give exact zeros."""
    o = split(out, fmt, h)
    dead = ~keep.expand(o.shape[0], h, o.shape[2], keep.shape[-1]).any(-1)
    assert (o[dead] == 0).all()
    return dead


def dpa(h, d, **kw):
    kw.setdefault("device", "cpu")
    return te.DotProductAttention(h, d, **kw)
