"""te_jax.quantize / dequantize / gemm with MXFP8 and NVFP4 (te-core's kernels through its FFI
handlers) against the numpy oracle in _jax_oracle.py.

- Quantization: each copy's bytes and scales are decoded here, in numpy, from te's layouts
  (te/tensor.h) and compared with the oracle's quantize-dequantize bit for bit, on awkward values;
  dequantize() likewise.
- Stochastic rounding: bit for bit too, the oracle drawing the same Philox words from the
  (seed, offset) that te_jax documents for a key (jax.random.bits(key, (4,), uint32)); and the
  key is a traced value under jit (one compilation serves every key).
- GEMMs: te_gemm multiplies MXFP8/NVFP4 operands as their values rounded to BF16 (te/gemm.h), so
  the tight reference is the decoded operands rounded to BF16, multiplied in float64 (<= 1e-5);
  loosely against the unquantized product.

Run: PYTHONPATH=packages/te-core/src:packages/te-jax/src pytest tests/jax/test_quantize_mx.py
"""

from __future__ import annotations

import dataclasses
import math

import _jax_oracle as oracle
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import te_jax

E4M3, E5M2 = np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)
MX_BLOCK = {"mxfp8_1d": 32, "nvfp4_1d": 16}


def _quantize(x, **kw):
    return jax.jit(lambda x: te_jax.quantize(x, columnwise=True, **kw))(jnp.asarray(x))


def _dims(shape):
    return math.prod(shape[:-1]), shape[-1]


def decode(t: te_jax.ScaledTensor, copy: str) -> np.ndarray:
    """The source-shaped [M, K] values of one copy, decoded here from te's bytes: the copy stored
    [R, C] (row-wise [M, K], column-wise [K, M]) with one scale byte per block of 32 / 16 along its
    rows at scale_inv[r, c // block]; NVFP4 codes two a byte (low nibble first) and its global
    scale 1 / S_enc from the copy's amax entry. The column-wise copy comes back transposed (and
    in the Hadamard domain where it carries the transform)."""
    m, k = _dims(t.shape)
    rows, cols = (m, k) if copy == "rowwise" else (k, m)
    data = np.asarray(t.data if copy == "rowwise" else t.columnwise_data)
    sinv = np.asarray(t.scale_inv if copy == "rowwise" else t.columnwise_scale_inv)
    block = MX_BLOCK[t.scaling_mode]
    blocks = math.ceil(cols / block)
    assert sinv.shape == (math.ceil(rows / 128) * 128, math.ceil(blocks / 4) * 4), sinv.shape
    s = np.repeat(sinv[:rows, :blocks].astype(np.float32), block, axis=1)[:, :cols]
    if t.scaling_mode == "mxfp8_1d":
        assert data.dtype == t.fp8_dtype and data.shape == (tuple(t.shape) if copy == "rowwise" else (k, m))
        values = data.reshape(rows, cols).astype(np.float32) * s
    else:
        assert data.dtype == np.uint8 and data.size == rows * cols // 2
        packed = data.reshape(-1)
        codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(rows, cols)
        q = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
        g = np.asarray(t.amax)[0 if copy == "rowwise" else 1]
        values = (q * s).astype(np.float32) * (np.float32(1.0) / oracle.nvfp4_encode_scale(g))
    return values if copy == "rowwise" else values.T


def _bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def assert_bits(got, want, what):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    bad = np.argwhere(_bits(got) != _bits(want))
    assert bad.size == 0, (
        f"{what}: {len(bad)} differ, first at {bad[0]}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}"
    )


def _source(shape, seed, scale=1.0, dtype=np.float32):
    x = oracle.random_source(np.random.default_rng(seed), shape, np.float32) * np.float32(scale)
    return jnp.asarray(x, dtype)


