"""Helpers shared by the fused-op tests (norms, activations, dbias): high-precision output
descriptors, tolerant comparisons against a float64 reference, and the "fused op == te op in fp32
then te_quantize == oracle" check for quantized outputs."""

from __future__ import annotations

import _oracle as O
import ml_dtypes
import numpy as np
from _buffers import FP8_DTYPE, Quantized, assert_bits_equal, assert_fp8_equal, tensor
from te_core import _C

BF16 = ml_dtypes.bfloat16
HP_TYPES = [np.float32, np.float16, BF16]


def dtype_id(t) -> str:
    return np.dtype(t).name


def hp_output(arr: np.ndarray) -> _C.QuantizedTensor:
    """A high-precision output: a PER_TENSOR te_quantized_tensor with only rowwise_data."""
    return _C.QuantizedTensor(int(_C.ScalingMode.PER_TENSOR), rowwise_data=tensor(arr))


def _ordinal(a: np.ndarray) -> np.ndarray:
    """16-bit float bits as a signed ordinal: neighbouring values differ by 1, +0 == -0."""
    b = a.view(np.uint16).astype(np.int64)
    return np.where(b & 0x8000, -(b & 0x7FFF), b)


def assert_matches_ref(got: np.ndarray, ref64: np.ndarray, what: str, rtol=1e-6, atol=None):
    """fp32: close to the float64 reference (rtol, and atol relative to the data's magnitude).
    fp16/bf16: equal to the reference rounded to nearest even, except within 1 ulp where the fp32
    computation sits on the other side of a rounding boundary (rare: at most 1% of elements).
    The fp32 reference rounded to 16 bits is as right as te's contract (fp32 math, one rounding)
    can be: where the float64 value lies just past a 16-bit tie, its fp32 rounding is the tie,
    which rounds to even. ml_dtypes < 0.7 rounded float64 through fp32 itself and hid these."""
    ref64 = np.asarray(ref64, np.float64).reshape(got.shape)
    if got.dtype == np.float32:
        scale = float(np.max(np.abs(ref64))) if ref64.size else 0.0
        a = rtol * max(scale, 1e-30) if atol is None else atol
        np.testing.assert_allclose(got.astype(np.float64), ref64, rtol=rtol, atol=a, err_msg=what)
        return
    want = ref64.astype(got.dtype)  # one RNE rounding of the float64 value
    d = np.abs(_ordinal(got) - _ordinal(want))
    # Near zero a 16-bit ulp is smaller than the fp32 math's absolute error (cancellation in
    # x - mu, or in dxhat minus its projections), so there the fp32 tolerance applies instead.
    scale = float(np.max(np.abs(ref64))) if ref64.size else 0.0
    fp32_close = np.abs(got.astype(np.float64) - ref64) <= (rtol * scale if atol is None else atol)
    bad = (d > 1) & ~fp32_close
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} elements off by more than 1 ulp; first got "
        f"{got.reshape(-1)[bad.reshape(-1)][:3].astype(np.float32).tolist()}, want "
        f"{ref64.reshape(-1)[bad.reshape(-1)][:3].tolist()}"
    )
    via32 = ref64.astype(np.float32).astype(got.dtype)
    off = (d >= 1) & ~fp32_close & (_ordinal(got) != _ordinal(via32))
    assert off.sum() <= max(1, got.size // 100), f"{what}: {int(off.sum())} off by 1 ulp"


# ---- quantized outputs ------------------------------------------------------------------------

QUANT_CASES = {
    # name: (mode, rowwise, columnwise, initial amax, initial scale, QuantConfig kwargs)
    "delayed": (_C.ScalingMode.PER_TENSOR, True, False, 0.25, 3.0, {}),
    "delayed_ct": (_C.ScalingMode.PER_TENSOR, True, True, 0.0, 0.5, {}),
    # reset_amax: the garbage in the amax buffer must not survive (te_jax's fresh XLA result)
    "delayed_reset": (_C.ScalingMode.PER_TENSOR, True, True, 1e30, 0.5, {"reset_amax": True}),
    "current_ct": (_C.ScalingMode.PER_TENSOR, True, True, 0.0, 1.0, {"compute_scale": True}),
    "current_colonly": (_C.ScalingMode.PER_TENSOR, False, True, 0.0, None, {"compute_scale": True}),
    "block1d": (_C.ScalingMode.BLOCK_1D, True, True, None, None, {"force_pow2_scales": True}),
    "block1d_fp32": (_C.ScalingMode.BLOCK_1D, True, True, None, None, {"amax_epsilon": 1e-3}),
}


def make_quantized(case: str, shape, fmt: str) -> tuple[Quantized, _C.QuantConfig]:
    mode, row, col, amax, scale, cfg = QUANT_CASES[case]
    q = Quantized(int(mode), shape, fmt, rowwise=row, columnwise=col, amax=amax, scale=scale)
    return q, _C.QuantConfig(**cfg)


def _parts(q: Quantized):
    return {
        "rowwise": q.rowwise,
        "rowwise_scale_inv": q.rowwise_scale_inv,
        "columnwise": q.columnwise,
        "columnwise_scale_inv": q.columnwise_scale_inv,
        "amax": q.amax,
        "scale": q.scale,
    }


def check_quantized(fused: Quantized, case: str, y32: np.ndarray, fmt: str, what: str):
    """`fused` (the fused op's output) equals te_quantize of te's own fp32 result y32 bit for bit,
    every part; and the data equals the independent oracle's quantization of y32."""
    sep, cfg = make_quantized(case, y32.shape, fmt)
    sep.quantize(y32, cfg)
    for name, got in _parts(fused).items():
        want = _parts(sep)[name]
        if got is None:
            assert want is None
        elif name in ("rowwise", "columnwise"):
            assert_fp8_equal(got, want, fmt, f"{what}: {name} vs norm+te_quantize")
        else:
            assert_bits_equal(got, want, f"{what}: {name} vs norm+te_quantize")
    mode, row, col, amax0, scale0, kw = QUANT_CASES[case]
    rows, cols = O.matrix_dims(y32.shape)
    if int(mode) == int(_C.ScalingMode.PER_TENSOR):
        if kw.get("compute_scale"):
            scale = O.compute_scale(O.amax(y32), O.FP8_MAX[fmt])
            assert_bits_equal(fused.amax, np.array([O.amax(y32)], np.float32), what + ": amax")
        else:
            scale = np.float32(scale0)
            want_amax = np.float32(O.amax(y32) if kw.get("reset_amax") else max(amax0, O.amax(y32)))
            assert_bits_equal(fused.amax, np.array([want_amax], np.float32), what + ": amax")
        q = O.quantize_per_tensor(y32, scale, fmt)
        if fused.rowwise is not None:
            assert_fp8_equal(fused.rowwise, q.reshape(y32.shape), fmt, what + ": rowwise vs oracle")
        if fused.columnwise is not None:
            assert_fp8_equal(
                fused.columnwise, q.reshape(rows, cols).T.copy(), fmt, what + ": columnwise vs oracle"
            )
        return
    from _buffers import scale_buffer

    rs = scale_buffer(O.block_scale_inv_shape(1, rows, cols, columnwise=False))
    cs = scale_buffer(O.block_scale_inv_shape(1, rows, cols, columnwise=True))
    q_row, q_col = O.quantize_block(
        y32, fmt, 1, kw.get("force_pow2_scales", False), kw.get("amax_epsilon", 0.0), rs, cs
    )
    assert_fp8_equal(fused.rowwise, q_row.reshape(y32.shape), fmt, what + ": rowwise vs oracle")
    assert_fp8_equal(fused.columnwise, q_col, fmt, what + ": columnwise vs oracle")
    assert_bits_equal(fused.rowwise_scale_inv, rs, what + ": rowwise_scale_inv vs oracle")
    assert_bits_equal(fused.columnwise_scale_inv, cs, what + ": columnwise_scale_inv vs oracle")


__all__ = ["FP8_DTYPE"]
