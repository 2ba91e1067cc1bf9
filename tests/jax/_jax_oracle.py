"""An independent numpy/ml_dtypes oracle for te's FP8, MXFP8 and NVFP4 quantization (NUMERICS.md,
and te/quantize.h where NUMERICS.md leaves a rounding detail open), written from the spec,
sharing nothing with te-core or te_jax."""

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


# ---- MXFP8 and NVFP4 (NUMERICS.md; the rounding details te/quantize.h fixes) ----


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
    with np.errstate(invalid="ignore"):
        q = np.clip(b / sinv, -m, m).astype(fp8)
    return _unblocks(q.astype(np.float32) * sinv, x2.shape)


E2M1 = ml_dtypes.float4_e2m1fn
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float64)
RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)


def _butterfly(v) -> np.ndarray:
    """H16 (Sylvester) on the last axis by the Walsh-Hadamard butterfly in fp32: stage h = 1, 2,
    4, 8 maps the pairs h apart to (a + b, a - b)."""
    v = np.asarray(v, np.float32)
    h = 1
    while h < 16:
        out = v.copy()
        for start in range(0, 16, 2 * h):
            a, b = v[..., start : start + h], v[..., start + h : start + 2 * h]
            out[..., start : start + h] = a + b
            out[..., start + h : start + 2 * h] = a - b
        v = out
        h *= 2
    return v


def rht(x2) -> np.ndarray:
    """Each run of 16 along the last dim, as a row vector v, to v @ ((1/4) diag(s) H16): signs,
    the butterfly, then * 1/4 (exact)."""
    m, k = x2.shape
    v = (np.asarray(x2, np.float32).reshape(m, k // 16, 16) * RHT_SIGNS).astype(np.float32)
    return (_butterfly(v) * np.float32(0.25)).reshape(m, k)


def rht_inverse(x2) -> np.ndarray:
    """rht undone ((H16 / 4)^2 = I): the butterfly, * 1/4, then the signs."""
    m, k = x2.shape
    v = _butterfly(np.asarray(x2, np.float32).reshape(m, k // 16, 16)) * np.float32(0.25)
    return (v * RHT_SIGNS).astype(np.float32).reshape(m, k)


def hadamard16() -> np.ndarray:
    """The Sylvester Hadamard matrix of order 16."""
    h = np.ones((1, 1), np.float32)
    for _ in range(4):
        h = np.block([[h, h], [h, -h]])
    return h


def philox4x32_10(counter: np.ndarray, key) -> np.ndarray:
    """Philox4x32 with 10 rounds (Salmon et al., SC'11): counters [..., 4] uint32 -> [..., 4]."""
    c = [np.asarray(counter[..., i], np.uint64) for i in range(4)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    lo = np.uint64(0xFFFFFFFF)
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c[0], np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & lo, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & lo]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & lo, (k1 + np.uint64(0xBB67AE85)) & lo
    return np.stack(c, axis=-1).astype(np.uint32)


def philox_words(seed: int, offset: int, words) -> np.ndarray:
    """te_quant_config's stream: word w is lane w % 4 of Philox4x32-10 with key {lo(seed),
    hi(seed)} and counter {lo(w / 4), hi(w / 4), lo(offset), hi(offset)}."""
    w = np.asarray(words, np.uint64)
    q = w >> np.uint64(2)
    ctr = np.stack(
        [q & np.uint64(0xFFFFFFFF), q >> np.uint64(32)]
        + [np.full_like(q, v) for v in (offset & 0xFFFFFFFF, offset >> 32)],
        axis=-1,
    )
    out = philox4x32_10(ctr, (seed & 0xFFFFFFFF, seed >> 32))
    return np.take_along_axis(out, (w & np.uint64(3)).astype(np.int64)[..., None], axis=-1)[..., 0]


def e2m1_stochastic(v, u) -> np.ndarray:
    """|v| to one of its E2M1 neighbours lo <= |v| < hi: up iff u < (|v| - lo) / (hi - lo) * 2^32
    (u the 32-bit word, exact in float64); |v| >= 6 -> 6; sign kept."""
    a = np.abs(np.asarray(v, np.float32)).astype(np.float64)
    idx = np.clip(np.searchsorted(E2M1_GRID, a, side="right") - 1, 0, 6)
    lo, hi = E2M1_GRID[idx], E2M1_GRID[idx + 1]
    up = np.asarray(u, np.float64) < (a - lo) / (hi - lo) * 2.0**32
    mag = np.where(a >= 6.0, 6.0, np.where(up, hi, lo))
    return (np.where(np.signbit(v), -1.0, 1.0) * mag).astype(np.float32)


def nvfp4_encode_scale(global_amax) -> np.float32:
    """S_enc = (448 * 6) / amax in fp32; amax 0 or inf -> 1; an inf result -> FLT_MAX."""
    g = np.float32(global_amax)
    if not g > 0 or np.isinf(g):
        return np.float32(1.0)
    with np.errstate(over="ignore"):
        s = np.float32(np.float32(448.0 * 6.0) / g)
    return np.float32(FLT_MAX) if np.isinf(s) else s


def nvfp4(x32, square=False, block=16, global_amax=None, words=None, seed=0, offset=0) -> np.ndarray:
    """NVFP4 quantize-dequantize of the [M, K] view along rows (1x16) or in 16x16 tiles.

    S_enc from the global amax (the view's own unless given); s_block = e4m3((block amax / 6) *
    S_enc); enc = S_enc / s_block (0 where s_block is 0); q = e2m1(x * enc) (RNE saturating to
    +-6, or with ``words`` [M, K] the stochastic rounding of te_quant_config by the Philox words
    of (seed, offset)); x ~ (q * s_block) * (1 / S_enc)."""
    x2 = as_matrix(np.asarray(x32, np.float32))
    s_enc = nvfp4_encode_scale(amax(x2) if global_amax is None else global_amax)
    b = _blocks(x2, block if square else 1, block)
    sb = (np.abs(b).max(axis=(1, 3), keepdims=True) / np.float32(6.0)).astype(np.float32) * s_enc
    sb = np.clip(sb, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        enc = np.where(sb > 0, (s_enc / sb).astype(np.float32), np.float32(0.0))
    v = _unblocks((b * np.minimum(enc, FLT_MAX)).astype(np.float32), x2.shape)
    if words is None:
        q = np.clip(v, -6.0, 6.0).astype(E2M1).astype(np.float32)
    else:
        q = e2m1_stochastic(v, philox_words(seed, offset, words))
    sbe = _unblocks(np.broadcast_to(sb, b.shape), x2.shape)
    return ((q * sbe).astype(np.float32) * (np.float32(1.0) / s_enc)).astype(np.float32)
