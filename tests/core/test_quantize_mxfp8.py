"""MXFP8 (1x32 / 32x1 blocks, E8M0 scales) on the CPU backend against the numpy oracle: data bytes,
scale tables in te/tensor.h's padded layout with the padding untouched, the scale rule on hand-picked
amaxes, special blocks, dequantization round trips, and the errors."""

import re

import _oracle as O
import ml_dtypes
import numpy as np
import pytest
from _buffers import SOURCE_TYPES, assert_bits_equal, assert_fp8_equal, awkward, rng_for, tensor
from _mx import MxQuantized
from te_core import _C

SHAPES = [(1, 1), (7, 13), (1, 33), (33, 1), (64, 96), (2, 3, 40), (130, 257), (0, 5), (5, 0)]


def dtype_id(t):
    return np.dtype(t).name


def oracle(x, fmt, tile_2d):
    rows, cols = O.matrix_dims(x.shape)
    rs = np.full(O.mx_scale_shape("mxfp8", rows, cols), 0xAB, np.uint8)
    cs = np.full(O.mx_scale_shape("mxfp8", cols, rows), 0xAB, np.uint8)
    q_row, q_col = O.quantize_mxfp8(x, fmt, tile_2d, rs, cs)
    return q_row.reshape(x.shape), q_col, rs, cs


def run(x, fmt="e4m3", tile_2d=False, rowwise=True, columnwise=True):
    q = MxQuantized("mxfp8", x.shape, fmt, rowwise=rowwise, columnwise=columnwise)
    return q.quantize(x, _C.QuantConfig(with_2d_quantization=tile_2d))


def check(q, x, tile_2d, what=""):
    q_row, q_col, rs, cs = oracle(x, q.fmt, tile_2d)
    if q.rowwise is not None:
        assert_fp8_equal(q.rowwise, q_row, q.fmt, what + " rowwise")
        assert_bits_equal(q.rowwise_scale_inv, rs, what + " rowwise_scale_inv (padding included)")
    if q.columnwise is not None:
        assert_fp8_equal(q.columnwise, q_col, q.fmt, what + " columnwise")
        assert_bits_equal(q.columnwise_scale_inv, cs, what + " columnwise_scale_inv (padding included)")


