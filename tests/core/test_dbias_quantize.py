"""te_dbias_quantize: the bias gradient fused with the gradient's cast(-transpose). The FP8 parts
equal te_quantize's bit for bit (and the oracle's); dbias is the fp32 column sum, checked against
float64 and against a row-order fp32 sum computed here."""

import re

import _oracle as O
import numpy as np
import pytest
from _buffers import assert_bits_equal, f32, finite_awkward, rng_for, tensor
from _fused import HP_TYPES, check_quantized, dtype_id, hp_output, make_quantized
from te_core import _C


def fp32_column_sum(x):
    """The reference's order: rows one after another, fp32 accumulators."""
    x2 = x.astype(np.float32).reshape(-1, x.shape[-1])
    s = np.zeros(x2.shape[1], np.float32)
    for row in x2:
        s = (s + row).astype(np.float32)
    return s


@pytest.mark.parametrize(
    "case",
    ["delayed", "delayed_ct", "delayed_reset", "current_ct", "current_colonly", "block1d", "block1d_fp32"],
)
@pytest.mark.parametrize("fmt", [O.E4M3, O.E5M2])
@pytest.mark.parametrize("dtype", HP_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (129, 257), (2, 3, 130)], ids=str)
def test_dbias_quantize(shape, dtype, fmt, case):
    rng = rng_for("dbias", shape, dtype_id(dtype), fmt, case)
    x = finite_awkward(rng, shape, dtype, fmt, huge=False)
    q, cfg = make_quantized(case, shape, fmt)
    dbias = np.zeros(shape[-1], dtype)
    _C.dbias_quantize(tensor(x), q.descriptor(), tensor(dbias), cfg)
    check_quantized(q, case, x.astype(np.float32), fmt, case) if dtype == np.float32 else None
    # For 16-bit inputs te_quantize reads the same input; compare against it directly.
    sep, cfg2 = make_quantized(case, shape, fmt)
    sep.quantize(x, cfg2)
    for name in ("rowwise", "columnwise", "rowwise_scale_inv", "columnwise_scale_inv", "amax", "scale"):
        got, want = getattr(q, name), getattr(sep, name)
        assert (got is None) == (want is None)
        if got is not None:
            assert_bits_equal(got, want, f"{name} vs te_quantize")
    want = fp32_column_sum(x)
    with np.errstate(over="ignore"):  # fp16 dbias of E5M2-max-sized data overflows to inf
        assert_bits_equal(dbias, want.astype(dtype), "dbias vs row-order fp32 sum")
    x64 = x.astype(np.float64).reshape(-1, shape[-1])
    fits = np.abs(x64.sum(axis=0)) < 0.99 * float(np.finfo(np.float16).max if dtype == np.float16 else np.inf)
    assert (np.isinf(dbias.astype(np.float64)) == ~fits).all() or dtype != np.float16
    np.testing.assert_allclose(
        dbias.astype(np.float64)[fits],
        x64.sum(axis=0)[fits],
        rtol=2.0**-7 if dtype != np.float32 else 1e-6,
        atol=1e-6 * np.abs(x64).sum(axis=0).max(initial=0) * x64.shape[0],
    )


def test_empty_rows_give_zero_dbias():
    x = np.zeros((0, 5), np.float32)
    q, cfg = make_quantized("current_ct", (0, 5), O.E4M3)
    dbias = f32(np.nan, (5,))
    _C.dbias_quantize(tensor(x), q.descriptor(), tensor(dbias), cfg)
    assert (dbias == 0).all()


def raises(exc, text):
    return pytest.raises(exc, match=re.escape(text))


def test_errors():
    x = np.zeros((4, 6), np.float32)
    q, cfg = make_quantized("current_ct", (4, 6), O.E4M3)
    p = "te_dbias_quantize: "
    with raises(ValueError, p + "input.dtype: expected float32, float16, bfloat16, got int32"):
        _C.dbias_quantize(tensor(x, int(_C.DType.INT32)), q.descriptor(), tensor(f32(0, (6,))), cfg)
    with raises(ValueError, p + "dbias.shape: expected [6] ([K], the last dim of input), got [4]"):
        _C.dbias_quantize(tensor(x), q.descriptor(), tensor(f32(0, (4,))), cfg)
    with raises(ValueError, p + "dbias: expected a [K] tensor (the bias gradient to write), got NULL"):
        _C.dbias_quantize(tensor(x), q.descriptor(), _C.Tensor(0, 0, []), cfg)
    with raises(ValueError, p + "output->rowwise_data.dtype: expected float8_e4m3, float8_e5m2, got float32"):
        _C.dbias_quantize(tensor(x), hp_output(x.copy()), tensor(f32(0, (6,))), cfg)
    with raises(ValueError, p + "output->rowwise_scale_inv.dtype: expected float32, got"):
        d = q.descriptor()
        d.rowwise_scale_inv = tensor(np.zeros(1, np.uint8), int(_C.DType.UINT8))
        _C.dbias_quantize(tensor(x), d, tensor(f32(0, (6,))), cfg)
    with raises(
        NotImplementedError,
        p + "output->scaling_mode: mxfp8_1d output from a fused op is not implemented; write the result "
        "in high precision and quantize it with te_quantize",
    ):
        q2 = _C.QuantizedTensor(int(_C.ScalingMode.MXFP8_1D))
        _C.dbias_quantize(tensor(x), q2, tensor(f32(0, (6,))), cfg)
