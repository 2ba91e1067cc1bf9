"""PER_TENSOR quantize with a column-wise copy (the fused cast-transpose): the column-wise bytes are
the transpose of the row-wise ones, and either copy may be requested alone."""

import _oracle as O
import numpy as np
import pytest
from _buffers import SOURCE_TYPES, Quantized, assert_bits_equal, assert_fp8_equal, awkward, rng_for
from te_core import _C

PT = int(_C.ScalingMode.PER_TENSOR)
SHAPES = [(1, 1), (7, 13), (1000, 3), (3, 1000), (2, 3, 5), (4, 33, 65), (129, 257), (0, 5), (5, 0)]


def dtype_id(t):
    return np.dtype(t).name


@pytest.mark.parametrize("fmt", [O.E4M3, O.E5M2])
@pytest.mark.parametrize("dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cast_transpose_both_copies(shape, dtype, fmt):
    rng = rng_for("ct", shape, dtype_id(dtype), fmt)
    scale = np.float32(2.0 ** int(rng.integers(-3, 4)))
    x = awkward(rng, shape, dtype, fmt, scale=scale)
    rows, cols = O.matrix_dims(shape)
    q = Quantized(PT, shape, fmt, amax=0.0, scale=scale).quantize(x, _C.QuantConfig())
    want = O.quantize_per_tensor(x, scale, fmt)
    assert_fp8_equal(q.rowwise, want, fmt, "rowwise")
    assert_fp8_equal(q.columnwise, want.reshape(rows, cols).T, fmt, "columnwise vs oracle")
    # the two copies are the same bytes, transposed (NaN codes included)
    assert_bits_equal(q.columnwise, np.ascontiguousarray(q.rowwise.reshape(rows, cols).T), "copies")
    assert_bits_equal(q.columnwise_scale_inv, O.reciprocal([scale]), "columnwise scale_inv")
    assert_bits_equal(q.rowwise_scale_inv, O.reciprocal([scale]), "rowwise scale_inv")


@pytest.mark.parametrize("which", ["rowwise", "columnwise"])
@pytest.mark.parametrize("current", [False, True])
def test_either_copy_alone(which, current):
    rng = rng_for("ct-alone", which, current)
    x = awkward(rng, (37, 150), np.float32, scale=4.0, huge=False)
    x[~np.isfinite(x)] = 3.0
    q = Quantized(
        PT, x.shape, O.E4M3, rowwise=which == "rowwise", columnwise=which == "columnwise", amax=0.0, scale=4.0
    )
    q.quantize(x, _C.QuantConfig(compute_scale=current))
    scale = O.compute_scale(O.amax(x), 448.0) if current else np.float32(4.0)
    assert q.scale[0] == scale
    want = O.quantize_per_tensor(x, scale, O.E4M3)
    if which == "rowwise":
        assert q.columnwise is None
        assert_fp8_equal(q.rowwise, want, O.E4M3, "rowwise alone")
        assert_bits_equal(q.rowwise_scale_inv, O.reciprocal([scale]), "scale_inv")
    else:
        assert q.rowwise is None
        assert_fp8_equal(q.columnwise, want.T, O.E4M3, "columnwise alone")
        assert_bits_equal(q.columnwise_scale_inv, O.reciprocal([scale]), "scale_inv")
    assert q.amax[0] == O.amax(x)


def test_cast_transpose_accepts_flattened_rowwise_shape():
    """The row-wise buffer may have any shape with the input's last dim and element count."""
    x = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8) - 20
    q = Quantized(PT, (6, 8), O.E5M2, scale=0.5)
    q.quantize(x, _C.QuantConfig())
    want = O.quantize_per_tensor(x.reshape(6, 8), 0.5, O.E5M2)
    assert_fp8_equal(q.rowwise, want, O.E5M2, "flattened rowwise")
    assert_fp8_equal(q.columnwise, want.T, O.E5M2, "columnwise of 3-D input")
