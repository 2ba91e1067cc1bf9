"""te.MultiheadAttention on CPU against an independent fp64 reference written here from TE's
semantics (the block's composition; te.DotProductAttention and RoPE have their own tests).

The reference reads the module's parameters by their TE names and computes: the input norm
(LayerNorm / RMSNorm, zero_centered_gamma as 1 + w), the QKV projection, the split into heads by
TE's layout rules (below, written out as channel indices), the rotary embedding as a complex
rotation, the QK norms, explicit softmax attention with the mask (query head i uses key/value
head i // (h / g); a query that sees no key gives zeros), the merge of heads and the output
projection.

TE's QKV layouts, for h query heads, g key/value heads of d channels:
- separate parameters (query_weight, key_weight, value_weight), or fused with
  qkv_weight_interleaved=False: [queries (h d) | keys (g d) | values (g d)];
- fused with qkv_weight_interleaved=True: per group j, its h / g query heads, then its key head,
  then its value head;
- cross attention's key_value: [keys | values], or interleaved per group (key head, value head).
"""

import io
import math
import pickle

import pytest
import te_torch as te
import torch
import torch.nn.functional as F
from _module_ref import rel
from te_torch import recipe

HID, H, D, S, B, SKV = 32, 4, 8, 6, 3, 5
TOL = 1e-5  # fp32 module against the fp64 reference, normwise
LAYOUTS = {  # (fuse_qkv_params, qkv_weight_interleaved)
    "separate": (False, True),  # the interleave flag only acts on fused parameters
    "separate_flag_off": (False, False),
    "fused_interleaved": (True, True),
    "fused_concat": (True, False),
}


# ----------------------------------------------------------------------------- reference


def norm_ref(x, w, b, normalization, eps, zero_centered_gamma):
    if zero_centered_gamma:
        w = 1 + w
    if normalization == "RMSNorm":
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w
    return F.layer_norm(x, x.shape[-1:], w, b, eps)


def qk_norm_ref(x, kind, w, b, eps):
    if kind == "L2Normalization":
        return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)
    if kind == "RMSNorm":
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w
    return F.layer_norm(x, x.shape[-1:], w, b, eps)


