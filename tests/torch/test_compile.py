"""torch.compile(fullgraph=True) runs te's quantizers through torch.ops.te.* with eager's numbers."""

import pytest
import te_torch as te
import torch


def _bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compiled_quantize_dequantize_matches_eager(oracle, backend):
    torch._dynamo.reset()
    cq = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cpu", force_pow_2_scales=True)
    b2 = te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=2)
    b1 = te.Float8BlockQuantizer(torch.float8_e5m2, block_scaling_dim=1, force_pow_2_scales=False)

    def f(x):
        a, b, c = cq(x), b2(x), b1(x)
        return (
            a.dequantize(),
            b.dequantize(),
            c.dequantize(dtype=torch.float32),
            a._data,
            a._transpose,
            a._scale_inv,
            b._rowwise_data,
            c._columnwise_data,
        )

    cf = torch.compile(f, fullgraph=True, backend=backend)
    for seed, shape in enumerate([(200, 300), (200, 300), (64, 130)]):
        x = oracle.random_input(shape, torch.bfloat16, seed=10 + seed)
        cq.amax.fill_(-1.0)
        got = cf(x)
        got_amax = cq.amax.clone()
        want = f(x)
        assert torch.equal(got_amax, cq.amax)  # the compiled call wrote the quantizer's amax too
        assert torch.equal(cq.amax, x.float().abs().max().reshape(1))
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert torch.equal(_bits(g), _bits(w))


def test_compiled_delayed_scaling_updates_callers_amax():
    torch._dynamo.reset()
    scale, amax = torch.tensor([16.0]), torch.zeros(1)
    q = te.Float8Quantizer(scale, amax, torch.float8_e4m3fn)
    cf = torch.compile(lambda x: q(x).dequantize(), fullgraph=True, backend="aot_eager")
    x = torch.randn(32, 48)
    y = cf(x)
    assert torch.equal(amax, x.abs().max().reshape(1))
    cf(x * 4)
    assert torch.equal(amax, (x * 4).abs().max().reshape(1))
    assert torch.equal(y, ((x * 16).clamp(-448, 448).to(torch.float8_e4m3fn).float() / 16))


def test_compiled_function_returns_and_takes_quantized_tensors():
    torch._dynamo.reset()
    cq = te.Float8CurrentScalingQuantizer(torch.float8_e5m2, "cpu")
    x = torch.randn(24, 40)
    qt = torch.compile(lambda x: cq(x), fullgraph=True, backend="aot_eager")(x)
    assert isinstance(qt, te.Float8Tensor)
    assert torch.equal(qt.dequantize(), cq(x).dequantize())
    bq = te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=1)
    bt = bq(x)
    w = torch.randn(40, 8)
    g = torch.compile(lambda q, w: q @ w, fullgraph=True, backend="aot_eager")
    assert torch.equal(g(bt, w), bt.dequantize() @ w)
