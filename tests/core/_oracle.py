"""An independent numpy/ml_dtypes reference of NUMERICS.md, written from its text, not from te's C.

Everything here works on numpy arrays and returns the exact bytes te-core must produce:
FP8 data as uint8, scales as float32, block scale_inv in te/tensor.h's padded, transposed layout.
The element conversion is the one NUMERICS.md names as the oracle: clamp to +-max (NaN passes
through), then ml_dtypes' round-to-nearest-even cast.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

E4M3, E5M2 = "e4m3", "e5m2"
FP8_TYPE = {E4M3: ml_dtypes.float8_e4m3fn, E5M2: ml_dtypes.float8_e5m2}
FP8_MAX = {E4M3: np.float32(448.0), E5M2: np.float32(57344.0)}
FLT_MAX = np.float32(np.finfo(np.float32).max)
BLOCK = 128
SCALE_ALIGN = 4


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def matrix_dims(shape) -> tuple[int, int]:
    """[..., K] viewed as M rows of K: the matrix view every op uses (a scalar is 1x1)."""
    shape = tuple(shape)
    cols = shape[-1] if shape else 1
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return rows, cols


# ---- element conversions ---------------------------------------------------------------------


def to_fp8(v: np.ndarray, fmt: str) -> np.ndarray:
    """fp32 values -> FP8 bytes: saturate finite values and +-inf to +-max, NaN stays NaN, RNE."""
    v = np.asarray(v, dtype=np.float32)
    m = FP8_MAX[fmt]
    return np.clip(v, -m, m).astype(FP8_TYPE[fmt]).view(np.uint8)


def from_fp8(q: np.ndarray, fmt: str) -> np.ndarray:
    """FP8 bytes -> exact fp32 values."""
    return np.asarray(q, dtype=np.uint8).view(FP8_TYPE[fmt]).astype(np.float32)


def fp8_is_nan(q: np.ndarray, fmt: str) -> np.ndarray:
    return np.isnan(from_fp8(q, fmt))


# ---- amax and the scale rule ----------------------------------------------------------------


def amax(x: np.ndarray) -> np.float32:
    """max |x| in fp32; NaN anywhere gives NaN; an empty tensor gives 0."""
    a = np.abs(np.asarray(x).astype(np.float32))
    return np.float32(a.max()) if a.size else np.float32(0.0)


def compute_scale(amax_value, fp8_max, pow2: bool = False, eps: float = 0.0):
    """Current/block scaling rule of NUMERICS.md, elementwise over an array of amaxes.

    amax = max(amax, eps) (NaN stays NaN); amax 0, inf or NaN -> scale 1; otherwise fp8_max / amax
    as a correctly rounded fp32 division, inf -> FLT_MAX; with pow2 the mantissa bits are cleared.
    """
    a = np.array(amax_value, dtype=np.float32, copy=True)
    eps = np.float32(eps)
    a = np.where(np.isnan(a), a, np.maximum(a, eps)).astype(np.float32)
    usable = np.isfinite(a) & (a != 0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s = np.where(usable, np.float32(fp8_max) / np.where(usable, a, np.float32(1)), np.float32(1))
    s = np.where(np.isinf(s), FLT_MAX, s).astype(np.float32)
    if pow2:
        s = (s.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    return s if s.ndim else np.float32(s)


def reciprocal(s) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore"):
        return (np.float32(1.0) / np.asarray(s, dtype=np.float32)).astype(np.float32)


# ---- per-tensor scaling ---------------------------------------------------------------------


def quantize_per_tensor(x: np.ndarray, scale, fmt: str) -> np.ndarray:
    """q = convert(float(x) * scale): one fp32 multiply, then the FP8 conversion. Shape of x."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.asarray(x).astype(np.float32) * np.float32(scale)
    return to_fp8(v, fmt)


# ---- block scaling (Float8BlockScaling), te/tensor.h layouts -------------------------------


def _block_amax_1d(x2: np.ndarray) -> np.ndarray:
    """[M, K] -> [M, ceil(K/128)] amaxes of the 1x128 blocks along rows (edge blocks partial)."""
    rows, cols = x2.shape
    nb = ceil_div(cols, BLOCK)
    a = np.zeros((rows, nb * BLOCK), np.float32)
    a[:, :cols] = np.abs(x2)
    return a.reshape(rows, nb, BLOCK).max(axis=2) if rows and nb else np.zeros((rows, nb), np.float32)


def _block_amax_2d(x2: np.ndarray) -> np.ndarray:
    rows, cols = x2.shape
    mb, nb = ceil_div(rows, BLOCK), ceil_div(cols, BLOCK)
    a = np.zeros((mb * BLOCK, nb * BLOCK), np.float32)
    a[:rows, :cols] = np.abs(x2)
    if not (mb and nb):
        return np.zeros((mb, nb), np.float32)
    return a.reshape(mb, BLOCK, nb, BLOCK).max(axis=(1, 3))


