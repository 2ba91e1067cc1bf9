"""fp8_output / fp8_grad of te.Linear and te.LayerNormLinear on CPU (TE's semantics, docs/linear.rst
"FP8 outputs and gradients"): the returned quantized output / input gradient is te's own fp32
GEMM result quantized by a fresh quantizer, bit for bit, and the emulated reference quantized,
tightly; a quantized output or gradient is consumed by the next (previous) te layer as it is, with
no quantization; the delayed-scaling output / grad-input slots step by step against hand
computation; state_dict round trips; the flags outside autocast; errors."""

import copy
import io

import pytest
import te_torch as te
import torch
import torch.nn.functional as F
from _module_ref import (
    E4M3,
    E5M2,
    RECIPES,
    assert_same_quantized,
    columns,
    copies,
    deq,
    hand_update,
    ref_io_quantizers,
    ref_quantizers,
    rel,
    with_amax,
)
from te_torch import _fused_kernels, _kernels, recipe

K, N, SHAPE = 256, 128, (2, 16, 256)
f32 = torch.float32


def kind(r):
    return te.Float8BlockwiseQTensor if r.float8_block_scaling() else te.Float8Tensor


def step(m, x, dy, r, **kw):
    """(y, x.grad) of one forward/backward of ``m`` under ``r`` (x a fresh leaf)."""
    x = x.detach().clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y = m(x, **kw)
    y.backward(dy)
    return y, x.grad


def quantize_spy(monkeypatch) -> list:
    """Records the shape of every tensor te quantizes (plain quantize and fused dbias+quantize)."""
    calls = []
    real_q, real_dbq = _kernels.quantize, _fused_kernels.dbias_quantize

    def q(x, *a, **kw):
        calls.append(tuple(x.shape))
        return real_q(x, *a, **kw)

    def dbq(x, *a, **kw):
        calls.append(tuple(x.shape))
        return real_dbq(x, *a, **kw)

    monkeypatch.setattr(_kernels, "quantize", q)
    monkeypatch.setattr(_fused_kernels, "dbias_quantize", dbq)
    return calls


def _grads_match_plain_pair(r, x, xa, dy, flagged, plain) -> None:
    """The flagged pair's input and weight gradients equal the unflagged pair's (fed x, dy)."""
    xb = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y_p = plain[1](plain[0](xb))
    y_p.backward(dy)
    assert torch.equal(xa.grad, xb.grad)
    for m, q in zip(flagged, plain, strict=True):
        assert torch.equal(m.weight.grad, q.weight.grad)


def _backward_reads_h_as_is(r, x, xa, dy, h, y, flagged, plain) -> None:
    """After y = fc2(fc1(xa, fp8_output=True)) = y(h): backward, then fc2's GEMM read h's bytes
    (te's GEMM of h itself gives y exactly), and the pair computes what the unflagged pair
    computes (the same fp32 result, quantized with the same scales): y and every gradient."""
    y.backward(dy)
    fc1, fc2 = flagged
    _, qw, _ = ref_quantizers(r)
    assert torch.equal(
        y.detach(), te.functional.gemm(h.detach(), qw(fc2.weight.detach()), bias=fc2.bias.detach())
    )
    xb = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y_p = plain[1](plain[0](xb))
    y_p.backward(dy)
    assert torch.equal(y, y_p) and torch.equal(xa.grad, xb.grad)
    for m, p in zip(flagged, plain, strict=True):
        assert torch.equal(m.weight.grad, p.weight.grad) and torch.equal(m.bias.grad, p.bias.grad)


