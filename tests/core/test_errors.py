"""Every error path of the C API through te_core._C: a ValueError (bad argument) or
NotImplementedError (this build cannot) whose message names the argument and says what was expected
and what was given. The process never crashes, and a failed call writes nothing."""

import re

import numpy as np
import pytest
from _buffers import DATA_SENTINEL, f32, fp8_buffer, tensor
from te_core import _C

D, M, P = _C.DType, _C.ScalingMode, _C.Part
E4M3 = int(D.FLOAT8_E4M3)


def pt_output(rows=4, cols=8, **over):
    """A valid PER_TENSOR delayed-scaling output for a [rows, cols] input; keyword overrides."""
    keep = dict(
        rw=fp8_buffer((rows, cols)),
        cw=fp8_buffer((cols, rows)),
        rs=f32(),
        cs=f32(),
        amax=f32(),
        scale=f32(1.0),
    )
    parts = dict(
        rowwise_data=tensor(keep["rw"], E4M3),
        rowwise_scale_inv=tensor(keep["rs"]),
        columnwise_data=tensor(keep["cw"], E4M3),
        columnwise_scale_inv=tensor(keep["cs"]),
        amax=tensor(keep["amax"]),
        scale=tensor(keep["scale"]),
    )
    parts.update(over)
    return _C.QuantizedTensor(
        int(over.pop("mode", M.PER_TENSOR)), **{k: v for k, v in parts.items() if k != "mode"}
    ), keep


def block_output(mode, rows=4, cols=8, **over):
    keep = dict(rw=fp8_buffer((rows, cols)), cw=fp8_buffer((cols, rows)))
    rs_shape = _C.quantized_shape(int(mode), int(P.ROWWISE_SCALE_INV), [rows, cols])
    cs_shape = _C.quantized_shape(int(mode), int(P.COLUMNWISE_SCALE_INV), [rows, cols])
    keep.update(rs=np.zeros(rs_shape, np.float32), cs=np.zeros(cs_shape, np.float32))
    parts = dict(
        rowwise_data=tensor(keep["rw"], E4M3),
        rowwise_scale_inv=tensor(keep["rs"]),
        columnwise_data=tensor(keep["cw"], E4M3),
        columnwise_scale_inv=tensor(keep["cs"]),
    )
    parts.update(over)
    return _C.QuantizedTensor(int(mode), **parts), keep


X = np.ones((4, 8), np.float32)


def raises(exc, pattern, fn, *args, **kw):
    with pytest.raises(exc, match=pattern) as info:
        fn(*args, **kw)
    # an error from the C layer carries te_last_error()'s text, prefixed with the entry point (the
    # binding's own checks of list lengths and ndim come before any C call)
    if str(info.value).startswith("te_"):
        assert str(info.value) == _C.last_error()
    else:
        assert re.match(r"(scales|shape|groups\[\d+\]): expected", str(info.value)), str(info.value)
    return info.value


def q(x, out, config=None):
    return _C.quantize(tensor(x) if isinstance(x, np.ndarray) else x, out, config)


def test_valid_baseline_succeeds():
    out, keep = pt_output()
    q(X, out)
    assert (keep["rw"] == 0x38).all()  # 1.0 in E4M3: the fixtures themselves are valid


# ---- te_quantize --------------------------------------------------------------------------------


def test_null_input_data_with_elements():
    out, keep = pt_output()
    raises(
        ValueError,
        re.escape("te_quantize: input.data: expected a pointer to 32 elements, got NULL"),
        q,
        _C.Tensor(0, int(D.FLOAT32), [4, 8]),
        out,
    )
    assert (keep["rw"] == DATA_SENTINEL).all() and keep["amax"][0] == 0  # nothing written


def test_null_output_data_with_elements():
    out, _ = pt_output(rowwise_scale_inv=_C.Tensor(0, int(D.FLOAT32), [1]))
    raises(
        ValueError,
        re.escape("output->rowwise_scale_inv.data: expected a pointer to 1 elements, got NULL"),
        q,
        X,
        out,
    )


