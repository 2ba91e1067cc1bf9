"""te.TransformerLayer on CPU against an independent fp64 reference of TE's block composition:

    pre-norm:  a = x + (self_attention(x) + proj bias)
               c = a + (inter_attention(a, encoder_output) + proj bias)      decoder only
               y = c + (fc2(act(fc1(norm(c)))) + fc2 bias)
    apply_residual_connection_post_layernorm: each residual is its norm's output instead;
    output_layernorm: no input norm in the self attention, y = layernorm(y);
    parallel_attention_mlp: y = x + attention(x) + mlp(x);
    drop_path_rate: a sample's branch dropped whole (train mode), kept ones scaled 1 / (1 - p).

The attention reference (mha_ref, TE's QKV layouts, masks, RoPE) is test_multihead_attention's.
"""

import io
import math

import pytest
import te_torch as te
import torch
import torch.nn.functional as F
from _module_ref import rel
from te_torch import recipe
from test_multihead_attention import (
    causal_keep,
    check_grads,
    compare_with,
    data,
    from_fmt,
    mha_ref,
    norm_ref,
    padding_keep,
    random_freqs,
    randomize,
    ref_params,
    te_norm_extra_state,
    to_fmt,
)

HID, FFN, H, S, B, SKV = 32, 64, 4, 6, 3, 5
TOL = 1e-5
_ATTN_KEYS = (
    "num_gqa_groups",
    "kv_channels",
    "layernorm_epsilon",
    "normalization",
    "zero_centered_gamma",
    "fuse_qkv_params",
    "qkv_weight_interleaved",
    "rotary_pos_interleaved",
    "qk_norm_type",
    "qk_norm_eps",
    "qk_norm_before_rope",
)


# ----------------------------------------------------------------------------- reference


def act_ref(h, kind):
    """te.LayerNormMLP's activations used here (gelu: the tanh approximation; gated: the first
    half of FC1's output feeds the activation, the second half is the linear gate)."""
    if kind == "gelu":
        return 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    if kind == "relu":
        return h.clamp(min=0)
    if kind == "swiglu":
        a, gate = h.chunk(2, dim=-1)
        return a * torch.sigmoid(a) * gate
    raise AssertionError(kind)


def mlp_ref(P, cfg, x, prefix="layernorm_mlp."):
    """(fc2 output without its bias, fc2 bias or None, the norm's output)."""
    ln = norm_ref(
        x,
        P[prefix + "layer_norm_weight"],
        P.get(prefix + "layer_norm_bias"),
        cfg.get("normalization", "LayerNorm"),
        cfg.get("layernorm_epsilon", 1e-5),
        cfg.get("zero_centered_gamma", False),
    )
    h = F.linear(ln, P[prefix + "fc1_weight"], P.get(prefix + "fc1_bias"))
    out = F.linear(act_ref(h, cfg.get("activation", "gelu")), P[prefix + "fc2_weight"])
    return out, P.get(prefix + "fc2_bias"), ln


def attn_cfg(cfg, kind):
    c = {k: cfg[k] for k in _ATTN_KEYS if k in cfg}
    c.update(
        hidden_size=cfg["hidden_size"], num_attention_heads=cfg["num_attention_heads"], attention_type=kind
    )
    c["input_layernorm"] = kind == "cross" or not cfg.get("output_layernorm", False)
    return c


def _plus(a, b):
    return a if b is None else a + b


def tl_ref(P, cfg, x, enc=None, keep=None, enc_keep=None, rope=None, drop=None):
    """The layer in fp64 on [b, s, hidden]. ``drop``: {branch: [b]} per-sample drop-path factors
    ("attn", "cross", "mlp"), 0 for dropped, 1 for kept (scaled by 1 / (1 - drop_path_rate))."""
    post = cfg.get("apply_residual_connection_post_layernorm", False)
    out_ln = cfg.get("output_layernorm", False)
    keep_p = 1.0 - cfg.get("drop_path_rate", 0.0)

    def branch(name, v):
        return v if drop is None else v * drop[name].double()[:, None, None] / keep_p

    a, ab, ln = mha_ref(P, attn_cfg(cfg, "self"), x, keep=keep, rope=rope, prefix="self_attention.")
    if cfg.get("parallel_attention_mlp", False):
        m, mb, _ = mlp_ref(P, cfg, x)
        y = x + branch("attn", _plus(_plus(a, ab) + m, mb))
    else:
        h = (ln if post and not out_ln else x) + branch("attn", _plus(a, ab))
        if cfg.get("layer_type", "encoder") == "decoder":
            c, cb, ln2 = mha_ref(P, attn_cfg(cfg, "cross"), h, enc, enc_keep, prefix="inter_attention.")
            h = (ln2 if post else h) + branch("cross", _plus(c, cb))
        m, mb, ln3 = mlp_ref(P, cfg, h)
        y = (ln3 if post else h) + branch("mlp", _plus(m, mb))
    if out_ln:
        y = norm_ref(
            y,
            P["layernorm.weight"],
            P.get("layernorm.bias"),
            cfg.get("normalization", "LayerNorm"),
            cfg.get("layernorm_epsilon", 1e-5),
            cfg.get("zero_centered_gamma", False),
        )
    return y


