"""te_dequantize in every implemented mode, from the row-wise or the column-wise copy, into fp32,
fp16 and bf16: x = float(q) * scale_inv in fp32, then round to nearest even (numpy / ml_dtypes)."""

import _oracle as O
import ml_dtypes
import numpy as np
import pytest
from _buffers import FP8_DTYPE, SOURCE_TYPES, assert_float_equal, rng_for, tensor
from te_core import _C

MODES = {0: int(_C.ScalingMode.PER_TENSOR), 1: int(_C.ScalingMode.BLOCK_1D), 2: int(_C.ScalingMode.BLOCK_2D)}
SHAPES = [(1, 1), (7, 13), (1000, 3), (2, 3, 5), (129, 257), (0, 5), (5, 0)]


def dtype_id(t):
    return np.dtype(t).name


def random_scale_inv(rng, shape):
    """Scales spanning tiny to huge, so products overflow fp16/bf16 and land in their subnormals."""
    return np.exp2(rng.uniform(-30, 30, shape)).astype(np.float32) * rng.choice([1, 0.75], shape).astype(
        np.float32
    )


def run(mode_dim, fmt, data, scale_inv, shape, out_dtype, columnwise):
    out = np.full(shape, 7, out_dtype)
    d = tensor(data, FP8_DTYPE[fmt])
    s = tensor(scale_inv)
    kw = (
        dict(columnwise_data=d, columnwise_scale_inv=s)
        if columnwise
        else dict(rowwise_data=d, rowwise_scale_inv=s)
    )
    _C.dequantize(_C.QuantizedTensor(MODES[mode_dim], **kw), tensor(out))
    return out