# ---- MXFP8 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,dtype,tile_2d,src",
    [
        ((64, 96), E4M3, False, jnp.float32),
        ((33, 50), E5M2, False, jnp.float32),
        ((2, 20, 70), E4M3, False, jnp.bfloat16),
        ((33, 50), E4M3, True, jnp.float32),
        ((16, 16), E5M2, True, jnp.float16),
    ],
    ids=str,
)
def test_mxfp8_matches_oracle(shape, dtype, tile_2d, src):
    x = _source(shape, 0, dtype=src)
    x = x.at[(0,) * (len(shape) - 1) + (slice(0, 32),)].set(0)  # an all-zero block: e = 0, values 0
    t = _quantize(x, dtype=dtype, scaling_mode="mxfp8_1d", with_2d_quantization=tile_2d)
    assert t.scale_inv.dtype == jnp.float8_e8m0fnu and t.amax is None and t.scale is None
    x2 = np.asarray(x, np.float32).reshape(_dims(shape))
    want_row = oracle.mxfp8(x2, dtype, square=tile_2d)
    want_col = oracle.mxfp8(x2.T, dtype, square=tile_2d).T
    assert_bits(decode(t, "rowwise"), want_row, "rowwise")
    assert_bits(decode(t, "columnwise"), want_col, "columnwise")
    assert_bits(np.asarray(t.dequantize(jnp.float32)).reshape(x2.shape), want_row, "dequantize")
    col_only = dataclasses.replace(t, data=None, scale_inv=None)
    assert_bits(
        np.asarray(col_only.dequantize(jnp.float32)).reshape(x2.shape), want_col, "dequantize column-wise"
    )


def test_mxfp8_scales_round_up_and_nan():
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 449.0  # amax / 448 just above 1: the scale rounds up to 2, nothing saturates
    x[0, 1] = -3.0
    t = te_jax.quantize(jnp.asarray(x), scaling_mode="mxfp8_1d")
    out = decode(t, "rowwise")
    assert out[0, 0] == 448.0  # 449 / 2 = 224.5 rounds to 224 (E4M3 spacing 16 there), times 2
    assert out[0, 1] == -3.0
    assert np.asarray(t.scale_inv).view(np.uint8)[0, 0] == 128  # 2^(128 - 127)
    x[0, 5] = np.nan
    t = te_jax.quantize(jnp.asarray(x), scaling_mode="mxfp8_1d")
    assert np.asarray(t.scale_inv).view(np.uint8)[0, 0] == 0xFF  # a NaN amax: the NaN scale
    assert np.isnan(np.asarray(t.dequantize())).all()  # the whole block decodes to NaN


# ---- NVFP4 -----------------------------------------------------------------------------------


NVFP4_CASES = [
    ((64, 96), False, False, jnp.float32),
    ((34, 50), False, False, jnp.float32),
    ((34, 50), True, False, jnp.float32),
    ((4, 16, 96), False, True, jnp.bfloat16),
    ((32, 40), False, True, jnp.float32),
]


@pytest.mark.parametrize("shape,tile_2d,rht,src", NVFP4_CASES, ids=str)
def test_nvfp4_matches_oracle(shape, tile_2d, rht, src):
    x = _source(shape, 1, scale=0.01, dtype=src)
    t = _quantize(x, scaling_mode="nvfp4_1d", with_2d_quantization=tile_2d, columnwise_rht=rht)
    assert t.fp8_dtype == np.dtype(jnp.float4_e2m1fn) and t.columnwise_rht == rht
    assert t.scale_inv.dtype == jnp.float8_e4m3fn and t.amax.shape == (2,) and t.scale is None
    x2 = np.asarray(x, np.float32).reshape(_dims(shape))
    want_row = oracle.nvfp4(x2, square=tile_2d)
    if tile_2d:  # one quantization: the column-wise copy is the row-wise one transposed
        want_col = want_row
    else:
        want_col = oracle.nvfp4(oracle.rht(x2.T) if rht else x2.T).T
    assert_bits(decode(t, "rowwise"), want_row, "rowwise")
    assert_bits(decode(t, "columnwise"), want_col, "columnwise")
    g_col = np.abs(oracle.rht(x2.T) if rht else x2).max()
    np.testing.assert_array_equal(np.asarray(t.amax), np.array([np.abs(x2).max(), g_col], np.float32))
    assert_bits(np.asarray(t.dequantize(jnp.float32)).reshape(x2.shape), want_row, "dequantize")
    col = np.asarray(dataclasses.replace(t, data=None, scale_inv=None).dequantize(jnp.float32))
    want = oracle.rht_inverse(want_col.T).T if rht else want_col  # te undoes the transform
    assert_bits(col.reshape(x2.shape), want, "dequantize column-wise")


