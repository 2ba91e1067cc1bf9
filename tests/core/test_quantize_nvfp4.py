"""NVFP4 (E2M1 data, 1x16 E4M3 block scales, fp32 global amaxes) on the CPU backend against the numpy
oracle: packed data, scale tables with the padding untouched, amaxes; 16x16 tiles, stochastic
rounding (Philox4x32-10), the random Hadamard transform; the oracle's own pieces against known
answers; dequantization round trips; the errors."""

import re

import _oracle as O
import ml_dtypes
import numpy as np
import pytest
from _buffers import SOURCE_TYPES, assert_bits_equal, assert_float_equal, awkward, rng_for, tensor
from _mx import MxQuantized
from te_core import _C

SHAPES = [(2, 2), (6, 14), (2, 34), (34, 2), (64, 96), (2, 3, 40), (130, 258), (0, 4), (4, 0)]
RHT_SHAPES = [(16, 2), (32, 50), (2, 8, 34), (160, 96)]


def dtype_id(t):
    return np.dtype(t).name


def oracle(x, tile_2d=False, rht=False, sr=False, seed=0, offset=0):
    rows, cols = O.matrix_dims(x.shape)
    rs = np.full(O.mx_scale_shape("nvfp4", rows, cols), 0xAB, np.uint8)
    cs = np.full(O.mx_scale_shape("nvfp4", cols, rows), 0xAB, np.uint8)
    q_row, q_col, amax = O.quantize_nvfp4(x, rs, cs, tile_2d, rht, sr, seed, offset)
    return q_row, q_col, rs, cs, amax


def config(tile_2d=False, sr=False, seed=0, offset=0, existing=False):
    return _C.QuantConfig(
        compute_scale=existing,
        use_existing_amax=existing,
        with_2d_quantization=tile_2d,
        stochastic_rounding=sr,
        rng_seed=seed,
        rng_offset=offset,
    )


def run(x, tile_2d=False, rht=False, sr=False, seed=0, offset=0, rowwise=True, columnwise=True):
    q = MxQuantized("nvfp4", x.shape, rowwise=rowwise, columnwise=columnwise, rht=rht)
    return q.quantize(x, config(tile_2d, sr, seed, offset))


def check(q, x, tile_2d=False, rht=False, sr=False, seed=0, offset=0, what=""):
    q_row, q_col, rs, cs, amax = oracle(x, tile_2d, rht, sr, seed, offset)
    if q.rowwise is not None:
        assert_bits_equal(q.rowwise, O.pack_e2m1(q_row), what + " rowwise")
        assert_bits_equal(q.rowwise_scale_inv, rs, what + " rowwise_scale_inv (padding included)")
        assert_float_equal(q.amax[:1], amax[:1], what + " amax[0]")
    if q.columnwise is not None:
        assert_bits_equal(q.columnwise, O.pack_e2m1(q_col), what + " columnwise")
        assert_bits_equal(q.columnwise_scale_inv, cs, what + " columnwise_scale_inv (padding included)")
        assert_float_equal(q.amax[1:], amax[1:], what + " amax[1]")


# ---- the oracle's pieces against known answers ---------------------------------------------------


def test_oracle_philox_known_answers():
    """Random123's published known-answer vectors for philox4x32 with 10 rounds."""
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ]
    for ctr, key, want in cases:
        got = O.philox4x32_10(np.array([ctr], np.uint32), key)[0]
        assert [int(v) for v in got] == list(want)


def test_oracle_butterfly_is_the_hadamard_matrix():
    """The fp32 butterfly computes x (1/4) diag(s) H16 (to fp32 rounding), and its inverse undoes it."""
    rng = rng_for("rht-matrix")
    x = rng.standard_normal((200, 16)).astype(np.float32)
    want = x.astype(np.float64) @ O.hadamard_matrix()
    np.testing.assert_allclose(O.rht_forward(x), want, rtol=0, atol=4e-6 * np.abs(x).max())
    np.testing.assert_allclose(O.rht_inverse(O.rht_forward(x)), x, rtol=0, atol=4e-6 * np.abs(x).max())
    h = O.hadamard_matrix()
    np.testing.assert_allclose(h @ h.T, np.eye(16), atol=1e-15)  # orthogonal: transforms cancel


