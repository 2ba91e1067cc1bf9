"""te.LayerNorm / te.RMSNorm on CPU against plain fp32 torch (forward and backward), the norm
kernels' fused FP8 output against "fp32 norm, then the quantizer", zero_centered_gamma,
mixed dtypes, state_dict, torch.compile and the errors."""

import io

import pytest
import te_torch as te
import torch
from _module_ref import E4M3, E5M2, norm32, rel, te_norm32
from te_torch import _fused, recipe

MODULES = {"layernorm": te.LayerNorm, "rmsnorm": te.RMSNorm}


def inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 1.5 + 0.3).to(dtype)
    return x, torch.randn(shape, generator=g).to(dtype)


def fwd_bwd(m, x, dy):
    x = x.detach().clone().requires_grad_(True)
    y = m(x)
    y.backward(dy)
    return y.detach(), x.grad, m.weight.grad, None if m.bias is None else m.bias.grad


def ref_fwd_bwd(m, x, dy):
    """The same norm in fp32 torch ops on fp32 copies of everything, through autograd."""
    n = len(m.normalized_shape)
    x32 = x.detach().float().reshape(*x.shape[: x.dim() - n], -1).clone().requires_grad_(True)
    w = m.weight.detach().float().reshape(-1).requires_grad_(True)
    b = None if m.bias is None else m.bias.detach().float().reshape(-1).requires_grad_(True)
    y = norm32(x32, w, b, m.__class__ is te.RMSNorm, m.eps, m.zero_centered_gamma)
    y.backward(dy.float().reshape(y.shape))
    return (
        y.detach().reshape(x.shape),
        x32.grad.reshape(x.shape),
        w.grad.reshape(m.weight.shape),
        None if b is None else b.grad.reshape(m.weight.shape),
    )