def test_nvfp4_values_by_hand_and_zero_tensor():
    x = np.array([[6.0, 3.0, 1.5, 0.75, 0.25, -2.5, -6.0, 0.0] * 2], np.float32)
    t = te_jax.quantize(jnp.asarray(x), scaling_mode="nvfp4_1d")
    # amax 6: S_enc = 448, s_block = e4m3(448) = 448, enc = 1: x rounded on the E2M1 grid (RNE,
    # 0.75 -> 1 and 0.25 -> 0 ties to even, -2.5 -> -2), decoded (q * 448) * (1 / 448)
    grid = np.array([[6.0, 3.0, 1.5, 1.0, 0.0, -2.0, -6.0, 0.0] * 2], np.float32)
    assert_bits(
        decode(t, "rowwise"), (grid * np.float32(448.0)) * (np.float32(1.0) / np.float32(448.0)), "by hand"
    )
    zero = te_jax.quantize(jnp.zeros((16, 16)), scaling_mode="nvfp4_1d", columnwise=True)
    assert (decode(zero, "rowwise") == 0).all() and (decode(zero, "columnwise") == 0).all()
    assert np.asarray(zero.amax).tolist() == [0.0, 0.0]


def test_nvfp4_given_global_amax():
    """amax= replaces each copy's own global amax (what a mesh reduces), and comes back as is."""
    x = np.asarray(_source((32, 48), 2, scale=0.01))
    given = jnp.asarray([3 * np.abs(x).max(), 0.5 * np.abs(x).max()], jnp.float32)
    t = _quantize(x, scaling_mode="nvfp4_1d", amax=given)
    np.testing.assert_array_equal(np.asarray(t.amax), np.asarray(given))
    assert_bits(decode(t, "rowwise"), oracle.nvfp4(x, global_amax=given[0]), "rowwise")
    assert_bits(decode(t, "columnwise"), oracle.nvfp4(x.T, global_amax=given[1]).T, "columnwise")


def _seed_offset(key) -> tuple[int, int]:
    """te_jax's documented map of a key to te's Philox (seed, offset): the little-endian uint64
    pairs of jax.random.bits(key, (4,), uint32)."""
    b = [int(v) for v in np.asarray(jax.random.bits(key, (4,), jnp.uint32))]
    return b[0] | b[1] << 32, b[2] | b[3] << 32


def _sr_oracle(x2, key, rht):
    """Both copies of x2 [M, K] rounded stochastically: row-wise element n takes word n, the
    column-wise copy [K, M] word numel + n (te_quant_config)."""
    seed, offset = _seed_offset(key)
    m, k = x2.shape
    n = np.arange(m * k, dtype=np.uint64)
    row = oracle.nvfp4(x2, words=n.reshape(m, k), seed=seed, offset=offset)
    src = oracle.rht(x2.T) if rht else x2.T
    col = oracle.nvfp4(src, words=(m * k + n).reshape(k, m), seed=seed, offset=offset).T
    return row, col


def test_nvfp4_stochastic_rounding_is_te_philox_under_jit():
    x = np.asarray(_source((32, 64), 3, scale=0.01))
    traces = []

    @jax.jit
    def quantize(x, key):
        traces.append(key)
        return te_jax.quantize(x, scaling_mode="nvfp4_1d", columnwise=True, columnwise_rht=True, rng=key)

    outs = []
    for key in (jax.random.PRNGKey(0), jax.random.PRNGKey(1), jax.random.key(7)):
        t = quantize(jnp.asarray(x), key)
        row, col = _sr_oracle(x, key, rht=True)
        assert_bits(decode(t, "rowwise"), row, "rowwise")
        assert_bits(decode(t, "columnwise"), col, "columnwise")
        outs.append(np.asarray(t.data))
    assert len(traces) == 2  # one trace per key type: the seed is data, never baked in
    assert not np.array_equal(outs[0], outs[1])
    again = quantize(jnp.asarray(x), jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(again.data), outs[0])


def test_nvfp4_stochastic_rounding_is_unbiased():
    # every block of 16 holds a 6 (S_enc = s_block = 448: elements are quantized as they are)
    x = jnp.full((16, 64), 1.25, jnp.float32).at[:, ::16].set(6.0)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.jit(lambda k: te_jax.quantize(x, scaling_mode="nvfp4_1d", rng=k))
    values = np.concatenate([np.delete(decode(q(k), "rowwise"), np.s_[::16], axis=1).ravel() for k in keys])
    decoded = {
        (np.float32(v) * np.float32(448.0)) * (np.float32(1.0) / np.float32(448.0)) for v in (1.0, 1.5)
    }
    assert set(np.unique(values)) == decoded  # 1.25's two neighbours
    assert abs(values.mean() - 1.25) < 0.02  # half way: up as often as down


# ---- GEMMs -----------------------------------------------------------------------------------


