"""te.LayerNormLinear on CPU: high precision against torch's nn.LayerNorm / nn.RMSNorm + nn.Linear
(tight), each recipe against the emulated reference (tight) and fp32 torch (loose), the returned
norm output, main_grad, the weight cache, state_dict round trips, torch.compile, errors."""

import copy
import io

import pytest
import te_torch as te
import torch
import torch.nn.functional as F
from _module_ref import RECIPES, deq, gemm_scales, norm32, ref_quantizers, rel, te_norm32
from te_torch import recipe

NORMS = ["LayerNorm", "RMSNorm"]


def make(k, n, norm="LayerNorm", dtype=torch.float32, **kw):
    torch.manual_seed(0)
    m = te.LayerNormLinear(k, n, normalization=norm, params_dtype=dtype, device="cpu", **kw)
    with torch.no_grad():  # non-trivial norm parameters and bias
        m.layer_norm_weight.normal_(0.0 if m.zero_centered_gamma else 1.0, 0.3)
        if m.layer_norm_bias is not None:
            m.layer_norm_bias.normal_(0, 0.3)
        if m.bias is not None:
            m.bias.normal_(0, 0.5)
    return m


def data(shape, n, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype)
    return x, torch.randn(*shape[:-1], n, generator=g).to(dtype)


def params(m):
    return [m.layer_norm_weight, m.layer_norm_bias, m.weight, m.bias]


def run(m, x, dy, r=None, dln=None, **kw):
    """(y, dx, d layer_norm_weight, d layer_norm_bias, dweight, dbias), one step."""
    x = x.detach().clone().requires_grad_(True)
    with te.autocast(enabled=r is not None, recipe=r):
        out = m(x, **kw)
    if dln is None:
        out.backward(dy)
        y = out
    else:
        y, ln = out
        torch.autograd.backward([y, ln], [dy, dln])
    grads = [None if p is None else p.grad for p in params(m)]
    for p in params(m):
        if p is not None:
            p.grad = None
    return (y.detach(), x.grad, *grads)


def fp32_reference(m, x, dy, dln=None):
    """The module's math in fp32 torch, through autograd."""
    rms = m.normalization == "RMSNorm"
    leaves = [None if p is None else p.detach().float().requires_grad_(True) for p in params(m)]
    lw, lb, w, b = leaves
    x32 = x.detach().float().clone().requires_grad_(True)
    ln = norm32(x32, lw, lb, rms, m.eps, m.zero_centered_gamma)
    y = F.linear(ln, w, b)
    torch.autograd.backward(
        [y, ln] if dln is not None else [y], [dy.float()] + ([dln.float()] if dln is not None else [])
    )
    return (y.detach(), x32.grad, *[None if p is None else p.grad for p in leaves])


def emulate(m, r, x, dy, fwd_scale=None, bwd_scale=None, dln_extra=None):
    """The quantized step from dequantized operands in fp32 (NUMERICS.md): the GEMM input is
    te's fp32 norm output quantized; the norm backward is fp32 torch autograd."""
    rms = m.normalization == "RMSNorm"
    lw = m.layer_norm_weight.detach()
    lb = None if m.layer_norm_bias is None else m.layer_norm_bias.detach()
    qx, qw, qg = ref_quantizers(r, fwd_scale, bwd_scale)
    w = m.weight.detach()
    k, n = w.shape[1], w.shape[0]
    ln32 = te_norm32(x, lw, lb, rms, m.eps, m.zero_centered_gamma)
    y = deq(qx, ln32, True) @ deq(qw, w, True).T + m.bias.detach().float()
    dln = deq(qg, dy, True) @ deq(qw, w, False)
    if dln_extra is not None:
        dln = dln + dln_extra.float()
    dw = deq(qg, dy, False).reshape(-1, n).T @ deq(qx, ln32, False).reshape(-1, k)
    db = dy.float().reshape(-1, n).sum(0)
    x32 = x.detach().float().clone().requires_grad_(True)
    lw32 = lw.float().requires_grad_(True)
    lb32 = None if lb is None else lb.float().requires_grad_(True)
    norm32(x32, lw32, lb32, rms, m.eps, m.zero_centered_gamma).backward(dln)
    return y, x32.grad, lw32.grad, None if lb32 is None else lb32.grad, dw, db