@pytest.mark.parametrize(
    "dtype,name", [(D.INT32, "int32"), (D.FLOAT8_E4M3, "float8_e4m3"), (D.UINT8, "uint8")]
)
def test_wrong_input_dtype(dtype, name):
    out, _ = pt_output()
    buf = np.zeros((4, 8), np.int32)
    raises(
        ValueError,
        re.escape(f"input.dtype: expected float32, float16, bfloat16, got {name}"),
        q,
        tensor(buf, int(dtype)),
        out,
    )
    raises(
        ValueError,
        re.escape(f"input.dtype: expected float32, float16, bfloat16, got {name}"),
        _C.amax,
        tensor(buf, int(dtype)),
        tensor(f32()),
    )


def test_unknown_dtype_value():
    out, _ = pt_output()
    raises(
        ValueError, re.escape("input.dtype: expected a te_dtype value 0..9, got 42"), q, tensor(X, 42), out
    )
    # the argument is named wherever the bad dtype is, not only on the first tensor checked
    raises(
        ValueError,
        re.escape("te_amax: amax.dtype: expected a te_dtype value 0..9, got -1"),
        _C.amax,
        tensor(X),
        tensor(f32(), -1),
    )


def test_element_count_overflow():
    """A shape whose product overflows int64 once wrapped to 0 elements: a NULL buffer passed as
    "empty" and the kernels then walked 2^32 x 2^32 elements (quantize, transpose: SIGSEGV), or
    te_amax silently wrote 0."""
    huge = [2**32, 2**32]
    out = _C.QuantizedTensor(
        int(M.PER_TENSOR),
        rowwise_data=_C.Tensor(0, E4M3, huge),
        rowwise_scale_inv=tensor(f32()),
        scale=tensor(f32(1.0)),
    )
    msg = re.escape(
        "input.shape: expected a size whose element and byte counts fit in int64, got [4294967296, 4294967296]"
    )
    raises(ValueError, "te_quantize: " + msg, q, _C.Tensor(0, int(D.FLOAT32), huge), out)
    amax = f32(5.0)
    raises(ValueError, "te_amax: " + msg, _C.amax, _C.Tensor(0, int(D.FLOAT32), huge), tensor(amax))
    assert amax[0] == 5.0
    raises(
        ValueError, "te_transpose: " + msg, _C.transpose, _C.Tensor(0, E4M3, huge), _C.Tensor(0, E4M3, huge)
    )
    # elements fit, bytes do not
    raises(
        ValueError,
        re.escape(
            "input.shape: expected a size whose element and byte counts fit in int64, got [2305843009213693952]"
        ),
        _C.amax,
        _C.Tensor(0, int(D.FLOAT32), [2**61]),
        tensor(f32()),
    )
    raises(
        ValueError,
        re.escape("te_quantized_shape: shape: expected an element count that fits in int64, got"),
        _C.quantized_shape,
        int(M.BLOCK_1D),
        int(P.ROWWISE_SCALE_INV),
        [2**62, 2**62],
    )
    # the packed-copy sizes of the fused steps come from the same layout query (they were (4, 4))
    with pytest.raises(ValueError, match=re.escape("expected an element count that fits in int64")):
        _C.packed_bytes(int(M.PER_TENSOR), E4M3, (2**62, 2**62))
    with pytest.raises(ValueError, match=re.escape("expected a size whose byte count fits in int64")):
        _C.packed_bytes(int(M.PER_TENSOR), int(D.FLOAT32), (2**61,))


def test_in_place_is_refused():
    """Ops whose output overwrites what they still read refuse an overlapping output instead of
    writing garbage (an in-place te_transpose of [2, 3] gave [0 3 1 1 1 5])."""
    a = np.arange(6, dtype=np.uint8).reshape(2, 3)
    overlap = re.escape(
        "output.data: expected a buffer separate from input's (this op does not work in place)"
    )
    raises(
        ValueError,
        "te_transpose: " + overlap,
        _C.transpose,
        tensor(a, int(D.UINT8)),
        _C.Tensor(a.ctypes.data, int(D.UINT8), [3, 2]),
    )
    assert (a.ravel() == np.arange(6)).all()  # nothing written
    x = np.ones((4, 8), np.float32)
    out, keep = pt_output(columnwise_data=_C.Tensor(x.ctypes.data + 4, E4M3, [8, 4]))
    raises(
        ValueError,
        re.escape("te_quantize: output->columnwise_data.data: expected a buffer separate from input's"),
        q,
        x,
        out,
    )
    assert (x == 1).all() and (keep["rw"] == DATA_SENTINEL).all()
    out, _ = pt_output(amax=_C.Tensor(x.ctypes.data + 8, int(D.FLOAT32), [1]))
    raises(ValueError, re.escape("te_quantize: output->amax.data: expected a buffer separate"), q, x, out)
    # te_gemm: D written while A is read
    a32 = np.ones((4, 4), np.float32)
    A = _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=tensor(a32))
    B = _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=tensor(np.eye(4, dtype=np.float32)))
    raises(
        ValueError,
        re.escape("te_gemm: d->rowwise_data.data: expected a buffer separate from a->rowwise_data's"),
        _C.gemm,
        A,
        B,
        A,
        _C.GemmConfig(beta=1.0),
    )
    # buffers side by side are fine
    both = np.zeros(16, np.uint8)
    _C.transpose(
        _C.Tensor(both.ctypes.data, int(D.UINT8), [2, 4]),
        _C.Tensor(both.ctypes.data + 8, int(D.UINT8), [4, 2]),
    )


