"""Float8Tensor / Float8BlockwiseQTensor as torch tensors: dispatch, usage, save/load, errors."""

import io

import pytest
import te_torch as te
import torch


def _quantizers():
    return [
        te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cpu"),
        te.Float8Quantizer(torch.tensor([64.0]), torch.zeros(1), torch.float8_e5m2),
        te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=1),
        te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=2),
    ]


QUANTIZER_IDS = ["current", "delayed", "block1d", "block2d"]


@pytest.mark.parametrize("qi", range(4), ids=QUANTIZER_IDS)
def test_fallback_ops_match_dequantize_then_op(oracle, qi):
    x = oracle.random_input((37, 140), torch.bfloat16, seed=5)
    qt = _quantizers()[qi](x)
    ref = qt.dequantize()
    assert not torch.equal(ref, x)  # quantization did change values: the checks below mean something
    w = torch.randn(140, 9, dtype=torch.bfloat16)
    for got, want in [
        (qt + 1, ref + 1),
        (qt @ w, ref @ w),
        (torch.nn.functional.linear(w.t(), qt), torch.nn.functional.linear(w.t(), ref)),
        (qt * qt, ref * ref),
        (qt.t(), ref.t()),
        (qt.sum(dim=0), ref.sum(dim=0)),
        (qt.float(), ref.float()),
        (qt[3:5], ref[3:5]),
        (torch.cat([qt, qt]), torch.cat([ref, ref])),
    ]:
        assert type(got) is torch.Tensor
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("qi", range(4), ids=QUANTIZER_IDS)
def test_detach_clone_copy(oracle, qi):
    x = oracle.random_input((130, 129), torch.float32, seed=6)
    q = _quantizers()[qi]
    qt = q(x)
    d = qt.detach()
    assert type(d) is type(qt) and torch.equal(d.dequantize(), qt.dequantize())
    c = qt.clone()
    assert type(c) is type(qt) and torch.equal(c.dequantize(), qt.dequantize())
    # clone owns its bytes
    data = c._data if isinstance(c, te.Float8Tensor) else c._rowwise_data
    orig = qt._data if isinstance(qt, te.Float8Tensor) else qt._rowwise_data
    assert data.data_ptr() != orig.data_ptr()

    # copy_ of a high-precision tensor into a quantized one = quantize in place
    y = oracle.random_input((130, 129), torch.float32, seed=7) * 0.25
    ptr = orig.data_ptr()
    qt.copy_(y)
    assert orig.data_ptr() == ptr  # same buffers, rewritten
    assert torch.equal(qt.dequantize(), q(y).dequantize())
    # copy_ between quantized tensors of one format copies the bytes
    c.copy_(qt)
    assert torch.equal(c.dequantize(), qt.dequantize())
    # copy_ of a quantized tensor into a plain one dequantizes
    out = torch.empty(130, 129)
    out.copy_(qt)
    assert torch.equal(out, qt.dequantize())


def test_in_place_op_requantizes():
    q = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cpu")
    x = torch.randn(16, 32)
    qt = q(x)
    want = q(qt.dequantize() * 3).dequantize()
    r = qt.mul_(3)
    assert r is qt and isinstance(r, te.Float8Tensor)
    assert torch.equal(qt.dequantize(), want)


def test_float8_update_usage_transposes_exactly(oracle):
    x = oracle.random_input((3, 17, 40), torch.float16, seed=8)
    q = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cpu", columnwise=False)
    qt = q(x)
    assert qt._transpose is None
    qt.update_usage(columnwise_usage=True)
    assert qt._transpose.shape == (40, 51)
    assert torch.equal(oracle.bits(qt._transpose), oracle.bits(qt._data.reshape(51, 40).t()))
    data = qt._data.clone()
    qt.update_usage(rowwise_usage=False)
    assert qt._data is None
    qt.update_usage(rowwise_usage=True)
    assert qt._data.shape == x.shape and torch.equal(oracle.bits(qt._data), oracle.bits(data))
    with pytest.raises(ValueError, match="cannot both be False"):
        qt.update_usage(rowwise_usage=False, columnwise_usage=False)


def test_view_keeps_quantized_data():
    q = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cpu")
    qt = q(torch.randn(6, 8))
    v = qt.view(2, 3, 8)
    assert isinstance(v, te.Float8Tensor) and v.shape == (2, 3, 8)
    assert v._data.data_ptr() == qt._data.data_ptr()
    assert torch.equal(v.dequantize(), qt.dequantize().view(2, 3, 8))
    flat = qt.view(48)  # last dim changes: falls back to a high-precision result
    assert type(flat) is torch.Tensor and torch.equal(flat, qt.dequantize().view(48))