NAMES = ("y", "dx", "dln_weight", "dln_bias", "dweight", "dbias")


def check(got, want, tol, dtype):
    for g, w, what in zip(got, want, NAMES, strict=True):
        assert (g is None) == (w is None), what
        if w is not None:
            assert g.dtype == dtype and g.shape == w.shape, what
            assert rel(g, w) <= tol, (what, rel(g, w))


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
def test_high_precision_matches_torch_modules(norm, zcg):
    m = make(128, 96, norm, zero_centered_gamma=zcg)
    torch_norm = (torch.nn.LayerNorm if norm == "LayerNorm" else torch.nn.RMSNorm)(128, eps=m.eps)
    lin = torch.nn.Linear(128, 96)
    with torch.no_grad():
        torch_norm.weight.copy_(m.layer_norm_weight + (1.0 if zcg else 0.0))
        if norm == "LayerNorm":
            torch_norm.bias.copy_(m.layer_norm_bias)
        lin.weight.copy_(m.weight)
        lin.bias.copy_(m.bias)
    x, dy = data((2, 16, 128), 96, torch.float32)
    got = run(m, x, dy)
    xt = x.clone().requires_grad_(True)
    yt = lin(torch_norm(xt))
    yt.backward(dy)
    want = (
        yt.detach(),
        xt.grad,
        torch_norm.weight.grad,
        torch_norm.bias.grad if norm == "LayerNorm" else None,
        lin.weight.grad,
        lin.bias.grad,
    )
    check(got, want, 1e-5, torch.float32)


# 3 x 7 tokens: padded to a multiple of 16 inside (_token_pad), which must change nothing
@pytest.mark.parametrize("lead", [(2, 16), (3, 7)], ids=["32_tokens", "21_tokens"])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_recipes_match_emulated_and_fp32_reference(name, dtype, norm, lead):
    r = RECIPES[name]()
    m = make(128, 96, norm, dtype)
    x, dy = data((*lead, 128), 96, dtype)
    fwd_scale = bwd_scale = None
    if r.delayed():  # a first step sets the scales the checked (second) step uses
        run(m, x * 0.7, dy * 0.7, r)
        fwd_scale, bwd_scale = gemm_scales(m._gemm)
        assert (fwd_scale[:2] != 1).all() and (bwd_scale[:1] != 1).all()
    got = run(m, x, dy, r)
    check(got, emulate(m, r, x, dy, fwd_scale, bwd_scale), 1e-5 if dtype == torch.float32 else 1e-2, dtype)
    want = fp32_reference(m, x, dy)
    grad_tol = 0.2 if r.fp8_format == recipe.Format.HYBRID else 0.1
    assert rel(got[0], want[0]) <= 0.1
    for g, w, what in zip(got[1:], want[1:], NAMES[1:], strict=True):
        if w is not None:
            assert rel(g, w) <= grad_tol, (what, rel(g, w))
    assert rel(got[0], want[0]) > 1e-4  # it really was quantized


@pytest.mark.parametrize("name", list(RECIPES))
def test_return_layernorm_output_and_bias(name):
    r = RECIPES[name]()
    m = make(64, 32, return_layernorm_output=True)
    x, dy = data((32, 64), 32, torch.float32, seed=2)
    dln = torch.randn(32, 64, generator=torch.Generator().manual_seed(3))
    ln_hp = te_norm32(x, m.layer_norm_weight.detach(), m.layer_norm_bias.detach(), False, m.eps, False)
    with te.autocast(recipe=r):
        y, ln = m(x)
    assert type(ln) is torch.Tensor and torch.equal(ln, ln_hp)
    fs, bs = gemm_scales(m._gemm)  # the scales the checked step uses (delayed scaling)
    got = run(m, x, dy, r, dln=dln)  # the norm output's own gradient reaches x and the norm
    check(got, emulate(m, r, x, dy, fs, bs, dln_extra=dln), 1e-5, torch.float32)
    mb = make(64, 32, return_bias=True, return_layernorm_output=True)
    out, b, ln = mb(x)
    assert b is mb.bias and torch.equal(ln, ln_hp)
    assert rel(out, F.linear(ln, mb.weight)) <= 1e-6
    with te.autocast(recipe=r):
        out8, b8 = make(64, 32, return_bias=True)(x)
    assert b8.shape == (32,) and rel(out8, F.linear(ln_hp, mb.weight)) < 0.1