@pytest.mark.parametrize("mode", [M.PER_TENSOR, M.BLOCK_1D, M.MXFP8_1D])
def test_zero_size_dequantize_without_copies(mode):
    """An empty output needs no copy (the check said so, then failed on the absent copy's NULL)."""
    _C.dequantize(_C.QuantizedTensor(int(mode)), _C.Tensor(0, int(D.FLOAT32), [0, 32]))


def test_wrong_output_dtype():
    rw = np.zeros((4, 8), np.uint16)
    out, _ = pt_output(rowwise_data=tensor(rw, int(D.FLOAT16)))
    raises(
        ValueError,
        re.escape("output->rowwise_data.dtype: expected float8_e4m3, float8_e5m2, got float16"),
        q,
        X,
        out,
    )
    out, _ = pt_output(rowwise_scale_inv=tensor(np.zeros(1, np.float16)))
    raises(ValueError, re.escape("output->rowwise_scale_inv.dtype: expected float32, got float16"), q, X, out)
    cw = fp8_buffer((8, 4))
    out, _ = pt_output(columnwise_data=tensor(cw, int(D.FLOAT8_E5M2)))
    raises(
        ValueError,
        re.escape("output->columnwise_data.dtype: expected the row-wise copy's float8_e4m3, got float8_e5m2"),
        q,
        X,
        out,
    )


def test_rowwise_shape_mismatch():
    rw = fp8_buffer((4, 7))
    out, _ = pt_output(rowwise_data=tensor(rw, E4M3))
    raises(
        ValueError, re.escape("output->rowwise_data.shape: expected [4, 8]") + ".*got \\[4, 7\\]", q, X, out
    )


def test_columnwise_not_transposed():
    cw = fp8_buffer((4, 8))
    out, _ = pt_output(columnwise_data=tensor(cw, E4M3))
    raises(
        ValueError,
        re.escape("output->columnwise_data.shape: expected [8, 4] ([K, M]: the transposed copy")
        + ".*got \\[4, 8\\]",
        q,
        X,
        out,
    )


@pytest.mark.parametrize("mode", [M.BLOCK_1D, M.BLOCK_2D], ids=str)
def test_block_scale_inv_wrong_shape(mode):
    want = _C.quantized_shape(int(mode), int(P.ROWWISE_SCALE_INV), [4, 8])
    bad = np.zeros((want[1], want[0]) if want[0] != want[1] else (want[0], want[1] + 1), np.float32)
    out, _ = block_output(mode, rowwise_scale_inv=tensor(bad))
    raises(
        ValueError,
        re.escape(f"output->rowwise_scale_inv.shape: expected [{want[0]}, {want[1]}] (the block-scale layout")
        + ".*got "
        + re.escape(str(list(bad.shape))),
        q,
        X,
        out,
    )
    # per-tensor scale_inv with more than one element
    out, _ = pt_output(rowwise_scale_inv=tensor(np.zeros(2, np.float32)))
    raises(ValueError, re.escape("output->rowwise_scale_inv.shape: expected 1 element, got [2]"), q, X, out)


@pytest.mark.parametrize("field", ["amax", "scale"])
@pytest.mark.parametrize("mode,name", [(M.BLOCK_1D, "block_1d"), (M.BLOCK_2D, "block_2d")])
def test_amax_or_scale_in_block_mode(field, mode, name):
    buf = f32()
    out, _ = block_output(mode, **{field: tensor(buf)})
    raises(ValueError, re.escape(f"output->{field}: expected NULL for scaling mode {name}"), q, X, out)


