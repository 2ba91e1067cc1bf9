"""numpy buffers <-> te_core._C descriptors, and the awkward random inputs every op test uses."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from _oracle import E4M3, E5M2, FP8_MAX, FP8_TYPE
from te_core import _C

D = _C.DType
FP8_DTYPE = {E4M3: int(D.FLOAT8_E4M3), E5M2: int(D.FLOAT8_E5M2)}
SOURCE_DTYPES = {
    np.dtype(np.float32): int(D.FLOAT32),
    np.dtype(np.float16): int(D.FLOAT16),
    np.dtype(ml_dtypes.bfloat16): int(D.BFLOAT16),
}
SOURCE_TYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
INT_VIEW = {1: np.uint8, 2: np.uint16, 4: np.uint32}

# Sentinels that te must never write: FP8 data starts as 0xAB, fp32 scale buffers as a NaN
# payload no computation produces, so "untouched" is checkable bit for bit.
DATA_SENTINEL = 0xAB
SCALE_SENTINEL_BITS = np.uint32(0x7FBADBAD)


def te_dtype(arr: np.ndarray, dtype: int | None = None) -> int:
    if dtype is not None:
        return int(dtype)
    return SOURCE_DTYPES[arr.dtype]


# Arrays whose memory a descriptor points at, kept alive until the test ends (conftest.py clears
# it): a descriptor does not own memory, and `tensor(np.zeros(...))` would otherwise hand te a
# freed buffer.
ALIVE: list[np.ndarray] = []


def tensor(arr: np.ndarray, dtype: int | None = None, shape=None) -> _C.Tensor:
    """A CPU te_tensor over arr's memory; arr is kept alive for the rest of the test."""
    assert arr.flags.c_contiguous
    ALIVE.append(arr)
    return _C.Tensor(arr.ctypes.data, te_dtype(arr, dtype), list(arr.shape if shape is None else shape))


def fp8_buffer(shape) -> np.ndarray:
    return np.full(shape, DATA_SENTINEL, np.uint8)


def scale_buffer(shape) -> np.ndarray:
    return np.full(shape, SCALE_SENTINEL_BITS, np.uint32).view(np.float32)


def f32(value=0.0, shape=(1,)) -> np.ndarray:
    return np.full(shape, value, np.float32)


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bits of an array, for exact comparisons."""
    a = np.ascontiguousarray(a)
    return a.view(INT_VIEW[a.dtype.itemsize])


def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    g, w = bits(got), bits(want)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (
        f"{what}: {bad.size} of {g.size} differ; first at flat {bad[:5].tolist()}: "
        f"got {g.reshape(-1)[bad[:5]].tolist()}, want {w.reshape(-1)[bad[:5]].tolist()}"
    )


def assert_fp8_equal(got: np.ndarray, want: np.ndarray, fmt: str, what: str = "") -> None:
    """FP8 bytes equal bit for bit, except NaNs, which need only be NaN on both sides."""
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    t = FP8_TYPE[fmt]
    gn = np.isnan(got.view(t).astype(np.float32))
    wn = np.isnan(want.view(t).astype(np.float32))
    bad = np.flatnonzero((gn != wn) | (~wn & (got != want)))
    assert bad.size == 0, (
        f"{what}: {bad.size} of {got.size} FP8 bytes differ; first at flat "
        f"{bad[:5].tolist()}: got {got.reshape(-1)[bad[:5]].tolist()}, want "
        f"{want.reshape(-1)[bad[:5]].tolist()}"
    )


def assert_float_equal(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Floats equal bit for bit (sign of zero included), NaNs compared by NaN-ness."""
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    g32, w32 = got.astype(np.float32), want.astype(np.float32)
    gn, wn = np.isnan(g32), np.isnan(w32)
    bad = np.flatnonzero((gn != wn) | (~wn & (bits(got) != bits(want))))
    assert bad.size == 0, (
        f"{what}: {bad.size} of {got.size} differ; first at flat {bad[:5].tolist()}: "
        f"got {g32.reshape(-1)[bad[:5]].tolist()}, want {w32.reshape(-1)[bad[:5]].tolist()}"
    )


# ---- awkward inputs -----------------------------------------------------------------------------


def rng_for(*key) -> np.random.Generator:
    """A generator seeded from a test's parameters: reproducible, different per case."""
    import zlib

    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def fp8_ties(rng: np.random.Generator, n: int, fmt: str) -> np.ndarray:
    """n fp32 values exactly halfway between two neighbouring finite FP8 values of fmt (both
    signs, normal and subnormal range): the cases round-to-nearest-even decides."""
    grid = np.arange(256, dtype=np.uint8).view(FP8_TYPE[fmt]).astype(np.float64)
    grid = np.unique(grid[np.isfinite(grid) & (grid >= 0)])
    mids = (grid[1:] + grid[:-1]) / 2  # exact in fp32: one bit more than the FP8 mantissa
    pick = mids[rng.integers(0, mids.size, n)]
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (pick * sign).astype(np.float32)


