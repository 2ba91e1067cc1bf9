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


# ---- MXFP8 and NVFP4 (NUMERICS.md "MXFP8BlockScaling", "NVFP4BlockScaling") ------------------
# Layouts of te/tensor.h: each copy is stored [R, C] (row-wise [M, K], column-wise [K, M]) with one
# byte scale per block of 32 (MXFP8) or 16 (NVFP4) along its rows, in a row-major table padded to
# 128 rows x 4 columns; E2M1 codes pack two per byte, the first in the low nibble.

MX_BLOCK = {"mxfp8": 32, "nvfp4": 16}
MX_ROW_ALIGN, MX_COL_ALIGN = 128, 4
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
E2M1_MAX = np.float32(6.0)
NVFP4_NUMERATOR = np.float32(448.0 * 6.0)
RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)


def mx_scale_shape(family: str, rows: int, cols: int) -> tuple[int, int]:
    """The padded scale table of a copy stored [rows, cols]."""
    return round_up(rows, MX_ROW_ALIGN), round_up(ceil_div(cols, MX_BLOCK[family]), MX_COL_ALIGN)


def block_amax_rows(v: np.ndarray, block: int) -> np.ndarray:
    """[R, C] -> [R, ceil(C / block)]: max |v| of each run of `block` along the rows (NaN wins)."""
    rows, cols = v.shape
    nb = ceil_div(cols, block)
    a = np.zeros((rows, nb * block), np.float32)
    a[:, :cols] = np.abs(v)
    return a.reshape(rows, nb, block).max(axis=2) if rows and nb else np.zeros((rows, nb), np.float32)


def tile_amax(v: np.ndarray, block: int) -> np.ndarray:
    """[R, C] -> [ceil(R / block), ceil(C / block)]: max |v| of each block x block tile."""
    rows, cols = v.shape
    mb, nb = ceil_div(rows, block), ceil_div(cols, block)
    a = np.zeros((mb * block, nb * block), np.float32)
    a[:rows, :cols] = np.abs(v)
    return a.reshape(mb, block, nb, block).max(axis=(1, 3)) if mb and nb else np.zeros((mb, nb), np.float32)


def expand(per_block: np.ndarray, block: int, cols: int) -> np.ndarray:
    """[R, nb] block values -> [R, cols] per element."""
    return np.repeat(per_block, block, axis=1)[:, :cols]


def pack_e2m1(codes: np.ndarray) -> np.ndarray:
    """Codes (uint8 0..15) in row-major order -> bytes, element 2i in the low nibble of byte i."""
    flat = np.ascontiguousarray(codes, np.uint8).reshape(-1)
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def unpack_e2m1(packed: np.ndarray, shape) -> np.ndarray:
    flat = np.asarray(packed, np.uint8).reshape(-1)
    out = np.empty(flat.size * 2, np.uint8)
    out[0::2], out[1::2] = flat & 0xF, flat >> 4
    return out.reshape(shape)


def e2m1_value(codes: np.ndarray) -> np.ndarray:
    c = np.asarray(codes, np.uint8)
    return np.where(c & 8, -1.0, 1.0).astype(np.float32) * E2M1_GRID[c & 7]


# ---- MXFP8 ------------------------------------------------------------------------------------