def test_use_existing_amax_in_block_mode():
    out, _ = block_output(M.BLOCK_1D)
    raises(
        ValueError,
        "config->use_existing_amax: not supported by scaling mode block_1d",
        q,
        X,
        out,
        _C.QuantConfig(compute_scale=True, use_existing_amax=True),
    )


def test_missing_scale_for_delayed():
    out, _ = pt_output(scale=None)
    raises(
        ValueError,
        re.escape("output->scale: delayed scaling (config->compute_scale = 0) needs the fp32 [1] scale"),
        q,
        X,
        out,
    )


def test_missing_amax_for_current():
    out, _ = pt_output(amax=None)
    raises(
        ValueError,
        re.escape(
            "output->amax: current scaling (config->compute_scale = 1) needs an fp32 [1] amax buffer, "
            "got NULL"
        ),
        q,
        X,
        out,
        _C.QuantConfig(compute_scale=True),
    )


def test_amax_and_scale_must_be_fp32_scalars():
    out, _ = pt_output(amax=tensor(np.zeros(3, np.float32)))
    raises(ValueError, re.escape("output->amax.shape: expected 1 element, got [3]"), q, X, out)
    out, _ = pt_output(scale=tensor(np.zeros(1, np.float16)))
    raises(ValueError, re.escape("output->scale.dtype: expected float32, got float16"), q, X, out)


def test_use_existing_amax_without_compute_scale():
    out, _ = pt_output()
    raises(
        ValueError,
        re.escape("config->use_existing_amax: only meaningful with compute_scale = 1")
        + ".*got compute_scale = 0",
        q,
        X,
        out,
        _C.QuantConfig(use_existing_amax=True),
    )


def test_negative_epsilon():
    out, _ = pt_output()
    raises(
        ValueError,
        re.escape("config->amax_epsilon: expected a value >= 0, got -1"),
        q,
        X,
        out,
        _C.QuantConfig(compute_scale=True, amax_epsilon=-1.0),
    )


def test_ndim_over_8():
    with pytest.raises(ValueError, match=re.escape("shape: expected at most 8 dims, got 9")):
        _C.Tensor(X.ctypes.data, int(D.FLOAT32), [1] * 9)
    with pytest.raises(ValueError, match=re.escape("shape: expected at most 8 dims, got 9")):
        _C.quantized_shape(0, 0, [1] * 9)


def test_negative_dims():
    out, _ = pt_output()
    raises(
        ValueError,
        re.escape("input.shape: expected non-negative sizes, got [-4, 8]"),
        q,
        _C.Tensor(X.ctypes.data, int(D.FLOAT32), [-4, 8]),
        out,
    )
    raises(
        ValueError,
        re.escape("te_quantized_shape: shape: expected non-negative sizes, got [3, -1]"),
        _C.quantized_shape,
        0,
        0,
        [3, -1],
    )


def test_misaligned_pointer():
    raw = np.zeros(40, np.uint8)
    odd = raw.ctypes.data + (1 if raw.ctypes.data % 2 == 0 else 0)
    out, _ = pt_output(rows=1, cols=8)
    raises(
        ValueError,
        r"input\.data: expected an address aligned to 4 bytes \(float32\), got 0x",
        q,
        _C.Tensor(odd, int(D.FLOAT32), [1, 8]),
        out,
    )
    raises(
        ValueError,
        r"input\.data: expected an address aligned to 2 bytes \(bfloat16\)",
        _C.amax,
        _C.Tensor(odd, int(D.BFLOAT16), [4]),
        tensor(f32()),
    )


def cuda_tensor(arr, dtype=None):
    t = tensor(arr, dtype)
    return _C.Tensor(t.ptr, t.dtype, t.shape, device_type=int(_C.DeviceType.CUDA), device_index=0)


