"""te.DotProductAttention on CUDA (torch's FlashAttention / cuDNN / memory-efficient kernels, as
torch picks them) against the same module on the CPU in fp32 (the reference, itself checked
against an independent fp64 oracle in tests/torch/test_attention.py).

Each case rounds its inputs to bf16 or fp16 once, runs them on the GPU in that dtype and, upcast,
on the CPU in fp32; outputs and gradients must agree normwise within 1e-2 (bf16) / 4e-3 (fp16).
Measured on an H100 (torch 2.11): at most 3.5e-3 (bf16) and 4e-4 (fp16) over outputs and
gradients; top-left instead of bottom-right alignment at s_q = 128, s_kv = 129 gives 0.45. Padding
rows must stay exactly zero on the GPU too. Shapes are those of real heads (d = 64 / 128, 8 heads, 2 groups) with an odd
sequence length (129) to leave the kernels' tiles partly filled.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")
CUDA = torch.device("cuda")
DTYPES = [torch.bfloat16, torch.float16]
IDS = ["bf16", "fp16"]
TOL = {torch.bfloat16: 1e-2, torch.float16: 4e-3}


def relerr(got, ref) -> float:
    got, ref = got.double().cpu(), ref.double().cpu()
    return ((got - ref).norm() / ref.norm().clamp(min=1e-30)).item()


def _to(x, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(y, dev) for y in x)
    return x


def _run(m, dev, dtype, q, k, v, dy, bias=None, **fwd):
    leaves = [x.detach().to(dev, dtype, copy=True).requires_grad_() for x in (q, k, v)]
    extra = []
    if bias is not None:
        b = bias.detach().to(dev, dtype, copy=True).requires_grad_()
        fwd["core_attention_bias"] = b
        extra.append(b)
    if getattr(m, "softmax_type", "vanilla") == "learnable":
        extra.append(m.softmax_offset)
    out = m(*leaves, **_to(fwd, dev))
    max_logit = None
    if isinstance(out, tuple):
        out, max_logit = out
    assert out.dtype == dtype and out.device.type == dev.type
    if dy is None:
        return out.detach().float().cpu(), [], max_logit
    out.backward(dy.to(dev, dtype))
    grads = [x.grad.float().cpu() for x in leaves + extra]
    return out.detach().float().cpu(), grads, max_logit


def compare(make, dtype, q, k, v, bias=None, **fwd):
    """make(device) -> module. Rounds q, k, v (and bias) to dtype, runs CUDA in dtype and CPU in
    fp32 on the same values, checks output and gradients. Returns (gpu out, cpu out)."""
    gen = torch.Generator().manual_seed(99)
    q, k, v = (x.to(dtype).float() for x in (q, k, v))
    if bias is not None:
        bias = bias.to(dtype).float()
    cpu, gpu = make("cpu"), make("cuda")
    if hasattr(cpu, "softmax_offset"):
        with torch.no_grad():
            cpu.softmax_offset.copy_(
                torch.linspace(-1.0, 2.0, cpu.softmax_offset.numel()).view_as(cpu.softmax_offset)
            )
            gpu.softmax_offset.copy_(cpu.softmax_offset)
    shape = _run(cpu, torch.device("cpu"), torch.float32, q, k, v, None, bias, **fwd)[0].shape
    dy = torch.randn(shape, generator=gen).to(dtype).float()
    ref_out, ref_grads, ref_ml = _run(cpu, torch.device("cpu"), torch.float32, q, k, v, dy, bias, **fwd)
    out, grads, ml = _run(gpu, CUDA, dtype, q, k, v, dy, bias, **fwd)
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    assert ref_out.abs().max() > 0
    err = relerr(out, ref_out)
    assert err < TOL[dtype], f"output: relative error {err:.3g}"
    for i, (g, r) in enumerate(zip(grads, ref_grads, strict=True)):
        e = relerr(g, r)
        assert e < TOL[dtype], (
            f"gradient {i} ({'qkv'[i] if i < 3 else 'bias/offset'}): relative error {e:.3g}"
        )
    # Rows the reference gives as exact zeros (queries that see no key) are exact zeros here too.
    zero = (ref_out == 0).all(-1)
    assert torch.equal(out[zero], torch.zeros_like(out[zero]))
    if ref_ml is not None:
        torch.testing.assert_close(ml.float().cpu(), ref_ml.float(), atol=5e-2, rtol=2e-2)
    return out, ref_out


def qkv(fmt, b, sq, skv, h, g, d, dv=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv

    def one(s, n, c):
        return torch.randn((s, b, n, c) if fmt == "sbhd" else (b, s, n, c), generator=gen)

    return one(sq, h, d), one(skv, g, d), one(skv, g, dv)


def mk(h, d, **kw):
    return lambda dev: te.DotProductAttention(h, d, device=dev, **kw)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("s", [128, 129])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_causal_flash_path(dtype, s, d):
    """Plain top-left causal self attention: torch's FlashAttention (is_causal, no mask)."""
    q, k, v = qkv("sbhd", 2, s, s, 8, 8, d, seed=s + d)
    compare(mk(8, d), dtype, q, k, v)