def awkward(
    rng: np.random.Generator,
    shape,
    dtype,
    fmt: str = E4M3,
    scale: float = 1.0,
    specials: bool = True,
    huge: bool = True,
) -> np.ndarray:
    """Random data of `dtype` with, where specials: values near the dtype's max (if huge), values
    near FP8 max / scale, subnormals of `dtype`, zeros of both signs, values that are exact FP8
    ties once multiplied by `scale`, +-inf and NaN. `scale` must be a power of two for the ties
    to stay exact."""
    n = int(np.prod(shape, dtype=np.int64))
    x = (rng.standard_normal(n) * np.exp2(rng.uniform(-8, 8, n))).astype(np.float32)
    if specials and n:
        info = ml_dtypes.finfo(dtype)
        kind = rng.integers(0, 16, n)
        big = float(info.max)
        x = np.where(kind == 0, 0.0, x)
        x = np.where(kind == 1, -0.0, x)
        if huge:
            x = np.where(kind == 2, np.float32(big) * rng.uniform(0.5, 1.0, n) * np.sign(x + 0.5), x)
        tiny = float(info.smallest_subnormal)
        x = np.where(kind == 3, tiny * rng.integers(1, 64, n) * np.where(rng.random(n) < 0.5, -1, 1), x)
        x = np.where(kind == 4, fp8_ties(rng, n, fmt) / np.float32(scale), x)
        x = np.where(kind == 5, fp8_ties(rng, n, fmt) / np.float32(scale), x)
        x = np.where(kind == 6, FP8_MAX[fmt] / np.float32(scale) * rng.uniform(0.9, 1.1, n), x)
        x = x.astype(np.float32)
        # A few infinities and NaNs, not so many that every block's amax is NaN.
        m = rng.random(n)
        x[m < 0.002] = np.inf
        x[(m >= 0.002) & (m < 0.004)] = -np.inf
        x[(m >= 0.004) & (m < 0.006)] = np.nan
    with np.errstate(over="ignore"):
        out = x.astype(dtype).reshape(shape)
    return np.ascontiguousarray(out)


def finite_awkward(rng, shape, dtype, fmt=E4M3, scale=1.0, huge=True) -> np.ndarray:
    """awkward() without inf/NaN (so an amax, and hence block and current scales, are usable)."""
    x = awkward(rng, shape, dtype, fmt, scale, huge=huge)
    x32 = x.astype(np.float32)
    x32[~np.isfinite(x32)] = 1.5
    return np.ascontiguousarray(x32.astype(dtype))


# ---- running quantize -------------------------------------------------------------------------


class Quantized:
    """The numpy buffers of one te_quantized_tensor, sentinel-filled, and its descriptor."""

    def __init__(self, mode: int, shape, fmt: str, rowwise=True, columnwise=True, amax=None, scale=None):
        from _oracle import matrix_dims

        self.mode, self.fmt, self.shape = int(mode), fmt, tuple(shape)
        rows, cols = matrix_dims(shape)
        P = _C.Part

        def sshape(part):
            return _C.quantized_shape(self.mode, int(part), list(shape))

        self.rowwise = fp8_buffer(self.shape) if rowwise else None
        self.rowwise_scale_inv = scale_buffer(sshape(P.ROWWISE_SCALE_INV)) if rowwise else None
        self.columnwise = fp8_buffer((cols, rows)) if columnwise else None
        self.columnwise_scale_inv = scale_buffer(sshape(P.COLUMNWISE_SCALE_INV)) if columnwise else None
        self.amax = None if amax is None else f32(amax)
        self.scale = None if scale is None else f32(scale)

    def descriptor(self) -> _C.QuantizedTensor:
        d = FP8_DTYPE[self.fmt]

        def t(a, dt=None):
            return None if a is None else tensor(a, dt)

        return _C.QuantizedTensor(
            self.mode,
            rowwise_data=t(self.rowwise, d),
            rowwise_scale_inv=t(self.rowwise_scale_inv),
            columnwise_data=t(self.columnwise, d),
            columnwise_scale_inv=t(self.columnwise_scale_inv),
            amax=t(self.amax),
            scale=t(self.scale),
        )

    def quantize(self, x: np.ndarray, config=None) -> Quantized:
        _C.quantize(tensor(x), self.descriptor(), config)
        return self
