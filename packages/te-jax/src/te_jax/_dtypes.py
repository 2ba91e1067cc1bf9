"""te dtype ints (te_core._C.DType) <-> JAX dtypes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from te_core import _C

_TE_TO_JNP = {
    int(_C.DType.FLOAT32): np.dtype(jnp.float32),
    int(_C.DType.FLOAT16): np.dtype(jnp.float16),
    int(_C.DType.BFLOAT16): np.dtype(jnp.bfloat16),
    int(_C.DType.FLOAT8_E4M3): np.dtype(jnp.float8_e4m3fn),
    int(_C.DType.FLOAT8_E5M2): np.dtype(jnp.float8_e5m2),
    int(_C.DType.INT32): np.dtype(jnp.int32),
    int(_C.DType.INT64): np.dtype(jnp.int64),
    int(_C.DType.UINT8): np.dtype(jnp.uint8),
}
if hasattr(jnp, "float8_e8m0fnu"):  # jax >= 0.5.x
    _TE_TO_JNP[int(_C.DType.FLOAT8_E8M0)] = np.dtype(jnp.float8_e8m0fnu)
_JNP_TO_TE = {dtype: te for te, dtype in _TE_TO_JNP.items()}

# What quantize accepts, with the names error messages list.
SOURCE = {
    np.dtype(jnp.float32): "float32",
    np.dtype(jnp.float16): "float16",
    np.dtype(jnp.bfloat16): "bfloat16",
}
FP8 = {np.dtype(jnp.float8_e4m3fn): "float8_e4m3fn", np.dtype(jnp.float8_e5m2): "float8_e5m2"}


def to_jnp(te_dtype: int) -> np.dtype:
    return _TE_TO_JNP[te_dtype]


def to_te(dtype: np.dtype) -> int:
    return _JNP_TO_TE[np.dtype(dtype)]


def as_dtype(value, name: str, accepted: dict[np.dtype, str]) -> np.dtype:
    """``value`` as a numpy dtype from ``accepted``, else TypeError naming ``name``."""
    expected = ", ".join(f"jnp.{n}" for n in accepted.values())
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise TypeError(f"{name}: expected one of {expected}, got {value!r}") from None
    if dtype not in accepted:
        raise TypeError(f"{name}: expected one of {expected}, got {dtype.name}")
    return dtype