def e8m0_from_amax(amax, fp8_max) -> np.ndarray:
    """NUMERICS.md: the 8 exponent bits of the fp32 quotient amax / fp8_max, plus 1 when its 23
    mantissa bits are not all zero, capped at 0xFE; amax 0 -> 0x00, NaN -> 0xFF."""
    a = np.asarray(amax, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        q = (a / np.float32(fp8_max)).astype(np.float32)
    b = np.atleast_1d(q).view(np.uint32).reshape(q.shape)
    e = ((b >> 23) & 0xFF) + ((b & 0x7FFFFF) != 0)
    e = np.minimum(e, 0xFE)
    e = np.where(a == 0, 0, e)
    return np.where(np.isnan(a), 0xFF, e).astype(np.uint8)


def e8m0_value(e) -> np.ndarray:
    """E8M0 byte e -> 2^(e - 127) as fp32 (0xFF: NaN)."""
    e = np.asarray(e, np.int64)
    v = np.ldexp(1.0, e - 127).astype(np.float32)
    return np.where(e == 0xFF, np.float32(np.nan), v).astype(np.float32)


def _mxfp8_copy(v: np.ndarray, fmt: str, block_amax: np.ndarray, scale_buf: np.ndarray) -> np.ndarray:
    """q = convert(x / scale_inv) for a copy stored [R, C] with per-block amaxes [R, nb]."""
    rows, cols = v.shape
    e = e8m0_from_amax(block_amax, FP8_MAX[fmt])
    scale_buf[:rows, : e.shape[1]] = e
    with np.errstate(over="ignore", invalid="ignore"):
        x = v / expand(e8m0_value(e), 32, cols)
    return to_fp8(x, fmt)


def quantize_mxfp8(
    x: np.ndarray, fmt: str, tile_2d: bool, rowwise_scale: np.ndarray, columnwise_scale: np.ndarray
):
    """MXFP8 of x [..., K] as [M, K]: returns (rowwise [M, K], columnwise [K, M]) FP8 bytes and
    fills the scale tables in place (padding untouched)."""
    rows, cols = matrix_dims(x.shape)
    x2 = np.asarray(x).astype(np.float32).reshape(rows, cols)
    if tile_2d:
        t = tile_amax(x2, 32)
        row_amax = np.repeat(t, 32, axis=0)[:rows]
        col_amax = np.repeat(t.T, 32, axis=0)[:cols]
    else:
        row_amax, col_amax = block_amax_rows(x2, 32), block_amax_rows(np.ascontiguousarray(x2.T), 32)
    q_row = _mxfp8_copy(x2, fmt, row_amax, rowwise_scale)
    q_col = _mxfp8_copy(np.ascontiguousarray(x2.T), fmt, col_amax, columnwise_scale)
    return q_row, q_col


def dequantize_mxfp8(q: np.ndarray, fmt: str, scale: np.ndarray) -> np.ndarray:
    """fp32 values of a stored copy [R, C]: float(q) * 2^(e - 127)."""
    rows, cols = q.shape
    with np.errstate(invalid="ignore", over="ignore"):
        return from_fp8(q, fmt) * expand(e8m0_value(scale[:rows, : ceil_div(cols, 32)]), 32, cols)


# ---- NVFP4 ------------------------------------------------------------------------------------


def nvfp4_encode_scale(amax) -> np.float32:
    """S_enc = 2688 / amax in fp32; amax 0 (or negative) or inf -> 1; inf result -> FLT_MAX; NaN
    stays NaN."""
    a = np.float32(amax)
    if np.isnan(a):
        return a
    if not a > 0 or np.isinf(a):
        return np.float32(1.0)
    with np.errstate(over="ignore"):
        s = NVFP4_NUMERATOR / a
    return FLT_MAX if np.isinf(s) else np.float32(s)


def nvfp4_decode_scale(amax) -> np.float32:
    with np.errstate(divide="ignore"):
        return np.float32(np.float32(1.0) / nvfp4_encode_scale(amax))


def to_e2m1(v: np.ndarray) -> np.ndarray:
    """fp32 -> E2M1 codes: ml_dtypes' round-to-nearest-even cast after clamping to +-6; the sign is
    kept (-0 -> 0x8); NaN -> 0x7 (te's rule; ml_dtypes would give -0)."""
    v = np.asarray(v, np.float32)
    codes = np.clip(v, -E2M1_MAX, E2M1_MAX).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    return np.where(np.isnan(v), 7, codes).astype(np.uint8)


def to_e2m1_stochastic(v: np.ndarray, u: np.ndarray) -> np.ndarray:
    """te_quant_config's stochastic rounding: lo <= |v| < hi neighbouring E2M1 values, up iff
    u < (|v| - lo) / (hi - lo) * 2^32 (exact in float64); |v| >= 6 -> 6; sign kept; NaN -> 0x7."""
    v = np.asarray(v, np.float32)
    a = np.abs(v).astype(np.float64)
    idx = np.clip(np.searchsorted(E2M1_GRID.astype(np.float64), a, side="right") - 1, 0, 6)
    lo, hi = E2M1_GRID[idx].astype(np.float64), E2M1_GRID[idx + 1].astype(np.float64)
    with np.errstate(invalid="ignore"):
        up = np.asarray(u, np.float64) < (a - lo) / (hi - lo) * 2.0**32
    mag = np.where(a >= 6.0, 7, idx + up).astype(np.uint8)
    codes = mag | np.where(np.signbit(v), 8, 0).astype(np.uint8)
    return np.where(np.isnan(v), 7, codes).astype(np.uint8)


def philox4x32_10(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32 with 10 rounds (Salmon et al. 2011) on counters [..., 4] uint32 -> [..., 4]."""
    c = [np.asarray(counter[..., i], np.uint64) for i in range(4)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    mask = np.uint64(0xFFFFFFFF)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & mask, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & mask]
        k0 = (k0 + np.uint64(0x9E3779B9)) & mask
        k1 = (k1 + np.uint64(0xBB67AE85)) & mask
    return np.stack(c, axis=-1).astype(np.uint32)


def philox_words(seed: int, offset: int, words: np.ndarray) -> np.ndarray:
    """Word w of the stream (seed, offset): lane w % 4 of Philox4x32-10 with counter
    {lo(w / 4), hi(w / 4), lo(offset), hi(offset)} and key {lo(seed), hi(seed)} (te/quantize.h)."""
    w = np.asarray(words, np.uint64)
    block = w >> np.uint64(2)
    ctr = np.stack(
        [
            block & np.uint64(0xFFFFFFFF),
            block >> np.uint64(32),
            np.full_like(block, offset & 0xFFFFFFFF),
            np.full_like(block, offset >> 32),
        ],
        axis=-1,
    )
    out = philox4x32_10(ctr, (seed & 0xFFFFFFFF, seed >> 32))
    return np.take_along_axis(out, (w & np.uint64(3)).astype(np.int64)[..., None], axis=-1)[..., 0]


def _butterfly(v: np.ndarray) -> np.ndarray:
    """The fp32 radix-2 butterfly over the last axis (16): strides 1, 2, 4, 8, (a, b) -> (a + b,
    a - b), the exact sequence of adds te/quantize.h fixes."""
    v = np.array(v, np.float32, copy=True)
    h = 1
    while h < 16:
        shaped = v.reshape(v.shape[:-1] + (16 // (2 * h), 2, h))
        a, b = shaped[..., 0, :].copy(), shaped[..., 1, :].copy()
        shaped[..., 0, :], shaped[..., 1, :] = a + b, a - b
        v = shaped.reshape(v.shape)
        h *= 2
    return v


def rht_forward(v: np.ndarray) -> np.ndarray:
    """Runs of 16 along the last axis times (1/4) diag(s) H16: signs, butterfly, * 1/4, in fp32."""
    shape = v.shape
    r = np.asarray(v, np.float32).reshape(-1, 16) * RHT_SIGNS
    return (_butterfly(r) * np.float32(0.25)).reshape(shape)


def rht_inverse(v: np.ndarray) -> np.ndarray:
    shape = v.shape
    r = _butterfly(np.asarray(v, np.float32).reshape(-1, 16)) * np.float32(0.25)
    return (r * RHT_SIGNS).reshape(shape)


def hadamard_matrix() -> np.ndarray:
    """(1/4) diag(s) H16 in float64, H16 the Sylvester Hadamard matrix (for checking the butterfly
    computes it)."""
    h = np.array([[1.0]])
    for _ in range(4):
        h = np.block([[h, h], [h, -h]])
    return np.diag(RHT_SIGNS.astype(np.float64)) @ h / 4.0


def _nvfp4_copy(v, block_amax, s_enc, scale_buf, words=None, seed=0, offset=0):
    """One NVFP4 copy stored [R, C] (fp32 values v) with per-block amaxes [R, nb]: fills the E4M3
    scale table, returns E2M1 codes [R, C]."""
    rows, cols = v.shape
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        s_val = ((block_amax / np.float32(6.0)).astype(np.float32) * np.float32(s_enc)).astype(np.float32)
        sb = to_fp8(s_val, E4M3)
        scale_buf[:rows, : sb.shape[1]] = sb
        s_dec = from_fp8(sb, E4M3)
        enc = np.where(s_dec == 0, np.float32(0), (np.float32(s_enc) / s_dec).astype(np.float32))
        enc = np.where(enc > FLT_MAX, FLT_MAX, enc).astype(np.float32)
        x = (v * expand(enc, 16, cols)).astype(np.float32)
    if words is None:
        return to_e2m1(x)
    return to_e2m1_stochastic(x, philox_words(seed, offset, words))


def quantize_nvfp4(
    x: np.ndarray,
    rowwise_scale: np.ndarray,
    columnwise_scale: np.ndarray,
    tile_2d: bool = False,
    rht: bool = False,
    sr: bool = False,
    seed: int = 0,
    offset: int = 0,
):
    """NVFP4 of x [..., K] as [M, K]. Returns (rowwise codes [M, K], columnwise codes [K, M],
    amax [2]); fills the E4M3 scale tables in place. Codes are unpacked (pack_e2m1 packs them)."""
    rows, cols = matrix_dims(x.shape)
    x2 = np.asarray(x).astype(np.float32).reshape(rows, cols)
    n = rows * cols
    idx = np.arange(n, dtype=np.uint64).reshape(rows, cols)
    if tile_2d:
        g = amax(x2)
        t = tile_amax(x2, 16)
        codes = _nvfp4_copy(
            x2,
            np.repeat(t, 16, axis=0)[:rows],
            nvfp4_encode_scale(g),
            rowwise_scale,
            idx if sr else None,
            seed,
            offset,
        )
        columnwise_scale[:cols, : t.shape[0]] = np.repeat(
            rowwise_scale[: t.shape[0] * 16 : 16, : t.shape[1]].T, 16, axis=0
        )[:cols]
        return codes, np.ascontiguousarray(codes.T), np.array([g, g], np.float32)
    g_row = amax(x2)
    q_row = _nvfp4_copy(
        x2,
        block_amax_rows(x2, 16),
        nvfp4_encode_scale(g_row),
        rowwise_scale,
        idx if sr else None,
        seed,
        offset,
    )
    t = np.ascontiguousarray(x2.T)
    if rht:
        t = rht_forward(t)
    g_col = amax(t)
    col_words = (np.uint64(n) + np.arange(n, dtype=np.uint64)).reshape(cols, rows)
    q_col = _nvfp4_copy(
        t,
        block_amax_rows(t, 16),
        nvfp4_encode_scale(g_col),
        columnwise_scale,
        col_words if sr else None,
        seed,
        offset,
    )
    return q_row, q_col, np.array([g_row, g_col], np.float32)


def dequantize_nvfp4(codes: np.ndarray, scale: np.ndarray, global_amax) -> np.ndarray:
    """fp32 values of a stored copy [R, C] of codes: (q * s_block) * s_global."""
    rows, cols = codes.shape
    s_block = from_fp8(scale[:rows, : ceil_div(cols, 16)], E4M3)
    with np.errstate(invalid="ignore", over="ignore"):
        return ((e2m1_value(codes) * expand(s_block, 16, cols)) * nvfp4_decode_scale(global_amax)).astype(
            np.float32
        )