@pytest.mark.skipif(_C.BUILT_WITH_CUDA, reason="checks the CPU-only build's message")
def test_cuda_tensors_on_cpu_only_build():
    assert _C.cuda_device_count() == 0
    a = f32()
    raises(
        NotImplementedError,
        re.escape("te_amax: input is on cuda:0 but this te-core was built without CUDA"),
        _C.amax,
        cuda_tensor(X),
        cuda_tensor(a),
    )
    keep = [fp8_buffer((4, 8)), f32(), f32(), f32(1.0)]
    out = _C.QuantizedTensor(
        0,
        rowwise_data=cuda_tensor(keep[0], E4M3),
        rowwise_scale_inv=cuda_tensor(keep[1]),
        amax=cuda_tensor(keep[2]),
        scale=cuda_tensor(keep[3]),
    )
    raises(NotImplementedError, "built without CUDA", _C.quantize, cuda_tensor(X), out)
    o = np.zeros((8, 4), np.float32)
    raises(NotImplementedError, "built without CUDA", _C.transpose, cuda_tensor(X), cuda_tensor(o))
    h = np.zeros((2, 1), np.float32)
    raises(
        NotImplementedError,
        re.escape("amax_histories[0] is on cuda:0 but this te-core was built without CUDA"),
        _C.delayed_scaling_update,
        [cuda_tensor(h)],
        [cuda_tensor(f32())],
        448.0,
    )


def test_cuda_tensors_without_a_device_are_not_implemented():
    if _C.cuda_device_count() > 0:
        pytest.skip("a GPU is present")
    with pytest.raises(NotImplementedError, match="(built without CUDA|no CUDA device is usable)"):
        _C.amax(cuda_tensor(X), cuda_tensor(f32()))


def test_mixed_devices():
    out, _ = pt_output()
    keep = fp8_buffer((4, 8))
    out.rowwise_data = cuda_tensor(keep, E4M3)
    raises(
        ValueError,
        re.escape("output->rowwise_data.device: expected the device of input (cpu), got cuda:0"),
        q,
        X,
        out,
    )
    raises(
        ValueError,
        re.escape("amax.device: expected the device of input (cpu), got cuda:0"),
        _C.amax,
        tensor(X),
        cuda_tensor(f32()),
    )
    o = np.zeros((8, 4), np.float32)
    raises(
        ValueError,
        re.escape("output.device: expected the device of input (cpu), got cuda:0"),
        _C.transpose,
        tensor(X),
        cuda_tensor(o),
    )


def test_bad_device_type():
    t = _C.Tensor(X.ctypes.data, int(D.FLOAT32), [4, 8], device_type=5)
    raises(
        ValueError,
        re.escape("input.device.type: expected TE_DEVICE_CPU (0) or TE_DEVICE_CUDA (1), got 5"),
        _C.amax,
        t,
        tensor(f32()),
    )


def test_unknown_scaling_mode():
    out, _ = pt_output()
    out.scaling_mode = 7
    raises(ValueError, re.escape("scaling_mode: expected a te_scaling_mode value 0..4, got 7"), q, X, out)
    raises(
        ValueError,
        re.escape("scaling_mode: expected a te_scaling_mode value 0..4, got 7"),
        _C.quantized_shape,
        7,
        0,
        [4, 8],
    )


@pytest.mark.parametrize(
    "mode,message",
    [
        (M.MXFP8_1D, "te_quantize: output->rowwise_scale_inv.dtype: expected float8_e8m0, got float32"),
        (M.NVFP4_1D, "te_quantize: output->rowwise_data.dtype: expected float4_e2m1, got float8_e4m3"),
    ],
)
def test_mx_modes_name_their_layout(mode, message):
    """A per-tensor-shaped output relabelled MXFP8 / NVFP4 fails on the first part that does not fit
    that mode's layout (test_quantize_mxfp8/nvfp4.py cover the modes themselves)."""
    out, _ = pt_output(amax=None, scale=None, columnwise_data=None, columnwise_scale_inv=None)
    out.scaling_mode = int(mode)
    raises(ValueError, re.escape(message), q, X, out)


def test_neither_copy():
    out = _C.QuantizedTensor(0, amax=tensor(f32()), scale=tensor(f32(1.0)))
    raises(
        ValueError, re.escape("output: expected rowwise_data and/or columnwise_data, got neither"), q, X, out
    )


def test_amax_output_errors():
    raises(
        ValueError,
        re.escape("amax.shape: expected 1 element, got [2]"),
        _C.amax,
        tensor(X),
        tensor(np.zeros(2, np.float32)),
    )
    raises(
        ValueError,
        re.escape("amax.dtype: expected float32, got int32"),
        _C.amax,
        tensor(X),
        tensor(np.zeros(1, np.int32), int(D.INT32)),
    )


# ---- te_dequantize ------------------------------------------------------------------------------


