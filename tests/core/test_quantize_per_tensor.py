"""Per-tensor FP8 quantization (delayed and current scaling) against the numpy oracle, bit for bit."""

import _oracle as O
import ml_dtypes
import numpy as np
import pytest
from _buffers import (
    SOURCE_TYPES,
    Quantized,
    assert_bits_equal,
    assert_float_equal,
    assert_fp8_equal,
    awkward,
    f32,
    finite_awkward,
    rng_for,
)
from te_core import _C

PT = int(_C.ScalingMode.PER_TENSOR)
FMTS = [O.E4M3, O.E5M2]
SHAPES = [(1, 1), (7, 13), (1000, 3), (2, 3, 5), (129, 257), (0, 5), (5, 0)]


def dtype_id(t):
    return np.dtype(t).name


def cfg(**kw):
    return _C.QuantConfig(**kw)


def check_output(q: Quantized, x, scale, what):
    want = O.quantize_per_tensor(x, scale, q.fmt)
    assert_fp8_equal(q.rowwise, want, q.fmt, what + " rowwise")
    assert_bits_equal(q.rowwise_scale_inv, O.reciprocal([scale]), what + " scale_inv")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_delayed_reads_scale_and_accumulates_amax(shape, dtype, fmt):
    rng = rng_for("delayed", shape, dtype_id(dtype), fmt)
    scale = np.float32(2.0 ** int(rng.integers(-4, 5)))
    x1 = awkward(rng, shape, dtype, fmt, scale=scale)
    x2 = finite_awkward(rng, shape, dtype, fmt, scale=scale, huge=False)
    q = Quantized(PT, shape, fmt, columnwise=False, amax=0.0, scale=scale)
    q.quantize(x1, cfg(compute_scale=False))
    check_output(q, x1, scale, "step 1")
    assert_float_equal(q.amax, np.array([O.amax(x1)]), "amax after one call")
    assert q.scale[0] == scale  # delayed scaling never writes the scale
    q.amax[0] = 0.5  # a smaller amax from an earlier quantization in this step
    q.quantize(x2, cfg(compute_scale=False))
    check_output(q, x2, scale, "step 2")
    want = max(np.float32(0.5), O.amax(x2))
    assert_float_equal(q.amax, np.array([want], np.float32), "amax max-accumulated")
    # a larger earlier amax survives
    q.amax[0] = 1e30
    q.quantize(x2, cfg(compute_scale=False))
    assert q.amax[0] == np.float32(1e30)


