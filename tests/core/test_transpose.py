"""te_transpose: output[k, m] = input[m, k] bit for bit for 1-, 2- and 4-byte dtypes."""

import numpy as np
import pytest
from _buffers import assert_bits_equal, rng_for, tensor
from te_core import _C

D = _C.DType
DTYPES = {  # te dtype -> numpy container of the same width
    "uint8": (D.UINT8, np.uint8),
    "e4m3": (D.FLOAT8_E4M3, np.uint8),
    "e5m2": (D.FLOAT8_E5M2, np.uint8),
    "e8m0": (D.FLOAT8_E8M0, np.uint8),
    "fp16": (D.FLOAT16, np.uint16),
    "bf16": (D.BFLOAT16, np.uint16),
    "fp32": (D.FLOAT32, np.uint32),
    "int32": (D.INT32, np.uint32),
}
SHAPES = [(1, 1), (7, 13), (1000, 3), (3, 1000), (2, 3, 5), (33, 31, 2), (129, 257), (0, 5), (5, 0), (17,)]


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_transpose_bits(shape, name):
    te_dt, container = DTYPES[name]
    rng = rng_for("transpose", shape, name)
    # every bit pattern, NaN payloads included, must move unchanged
    x = rng.integers(0, np.iinfo(container).max, shape, dtype=container, endpoint=True)
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    cols = shape[-1]
    out = np.full((cols, rows), 0x5A, container)
    _C.transpose(tensor(x, int(te_dt)), tensor(out, int(te_dt)))
    assert_bits_equal(out, np.ascontiguousarray(x.reshape(rows, cols).T), f"{name} {shape}")


def test_transpose_large():
    x = rng_for("transpose-large").integers(0, 256, (4096, 4096), dtype=np.uint8)
    out = np.zeros((4096, 4096), np.uint8)
    _C.transpose(tensor(x, int(D.FLOAT8_E4M3)), tensor(out, int(D.FLOAT8_E4M3)))
    assert_bits_equal(out, np.ascontiguousarray(x.T), "4096x4096")


def test_transpose_twice_is_identity():
    x = rng_for("tt").integers(0, 2**16, (70, 45), dtype=np.uint16)
    y = np.zeros((45, 70), np.uint16)
    z = np.zeros((70, 45), np.uint16)
    _C.transpose(tensor(x, int(D.BFLOAT16)), tensor(y, int(D.BFLOAT16)))
    _C.transpose(tensor(y, int(D.BFLOAT16)), tensor(z, int(D.BFLOAT16)))
    assert_bits_equal(z, x, "round trip")