@pytest.mark.parametrize("fp8", [False, True], ids=["high_precision", "current"])
def test_fuse_wgrad_accumulation_into_main_grad(fp8):
    r = recipe.Float8CurrentScaling() if fp8 else None
    m = make(64, 48, fuse_wgrad_accumulation=True)
    ref = make(64, 48)
    m.weight.main_grad = torch.full((48, 64), 0.5)
    x, dy = data((32, 64), 48, torch.float32, seed=4)
    got = run(m, x, dy, r)
    want = run(ref, x, dy, r)
    assert got[4] is None and m.weight.grad is None  # the weight gradient went into main_grad
    assert rel(m.weight.main_grad, 0.5 + want[4]) <= 1e-6
    for g, w in zip(got[:4] + got[5:], want[:4] + want[5:], strict=True):
        assert torch.equal(g, w)
    m.weight.overwrite_main_grad = True
    run(m, x, dy, r)
    assert rel(m.weight.main_grad, want[4]) <= 1e-6


def test_is_first_microbatch_reuses_cached_weight():
    r = recipe.Float8CurrentScaling()
    m = make(64, 48)
    x, _ = data((32, 64), 48, torch.float32, seed=5)
    with te.autocast(recipe=r):
        y1 = m(x, is_first_microbatch=True)
    with torch.no_grad():
        m.weight.mul_(2.0)  # the cached FP8 copy must be used, not this
    with te.autocast(recipe=r):
        y2 = m(x, is_first_microbatch=False)
        y3 = m(x)
    assert torch.equal(y1, y2) and rel(y3 - m.bias, 2 * (y1 - m.bias)) < 1e-6


def test_delayed_state_round_trips_through_weights_only_load():
    r = recipe.DelayedScaling(amax_history_len=4)
    m = make(64, 32)
    x, dy = data((32, 64), 32, torch.float32, seed=6)
    for s in range(2):
        run(m, x * (s + 1), dy, r)
    sd = m.state_dict()
    assert list(sd) == ["layer_norm_weight", "layer_norm_bias", "weight", "bias", "_extra_state"]
    assert set(sd["_extra_state"]) == {"fwd_amax_history", "fwd_scale", "bwd_amax_history", "bwd_scale"}
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    fresh = te.LayerNormLinear(64, 32, device="cpu")
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(fresh._fwd_state.amax_history, m._fwd_state.amax_history)
    a, b = run(copy.deepcopy(m), x, dy, r), run(fresh, x, dy, r)
    for g, w in zip(a, b, strict=True):
        assert torch.equal(g, w)  # the restored state reproduces the next step bit for bit
    torch_sd = {
        "0.weight": sd["layer_norm_weight"],
        "0.bias": sd["layer_norm_bias"],
        "1.weight": sd["weight"],
        "1.bias": sd["bias"],
    }
    seq = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 32))
    seq.load_state_dict(torch_sd)  # same parameter meanings as torch's modules
    assert rel(seq(x), m(x)) <= 1e-6


@pytest.mark.parametrize(
    ("name", "backend"), [("current", "aot_eager"), ("current", "inductor"), ("block", "aot_eager")]
)
def test_compile_fullgraph_matches_eager(name, backend):
    torch._dynamo.reset()
    r = RECIPES[name]()
    m = make(128, 96, "RMSNorm" if backend == "inductor" else "LayerNorm")

    def step(x):
        with te.autocast(recipe=r):
            return m(x)

    cstep = torch.compile(step, fullgraph=True, backend=backend)
    for seed in range(2):
        x, dy = data((2, 16, 128), 96, torch.float32, seed=10 + seed)
        xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        step(xe).backward(dy)
        ge = [None if p is None else p.grad.clone() for p in params(m)]
        m.zero_grad(set_to_none=True)
        yc = cstep(xc)
        yc.backward(dy)
        assert torch.equal(yc, step(x)) and torch.equal(xc.grad, xe.grad)
        for p, g in zip(params(m), ge, strict=True):
            assert p is None or torch.equal(p.grad, g)
        m.zero_grad(set_to_none=True)


