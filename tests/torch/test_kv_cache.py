"""te.InferenceParams (TE's KV cache for generation) on CPU against independent references.

DotProductAttention with a cache is checked, token by token, against softmax attention written
out here in fp64 over each sequence's whole history as the test itself recorded it: a new token
at absolute position p of its sequence sees key position j when j <= p (causal types; te, as
TE, aligns them bottom-right under a cache), -left <= j - p <= right (windows), every j (padding /
no_mask); ALiBi adds -slope * |j - p|. The cache's own contents are never the reference.

MultiheadAttention and TransformerLayer are checked against their own full-sequence causal
forward without a cache (a different code path: one dense causal call over all positions).
InferenceParams' bookkeeping is checked against lengths the test adds up from its step dicts.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import te_torch as te
import torch
from _attention_ref import F32_TOL, LOW_TOL, ref_attention
from test_multihead_attention import randomize

CPU = torch.device("cpu")
MAX_BATCH, MAX_SEQ = 4, 12
# Step dicts in batch order: prompts of 5, 1 and 7 tokens; seq 0 continues by 3 at once (step 2)
# while the batch order changes; seq 0 finishes first, seq 3 joins at the front, seq 4 joins
# with a 4-token prompt while seq 2 reaches MAX_SEQ exactly; seq 5 joins with a 1-token prompt.
SCHEDULE = [
    {0: 5, 1: 1, 2: 7},
    {0: 1, 1: 1, 2: 1},
    {2: 1, 0: 3, 1: 1},
    {2: 1, 1: 1},
    {3: 2, 2: 1, 1: 1},
    {1: 1, 3: 1, 4: 4, 2: 1},
    {4: 1, 3: 1},
    {4: 1, 3: 1, 5: 1},
]
# Page sizes: 1, 3 (divides none of the prompts 5, 1, 7, 2, 4), 4; None = non-paged.
CACHES = [None, 1, 3, 4]


def lengths_after(schedule):
    """Each step's {seq: length after the step} and {seq: length before}, in step order."""
    lens, out = {}, []
    for step in schedule:
        pre = OrderedDict((s, lens.get(s, 0)) for s in step)
        lens = {s: pre[s] + n for s, n in step.items()}
        out.append((OrderedDict((s, lens[s]) for s in step), pre))
    return out