def test_dequantize_errors():
    data, si, out = fp8_buffer((4, 8)), f32(1.0), np.zeros((4, 8), np.float32)
    raises(
        ValueError,
        re.escape("te_dequantize: input: expected rowwise_data or columnwise_data, got neither"),
        _C.dequantize,
        _C.QuantizedTensor(0),
        tensor(out),
    )
    good = _C.QuantizedTensor(0, rowwise_data=tensor(data, E4M3), rowwise_scale_inv=tensor(si))
    raises(
        ValueError,
        re.escape("output.dtype: expected float32, float16, bfloat16, got int32"),
        _C.dequantize,
        good,
        tensor(np.zeros((4, 8), np.int32), int(D.INT32)),
    )
    raises(
        ValueError,
        re.escape("output.shape: expected [4, 8] (the row-wise data's shape") + ".*got \\[8, 4\\]",
        _C.dequantize,
        good,
        tensor(np.zeros((8, 4), np.float32)),
    )
    bad = _C.QuantizedTensor(0, rowwise_data=tensor(data, int(D.UINT8)), rowwise_scale_inv=tensor(si))
    raises(
        ValueError,
        re.escape("input->rowwise_data.dtype: expected float8_e4m3, float8_e5m2, got uint8"),
        _C.dequantize,
        bad,
        tensor(out),
    )
    cw = _C.QuantizedTensor(0, columnwise_data=tensor(data, E4M3), columnwise_scale_inv=tensor(si))
    raises(
        ValueError,
        re.escape("input->columnwise_data.shape: expected [8, 4] ([K, M] for the [M, K] output), got [4, 8]"),
        _C.dequantize,
        cw,
        tensor(out),
    )
    blk = _C.QuantizedTensor(int(M.BLOCK_1D), rowwise_data=tensor(data, E4M3), rowwise_scale_inv=tensor(si))
    raises(
        ValueError,
        re.escape("input->rowwise_scale_inv.shape: expected [1, 4] (the block-scale layout"),
        _C.dequantize,
        blk,
        tensor(out),
    )
    raises(
        ValueError,
        "scaling_mode: expected a te_scaling_mode value 0..4, got 7",
        _C.dequantize,
        _C.QuantizedTensor(7, rowwise_data=tensor(data, E4M3), rowwise_scale_inv=tensor(si)),
        tensor(out),
    )
    raises(
        ValueError,
        re.escape("input->rowwise_scale_inv.dtype: expected float8_e8m0, got float32"),
        _C.dequantize,
        _C.QuantizedTensor(int(M.MXFP8_1D), rowwise_data=tensor(data, E4M3), rowwise_scale_inv=tensor(si)),
        tensor(out),
    )
    assert (out == 0).all()


# ---- te_transpose -------------------------------------------------------------------------------


def test_transpose_errors():
    a = np.zeros((4, 8), np.uint8)
    raises(
        ValueError,
        re.escape("te_transpose: output.dtype: expected the input's float8_e4m3, got uint8"),
        _C.transpose,
        tensor(a, E4M3),
        tensor(np.zeros((8, 4), np.uint8), int(D.UINT8)),
    )
    raises(
        ValueError,
        re.escape("output.shape: expected [8, 4] ([K, M] for an [M, K] input), got [4, 8]"),
        _C.transpose,
        tensor(a, E4M3),
        tensor(np.zeros((4, 8), np.uint8), E4M3),
    )
    b = np.zeros((4, 8), np.int64)
    raises(
        ValueError,
        re.escape("input.dtype: expected a 1-, 2- or 4-byte dtype, got int64"),
        _C.transpose,
        tensor(b, int(D.INT64)),
        tensor(np.zeros((8, 4), np.int64), int(D.INT64)),
    )
    raises(
        ValueError,
        re.escape("input.dtype: expected a 1-, 2- or 4-byte dtype, got float4_e2m1"),
        _C.transpose,
        tensor(a, int(D.FLOAT4_E2M1)),
        tensor(np.zeros((8, 4), np.uint8), int(D.FLOAT4_E2M1)),
    )


# ---- te_delayed_scaling_update ---------------------------------------------------------------