def test_bad_arguments_say_what_is_expected():
    with pytest.raises(
        ValueError, match=r"normalization: expected 'LayerNorm' or 'RMSNorm', got 'BatchNorm'"
    ):
        te.LayerNormLinear(8, 8, normalization="BatchNorm", device="cpu")
    with pytest.raises(ValueError, match=r"LayerNormLinear: in_features: expected an int >= 1, got 0"):
        te.LayerNormLinear(0, 8, device="cpu")
    with pytest.raises(NotImplementedError, match="parallel_mode='row' is not implemented"):
        te.LayerNormLinear(8, 8, parallel_mode="row", tp_size=2, device="cpu")
    with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
        te.LayerNormLinear(8, 8, foo=1, device="cpu")
    m = te.LayerNormLinear(64, 32, device="cpu")
    with pytest.raises(ValueError, match=r"in_features=64, got shape \(4, 63\)"):
        m(torch.randn(4, 63))
    with pytest.raises(ValueError, match=r"LayerNormLinear: inp: .*in_features=64, got shape \(\)"):
        m(torch.tensor(1.0))
    with pytest.raises(TypeError, match="LayerNormLinear: inp: expected a torch.Tensor, got NoneType"):
        m(None)
    with pytest.raises(TypeError, match="LayerNormLinear: init_method: expected a callable"):
        te.LayerNormLinear(8, 8, init_method="xavier", device="cpu")
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        with pytest.raises(TypeError, match=r"got torch.float64; cast it"):
            m(torch.randn(4, 64, dtype=torch.float64))
        with pytest.raises(ValueError, match=r"te.LayerNormLinear: .* out_features is 8; build the layer"):
            te.LayerNormLinear(64, 8, device="cpu")(torch.randn(16, 64))
    with (
        te.autocast(recipe=recipe.MXFP8BlockScaling()),
        pytest.raises(
            ValueError,
            match=r"LayerNormLinear: MXFP8BlockScaling quantizes every GEMM operand in blocks of 32 "
            r"along both of its dimensions, so the input's rows .* must be a multiple of 32, got 4",
        ),
    ):
        m(torch.randn(4, 64))


def test_parameters_split_names_and_numbers():
    m = make(64, 48, parameters_split=("query_", "key_", "value_"))
    names = [n for n, _ in m.named_parameters()]
    assert names == [
        "layer_norm_weight",
        "layer_norm_bias",
        "query_weight",
        "query_bias",
        "key_weight",
        "key_bias",
        "value_weight",
        "value_bias",
    ]
    w = torch.cat([m.query_weight, m.key_weight, m.value_weight]).detach()
    b = torch.cat([m.query_bias, m.key_bias, m.value_bias]).detach()
    x, dy = data((32, 64), 48, torch.float32, seed=9)
    ln = te_norm32(x, m.layer_norm_weight.detach(), m.layer_norm_bias.detach(), False, m.eps, False)
    assert rel(m(x), F.linear(ln, w, b)) <= 1e-6
    r = recipe.Float8CurrentScaling()
    xg = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y = m(xg)
    y.backward(dy)
    qx, qw, qg = ref_quantizers(r)
    assert rel(y, deq(qx, ln, True) @ deq(qw, w, True).T + b) <= 1e-5
    assert m.key_weight.grad.shape == (16, 64) and m.value_bias.grad.shape == (16,)
    dw = deq(qg, dy, False).T @ deq(qx, ln, False)
    assert rel(torch.cat([m.query_weight.grad, m.key_weight.grad, m.value_weight.grad]), dw) <= 1e-5