def _rowwise_1d(x2, fmt, pow2, eps, scale_inv_buf):
    """1x128 blocks along the rows of x2 [M, K]; writes scale_inv_buf[j, r] for block (r, j)."""
    rows, cols = x2.shape
    scale = compute_scale(_block_amax_1d(x2), FP8_MAX[fmt], pow2, eps)
    full = np.repeat(scale, BLOCK, axis=1)[:, :cols] if cols else np.zeros((rows, 0), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        q = to_fp8(x2 * full, fmt)
    scale_inv_buf[:, :rows] = reciprocal(scale).T
    return q


def quantize_block(
    x: np.ndarray,
    fmt: str,
    block_dim: int,
    pow2: bool,
    eps: float,
    rowwise_scale_inv: np.ndarray,
    columnwise_scale_inv: np.ndarray,
):
    """Float8BlockScaling of x [..., K] as [M, K]. Fills the given scale_inv buffers in place (their
    padding untouched, so pass sentinel-filled copies) and returns (rowwise [M, K], columnwise
    [K, M]) FP8 bytes."""
    rows, cols = matrix_dims(x.shape)
    x2 = np.asarray(x).astype(np.float32).reshape(rows, cols)
    if block_dim == 1:
        q_row = _rowwise_1d(x2, fmt, pow2, eps, rowwise_scale_inv)
        # Column-wise 1-D blocks are 128x1 along the source columns, i.e. 1x128 along the rows of
        # the transposed copy, with that copy's own scales.
        q_col = _rowwise_1d(np.ascontiguousarray(x2.T), fmt, pow2, eps, columnwise_scale_inv)
        return q_row, q_col
    mb, nb = ceil_div(rows, BLOCK), ceil_div(cols, BLOCK)
    scale = compute_scale(_block_amax_2d(x2), FP8_MAX[fmt], pow2, eps)
    full = np.repeat(np.repeat(scale, BLOCK, axis=0), BLOCK, axis=1)[:rows, :cols]
    with np.errstate(over="ignore", invalid="ignore"):
        q = to_fp8(x2 * full, fmt)
    rowwise_scale_inv[:, :nb] = reciprocal(scale)
    columnwise_scale_inv[:, :mb] = reciprocal(scale).T
    return q, np.ascontiguousarray(q.T)


def block_scale_inv_shape(mode_dim: int, rows: int, cols: int, columnwise: bool) -> tuple[int, int]:
    """te/tensor.h's scale_inv shapes for BLOCK_1D (mode_dim 1) and BLOCK_2D (mode_dim 2)."""
    if mode_dim == 1:
        return (
            (ceil_div(rows, BLOCK), round_up(cols, SCALE_ALIGN))
            if columnwise
            else (ceil_div(cols, BLOCK), round_up(rows, SCALE_ALIGN))
        )
    if columnwise:
        return ceil_div(cols, BLOCK), round_up(ceil_div(rows, BLOCK), SCALE_ALIGN)
    return ceil_div(rows, BLOCK), round_up(ceil_div(cols, BLOCK), SCALE_ALIGN)


# ---- dequantize ------------------------------------------------------------------------------


def dequantize(q_rowwise: np.ndarray, fmt: str, scale_inv_of_element: np.ndarray, out_dtype):
    """x = float(q) * scale_inv (one fp32 multiply), rounded to out_dtype by numpy/ml_dtypes (RNE).
    scale_inv_of_element has q's shape (or broadcasts to it)."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = from_fp8(q_rowwise, fmt) * np.asarray(scale_inv_of_element, np.float32)
        return v.astype(out_dtype)


def expand_block_scale_inv(
    block_dim: int, sinv: np.ndarray, rows: int, cols: int, columnwise: bool
) -> np.ndarray:
    """Per-element scale_inv [rows, cols] of the source from a stored block scale_inv buffer."""
    r = np.arange(rows)[:, None]
    c = np.arange(cols)[None, :]
    if block_dim == 1:
        return sinv[r // BLOCK, c] if columnwise else sinv[c // BLOCK, r]
    return sinv[c // BLOCK, r // BLOCK] if columnwise else sinv[r // BLOCK, c // BLOCK]


# ---- delayed scaling update -------------------------------------------------------------------


def delayed_scaling_update(history: np.ndarray, scale: np.ndarray, fp8_max, margin, algo: str):
    """One update of NUMERICS.md's DelayedScaling on a [L] or [L, N] history and its [N] scales.
    Returns (new_history, new_scale); the inputs are not modified."""
    h = np.array(history, dtype=np.float32, copy=True)
    two_d = h.ndim == 2
    if not two_d:
        h = h[:, None]
    old_scale = np.array(scale, dtype=np.float32, copy=True).reshape(-1)
    window = h.max(axis=0) if algo == "max" else h[0]  # np.max propagates NaN
    usable = np.isfinite(window) & (window != 0)
    # scale = (fp8_max / amax) / 2^margin read as one real-valued quotient rounded once to fp32
    # (as te/recipe.h writes it: (fp8_max * 2^-margin) / amax), not as two fp32 steps: the
    # intermediate fp8_max / amax may overflow fp32 where the scale itself does not. fp64 holds
    # the exact value for integer margins, and rounding a fp64 quotient of fp32 operands to fp32
    # gives the correctly rounded fp32 quotient (53 >= 2 * 24 + 2 bits: no double-rounding error).
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        exact = (
            np.float64(fp8_max)
            * np.exp2(-np.float64(margin))
            / np.where(usable, window, 1).astype(np.float64)
        )
        s = exact.astype(np.float32)
    s = np.where(np.isinf(s), FLT_MAX, s)
    new_scale = np.where(usable, s, old_scale).astype(np.float32)
    new_h = np.roll(h, -1, axis=0)  # new[i] = old[i + 1], new[L - 1] = old[0]
    new_h[0] = 0.0
    return (new_h if two_d else new_h[:, 0]), new_scale