def _bf16(a) -> np.ndarray:
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("mode", ["mxfp8_1d", "nvfp4_1d"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (False, False), (True, False)])
def test_gemm_reads_the_needed_copy_as_bf16(mode, trans_a, trans_b):
    m, n, k = 64, 48, 96
    x = _source((k, m) if trans_a else (m, k), 4)
    w = _source((n, k) if trans_b else (k, n), 5)
    b = _source((n,), 6)
    qx = te_jax.quantize(x, scaling_mode=mode, columnwise=True)
    qw = te_jax.quantize(w, scaling_mode=mode, columnwise=True)
    d = jax.jit(lambda qx, qw, b: te_jax.gemm(qx, qw, bias=b, trans_a=trans_a, trans_b=trans_b))(qx, qw, b)
    assert d.shape == (m, n) and d.dtype == jnp.float32
    a_ = _bf16(decode(qx, "columnwise" if trans_a else "rowwise"))
    b_ = _bf16(decode(qw, "rowwise" if trans_b else "columnwise"))
    want = (a_.T if trans_a else a_) @ (b_.T if trans_b else b_) + np.asarray(b, np.float64)
    assert _rel(d, want) <= 1e-5
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    exact = (x64.T if trans_a else x64) @ (w64.T if trans_b else w64) + np.asarray(b, np.float64)
    assert _rel(d, exact) <= (0.1 if mode == "mxfp8_1d" else 0.35)


def test_gemm_nvfp4_wgrad_through_the_hadamard_transform():
    """x^T dy from both operands' transformed column-wise copies: the transforms cancel."""
    x, dy = _source((64, 96), 7), _source((64, 32), 8)
    qx, qdy = (
        te_jax.quantize(v, scaling_mode="nvfp4_1d", columnwise=True, columnwise_rht=True) for v in (x, dy)
    )
    dw = te_jax.gemm(qx, qdy, trans_a=True, trans_b=False)
    want = _bf16(decode(qx, "columnwise")).T @ _bf16(decode(qdy, "columnwise"))
    assert _rel(dw, want) <= 1e-5
    assert _rel(dw, np.asarray(x, np.float64).T @ np.asarray(dy, np.float64)) <= 0.35
    plain = te_jax.quantize(dy, scaling_mode="nvfp4_1d", columnwise=True)
    with pytest.raises(Exception, match="columnwise_rht"):
        jax.block_until_ready(te_jax.gemm(qx, plain, trans_a=True, trans_b=False))


# ---- errors ----------------------------------------------------------------------------------


def test_errors():
    x = jnp.zeros((32, 64))
    with pytest.raises(ValueError, match="with_2d_quantization: only for 'mxfp8_1d' and 'nvfp4_1d'"):
        te_jax.quantize(x, scaling_mode="block_1d", with_2d_quantization=True)
    with pytest.raises(ValueError, match="rng: only for 'nvfp4_1d'"):
        te_jax.quantize(x, scaling_mode="mxfp8_1d", rng=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="columnwise_rht: only for 'nvfp4_1d'"):
        te_jax.quantize(x, columnwise_rht=True)
    with pytest.raises(ValueError, match="scaling_mode 'mxfp8_1d' fixes its scale rule"):
        te_jax.quantize(x, scaling_mode="mxfp8_1d", amax_epsilon=1.0)
    with pytest.raises(TypeError, match="dtype: expected one of jnp.float4_e2m1fn, got float8_e4m3fn"):
        te_jax.quantize(x, scaling_mode="nvfp4_1d", dtype=jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="the last dim K must be even, got K = 5"):
        te_jax.quantize(jnp.zeros((4, 5)), scaling_mode="nvfp4_1d")
    with pytest.raises(ValueError, match="need M even"):
        te_jax.quantize(jnp.zeros((3, 4)), scaling_mode="nvfp4_1d", columnwise=True)
    with pytest.raises(ValueError, match="expected M a multiple of 16"):
        te_jax.quantize(jnp.zeros((8, 16)), scaling_mode="nvfp4_1d", columnwise=True, columnwise_rht=True)
    with pytest.raises(ValueError, match="columnwise_rht: not with with_2d_quantization"):
        te_jax.quantize(x, scaling_mode="nvfp4_1d", columnwise_rht=True, with_2d_quantization=True)
    with pytest.raises(ValueError, match=r"amax: expected shape \(2,\) for nvfp4_1d"):
        te_jax.quantize(x, scaling_mode="nvfp4_1d", amax=jnp.zeros((1,)))
    with pytest.raises(ValueError, match="amax: expected None without a scale"):
        te_jax.quantize(x, scaling_mode="mxfp8_1d", amax=jnp.zeros((1,)))
    with pytest.raises(TypeError, match="rng: expected a jax.random key, got int"):
        te_jax.quantize(x, scaling_mode="nvfp4_1d", rng=3)
