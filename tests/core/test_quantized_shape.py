"""te_quantized_shape: every part of every mode against te/tensor.h's table."""

import _oracle as O
import pytest
from te_core import _C

M = _C.ScalingMode
P = _C.Part
SHAPES = [
    (),
    (1,),
    (1, 1),
    (7, 13),
    (1000, 3),
    (128, 128),
    (129, 257),
    (2, 3, 5),
    (4, 130, 513),
    (0, 5),
    (5, 0),
    (0,),
    (1, 2, 1, 2, 1, 2, 1, 300),
]


def table(mode, part, shape):
    """te/tensor.h, written out."""
    rows, cols = O.matrix_dims(shape)
    cd, ru = O.ceil_div, O.round_up
    if part == P.ROWWISE_DATA:
        return tuple(shape)
    if part == P.COLUMNWISE_DATA:
        return (cols, rows)
    if mode in (M.MXFP8_1D, M.NVFP4_1D):
        # row-major byte scales per 32 / 16 along each copy's rows, padded to 128 x 4
        b = 32 if mode == M.MXFP8_1D else 16
        r, c = (rows, cols) if part == P.ROWWISE_SCALE_INV else (cols, rows)
        return (ru(r, 128), ru(cd(c, b), 4))
    if mode == M.PER_TENSOR:
        return (1,)
    if mode == M.BLOCK_1D:
        return (cd(cols, 128), ru(rows, 4)) if part == P.ROWWISE_SCALE_INV else (cd(rows, 128), ru(cols, 4))
    if part == P.ROWWISE_SCALE_INV:
        return (cd(rows, 128), ru(cd(cols, 128), 4))
    return (cd(cols, 128), ru(cd(rows, 128), 4))


@pytest.mark.parametrize("part", list(P.__members__.values()), ids=str)
@pytest.mark.parametrize("mode", [M.PER_TENSOR, M.BLOCK_1D, M.BLOCK_2D, M.MXFP8_1D, M.NVFP4_1D], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_quantized_shape_table(shape, mode, part):
    assert _C.quantized_shape(int(mode), int(part), list(shape)) == table(mode, part, shape)


def test_quantized_shape_spot_values():
    # hand-computed: [1000, 3] -> M = 1000, K = 3
    assert _C.quantized_shape(int(M.BLOCK_1D), int(P.ROWWISE_SCALE_INV), [1000, 3]) == (1, 1000)
    assert _C.quantized_shape(int(M.BLOCK_1D), int(P.COLUMNWISE_SCALE_INV), [1000, 3]) == (8, 4)
    assert _C.quantized_shape(int(M.BLOCK_2D), int(P.ROWWISE_SCALE_INV), [1000, 3]) == (8, 4)
    assert _C.quantized_shape(int(M.BLOCK_2D), int(P.COLUMNWISE_SCALE_INV), [1000, 3]) == (1, 8)
    assert _C.quantized_shape(int(M.BLOCK_1D), int(P.ROWWISE_SCALE_INV), [2, 3, 129]) == (2, 8)
    assert _C.quantized_shape(int(M.PER_TENSOR), int(P.COLUMNWISE_DATA), [2, 3, 5]) == (5, 6)
    assert _C.quantized_shape(int(M.BLOCK_2D), int(P.ROWWISE_SCALE_INV), [0, 5]) == (0, 4)


def test_quantized_shape_mx_spot_values():
    # hand-computed: [1000, 3] -> M = 1000, K = 3; [2, 3, 129] -> M = 6, K = 129
    mx, nv = int(M.MXFP8_1D), int(M.NVFP4_1D)
    assert _C.quantized_shape(mx, int(P.ROWWISE_SCALE_INV), [1000, 3]) == (1024, 4)
    assert _C.quantized_shape(mx, int(P.COLUMNWISE_SCALE_INV), [1000, 3]) == (128, 32)
    assert _C.quantized_shape(nv, int(P.COLUMNWISE_SCALE_INV), [1000, 3]) == (128, 64)
    assert _C.quantized_shape(mx, int(P.ROWWISE_SCALE_INV), [2, 3, 129]) == (128, 8)
    assert _C.quantized_shape(nv, int(P.ROWWISE_SCALE_INV), [2, 3, 129]) == (128, 12)
    assert _C.quantized_shape(nv, int(P.COLUMNWISE_DATA), [2, 3, 129]) == (129, 6)
    assert _C.quantized_shape(mx, int(P.ROWWISE_SCALE_INV), []) == (128, 4)
    assert _C.quantized_shape(nv, int(P.ROWWISE_SCALE_INV), [0, 5]) == (0, 4)
    assert _C.quantized_shape(nv, int(P.ROWWISE_SCALE_INV), [5, 0]) == (128, 0)


def test_quantized_shape_bad_part():
    with pytest.raises(ValueError, match="part: expected a te_quantized_part value 0..3, got 9"):
        _C.quantized_shape(int(M.MXFP8_1D), 9, [4, 4])
