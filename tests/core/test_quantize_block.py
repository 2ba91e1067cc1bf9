"""Float8BlockScaling (1x128 with its column-wise copy, and 128x128) against the numpy oracle: data
bytes, scale_inv bits in te/tensor.h's layout, and padding left exactly as it was."""

import _oracle as O
import numpy as np
import pytest
from _buffers import (
    SOURCE_TYPES,
    Quantized,
    assert_bits_equal,
    assert_fp8_equal,
    awkward,
    finite_awkward,
    rng_for,
    scale_buffer,
)
from te_core import _C

MODES = {1: int(_C.ScalingMode.BLOCK_1D), 2: int(_C.ScalingMode.BLOCK_2D)}
SHAPES = [
    (1, 1),
    (7, 13),
    (1000, 3),
    (3, 1000),
    (2, 3, 5),
    (2, 130, 129),
    (129, 257),
    (256, 384),
    (0, 5),
    (5, 0),
]


def dtype_id(t):
    return np.dtype(t).name


def oracle(x, fmt, block_dim, pow2, eps):
    rows, cols = O.matrix_dims(x.shape)
    rs = scale_buffer(O.block_scale_inv_shape(block_dim, rows, cols, columnwise=False))
    cs = scale_buffer(O.block_scale_inv_shape(block_dim, rows, cols, columnwise=True))
    q_row, q_col = O.quantize_block(x, fmt, block_dim, pow2, eps, rs, cs)
    return q_row.reshape(x.shape), q_col, rs, cs


def run(x, fmt, block_dim, pow2=True, eps=0.0, rowwise=True, columnwise=True):
    q = Quantized(MODES[block_dim], x.shape, fmt, rowwise=rowwise, columnwise=columnwise)
    return q.quantize(x, _C.QuantConfig(force_pow2_scales=pow2, amax_epsilon=eps))


