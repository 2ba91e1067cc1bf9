"""te_amax on the CPU backend against max |x| in numpy (NaN-propagating, 0 for empty)."""

import _oracle as O
import ml_dtypes
import numpy as np
import pytest
from _buffers import SOURCE_TYPES, assert_float_equal, awkward, f32, rng_for, tensor
from te_core import _C

SHAPES = [(1, 1), (7, 13), (1000, 3), (2, 3, 5), (129, 257), (0, 5), (5, 0), (4, 0, 3), ()]


def run_amax(x, initial=-3.0):
    out = f32(initial)
    _C.amax(tensor(x), tensor(out))
    return out


@pytest.mark.parametrize("dtype", SOURCE_TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_amax_matches_numpy(shape, dtype):
    rng = rng_for(shape, np.dtype(dtype).name)
    x = awkward(rng, shape, dtype, specials=False)
    got = run_amax(x)
    want = np.float32(np.abs(x.astype(np.float32)).max()) if x.size else np.float32(0)
    assert_float_equal(got, np.array([want]), f"amax {shape}")


@pytest.mark.parametrize("dtype", SOURCE_TYPES, ids=lambda t: np.dtype(t).name)
def test_amax_specials(dtype):
    x = np.array([0.0, -0.0, 1.0, -2.5], np.float32).astype(dtype)
    assert run_amax(x)[0] == 2.5
    # the largest magnitude is negative and a subnormal of the source dtype is present
    tiny = ml_dtypes.finfo(dtype).smallest_subnormal
    x = np.array([tiny, -tiny * 3], dtype)
    assert_float_equal(run_amax(x), np.array([tiny * 3], np.float32), "subnormal amax")
    x = np.array([1.0, -np.inf, 2.0], np.float32).astype(dtype)
    assert run_amax(x)[0] == np.inf
    # NaN wins over inf and over anything before or after it
    for pos in [0, 1, 3]:
        x = np.array([5.0, np.inf, -7.0, 1.0], np.float32)
        x[pos] = np.nan
        assert np.isnan(run_amax(x.astype(dtype))[0]), pos
    # all-zero -> +0 (not -0)
    assert_float_equal(run_amax(np.array([-0.0, -0.0], dtype)), f32(0.0), "all negative zeros")


def test_amax_awkward_random():
    rng = np.random.default_rng(7)
    for dtype in SOURCE_TYPES:
        x = awkward(rng, (300, 77), dtype)
        assert np.isnan(x.astype(np.float32)).any()
        assert np.isnan(run_amax(x)[0])
        xf = x.astype(np.float32)
        xf[np.isnan(xf)] = 0
        x = xf.astype(dtype)
        assert_float_equal(run_amax(x), np.array([O.amax(x)]), "amax without NaN")


def test_amax_empty_is_zero_and_written():
    for shape in [(0,), (0, 7), (3, 0)]:
        assert_float_equal(run_amax(np.zeros(shape, np.float32), initial=9.0), f32(0.0), str(shape))


def test_amax_output_any_one_element_shape():
    x = np.array([[-4.0, 3.0]], np.float32)
    out = np.full((1, 1), -1.0, np.float32)
    _C.amax(tensor(x), tensor(out))
    assert out[0, 0] == 4.0


def test_amax_large():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4096, 4096), dtype=np.float32)
    x[1234, 4000] = -1000.0
    assert run_amax(x)[0] == 1000.0
