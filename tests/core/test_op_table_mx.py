"""te_core._ops for MXFP8 / NVFP4: the quantize output specs (shapes from te_quantized_shape, E8M0 /
E4M3 scale dtypes, NVFP4's [2] amax, E2M1 storage), and buffers allocated from them running through
the flat entry points the bindings call (quantize_flat, dequantize_flat, gemm_flat), against the
oracle."""

import _oracle as O
import numpy as np
import pytest
from _buffers import ALIVE, assert_bits_equal, rng_for
from te_core import _C, _ops

D = _C.DType
E4M3 = int(D.FLOAT8_E4M3)


@pytest.mark.parametrize("shape", [(6, 40), (2, 3, 64), (1, 2)], ids=str)
@pytest.mark.parametrize("family", ["mxfp8_1d", "nvfp4_1d"])
def test_quantize_outputs_mx(family, shape):
    mode = _ops.MX_SCALING_MODES[family]
    data_dtype = _ops.FLOAT4_E2M1 if family == "nvfp4_1d" else E4M3
    specs = _ops.quantize_outputs(shape, mode, data_dtype, True, True, False)
    P = _C.Part
    for i, part in enumerate(
        [P.ROWWISE_DATA, P.ROWWISE_SCALE_INV, P.COLUMNWISE_DATA, P.COLUMNWISE_SCALE_INV]
    ):
        assert specs[i].shape == _C.quantized_shape(mode, int(part), list(shape))
    scale = int(D.FLOAT8_E4M3 if family == "nvfp4_1d" else D.FLOAT8_E8M0)
    assert [s.dtype for s in specs[:4]] == [data_dtype, scale, data_dtype, scale]
    if family == "nvfp4_1d":
        assert specs[4] == _ops.TensorSpec((2,), _ops.FLOAT32) and specs[5].shape == _ops.ABSENT_SHAPE
        assert _ops.storage_shape(specs[0]) == tuple(shape[:-1]) + (shape[-1] // 2,)
    else:
        assert specs[4].shape == specs[5].shape == _ops.ABSENT_SHAPE
        assert _ops.storage_shape(specs[0]) == tuple(shape)


def test_storage_shape_rejects_odd_e2m1_rows():
    with pytest.raises(ValueError, match=r"^shape: float4_e2m1 packs two elements per byte .*got \(4, 5\)"):
        _ops.storage_shape(_ops.TensorSpec((4, 5), _ops.FLOAT4_E2M1))


def alloc(spec):
    """A zeroed uint8/fp32 numpy buffer for a spec, in its storage shape."""
    dt = np.float32 if spec.dtype == _ops.FLOAT32 else np.uint8
    return np.zeros(_ops.storage_shape(spec), dt)


def flat(arr, spec):
    """(ptr, dtype, logical shape, device) as the flat entry points take a tensor."""
    ALIVE.append(arr)  # kept alive for the test
    return (arr.ctypes.data, spec.dtype, tuple(spec.shape), -1)


def test_flat_entry_points_nvfp4():
    rng = rng_for("flat-nvfp4")
    x = rng.standard_normal((32, 48)).astype(np.float32)
    mode = _ops.MX_SCALING_MODES["nvfp4_1d"]
    specs = _ops.quantize_outputs(x.shape, mode, _ops.FLOAT4_E2M1, True, True, False)
    rd, rs, cd, cs, amax = (alloc(s) for s in specs[:5])
    ALIVE.extend([x, rd, rs, cd, cs])
    _C.quantize_flat(
        x.ctypes.data, int(D.FLOAT32), x.shape, -1, mode, _ops.FLOAT4_E2M1,
        rd.ctypes.data, rs.ctypes.data, specs[1].shape, cd.ctypes.data, specs[2].shape,
        cs.ctypes.data, specs[3].shape, flat(amax, specs[4]), None, None, 0, columnwise_rht=True,
    )  # fmt: skip
    want_rs, want_cs = np.zeros_like(rs), np.zeros_like(cs)
    q_row, q_col, want_amax = O.quantize_nvfp4(x, want_rs, want_cs, rht=True)
    assert_bits_equal(rd, O.pack_e2m1(q_row).reshape(rd.shape), "row-wise data")
    assert_bits_equal(cd, O.pack_e2m1(q_col).reshape(cd.shape), "column-wise data (transformed)")
    assert_bits_equal(rs, want_rs)
    assert_bits_equal(cs, want_cs)
    assert_bits_equal(amax, want_amax)

    out = np.zeros(x.shape, np.float32)
    _C.dequantize_flat(
        mode, None, None, flat(cd, specs[2]), flat(cs, specs[3]), flat(out, _ops.TensorSpec(x.shape, _ops.FLOAT32)),
        0, amax=flat(amax, specs[4]), columnwise_rht=True,
    )  # fmt: skip
    want = O.rht_inverse(O.dequantize_nvfp4(q_col, want_cs, want_amax[1])).T
    assert_bits_equal(out, np.ascontiguousarray(want), "dequantized through the inverse transform")

    # wgrad-shaped product of the column-wise copies: x^T x over the 32 transformed rows
    d = np.zeros((48, 48), np.float32)
    cfg = _C.GemmConfig(trans_a=True)
    a = (mode, None, None, flat(cd, specs[2]), flat(cs, specs[3]))
    _C.gemm_flat(
        *a, *a, flat(d, _ops.TensorSpec((48, 48), _ops.FLOAT32)), cfg, None, None, None, 0,
        a_amax=flat(amax, specs[4]), b_amax=flat(amax, specs[4]), a_rht=True, b_rht=True,
    )  # fmt: skip
    v = O.dequantize_nvfp4(q_col, want_cs, want_amax[1]).astype(O.ml_dtypes.bfloat16).astype(np.float64)
    want = v @ v.T
    assert np.linalg.norm(d - want) <= 1e-5 * np.linalg.norm(want)


def test_flat_quantize_mxfp8():
    x = rng_for("flat-mxfp8").standard_normal((40, 70)).astype(np.float32)
    mode = _ops.MX_SCALING_MODES["mxfp8_1d"]
    specs = _ops.quantize_outputs(x.shape, mode, E4M3, True, False, False)
    rd, rs = alloc(specs[0]), alloc(specs[1])
    ALIVE.extend([x, rd, rs])
    _C.quantize_flat(
        x.ctypes.data, int(D.FLOAT32), x.shape, -1, mode, E4M3, rd.ctypes.data, rs.ctypes.data,
        specs[1].shape, 0, None, 0, None, None, None, None, 0,
    )  # fmt: skip
    want_rs = np.zeros_like(rs)
    q_row, _ = O.quantize_mxfp8(
        x, "e4m3", False, want_rs, np.zeros(O.mx_scale_shape("mxfp8", 70, 40), np.uint8)
    )
    assert_bits_equal(rd, q_row)
    assert_bits_equal(rs, want_rs)