@pytest.mark.parametrize("mask_type", ["causal", "causal_bottom_right", "no_mask"])
@pytest.mark.parametrize("g", [8, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_gqa_and_cross_lengths(dtype, g, mask_type):
    q, k, v = qkv("bshd", 2, 128, 129, 8, g, 64, seed=g)
    compare(
        mk(8, 64, num_gqa_groups=g, qkv_format="bshd", attn_mask_type=mask_type, attention_type="cross"),
        dtype,
        q,
        k,
        v,
    )


@pytest.mark.parametrize("mask_type", ["padding", "padding_causal", "padding_causal_bottom_right"])
@pytest.mark.parametrize("by", ["cu_seqlens", "mask"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_padding(dtype, by, mask_type):
    b, s, h, g, d = 2, 129, 8, 2, 64
    q, k, v = qkv("sbhd", b, s, s, h, g, d, seed=3)
    lens = [129, 77]
    if by == "cu_seqlens":
        cu = torch.tensor([0, 129, 206], dtype=torch.int32)
        fwd = {"cu_seqlens_q": cu, "cu_seqlens_kv": cu}
    else:
        fwd = {"attention_mask": torch.arange(s)[None, :].ge(torch.tensor(lens)[:, None]).view(b, 1, 1, s)}
    out, _ = compare(mk(h, d, num_gqa_groups=g, attn_mask_type=mask_type), dtype, q, k, v, **fwd)
    assert (out[77:, 1] == 0).all()  # the second sequence's padding queries


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("mask_type", ["padding", "padding_causal", "padding_causal_bottom_right"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_thd(dtype, d, mask_type, padded):
    h, g = 8, 2
    lens = [129, 0, 64, 31]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    fwd = {"cu_seqlens_q": cu, "cu_seqlens_kv": cu, "max_seqlen_q": 129, "max_seqlen_kv": 129}
    t = int(cu[-1])
    if padded:  # 3 padding tokens after each sequence
        pad = torch.tensor(
            [0, *[sum(n + 3 for n in lens[: i + 1]) for i in range(len(lens))]], dtype=torch.int32
        )
        fwd.update(cu_seqlens_q_padded=pad, cu_seqlens_kv_padded=pad)
        t = int(pad[-1])
    gen = torch.Generator().manual_seed(d)
    q, k, v = (
        torch.randn(t, h, d, generator=gen),
        torch.randn(t, g, d, generator=gen),
        torch.randn(t, g, d, generator=gen),
    )
    out, _ = compare(
        mk(h, d, num_gqa_groups=g, qkv_format="thd", attn_mask_type=mask_type), dtype, q, k, v, **fwd
    )
    if padded:
        assert (out[129:132] == 0).all()


@pytest.mark.parametrize(
    "mask_type, window",
    [("causal", (64, 0)), ("causal_bottom_right", (32, 0)), ("no_mask", (32, 32)), ("padding", (16, -1))],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_window(dtype, mask_type, window):
    b, sq, skv, h, g, d = 2, 128, 129, 8, 2, 64
    q, k, v = qkv("bshd", b, sq, skv, h, g, d, seed=7)
    fwd = {}
    if mask_type == "padding":
        fwd["attention_mask"] = (
            torch.zeros(b, 1, 1, sq, dtype=torch.bool),
            torch.arange(skv).ge(torch.tensor([129, 90])[:, None]).view(b, 1, 1, skv),
        )
    make = mk(
        h,
        d,
        num_gqa_groups=g,
        qkv_format="bshd",
        attn_mask_type=mask_type,
        window_size=window,
        attention_type="cross",
    )
    compare(make, dtype, q, k, v, **fwd)


@pytest.mark.parametrize(
    "bias_type, shape",
    [("post_scale_bias", (1, 8)), ("pre_scale_bias", (2, 1)), ("post_scale_bias", (2, 8)), ("alibi", None)],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_bias(dtype, bias_type, shape):
    b, s, h, g, d = 2, 129, 8, 2, 64
    q, k, v = qkv("sbhd", b, s, s, h, g, d, seed=11)
    bias = None if shape is None else torch.randn(*shape, s, s, generator=torch.Generator().manual_seed(1))
    compare(mk(h, d, num_gqa_groups=g), dtype, q, k, v, bias=bias, core_attention_bias_type=bias_type)


@pytest.mark.parametrize("softmax_type", ["off-by-one", "learnable"])
@pytest.mark.parametrize("mask_type", ["causal", "padding_causal_bottom_right"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_softmax_sink(dtype, softmax_type, mask_type):
    b, s, h, g, d = 2, 129, 8, 2, 64
    q, k, v = qkv("bshd", b, s, s, h, g, d, seed=13)
    fwd = {}
    if "padding" in mask_type:
        cu = torch.tensor([0, 100, 229], dtype=torch.int32)
        fwd = {"cu_seqlens_q": cu, "cu_seqlens_kv": cu}
    make = mk(h, d, num_gqa_groups=g, qkv_format="bshd", attn_mask_type=mask_type, softmax_type=softmax_type)
    compare(make, dtype, q, k, v, **fwd)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_arbitrary_mask_mla_and_max_logit(dtype):
    b, s, h, g = 2, 129, 8, 2
    q, k, v = qkv("sbhd", b, s, s, h, g, 128, dv=64, seed=17)
    mask = torch.rand(b, 1, s, s, generator=torch.Generator().manual_seed(2)) < 0.3
    make = mk(h, (128, 64), num_gqa_groups=g, attn_mask_type="arbitrary", return_max_logit=True)
    out, _ = compare(make, dtype, q, k, v, attention_mask=mask)
    assert out.shape == (s, b, h * 64)


@pytest.mark.parametrize("ckpt", [False, True])
def test_dropout_on_the_gpu_tracker(ckpt):
    """Dropout draws from the CUDA tracker's state: the same seed repeats the output (and, with
    checkpoint_core_attention, the recomputation's gradients), the global CUDA generator is
    untouched."""
    q, k, v = (x.to(CUDA, torch.bfloat16) for x in qkv("sbhd", 2, 128, 128, 8, 2, 64, seed=19))
    runs = []
    for _ in range(2):
        tracker = te.CudaRNGStatesTracker(device="cuda")
        tracker.add("model-parallel-rng", 1234)
        m = te.DotProductAttention(
            8, 64, num_gqa_groups=2, attention_dropout=0.2, get_rng_state_tracker=lambda t=tracker: t
        )
        before = torch.cuda.get_rng_state()
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = m(*leaves, checkpoint_core_attention=ckpt)
        out.float().sum().backward()
        assert torch.equal(torch.cuda.get_rng_state(), before)
        runs.append((out.detach(), [x.grad for x in leaves]))
    (o1, g1), (o2, g2) = runs
    assert torch.equal(o1, o2) and all(torch.equal(a, c) for a, c in zip(g1, g2, strict=True))
    plain = te.DotProductAttention(8, 64, num_gqa_groups=2)
    assert relerr(o1, plain(q, k, v)) > 0.05  # dropout did something
