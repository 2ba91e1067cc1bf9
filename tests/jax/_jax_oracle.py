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