def test_oracle_e2m1_by_hand():
    v = np.array(
        [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.1, -0.0, np.inf, -np.inf, np.nan, 0.26], np.float32
    )
    assert O.to_e2m1(v).tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 8, 8, 7, 15, 7, 1]
    # stochastic: 0.25 is half way between 0 and 0.5: up iff u < 2^31
    assert O.to_e2m1_stochastic(np.float32([0.25, 0.25]), np.array([2**31 - 1, 2**31])).tolist() == [1, 0]
    assert O.to_e2m1_stochastic(np.float32([5.0, -3.0, 7.0]), np.array([2**31 - 1, 0, 0])).tolist() == [
        7,
        13,
        7,
    ]


# ---- te against the oracle ------------------------------------------------------------------------


@pytest.mark.parametrize("tile_2d", [False, True], ids=["1d", "2d"])
@pytest.mark.parametrize("dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_nvfp4_matches_oracle(shape, dtype, tile_2d):
    x = awkward(rng_for("nvfp4", shape, dtype_id(dtype), tile_2d), shape, dtype, specials=True)
    x = np.where(np.isnan(x.astype(np.float32)), np.float32(1.0), x).astype(dtype)  # NaN: its own test
    check(run(x, tile_2d), x, tile_2d)


@pytest.mark.parametrize("dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", RHT_SHAPES, ids=str)
def test_nvfp4_hadamard_columnwise(shape, dtype):
    x = awkward(rng_for("nvfp4-rht", shape, dtype_id(dtype)), shape, dtype, specials=False)
    q = run(x, rht=True)
    check(q, x, rht=True)
    assert q.amax[1] != q.amax[0]  # the column-wise amax is taken after the transform


@pytest.mark.parametrize("tile_2d", [False, True], ids=["1d", "2d"])
@pytest.mark.parametrize("shape", [(6, 14), (64, 96), (130, 258)], ids=str)
def test_nvfp4_stochastic_rounding(shape, tile_2d):
    x = awkward(rng_for("nvfp4-sr", shape, tile_2d), shape, np.float32, specials=False)
    seed, offset = 0x1234_5678_9ABC_DEF0, 77
    q = run(x, tile_2d, sr=True, seed=seed, offset=offset)
    check(q, x, tile_2d, sr=True, seed=seed, offset=offset)
    again = run(x, tile_2d, sr=True, seed=seed, offset=offset)
    assert_bits_equal(again.rowwise, q.rowwise, "same (seed, offset), same bits")
    other = run(x, tile_2d, sr=True, seed=seed, offset=offset + 1)
    assert not np.array_equal(other.rowwise, q.rowwise)


@pytest.mark.parametrize("tile_2d", [False, True], ids=["1d", "2d"])
def test_nvfp4_rng_state_on_the_device_is_the_seed_and_offset(tile_2d):
    """config->rng_state {seed, offset} (int64 [2], read where the kernel runs) gives the bits that
    rng_seed / rng_offset give, and overrides them."""
    x = awkward(rng_for("nvfp4-rng-state", tile_2d), (32, 48), np.float32, specials=False)
    seed, offset = 0xFEDC_BA98_7654_3210, 2**40 + 5
    want = run(x, tile_2d, sr=True, seed=seed, offset=offset)
    state = np.array([seed, offset], np.uint64).view(np.int64)
    cfg = config(tile_2d, sr=True, seed=1, offset=2)  # ignored: rng_state wins
    cfg.rng_state = tensor(state, int(_C.DType.INT64))
    got = MxQuantized("nvfp4", x.shape).quantize(x, cfg)
    assert_bits_equal(got.rowwise, want.rowwise, "rowwise")
    assert_bits_equal(got.columnwise, want.columnwise, "columnwise")


def test_nvfp4_stochastic_rounding_is_unbiased():
    """Averaged over many offsets, stochastically rounded values approach the source; round to
    nearest keeps its bias."""
    rng = rng_for("nvfp4-sr-mean")
    x = np.repeat((rng.random((1, 64)) * 6).astype(np.float32), 2, axis=0)
    x[:, 0] = 6.0  # pins the global and block amaxes: S_enc = 448, blocks scaled by 448/448
    draws = [run(x, sr=True, seed=3, offset=k, columnwise=False).dequantize() for k in range(400)]
    mean = np.mean(draws, axis=0)
    nearest = run(x, columnwise=False).dequantize()
    sr_err = np.abs(mean - x).mean()
    rn_err = np.abs(nearest - x).mean()
    assert sr_err < rn_err / 4, (sr_err, rn_err)


def test_nvfp4_scales_by_hand():
    """Global amax 6 gives S_enc = 448; a block with amax 6 gets s_block = E4M3(448) and codes
    x * 1; a block with amax 3 gets E4M3(224); an all-zero block gets scale 0 and codes 0."""
    x = np.zeros((2, 48), np.float32)
    x[0, :16] = np.linspace(-6, 6, 16, dtype=np.float32)
    x[0, 16:32] = np.float32([3.0, -1.5, 0.75, 0.25] * 4)
    q = run(x, columnwise=False)
    assert q.amax[0] == 6.0
    s = q.rowwise_scale_inv
    assert (
        s[0, 0] == 0x7E and s[0, 1] == O.to_fp8(np.float32(224.0), O.E4M3) and s[0, 2] == 0 and s[1, 0] == 0
    )
    codes = O.unpack_e2m1(q.rowwise, (2, 48))
    assert codes[0, 16:20].tolist() == [0b0111, 0b1101, 0b0011, 0b0001]  # x / 0.5: 6, -3, 1.5, 0.5
    assert (codes[0, 32:] == 0).all() and (codes[1] == 0).all()


@pytest.mark.parametrize("amax", [0.0, np.inf, np.nan])
def test_nvfp4_special_global_amax(amax):
    """amax 0: S_enc 1 and zero codes; inf: S_enc 1, the inf saturates; NaN: every scale is NaN, so
    the whole tensor decodes to NaN, and amax reports it."""
    x = np.zeros((4, 32), np.float32)
    if amax != 0:
        x[:, 1] = 1.0
        x[0, 0] = amax
    q = run(x)
    check(q, x)
    deq = q.dequantize()
    if np.isnan(amax):
        assert np.isnan(q.amax).all() and (q.rowwise_scale_inv[:4, :2] == 0x7F).all() and np.isnan(deq).all()
    elif np.isinf(amax):
        # S_enc 1: the inf block's scale saturates to 448 and its inf to 6; row 1 keeps 1.0 to
        # E4M3 scale and E2M1 rounding ((1 / 6) -> 0.171875, 1 / 0.171875 -> 6: 1.03125)
        assert q.amax[0] == np.inf and deq[0, 0] == 2688.0 and deq[1, 1] == 1.03125
    else:
        assert (q.amax == 0).all() and (deq == 0).all() and (q.rowwise_scale_inv[:4, :2] == 0).all()


def test_nvfp4_subnormal_blocks():
    """Blocks far below the global amax get E4M3-subnormal or zero scales and still round trip."""
    x = np.ones((2, 64), np.float32)
    x[:, 0] = 2.0**10
    x[:, 16:32] = 2.0**-6  # block scale (2^-6 / 6) * (2688 / 2^10) = 0.0068: an E4M3 subnormal
    x[:, 32:48] = 2.0**-30  # rounds to a zero scale: codes 0
    q = run(x)
    check(q, x)
    assert (q.rowwise_scale_inv[:2, 1] < 8).all() and (q.rowwise_scale_inv[:2, 1] > 0).all()
    assert (q.rowwise_scale_inv[:2, 2] == 0).all()
    deq = q.dequantize()
    np.testing.assert_allclose(deq[:, 16:32], x[:, 16:32], rtol=0.25)
    assert (deq[:, 32:48] == 0).all()


def test_nvfp4_2d_copies_are_transposes():
    x = awkward(rng_for("nv2d"), (48, 80), np.float32, specials=False)
    q = run(x, tile_2d=True)
    row = O.unpack_e2m1(q.rowwise, (48, 80))
    col = O.unpack_e2m1(q.columnwise, (80, 48))
    assert_bits_equal(col, np.ascontiguousarray(row.T), "2-D copies")
    assert (q.rowwise_scale_inv[0:16, :5] == q.rowwise_scale_inv[0, :5]).all()


def test_nvfp4_use_existing_amax():
    x = awkward(rng_for("nv-existing"), (32, 64), np.float32, specials=False)
    q = MxQuantized("nvfp4", x.shape)
    given = np.float32([4.0, 8.0]) * O.amax(x)
    q.amax[:] = given
    q.quantize(x, config(existing=True))
    assert_bits_equal(q.amax, given, "amax is read, not written")
    rs = np.full_like(q.rowwise_scale_inv, 0xAB)
    codes = O._nvfp4_copy(x, O.block_amax_rows(x, 16), O.nvfp4_encode_scale(given[0]), rs)
    assert_bits_equal(q.rowwise, O.pack_e2m1(codes), "row-wise with amax[0]")
    assert_bits_equal(q.rowwise_scale_inv, rs)
    t = np.ascontiguousarray(x.T)
    cs = np.full_like(q.columnwise_scale_inv, 0xAB)
    codes = O._nvfp4_copy(t, O.block_amax_rows(t, 16), O.nvfp4_encode_scale(given[1]), cs)
    assert_bits_equal(q.columnwise, O.pack_e2m1(codes), "column-wise with amax[1]")


@pytest.mark.parametrize("which", ["rowwise", "columnwise"])
def test_nvfp4_either_copy_alone(which):
    x = awkward(rng_for("nv-alone", which), (48, 70), ml_dtypes.bfloat16, specials=False)
    q = run(x, rowwise=which == "rowwise", columnwise=which == "columnwise")
    check(q, x, what=which)
    untouched = q.amax[1] if which == "rowwise" else q.amax[0]
    assert untouched.view(np.uint32) == 0x7FBADBAD  # the absent copy's amax entry is not written


def test_nvfp4_rowwise_only_odd_rows():
    """Only a stored row's length must be even: M = 7 is fine without a column-wise copy."""
    x = awkward(rng_for("nv-odd-m"), (7, 20), np.float16, specials=False)
    check(run(x, columnwise=False), x)


@pytest.mark.parametrize("out_dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
def test_nvfp4_dequantize_round_trip(out_dtype, rht):
    """te_dequantize of either copy equals the oracle's (q * s_block) * s_global (transformed back
    for an RHT copy) rounded to out_dtype, and is near the source."""
    rng = rng_for("nv-rt", dtype_id(out_dtype), rht)
    x = (rng.standard_normal((64, 96)) * np.exp2(rng.integers(-4, 4, (64, 1)))).astype(np.float32)
    q = run(x, rht=rht)
    q_row, q_col, rs, cs, amax = oracle(x, rht=rht)
    want_row = O.dequantize_nvfp4(q_row, rs, amax[0])
    want_col = O.dequantize_nvfp4(q_col, cs, amax[1])
    if rht:
        want_col = O.rht_inverse(want_col)
    assert_bits_equal(
        q.dequantize(out_dtype, "rowwise"), want_row.astype(out_dtype), "from the row-wise copy"
    )
    assert_bits_equal(
        q.dequantize(out_dtype, "columnwise"), want_col.T.astype(out_dtype), "from the column-wise copy"
    )
    for got in (want_row, want_col.T):
        err = np.linalg.norm(got - x) / np.linalg.norm(x)
        assert err < 0.12, err


def test_nvfp4_v1_descriptor_ignores_columnwise_rht():
    """A te_quantized_tensor from a 0.1.0 caller (struct_size 536) has no columnwise_rht: 0."""
    x = awkward(rng_for("nv-v1"), (32, 32), np.float32, specials=False)
    q = MxQuantized("nvfp4", x.shape)
    d = q.descriptor()
    d.columnwise_rht = 1
    d.struct_size = 536
    _C.quantize(tensor(x), d, config())
    check(q, x, rht=False, what="v1 descriptor")


def raises(exc, match, x, q, cfg=None):
    with pytest.raises(exc, match="^te_quantize: " + re.escape(match)):
        _C.quantize(tensor(x), q, cfg)


def test_nvfp4_errors():
    x = np.zeros((20, 64), np.float32)
    good = MxQuantized("nvfp4", x.shape)
    E2M1 = int(_C.DType.FLOAT4_E2M1)

    odd_k = np.zeros((4, 5), np.float32)
    raises(
        ValueError,
        "output->rowwise_data.shape: float4_e2m1 packs two elements per byte and each stored row must "
        "start on a byte, so K (the last dim) must be even, got K (the last dim) = 5",
        odd_k,
        MxQuantized("nvfp4", (4, 6), columnwise=False)
        .descriptor()
        .__class__(
            int(_C.ScalingMode.NVFP4_1D),
            rowwise_data=tensor(np.zeros(10, np.uint8), E2M1, [4, 5]),
            rowwise_scale_inv=tensor(np.zeros((128, 4), np.uint8), int(_C.DType.FLOAT8_E4M3)),
            amax=tensor(np.zeros(2, np.float32)),
        ),
    )
    odd_m = MxQuantized("nvfp4", (3, 4), rowwise=False)
    odd_m.columnwise = np.zeros(6, np.uint8)
    raises(
        ValueError,
        "output->columnwise_data.shape: float4_e2m1 packs two elements per byte and each stored row "
        "must start on a byte, so M (the input's rows) must be even, got M (the input's rows) = 3",
        np.zeros((3, 4), np.float32),
        odd_m.descriptor(),
    )
    d = good.descriptor()
    d.amax = _C.Tensor(0, 0, [])
    raises(
        ValueError,
        "output->amax: nvfp4_1d needs the fp32 [2] global amaxes (row-wise, column-wise), got NULL",
        x,
        d,
    )
    d = good.descriptor()
    d.amax = tensor(np.zeros(1, np.float32))
    raises(ValueError, "output->amax.shape: expected 2 elements, got [1]", x, d)
    d = good.descriptor()
    d.scale = tensor(np.zeros(1, np.float32))
    raises(
        ValueError, "output->scale: expected NULL for scaling mode nvfp4_1d (its global scales derive", x, d
    )
    d = good.descriptor()
    d.rowwise_scale_inv = tensor(np.zeros((128, 4), np.uint8), int(_C.DType.FLOAT8_E8M0))
    raises(ValueError, "output->rowwise_scale_inv.dtype: expected float8_e4m3, got float8_e8m0", x, d)
    d = good.descriptor()
    d.rowwise_data = tensor(np.zeros((20, 64), np.uint8), int(_C.DType.FLOAT8_E4M3))
    raises(ValueError, "output->rowwise_data.dtype: expected float4_e2m1, got float8_e4m3", x, d)
    raises(
        ValueError,
        "output->columnwise_rht: the Hadamard transform runs over 16 rows of the input at a time, so M "
        "(the input's rows) must be a multiple of 16, got M = 20",
        x,
        MxQuantized("nvfp4", x.shape, rht=True).descriptor(),
    )
    raises(
        ValueError,
        "output->columnwise_rht: not with config->with_2d_quantization",
        np.zeros((32, 64), np.float32),
        MxQuantized("nvfp4", (32, 64), rht=True).descriptor(),
        config(tile_2d=True),
    )
    raises(
        ValueError,
        "config->force_pow2_scales: expected 0 for scaling mode nvfp4_1d",
        x,
        good.descriptor(),
        _C.QuantConfig(force_pow2_scales=True),
    )
    cfg = _C.QuantConfig()
    cfg.stochastic_rounding = 3
    raises(ValueError, "config->stochastic_rounding: expected 0 or 1, got 3", x, good.descriptor(), cfg)
    state = np.zeros(2, np.int64)
    raises(
        ValueError,
        "config->rng_state: only read with stochastic_rounding = 1, got a buffer with 0",
        x,
        good.descriptor(),
        _C.QuantConfig(rng_state=tensor(state, int(_C.DType.INT64))),
    )
    raises(
        ValueError,
        "config->rng_state.dtype: expected int64, got int32",
        x,
        good.descriptor(),
        _C.QuantConfig(
            stochastic_rounding=True, rng_state=tensor(np.zeros(4, np.int32), int(_C.DType.INT32))
        ),
    )
    raises(
        ValueError,
        "config->rng_state.shape: expected 2 elements, got [3]",
        x,
        good.descriptor(),
        _C.QuantConfig(
            stochastic_rounding=True, rng_state=tensor(np.zeros(3, np.int64), int(_C.DType.INT64))
        ),
    )