# ----------------------------------------------------------------------------- helpers


def make_tl(seed=0, **cfg):
    kw = {
        "hidden_size": HID,
        "ffn_hidden_size": FFN,
        "num_attention_heads": H,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "device": "cpu",
    }
    kw.update(cfg)
    torch.manual_seed(seed)
    return randomize(te.TransformerLayer(**kw), seed), kw


def compare_tl(m, cfg, x, dy, enc=None, keep=None, enc_keep=None, rope=None, fwd=None, tol=TOL):
    def reference(P, x64, e64):
        return tl_ref(P, cfg, x64, e64, keep, enc_keep, rope)

    return compare_with(reference, m, cfg.get("attn_input_format", "sbhd"), x, dy, enc, rope, fwd, tol)


VARIANTS = {
    "pre_norm": {},
    "post_ln_residual": {"apply_residual_connection_post_layernorm": True},
    "output_layernorm": {"output_layernorm": True},
    "output_layernorm_post_ln_residual": {
        "output_layernorm": True,
        "apply_residual_connection_post_layernorm": True,
    },
    "parallel_attention_mlp": {"parallel_attention_mlp": True},
}


# ----------------------------------------------------------------------------- against the reference


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_encoder_matches_reference(fmt, variant):
    m, cfg = make_tl(attn_input_format=fmt, **VARIANTS[variant])
    x, dy = data(B, S, HID), data(B, S, HID, seed=2)
    compare_tl(m, cfg, x, dy, keep=causal_keep(S, S))


@pytest.mark.parametrize("variant", ["pre_norm", "post_ln_residual", "output_layernorm"])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_decoder_matches_reference(fmt, variant):
    m, cfg = make_tl(layer_type="decoder", attn_input_format=fmt, **VARIANTS[variant])
    x, dy, enc = data(B, S, HID), data(B, S, HID, seed=2), data(B, SKV, HID, seed=3)
    compare_tl(m, cfg, x, dy, enc=enc, keep=causal_keep(S, S))  # enc_dec_attn_mask_type "no_mask"


LAYER_OPTIONS = {
    "gqa_kv_channels_fused_rms_zc": {
        "num_gqa_groups": 2,
        "kv_channels": 12,
        "fuse_qkv_params": True,
        "normalization": "RMSNorm",
        "zero_centered_gamma": True,
    },
    "no_bias_concat_swiglu": {
        "bias": False,
        "fuse_qkv_params": True,
        "qkv_weight_interleaved": False,
        "activation": "swiglu",
    },
    "mqa_relu_eps": {"num_gqa_groups": 1, "activation": "relu", "layernorm_epsilon": 0.5},
}


@pytest.mark.parametrize("layer_type", ["encoder", "decoder"])
@pytest.mark.parametrize("option", list(LAYER_OPTIONS))
def test_layer_options_match_reference(option, layer_type):
    m, cfg = make_tl(layer_type=layer_type, **LAYER_OPTIONS[option])
    if cfg.get("bias") is False:
        assert not [n for n, _ in m.named_parameters() if "bias" in n and "layer_norm" not in n]
    x, dy = data(B, S, HID), data(B, S, HID, seed=2)
    enc = data(B, SKV, HID, seed=3) if layer_type == "decoder" else None
    compare_tl(m, cfg, x, dy, enc=enc, keep=causal_keep(S, S))