def test_delayed_update_errors():
    h, s = np.zeros((4, 3), np.float32), np.ones(3, np.float32)
    upd = _C.delayed_scaling_update
    raises(
        ValueError,
        re.escape("scales[0].shape: expected 3 elements, got [2]"),
        upd,
        [tensor(h)],
        [tensor(np.ones(2, np.float32))],
        448.0,
    )
    raises(
        ValueError,
        re.escape("scales: expected one per amax history (1), got 2"),
        upd,
        [tensor(h)],
        [tensor(s), tensor(s)],
        448.0,
    )
    raises(
        ValueError,
        re.escape(
            "amax_compute_algo: expected TE_AMAX_COMPUTE_MAX (0) or TE_AMAX_COMPUTE_MOST_RECENT (1), got 5"
        ),
        upd,
        [tensor(h)],
        [tensor(s)],
        448.0,
        0.0,
        5,
    )
    for bad in [0.0, -448.0, float("inf"), float("nan")]:
        raises(
            ValueError,
            r"fp8_max: expected a positive finite value \(448 for E4M3, 57344 for E5M2\), got",
            upd,
            [tensor(h)],
            [tensor(s)],
            bad,
        )
    raises(
        ValueError, "margin: expected a finite value, got", upd, [tensor(h)], [tensor(s)], 448.0, float("inf")
    )
    raises(
        ValueError,
        re.escape("amax_histories[1].dtype: expected float32, got float16"),
        upd,
        [tensor(h), tensor(np.zeros(3, np.float16))],
        [tensor(s), tensor(f32())],
        448.0,
    )
    raises(
        ValueError,
        re.escape("amax_histories[0].ndim: expected 1 ([L]) or 2 ([L, N]), got 3"),
        upd,
        [tensor(np.zeros((2, 2, 2), np.float32))],
        [tensor(s)],
        448.0,
    )
    raises(
        ValueError,
        re.escape("amax_histories[0].shape: expected a history length L >= 1, got [0, 3]"),
        upd,
        [tensor(np.zeros((0, 3), np.float32))],
        [tensor(s)],
        448.0,
    )
    assert (h == 0).all() and (s == 1).all()


def test_delayed_update_groups_errors():
    """te_delayed_scaling_update_groups names the group of a bad argument."""
    h, s = np.zeros((4, 3), np.float32), np.ones(3, np.float32)
    good = ([tensor(h)], [tensor(s)], 448.0, 0.0, 0)

    def upd(*bad):
        _C.DelayedScalingUpdate([good, bad])()

    raises(
        ValueError,
        re.escape("groups[1].scales[0].shape: expected 3 elements, got [2]"),
        upd,
        [tensor(h)],
        [tensor(np.ones(2, np.float32))],
        57344.0,
        0.0,
        0,
    )
    raises(
        ValueError,
        re.escape("groups[1]: expected one scale per amax history (1), got 2"),
        upd,
        [tensor(h)],
        [tensor(s), tensor(s)],
        57344.0,
        0.0,
        0,
    )
    raises(
        ValueError,
        re.escape("groups[1].fp8_max: expected a positive finite value (448 for E4M3, 57344 for E5M2), got"),
        upd,
        [tensor(h)],
        [tensor(s)],
        -1.0,
        0.0,
        0,
    )
    raises(
        ValueError,
        re.escape(
            "groups[1].amax_compute_algo: expected TE_AMAX_COMPUTE_MAX (0) or TE_AMAX_COMPUTE_MOST_RECENT (1), got 7"
        ),
        upd,
        [tensor(h)],
        [tensor(s)],
        57344.0,
        0.0,
        7,
    )
    raises(
        ValueError,
        re.escape("groups[1].amax_histories[0].dtype: expected float32, got float16"),
        upd,
        [tensor(np.zeros(3, np.float16))],
        [tensor(f32())],
        57344.0,
        0.0,
        0,
    )
    assert (h == 0).all() and (s == 1).all(), "a failing call updates nothing"


# ---- te_quantized_shape -----------------------------------------------------------------------


def test_quantized_shape_bad_part():
    raises(
        ValueError,
        re.escape("te_quantized_shape: part: expected a te_quantized_part value 0..3, got 9"),
        _C.quantized_shape,
        0,
        9,
        [4, 8],
    )
    raises(
        ValueError,
        re.escape("part: expected a te_quantized_part value 0..3, got -1"),
        _C.quantized_shape,
        int(M.BLOCK_2D),
        -1,
        [4, 8],
    )


