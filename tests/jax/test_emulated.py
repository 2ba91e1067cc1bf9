"""te_jax's emulated MXFP8 and NVFP4 quantization (te_jax._emulated) against the numpy oracle
in _jax_oracle.py, bit for bit on awkward values, and the properties NUMERICS.md states
(scales never saturate a block's largest element; the Hadamard transform leaves the wgrad
product unchanged; stochastic rounding picks a neighbour, unbiased on average).

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_emulated.py
"""

from __future__ import annotations

import _jax_oracle as oracle
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from te_jax import _emulated
from te_jax._quantizer import E4M3, E5M2, Quantizer

_quantize = jax.jit(_emulated.quantize, static_argnames=("q", "rowwise", "columnwise", "reduce_axes"))


def _emulate(x, q, rowwise=True, columnwise=True, rng=None):
    return _quantize(x, q=q, rowwise=rowwise, columnwise=columnwise, rng=rng)


@pytest.mark.parametrize(
    "shape,dtype,square",
    [((64, 96), E4M3, False), ((33, 50), E5M2, False), ((33, 50), E4M3, True), ((16, 16), E5M2, True)],
)
def test_mxfp8_bit_exact(shape, dtype, square):
    x = oracle.random_source(np.random.default_rng(0), shape, np.float32)
    x[: min(shape[0], 32), :32] = 0.0  # an all-zero block: scale 2^-127, values 0
    q = Quantizer("mxfp8", np.dtype(dtype), "2d" if square else "1d")
    out = _emulate(jnp.asarray(x), q)
    want_row = oracle.mxfp8(x, dtype, square=square)
    want_col = oracle.mxfp8(x.T, dtype, square=square).T
    np.testing.assert_array_equal(oracle.bits(np.asarray(out.rowwise)), oracle.bits(want_row))
    np.testing.assert_array_equal(oracle.bits(np.asarray(out.columnwise)), oracle.bits(want_col))


def test_mxfp8_scales_round_up_and_nan():
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 449.0  # amax / 448 just above 1: the scale rounds up to 2, nothing saturates
    x[0, 1] = -3.0
    q = Quantizer("mxfp8", E4M3, "1d")
    out = np.asarray(_emulate(jnp.asarray(x), q, columnwise=False).rowwise)
    assert out[0, 0] == 448.0  # 449 / 2 = 224.5 rounds to 224 (E4M3 spacing 16 there), times 2
    assert out[0, 1] == -3.0
    x[0, 5] = np.nan
    out = np.asarray(_emulate(jnp.asarray(x), q, columnwise=False).rowwise)
    assert np.isnan(out).all()  # a NaN amax gives the NaN scale 0xFF: the whole block is NaN


# the Hadamard transform runs over 16 rows of the column-wise copy and never on 2D weights
NVFP4_CASES = [
    ((64, 96), False, False),
    ((33, 50), False, False),
    ((33, 50), True, False),
    ((64, 96), False, True),
]


@pytest.mark.parametrize("shape,square,rht", NVFP4_CASES)
def test_nvfp4_bit_exact(shape, square, rht):
    x = oracle.random_source(np.random.default_rng(1), shape, np.float32) / 100
    q = Quantizer("nvfp4", None, "2d" if square else "1d", rht=rht)
    out = _emulate(jnp.asarray(x), q)
    want_row = oracle.nvfp4(x, square=square)
    col_src = oracle.rht(x.T) if rht and not square else x.T
    want_col = oracle.nvfp4(col_src, square=square).T
    np.testing.assert_array_equal(oracle.bits(np.asarray(out.rowwise)), oracle.bits(want_row))
    np.testing.assert_array_equal(oracle.bits(np.asarray(out.columnwise)), oracle.bits(want_col))


def test_nvfp4_values_and_zero_tensor():
    x = np.array([[6.0, 3.0, 1.5, 0.75, 0.25, -2.5, -6.0, 0.0] * 2], np.float32)
    q = Quantizer("nvfp4", None, "1d")
    out = np.asarray(_emulate(jnp.asarray(x), q, columnwise=False).rowwise)
    # amax 6: S_enc = 448, s_block = e4m3(448) = 448, q = x rounded on the E2M1 grid (RNE), and
    # the reconstruction q * s_block * (1 / S_enc) in fp32
    grid = np.array([[6.0, 3.0, 1.5, 1.0, 0.0, -2.0, -6.0, 0.0] * 2], np.float32)
    np.testing.assert_array_equal(out, (grid * np.float32(448.0)) * (np.float32(1.0) / np.float32(448.0)))
    zero = np.asarray(_emulate(jnp.zeros((16, 16)), q).rowwise)
    assert (zero == 0).all()


def test_hadamard_keeps_the_wgrad_product():
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((64, 24)).astype(np.float32), rng.standard_normal((64, 8)).astype(np.float32)
    # the butterfly is the matrix of NUMERICS.md: v @ ((1/4) diag(s) H16)
    t = np.diag(oracle.RHT_SIGNS).astype(np.float64) @ oracle.hadamard16() / 4
    want = (x.T.reshape(24, 4, 16).astype(np.float64) @ t).reshape(24, 64)
    np.testing.assert_allclose(oracle.rht(x.T), want, rtol=1e-6, atol=1e-6)
    product = oracle.rht(x.T) @ oracle.rht(dy.T).T
    np.testing.assert_allclose(product, x.T @ dy, rtol=1e-5, atol=1e-4)


def test_stochastic_rounding():
    # every block of 16 holds a 6 (S_enc = s_block = 448: elements are quantized as they are)
    x = jnp.full((16, 64), 1.25, jnp.float32).at[:, ::16].set(6.0)
    q = Quantizer("nvfp4", None, "1d", stochastic_rounding=True)
    outs = [np.asarray(_emulate(x, q, columnwise=False, rng=jax.random.PRNGKey(s)).rowwise) for s in range(4)]
    values = np.concatenate([np.delete(o, np.s_[::16], axis=1).ravel() for o in outs])
    decoded = {
        (np.float32(v) * np.float32(448.0)) * (np.float32(1.0) / np.float32(448.0)) for v in (1.0, 1.5)
    }
    assert set(np.unique(values)) == decoded  # 1.25's two neighbours
    assert abs(values.mean() - 1.25) < 0.02  # unbiased: 1.25 is half way
    assert not np.array_equal(outs[0], outs[1])  # another key, other draws
    np.testing.assert_array_equal(
        outs[0], np.asarray(_emulate(x, q, columnwise=False, rng=jax.random.PRNGKey(0)).rowwise)
    )
    with pytest.raises(ValueError, match="rng: NVFP4BlockScaling rounds gradients stochastically"):
        _emulate(x, q, columnwise=False)