def check(q, x, block_dim, pow2, eps, what):
    q_row, q_col, rs, cs = oracle(x, q.fmt, block_dim, pow2, eps)
    if q.rowwise is not None:
        assert_fp8_equal(q.rowwise, q_row, q.fmt, what + " rowwise")
        assert_bits_equal(q.rowwise_scale_inv, rs, what + " rowwise_scale_inv (padding included)")
    if q.columnwise is not None:
        assert_fp8_equal(q.columnwise, q_col, q.fmt, what + " columnwise")
        assert_bits_equal(q.columnwise_scale_inv, cs, what + " columnwise_scale_inv (padding included)")


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("fmt", [O.E4M3, O.E5M2])
@pytest.mark.parametrize("dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_block_quantize_matches_oracle(shape, dtype, fmt, block_dim):
    rng = rng_for("block", shape, dtype_id(dtype), fmt, block_dim)
    x = awkward(rng, shape, dtype, fmt)
    pow2 = bool(rng.integers(0, 2))
    q = run(x, fmt, block_dim, pow2)
    check(q, x, block_dim, pow2, 0.0, f"pow2={pow2}")


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("pow2", [False, True])
def test_block_scales_pow2_and_fp32(block_dim, pow2):
    """Finite data with a different magnitude per block: every scale is usable and checked."""
    rng = rng_for("block-scales", block_dim, pow2)
    x = finite_awkward(rng, (300, 260), np.float32, huge=False)
    x *= np.exp2(rng.integers(-20, 20, (300, 1))).astype(np.float32)
    q = run(x, O.E4M3, block_dim, pow2)
    check(q, x, block_dim, pow2, 0.0, "scales")
    used = q.rowwise_scale_inv[:, : (300 if block_dim == 1 else 3)]
    mant = used.view(np.uint32) & 0x7FFFFF
    if pow2:
        assert (mant == 0).all()
    else:
        assert (mant != 0).sum() > used.size // 2  # plain fp32 scales are mostly not powers of two


@pytest.mark.parametrize("block_dim", [1, 2])
def test_block_edges_and_special_blocks(block_dim):
    """Edge blocks use only their valid elements; a block's zero/inf/NaN/tiny amax gives its own
    scale without touching its neighbours."""
    x = np.ones((130, 257), np.float32)
    x[:, 256] = 4.0  # the 1-wide last column block
    x[129, :] = 0.5  # the 1-high last row band
    x[0:128, 0:128] = 0.0  # an all-zero block -> scale 1
    x[0, 130] = np.inf  # a block with inf amax -> scale 1
    x[5, 131] = np.nan  # a block with NaN amax -> scale 1, NaN stays NaN
    x[128, 128] = 1e-40  # a subnormal max in the edge tile
    x[128, 129:256] = 0.0
    x[129, 128:256] = 0.0
    for pow2 in [False, True]:
        for fmt in [O.E4M3, O.E5M2]:
            q = run(x, fmt, block_dim, pow2)
            check(q, x, block_dim, pow2, 0.0, f"edges pow2={pow2} {fmt}")
    q = run(x, O.E4M3, block_dim, False)
    if block_dim == 1:
        # row 0, block 2 is the 1-wide last column (amax 4): scale_inv = 1 / (448 / 4)
        assert q.rowwise_scale_inv[2, 0] == np.float32(1.0) / (np.float32(448.0) / np.float32(4.0))
        assert q.rowwise_scale_inv[0, 0] == 1.0  # zeros
        assert q.rowwise_scale_inv[1, 0] == 1.0  # inf
        assert q.rowwise_scale_inv[1, 5] == 1.0  # NaN
    else:
        assert q.rowwise_scale_inv[0, 0] == 1.0  # zero tile
        assert q.rowwise_scale_inv[0, 1] == 1.0  # inf/NaN tile
        assert q.rowwise_scale_inv[1, 2] == np.float32(1.0) / (np.float32(448.0) / np.float32(4.0))
        assert (q.columnwise_scale_inv[:, :2] == q.rowwise_scale_inv[:, :3].T).all()


@pytest.mark.parametrize("block_dim", [1, 2])
def test_block_epsilon(block_dim):
    x = np.full((4, 200), 1e-3, np.float32)
    x[:, 150:] = 2.0
    for pow2 in [False, True]:
        q = run(x, O.E4M3, block_dim, pow2, eps=0.5)
        check(q, x, block_dim, pow2, 0.5, "eps")
    q = run(x, O.E4M3, 1, False, eps=0.5)
    assert q.rowwise_scale_inv[0, 0] == np.float32(1.0) / np.float32(896.0)
    assert q.rowwise_scale_inv[1, 0] == np.float32(1.0) / np.float32(224.0)


@pytest.mark.parametrize("which", ["rowwise", "columnwise"])
@pytest.mark.parametrize("block_dim", [1, 2])
def test_block_either_copy_alone(which, block_dim):
    x = awkward(rng_for("alone", which, block_dim), (140, 300), np.float16)
    q = run(x, O.E5M2, block_dim, rowwise=which == "rowwise", columnwise=which == "columnwise")
    check(q, x, block_dim, True, 0.0, which)


def test_block_2d_copies_are_transposes():
    x = awkward(rng_for("2d-t"), (257, 129), np.float32)
    q = run(x, O.E4M3, 2, pow2=False)
    assert_bits_equal(q.columnwise, np.ascontiguousarray(q.rowwise.T), "2-D copies")


def test_block_1d_columnwise_has_its_own_scales():
    x = np.ones((256, 4), np.float32)
    x[0, :] = 448.0 * 8  # row 0: only in the first column block of 128 rows
    q = run(x, O.E4M3, 1, pow2=False)
    assert (q.columnwise_scale_inv[0, :4] == 8.0).all() and (q.columnwise_scale_inv[1, :4] == 1 / 448.0).all()
    assert (q.rowwise_scale_inv[0, 0] == 8.0) and (q.rowwise_scale_inv[0, 1] == np.float32(1 / 448.0))


def test_block_large_4096():
    rng = rng_for("4096-block")
    x = rng.standard_normal((4096, 4096), dtype=np.float32)
    x *= np.exp2(rng.integers(-10, 10, (4096, 1))).astype(np.float32)
    for block_dim in [1, 2]:
        q = run(x, O.E4M3, block_dim, pow2=True, columnwise=block_dim == 2)
        check(q, x, block_dim, True, 0.0, f"4096 block{block_dim}")