def tight_pool(schedule, page_size):
    """The fewest pages the schedule can run in: finished sequences' pages must be reused."""
    return max(sum(-(-n // page_size) for n in after.values()) for after, _ in lengths_after(schedule))


def make_params(page_size, *, g=2, dk=8, dv=None, dtype=torch.float32, pool=None, schedule=SCHEDULE, **kw):
    paged = page_size is not None
    return te.InferenceParams(
        MAX_BATCH,
        MAX_SEQ,
        g,
        dk,
        dtype,
        head_dim_v=dv,
        is_paged=paged,
        total_num_pages=(pool or tight_pool(schedule, page_size)) if paged else None,
        page_size=page_size,
        device=CPU,
        **kw,
    )


# ----------------------------------------------------------------------------------------------
# Packing the new tokens of a step, and the reference
# ----------------------------------------------------------------------------------------------


def garbage(shape, gen, dtype):
    """Padding values far from the real ones: a copy that reads them shows up in the outputs."""
    return (torch.randn(shape, generator=gen) * 30 + 100).to(dtype)


def pack(fmt, parts, gen, extra=0):
    """Per-sequence [n_i, heads, d] tensors -> the step's input: bshd / sbhd with each sequence's
    tokens first and ``extra`` more padded positions, thd packed with ``extra`` trailing tokens."""
    heads, d = parts[0].shape[1:]
    dtype = parts[0].dtype
    if fmt == "thd":
        return torch.cat([*parts, garbage((extra, heads, d), gen, dtype)])
    s = max(p.shape[0] for p in parts) + extra
    x = garbage((len(parts), s, heads, d), gen, dtype)
    for i, p in enumerate(parts):
        x[i, : p.shape[0]] = p
    return x if fmt == "bshd" else x.transpose(0, 1).contiguous()


def unpack(fmt, out, counts):
    """The step's output -> each sequence's new-token rows [n_i, ...]."""
    if fmt == "thd":
        starts = [0, *torch.tensor(counts).cumsum(0).tolist()]
        return [out[starts[i] : starts[i] + n] for i, n in enumerate(counts)]
    if fmt == "sbhd":
        return [out[:n, i] for i, n in enumerate(counts)]
    return [out[i, :n] for i, n in enumerate(counts)]


def ref_new_tokens(q, k, v, *, causal, window, slopes, scale):
    """q [n, h, dk]: the last n tokens of a sequence whose whole history is k [L, g, dk], v
    [L, g, dv] -> [n, h * dv] in fp64."""
    n, L = q.shape[0], k.shape[0]
    rel = torch.arange(L)[None, :] - torch.arange(L - n, L)[:, None]  # key position - query position
    keep = torch.ones(n, L, dtype=torch.bool)
    left, right = window
    if causal:
        keep &= rel <= 0
    if left >= 0:
        keep &= rel >= -left
    if right >= 0:
        keep &= rel <= right
    add = None if slopes is None else (-slopes.double()[:, None, None] * rel.abs())[None]
    out = ref_attention(
        *(x.permute(1, 0, 2)[None] for x in (q, k, v)), keep[None, None], scale, add
    )  # [1, h, n, dv]
    return out[0].permute(1, 0, 2).reshape(n, -1)


def run_dpa(
    fmt,
    page_size,
    *,
    schedule=SCHEDULE,
    h=4,
    g=2,
    dk=8,
    dv=8,
    mask="padding_causal",
    window=None,
    alibi=False,
    q_dtype=torch.float32,
    cache_dtype=torch.float32,
    extra=0,
    seed=0,
    params=None,
    te_kwargs=False,
):
    """Runs te.DotProductAttention with a cache over ``schedule`` and checks every new token
    against the reference over the history this function recorded. Returns (params, history)."""
    gen = torch.Generator().manual_seed(seed)
    if params is None:
        params = make_params(page_size, g=g, dk=dk, dv=dv, dtype=cache_dtype, schedule=schedule)
        params.allocate_memory(7)
    m = te.DotProductAttention(
        h,
        (dk, dv),
        num_gqa_groups=g,
        qkv_format=fmt,
        attn_mask_type=mask,
        window_size=window,
        layer_number=7,
        device=CPU,
    )
    causal = "causal" in mask
    win = window if window is not None else ((-1, 0) if causal else (-1, -1))
    slopes = torch.rand(h, generator=gen) * 0.6 + 0.05 if alibi else None
    extra_kw = {"core_attention_bias_type": "alibi", "alibi_slopes": slopes} if alibi else {}
    tol = F32_TOL if q_dtype == torch.float32 else LOW_TOL[q_dtype]
    hist: dict = {}
    for t, step in enumerate(schedule):
        params.pre_step(OrderedDict(step))
        hist = {s: hist[s] for s in step if s in hist}  # finished sequences are gone
        counts = list(step.values())
        q, k, v = (
            [torch.randn(n, heads, d, generator=gen).mul(1.5).to(q_dtype) for n in counts]
            for heads, d in ((h, dk), (g, dk), (g, dv))
        )
        fwd = dict(extra_kw)
        if te_kwargs:  # TE's own generation loop passes these; under a cache they are the step's
            fwd.update(
                cu_seqlens_q=params.cu_seqlens_q,
                cu_seqlens_kv=params.cu_seqlens_kv,
                max_seqlen_q=MAX_SEQ,
                max_seqlen_kv=MAX_SEQ,
            )
        out = m(*(pack(fmt, x, gen, extra) for x in (q, k, v)), inference_params=params, **fwd)
        assert out.dtype == q_dtype
        if fmt == "thd":  # te's thd: tokens past the last sequence come out zero
            assert (out[sum(counts) :] == 0).all()
        for i, (seq, got) in enumerate(zip(step, unpack(fmt, out, counts), strict=True)):
            # the attention runs in q's dtype over the cache's values
            kc, vc = (x[i].to(cache_dtype).to(q_dtype) for x in (k, v))
            hist[seq] = tuple(
                torch.cat((hist[seq][j], new)) if seq in hist else new for j, new in enumerate((kc, vc))
            )
            want = ref_new_tokens(
                q[i].double(), *hist[seq], causal=causal, window=win, slopes=slopes, scale=1 / math.sqrt(dk)
            )
            torch.testing.assert_close(
                got.double(), want, **tol, msg=lambda s, t=t, seq=seq: f"step {t}, sequence {seq}: {s}"
            )
    return params, hist


# ----------------------------------------------------------------------------------------------
# 1. DotProductAttention with a cache
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", CACHES, ids=lambda p: "nonpaged" if p is None else f"page{p}")
@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_dpa_generation_matches_reference(fmt, page_size):
    run_dpa(fmt, page_size)


@pytest.mark.parametrize("page_size", [None, 3])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_dpa_extra_padding_and_te_style_kwargs(fmt, page_size):
    """Inputs longer than the step's tokens (padded positions / trailing packed tokens) and TE's
    cu_seqlens_* / max_seqlen_* arguments next to the cache."""
    run_dpa(fmt, page_size, extra=2, te_kwargs=True, seed=1)


MASK_CASES = [
    ("causal", None, False),
    ("causal_bottom_right", None, False),
    ("padding_causal_bottom_right", None, False),
    ("padding", None, False),
    ("no_mask", None, False),
    ("padding_causal", (2, 0), False),
    ("causal", (0, 0), False),
    ("padding", (1, 1), False),
    ("no_mask", (3, 2), False),
    ("padding_causal", None, True),
    ("padding", None, True),
    ("causal", (3, 0), True),
]


@pytest.mark.parametrize("mask, window, alibi", MASK_CASES)
@pytest.mark.parametrize("fmt, page_size", [("sbhd", None), ("thd", 3), ("bshd", 1)])
def test_dpa_masks_windows_alibi(fmt, page_size, mask, window, alibi):
    run_dpa(fmt, page_size, mask=mask, window=window, alibi=alibi, seed=2)


# Uniform steps (every sequence at one length taking one count of tokens: a static batch) take
# the maskless path; the 2-token causal step (s_q < s_kv) and the ragged last steps do not. Step
# 3 changes the batch order (rows move), step 5 finishes sequence 2.
UNIFORM = [
    {0: 4, 1: 4, 2: 4},
    {0: 1, 1: 1, 2: 1},
    {0: 1, 1: 1, 2: 1},
    {0: 2, 1: 2, 2: 2},
    {2: 1, 0: 1, 1: 1},
    {0: 1, 1: 1},
    {0: 1, 1: 2},
]


@pytest.mark.parametrize("extra", [0, 1], ids=["exact", "padded"])
@pytest.mark.parametrize("mask", ["padding_causal", "causal", "padding", "no_mask"])
@pytest.mark.parametrize("page_size", [None, 3])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
def test_dpa_uniform_steps_run_maskless_and_match_reference(fmt, page_size, mask, extra, monkeypatch):
    """Padded bshd / sbhd inputs keep the mask (their padded query rows come out zero)."""
    taken = []
    maskless = te.DotProductAttention._maskless

    def spy(self, *args):
        taken.append(maskless(self, *args))
        return taken[-1]

    monkeypatch.setattr(te.DotProductAttention, "_maskless", spy)
    run_dpa(fmt, page_size, schedule=UNIFORM, mask=mask, extra=extra, seed=11)
    causal = "causal" in mask
    if extra and fmt != "thd":
        assert not any(taken)
    else:
        assert taken == [True, True, True, not causal, True, True, False]


@pytest.mark.parametrize("h, g", [(4, 1), (4, 4)])
def test_dpa_uniform_steps_with_gqa_window_or_bias_match_reference(h, g):
    """Uniform steps with MQA / MHA heads, and with a window or ALiBi (which keep the mask)."""
    run_dpa("bshd", None, schedule=UNIFORM, h=h, g=g, seed=12)
    run_dpa("sbhd", 3, schedule=UNIFORM, window=(1, 0), seed=13)
    run_dpa("thd", None, schedule=UNIFORM, alibi=True, seed=14)


@pytest.mark.parametrize("h, g, dk, dv", [(4, 4, 8, 8), (4, 1, 8, 8), (4, 2, 8, 4), (2, 2, 4, 12)])
@pytest.mark.parametrize("fmt, page_size", [("bshd", None), ("sbhd", 3), ("thd", 4)])
def test_dpa_heads_and_head_dims(fmt, page_size, h, g, dk, dv):
    """MHA, MQA, GQA and MLA-like head_dim_v != head_dim_k."""
    run_dpa(fmt, page_size, h=h, g=g, dk=dk, dv=dv, seed=3)


@pytest.mark.parametrize(
    "q_dtype, cache_dtype",
    [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)],
    ids=["bf16", "bf16_q_fp32_cache", "fp32_q_bf16_cache"],
)
@pytest.mark.parametrize("fmt, page_size", [("bshd", 3), ("thd", None)])
def test_dpa_cache_dtype(fmt, page_size, q_dtype, cache_dtype):
    params, _ = run_dpa(fmt, page_size, q_dtype=q_dtype, cache_dtype=cache_dtype, seed=4)
    assert all(x.dtype == cache_dtype for x in params.cache_manager.cache[7])


def test_fp32_query_over_bf16_cache_sees_rounded_keys():
    """The reference above rounds k / v to the cache's dtype; here, a cache that kept fp32
    values would be caught: the unrounded reference is measurably different."""
    gen = torch.Generator().manual_seed(5)
    params = make_params(None, g=1, dk=8, dtype=torch.bfloat16)
    params.allocate_memory(7)
    params.pre_step(OrderedDict({0: 6}))
    q, k, v = (torch.randn(1, 6, 1, 8, generator=gen) * 3 for _ in range(3))
    m = te.DotProductAttention(1, 8, qkv_format="bshd", layer_number=7, device=CPU)
    out = m(q, k, v, inference_params=params)[0].double()
    exact = ref_new_tokens(
        q[0].double(), k[0].double(), v[0].double(), causal=True, window=(-1, 0), slopes=None, scale=8**-0.5
    )
    rounded = ref_new_tokens(
        q[0].double(),
        *(x[0].bfloat16().double() for x in (k, v)),
        causal=True,
        window=(-1, 0),
        slopes=None,
        scale=8**-0.5,
    )
    assert (exact - rounded).abs().max() > 1e-3
    torch.testing.assert_close(out, rounded, **F32_TOL)


@pytest.mark.parametrize("softmax_type", ["off-by-one", "learnable"])
def test_dpa_softmax_sink_with_a_cache(softmax_type):
    """The sink is one more logit in every new token's softmax over its whole history."""
    gen = torch.Generator().manual_seed(16)
    params = make_params(3, g=1, dk=8)
    params.allocate_memory(7)
    m = te.DotProductAttention(
        2, 8, num_gqa_groups=1, qkv_format="thd", softmax_type=softmax_type, layer_number=7, device=CPU
    )
    sink = torch.zeros(2)
    if softmax_type == "learnable":
        sink = torch.tensor([0.7, -1.2])
        with torch.no_grad():
            m.softmax_offset.copy_(sink.view(1, 2, 1, 1))
    hist = {}
    for step in SCHEDULE:
        params.pre_step(OrderedDict(step))
        counts = list(step.values())
        q = torch.randn(sum(counts), 2, 8, generator=gen)
        k, v = (torch.randn(sum(counts), 1, 8, generator=gen) for _ in range(2))
        with torch.no_grad():
            out = m(q, k, v, attn_mask_type="padding_causal", inference_params=params)
        at = 0
        for s, n in step.items():
            new = (k[at : at + n], v[at : at + n])
            hist[s] = tuple(torch.cat((hist[s][j], new[j])) for j in (0, 1)) if s in hist else new
            kk, vv = (x.double().permute(1, 0, 2)[None] for x in hist[s])
            L = kk.shape[2]
            keep = (torch.arange(L)[None, :] <= torch.arange(L - n, L)[:, None])[None, None]
            want = ref_attention(
                q[at : at + n].double().permute(1, 0, 2)[None], kk, vv, keep, 8**-0.5, sink=sink
            )
            torch.testing.assert_close(
                out[at : at + n].double(), want[0].permute(1, 0, 2).reshape(n, -1), **F32_TOL
            )
            at += n


def test_dpa_custom_cache_manager_contract():
    """A KVCacheManager written here (a dict of per-sequence tensors, reading the new tokens
    with the cu_new_seqlens te passes it) drives DotProductAttention like te's managers."""

    class ListCache(te.KVCacheManager):
        def __init__(self, max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v):
            super().__init__()
            self.shape = (max_seqlen, num_heads)
            self.dims, self.dtype = (head_dim_k, head_dim_v), dtype
            self.store = {}
            self.step_dict = None

        def allocate_memory(self, layer_number):
            self.cache[layer_number] = None

        def pre_step(self, step_dict):
            self.store = {s: self.store.get(s) for s in step_dict}  # finished sequences go
            self.sequences = OrderedDict(
                (s, (0 if self.store[s] is None else len(self.store[s][0])) + n) for s, n in step_dict.items()
            )
            self.step_dict = step_dict
            return self.sequences

        def step(self, layer_number, new_k, new_v, cu_new_seqlens, cu_cached_seqlens, qkv_format):
            b, cu = len(self.step_dict), cu_new_seqlens.tolist()
            counts = list(self.step_dict.values())
            assert cu[: b + 1] == [0, *torch.tensor(counts).cumsum(0).tolist()]
            assert cu_cached_seqlens.tolist()[b] == sum(self.sequences.values())
            fulls, store = [], {s: [] for s in self.step_dict}
            for which, (x, d) in enumerate(zip((new_k, new_v), self.dims, strict=True)):
                x = x.transpose(0, 1) if qkv_format == "sbhd" else x
                full = torch.zeros(b, *self.shape, d, dtype=self.dtype)
                for i, (s, n) in enumerate(self.step_dict.items()):
                    new = (x[cu[i] : cu[i + 1]] if qkv_format == "thd" else x[i, :n]).to(self.dtype)
                    seq = new if self.store[s] is None else torch.cat((self.store[s][which], new))
                    full[i, : seq.shape[0]] = seq
                    store[s].append(seq)
                fulls.append(full)
            self.store = store
            return fulls[0], fulls[1]

    for fmt in ("bshd", "sbhd", "thd"):
        params = te.InferenceParams(
            MAX_BATCH, MAX_SEQ, 2, 8, torch.float32, custom_cache_manager=ListCache, device=CPU
        )
        assert isinstance(params.cache_manager, ListCache)
        params.allocate_memory(7)
        run_dpa(fmt, None, params=params, seed=6)


# ----------------------------------------------------------------------------------------------
# 2. MultiheadAttention and TransformerLayer: generation equals the full causal forward
# ----------------------------------------------------------------------------------------------

HID, FFN, H, G = 32, 48, 4, 2
S, B = 7, 3
# {sequence: (step it joins at, new tokens per step)}: prompts of 3, 1 and 5 tokens (seq 2
# joins at step 2); seq 0 continues by 2 at once; all end at S tokens, at different steps.
PLAN = {0: (0, [3, 1, 1, 2]), 1: (0, [1] * 7), 2: (2, [5, 1, 1])}


def plan_steps(plan):
    """Step dicts from PLAN, the batch order rotated every step."""
    steps = []
    for t in range(max(j + len(c) for j, c in plan.values())):
        live = [(s, c[t - j]) for s, (j, c) in plan.items() if j <= t < j + len(c)]
        r = t % len(live)
        steps.append(OrderedDict(live[r:] + live[:r]))
    return steps


def build(kind, fmt, layer_number=3):
    common = {"num_gqa_groups": G, "attention_dropout": 0.0, "params_dtype": torch.float32, "device": CPU}
    if kind == "mha":
        mods = [
            te.MultiheadAttention(
                HID, H, layer_number=layer_number, qkv_format=fmt, input_layernorm=True, **common
            )
        ]
    else:
        mods = [
            te.TransformerLayer(
                HID, FFN, H, hidden_dropout=0.0, layer_number=n, attn_input_format=fmt, **common
            )
            for n in (layer_number, layer_number + 1)
        ]
    return torch.nn.ModuleList(mods).eval()


def to_fmt(x, fmt):
    """[b, s, hidden] -> the module's layout."""
    return x.transpose(0, 1).contiguous() if fmt == "sbhd" else x


@pytest.mark.parametrize("paged", [False, True], ids=["nonpaged", "paged"])
@pytest.mark.parametrize("rope", [False, True], ids=["no_rope", "rope"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd", "thd"])
@pytest.mark.parametrize("kind", ["mha", "layer_stack"])
def test_modules_generate_like_their_full_causal_forward(kind, fmt, rope, paged):
    gen = torch.Generator().manual_seed(8)
    net = build(kind, fmt)
    full_net = build(kind, "bshd")
    randomize(net, seed=9)
    full_net.load_state_dict(net.state_dict())
    x = torch.randn(B, S, HID, generator=gen)
    # freqs cover the sequences only: a bshd step's padded positions may lie past them
    freqs = te.RotaryPositionEmbedding(HID // H, device=CPU)(S) if rope else None
    with torch.no_grad():
        want = x
        for layer in full_net:
            want = layer(want, rotary_pos_emb=freqs)
    steps = plan_steps(PLAN)
    ps = 2
    params = te.InferenceParams(
        B,
        8,
        G,
        HID // H,
        torch.float32,
        is_paged=paged,
        total_num_pages=tight_pool(steps, ps) if paged else None,
        page_size=ps if paged else None,
        qkv_format=fmt,
        device=CPU,
    )
    done = dict.fromkeys(PLAN, 0)
    for t, step in enumerate(steps):
        params.pre_step(step)
        parts = [x[s, done[s] : done[s] + n] for s, n in step.items()]
        if fmt == "thd":
            h_in = torch.cat(parts)
        else:
            h_in = pack("bshd", [p[:, None] for p in parts], gen)[:, :, 0]
            h_in = to_fmt(h_in, fmt)
        with torch.no_grad():
            out = h_in
            for layer in net:
                out = layer(out, inference_params=params, rotary_pos_emb=freqs)
        counts = list(step.values())
        for (s, n), got in zip(step.items(), unpack(fmt, out, counts), strict=True):
            torch.testing.assert_close(
                got,
                want[s, done[s] : done[s] + n],
                atol=2e-5,
                rtol=1e-4,
                msg=lambda m, t=t, s=s: f"step {t}, sequence {s}: {m}",
            )
            done[s] += n
    assert done == dict.fromkeys(PLAN, S)
    assert sorted(params.cache_manager.cache) == ([3] if kind == "mha" else [3, 4])


# ----------------------------------------------------------------------------------------------
# 3. Bookkeeping
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", CACHES, ids=lambda p: "nonpaged" if p is None else f"page{p}")
def test_bookkeeping_follows_the_step_dicts(page_size):
    params = make_params(page_size)
    for step, (after, pre) in zip(SCHEDULE, lengths_after(SCHEDULE), strict=True):
        params.pre_step(OrderedDict(step))
        b = len(step)
        assert list(params.sequences.items()) == list(after.items())
        assert list(params.sequences_pre_step.items()) == list(pre.items())
        assert params.batch_size == b
        for name, counts in (("cu_seqlens_q", list(step.values())), ("cu_seqlens_kv", list(after.values()))):
            cu = getattr(params, name)
            want = [0]
            for n in counts:
                want.append(want[-1] + n)
            want += [want[-1]] * (MAX_BATCH - b)
            assert cu.dtype == torch.int32 and cu.tolist() == want, name
        assert params.pre_step_seqlens.dtype == torch.int32
        assert params.pre_step_seqlens[:b].tolist() == list(pre.values())
        assert params.get_seqlens_pre_step()[:b].tolist() == list(pre.values())
        if page_size is None:
            continue
        mgr = params.cache_manager
        pages = {s: mgr.get_page_list(s) for s in step}
        for i, s in enumerate(step):
            assert len(pages[s]) == -(-after[s] // page_size), s
            assert mgr.page_table[i, : len(pages[s])].tolist() == pages[s]
        used = [p for ps in pages.values() for p in ps]
        assert len(set(used)) == len(used), "a page held twice"
        assert sorted(used + list(mgr.free_pages)) == list(range(mgr.total_num_pages))


def test_paged_pages_are_freed_and_reused():
    params = te.InferenceParams(
        2, 8, 1, 4, torch.float32, is_paged=True, total_num_pages=4, page_size=2, device=CPU
    )
    mgr = params.cache_manager
    params.pre_step(OrderedDict({"a": 8}))
    a_pages = mgr.get_page_list("a")
    assert len(a_pages) == 4 and len(mgr.free_pages) == 0
    params.pre_step(OrderedDict({"b": 3}))  # a finished: b can only take a's pages
    assert set(mgr.get_page_list("b")) <= set(a_pages) and len(mgr.get_page_list("b")) == 2
    assert mgr.get_page_list("a") == []
    params.pre_step(OrderedDict({"c": 3, "b": 1}))
    assert len(mgr.get_page_list("b")) == 2 and len(mgr.get_page_list("c")) == 2
    assert sorted(mgr.get_page_list("b") + mgr.get_page_list("c")) == sorted(a_pages)


def test_full_paged_pool_raises_and_keeps_its_state():
    """A step that needs more pages than are free raises RuntimeError before changing anything;
    the next valid step (one that frees a finished sequence's pages) attends correctly."""
    gen = torch.Generator().manual_seed(11)
    params = te.InferenceParams(
        3, 8, 1, 4, torch.float32, is_paged=True, total_num_pages=4, page_size=2, device=CPU
    )
    params.allocate_memory(1)
    m = te.DotProductAttention(
        2, 4, num_gqa_groups=1, qkv_format="thd", attn_mask_type="padding_causal", layer_number=1, device=CPU
    )
    hist = {}

    def step(step_dict):
        params.pre_step(OrderedDict(step_dict))
        hist.update({s: hist.get(s, torch.zeros(2, 0, 1, 4)) for s in step_dict})
        for s in [s for s in hist if s not in step_dict]:
            del hist[s]
        q = torch.randn(sum(step_dict.values()), 2, 4, generator=gen)
        k, v = (torch.randn(q.shape[0], 1, 4, generator=gen) for _ in range(2))
        out = m(q, k, v, inference_params=params)
        at = 0
        for s, n in step_dict.items():
            hist[s] = torch.cat((hist[s], torch.stack((k[at : at + n], v[at : at + n]))), dim=1)
            want = ref_new_tokens(
                q[at : at + n].double(),
                *hist[s].double(),
                causal=True,
                window=(-1, 0),
                slopes=None,
                scale=0.5,
            )
            torch.testing.assert_close(out[at : at + n].double(), want, **F32_TOL)
            at += n

    step({"a": 3, "b": 2})  # 2 + 1 pages
    mgr = params.cache_manager
    snapshot = (
        list(params.sequences.items()),
        list(params.sequences_pre_step.items()),
        params.batch_size,
        params.cu_seqlens_q.clone(),
        params.cu_seqlens_kv.clone(),
        params.pre_step_seqlens.clone(),
        {s: mgr.get_page_list(s) for s in ("a", "b")},
        list(mgr.free_pages),
        mgr.page_table.clone(),
    )
    with pytest.raises(RuntimeError, match="total_num_pages=4"):
        params.pre_step(OrderedDict({"a": 1, "b": 1, "c": 3}))  # needs 0 + 1 + 2 > 1 free
    after = (
        list(params.sequences.items()),
        list(params.sequences_pre_step.items()),
        params.batch_size,
        params.cu_seqlens_q,
        params.cu_seqlens_kv,
        params.pre_step_seqlens,
        {s: mgr.get_page_list(s) for s in ("a", "b")},
        list(mgr.free_pages),
        mgr.page_table,
    )
    for was, now in zip(snapshot, after, strict=True):
        assert torch.equal(was, now) if isinstance(was, torch.Tensor) else was == now
    step({"a": 1, "b": 1})
    step({"b": 1, "c": 3})  # a's 2 pages come free: b + 1, c + 2 = 3 free


@pytest.mark.parametrize("page_size", [None, 3])
def test_reset_forgets_every_sequence(page_size):
    params, _ = run_dpa("bshd", page_size, schedule=SCHEDULE[:3], seed=12)
    params.reset()
    assert params.sequences == OrderedDict() and params.sequences_pre_step == OrderedDict()
    assert params.batch_size == 0
    if page_size is not None:
        assert sorted(params.cache_manager.free_pages) == list(range(params.total_num_pages))
    with pytest.raises(RuntimeError, match="pre_step"):
        params.step(7, torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8), "bshd")
    # known ids start over: only the new tokens are their history
    run_dpa("bshd", page_size, schedule=[{2: 3, 0: 1}, {2: 1, 0: 2}], params=params, seed=13)


def test_convert_paged_to_nonpaged_matches_the_history_and_the_nonpaged_cache():
    paged = make_params(3, dk=8, dv=4)
    flat = make_params(None, dk=8, dv=4)
    for p in (paged, flat):
        p.allocate_memory(7)
    gen = torch.Generator().manual_seed(14)
    hist = {}
    for step, (after, _) in zip(SCHEDULE, lengths_after(SCHEDULE), strict=True):
        counts = list(step.values())
        k = [torch.randn(n, 2, 8, generator=gen) for n in counts]
        v = [torch.randn(n, 2, 4, generator=gen) for n in counts]
        hist = {
            s: (torch.cat((hist[s][0], k[i])), torch.cat((hist[s][1], v[i]))) if s in hist else (k[i], v[i])
            for i, s in enumerate(step)
        }
        longest = max(after.values())
        for p in (paged, flat):
            p.pre_step(OrderedDict(step))
            kc, vc, cu_q, cu_kv, max_kv, fmt = p.step(7, pack("sbhd", k, gen), pack("sbhd", v, gen), "sbhd")
            assert fmt == "sbhd_2bshd" and max_kv == longest
            assert kc.shape == (len(step), longest, 2, 8) and vc.shape == (len(step), longest, 2, 4)
            assert torch.equal(cu_q, p.cu_seqlens_q) and torch.equal(cu_kv, p.cu_seqlens_kv)
            for i, s in enumerate(step):
                assert torch.equal(kc[i, : after[s]], hist[s][0]) and torch.equal(
                    vc[i, : after[s]], hist[s][1]
                )
        kp, vp = paged.convert_paged_to_nonpaged(7)
        assert kp.shape == (len(step), MAX_SEQ, 2, 8) and vp.shape == (len(step), MAX_SEQ, 2, 4)
        kf, vf = flat.cache_manager.cache[7]
        for i, s in enumerate(step):
            n = after[s]
            for got, other, want in ((kp, kf, hist[s][0]), (vp, vf, hist[s][1])):
                assert torch.equal(got[i, :n], want), s
                assert torch.equal(other[i, :n], want), s
    with pytest.raises(ValueError, match="is_paged"):
        flat.convert_paged_to_nonpaged(7)


def test_custom_cache_manager_gets_te_keyword_arguments():
    seen = {}

    class Recording(te.KVCacheManager):
        def __init__(self, **kwargs):
            super().__init__()
            seen.update(kwargs)

    te.InferenceParams(3, 16, 2, 8, torch.bfloat16, head_dim_v=4, custom_cache_manager=Recording, device=CPU)
    assert seen == {
        "max_batch_size": 3,
        "max_seqlen": 16,
        "num_heads": 2,
        "head_dim_k": 8,
        "dtype": torch.bfloat16,
        "head_dim_v": 4,
    }
    seen.clear()
    te.InferenceParams(
        3,
        16,
        2,
        8,
        torch.float32,
        is_paged=True,
        total_num_pages=12,
        page_size=4,
        custom_cache_manager=Recording,
        device=CPU,
    )
    assert seen == {
        "total_num_pages": 12,
        "page_size": 4,
        "num_heads": 2,
        "head_dim_k": 8,
        "dtype": torch.float32,
        "max_batch_size": 3,
        "max_seqlen": 16,
        "head_dim_v": 8,
    }
    with pytest.raises(TypeError, match="custom_cache_manager"):
        te.InferenceParams(3, 16, 2, 8, torch.float32, custom_cache_manager=object, device=CPU)


def test_allocated_cache_shapes():
    flat = te.InferenceParams(3, 12, 2, 8, torch.bfloat16, head_dim_v=4, device=CPU)
    paged = te.InferenceParams(
        3, 12, 2, 8, torch.float32, head_dim_v=4, is_paged=True, total_num_pages=5, page_size=4, device=CPU
    )
    for p in (flat, paged):
        p.allocate_memory(2)
    k, v = flat.cache_manager.cache[2]
    assert k.shape == (3, 12, 2, 8) and v.shape == (3, 12, 2, 4) and k.dtype == torch.bfloat16
    k, v = paged.cache_manager.cache[2]
    assert k.shape == (5, 4, 2, 8) and v.shape == (5, 4, 2, 4)
    assert (
        paged.cache_manager.page_table.shape == (3, 3) and paged.cache_manager.page_table.dtype == torch.int32
    )


# ----------------------------------------------------------------------------------------------
# 4. Errors name the argument
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_heads_kv": None}, "num_heads_kv"),
        ({"head_dim_k": None}, "head_dim_k"),
        ({"dtype": None}, "dtype"),
        ({"dtype": torch.int32}, "dtype"),
        ({"qkv_format": "bhsd"}, "qkv_format"),
        ({"is_paged": True, "total_num_pages": 8, "page_size": 5}, "page_size"),
        ({"is_paged": True, "total_num_pages": 8}, "page_size"),
        ({"is_paged": True, "page_size": 4}, "total_num_pages"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_ctx_len": 13}, "max_ctx_len"),
    ],
)
def test_constructor_errors(kwargs, match):
    args = {
        "max_batch_size": 2,
        "max_sequence_length": 12,
        "num_heads_kv": 2,
        "head_dim_k": 8,
        "dtype": torch.float32,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        te.InferenceParams(**args, device=CPU)


@pytest.mark.parametrize("page_size", [None, 4])
@pytest.mark.parametrize(
    "step_dict, match",
    [
        ({}, "step_dict"),
        ({0: 1, 1: 1, 2: 1}, "step_dict.*max_batch_size=2"),
        ({0: 0}, r"step_dict\[0\]"),
        ({0: 1, 1: -2}, r"step_dict\[1\]"),
        ({0: 1.0}, r"step_dict\[0\]"),
        ({0: True}, r"step_dict\[0\]"),
        ({5: 13}, r"step_dict\[5\].*max_sequence_length=12"),
        ({0: 9}, r"step_dict\[0\].*max_sequence_length=12"),  # 4 cached + 9
        ([(0, 1)], "step_dict"),
    ],
)
def test_pre_step_errors_leave_the_state_alone(page_size, step_dict, match):
    params = _ready(page_size)
    params.pre_step(OrderedDict({0: 4}))
    before = (list(params.sequences.items()), params.cu_seqlens_kv.tolist(), params.batch_size)
    with pytest.raises(ValueError, match=match):
        params.pre_step(step_dict)
    assert (list(params.sequences.items()), params.cu_seqlens_kv.tolist(), params.batch_size) == before
    params.pre_step(OrderedDict({0: 8}))
    assert params.sequences == OrderedDict({0: 12})


def _ready(page_size=None):
    params = te.InferenceParams(
        2,
        12,
        2,
        8,
        torch.float32,
        is_paged=page_size is not None,
        total_num_pages=6,
        page_size=page_size,
        device=CPU,
    )
    params.allocate_memory(1)
    return params


def test_step_errors():
    params = _ready()
    k = torch.zeros(2, 3, 2, 8)
    with pytest.raises(RuntimeError, match="pre_step"):
        params.step(1, k, k, "bshd")
    params.pre_step(OrderedDict({0: 3, 1: 2}))
    with pytest.raises(ValueError, match="layer_number=2"):
        params.step(2, k, k, "bshd")
    with pytest.raises(ValueError, match="qkv_format"):
        params.step(1, k, k, "bhsd")
    with pytest.raises(ValueError, match="new_k.*batch 2"):
        params.step(1, torch.zeros(3, 3, 2, 8), k, "bshd")
    with pytest.raises(ValueError, match="new_k.*sequence >= 3"):
        params.step(1, k[:, :2], k, "bshd")
    with pytest.raises(ValueError, match="new_k.*batch 2"):
        params.step(1, k.transpose(0, 1)[:, :1], k, "sbhd")
    with pytest.raises(ValueError, match="new_k.*num_heads_kv=2"):
        params.step(1, torch.zeros(2, 3, 4, 8), k, "bshd")
    with pytest.raises(ValueError, match="new_v.*num_heads_kv=2, 8"):
        params.step(1, k, torch.zeros(2, 3, 2, 4), "bshd")
    with pytest.raises(ValueError, match="new_v: expected new_k's leading dims"):
        params.step(1, k, torch.zeros(2, 4, 2, 8), "bshd")  # each valid alone, not together
    with pytest.raises(ValueError, match="new_k.*5 new tokens"):
        params.step(1, torch.zeros(4, 2, 8), torch.zeros(4, 2, 8), "thd")
    with pytest.raises(ValueError, match="new_k.*thd"):
        params.step(1, k, k, "thd")
    with pytest.raises(ValueError, match="new_k.*device"):
        params.step(1, k.to("meta"), k.to("meta"), "bshd")
    # none of these wrote anything: the valid step that follows sees zeros nowhere it reads
    params.step(1, k + 1, k + 2, "bshd")
    kc = params.cache_manager.cache[1][0]
    assert (kc[0, :3] == 1).all() and (kc[1, :2] == 1).all() and (kc[1, 2:] == 0).all()


def test_dpa_errors():
    params = _ready()
    params.pre_step(OrderedDict({0: 3, 1: 2}))
    q, k = torch.zeros(2, 3, 2, 8), torch.zeros(2, 3, 2, 8)
    no_layer = te.DotProductAttention(2, 8, qkv_format="bshd", device=CPU)
    with pytest.raises(ValueError, match="layer_number"):
        no_layer(q, k, k, inference_params=params)
    m = te.DotProductAttention(2, 8, qkv_format="bshd", layer_number=1, device=CPU)
    with pytest.raises(ValueError, match="attn_mask_type='arbitrary'"):
        m(
            q,
            k,
            k,
            attn_mask_type="arbitrary",
            attention_mask=torch.zeros(1, 1, 3, 3, dtype=torch.bool),
            inference_params=params,
        )
    with pytest.raises(ValueError, match="attention_mask"):
        m(
            q,
            k,
            k,
            attn_mask_type="padding",
            attention_mask=torch.zeros(2, 1, 1, 3, dtype=torch.bool),
            inference_params=params,
        )
    for bias_type in ("post_scale_bias", "pre_scale_bias"):
        with pytest.raises(ValueError, match=f"core_attention_bias_type='{bias_type}'"):
            m(
                q,
                k,
                k,
                core_attention_bias_type=bias_type,
                core_attention_bias=torch.zeros(1, 2, 3, 3),
                inference_params=params,
            )
    with pytest.raises(ValueError, match="new_k.*batch 2"):
        m(torch.zeros(3, 3, 2, 8), torch.zeros(3, 3, 2, 8), torch.zeros(3, 3, 2, 8), inference_params=params)
    wide = te.DotProductAttention(4, 8, qkv_format="bshd", layer_number=1, device=CPU)
    with pytest.raises(ValueError, match="new_k.*num_heads_kv=2"):
        wide(
            torch.zeros(2, 3, 4, 8), torch.zeros(2, 3, 4, 8), torch.zeros(2, 3, 4, 8), inference_params=params
        )
    meta = [x.to("meta") for x in (q, k, k)]
    with pytest.raises(ValueError, match="new_k.*device"):
        m(*meta, inference_params=params)


def test_mha_errors():
    params = _ready()
    params.pre_step(OrderedDict({0: 3}))
    x = torch.zeros(1, 3, 16)
    cross = te.MultiheadAttention(
        16, 2, attention_type="cross", layer_number=1, qkv_format="bshd", device=CPU
    )
    with pytest.raises(ValueError, match="inference_params"):
        cross(x, encoder_output=x, inference_params=params)
    no_layer = te.MultiheadAttention(16, 2, qkv_format="bshd", device=CPU)
    with pytest.raises(ValueError, match="layer_number"):
        no_layer(x, inference_params=params)
    short = te.RotaryPositionEmbedding(8, device=CPU)(2)
    m = te.MultiheadAttention(16, 2, layer_number=1, qkv_format="bshd", device=CPU)
    with pytest.raises(ValueError, match=r"rotary_pos_emb: a sequence in the KV cache reaches position 2"):
        m(x, inference_params=params, rotary_pos_emb=short)


# ----------------------------------------------------------------------------------------------
# 5. apply_rotary_pos_emb: packed sequences that continue from start positions
# ----------------------------------------------------------------------------------------------


def _rotate_ref(x, positions, d, interleaved, base=10000.0):
    """x [t, h, D] fp64: token i's channel pairs (halves, or neighbours) as complex numbers
    times exp(i * positions[i] * base^(-2j / d)); channels past d pass through."""
    inv = torch.tensor([base ** (-2.0 * j / d) for j in range(d // 2)], dtype=torch.float64)
    turn = torch.polar(
        torch.ones(len(positions), d // 2, dtype=torch.float64),
        torch.tensor(positions, dtype=torch.float64)[:, None] * inv,
    )[:, None]
    head = x[..., :d]
    re, im = (head[..., 0::2], head[..., 1::2]) if interleaved else (head[..., : d // 2], head[..., d // 2 :])
    z = torch.complex(re, im) * turn
    rot = torch.stack((z.real, z.imag), -1).flatten(-2) if interleaved else torch.cat((z.real, z.imag), -1)
    return torch.cat((rot, x[..., d:]), -1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("percent", [1.0, 0.5])
@pytest.mark.parametrize("start_dtype", [torch.int32, torch.int64])
def test_rope_thd_start_positions(interleaved, percent, start_dtype):
    D = 16
    d = int(D * percent)
    lens, start = [3, 1, 4, 2], [0, 7, 2, 11]
    cu = torch.tensor([0, 3, 4, 8, 10], dtype=torch.int32)
    t = torch.randn(10, 2, D, generator=torch.Generator().manual_seed(15))
    freqs = te.RotaryPositionEmbedding(D, rotary_percent=percent, interleaved=interleaved, device=CPU)(16)
    out = te.apply_rotary_pos_emb(
        t, freqs, "thd", torch.tensor(start, dtype=start_dtype), interleaved=interleaved, cu_seqlens=cu
    )
    positions = [s + j for s, n in zip(start, lens, strict=True) for j in range(n)]
    torch.testing.assert_close(
        out.double(), _rotate_ref(t.double(), positions, d, interleaved), atol=1e-5, rtol=1e-5
    )
    no_start = te.apply_rotary_pos_emb(t, freqs, "thd", interleaved=interleaved, cu_seqlens=cu)
    zero = te.apply_rotary_pos_emb(
        t, freqs, "thd", torch.zeros(4, dtype=start_dtype), interleaved=interleaved, cu_seqlens=cu
    )
    assert torch.equal(no_start, zero)


def test_rope_thd_start_positions_past_freqs_raise_like_bshd():
    t = torch.randn(3, 1, 8)
    f = te.RotaryPositionEmbedding(8, device=CPU)(8)
    with pytest.raises(ValueError, match="start_positions"):
        te.apply_rotary_pos_emb(t[None], f, "bshd", torch.tensor([6]))
    with pytest.raises(ValueError, match="start_positions"):
        te.apply_rotary_pos_emb(
            t, f, "thd", torch.tensor([6]), cu_seqlens=torch.tensor([0, 3], dtype=torch.int32)
        )


def test_rope_thd_start_positions_shape_error():
    t = torch.zeros(4, 1, 8)
    f = te.RotaryPositionEmbedding(8, device=CPU)(8)
    with pytest.raises(ValueError, match="start_positions"):
        te.apply_rotary_pos_emb(
            t,
            f,
            "thd",
            torch.zeros(3, dtype=torch.int32),
            cu_seqlens=torch.tensor([0, 1, 4], dtype=torch.int32),
        )