@pytest.mark.parametrize("dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(1, 1), (129, 257), (0, 5)], ids=str)
def test_delayed_reset_amax_writes_this_calls_amax(shape, dtype):
    """reset_amax (te_jax's fresh amax result): whatever the buffer held, amax = amax(x); the
    quantized bytes are the accumulating call's."""
    rng = rng_for("delayed reset", shape, dtype_id(dtype))
    x = finite_awkward(rng, shape, dtype, O.E4M3, scale=2.0, huge=False)
    for garbage in [1e30, np.nan, -5.0]:
        q = Quantized(PT, shape, O.E4M3, amax=garbage, scale=2.0).quantize(x, cfg(reset_amax=True))
        check_output(q, x, np.float32(2.0), f"reset from {garbage}")
        assert_float_equal(q.amax, np.array([O.amax(x)], np.float32), f"amax reset from {garbage}")
    with pytest.raises(ValueError, match=r"config->reset_amax: only for delayed scaling"):
        Quantized(PT, shape, O.E4M3, amax=0.0, scale=2.0).quantize(
            x, cfg(compute_scale=True, reset_amax=True)
        )
    with pytest.raises(ValueError, match=r"output->amax: config->reset_amax = 1 needs the fp32 \[1\] amax"):
        Quantized(PT, shape, O.E4M3, scale=2.0).quantize(x, cfg(reset_amax=True))
    block = int(_C.ScalingMode.BLOCK_1D)
    with pytest.raises(ValueError, match=r"config->reset_amax: not supported by scaling mode block_1d"):
        Quantized(block, shape, O.E4M3).quantize(x, cfg(reset_amax=True))


def test_delayed_non_power_of_two_scale_and_no_amax_buffer():
    rng = rng_for("delayed-np2")
    for fmt in FMTS:
        for dtype in SOURCE_TYPES:
            x = awkward(rng, (33, 65), dtype, fmt)
            scale = np.float32(0.7310585)
            q = Quantized(PT, x.shape, fmt, columnwise=False, scale=scale).quantize(x)  # config None
            check_output(q, x, scale, f"{fmt} {dtype_id(dtype)}")


def test_delayed_amax_nan_propagates():
    x = np.array([[1.0, np.nan, 3.0]], np.float32)
    q = Quantized(PT, x.shape, O.E4M3, columnwise=False, amax=100.0, scale=1.0).quantize(x)
    assert np.isnan(q.amax[0])
    # an old NaN amax stays NaN even if the new data is clean
    q.quantize(np.array([[1.0, 2.0, 3.0]], np.float32))
    assert np.isnan(q.amax[0])
    check_output(q, np.array([[1.0, 2.0, 3.0]], np.float32), np.float32(1.0), "after NaN")


def test_delayed_saturation_and_nan_elements():
    x = np.array(
        [[448.0, 464.0, 480.0, 1e30, -np.inf, np.inf, np.nan, -np.nan, 57344.0, 61440.0, 65504.0, -0.0]],
        np.float32,
    )
    for fmt in FMTS:
        q = Quantized(PT, x.shape, fmt, columnwise=False, scale=1.0).quantize(x)
        got = q.rowwise.view(O.FP8_TYPE[fmt]).astype(np.float32)[0]
        m = float(O.FP8_MAX[fmt])
        # finite overflow and inf saturate to +-max, NaN stays NaN (any NaN code)
        assert got[3] == m and got[4] == -m and got[5] == m, got
        assert np.isnan(got[6]) and np.isnan(got[7])
        assert q.rowwise[0, 11] == 0x80  # -0 keeps its sign
        check_output(q, x, np.float32(1.0), fmt)
    q = Quantized(PT, x.shape, O.E4M3, columnwise=False, scale=1.0).quantize(x)
    # 464 is the tie between 448 and the (non-existent) 480 -> saturates; 480 too
    assert q.rowwise[0, 1] == 0x7E and q.rowwise[0, 2] == 0x7E


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (1000, 3), (3, 4, 17), (129, 257)], ids=str)
def test_current_scaling_power_of_two_scale_exact_ties(shape, dtype, fmt):
    """amax is placed at fp8_max / 2^k, so the scale is exactly 2^k and the ties stay ties."""
    rng = rng_for("current", shape, dtype_id(dtype), fmt)
    k = int(rng.integers(-3, 4))
    scale = np.float32(2.0**k)
    x = finite_awkward(rng, shape, dtype, fmt, scale=scale, huge=False).astype(np.float32)
    limit = O.FP8_MAX[fmt] / scale
    x = np.clip(x, -limit, limit)
    x.reshape(-1)[0] = -limit
    x = x.astype(dtype)
    q = Quantized(PT, shape, fmt, amax=-1.0, scale=-1.0).quantize(x, cfg(compute_scale=True))
    assert_float_equal(q.amax, np.array([limit], np.float32), "amax")
    assert_float_equal(q.scale, np.array([scale]), "scale")
    check_output(q, x, scale, "rowwise")
    assert_fp8_equal(
        q.columnwise, O.quantize_per_tensor(x, scale, fmt).reshape(-1, shape[-1]).T, fmt, "columnwise"
    )
    assert_bits_equal(q.columnwise_scale_inv, O.reciprocal([scale]), "columnwise scale_inv")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("pow2", [False, True])
def test_current_scaling_random_amax(fmt, dtype, pow2):
    rng = rng_for("current-random", fmt, dtype_id(dtype), pow2)
    for shape in [(5, 9), (200, 31)]:
        x = (rng.standard_normal(shape) * rng.uniform(0.01, 100.0)).astype(dtype)
        q = Quantized(PT, shape, fmt, amax=0.0, scale=0.0)
        q.quantize(x, cfg(compute_scale=True, force_pow2_scales=pow2))
        a = O.amax(x)
        s = O.compute_scale(a, O.FP8_MAX[fmt], pow2)
        assert_float_equal(q.amax, np.array([a]), "amax")
        assert_float_equal(q.scale, np.array([s]), "scale")
        if pow2:
            assert q.scale.view(np.uint32)[0] & 0x7FFFFF == 0 and q.scale[0] <= O.FP8_MAX[fmt] / a
        else:
            assert q.scale[0] == np.float32(O.FP8_MAX[fmt]) / a
        check_output(q, x, s, str(shape))


