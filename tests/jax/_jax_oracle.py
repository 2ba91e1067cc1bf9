"""An independent numpy/ml_dtypes oracle for te's FP8 quantization (NUMERICS.md), written from
the spec, sharing nothing with te-core or te_jax."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FP8_MAX = {ml_dtypes.float8_e4m3fn: 448.0, ml_dtypes.float8_e5m2: 57344.0}
FLT_MAX = np.finfo(np.float32).max


def fp8_max(fp8) -> float:
    return FP8_MAX[np.dtype(fp8).type]


def scale_from_amax(amax, fp8, pow2: bool, eps: float = 0.0) -> np.float32:
    """Current/block scaling: amax = max(amax, eps); 0/inf/NaN -> 1; fp8_max / amax (correctly
    rounded fp32 division), inf -> FLT_MAX; pow2 clears the mantissa bits."""
    amax = np.float32(amax)
    if not np.isnan(amax) and amax < np.float32(eps):
        amax = np.float32(eps)
    if amax == 0 or not np.isfinite(amax):
        scale = np.float32(1.0)
    else:
        with np.errstate(over="ignore"):
            scale = np.float32(np.float32(fp8_max(fp8)) / amax)
        if np.isinf(scale):
            scale = np.float32(FLT_MAX)
    if pow2:
        bits = np.array(scale, np.float32).view(np.uint32) & np.uint32(0xFF800000)
        scale = bits.view(np.float32)[()]
    return np.float32(scale)


def cast(x32: np.ndarray, scale, fp8) -> np.ndarray:
    """q = convert(x * scale): fp32 product, clip to +-max (saturating finite and inf), RNE."""
    y = np.asarray(x32, np.float32) * np.float32(scale)
    m = np.float32(fp8_max(fp8))
    return np.clip(y, -m, m).astype(fp8)


def amax(x32: np.ndarray) -> np.float32:
    a = np.abs(np.asarray(x32, np.float32))
    return np.float32(a.max()) if a.size else np.float32(0.0)


def as_matrix(x: np.ndarray) -> np.ndarray:
    k = x.shape[-1] if x.ndim else 1
    return x.reshape(-1, k)


def per_tensor(x32, fp8, *, scale=None, pow2=False, eps=0.0):
    """(q [x.shape], scale, scale_inv, amax) for current (scale None) or delayed scaling."""
    a = amax(x32)
    if scale is None:
        scale = scale_from_amax(a, fp8, pow2, eps)
    scale = np.float32(scale)
    return cast(x32, scale, fp8), scale, np.float32(np.float32(1.0) / scale), a


def block_1d(x32, fp8, *, pow2=True, eps=0.0, block=128):
    """1x128 blocks along rows of the [M, K] view: (q [M, K], scale_inv [ceil(K/128), M])."""
    x2 = as_matrix(np.asarray(x32, np.float32))
    m, k = x2.shape
    nb = math.ceil(k / block)
    q = np.zeros((m, k), fp8)
    sinv = np.zeros((nb, m), np.float32)
    for b in range(nb):
        blk = x2[:, b * block : (b + 1) * block]
        for r in range(m):
            s = scale_from_amax(amax(blk[r]), fp8, pow2, eps)
            q[r, b * block : (b + 1) * block] = cast(blk[r], s, fp8)
            sinv[b, r] = np.float32(1.0) / s
    return q, sinv


def block_2d(x32, fp8, *, pow2=True, eps=0.0, block=128):
    """128x128 tiles of the [M, K] view: (q [M, K], scale_inv [ceil(M/128), ceil(K/128)])."""
    x2 = as_matrix(np.asarray(x32, np.float32))
    m, k = x2.shape
    mb, kb = math.ceil(m / block), math.ceil(k / block)
    q = np.zeros((m, k), fp8)
    sinv = np.zeros((mb, kb), np.float32)
    for i in range(mb):
        for j in range(kb):
            tile = x2[i * block : (i + 1) * block, j * block : (j + 1) * block]
            s = scale_from_amax(amax(tile), fp8, pow2, eps)
            q[i * block : (i + 1) * block, j * block : (j + 1) * block] = cast(tile, s, fp8)
            sinv[i, j] = np.float32(1.0) / s
    return q, sinv


def bits(a) -> np.ndarray:
    """The raw bytes of an fp8 array, for bit-exact comparison."""
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32)


def random_source(rng, shape, dtype) -> np.ndarray:
    """Awkward values: magnitudes over 8 decades, zeros, exact ties after scaling are likely for
    values with few mantissa bits, plus both signs."""
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.float32(10.0) ** rng.uniform(-4, 4, shape).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size > 4:
        flat[rng.integers(0, flat.size, max(1, flat.size // 50))] = 0.0
        # few-mantissa-bit values: ties of the fp8 rounding once scaled by a power of two
        idx = rng.integers(0, flat.size, max(1, flat.size // 10))
        flat[idx] = (rng.integers(-64, 64, idx.size) * 0.5 + 0.25).astype(np.float32)
    return x.astype(dtype)


# ---- MXFP8 and NVFP4 (NUMERICS.md), for te_jax's emulation of them ----


def _blocks(x2, rows, cols):
    """x2 [M, K] zero-padded to whole blocks, as [M/rows, rows, K/cols, cols] (a copy)."""
    m, k = x2.shape
    out = np.zeros((-(-m // rows) * rows, -(-k // cols) * cols), np.float32)
    out[:m, :k] = x2
    return out.reshape(out.shape[0] // rows, rows, out.shape[1] // cols, cols)


def _unblocks(b, shape):
    m, k = shape
    return b.reshape(b.shape[0] * b.shape[1], b.shape[2] * b.shape[3])[:m, :k]


def e8m0_scale_inv(amaxes, fp8) -> np.ndarray:
    """2^(e - 127) per amax, e the E8M0 of amax / fp8_max rounded up (mantissa bits set -> e + 1,
    capped at 0xFE; amax 0 -> 0x00); NaN amax -> NaN."""
    a = np.asarray(amaxes, np.float32)
    q = (a / np.float32(fp8_max(fp8))).astype(np.float32)
    bits = q.view(np.uint32).astype(np.int64)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0)
    e = np.minimum(e, 0xFE)
    out = np.ldexp(np.float64(1.0), e - 127).astype(np.float32)
    return np.where(np.isnan(a), np.float32(np.nan), out)


def mxfp8(x32, fp8, square=False, block=32) -> np.ndarray:
    """MXFP8 quantize-dequantize of the [M, K] view along rows (1x32) or in 32x32 tiles."""
    x2 = as_matrix(np.asarray(x32, np.float32))
    b = _blocks(x2, block if square else 1, block)
    sinv = e8m0_scale_inv(np.abs(b).max(axis=(1, 3), keepdims=True), fp8)
    m = np.float32(fp8_max(fp8))
    q = np.clip(b / sinv, -m, m).astype(fp8)
    return _unblocks(q.astype(np.float32) * sinv, x2.shape)


E2M1 = ml_dtypes.float4_e2m1fn
RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)


def rht(x2) -> np.ndarray:
    """Each run of 16 along the last dim, as a row vector v, to v @ ((1/4) diag(s) H16): signs,
    then H16 (Sylvester) by the Walsh-Hadamard butterfly in fp32 (stage h: a + b, a - b for
    the pairs h apart), then * 1/4 (exact)."""
    m, k = x2.shape
    v = (x2.reshape(m, k // 16, 16) * RHT_SIGNS).astype(np.float32)
    h = 1
    while h < 16:
        out = v.copy()
        for start in range(0, 16, 2 * h):
            a, b = v[..., start : start + h], v[..., start + h : start + 2 * h]
            out[..., start : start + h] = a + b
            out[..., start + h : start + 2 * h] = a - b
        v = out
        h *= 2
    return (v * np.float32(0.25)).reshape(m, k)


def hadamard16() -> np.ndarray:
    """The Sylvester Hadamard matrix of order 16."""
    h = np.ones((1, 1), np.float32)
    for _ in range(4):
        h = np.block([[h, h], [h, -h]])
    return h


def nvfp4(x32, square=False, block=16) -> np.ndarray:
    """NVFP4 quantize-dequantize of the [M, K] view along rows (1x16) or in 16x16 tiles:
    S_enc = 2688 / global amax (amax 0 -> 1, inf -> FLT_MAX); s_block = e4m3(block amax / 6 *
    S_enc); q = e2m1(x * S_enc / s_block) (RNE, saturating; 0 where s_block is 0);
    x ~ q * s_block * (1 / S_enc)."""
    x2 = as_matrix(np.asarray(x32, np.float32))
    g = amax(x2)
    with np.errstate(over="ignore", divide="ignore"):
        s_enc = np.float32(np.float32(448.0 * 6.0) / g) if g > 0 else np.float32(1.0)
    if np.isinf(s_enc):
        s_enc = np.float32(FLT_MAX)
    b = _blocks(x2, block if square else 1, block)
    sb = (np.abs(b).max(axis=(1, 3), keepdims=True) / np.float32(6.0)).astype(np.float32) * s_enc
    sb = np.clip(sb, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.clip((b * s_enc) / sb, -6.0, 6.0).astype(np.float32)
    q = np.where(sb > 0, np.nan_to_num(v).astype(E2M1).astype(np.float32), np.float32(0.0))
    return _unblocks((q * sb) * (np.float32(1.0) / s_enc), x2.shape)