@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize(
    ("shape", "normalized"), [((32, 64), 64), ((2, 16, 128), 128), ((4, 6, 8, 16), (8, 16))], ids=str
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", list(MODULES))
def test_matches_fp32_torch(kind, dtype, shape, normalized, zcg):
    torch.manual_seed(0)
    m = MODULES[kind](normalized, eps=1e-3, zero_centered_gamma=zcg, dtype=dtype, device="cpu")
    with torch.no_grad():  # non-trivial parameters
        m.weight.normal_(0.0 if zcg else 1.0, 0.3)
        if m.bias is not None:
            m.bias.normal_(0, 0.3)
    x, dy = inputs(shape, dtype, seed=1)
    got = fwd_bwd(m, x, dy)
    want = ref_fwd_bwd(m, x, dy)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for g, w, what in zip(got, want, ("y", "dx", "dweight", "dbias"), strict=True):
        if w is None:
            assert g is None, what
            continue
        assert g.dtype == dtype and g.shape == w.shape, what
        assert rel(g, w) <= tol, (what, rel(g, w))


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("kind", list(MODULES))
def test_inference_forward_matches_fp32_torch(kind, mode):
    """Without autograd the kernel runs alone (no autograd Function): same numbers."""
    torch.manual_seed(5)
    m = MODULES[kind](96, eps=1e-4, zero_centered_gamma=True, dtype=torch.bfloat16, device="cpu")
    with torch.no_grad():
        m.weight.normal_(0.0, 0.3)
    x, dy = inputs((7, 3, 96), torch.bfloat16, seed=6)
    with torch.no_grad() if mode == "no_grad" else torch.inference_mode():
        y = m(x.requires_grad_(True))
    assert not y.requires_grad and y.dtype == torch.bfloat16
    assert rel(y, ref_fwd_bwd(m, x, dy)[0]) <= 1e-2
    assert torch.equal(y, fwd_bwd(m, x, dy)[0])


@pytest.mark.parametrize("kind", list(MODULES))
def test_zero_centered_gamma_applies_one_plus_weight(kind):
    cls = MODULES[kind]
    zc = cls(48, zero_centered_gamma=True, device="cpu")
    plain = cls(48, device="cpu")
    assert torch.equal(zc.weight, torch.zeros(48)) and torch.equal(plain.weight, torch.ones(48))
    with torch.no_grad():
        zc.weight.normal_(0, 0.2)
        plain.weight.copy_(1.0 + zc.weight)
        if zc.bias is not None:
            zc.bias.normal_(0, 0.2)
            plain.bias.copy_(zc.bias)
    x, dy = inputs((24, 48), torch.float32, seed=2)
    a, b = fwd_bwd(zc, x, dy), fwd_bwd(plain, x, dy)
    assert torch.equal(a[0], b[0])  # fp32 1 + weight is exactly the plain weight here
    for g, w in zip(a[1:], b[1:], strict=True):  # d(1 + w)/dw = 1: same gradients
        assert w is None or torch.equal(g, w)
    assert rel(a[0], x) > 0.1  # it normalized


def test_mixed_dtypes_fp32_params_bf16_input():
    m = te.LayerNorm(64, device="cpu")
    with torch.no_grad():
        m.weight.normal_(1, 0.3)
        m.bias.normal_(0, 0.3)
    x, dy = inputs((16, 64), torch.bfloat16, seed=3)
    y, dx, dw, db = fwd_bwd(m, x, dy)
    assert y.dtype == dx.dtype == torch.bfloat16 and dw.dtype == db.dtype == torch.float32
    want = ref_fwd_bwd(m, x, dy)
    assert rel(y, want[0]) <= 1e-2 and rel(dx, want[1]) <= 1e-2
    assert rel(dw, want[2]) <= 1e-5 and rel(db, want[3]) <= 1e-5  # fp32 sums of bf16 terms


@pytest.mark.parametrize("kind", list(MODULES))
def test_output_is_not_quantized_inside_autocast(kind):
    m = MODULES[kind](64, device="cpu")
    x, _ = inputs((8, 64), torch.float32, seed=4)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        y = m(x)
    assert type(y) is torch.Tensor and torch.equal(y, m(x))


QUANTIZERS = {
    "delayed": lambda: te.Float8Quantizer(torch.tensor([3.0]), torch.tensor([0.5]), E4M3),
    "current": lambda: te.Float8CurrentScalingQuantizer(E5M2),
    "block1d": lambda: te.Float8BlockQuantizer(E4M3, block_scaling_dim=1),
    "block2d": lambda: te.Float8BlockQuantizer(E4M3, block_scaling_dim=2, force_pow_2_scales=False),
}


def parts(t):
    """A quantized tensor's inner tensors; block scales cut to their written (unpadded) columns
    (te/tensor.h pads their last dim to a multiple of 4 and leaves the padding unwritten)."""
    names, _ = t.__tensor_flatten__()
    out = {n: getattr(t, n) for n in names}
    if isinstance(t, te.Float8BlockwiseQTensor):
        k = t.shape[-1]
        m = t.numel() // k
        if t._is_2D_scaled:
            widths = {"_rowwise_scale_inv": -(-k // 128), "_columnwise_scale_inv": -(-m // 128)}
        else:
            widths = {"_rowwise_scale_inv": m, "_columnwise_scale_inv": k}
        for n, w in widths.items():
            if n in out:
                out[n] = out[n][:, :w]
    return out


@pytest.mark.parametrize("usage", [(True, True), (True, False), (False, True)], ids=["both", "row", "col"])
@pytest.mark.parametrize("qname", list(QUANTIZERS))
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_fused_quantized_output_is_fp32_norm_then_quantize(rms, qname, usage):
    """The norm kernel's FP8 output: the bits the quantizer gives for te's fp32 norm output
    (itself checked against plain fp32 torch), and the quantizer's amax updated alike."""
    x, _ = inputs((40, 160), torch.bfloat16, seed=5)
    g = torch.Generator().manual_seed(6)
    w, b = torch.randn(160, generator=g).bfloat16(), torch.randn(160, generator=g).bfloat16()
    beta = None if rms else b
    y32 = te_norm32(x, w, beta, rms, 1e-5, False)
    assert rel(y32, norm32(x, w, beta, rms, 1e-5, False)) <= 1e-6
    q_fused, q_ref = QUANTIZERS[qname](), QUANTIZERS[qname]()
    for q in (q_fused, q_ref):
        q.set_usage(rowwise=usage[0], columnwise=usage[1])
    got, mu, rsigma = _fused.norm_fwd(x, w, beta, rms, 1e-5, False, q_fused)
    want = q_ref(y32)
    assert type(got) is type(want) and got.shape == x.shape and got.dtype == x.dtype
    got_parts, want_parts = parts(got), parts(want)
    assert list(got_parts) == list(want_parts)  # the same copies are present
    for n, a in got_parts.items():
        e = want_parts[n]
        assert a.dtype == e.dtype and torch.equal(a.view(torch.uint8), e.view(torch.uint8)), n
    if hasattr(q_ref, "amax"):
        assert torch.equal(q_fused.amax, q_ref.amax) and torch.equal(q_fused.scale, q_ref.scale)
    x32 = x.float()
    assert (mu is None) == rms
    if not rms:
        assert torch.allclose(mu, x32.mean(-1), atol=1e-6)
    ms = x32.var(-1, unbiased=False) if not rms else x32.pow(2).mean(-1)
    assert torch.allclose(rsigma, torch.rsqrt(ms + 1e-5), rtol=1e-6)


def test_state_dict_names_and_round_trip():
    m = te.LayerNorm(32, device="cpu")
    with torch.no_grad():
        m.weight.normal_(1, 0.2)
        m.bias.normal_(0, 0.2)
    sd = m.state_dict()
    assert list(sd) == ["weight", "bias"]  # TE's names (and torch.nn.LayerNorm's)
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    fresh = te.LayerNorm(32, device="cpu")
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    x, _ = inputs((8, 32), torch.float32, seed=7)
    assert torch.equal(fresh(x), m(x))
    ref = torch.nn.LayerNorm(32)
    ref.load_state_dict(sd)
    assert rel(m(x), ref(x)) <= 1e-6
    r = te.RMSNorm(32, device="cpu")
    assert list(r.state_dict()) == ["weight"] and r.bias is None


def test_te_arguments():
    m = te.LayerNorm(hidden_size=16, params_dtype=torch.bfloat16, sequence_parallel=True, device="cpu")
    assert m.normalized_shape == (16,) and m.weight.dtype == torch.bfloat16
    assert m.weight.sequence_parallel and m.bias.sequence_parallel
    assert te.RMSNorm(16, sm_margin={"forward": 8}, device="cpu").sm_margin == {"forward": 8}
    assert te.RMSNorm((2, 8), device="cpu").weight.shape == (2, 8)


@pytest.mark.parametrize("kind", list(MODULES))
def test_compile_fullgraph_matches_eager(kind):
    torch._dynamo.reset()
    m = MODULES[kind](96, device="cpu")
    with torch.no_grad():
        m.weight.normal_(1, 0.3)
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    x, dy = inputs((2, 8, 96), torch.bfloat16, seed=8)
    xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ye, yc = m(xe), cm(xc)
    ye.backward(dy)
    ge = m.weight.grad.clone()
    m.weight.grad = None
    yc.backward(dy)
    assert torch.equal(yc, ye) and torch.equal(xc.grad, xe.grad) and torch.equal(m.weight.grad, ge)


def test_bad_arguments_say_what_is_expected():
    for bad in (0, (), (4, 0), -3):
        with pytest.raises(ValueError, match=r"LayerNorm: normalized_shape: expected one or more sizes >= 1"):
            te.LayerNorm(bad, device="cpu")
    for bad in ("64", 2.5, (4, "a"), None):
        with pytest.raises(
            TypeError,
            match=r"RMSNorm: (normalized_shape: expected an int or a tuple of ints|missing normalized_shape)",
        ):
            te.RMSNorm(bad, device="cpu")
    with pytest.raises(ValueError, match=r"eps: expected a finite float >= 0, got -1"):
        te.LayerNorm(8, eps=-1, device="cpu")
    with pytest.raises(TypeError, match=r"dtype: expected float32, bfloat16 or float16, got torch.float64"):
        te.LayerNorm(8, dtype=torch.float64, device="cpu")
    m = te.LayerNorm((4, 8), device="cpu")
    with pytest.raises(
        ValueError, match=r"trailing dims to be normalized_shape=\[4, 8\], got shape \(3, 8, 4\)"
    ):
        m(torch.randn(3, 8, 4))
    with pytest.raises(TypeError, match=r"inp: expected float32, bfloat16 or float16, got torch.float64"):
        m(torch.randn(3, 4, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"inp: expected a torch.Tensor, got list"):
        te.RMSNorm(2, device="cpu")([1.0, 2.0])
