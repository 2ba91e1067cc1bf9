"""Float8Quantizer (delayed) and Float8CurrentScalingQuantizer against the plain-torch oracle."""

import pytest
import te_torch as te
import torch

SHAPES = [(1, 1), (7, 13), (1000, 3), (2, 3, 5), (129, 257), (4, 16, 32)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def _check_copies(oracle, qt, x, scale, fp8_dtype):
    """Row-wise data == oracle; column-wise == its transpose; scale_inv == 1/scale."""
    want = oracle.cast(x.float(), scale, fp8_dtype)
    assert qt._data.dtype == fp8_dtype and qt._data.shape == x.shape
    assert torch.equal(oracle.bits(qt._data), oracle.bits(want))
    k = x.shape[-1]
    assert qt._transpose.shape == (k, x.numel() // k)
    assert torch.equal(oracle.bits(qt._transpose), oracle.bits(want.reshape(-1, k).t()))
    assert qt._scale_inv.dtype == torch.float32 and qt._scale_inv.shape == (1,)
    assert torch.equal(qt._scale_inv, 1.0 / torch.as_tensor(scale, dtype=torch.float32).reshape(1))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_current_scaling_matches_oracle(oracle, shape, dtype, fp8_dtype):
    x = oracle.random_input(shape, dtype)
    q = te.Float8CurrentScalingQuantizer(fp8_dtype, "cpu")
    qt = q(x)
    assert isinstance(qt, te.Float8Tensor)
    assert qt.shape == x.shape and qt.dtype == dtype and qt._fp8_dtype == fp8_dtype
    amax = x.float().abs().max().reshape(1)
    scale = oracle.scale_from_amax(amax, oracle.FP8_MAX[fp8_dtype], False, 0.0)
    assert torch.equal(q.amax, amax)
    assert torch.equal(q.scale, scale)
    _check_copies(oracle, qt, x, scale, fp8_dtype)
    # dequantize is exactly q * scale_inv rounded to the output dtype, and close to x
    deq = qt.dequantize()
    assert deq.dtype == dtype and deq.shape == x.shape
    exact = (qt._data.float() * qt._scale_inv).to(dtype)
    assert torch.equal(deq, exact)
    assert torch.equal(qt.dequantize(dtype=torch.float32), qt._data.float() * qt._scale_inv)
    rel = 2.0**-3 if fp8_dtype == torch.float8_e4m3fn else 2.0**-2
    big = x.float().abs() > amax * 2.0**-6  # well inside the normal range after scaling
    assert torch.all((deq.float() - x.float()).abs()[big] <= rel * x.float().abs()[big])


@pytest.mark.parametrize("fp8_dtype", FP8)
def test_current_scaling_pow2_and_epsilon(oracle, fp8_dtype):
    fp8_max = oracle.FP8_MAX[fp8_dtype]
    x = torch.tensor([[0.3, -0.7, 0.1, 0.0]])
    q = te.Float8CurrentScalingQuantizer(fp8_dtype, "cpu", force_pow_2_scales=True)
    qt = q(x)
    exact = torch.tensor([fp8_max], dtype=torch.float32) / torch.tensor([0.7], dtype=torch.float32)
    pow2 = 2.0 ** torch.floor(torch.log2(exact))
    assert torch.equal(q.scale, pow2) and not torch.equal(pow2, exact)
    _check_copies(oracle, qt, x, pow2, fp8_dtype)

    # amax below epsilon: the scale comes from epsilon, amax is still the tensor's own
    q = te.Float8CurrentScalingQuantizer(fp8_dtype, "cpu", amax_epsilon=4.0)
    qt = q(x)
    assert torch.equal(q.amax, torch.tensor([0.7]))
    assert torch.equal(q.scale, torch.tensor([fp8_max / 4.0]))
    _check_copies(oracle, qt, x, q.scale, fp8_dtype)

    # all zeros: amax 0 gives scale 1
    q = te.Float8CurrentScalingQuantizer(fp8_dtype, "cpu")
    qt = q(torch.zeros(3, 5))
    assert torch.equal(q.amax, torch.zeros(1)) and torch.equal(q.scale, torch.ones(1))
    assert torch.equal(qt._scale_inv, torch.ones(1))
    assert torch.equal(qt.dequantize(), torch.zeros(3, 5))


def test_current_scaling_tiny_amax_overflows_to_flt_max(oracle):
    q = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cpu")
    q(torch.tensor([[1e-45, 0.0]]))  # 448 / (smallest subnormal) overflows fp32
    assert torch.equal(q.scale, torch.tensor([oracle.FLT_MAX]))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_delayed_scaling_matches_oracle_and_accumulates_amax(oracle, shape, dtype, fp8_dtype):
    x = oracle.random_input(shape, dtype, seed=1)
    # a scale 4x too large for x's amax: the largest values saturate to +-fp8_max
    xmax = x.float().abs().max()
    scale = torch.tensor([4 * oracle.FP8_MAX[fp8_dtype]], dtype=torch.float32) / xmax
    amax = torch.tensor([0.5], dtype=torch.float32)
    q = te.Float8Quantizer(scale, amax, fp8_dtype)
    qt = q(x)
    _check_copies(oracle, qt, x, scale, fp8_dtype)
    assert torch.equal(amax, torch.maximum(torch.tensor([0.5]), xmax.reshape(1)))
    assert q.amax is amax and q.scale is scale  # the caller's buffers, updated in place
    # a second quantization max-accumulates into the same amax
    q(x * 0.5)
    assert torch.equal(amax, torch.maximum(torch.tensor([0.5]), xmax.reshape(1)))
    q(x * 3)
    assert torch.equal(amax, (x * 3).float().abs().max().reshape(1))
    assert torch.equal(scale, torch.tensor([4 * oracle.FP8_MAX[fp8_dtype]]) / xmax)  # read-only


def test_delayed_scaling_saturates_and_propagates_nan(oracle):
    scale, amax = torch.tensor([1.0]), torch.zeros(1)
    q = te.Float8Quantizer(scale, amax, torch.float8_e4m3fn, columnwise=False)
    x = torch.tensor([[1000.0, -1000.0, float("inf"), float("-inf"), 448.0, 1.0]])
    qt = q(x)
    assert qt._data.float().tolist() == [[448.0, -448.0, 448.0, -448.0, 448.0, 1.0]]
    assert torch.isinf(amax).all()
    q(torch.tensor([[1.0, float("nan")]]))
    assert torch.isnan(amax).all()
    qt = q(torch.tensor([[float("nan"), 2.0]]))
    assert torch.isnan(qt._data.float()[0, 0]) and qt._data.float()[0, 1] == 2.0


def test_usage_flags_select_copies(oracle):
    x = oracle.random_input((33, 48), torch.bfloat16)
    q = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cpu", columnwise=False)
    assert (q.rowwise_usage, q.columnwise_usage) == (True, False)
    qt = q(x)
    assert qt._data is not None and qt._transpose is None
    q.set_usage(rowwise=False, columnwise=True)
    qt2 = q.quantize(x)
    assert qt2._data is None and qt2._transpose.shape == (48, 33)
    assert torch.equal(oracle.bits(qt2._transpose), oracle.bits(qt._data.t()))
    assert torch.equal(qt2.dequantize(), qt.dequantize())  # read back from the column-wise copy
    q.set_usage(rowwise=True)  # None leaves columnwise as it is
    assert (q.rowwise_usage, q.columnwise_usage) == (True, True)


def test_non_contiguous_input_is_quantized_as_its_values(oracle):
    base = oracle.random_input((40, 24), torch.float32)
    x = base.t()  # non-contiguous [24, 40]
    q = te.Float8CurrentScalingQuantizer(torch.float8_e5m2, "cpu")
    qt = q(x)
    assert qt.shape == (24, 40)
    _check_copies(oracle, qt, x.contiguous(), q.scale, torch.float8_e5m2)


def test_quantize_dtype_argument_sets_nominal_dtype():
    q = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cpu")
    qt = q.quantize(torch.randn(4, 8), dtype=torch.bfloat16)
    assert qt.dtype == torch.bfloat16 and qt.dequantize().dtype == torch.bfloat16
    assert qt._quantizer is q