@pytest.mark.parametrize("dtype", [f32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_quantized_output_and_input_gradient(name, dtype):
    """y (fp8_output) and dx (fp8_grad) are the fp32 GEMM results quantized once, in the forward
    and backward formats; dW and db are what they are without the flags."""
    torch.manual_seed(0)
    r = RECIPES[name]()
    m = te.Linear(K, N, params_dtype=dtype, device="cpu")
    with torch.no_grad():
        m.bias.normal_(0, 0.5)
    x, dy = torch.randn(SHAPE, dtype=dtype), torch.randn(*SHAPE[:-1], N, dtype=dtype)
    fs = bs = None
    if r.delayed():  # a first step sets the five scales the checked (second) step uses
        step(m, x * 0.7, dy * 0.7, r, fp8_output=True, fp8_grad=True)
        fs, bs = m._fwd_state.scale.clone(), m._bwd_state.scale.clone()
        assert (fs != 1).all() and (bs != 1).all()
    plain = copy.deepcopy(m)
    m.weight.grad = m.bias.grad = plain.weight.grad = plain.bias.grad = None
    y, dx = step(m, x, dy, r, fp8_output=True, fp8_grad=True)
    assert isinstance(y, kind(r)) and isinstance(dx, kind(r))
    assert y.dtype == dtype and y.shape == (*SHAPE[:-1], N) and y._fp8_dtype == E4M3
    assert dx.dtype == dtype and dx.shape == SHAPE
    assert dx._fp8_dtype == (E4M3 if r.float8_block_scaling() else E5M2)  # HYBRID: E5M2 gradients
    # bit for bit: te's fp32 GEMMs of the same quantized operands, quantized by fresh quantizers
    qx, qw, qg = ref_quantizers(r, fs, bs)
    qo, qgi = ref_io_quantizers(r, fs, bs)
    w, b = m.weight.detach(), m.bias.detach()
    y32 = te.functional.gemm(qx(x), qw(w), bias=b.float(), out_dtype=f32)
    dx32 = te.functional.gemm_dgrad(qg(dy), qw(w), out_dtype=f32)
    assert_same_quantized(y, qo.quantize(y32, dtype=dtype))
    assert_same_quantized(dx, qgi.quantize(dx32, dtype=dtype))
    # tight: the emulated fp32 reference quantized the same way
    y_emul = deq(qx, x, True) @ deq(qw, w, True).T + b.float()
    dx_emul = deq(qg, dy, True) @ deq(qw, w, False)
    assert rel(y.dequantize(f32), qo.quantize(y_emul).dequantize(f32)) <= 1e-3
    assert rel(dx.dequantize(f32), qgi.quantize(dx_emul).dequantize(f32)) <= 1e-3
    # loose: the unquantized fp32 math
    assert rel(y.dequantize(f32), F.linear(x.float(), w.float(), b.float())) <= 0.1
    assert rel(dx.dequantize(f32), dy.float() @ w.float()) <= 0.2
    # the flags change nothing else
    y_p, dx_p = step(plain, x, dy, r)
    assert torch.equal(m.weight.grad, plain.weight.grad) and torch.equal(m.bias.grad, plain.bias.grad)
    assert type(y_p) is torch.Tensor and type(dx_p) is torch.Tensor


@pytest.mark.parametrize("name", list(RECIPES))
def test_next_linear_reads_the_quantized_output_as_it_is(name, monkeypatch):
    """fc2 multiplies fc1's FP8 output bytes and scales (no quantization of its input), and the
    pair computes what it computes without fp8_output (fp32: bit for bit)."""
    torch.manual_seed(1)
    r = RECIPES[name]()
    fc1, fc2 = te.Linear(K, N, device="cpu"), te.Linear(N, 64, device="cpu")
    plain1, plain2 = copy.deepcopy(fc1), copy.deepcopy(fc2)
    x, dy = torch.randn(SHAPE), torch.randn(*SHAPE[:-1], 64)
    calls = quantize_spy(monkeypatch)
    xa = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        h = fc1(xa, fp8_output=True)
        before = len(calls)
        y = fc2(h)
    assert isinstance(h, kind(r)) and h.requires_grad
    assert calls[before:] == [(64, N)]  # fc2 quantized its weight, not its input
    # delayed: te_gemm wrote h; current / block: fc1's output quantizer did
    assert calls[:before].count(tuple(h.shape)) == (0 if r.delayed() else 1)
    _backward_reads_h_as_is(r, x, xa, dy, h, y, (fc1, fc2), (plain1, plain2))


@pytest.mark.parametrize("name", list(RECIPES))
def test_previous_linear_reads_the_quantized_gradient_as_it_is(name, monkeypatch):
    """fc2's fp8_grad hands fc1's backward a quantized dh, which fc1 uses as it is (nothing is
    quantized in its backward); its bias gradient is the sum of dh's dequantized values."""
    torch.manual_seed(2)
    r = RECIPES[name]()
    fc1, fc2 = te.Linear(K, N, device="cpu"), te.Linear(N, 64, device="cpu")
    plain1, plain2 = copy.deepcopy(fc1), copy.deepcopy(fc2)
    x, dy = torch.randn(SHAPE), torch.randn(*SHAPE[:-1], 64)
    calls = quantize_spy(monkeypatch)
    seen = {}

    def at_dh(g):
        seen["dh"], seen["calls"] = g, len(calls)

    xa = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        h = fc1(xa)
        h.register_hook(at_dh)
        y = fc2(h, fp8_grad=True)
    y.backward(dy)
    dh = seen["dh"]
    assert isinstance(dh, kind(r)) and dh._fp8_dtype == (E4M3 if r.float8_block_scaling() else E5M2)
    assert calls[seen["calls"] :] == []  # fc1's backward quantized nothing
    assert torch.allclose(fc1.bias.grad, dh.dequantize(f32).reshape(-1, N).sum(0), rtol=1e-6, atol=1e-6)
    # fc1's dgrad / wgrad read the bytes a plain backward would have quantized (same fp32 dgrad,
    # same quantizer settings and, in a first delayed step, the same scale 1)
    _grads_match_plain_pair(r, x, xa, dy, (fc1, fc2), (plain1, plain2))


def test_quantized_gradient_of_another_recipe_is_quantized_again():
    """A gradient in a format this layer's GEMMs do not take (nested regions with different
    recipes) is dequantized and quantized like a plain one."""
    torch.manual_seed(3)
    fc1, fc2 = te.Linear(K, N, device="cpu"), te.Linear(N, 64, device="cpu")
    plain1 = copy.deepcopy(fc1)
    x = torch.randn(SHAPE)
    seen = {}
    with te.autocast(recipe=recipe.Float8BlockScaling()):
        h = fc1(x.clone().requires_grad_(True))
        h.register_hook(lambda g: seen.setdefault("dh", g))
        with te.autocast(recipe=recipe.Float8CurrentScaling()):
            y = fc2(h, fp8_grad=True)
    y.sum().backward()
    assert isinstance(seen["dh"], te.Float8Tensor)
    with te.autocast(recipe=recipe.Float8BlockScaling()):
        h_p = plain1(x)
    h_p.backward(seen["dh"].dequantize())
    assert torch.equal(fc1.weight.grad, plain1.weight.grad) and torch.equal(fc1.bias.grad, plain1.bias.grad)


@pytest.mark.parametrize(("algo", "margin"), [("max", 0), ("most_recent", 1)])
def test_delayed_output_and_grad_input_slots_step_by_step(algo, margin):
    """The output slot (forward column 2) records max|y| before the cast and the grad-input slot
    (backward column 1) max|dx|; both update with the others (NUMERICS.md's rule by hand) and
    the next step quantizes y and dx with the new scales."""
    r = recipe.DelayedScaling(margin=margin, amax_history_len=3, amax_compute_algo=algo)
    m = te.Linear(64, 32, device="cpu")
    fwd_h, fwd_s = [[0.0] * 3 for _ in range(3)], [1.0] * 3
    bwd_h, bwd_s = [[0.0] * 3 for _ in range(2)], [1.0] * 2
    for k, (x_amax, g_amax) in enumerate(((4.0, 3.0), (1.5, 0.125), (2.5, 10.0))):
        x = with_amax((4, 64), x_amax, k)
        dy = with_amax((4, 32), g_amax, 50 + k)
        used_f, used_b = torch.tensor(fwd_s), torch.tensor(bwd_s)
        qx, qw, qg = ref_quantizers(r, used_f, used_b)
        w = m.weight.detach()
        y32 = te.functional.gemm(qx(x), qw(w), bias=m.bias.detach(), out_dtype=f32)
        dx32 = te.functional.gemm_dgrad(qg(dy), qw(w), out_dtype=f32)
        xg = x.clone().requires_grad_(True)
        with te.autocast(recipe=r):
            y = m(xg, fp8_output=True, fp8_grad=True)
            assert m._fwd_state.amax_history[0].tolist() == [
                x_amax,
                w.abs().max().item(),
                y32.abs().max().item(),
            ]
        assert y._scale_inv.item() == (1 / used_f[2]).item()
        y.backward(dy)
        assert xg.grad._scale_inv.item() == (1 / used_b[1]).item()
        fwd_h[0][0], fwd_h[1][0], fwd_h[2][0] = x_amax, w.abs().max().item(), y32.abs().max().item()
        bwd_h[0][0], bwd_h[1][0] = g_amax, dx32.abs().max().item()
        fwd_h, fwd_s = hand_update(fwd_h, fwd_s, 448.0, margin, algo)
        bwd_h, bwd_s = hand_update(bwd_h, bwd_s, 57344.0, margin, algo)
        assert columns(m._fwd_state.amax_history) == fwd_h and m._fwd_state.scale.tolist() == fwd_s
        assert columns(m._bwd_state.amax_history) == bwd_h and m._bwd_state.scale.tolist() == bwd_s
    assert fwd_s[2] != 1.0 and bwd_s[1] != 1.0


def test_module_used_twice_keeps_the_larger_output_amax():
    """te_gemm overwrites the amax it writes; the module's output slot max-accumulates."""
    r = recipe.DelayedScaling(amax_history_len=2)
    m = te.Linear(32, 16, device="cpu")
    xs = [with_amax((4, 32), a, i) for i, a in enumerate((2.0, 5.0, 3.0))]
    qx, qw, _ = ref_quantizers(r)
    w, b = m.weight.detach(), m.bias.detach()
    amaxes = [te.functional.gemm(qx(x), qw(w), bias=b, out_dtype=f32).abs().max().item() for x in xs]
    assert amaxes.index(max(amaxes)) != 2  # the last call's amax is not the step's
    with te.autocast(recipe=r):
        for x in xs:
            m(x, fp8_output=True)
        assert m._fwd_state.amax_history[0, 2].item() == max(amaxes)


def _train(m, steps, seed, r):
    outs = []
    for s in range(steps):
        g = torch.Generator().manual_seed(seed + s)
        y, dx = step(
            m,
            torch.randn(8, 64, generator=g),
            torch.randn(8, 32, generator=g),
            r,
            fp8_output=True,
            fp8_grad=True,
        )
        outs.append((y, dx, m.weight.grad.clone()))
        m.weight.grad = m.bias.grad = None
    return outs


def test_state_dict_round_trip_with_output_and_grad_input_slots(tmp_path):
    r = recipe.DelayedScaling(amax_history_len=4)
    torch.manual_seed(4)
    a = te.Linear(64, 32, device="cpu")
    _train(a, 2, 10, r)
    assert (a._fwd_state.scale != 1).all() and (a._bwd_state.scale != 1).all()
    path = tmp_path / "linear.pt"
    torch.save(a.state_dict(), path)
    sd = torch.load(path, weights_only=True)
    assert sd["_extra_state"]["fwd_amax_history"].shape == (4, 3) and sd["_extra_state"][
        "bwd_scale"
    ].shape == (2,)
    b = te.Linear(64, 32, device="cpu")
    b.load_state_dict(sd)
    for sa, sb in ((a._fwd_state, b._fwd_state), (a._bwd_state, b._bwd_state)):
        assert torch.equal(sa.amax_history, sb.amax_history) and torch.equal(sa.scale, sb.scale)
    ((ya, dxa, dwa),) = _train(a, 1, 20, r)
    ((yb, dxb, dwb),) = _train(b, 1, 20, r)
    assert_same_quantized(ya, yb)
    assert_same_quantized(dxa, dxb)
    assert torch.equal(dwa, dwb)
    # a quantized output saves and loads with weights_only=True too
    buf = io.BytesIO()
    torch.save({"y": ya.detach()}, buf)
    buf.seek(0)
    assert_same_quantized(torch.load(buf, weights_only=True)["y"], ya.detach())


@pytest.mark.parametrize("name", list(RECIPES))
def test_layernorm_linear_output_and_gradient(name):
    """LayerNormLinear: y is its fp32 GEMM result quantized; dx the norm backward's dx quantized
    by the grad-input quantizer; the norm output it returns stays high precision."""
    torch.manual_seed(5)
    r = RECIPES[name]()
    m = te.LayerNormLinear(K, N, return_layernorm_output=True, device="cpu")
    with torch.no_grad():
        m.bias.normal_(0, 0.5)
    x, dy = torch.randn(SHAPE), torch.randn(*SHAPE[:-1], N)
    if r.delayed():  # non-trivial scales in every slot
        with te.autocast(recipe=r):
            y, _ = m(x.clone().requires_grad_(True), fp8_output=True, fp8_grad=True)
        y.backward(dy)
        m.weight.grad = m.bias.grad = m.layer_norm_weight.grad = m.layer_norm_bias.grad = None
    plain = copy.deepcopy(m)
    fs, bs = (m._fwd_state.scale.clone(), m._bwd_state.scale.clone()) if r.delayed() else (None, None)
    xa = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y, ln_out = m(xa, fp8_output=True, fp8_grad=True)
    y.backward(dy)
    xb = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y_p, ln_p = plain(xb)
    y_p.backward(dy)
    qo, qgi = ref_io_quantizers(r, fs, bs)
    assert isinstance(y, kind(r)) and type(ln_out) is torch.Tensor and torch.equal(ln_out, ln_p)
    assert_same_quantized(y, qo(y_p.detach()))  # fp32 module: y_p is the fp32 GEMM result
    assert_same_quantized(xa.grad, qgi(xb.grad))
    assert torch.equal(m.weight.grad, plain.weight.grad) and torch.equal(
        m.layer_norm_weight.grad, plain.layer_norm_weight.grad
    )


def test_layernorm_linear_dequantizes_a_quantized_input():
    """The norm reads high precision: a quantized input is dequantized (its gradient flows)."""
    torch.manual_seed(6)
    r = recipe.Float8CurrentScaling()
    fc, ln = te.Linear(K, N, device="cpu"), te.LayerNormLinear(N, 64, device="cpu")
    x = torch.randn(SHAPE, requires_grad=True)
    with te.autocast(recipe=r):
        h = fc(x, fp8_output=True)
        y = ln(h)
        y_ref = copy.deepcopy(ln)(h.dequantize())
    assert torch.equal(y, y_ref)
    y.sum().backward()
    assert x.grad is not None and fc.weight.grad is not None


def test_flags_are_ignored_outside_autocast():
    """As in TE: no quantizers without FP8, so the output and gradients are high precision; a
    quantized input is dequantized."""
    torch.manual_seed(7)
    m = te.Linear(K, N, device="cpu")
    x = torch.randn(SHAPE)
    y, dx = step_outside(m, x, fp8_output=True, fp8_grad=True)
    y_p, dx_p = step_outside(m, x)
    assert type(y) is torch.Tensor and type(dx) is torch.Tensor
    assert torch.equal(y, y_p) and torch.equal(dx, dx_p)
    h = te.Float8CurrentScalingQuantizer(E4M3)(x).requires_grad_(True)
    out = m(h)
    assert torch.equal(out, m(h.dequantize()))
    out.sum().backward()
    assert h.grad is not None and h.grad.shape == SHAPE
    with te.autocast(recipe=recipe.Float8CurrentScaling()), torch.no_grad():
        assert type(m(x, fp8_grad=True)) is torch.Tensor  # fp8_grad with grad disabled: nothing to do


def step_outside(m, x, **kw):
    x = x.clone().requires_grad_(True)
    y = m(x, **kw)
    y.sum().backward()
    return y.detach(), x.grad


def test_misuse_says_what_to_do():
    m = te.Linear(K, N, device="cpu")
    x = torch.randn(SHAPE)
    with pytest.raises(TypeError, match=r"^Linear: fp8_output: expected a bool, got 'yes' \(str\)$"):
        m(x, fp8_output="yes")
    with pytest.raises(TypeError, match=r"^LayerNormLinear: fp8_grad: expected a bool, got 1 \(int\)$"):
        te.LayerNormLinear(K, N, device="cpu")(x, fp8_grad=1)
    per_tensor = te.Float8CurrentScalingQuantizer(E4M3)(x)
    with te.autocast(recipe=recipe.Float8BlockScaling()):
        with pytest.raises(
            ValueError,
            match=r"te.Linear: inp: got a Float8Tensor \(per-tensor FP8\), which Float8BlockScaling GEMMs do "
            r"not take\. A quantized input is used as it is .*or pass inp\.dequantize\(\)",
        ):
            m(per_tensor)
        row_only = te.Float8BlockQuantizer(E4M3, block_scaling_dim=1, columnwise=False)(x)
        with pytest.raises(
            ValueError, match=r"without its column-wise copy, which cannot be made.*columnwise_usage=True"
        ):
            m(row_only)  # the weight's gradient needs the column-wise copy
        m.weight.requires_grad_(False)
        assert type(m(row_only)) is torch.Tensor  # no wgrad: the row-wise copy is enough
        m.weight.requires_grad_(True)
        tiles = te.Float8BlockQuantizer(E4M3, block_scaling_dim=2)(x)
        with pytest.raises(
            ValueError, match=r"128x128 blocks, which Float8BlockScaling \(block_scaling_dim=1"
        ):
            m(tiles)
    with te.autocast(recipe=recipe.DelayedScaling()):
        with pytest.raises(
            ValueError, match="Float8BlockwiseQTensor with 1x128 blocks, which DelayedScaling"
        ):
            m(row_only)


def test_torch_compile_runs_the_flagged_calls_eagerly():
    """Under torch.compile a call with fp8_output / fp8_grad (or a quantized input) runs eagerly
    (a graph break); a compiled layer's backward takes the quantized gradient such a call returns
    (handed over dequantized) and gives eager's numbers."""
    torch._dynamo.reset()
    torch.manual_seed(8)
    r = recipe.Float8CurrentScaling()
    fc1, fc2 = te.Linear(K, N, device="cpu"), te.Linear(N, 64, device="cpu")

    def f(x):
        with te.autocast(recipe=r):
            return fc2(fc1(x), fp8_grad=True)

    got = []
    for fn in (f, torch.compile(f, backend="aot_eager")):
        x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
        y = fn(x)
        y.sum().backward()
        got.append((y.detach(), x.grad, fc1.weight.grad, fc2.weight.grad))
        fc1.weight.grad = fc1.bias.grad = fc2.weight.grad = fc2.bias.grad = None
    for a, b in zip(*got, strict=True):
        assert rel(a, b) <= 1e-6


def test_torch_ops_on_the_quantized_output_are_differentiated():
    """Any torch op on y dequantizes it under autograd; its gradient reaches the layer."""
    torch.manual_seed(9)
    r = recipe.Float8CurrentScaling()
    m = te.Linear(K, N, device="cpu")
    plain = copy.deepcopy(m)
    xa = torch.randn(SHAPE, requires_grad=True)
    xb = xa.detach().clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y = m(xa, fp8_output=True)
        y_p = plain(xb)
    ((y * 2).sum() + y.mean()).backward()
    ((y_p * 2).sum() + y_p.mean()).backward()
    assert torch.equal(xa.grad, xb.grad) and torch.equal(m.weight.grad, plain.weight.grad)


# -- MXFP8BlockScaling ----------------------------------------------------------------------------

MX_RECIPES = {
    "mxfp8_e4m3": lambda: recipe.MXFP8BlockScaling(),
    "mxfp8_hybrid": lambda: recipe.MXFP8BlockScaling(fp8_format=recipe.Format.HYBRID),
}


def mx_scales(t) -> dict:
    """{"row" / "col": the E8M0 scale bytes each copy of an MXFP8Tensor reads (its table less
    the padding te never writes)}."""
    k = t.shape[-1]
    m = t.numel() // k
    rd, rs, cd, cs = t._parts()
    out = {}
    if rd is not None:
        out["row"] = rs[:m, : k // 32]
    if cd is not None:
        out["col"] = cs[:k, : m // 32]
    return out


def assert_same_mx(got, want) -> None:
    """assert_same_quantized, plus the scale bytes themselves."""
    assert_same_quantized(got, want)
    g, w = mx_scales(got), mx_scales(want)
    assert set(g) == set(w) and all(torch.equal(g[k], w[k]) for k in g)


@pytest.mark.parametrize("dtype", [f32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(MX_RECIPES))
def test_mxfp8_quantized_output_and_input_gradient(name, dtype):
    """MXFP8: y (fp8_output) is an MXFP8Tensor of the fp32 GEMM result in the forward format with
    both copies (its consumer's wgrad needs the 32x1 column blocks, which cannot be made from the
    row-wise copy), dx (fp8_grad) one in the backward format; bytes and scales are a fresh
    MXFP8Quantizer's of te's fp32 product; dW and db are what they are without the flags."""
    torch.manual_seed(10)
    r = MX_RECIPES[name]()
    m = te.Linear(K, N, params_dtype=dtype, device="cpu")
    with torch.no_grad():
        m.bias.normal_(0, 0.5)
    plain = copy.deepcopy(m)
    x, dy = torch.randn(SHAPE, dtype=dtype), torch.randn(*SHAPE[:-1], N, dtype=dtype)
    y, dx = step(m, x, dy, r, fp8_output=True, fp8_grad=True)
    g = E5M2 if name == "mxfp8_hybrid" else E4M3
    assert isinstance(y, te.MXFP8Tensor) and isinstance(dx, te.MXFP8Tensor)
    assert y.dtype == dtype and y.shape == (*SHAPE[:-1], N) and y._fp8_dtype == E4M3
    assert dx.dtype == dtype and dx.shape == SHAPE and dx._fp8_dtype == g
    assert set(mx_scales(y)) == set(mx_scales(dx)) == {"row", "col"}
    qx, qw, qg = ref_quantizers(r)
    qo, qgi = ref_io_quantizers(r)
    w, b = m.weight.detach(), m.bias.detach()
    y32 = te.functional.gemm(qx(x), qw(w), bias=b.float(), out_dtype=f32)
    dx32 = te.functional.gemm_dgrad(qg(dy), qw(w), out_dtype=f32)
    assert_same_mx(y, qo.quantize(y32, dtype=dtype))
    assert_same_mx(dx, qgi.quantize(dx32, dtype=dtype))
    # loose: the unquantized fp32 math
    assert rel(y.dequantize(f32), F.linear(x.float(), w.float(), b.float())) <= 0.1
    assert rel(dx.dequantize(f32), dy.float() @ w.float()) <= 0.2
    y_p, dx_p = step(plain, x, dy, r)
    assert torch.equal(m.weight.grad, plain.weight.grad) and torch.equal(m.bias.grad, plain.bias.grad)
    assert type(y_p) is torch.Tensor and type(dx_p) is torch.Tensor
    with te.autocast(recipe=r), torch.no_grad():  # no backward: the row-wise copy only
        assert set(mx_scales(m(x, fp8_output=True))) == {"row"}


@pytest.mark.parametrize("name", list(MX_RECIPES))
def test_mxfp8_chain_reads_the_quantized_output_as_it_is(name):
    """fc1(fp8_output) -> fc2: fc2's fprop and wgrad read h's copies as they are, and the pair
    computes bit for bit what it computes without the flag (fc2 quantizing fc1's fp32 output
    with the same MXFP8 settings)."""
    torch.manual_seed(11)
    r = MX_RECIPES[name]()
    fc1, fc2 = te.Linear(K, N, device="cpu"), te.Linear(N, 64, device="cpu")
    plain1, plain2 = copy.deepcopy(fc1), copy.deepcopy(fc2)
    x, dy = torch.randn(SHAPE), torch.randn(*SHAPE[:-1], 64)
    xa = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        h = fc1(xa, fp8_output=True)
        y = fc2(h)
    assert isinstance(h, te.MXFP8Tensor) and h.requires_grad
    _backward_reads_h_as_is(r, x, xa, dy, h, y, (fc1, fc2), (plain1, plain2))


def test_mxfp8_requantizing_the_dequantized_output():
    """What fc2 would get from h.dequantize() instead: the row-wise copy's values come back
    exactly (an MXFP8 value set is its own quantization, up to a block whose largest byte
    rounded down to 224 = 448 / 2, which re-quantizes with half the scale and twice the bytes:
    same values, other bits), so fc2's output is bit for bit the same; the column-wise copy
    is a second rounding (32x1 blocks of values already rounded in 1x32 blocks), so fc2's
    weight gradient is only close (not bit for bit in general)."""
    torch.manual_seed(12)
    r = recipe.MXFP8BlockScaling()
    fc1, fc2 = te.Linear(K, N, device="cpu"), te.Linear(N, 64, device="cpu")
    x, dy = torch.randn(SHAPE), torch.randn(*SHAPE[:-1], 64)
    with te.autocast(recipe=r):
        h = fc1(x.requires_grad_(True), fp8_output=True)
    hq = te.MXFP8Quantizer(E4M3)(h.dequantize())
    row = copies(hq)["row"][1], copies(h)["row"][1]
    assert torch.equal(row[0].view(torch.int32), row[1].view(torch.int32))
    fc2b = copy.deepcopy(fc2)
    h1 = h.detach().requires_grad_(False)
    h2 = h.dequantize().detach()
    with te.autocast(recipe=r):
        y1, y2 = fc2(h1), fc2b(h2)
    assert torch.equal(y1, y2)
    y1.backward(dy)
    y2.backward(dy)
    # the second rounding moves few elements (by one step of their column block's grid): here
    # none at all, 6e-8 normwise on larger random data; bounded well below one E4M3 step
    c1, c2 = copies(h)["col"][1], copies(hq)["col"][1]
    assert (c1 != c2).float().mean().item() <= 1e-3
    assert rel(fc2.weight.grad, fc2b.weight.grad) <= 2**-8
    assert torch.equal(fc2.bias.grad, fc2b.bias.grad)


@pytest.mark.parametrize("name", list(MX_RECIPES))
def test_mxfp8_previous_linear_reads_the_quantized_gradient_as_it_is(name):
    """fc2's fp8_grad hands fc1 an MXFP8 dh with both copies in the backward format; fc1's dgrad
    and wgrad read it as it is and give the unflagged pair's dx and dW bit for bit."""
    torch.manual_seed(13)
    r = MX_RECIPES[name]()
    fc1, fc2 = te.Linear(K, N, device="cpu"), te.Linear(N, 64, device="cpu")
    plain1, plain2 = copy.deepcopy(fc1), copy.deepcopy(fc2)
    x, dy = torch.randn(SHAPE), torch.randn(*SHAPE[:-1], 64)
    seen = {}
    xa = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        h = fc1(xa)
        h.register_hook(lambda g: seen.setdefault("dh", g))
        y = fc2(h, fp8_grad=True)
    y.backward(dy)
    dh = seen["dh"]
    assert isinstance(dh, te.MXFP8Tensor) and set(mx_scales(dh)) == {"row", "col"}
    assert dh._fp8_dtype == (E5M2 if name == "mxfp8_hybrid" else E4M3)
    assert torch.allclose(fc1.bias.grad, dh.dequantize(f32).reshape(-1, N).sum(0), rtol=1e-6, atol=1e-6)
    _grads_match_plain_pair(r, x, xa, dy, (fc1, fc2), (plain1, plain2))


def test_mxfp8_layernorm_linear_output_and_gradient():
    torch.manual_seed(14)
    r = recipe.MXFP8BlockScaling(fp8_format=recipe.Format.HYBRID)
    m = te.LayerNormLinear(K, N, return_layernorm_output=True, device="cpu")
    plain = copy.deepcopy(m)
    x, dy = torch.randn(SHAPE), torch.randn(*SHAPE[:-1], N)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y, ln_out = m(xa, fp8_output=True, fp8_grad=True)
        y_p, ln_p = plain(xb)
    y.backward(dy)
    y_p.backward(dy)
    qo, qgi = ref_io_quantizers(r)
    assert isinstance(y, te.MXFP8Tensor) and torch.equal(ln_out, ln_p)
    assert_same_mx(y, qo(y_p.detach()))
    assert_same_mx(xa.grad, qgi(xb.grad))
    assert torch.equal(m.weight.grad, plain.weight.grad)
    assert torch.equal(m.layer_norm_weight.grad, plain.layer_norm_weight.grad)


def test_mxfp8_gradient_of_another_format_is_quantized_again():
    """An MXFP8 gradient of the wrong FP8 dtype (E4M3 under HYBRID) is dequantized and quantized
    like a plain gradient."""
    torch.manual_seed(15)
    fc1 = te.Linear(K, N, device="cpu")
    plain1 = copy.deepcopy(fc1)
    x = torch.randn(SHAPE)
    r = recipe.MXFP8BlockScaling(fp8_format=recipe.Format.HYBRID)
    dh = te.MXFP8Quantizer(E4M3)(torch.randn(*SHAPE[:-1], N))
    with te.autocast(recipe=r):
        h, h_p = fc1(x), plain1(x)
    h.backward(dh)
    h_p.backward(dh.dequantize())
    assert torch.equal(fc1.weight.grad, plain1.weight.grad) and torch.equal(fc1.bias.grad, plain1.bias.grad)


def test_mxfp8_input_misuse_says_what_to_do():
    m = te.Linear(K, N, device="cpu")
    x = torch.randn(SHAPE)
    with te.autocast(recipe=recipe.MXFP8BlockScaling()):
        with pytest.raises(ValueError, match=r"te.Linear: inp: got an MXFP8Tensor of torch.float8_e5m2, "):
            m(te.MXFP8Quantizer(E5M2)(x))
        row_only = te.MXFP8Quantizer(E4M3, columnwise=False)(x)
        with pytest.raises(
            ValueError, match=r"MXFP8Tensor without its column-wise copy.*columnwise_usage=True"
        ):
            m(row_only)
        m.weight.requires_grad_(False)
        assert torch.equal(m(row_only), m(row_only.dequantize()))  # fprop only: bytes as they are
        m.weight.requires_grad_(True)
        with pytest.raises(ValueError, match=r"rows .* must be a multiple of 32"):
            m(torch.randn(3, K), fp8_output=True)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        with pytest.raises(ValueError, match=r"an MXFP8Tensor, which Float8CurrentScaling GEMMs do not take"):
            m(te.MXFP8Quantizer(E4M3)(x))


# -- NVFP4BlockScaling ----------------------------------------------------------------------------

NV_RECIPES = {
    "nvfp4": lambda: recipe.NVFP4BlockScaling(),
    "nvfp4_no_sr": lambda: recipe.NVFP4BlockScaling(disable_stochastic_rounding=True),
}


def nv_quantizers(r):
    """Fresh NVFP4 quantizers as a te module's (x, w, dy, output, grad_input) for recipe ``r``."""

    def q(qp):
        return te.NVFP4Quantizer(
            with_rht=qp.random_hadamard_transform,
            with_2d_quantization=qp.fp4_2d_quantization,
            stochastic_rounding=qp.stochastic_rounding,
        )

    inp, wt, grad = r.fp4_quant_fwd_inp, r.fp4_quant_fwd_weight, r.fp4_quant_bwd_grad
    return q(inp), q(wt), q(grad), q(inp), q(grad)


def assert_same_nv(got, want) -> None:
    """Two NVFP4Tensors hold the same copies: E2M1 bytes, the E4M3 scale bytes each copy reads,
    the global amaxes and the transform flag."""
    assert type(got) is type(want) is te.NVFP4Tensor
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got._columnwise_rht == want._columnwise_rht and torch.equal(got._amax, want._amax)
    k = got.shape[-1]
    m = got.numel() // k
    g, w = got._parts(), want._parts()
    for i, region in ((0, None), (1, (m, k // 16)), (2, None), (3, (k, m // 16))):
        assert (g[i] is None) == (w[i] is None), i
        if g[i] is not None:
            a, b = (
                (g[i], w[i])
                if region is None
                else (g[i][: region[0], : region[1]], w[i][: region[0], : region[1]])
            )
            assert torch.equal(a, b), i


@pytest.mark.parametrize("name", list(NV_RECIPES))
def test_nvfp4_quantized_output_and_input_gradient(name):
    """NVFP4: y (fp8_output) and dx (fp8_grad) are NVFP4Tensors of te's fp32 products with both
    copies (16x1 column blocks, with the recipe's Hadamard transform), quantized by fresh
    quantizers of the input's / gradient's QParams; dx with stochastic rounding draws its seed
    from torch's generator, so the reference replays the backward's draws."""
    torch.manual_seed(20)
    r = NV_RECIPES[name]()
    m = te.Linear(K, N, device="cpu")
    with torch.no_grad():
        m.bias.normal_(0, 0.5)
    plain = copy.deepcopy(m)
    x, dy = torch.randn(SHAPE), torch.randn(*SHAPE[:-1], N)
    xa = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y = m(xa, fp8_output=True, fp8_grad=True)
    torch.manual_seed(21)
    y.backward(dy)
    dx = xa.grad
    assert isinstance(y, te.NVFP4Tensor) and isinstance(dx, te.NVFP4Tensor)
    assert all(p is not None for p in (*y._parts(), *dx._parts()))
    qx, qw, qg, qo, qgi = nv_quantizers(r)
    w, b = m.weight.detach(), m.bias.detach()
    y32 = te.functional.gemm(qx(x), qw(w), bias=b, out_dtype=f32)
    assert_same_nv(y, qo.quantize(y32))
    torch.manual_seed(21)  # the backward's draws: dy's quantization, then dx's
    dx32 = te.functional.gemm_dgrad(qg(dy), qw(w), out_dtype=f32)
    assert_same_nv(dx, qgi.quantize(dx32))
    # loose: three E2M1 roundings (x, W, y), each about 0.1 normwise on Gaussian data
    assert rel(y.dequantize(f32), F.linear(x, w, b)) <= 0.3
    assert rel(dx.dequantize(f32), dy @ w) <= 0.3
    xb = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y_p = plain(xb)
    torch.manual_seed(21)
    y_p.backward(dy)
    assert torch.equal(m.weight.grad, plain.weight.grad) and torch.equal(m.bias.grad, plain.bias.grad)


@pytest.mark.parametrize("name", list(NV_RECIPES))
def test_nvfp4_chain_reads_quantized_outputs_and_gradients_as_they_are(name):
    """fc1(fp8_output, fp8_grad) -> fc2(fp8_grad): fc2 reads h's copies (with its transformed
    column-wise copy for the wgrad), fc1 reads dh's; outputs and every gradient equal the
    unflagged pair's bit for bit (the same fp32 results, quantized by quantizers of the same
    settings, drawing the same stochastic-rounding seeds)."""
    torch.manual_seed(22)
    r = NV_RECIPES[name]()
    fc1, fc2 = te.Linear(K, N, device="cpu"), te.Linear(N, 64, device="cpu")
    plain1, plain2 = copy.deepcopy(fc1), copy.deepcopy(fc2)
    x, dy = torch.randn(SHAPE), torch.randn(*SHAPE[:-1], 64)
    seen = {}
    xa = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        h = fc1(xa, fp8_output=True)
        h.register_hook(lambda g: seen.setdefault("dh", g))
        y = fc2(h, fp8_grad=True)
    assert (
        isinstance(h, te.NVFP4Tensor) and h._columnwise_rht == r.fp4_quant_fwd_inp.random_hadamard_transform
    )
    torch.manual_seed(23)
    y.backward(dy)
    assert isinstance(seen["dh"], te.NVFP4Tensor) and seen["dh"]._columnwise_data is not None
    xb = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y_p = plain2(plain1(xb))
    torch.manual_seed(23)
    y_p.backward(dy)
    assert torch.equal(y, y_p) and torch.equal(xa.grad, xb.grad)
    assert torch.equal(fc1.weight.grad, plain1.weight.grad) and torch.equal(
        fc2.weight.grad, plain2.weight.grad
    )
    assert torch.equal(fc2.bias.grad, plain2.bias.grad)


def test_nvfp4_layernorm_linear_output_and_gradient():
    torch.manual_seed(24)
    r = recipe.NVFP4BlockScaling(disable_stochastic_rounding=True)
    m = te.LayerNormLinear(K, N, device="cpu")
    plain = copy.deepcopy(m)
    x, dy = torch.randn(SHAPE), torch.randn(*SHAPE[:-1], N)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y = m(xa, fp8_output=True, fp8_grad=True)
        y_p = plain(xb)
    y.backward(dy)
    y_p.backward(dy)
    *_, qo, qgi = nv_quantizers(r)
    assert_same_nv(y, qo(y_p.detach()))
    assert_same_nv(xa.grad, qgi(xb.grad))
    assert torch.equal(m.weight.grad, plain.weight.grad)


def test_nvfp4_input_misuse_says_what_to_do():
    m = te.Linear(K, N, device="cpu")
    x = torch.randn(SHAPE)
    with te.autocast(recipe=recipe.NVFP4BlockScaling()):
        with pytest.raises(
            ValueError, match=r"te.Linear: inp: got an NVFP4Tensor whose column-wise copy lacks"
        ):
            m(te.NVFP4Quantizer(with_rht=False)(x))
        with pytest.raises(ValueError, match=r"an MXFP8Tensor, which NVFP4BlockScaling GEMMs do not take"):
            m(te.MXFP8Quantizer(E4M3)(x))
        assert torch.equal(m(te.NVFP4Quantizer(with_rht=True)(x)), m(x))  # the x quantizer's bytes
    with te.autocast(recipe=recipe.MXFP8BlockScaling()):
        with pytest.raises(ValueError, match=r"an NVFP4Tensor, which MXFP8BlockScaling GEMMs do not take"):
            m(te.NVFP4Quantizer()(x))