def rope_ref(x, freqs, interleaved):
    """x [b, s, n, d]; freqs [S, 1, 1, r] (angles [a, a] or [a0, a0, a1, a1, ...]): channel pairs
    (halves, or neighbours when interleaved) as complex numbers times e^(i a); channels past r
    pass through."""
    r, s = freqs.shape[-1], x.shape[1]
    ang = freqs[:s, 0, 0].double()
    ang = ang[:, 0::2] if interleaved else ang[:, : r // 2]
    turn = torch.polar(torch.ones_like(ang), ang)[None, :, None, :]
    xr = x[..., :r]
    if interleaved:
        z = torch.view_as_complex(xr.unflatten(-1, (r // 2, 2)).contiguous()) * turn
        out = torch.view_as_real(z).flatten(-2)
    else:
        z = torch.complex(xr[..., : r // 2], xr[..., r // 2 :]) * turn
        out = torch.cat((z.real, z.imag), dim=-1)
    return torch.cat((out, x[..., r:]), dim=-1)


def split_self(mixed, h, g, d, interleaved):
    """[..., (h + 2g) d] -> q [..., h, d], k / v [..., g, d] by TE's channel layout."""
    per, c = h // g, torch.arange(d)
    if interleaved:
        blk = (per + 2) * d
        qi = [(i // per) * blk + (i % per) * d + c for i in range(h)]
        ki = [j * blk + per * d + c for j in range(g)]
        vi = [j * blk + (per + 1) * d + c for j in range(g)]
    else:
        qi = [i * d + c for i in range(h)]
        ki = [h * d + j * d + c for j in range(g)]
        vi = [(h + g) * d + j * d + c for j in range(g)]
    return tuple(mixed[..., torch.stack(idx)] for idx in (qi, ki, vi))


def split_kv(mixed, g, d, interleaved):
    """[..., 2 g d] -> k, v [..., g, d]."""
    c = torch.arange(d)
    if interleaved:
        ki = [j * 2 * d + c for j in range(g)]
        vi = [j * 2 * d + d + c for j in range(g)]
    else:
        ki = [j * d + c for j in range(g)]
        vi = [g * d + j * d + c for j in range(g)]
    return tuple(mixed[..., torch.stack(idx)] for idx in (ki, vi))


def attention_ref(q, k, v, keep):
    """q [b, sq, h, d], k / v [b, skv, g, d], keep bool broadcastable to [b, h, sq, skv] or None
    -> [b, sq, h d]. Query head i uses key/value head i // (h / g); a query row that sees no key
    gives zeros."""
    h, g, d = q.shape[2], k.shape[2], q.shape[3]
    kv_head = torch.arange(h) // (h // g)
    k, v = k[:, :, kv_head], v[:, :, kv_head]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    if keep is not None:
        keep = keep.expand_as(s)
        seen = keep.any(-1, keepdim=True)
        s = s.masked_fill(~keep, float("-inf")).masked_fill(~seen, 0.0)
        p = torch.softmax(s, -1) * seen
    else:
        p = torch.softmax(s, -1)
    return torch.einsum("bhqk,bkhd->bqhd", p, v).flatten(-2)


def causal_keep(sq, skv):
    """Top-left causal: query i sees keys j <= i."""
    return torch.ones(sq, skv, dtype=torch.bool).tril()[None, None]


def padding_keep(pad_q, pad_kv, causal=False):
    """pad_* [b, s] True = padding -> keep [b, 1, sq, skv]."""
    keep = ~pad_q[:, None, :, None] & ~pad_kv[:, None, None, :]
    if causal:
        keep = keep & causal_keep(pad_q.shape[1], pad_kv.shape[1])
    return keep


def mha_ref(P, cfg, x, enc=None, keep=None, rope=None, prefix=""):
    """The block in fp64 on [b, s, hidden] inputs: (output without the projection bias, the
    projection bias or None, the input norm's output or None). ``cfg``: the module's kwargs."""
    hidden, h = cfg["hidden_size"], cfg["num_attention_heads"]
    d = cfg.get("kv_channels") or hidden // h
    g = cfg.get("num_gqa_groups") or h
    fused = cfg.get("fuse_qkv_params", False)
    interleaved = fused and cfg.get("qkv_weight_interleaved", True)
    ln = cfg.get("input_layernorm", False)
    cross = cfg.get("attention_type", "self") == "cross"

    def p(name):
        return P.get(prefix + name)

    def weight(sub, parts):
        if fused:
            return p(f"{sub}.weight"), p(f"{sub}.bias")
        w = torch.cat([p(f"{sub}.{n}_weight") for n in parts])
        b = [p(f"{sub}.{n}_bias") for n in parts]
        return w, None if b[0] is None else torch.cat(b)

    src, ln_out = x, None
    qsub = ("layernorm_query" if ln else "query_layer") if cross else ("layernorm_qkv" if ln else "qkv")
    if ln:
        src = ln_out = norm_ref(
            x,
            p(f"{qsub}.layer_norm_weight"),
            p(f"{qsub}.layer_norm_bias"),
            cfg.get("normalization", "LayerNorm"),
            cfg.get("layernorm_epsilon", 1e-5),
            cfg.get("zero_centered_gamma", False),
        )
    if cross:
        wkv, bkv = weight("key_value", ("key", "value"))
        k, v = split_kv(F.linear(enc, wkv, bkv), g, d, interleaved)
        if ln:
            wq, bq = weight(qsub, ("query",))
        else:
            # TE's query_layer is one Linear without parameters_split: query_layer.weight (the
            # state_dict test pins the name; the numbers are checked here whatever it is).
            name = "query_layer.weight" if prefix + "query_layer.weight" in P else "query_layer.query_weight"
            wq, bq = p(name), p(name.replace("weight", "bias"))
        q = F.linear(src, wq, bq).unflatten(-1, (h, d))
    else:
        w, b = weight(qsub, ("query", "key", "value"))
        q, k, v = split_self(F.linear(src, w, b), h, g, d, interleaved)
    kind = cfg.get("qk_norm_type")
    eps = cfg.get("qk_norm_eps", 1e-6)

    def qk_norm(q, k):
        q = qk_norm_ref(q, kind, p("q_norm.weight"), p("q_norm.bias"), eps)
        return q, qk_norm_ref(k, kind, p("k_norm.weight"), p("k_norm.bias"), eps)

    if kind is not None and cfg.get("qk_norm_before_rope", False):
        q, k = qk_norm(q, k)
    if rope is not None:
        fq, fk = rope if isinstance(rope, tuple) else (rope, rope)
        inter = cfg.get("rotary_pos_interleaved", False)
        q, k = rope_ref(q, fq, inter), rope_ref(k, fk, inter)
    if kind is not None and not cfg.get("qk_norm_before_rope", False):
        q, k = qk_norm(q, k)
    ctx = attention_ref(q, k, v, keep)
    return F.linear(ctx, p("proj.weight")), p("proj.bias"), ln_out


# ----------------------------------------------------------------------------- helpers


def randomize(m, seed=0):
    """Non-trivial values for every parameter: norm scales around 1 (0 when zero-centered),
    biases, and weights large enough that the softmax is far from uniform."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.dim() == 1 and "norm" in name and name.endswith("weight"):
                p.copy_((0.0 if _zero_centered(m, name) else 1.0) + 0.3 * r)
            elif p.dim() == 1:
                p.copy_(0.3 * r)
            else:
                p.copy_(0.25 * r)
    return m


def _zero_centered(m, name):
    owner = m.get_submodule(name.rsplit(".", 1)[0]) if "." in name else m
    return bool(getattr(owner, "zero_centered_gamma", False))


def make_mha(seed=0, **cfg):
    kw = {"hidden_size": HID, "num_attention_heads": H, "attention_dropout": 0.0, "device": "cpu"}
    kw.update(cfg)
    torch.manual_seed(seed)
    return randomize(te.MultiheadAttention(**kw), seed), kw


def ref_params(m):
    return {n: p.detach().double().requires_grad_(True) for n, p in m.named_parameters()}


def to_fmt(x, fmt):
    """[b, s, ...] -> the module's layout."""
    return x.transpose(0, 1).contiguous() if fmt == "sbhd" else x.clone()


def from_fmt(x, fmt):
    return x.transpose(0, 1) if fmt == "sbhd" else x


def data(*shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g)


def random_freqs(s, r, interleaved, seed=5):
    """Arbitrary angles [s, 1, 1, r] in TE's layout for the given interleaving."""
    a = torch.rand(s, r // 2, generator=torch.Generator().manual_seed(seed)) * 6.0 - 3.0
    f = a.repeat_interleave(2, dim=-1) if interleaved else torch.cat((a, a), dim=-1)
    return f[:, None, None, :]


def grad_errors(m, P):
    """Every parameter's gradient against the reference's, normwise. The key bias's gradient is
    zero in exact arithmetic (a bias on every key shifts a query's scores alike, which the
    softmax ignores), so errors are relative to max(|reference|, 1% of the largest gradient)."""
    floor = 1e-2 * max(g.grad.double().norm().item() for g in P.values() if g.grad is not None)
    errs = {}
    for name, p in m.named_parameters():
        assert p.grad is not None, f"{name}: no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: gradient not finite"
        assert P[name].grad is not None, f"{name}: not used by the reference"
        want = P[name].grad
        errs[name] = (p.grad.double() - want).norm().item() / max(want.norm().item(), floor)
    return errs


def check_grads(m, P, tol=TOL):
    bad = {n: f"{e:.2e}" for n, e in grad_errors(m, P).items() if not e < tol}
    assert not bad, f"gradient errors over {tol}: {bad}"


def compare_with(reference, m, fmt, x, dy, enc=None, rope=None, fwd=None, tol=TOL):
    """Forward and backward of m (x, dy, enc: [b, s, hidden], run laid out as ``fmt``) against
    ``reference(P, x64, e64)`` (the fp64 output, [b, s, hidden]): output, input gradients and
    every parameter's gradient."""
    fwd = dict(fwd or {})
    xt = to_fmt(x, fmt).requires_grad_(True)
    et = None
    if enc is not None:
        et = to_fmt(enc, fmt).requires_grad_(True)
        fwd["encoder_output"] = et
    y = m(xt, rotary_pos_emb=rope, **fwd)
    assert isinstance(y, torch.Tensor) and y.shape == xt.shape and y.dtype == torch.float32
    (y * to_fmt(dy, fmt)).sum().backward()
    P = ref_params(m)
    x64 = x.double().requires_grad_(True)
    e64 = None if enc is None else enc.double().requires_grad_(True)
    want = reference(P, x64, e64)
    (want * dy.double()).sum().backward()
    err = rel(from_fmt(y.detach(), fmt), want.detach())
    assert err < tol, f"output rel error {err:.2e}"
    assert rel(from_fmt(xt.grad, fmt), x64.grad) < tol
    if enc is not None:
        assert rel(from_fmt(et.grad, fmt), e64.grad) < tol
    check_grads(m, P, tol)
    return y


def compare(m, cfg, x, dy, fmt=None, enc=None, keep=None, rope=None, fwd=None, tol=TOL):
    """compare_with mha_ref, the output with the projection bias added."""

    def reference(P, x64, e64):
        out, bias, _ = mha_ref(P, cfg, x64, e64, keep, rope)
        return out if bias is None else out + bias

    return compare_with(reference, m, fmt or cfg.get("qkv_format", "sbhd"), x, dy, enc, rope, fwd, tol)


# ----------------------------------------------------------------------------- self attention


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("groups", [H, 2, 1])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("input_layernorm", [False, True])
def test_self_attention_matches_reference(input_layernorm, layout, groups, fmt):
    fuse, inter = LAYOUTS[layout]
    m, cfg = make_mha(
        input_layernorm=input_layernorm,
        fuse_qkv_params=fuse,
        qkv_weight_interleaved=inter,
        num_gqa_groups=groups,
        qkv_format=fmt,
    )
    x, dy = data(B, S, HID), data(B, S, HID, seed=2)
    compare(m, cfg, x, dy, fmt, keep=causal_keep(S, S))


@pytest.mark.parametrize("layout", ["separate", "fused_interleaved", "fused_concat"])
@pytest.mark.parametrize("attention_type", ["self", "cross"])
def test_kv_channels_other_than_hidden_over_heads(layout, attention_type):
    fuse, inter = LAYOUTS[layout]
    m, cfg = make_mha(
        kv_channels=12,
        num_gqa_groups=2,
        input_layernorm=True,
        fuse_qkv_params=fuse,
        qkv_weight_interleaved=inter,
        attention_type=attention_type,
        attn_mask_type="no_mask" if attention_type == "cross" else "causal",
    )
    assert m.proj.weight.shape == (HID, H * 12)
    x, dy = data(B, S, HID), data(B, S, HID, seed=2)
    if attention_type == "cross":
        compare(m, cfg, x, dy, enc=data(B, SKV, HID, seed=3))
    else:
        compare(m, cfg, x, dy, keep=causal_keep(S, S))


@pytest.mark.parametrize("fused", [False, True])
def test_bias_false(fused):
    m, cfg = make_mha(bias=False, input_layernorm=True, fuse_qkv_params=fused, num_gqa_groups=2)
    assert not [n for n in m.state_dict() if n.endswith("bias") and "layer_norm" not in n]
    x, dy = data(B, S, HID), data(B, S, HID, seed=2)
    compare(m, cfg, x, dy, keep=causal_keep(S, S))
    m2, _ = make_mha(
        bias=False, return_bias=True, input_layernorm=True, fuse_qkv_params=fused, num_gqa_groups=2
    )
    out = m2(to_fmt(x, "sbhd"))
    assert isinstance(out, tuple) and len(out) == 2
    assert out[1] is None or out[1].numel() == 0  # no bias to return (TE returns an empty tensor)


@pytest.mark.parametrize("zero_centered_gamma", [False, True])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_input_norm_options(normalization, zero_centered_gamma):
    m, cfg = make_mha(
        input_layernorm=True,
        normalization=normalization,
        zero_centered_gamma=zero_centered_gamma,
        layernorm_epsilon=0.5,  # large enough that a wrong eps shows
        fuse_qkv_params=True,
    )
    names = {n for n, _ in m.named_parameters()}
    assert ("layernorm_qkv.layer_norm_bias" in names) == (normalization == "LayerNorm")
    x, dy = data(B, S, HID), data(B, S, HID, seed=2)
    compare(m, cfg, x * 0.5, dy, keep=causal_keep(S, S))


@pytest.mark.parametrize("attention_type", ["self", "cross"])
@pytest.mark.parametrize("return_layernorm_output", [False, True])
@pytest.mark.parametrize("return_bias", [False, True])
@pytest.mark.parametrize("input_layernorm", [False, True])
def test_return_values_and_order(input_layernorm, return_bias, return_layernorm_output, attention_type):
    m, cfg = make_mha(
        input_layernorm=input_layernorm,
        return_bias=return_bias,
        return_layernorm_output=return_layernorm_output,
        attention_type=attention_type,
        attn_mask_type="no_mask",
        num_gqa_groups=2,
    )
    fmt = "sbhd"
    x, dy, dln = data(B, S, HID), data(B, S, HID, seed=2), data(B, S, HID, seed=4)
    enc = data(B, SKV, HID, seed=3)
    xt = to_fmt(x, fmt).requires_grad_(True)
    kw = {"encoder_output": to_fmt(enc, fmt)} if attention_type == "cross" else {}
    got = m(xt, **kw)
    P = ref_params(m)
    x64 = x.double().requires_grad_(True)
    out, bias, ln_out = mha_ref(P, cfg, x64, enc.double() if kw else None, None)
    with_ln = input_layernorm and return_layernorm_output
    n = 1 + return_bias + with_ln
    if n == 1:
        assert isinstance(got, torch.Tensor)
        got = (got,)
    assert isinstance(got, tuple) and len(got) == n
    y = got[0]
    assert y.shape == xt.shape
    want = out if return_bias else out + bias
    assert rel(from_fmt(y.detach(), fmt), want.detach()) < TOL
    loss = (y * to_fmt(dy, fmt)).sum()
    ref_loss = (want * dy.double()).sum()
    if return_bias:
        assert got[1].shape == (HID,)
        assert torch.equal(got[1].detach(), m.proj.bias.detach())
        loss = loss + (got[1] * 3.0).sum()
        ref_loss = ref_loss + (bias * 3.0).sum()
    if with_ln:
        ln = got[-1]
        assert ln.shape == xt.shape
        assert rel(from_fmt(ln.detach(), fmt), ln_out.detach()) < TOL
        loss = loss + (ln * to_fmt(dln, fmt)).sum()
        ref_loss = ref_loss + (ln_out * dln.double()).sum()
    loss.backward()
    ref_loss.backward()
    assert rel(from_fmt(xt.grad, fmt), x64.grad) < TOL
    check_grads(m, P)


# ----------------------------------------------------------------------------- cross attention


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("groups", [H, 2, 1])
@pytest.mark.parametrize("layout", ["separate", "fused_interleaved", "fused_concat"])
@pytest.mark.parametrize("input_layernorm", [False, True])
def test_cross_attention_matches_reference(input_layernorm, layout, groups, fmt):
    fuse, inter = LAYOUTS[layout]
    m, cfg = make_mha(
        attention_type="cross",
        attn_mask_type="no_mask",
        input_layernorm=input_layernorm,
        fuse_qkv_params=fuse,
        qkv_weight_interleaved=inter,
        num_gqa_groups=groups,
        qkv_format=fmt,
    )
    x, dy, enc = data(B, S, HID), data(B, S, HID, seed=2), data(B, SKV, HID, seed=3)
    compare(m, cfg, x, dy, fmt, enc=enc)


def test_cross_attention_default_mask_is_top_left_causal():
    m, cfg = make_mha(attention_type="cross", input_layernorm=True)  # attn_mask_type="causal"
    x, dy, enc = data(B, S, HID), data(B, S, HID, seed=2), data(B, SKV + 3, HID, seed=3)
    compare(m, cfg, x, dy, enc=enc, keep=causal_keep(S, SKV + 3))


# ----------------------------------------------------------------------------- thd


@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("groups", [H, 1])
@pytest.mark.parametrize("layout", ["separate", "fused_interleaved", "fused_concat"])
def test_thd_matches_reference_per_sequence(layout, groups, rotary):
    fuse, inter = LAYOUTS[layout]
    m, cfg = make_mha(
        qkv_format="thd",
        attn_mask_type="padding_causal",
        input_layernorm=True,
        fuse_qkv_params=fuse,
        qkv_weight_interleaved=inter,
        num_gqa_groups=groups,
    )
    lens = [3, 5, 2]
    cu = torch.tensor([0, 3, 8, 10], dtype=torch.int32)
    t = sum(lens)
    x, dy = data(t, HID), data(t, HID, seed=2)
    freqs = random_freqs(max(lens), D, False) if rotary else None
    xt = x.clone().requires_grad_(True)
    y = m(xt, cu_seqlens_q=cu, cu_seqlens_kv=cu, rotary_pos_emb=freqs)
    assert y.shape == (t, HID)
    (y * dy).sum().backward()
    P = ref_params(m)
    x64 = x.double().requires_grad_(True)
    outs = []
    for i, s in enumerate(lens):
        seq = x64[cu[i] : cu[i + 1]][None]  # [1, s, hidden]
        out, bias, _ = mha_ref(P, cfg, seq, keep=causal_keep(s, s), rope=freqs)
        outs.append((out + bias)[0])
    want = torch.cat(outs)
    (want * dy.double()).sum().backward()
    assert rel(y.detach(), want.detach()) < TOL
    assert rel(xt.grad, x64.grad) < TOL
    check_grads(m, P)


def test_thd_with_max_seqlen_and_mask_type_in_forward():
    m, cfg = make_mha(qkv_format="thd", num_gqa_groups=2)  # attn_mask_type "causal" by default
    lens, cu = [4, 2], torch.tensor([0, 4, 6], dtype=torch.int32)
    x = data(6, HID)
    y = m(
        x, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=4, max_seqlen_kv=4, attn_mask_type="padding_causal"
    )
    P = ref_params(m)
    want = []
    for i, s in enumerate(lens):
        out, bias, _ = mha_ref(P, cfg, x.double()[cu[i] : cu[i + 1]][None], keep=causal_keep(s, s))
        want.append((out + bias)[0])
    assert rel(y.detach(), torch.cat(want)) < TOL


# ----------------------------------------------------------------------------- rotary, qk norm


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("rotated", [D, D // 2])
@pytest.mark.parametrize("form", ["tensor", "tuple"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_matches_reference(interleaved, form, rotated, fmt):
    m, cfg = make_mha(
        rotary_pos_interleaved=interleaved,
        qkv_format=fmt,
        fuse_qkv_params=True,
        num_gqa_groups=2,
        input_layernorm=True,
    )
    fq = random_freqs(S + 2, rotated, interleaved)  # longer than the sequence, as TE's are
    rope = fq if form == "tensor" else (fq, random_freqs(S + 2, rotated, interleaved, seed=9))
    x, dy = data(B, S, HID), data(B, S, HID, seed=2)
    y = compare(m, cfg, x, dy, fmt, keep=causal_keep(S, S), rope=rope)
    m.zero_grad()
    # The embedding acts: without it the output differs.
    assert rel(m(to_fmt(x, fmt)).detach(), y.detach()) > 1e-2


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_cross_attention_tuple(interleaved):
    m, cfg = make_mha(attention_type="cross", attn_mask_type="no_mask", rotary_pos_interleaved=interleaved)
    rope = (random_freqs(S, D, interleaved), random_freqs(SKV, D, interleaved, seed=9))
    x, dy, enc = data(B, S, HID), data(B, S, HID, seed=2), data(B, SKV, HID, seed=3)
    compare(m, cfg, x, dy, "sbhd", enc=enc, rope=rope)


@pytest.mark.parametrize("before_rope", [False, True])
@pytest.mark.parametrize("kind", ["L2Normalization", "RMSNorm", "LayerNorm"])
def test_qk_norm_matches_reference(kind, before_rope):
    m, cfg = make_mha(
        qk_norm_type=kind,
        qk_norm_before_rope=before_rope,
        qk_norm_eps=0.25,  # large enough that a wrong eps shows
        input_layernorm=True,
        num_gqa_groups=2,
    )
    if kind == "LayerNorm":  # TE's qk LayerNorm has a bias too
        assert {"q_norm.bias", "k_norm.bias"} <= {n for n, _ in m.named_parameters()}
    rope = random_freqs(S, D, False)
    x, dy = data(B, S, HID), data(B, S, HID, seed=2)
    compare(m, cfg, x, dy, "sbhd", keep=causal_keep(S, S), rope=rope)


def test_qk_norm_order_matters_with_layer_norm():
    """With a LayerNorm QK norm (mean removal is not rotation-invariant) before and after RoPE
    differ: the flag is used."""
    outs = []
    for before in (False, True):
        m, _ = make_mha(qk_norm_type="LayerNorm", qk_norm_before_rope=before)
        outs.append(m(data(S, B, HID), rotary_pos_emb=random_freqs(S, D, False)).detach())
    assert rel(outs[0], outs[1]) > 1e-3


# ----------------------------------------------------------------------------- masks


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("where", ["ctor", "forward"])
@pytest.mark.parametrize("mask_type", ["padding", "padding_causal"])
def test_padding_mask_passed_through(mask_type, where, fmt):
    ctor = {"attn_mask_type": mask_type} if where == "ctor" else {}
    m, cfg = make_mha(qkv_format=fmt, input_layernorm=True, num_gqa_groups=2, **ctor)
    lens = torch.tensor([S, 4, 2])
    pad = torch.arange(S)[None, :] >= lens[:, None]  # [b, s] True = padding
    mask = pad[:, None, None, :]  # [b, 1, 1, s], True = masked out
    fwd = {"attention_mask": mask}
    if where == "forward":
        fwd["attn_mask_type"] = mask_type
    x = data(B, S, HID)
    dy = data(B, S, HID, seed=2) * (~pad)[..., None]  # padded rows' outputs unused
    keep = padding_keep(pad, pad, causal=mask_type == "padding_causal")
    xt = to_fmt(x, fmt).requires_grad_(True)
    y = m(xt, **fwd)
    assert torch.isfinite(y).all()
    (y * to_fmt(dy, fmt)).sum().backward()
    P = ref_params(m)
    x64 = x.double().requires_grad_(True)
    out, bias, _ = mha_ref(P, cfg, x64, keep=keep)
    want = out + bias
    (want * dy.double()).sum().backward()
    valid = ~pad
    assert rel(from_fmt(y.detach(), fmt)[valid], want.detach()[valid]) < TOL
    assert rel(from_fmt(xt.grad, fmt), x64.grad) < TOL
    check_grads(m, P)
    # the mask acts: a masked key changes nothing, so changing a padded token's input changes no
    # valid row's output
    x2 = x.clone()
    x2[1, 5] += 10.0
    y2 = m(to_fmt(x2, fmt), **fwd).detach()
    assert torch.equal(from_fmt(y2, fmt)[valid], from_fmt(y.detach(), fmt)[valid])


def test_cross_attention_padding_mask_pair():
    m, cfg = make_mha(attention_type="cross", attn_mask_type="padding", input_layernorm=True)
    pad_q = torch.arange(S)[None, :] >= torch.tensor([S, 3, 5])[:, None]
    pad_kv = torch.arange(SKV)[None, :] >= torch.tensor([2, SKV, 4])[:, None]
    mask = (pad_q[:, None, None, :], pad_kv[:, None, None, :])
    x, enc = data(B, S, HID), data(B, SKV, HID, seed=3)
    dy = data(B, S, HID, seed=2) * (~pad_q)[..., None]
    y = compare(
        m, cfg, x, dy, "sbhd", enc=enc, keep=padding_keep(pad_q, pad_kv), fwd={"attention_mask": mask}
    )
    assert torch.isfinite(y).all()


# ----------------------------------------------------------------------------- state_dict


def _keys(m):
    return {k for k in m.state_dict() if not k.endswith("_extra_state")}


STATE_DICT_CASES = {
    "self_default": (
        {},
        "qkv.query_weight qkv.query_bias qkv.key_weight qkv.key_bias qkv.value_weight qkv.value_bias "
        "proj.weight proj.bias",
    ),
    "self_ln_fused_qk_rms": (
        {"input_layernorm": True, "fuse_qkv_params": True, "qk_norm_type": "RMSNorm"},
        "layernorm_qkv.layer_norm_weight layernorm_qkv.layer_norm_bias layernorm_qkv.weight "
        "layernorm_qkv.bias q_norm.weight k_norm.weight proj.weight proj.bias",
    ),
    "self_rms_nobias_qk_ln": (
        {"input_layernorm": True, "normalization": "RMSNorm", "bias": False, "qk_norm_type": "LayerNorm"},
        "layernorm_qkv.layer_norm_weight layernorm_qkv.query_weight layernorm_qkv.key_weight "
        "layernorm_qkv.value_weight q_norm.weight q_norm.bias k_norm.weight k_norm.bias proj.weight",
    ),
    "self_fused_qk_l2": (
        {"fuse_qkv_params": True, "qk_norm_type": "L2Normalization"},
        "qkv.weight qkv.bias proj.weight proj.bias",
    ),
    "cross_ln": (
        {"attention_type": "cross", "input_layernorm": True},
        "layernorm_query.layer_norm_weight layernorm_query.layer_norm_bias layernorm_query.query_weight "
        "layernorm_query.query_bias key_value.key_weight key_value.key_bias key_value.value_weight "
        "key_value.value_bias proj.weight proj.bias",
    ),
    "cross_ln_fused": (
        {"attention_type": "cross", "input_layernorm": True, "fuse_qkv_params": True},
        "layernorm_query.layer_norm_weight layernorm_query.layer_norm_bias layernorm_query.weight "
        "layernorm_query.bias key_value.weight key_value.bias proj.weight proj.bias",
    ),
    # TE's query_layer is a plain Linear (no parameters_split) whatever fuse_qkv_params is.
    "cross_no_ln": (
        {"attention_type": "cross"},
        "query_layer.weight query_layer.bias key_value.key_weight key_value.key_bias "
        "key_value.value_weight key_value.value_bias proj.weight proj.bias",
    ),
    "cross_no_ln_fused": (
        {"attention_type": "cross", "fuse_qkv_params": True},
        "query_layer.weight query_layer.bias key_value.weight key_value.bias proj.weight proj.bias",
    ),
}


@pytest.mark.parametrize("case", list(STATE_DICT_CASES))
def test_state_dict_names(case):
    cfg, names = STATE_DICT_CASES[case]
    m, _ = make_mha(num_gqa_groups=2, **cfg)
    assert _keys(m) == set(names.split())
    # te's GEMM modules keep an _extra_state entry each (their scaling state); the attention core
    # and the norms have no state and write none (a TE checkpoint's entries for them load)
    extra = {k for k in m.state_dict() if k.endswith("_extra_state")}
    gemms = {k.rsplit(".", 1)[0] for k in names.split() if "norm." not in k}
    assert extra == {f"{g}._extra_state" for g in gemms}
    sd = m.state_dict()
    sd["core_attention._extra_state"] = te_norm_extra_state()
    m.load_state_dict(sd, strict=True)


def test_state_dict_shapes_follow_heads_and_groups():
    m, _ = make_mha(num_gqa_groups=2, kv_channels=6, input_layernorm=True, qk_norm_type="RMSNorm")
    sd = m.state_dict()
    assert sd["layernorm_qkv.query_weight"].shape == (H * 6, HID)
    assert sd["layernorm_qkv.key_weight"].shape == (2 * 6, HID)
    assert sd["layernorm_qkv.value_bias"].shape == (2 * 6,)
    assert sd["q_norm.weight"].shape == (6,)
    assert sd["proj.weight"].shape == (HID, H * 6)
    f, _ = make_mha(num_gqa_groups=2, kv_channels=6, fuse_qkv_params=True)
    assert f.state_dict()["qkv.weight"].shape == ((H + 4) * 6, HID)


def te_norm_extra_state():
    """What TE 2.x's ops-based norms (te.pytorch.LayerNorm / RMSNorm / ops.L2Normalization, its
    q_norm and k_norm) write as ``_extra_state`` without FP8 state: a uint8 tensor of
    pickle.dumps({})."""
    return torch.frombuffer(bytearray(pickle.dumps({})), dtype=torch.uint8).clone()


@pytest.mark.parametrize("kind", ["RMSNorm", "LayerNorm", "L2Normalization"])
def test_te_checkpoint_with_qk_norm_extra_state_loads(kind):
    """The module docstring: a TE checkpoint's state_dict loads. TE's q_norm / k_norm carry an
    _extra_state entry (for L2Normalization too: one shared parameter-free op)."""
    a, _ = make_mha(seed=0, qk_norm_type=kind, input_layernorm=True)
    b, _ = make_mha(seed=3, qk_norm_type=kind, input_layernorm=True)
    sd = a.state_dict()
    sd["q_norm._extra_state"] = te_norm_extra_state()
    sd["k_norm._extra_state"] = te_norm_extra_state()
    b.load_state_dict(sd, strict=True)
    x = data(S, B, HID)
    assert torch.equal(a(x), b(x))


@pytest.mark.parametrize(
    "cfg",
    [
        {"input_layernorm": True, "fuse_qkv_params": True, "num_gqa_groups": 2, "qk_norm_type": "LayerNorm"},
        {"attention_type": "cross", "attn_mask_type": "no_mask", "input_layernorm": True},
        {"normalization": "RMSNorm", "input_layernorm": True, "zero_centered_gamma": True, "bias": False},
    ],
)
def test_state_dict_round_trip(cfg):
    a, _ = make_mha(seed=0, **cfg)
    b, _ = make_mha(seed=7, **cfg)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b.load_state_dict(torch.load(buf, weights_only=False), strict=True)
    x = data(S, B, HID)
    kw = {"encoder_output": data(SKV, B, HID, seed=3)} if cfg.get("attention_type") == "cross" else {}
    assert torch.equal(a(x, **kw), b(x, **kw))


# ----------------------------------------------------------------------------- FP8 recipes

# Bounds, normwise against the fp64 reference: E4M3 keeps 3 mantissa bits (round-off up to
# 2^-4, about 3.6% rms per element); the QKV GEMM quantizes both operands (~5%), the scores
# q k^T carry q's and k's errors into the softmax, and the output GEMM adds its own ~5%: a few
# percent to ~10% (the larger, the more peaked the softmax; measured 3.5-4.5% here, with scores
# of rms ~0.7). 0.1 of the output's scale holds that with a 2x margin, while a wrong layout or
# a skipped part gives O(1). Gradients go through E5M2 (HYBRID: 2 mantissa bits, twice the
# round-off) in every dgrad / wgrad GEMM and through the softmax: measured 7-13%, bound 0.25.
FP8_FWD, FP8_BWD = 0.1, 0.25
RECIPES = {
    "delayed": recipe.DelayedScaling,
    "current": recipe.Float8CurrentScaling,
    "block": recipe.Float8BlockScaling,
}


@pytest.mark.parametrize(
    "cfg",
    [
        {"input_layernorm": True, "fuse_qkv_params": True, "num_gqa_groups": 2},
        {"attention_type": "cross", "attn_mask_type": "no_mask", "input_layernorm": True},
    ],
    ids=["self", "cross"],
)
@pytest.mark.parametrize("name", list(RECIPES))
def test_fp8_recipes_close_to_reference(name, cfg):
    hid, s, b = 64, 16, 2  # 32 tokens
    torch.manual_seed(0)
    kw = {"hidden_size": hid, "num_attention_heads": 4, "attention_dropout": 0.0, "device": "cpu", **cfg}
    m = randomize(te.MultiheadAttention(**kw))
    with torch.no_grad():  # weights of TE's scale (the softmax stays non-uniform)
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(0.4)
    r = RECIPES[name]()
    for step in range(2):
        x, dy = data(b, s, hid, seed=10 + step), data(b, s, hid, seed=20 + step)
        enc = data(b, s, hid, seed=30 + step) if kw.get("attention_type") == "cross" else None
        xt = to_fmt(x, "sbhd").requires_grad_(True)
        fwd = {} if enc is None else {"encoder_output": to_fmt(enc, "sbhd")}
        with te.autocast(recipe=r):
            y = m(xt, **fwd)
        (y * to_fmt(dy, "sbhd")).sum().backward()
        assert torch.isfinite(y).all() and torch.isfinite(xt.grad).all()
        P = ref_params(m)
        x64 = x.double().requires_grad_(True)
        keep = None if enc is not None else causal_keep(s, s)
        out, bias, _ = mha_ref(P, kw, x64, None if enc is None else enc.double(), keep)
        want = out + bias
        (want * dy.double()).sum().backward()
        err = rel(from_fmt(y.detach(), "sbhd"), want.detach())
        assert 1e-3 < err < FP8_FWD, f"step {step}: output rel error {err:.3f}"  # quantized, and close
        assert rel(from_fmt(xt.grad, "sbhd"), x64.grad) < FP8_BWD
        check_grads(m, P, FP8_BWD)
        m.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------- errors


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="attention_type"):
        te.MultiheadAttention(HID, H, attention_type="both", device="cpu")
    with pytest.raises(ValueError, match="qk_norm_type"):
        te.MultiheadAttention(HID, H, qk_norm_type="BatchNorm", device="cpu")
    with pytest.raises(ValueError, match="kv_channels"):
        te.MultiheadAttention(30, 4, device="cpu")
    with pytest.raises(ValueError, match="num_gqa_groups"):
        te.MultiheadAttention(HID, H, num_gqa_groups=3, device="cpu")
    m, _ = make_mha()
    with pytest.raises(ValueError, match="hidden_states"):
        m(data(B, HID))  # 2-d for sbhd
    with pytest.raises(ValueError, match="hidden_states"):
        m(data(S, B, HID + 1))
    with pytest.raises(TypeError, match="hidden_states"):
        m(torch.ones(S, B, HID, dtype=torch.int32))
    with pytest.raises(TypeError, match="inference_params: expected a te.InferenceParams, got object"):
        m(data(S, B, HID), inference_params=object())
    with pytest.raises(ValueError, match="encoder_output"):
        m(data(S, B, HID), encoder_output=data(S, B, HID))
    c, _ = make_mha(attention_type="cross")
    with pytest.raises(ValueError, match="encoder_output"):
        c(data(S, B, HID))
    with pytest.raises(ValueError, match="encoder_output"):
        c(data(S, B, HID), encoder_output=data(S * B, HID))
    t, _ = make_mha(qkv_format="thd", attn_mask_type="padding_causal")
    with pytest.raises(ValueError, match="hidden_states"):
        t(data(S, B, HID))