@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "columnwise"])
@pytest.mark.parametrize("out_dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("fmt", [O.E4M3, O.E5M2])
@pytest.mark.parametrize("mode_dim", [0, 1, 2], ids=["per_tensor", "block_1d", "block_2d"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dequantize_matches_oracle(shape, mode_dim, fmt, out_dtype, columnwise):
    rng = rng_for("deq", shape, mode_dim, fmt, dtype_id(out_dtype), columnwise)
    rows, cols = O.matrix_dims(shape)
    q = rng.integers(0, 256, (rows, cols), dtype=np.uint8)  # every code, NaNs and infs included
    if mode_dim == 0:
        sinv = random_scale_inv(rng, (1,))
        per_elem = sinv[0]
    else:
        sshape = O.block_scale_inv_shape(mode_dim, rows, cols, columnwise)
        sinv = random_scale_inv(rng, sshape)
        per_elem = O.expand_block_scale_inv(mode_dim, sinv, rows, cols, columnwise)
    data = np.ascontiguousarray(q.T) if columnwise else q.reshape(shape)
    got = run(mode_dim, fmt, data, sinv, shape, out_dtype, columnwise)
    want = O.dequantize(q, fmt, per_elem, out_dtype).reshape(shape)
    assert_float_equal(got, want, "dequantize")


@pytest.mark.parametrize("out_dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("fmt", [O.E4M3, O.E5M2])
def test_dequantize_every_code_and_rounding(fmt, out_dtype):
    """All 256 codes times scales that force rounding in fp16/bf16 (ties, overflow, subnormals)."""
    q = np.tile(np.arange(256, dtype=np.uint8), (6, 1))
    sinv = np.array([1.0, 1.0 + 2.0**-9, 1.0 + 2.0**-12, 2.0**-20, 2.0**10, 3.0**5], np.float32)
    for s in sinv:
        got = run(0, fmt, q, np.array([s], np.float32), q.shape, out_dtype, False)
        assert_float_equal(got, O.dequantize(q, fmt, s, out_dtype), f"scale_inv {s}")
    # widening with scale_inv 1 is exact: every finite code comes back as its value
    got = run(0, fmt, q[:1], np.ones(1, np.float32), (1, 256), np.float32, False)
    ref = q[:1].view(O.FP8_TYPE[fmt]).astype(np.float32)
    fin = np.isfinite(ref) | np.isinf(ref)
    assert (got[fin] == ref[fin]).all() and np.isnan(got[~fin]).all()


@pytest.mark.parametrize("mode_dim", [0, 1, 2])
def test_round_trip_through_quantize(mode_dim):
    """Quantize with te, dequantize both copies with te: the two copies give the same values in
    per-tensor and 2-D modes (1-D column-wise blocks differ by design)."""
    rng = rng_for("roundtrip", mode_dim)
    x = (rng.standard_normal((130, 260)) * 3).astype(np.float32)
    rows, cols = x.shape
    P = _C.Part
    mode = MODES[mode_dim]

    def shp(part):
        return _C.quantized_shape(mode, int(part), list(x.shape))

    rw, cw = np.zeros(x.shape, np.uint8), np.zeros((cols, rows), np.uint8)
    rs, cs = np.zeros(shp(P.ROWWISE_SCALE_INV), np.float32), np.zeros(shp(P.COLUMNWISE_SCALE_INV), np.float32)
    extra = {}
    if mode_dim == 0:
        extra = dict(amax=tensor(np.zeros(1, np.float32)), scale=tensor(np.zeros(1, np.float32)))
    d = FP8_DTYPE[O.E4M3]
    qt = _C.QuantizedTensor(
        mode,
        rowwise_data=tensor(rw, d),
        rowwise_scale_inv=tensor(rs),
        columnwise_data=tensor(cw, d),
        columnwise_scale_inv=tensor(cs),
        **extra,
    )
    _C.quantize(tensor(x), qt, _C.QuantConfig(compute_scale=True))
    out_r = np.zeros_like(x)
    out_c = np.zeros_like(x)
    _C.dequantize(
        _C.QuantizedTensor(mode, rowwise_data=tensor(rw, d), rowwise_scale_inv=tensor(rs)), tensor(out_r)
    )
    _C.dequantize(
        _C.QuantizedTensor(mode, columnwise_data=tensor(cw, d), columnwise_scale_inv=tensor(cs)),
        tensor(out_c),
    )
    err = np.linalg.norm(out_r - x) / np.linalg.norm(x)
    assert 0 < err < 0.05
    if mode_dim != 1:
        assert_float_equal(out_c, out_r, "copies dequantize alike")
    else:
        assert 0 < np.linalg.norm(out_c - x) / np.linalg.norm(x) < 0.05


def test_dequantize_prefers_rowwise():
    """With both copies present the row-wise one is read."""
    q = np.array([[0x38, 0x40]], np.uint8)  # E4M3 1.0, 2.0
    cw = np.array([[0x48], [0x50]], np.uint8)  # 4.0, 8.0: would give different values
    out = np.zeros((1, 2), np.float32)
    d = FP8_DTYPE[O.E4M3]
    one = np.ones(1, np.float32)
    _C.dequantize(
        _C.QuantizedTensor(
            MODES[0],
            rowwise_data=tensor(q, d),
            rowwise_scale_inv=tensor(one),
            columnwise_data=tensor(cw, d),
            columnwise_scale_inv=tensor(one),
        ),
        tensor(out),
    )
    assert out.tolist() == [[1.0, 2.0]]


def test_dequantize_3d_output_from_flattened_rowwise():
    q = np.arange(24, dtype=np.uint8).reshape(6, 4)
    out = np.zeros((2, 3, 4), ml_dtypes.bfloat16)
    _C.dequantize(
        _C.QuantizedTensor(
            MODES[0],
            rowwise_data=tensor(q, FP8_DTYPE[O.E5M2]),
            rowwise_scale_inv=tensor(np.array([0.5], np.float32)),
        ),
        tensor(out),
    )
    assert_float_equal(
        out, O.dequantize(q, O.E5M2, np.float32(0.5), ml_dtypes.bfloat16).reshape(2, 3, 4), "3-D"
    )


def test_dequantize_empty_with_null_pointers():
    si = np.ones(1, np.float32)
    qt = _C.QuantizedTensor(
        MODES[0], rowwise_data=_C.Tensor(0, FP8_DTYPE[O.E4M3], [0, 5]), rowwise_scale_inv=tensor(si)
    )
    # A zero-size copy with a NULL pointer (what torch allocates for numel 0) is present, not absent.
    _C.dequantize(qt, _C.Tensor(0, int(_C.DType.FLOAT32), [0, 5]))