@pytest.mark.parametrize("qi", range(4), ids=QUANTIZER_IDS)
def test_save_load_roundtrip(oracle, qi):
    x = oracle.random_input((129, 257), torch.bfloat16, seed=9)
    qt = _quantizers()[qi](x)
    buf = io.BytesIO()
    torch.save({"w": qt, "other": torch.arange(3)}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)["w"]
    assert type(loaded) is type(qt)
    assert loaded.shape == qt.shape and loaded.dtype == qt.dtype
    assert loaded._fp8_dtype == qt._fp8_dtype
    names, _ = qt.__tensor_flatten__()
    assert names == loaded.__tensor_flatten__()[0]
    for n in names:
        a, b = getattr(qt, n), getattr(loaded, n)
        assert a.dtype == b.dtype and torch.equal(oracle.bits(a), oracle.bits(b))
    assert torch.equal(loaded.dequantize(), qt.dequantize())


def test_repr_shows_shape_dtype_scale():
    q = te.Float8Quantizer(torch.tensor([2.0]), torch.zeros(1), torch.float8_e4m3fn)
    r = repr(q(torch.ones(2, 3)))
    assert "Float8Tensor(shape=(2, 3)" in r and "float8_e4m3fn" in r and "scale_inv=0.5" in r
    b = repr(te.Float8BlockQuantizer(torch.float8_e5m2)(torch.ones(2, 3)))
    assert "Float8BlockwiseQTensor(shape=(2, 3)" in b and "float8_e5m2" in b and "128x128" in b


def test_errors_name_the_argument():
    for bad in (torch.float16, torch.int8):
        with pytest.raises(ValueError, match="fp8_dtype: expected torch.float8_e4m3fn or .*e5m2"):
            te.Float8CurrentScalingQuantizer(bad, "cpu")
        with pytest.raises(ValueError, match="fp8_dtype"):
            te.Float8BlockQuantizer(bad)
    with pytest.raises(TypeError, match="fp8_dtype: expected torch.float8_e4m3fn"):
        te.Float8Quantizer(torch.ones(1), torch.zeros(1), "e4m3")
    with pytest.raises(ValueError, match=r"scale: expected a contiguous float32 tensor .*\[2\]"):
        te.Float8Quantizer(torch.ones(2), torch.zeros(1), torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="amax: expected .*float64"):
        te.Float8Quantizer(torch.ones(1), torch.zeros(1, dtype=torch.float64), torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="block_scaling_dim: expected 1 or 2, got 3"):
        te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=3)
    q = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cpu")
    with pytest.raises(TypeError, match="x: expected one of float32, float16, bfloat16"):
        q(torch.ones(2, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="input"):  # te-core's message names its argument
        q(torch.ones(2, 2, dtype=torch.int32))
    for qz in (q, te.Float8BlockQuantizer(torch.float8_e4m3fn)):
        name = type(qz).__name__
        with pytest.raises(TypeError, match=f"{name}: tensor: expected a torch.Tensor, got list"):
            qz([1.0, 2.0])  # was torch's op-schema error for te::quantize
        with pytest.raises(
            ValueError, match=r"src: expected a tensor of dst's shape \[4, 8\] .*got shape \[3, 8\]"
        ):
            qz.quantize(torch.ones(3, 8), out=qz(torch.ones(4, 8)))
    with pytest.raises(ValueError, match="amax_epsilon: expected a number >= 0, got 'x'"):
        te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cpu", amax_epsilon="x")
    # reassigning a delayed quantizer's buffers is allowed; a wrong one is named at the next use
    d = te.Float8Quantizer(torch.ones(1), torch.zeros(1), torch.float8_e4m3fn)
    d.scale = 2.0
    with pytest.raises(TypeError, match="scale: expected a torch.Tensor, got float"):
        d(torch.ones(2, 2))
    d.scale = torch.ones(1, dtype=torch.float64)
    with pytest.raises(
        ValueError, match="scale: expected a contiguous float32 tensor with 1 element, got torch.float64"
    ):
        d(torch.ones(2, 2))
    d.scale = torch.full((1,), 2.0)
    assert torch.equal(d(torch.ones(2, 2))._scale_inv, torch.full((1,), 0.5))


def test_recipe_reexport():
    r = te.recipe.DelayedScaling(amax_history_len=16)
    assert r.amax_history_len == 16 and r.fp8_format == te.recipe.Format.HYBRID
    assert te.recipe.Float8BlockScaling().x_block_scaling_dim == 1
    assert set(te.__all__) >= {
        "Float8Quantizer",
        "Float8CurrentScalingQuantizer",
        "Float8BlockQuantizer",
        "Float8Tensor",
        "Float8BlockwiseQTensor",
        "recipe",
    }