def test_last_error_is_per_failure():
    with pytest.raises(ValueError):
        _C.quantized_shape(0, 9, [4])
    first = _C.last_error()
    with pytest.raises(ValueError):
        _C.quantized_shape(0, 0, [-2])
    assert _C.last_error() != first and "-2" in _C.last_error()


# ---- the fused steps' and flat entry points' argument conversion --------------------------------


def test_step_arguments_name_themselves():
    """Wrong Python types in the fused steps' tuples say which argument, instead of pybind11's
    "Unable to cast Python instance of type <class 'str'> to C++ type '?'"."""
    x = np.ones((4, 8), np.float32)
    w = np.ones((6, 8), np.float32)
    y = np.zeros((4, 6), np.float32)
    hp = (2, int(M.PER_TENSOR), tensor(x), None, None, None)
    hw = (2, int(M.PER_TENSOR), tensor(w), None, None, None)
    with pytest.raises(TypeError, match=re.escape("config: expected a GemmConfig, got 'cfg'")):
        _C.linear_fwd(hp, hw, None, tensor(y), "cfg", 0)
    with pytest.raises(TypeError, match=re.escape("dgrad_config: expected a GemmConfig, got 3")):
        _C.linear_bwd(hp, None, None, hw, tensor(np.zeros((4, 8), np.float32)), 3, None, None, 0)
    buf = np.zeros(4096, np.uint8)
    quant = (int(M.PER_TENSOR), E4M3, "cfg", None, tensor(f32(1.0)))
    with pytest.raises(TypeError, match=re.escape("x: expected quant[2] a QuantConfig or None, got 'cfg'")):
        _C.linear_fwd((0, tensor(x), quant, buf.ctypes.data, 0), hw, None, tensor(y), _C.GemmConfig(), 0)
    # a bad mode or dtype of packed copies names the operand
    for mode, dtype, what in [
        (9, E4M3, "scaling_mode: expected a te_scaling_mode value 0..4, got 9"),
        (0, 99, "dtype: expected a te_dtype value 0..9, got 99"),
    ]:
        with pytest.raises(
            ValueError,
            match=re.escape(f"w: packed copies (mode {mode}, fp8 dtype {dtype}): ") + ".*" + re.escape(what),
        ):
            _C.linear_fwd(
                hp, (1, mode, dtype, (6, 8), -1, buf.ctypes.data, 0), None, tensor(y), _C.GemmConfig(), 0
            )
    # an int32 field given a wider int was truncated (mode 2**32 + 1 read as 1)
    with pytest.raises(ValueError, match=re.escape("w[1]: expected an int32 value, got 4294967297")):
        _C.linear_fwd(
            hp, (1, 2**32 + 1, E4M3, (6, 8), -1, buf.ctypes.data, 0), None, tensor(y), _C.GemmConfig(), 0
        )


def test_norm_tuple_with_failing_bool():
    """The norm tuple's rms flag whose truth test raises surfaces that error (it was left pending
    and surfaced as a wrong TypeError at the next int conversion)."""

    class Bad:
        def __bool__(self):
            raise RuntimeError("no truth value")

    with pytest.raises(RuntimeError, match="no truth value"):
        _C.layernorm_linear_bwd(
            (2, 0, None, None, None, None),
            None,
            None,
            (2, 0, None, None, None, None),
            (16, int(D.FLOAT32), (4, 4), -1),
            _C.GemmConfig(),
            None,
            None,
            (Bad(), None, None, None, None, None, None, None, _C.NormConfig()),
            0,
        )


@pytest.mark.parametrize("field,value", [(1, 2**32), (3, 2**32), (3, 2**32 + 5)])
def test_spec_int32_fields_out_of_range(field, value):
    """A spec's dtype or device wider than int32 was truncated: dtype 2**32 ran as float32,
    device 2**32 as cuda:0."""
    x = np.ones((1, 4), np.float32)
    spec = [x.ctypes.data, int(D.FLOAT32), (1, 4), -1]
    spec[field] = value
    with pytest.raises(
        ValueError, match=re.escape("x: expected dtype and device to fit in int32 (device -1: the CPU), got")
    ):
        # (rms, x, gamma, beta, out_mode, rd, then rs, cd, cs, amax, scale, mu, rsigma)
        _C.norm_fwd_flat(
            False,
            tuple(spec),
            tensor(np.ones(4, np.float32)),
            None,
            0,
            tensor(np.zeros((1, 4), np.float32)),
            *[None] * 7,
        )