@pytest.mark.parametrize("tile_2d", [False, True], ids=["1d", "2d"])
@pytest.mark.parametrize("fmt", [O.E4M3, O.E5M2])
@pytest.mark.parametrize("dtype", SOURCE_TYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_mxfp8_matches_oracle(shape, dtype, fmt, tile_2d):
    x = awkward(rng_for("mxfp8", shape, dtype_id(dtype), fmt, tile_2d), shape, dtype, fmt)
    check(run(x, fmt, tile_2d), x, tile_2d)


def test_mxfp8_scale_rule_by_hand():
    """One 1x32 block per row, its amax chosen: the E8M0 byte is the exponent of amax / 448
    rounded up (hand-computed), so the block's largest element never saturates."""
    amaxes = np.array(
        [448.0, 449.0, 448.0 * 2.0**-3, 3.0, 0.0, np.inf, np.nan, 1e-40, 448.0 * 2.0**100, 2.0**-133],
        np.float32,
    )
    # 448 -> 1.0 exactly: byte 127. 449 -> just above 1: 128. 3 / 448 = 0.0067 lies in
    # [2^-8, 2^-7): 119, rounded up to 120. inf caps at 254, NaN is 255. 1e-40 / 448 and
    # 2^-133 / 448 are fp32 subnormals (exponent bits 0, mantissa set): 1.
    want = [127, 128, 124, 120, 0, 254, 255, 1, 227, 1]
    x = np.zeros((amaxes.size, 32), np.float32)
    x[:, 5] = amaxes
    x[:, 6] = -amaxes / 2
    q = run(x, "e4m3")
    assert q.rowwise_scale_inv[: amaxes.size, 0].tolist() == want
    finite = np.isfinite(amaxes) & (amaxes > 0)
    # q of the amax element: amax / 2^(e - 127) lies in (224, 448] for a normal quotient (224
    # itself after rounding).
    v = O.from_fp8(q.rowwise[:, 5], O.E4M3)
    normal = finite & (amaxes / 448.0 >= 2.0**-126)
    assert (v[normal] <= 448.0).all() and (v[normal] >= 224.0).all()
    # The same rule as 2^ceil(log2(amax / 448)), computed in float64, for normal quotients.
    expect = np.ceil(np.log2(amaxes[normal].astype(np.float64) / 448.0)) + 127
    assert (
        q.rowwise_scale_inv[: amaxes.size, 0][normal].tolist() == np.minimum(expect, 254).astype(int).tolist()
    )


def test_mxfp8_special_blocks():
    """A block's zero, inf, NaN or subnormal amax gives its own scale; its neighbours are unmoved."""
    x = np.ones((4, 96), np.float32)
    x[0, 0:32] = 0.0
    x[1, 32] = np.inf
    x[2, 64] = np.nan
    x[3, 0:32] = np.float32(3e-39)  # subnormal fp32
    q = run(x, "e4m3")
    check(q, x, False)
    s = q.rowwise_scale_inv
    one = O.e8m0_from_amax(np.float32(1.0), 448.0)
    assert s[0, 0] == 0 and (q.rowwise[0, :32] == 0).all()
    assert s[1, 1] == 0xFE and q.rowwise[1, 32] == 0x7E  # inf saturates to +448
    assert s[2, 2] == 0xFF and O.fp8_is_nan(q.rowwise[2, 64:96], O.E4M3).all()  # NaN block
    assert s[3, 0] == 1 and s[1, 0] == one and s[2, 0] == one  # neighbours keep 1.0's scale


@pytest.mark.parametrize("fmt", [O.E4M3, O.E5M2])
def test_mxfp8_columnwise_copy_has_its_own_blocks(fmt):
    """The column-wise copy quantizes 32x1 source blocks: a row of large values scales only the
    blocks of its 32-row band, so the copy is not the transposed row-wise one."""
    x = np.ones((64, 32), np.float32)
    x[0, :] = 448.0 * 16
    q = run(x, fmt)
    check(q, x, False)
    assert (q.columnwise_scale_inv[:32, 0] != q.columnwise_scale_inv[:32, 1]).all()
    assert not np.array_equal(q.columnwise, q.rowwise.T)


def test_mxfp8_2d_copies_are_transposes():
    x = awkward(rng_for("mx2d"), (70, 100), np.float32)
    q = run(x, "e4m3", tile_2d=True)
    assert_fp8_equal(q.columnwise, np.ascontiguousarray(q.rowwise.T), "e4m3", "2-D copies")
    # one scale per 32x32 tile: rows of a band share the row-wise scales
    assert (q.rowwise_scale_inv[0:32, :4] == q.rowwise_scale_inv[0, :4]).all()
    assert (
        q.columnwise_scale_inv[:100, :3] == np.repeat(q.rowwise_scale_inv[0:70:32, :4].T, 32, axis=0)[:100]
    ).all()


@pytest.mark.parametrize("which", ["rowwise", "columnwise"])
def test_mxfp8_either_copy_alone(which):
    x = awkward(rng_for("mx-alone", which), (40, 70), ml_dtypes.bfloat16)
    q = run(x, "e5m2", rowwise=which == "rowwise", columnwise=which == "columnwise")
    check(q, x, False, which)


@pytest.mark.parametrize("out_dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("tile_2d", [False, True], ids=["1d", "2d"])
def test_mxfp8_dequantize_round_trip(out_dtype, tile_2d):
    """te_dequantize of either copy equals the oracle's float(q) * 2^(e-127) rounded to out_dtype,
    and is close to the source (E4M3: relative error <= 2^-4 for elements not far below their
    block's amax)."""
    rng = rng_for("mx-rt", dtype_id(out_dtype), tile_2d)
    x = (rng.standard_normal((96, 160)) * np.exp2(rng.integers(-6, 6, (96, 1)))).astype(np.float32)
    q = run(x, "e4m3", tile_2d)
    q_row, q_col, rs, cs = oracle(x, "e4m3", tile_2d)
    from_row = q.dequantize(out_dtype, "rowwise")
    from_col = q.dequantize(out_dtype, "columnwise")
    with np.errstate(over="ignore"):
        want_row = O.dequantize_mxfp8(q_row, "e4m3", rs).astype(out_dtype)
        want_col = O.dequantize_mxfp8(q_col, "e4m3", cs).T.astype(out_dtype)
    assert_bits_equal(from_row, want_row, "from the row-wise copy")
    assert_bits_equal(from_col, want_col, "from the column-wise copy")
    if tile_2d:
        blk = np.repeat(np.repeat(O.tile_amax(x, 32), 32, axis=0), 32, axis=1)
    else:
        blk = np.repeat(O.block_amax_rows(x, 32), 32, axis=1)
    big = np.abs(x) > blk / 8
    rel = np.abs(from_row.astype(np.float64) - x) / np.abs(x)
    assert rel[big].max() <= 2.0**-4 + 2.0**-8


def test_mxfp8_large():
    rng = rng_for("mx-large")
    x = (rng.standard_normal((1024, 1536)) * np.exp2(rng.integers(-20, 20, (1024, 1)))).astype(
        ml_dtypes.bfloat16
    )
    check(run(x, "e4m3"), x, False, "large")


def test_mxfp8_v1_config_ignores_appended_fields():
    """A te_quant_config from a 0.1.0 caller (struct_size 20) gets the defaults for the fields appended
    later, whatever bytes lie past its end."""
    x = awkward(rng_for("mx-v1"), (64, 64), np.float32)
    cfg = _C.QuantConfig(with_2d_quantization=True)
    cfg.struct_size = 20
    q = MxQuantized("mxfp8", x.shape).quantize(x, cfg)
    check(q, x, False, "v1 config")


def raises(exc, match, x, q, config=None):
    with pytest.raises(exc, match="^te_quantize: " + re.escape(match)):
        _C.quantize(tensor(x), q, config)


def test_mxfp8_errors():
    x = np.zeros((4, 200), np.float32)
    good = MxQuantized("mxfp8", x.shape)

    d = good.descriptor()
    d.rowwise_scale_inv = tensor(np.zeros((128, 8), np.float32))
    raises(ValueError, "output->rowwise_scale_inv.dtype: expected float8_e8m0, got float32", x, d)
    d = good.descriptor()
    d.rowwise_scale_inv = tensor(np.zeros((4, 7), np.uint8), int(_C.DType.FLOAT8_E8M0))
    raises(
        ValueError,
        "output->rowwise_scale_inv.shape: expected [128, 8] (the block-scale layout of te/tensor.h for "
        "this shape), got [4, 7]",
        x,
        d,
    )
    d = good.descriptor()
    d.columnwise_scale_inv = tensor(np.zeros((128, 4), np.uint8), int(_C.DType.FLOAT8_E8M0))
    raises(ValueError, "output->columnwise_scale_inv.shape: expected [256, 4] (the block-scale", x, d)
    d = good.descriptor()
    d.rowwise_data = tensor(np.zeros(400, np.uint8), int(_C.DType.FLOAT4_E2M1), [4, 200])
    raises(ValueError, "output->rowwise_data.dtype: expected float8_e4m3, float8_e5m2, got float4_e2m1", x, d)
    d = good.descriptor()
    d.columnwise_data = tensor(np.zeros((200, 4), np.uint8), int(_C.DType.FLOAT8_E5M2))
    raises(ValueError, "output->columnwise_data.dtype: expected the row-wise copy's float8_e4m3, got", x, d)
    d = good.descriptor()
    d.amax = tensor(np.zeros(1, np.float32))
    raises(ValueError, "output->amax: expected NULL for scaling mode mxfp8_1d", x, d)
    raises(
        ValueError,
        "config->stochastic_rounding: only for nvfp4_1d, got 1 with scaling mode mxfp8_1d",
        x,
        good.descriptor(),
        _C.QuantConfig(stochastic_rounding=True),
    )
    raises(
        ValueError,
        "config->force_pow2_scales: expected 0 for scaling mode mxfp8_1d",
        x,
        good.descriptor(),
        _C.QuantConfig(force_pow2_scales=True),
    )
    raises(
        ValueError,
        "config->amax_epsilon: expected 0 for scaling mode mxfp8_1d",
        x,
        good.descriptor(),
        _C.QuantConfig(amax_epsilon=1.0),
    )
    raises(
        ValueError,
        "config->use_existing_amax: not supported by scaling mode mxfp8_1d",
        x,
        good.descriptor(),
        _C.QuantConfig(compute_scale=True, use_existing_amax=True),
    )
    d = good.descriptor()
    d.columnwise_rht = 1
    raises(ValueError, "output->columnwise_rht: only for nvfp4_1d, got 1 with scaling mode mxfp8_1d", x, d)
    cfg = _C.QuantConfig()
    cfg.with_2d_quantization = 2
    raises(ValueError, "config->with_2d_quantization: expected 0 or 1, got 2", x, good.descriptor(), cfg)