@pytest.mark.parametrize("pow2", [False, True])
def test_current_scaling_epsilon(pow2):
    x = np.array([[1e-3, -2e-3]], np.float32)
    for eps, amax_used in [(0.5, 0.5), (1e-4, 2e-3), (2e-3, 2e-3)]:
        q = Quantized(PT, x.shape, O.E4M3, amax=0.0, scale=0.0)
        q.quantize(x, cfg(compute_scale=True, amax_epsilon=eps, force_pow2_scales=pow2))
        s = O.compute_scale(np.float32(amax_used), 448.0, pow2)
        assert_float_equal(q.amax, f32(2e-3), "amax is the data's, not the epsilon")
        assert_float_equal(q.scale, np.array([s]), f"eps {eps}")
        check_output(q, x, s, f"eps {eps}")
    # epsilon also rescues an all-zero tensor
    z = np.zeros((2, 2), np.float32)
    q = Quantized(PT, z.shape, O.E5M2, amax=0.0, scale=0.0)
    q.quantize(z, cfg(compute_scale=True, amax_epsilon=2.0, force_pow2_scales=pow2))
    assert q.scale[0] == (16384.0 if pow2 else 28672.0)


def test_current_scaling_use_existing_amax():
    rng = rng_for("existing")
    x = rng.standard_normal((17, 40)).astype(np.float32) * 100
    for pow2 in [False, True]:
        q = Quantized(PT, x.shape, O.E4M3, amax=3.5, scale=0.0)
        q.quantize(x, cfg(compute_scale=True, use_existing_amax=True, force_pow2_scales=pow2))
        s = O.compute_scale(np.float32(3.5), 448.0, pow2)
        assert q.amax[0] == np.float32(3.5)  # read, not overwritten
        assert q.scale[0] == s == (128.0 if pow2 else 128.0)
        check_output(q, x, s, "existing amax")
    q = Quantized(PT, x.shape, O.E4M3, columnwise=True, rowwise=False, amax=0.75)
    q.quantize(x, cfg(compute_scale=True, use_existing_amax=True))
    s = np.float32(448.0) / np.float32(0.75)
    assert_fp8_equal(q.columnwise, O.quantize_per_tensor(x, s, O.E4M3).T, O.E4M3, "columnwise only")
    assert_bits_equal(q.columnwise_scale_inv, O.reciprocal([s]), "scale_inv")


@pytest.mark.parametrize("fmt", FMTS)
def test_current_scaling_tiny_amax_gives_flt_max(fmt):
    for tiny in [np.float32(1e-38), np.float32(1e-45), np.float32(2.0**-126)]:
        x = np.array([[tiny, -tiny / 2, 0.0]], np.float32)
        for pow2 in [False, True]:
            q = Quantized(PT, x.shape, fmt, amax=0.0, scale=0.0)
            q.quantize(x, cfg(compute_scale=True, force_pow2_scales=pow2))
            want = np.float32(2.0**127) if pow2 else O.FLT_MAX
            assert q.scale[0] == want, (tiny, pow2, q.scale[0])
            assert_bits_equal(q.rowwise_scale_inv, O.reciprocal([want]), "scale_inv of FLT_MAX")
            check_output(q, x, want, "tiny")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("bad", [0.0, np.inf, np.nan])
def test_current_scaling_unusable_amax_gives_scale_one(fmt, bad):
    x = np.array([[bad, -bad, 0.0, 1.0 if bad != 0 else 0.0]], np.float32)
    for pow2 in [False, True]:
        q = Quantized(PT, x.shape, fmt, amax=5.0, scale=5.0)
        q.quantize(x, cfg(compute_scale=True, force_pow2_scales=pow2, amax_epsilon=0.25 if bad else 0.0))
        assert_float_equal(q.amax, f32(abs(bad)), "amax")
        assert q.scale[0] == 1.0 and q.rowwise_scale_inv[0] == 1.0
        check_output(q, x, np.float32(1.0), f"amax {bad}")
    # the same through use_existing_amax
    q = Quantized(PT, x.shape, fmt, amax=bad, scale=5.0)
    q.quantize(x, cfg(compute_scale=True, use_existing_amax=True))
    assert q.scale[0] == 1.0


def test_current_scaling_empty_tensor():
    for shape in [(0, 8), (8, 0)]:
        x = np.zeros(shape, np.float32)
        q = Quantized(PT, shape, O.E4M3, amax=7.0, scale=7.0).quantize(x, cfg(compute_scale=True))
        assert q.amax[0] == 0.0 and q.scale[0] == 1.0 and q.rowwise_scale_inv[0] == 1.0


def test_large_4096_square_current_scaling():
    rng = rng_for("4096")
    x = rng.standard_normal((4096, 4096), dtype=np.float32).astype(ml_dtypes.bfloat16)
    q = Quantized(PT, x.shape, O.E4M3, columnwise=False, amax=0.0, scale=0.0)
    q.quantize(x, cfg(compute_scale=True))
    s = O.compute_scale(O.amax(x), 448.0)
    assert q.scale[0] == s
    check_output(q, x, s, "4096x4096")