@pytest.mark.parametrize("form", ["tensor", "tuple"])
def test_rotary_and_qk_norm_pass_through(form):
    m, cfg = make_tl(
        qk_norm_type="RMSNorm",
        rotary_pos_interleaved=True,
        qk_norm_eps=0.25,
        num_gqa_groups=2,
        attn_input_format="bshd",
    )
    f = random_freqs(S, HID // H, True)
    rope = f if form == "tensor" else (f, random_freqs(S, HID // H, True, seed=9))
    x, dy = data(B, S, HID), data(B, S, HID, seed=2)
    compare_tl(m, cfg, x, dy, keep=causal_keep(S, S), rope=rope)


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_masks_pass_through(fmt):
    """A self-attention padding mask [b, 1, 1, s] and the cross attention's (q, kv) pair."""
    m, cfg = make_tl(
        layer_type="decoder",
        attn_input_format=fmt,
        self_attn_mask_type="padding_causal",
        enc_dec_attn_mask_type="padding",
    )
    pad_q = torch.arange(S)[None, :] >= torch.tensor([S, 4, 2])[:, None]
    pad_kv = torch.arange(SKV)[None, :] >= torch.tensor([3, SKV, 1])[:, None]
    x, enc = data(B, S, HID), data(B, SKV, HID, seed=3)
    dy = data(B, S, HID, seed=2) * (~pad_q)[..., None]
    fwd = {
        "attention_mask": pad_q[:, None, None, :],
        "enc_dec_attn_mask": (pad_q[:, None, None, :], pad_kv[:, None, None, :]),
    }
    xt = to_fmt(x, fmt).requires_grad_(True)
    y = m(xt, encoder_output=to_fmt(enc, fmt), **fwd)
    assert torch.isfinite(y).all()
    (y * to_fmt(dy, fmt)).sum().backward()
    P = ref_params(m)
    x64 = x.double().requires_grad_(True)
    keep = padding_keep(pad_q, pad_q, causal=True)
    want = tl_ref(P, cfg, x64, enc.double(), keep, padding_keep(pad_q, pad_kv))
    (want * dy.double()).sum().backward()
    valid = ~pad_q
    assert rel(from_fmt(y.detach(), fmt)[valid], want.detach()[valid]) < TOL
    assert rel(from_fmt(xt.grad, fmt), x64.grad) < TOL
    check_grads(m, P)


def test_thd_matches_reference_per_sequence():
    m, cfg = make_tl(attn_input_format="thd", self_attn_mask_type="padding_causal", num_gqa_groups=2)
    lens, cu = [3, 5, 2], torch.tensor([0, 3, 8, 10], dtype=torch.int32)
    x, dy = data(10, HID), data(10, HID, seed=2)
    xt = x.clone().requires_grad_(True)
    y = m(xt, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=5, max_seqlen_kv=5)
    assert y.shape == (10, HID)
    (y * dy).sum().backward()
    P = ref_params(m)
    x64 = x.double().requires_grad_(True)
    want = torch.cat(
        [tl_ref(P, cfg, x64[cu[i] : cu[i + 1]][None], keep=causal_keep(s, s))[0] for i, s in enumerate(lens)]
    )
    (want * dy.double()).sum().backward()
    assert rel(y.detach(), want.detach()) < TOL
    assert rel(xt.grad, x64.grad) < TOL
    check_grads(m, P)


def test_non_contiguous_input():
    m, _ = make_tl()
    x = data(B, S, HID)
    assert torch.equal(m(x.transpose(0, 1)), m(x.transpose(0, 1).contiguous()))


# ----------------------------------------------------------------------------- dropout, drop path


def _combos(branches):
    out = [{}]
    for name in branches:
        out = [{**c, name: k} for c in out for k in (0, 1)]
    return out


@pytest.mark.parametrize(
    "layer_type,fmt,extra",
    [
        ("encoder", "sbhd", {}),
        ("encoder", "bshd", {}),
        ("encoder", "sbhd", {"parallel_attention_mlp": True}),
        ("decoder", "bshd", {}),
    ],
)
def test_drop_path_drops_whole_samples_in_training(layer_type, fmt, extra):
    b, p = 16, 0.5
    m, cfg = make_tl(drop_path_rate=p, layer_type=layer_type, attn_input_format=fmt, **extra)
    x = data(b, S, HID)
    enc = data(b, SKV, HID, seed=3) if layer_type == "decoder" else None
    kw = {} if enc is None else {"encoder_output": to_fmt(enc, fmt)}
    P = {n: t.detach().double() for n, t in ref_params(m).items()}
    x64, e64 = x.double(), None if enc is None else enc.double()
    m.eval()  # no effect in eval mode
    want = tl_ref(P, cfg, x64, e64, causal_keep(S, S))
    assert rel(from_fmt(m(to_fmt(x, fmt), **kw).detach(), fmt), want) < TOL
    m.train()
    torch.manual_seed(1234)
    y = from_fmt(m(to_fmt(x, fmt), **kw).detach(), fmt).double()
    # a decoder's cross-attention branch is never dropped (as in TE)
    branches = ["attn"] if extra else ["attn", "mlp"]
    refs = []
    for combo in _combos(branches):
        drop = {k: torch.full((b,), float(v)) for k, v in combo.items()}
        if enc is not None:
            drop["cross"] = torch.full((b,), 1.0 - p)  # kept and not rescaled
        refs.append((combo, tl_ref(P, cfg, x64, e64, causal_keep(S, S), drop=drop)))
    seen = []
    for i in range(b):
        match = [c for c, r in refs if rel(y[i], r[i]) < TOL]
        assert match, f"sample {i}: matches no combination of kept / dropped branches"
        seen.append(match[0])
    for name in branches:
        kept = {c[name] for c in seen}
        assert kept == {0, 1}, f"branch {name}: over {b} samples with p={p}, kept pattern {kept}"
    if enc is not None:
        return
    # a sample with every branch dropped is its residual path alone: the input
    all_dropped = [i for i, c in enumerate(seen) if not any(c.values())]
    assert all_dropped
    for i in all_dropped:
        assert torch.equal(y[i], x64[i])


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_hidden_dropout_eval_none_train_seeded(fmt):
    m, cfg = make_tl(hidden_dropout=0.5, attention_dropout=0.3, layer_type="decoder", attn_input_format=fmt)
    x, enc = to_fmt(data(B, S, HID), fmt), to_fmt(data(B, SKV, HID, seed=3), fmt)
    m.eval()
    y_eval = m(x, encoder_output=enc).detach()
    P = {n: t.detach().double() for n, t in ref_params(m).items()}
    want = tl_ref(P, cfg, from_fmt(x, fmt).double(), from_fmt(enc, fmt).double(), causal_keep(S, S))
    assert rel(from_fmt(y_eval, fmt), want) < TOL
    m.train()
    outs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        outs.append(m(x, encoder_output=enc).detach())
    assert torch.equal(outs[0], outs[1])
    assert not torch.allclose(outs[0], outs[2])
    assert rel(outs[0], y_eval) > 1e-2


def test_hidden_dropout_drops_branch_elements_not_the_residual():
    """parallel_attention_mlp: y = x + dropout(attention(x) + mlp(x)); with no attention dropout
    every element of y - x is 0 or the branch / (1 - p)."""
    p = 0.5
    m, cfg = make_tl(parallel_attention_mlp=True, hidden_dropout=p)
    x = data(B, S, HID)
    P = {n: t.detach().double() for n, t in ref_params(m).items()}
    branch = tl_ref(P, cfg, x.double(), keep=causal_keep(S, S)) - x.double()
    m.train()
    torch.manual_seed(0)
    d = from_fmt(m(to_fmt(x, "sbhd")).detach(), "sbhd").double() - x.double()
    zero = d.abs() < 1e-6
    kept = ~zero
    assert torch.allclose(d[kept], branch[kept] / (1 - p), rtol=1e-4, atol=1e-5)
    assert 0.35 < zero.double().mean().item() < 0.65


# ----------------------------------------------------------------------------- compile


def test_torch_compile_matches_eager():
    torch._dynamo.reset()
    m, _ = make_tl(layer_type="decoder", num_gqa_groups=2, fuse_qkv_params=True)
    x, enc, dy = data(S, B, HID), data(SKV, B, HID, seed=3), data(S, B, HID, seed=2)
    cm = torch.compile(m, backend="aot_eager", fullgraph=False)
    results = []
    for f in (m, cm):
        xt = x.clone().requires_grad_(True)
        y = f(xt, encoder_output=enc)
        (y * dy).sum().backward()
        results.append((y.detach(), xt.grad, {n: p.grad.clone() for n, p in m.named_parameters()}))
        m.zero_grad(set_to_none=True)
    (y0, dx0, g0), (y1, dx1, g1) = results
    torch.testing.assert_close(y1, y0, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dx1, dx0, rtol=1e-6, atol=1e-6)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-6, msg=n)


# ----------------------------------------------------------------------------- state_dict

_SELF_LN = "self_attention.layernorm_qkv.layer_norm_weight self_attention.layernorm_qkv.layer_norm_bias "
_SELF_SPLIT = " ".join(
    f"self_attention.{{}}.{n}_{k}" for n in ("query", "key", "value") for k in ("weight", "bias")
)
_PROJ = "self_attention.proj.weight self_attention.proj.bias "
_MLP = (
    "layernorm_mlp.layer_norm_weight layernorm_mlp.layer_norm_bias layernorm_mlp.fc1_weight layernorm_mlp.fc1_bias "
    "layernorm_mlp.fc2_weight layernorm_mlp.fc2_bias "
)
_CROSS = (
    "inter_attention.layernorm_query.layer_norm_weight inter_attention.layernorm_query.layer_norm_bias "
    "inter_attention.layernorm_query.query_weight inter_attention.layernorm_query.query_bias "
    "inter_attention.key_value.key_weight inter_attention.key_value.key_bias "
    "inter_attention.key_value.value_weight inter_attention.key_value.value_bias "
    "inter_attention.proj.weight inter_attention.proj.bias "
)
TL_STATE_DICTS = {
    "encoder": ({}, _SELF_LN + _SELF_SPLIT.format(*["layernorm_qkv"] * 6) + " " + _PROJ + _MLP),
    "decoder": (
        {"layer_type": "decoder"},
        _SELF_LN + _SELF_SPLIT.format(*["layernorm_qkv"] * 6) + " " + _PROJ + _CROSS + _MLP,
    ),
    "output_layernorm": (
        {"output_layernorm": True},
        _SELF_SPLIT.format(*["qkv"] * 6) + " " + _PROJ + _MLP + "layernorm.weight layernorm.bias",
    ),
    "parallel_fused": (
        {"parallel_attention_mlp": True, "fuse_qkv_params": True},
        _SELF_LN + "self_attention.layernorm_qkv.weight self_attention.layernorm_qkv.bias " + _PROJ + _MLP,
    ),
    "rms_no_bias_output_ln_qk_norm": (
        {"normalization": "RMSNorm", "bias": False, "output_layernorm": True, "qk_norm_type": "RMSNorm"},
        "self_attention.qkv.query_weight self_attention.qkv.key_weight self_attention.qkv.value_weight "
        "self_attention.q_norm.weight self_attention.k_norm.weight self_attention.proj.weight "
        "layernorm_mlp.layer_norm_weight layernorm_mlp.fc1_weight layernorm_mlp.fc2_weight layernorm.weight",
    ),
}


@pytest.mark.parametrize("case", list(TL_STATE_DICTS))
def test_state_dict_names(case):
    cfg, names = TL_STATE_DICTS[case]
    m, _ = make_tl(**cfg)
    assert {k for k in m.state_dict() if not k.endswith("_extra_state")} == set(names.split())
    extra = {k for k in m.state_dict() if k.endswith("_extra_state")}
    assert {"self_attention.proj._extra_state", "layernorm_mlp._extra_state"} <= extra


def test_state_dict_round_trip():
    cfg = {"layer_type": "decoder", "num_gqa_groups": 2, "fuse_qkv_params": True, "zero_centered_gamma": True}
    a, _ = make_tl(seed=0, **cfg)
    b, _ = make_tl(seed=5, **cfg)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b.load_state_dict(torch.load(buf, weights_only=False), strict=True)
    x, enc = data(S, B, HID), data(SKV, B, HID, seed=3)
    assert torch.equal(a(x, encoder_output=enc), b(x, encoder_output=enc))


def test_te_checkpoint_with_norm_extra_state_loads():
    """TE 2.x's final ``layernorm`` and q_norm / k_norm (ops-based norms) write an _extra_state
    entry (uint8 pickle of {} without FP8 state); the layer's docstring says TE checkpoints load."""
    cfg = {"output_layernorm": True, "qk_norm_type": "RMSNorm", "layer_type": "decoder"}
    a, _ = make_tl(seed=0, **cfg)
    b, _ = make_tl(seed=5, **cfg)
    sd = a.state_dict()
    for att in ("self_attention", "inter_attention"):
        for k in ("q_norm", "k_norm"):
            sd[f"{att}.{k}._extra_state"] = te_norm_extra_state()
    sd["layernorm._extra_state"] = te_norm_extra_state()
    b.load_state_dict(sd, strict=True)
    x, enc = data(S, B, HID), data(SKV, B, HID, seed=3)
    assert torch.equal(a(x, encoder_output=enc), b(x, encoder_output=enc))


# ----------------------------------------------------------------------------- FP8 recipes

# Bounds (as test_multihead_attention's), normwise against the fp64 reference: E4M3 round-off
# of a few percent per GEMM operand gives the branches (y - x: the residual carries no GEMM
# error and would hide the rest) an error of several percent, measured 4.5-6% here: 0.1 leaves
# a ~2x margin, while a wrong composition gives O(1). Gradients (E5M2 in backward with HYBRID,
# twice E4M3's round-off, through every dgrad / wgrad GEMM and the softmax; dx with the
# residual's identity part dy taken out): measured 6-10% for dx and up to 16% for the query /
# key side's parameters, whose gradients come through score differences: bound 0.25.
FP8_FWD, FP8_BWD = 0.1, 0.25
RECIPES = {
    "delayed": recipe.DelayedScaling,
    "current": recipe.Float8CurrentScaling,
    "block": recipe.Float8BlockScaling,
}


@pytest.mark.parametrize("layer_type", ["encoder", "decoder"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_fp8_recipes_close_to_reference(name, layer_type):
    hid, s, b = 64, 16, 2  # 32 tokens
    cfg = {
        "hidden_size": hid,
        "ffn_hidden_size": 128,
        "num_attention_heads": 4,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "device": "cpu",
        "layer_type": layer_type,
    }
    torch.manual_seed(0)
    m = randomize(te.TransformerLayer(**cfg))
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(0.4)
    r = RECIPES[name]()
    for step in range(2):
        x, dy = data(b, s, hid, seed=10 + step), data(b, s, hid, seed=20 + step)
        enc = data(b, s, hid, seed=30 + step) if layer_type == "decoder" else None
        xt = to_fmt(x, "sbhd").requires_grad_(True)
        kw = {} if enc is None else {"encoder_output": to_fmt(enc, "sbhd")}
        with te.autocast(recipe=r):
            y = m(xt, **kw)
        (y * to_fmt(dy, "sbhd")).sum().backward()
        assert torch.isfinite(y).all() and torch.isfinite(xt.grad).all()
        P = ref_params(m)
        x64 = x.double().requires_grad_(True)
        want = tl_ref(P, cfg, x64, None if enc is None else enc.double(), causal_keep(s, s))
        (want * dy.double()).sum().backward()
        err = rel(from_fmt(y.detach(), "sbhd") - x, (want - x64).detach())
        assert 1e-3 < err < FP8_FWD, f"step {step}: branch rel error {err:.3f}"
        derr = rel(from_fmt(xt.grad, "sbhd") - dy, x64.grad - dy.double())
        assert derr < FP8_BWD, f"step {step}: dx (less dy) rel error {derr:.3f}"
        check_grads(m, P, FP8_BWD)
        m.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------- errors


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="layer_type"):
        te.TransformerLayer(HID, FFN, H, layer_type="encoder_decoder", device="cpu")
    with pytest.raises(NotImplementedError, match="ub_tp_comm_overlap"):
        te.TransformerLayer(HID, FFN, H, ub_tp_comm_overlap=True, device="cpu")
    with pytest.raises(ValueError, match="parallel_attention_mlp"):
        te.TransformerLayer(HID, FFN, H, parallel_attention_mlp=True, output_layernorm=True, device="cpu")
    with pytest.raises(ValueError, match="parallel_attention_mlp"):
        te.TransformerLayer(HID, FFN, H, parallel_attention_mlp=True, layer_type="decoder", device="cpu")
    with pytest.raises(ValueError, match="hidden_dropout"):
        te.TransformerLayer(HID, FFN, H, hidden_dropout=1.5, device="cpu")
    with pytest.raises(ValueError, match="drop_path_rate"):
        te.TransformerLayer(HID, FFN, H, drop_path_rate=-0.1, device="cpu")
    m, _ = make_tl()
    with pytest.raises(ValueError, match="hidden_states"):
        m(data(S * B, HID))
    with pytest.raises(ValueError, match="hidden_states"):
        m(data(S, B, HID + 2))
    with pytest.raises(TypeError, match="inference_params: expected a te.InferenceParams, got object"):
        m(data(S, B, HID), inference_params=object())
    d, _ = make_tl(layer_type="decoder")
    with pytest.raises(ValueError, match="encoder_output"):
        d(data(S, B, HID))
