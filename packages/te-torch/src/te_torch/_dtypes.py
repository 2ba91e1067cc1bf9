"""torch dtypes <-> te dtype ints (te_core._C.DType), and the FP8 formats te-torch accepts."""

from __future__ import annotations

import torch
from te_core import _C

TE_DTYPE: dict[torch.dtype, int] = {
    torch.float32: int(_C.DType.FLOAT32),
    torch.float16: int(_C.DType.FLOAT16),
    torch.bfloat16: int(_C.DType.BFLOAT16),
    torch.float8_e4m3fn: int(_C.DType.FLOAT8_E4M3),
    torch.float8_e5m2: int(_C.DType.FLOAT8_E5M2),
    torch.int32: int(_C.DType.INT32),
    torch.int64: int(_C.DType.INT64),
    torch.uint8: int(_C.DType.UINT8),
}
if hasattr(torch, "float8_e8m0fnu"):
    TE_DTYPE[torch.float8_e8m0fnu] = int(_C.DType.FLOAT8_E8M0)

TORCH_DTYPE: dict[int, torch.dtype] = {v: k for k, v in TE_DTYPE.items()}

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
SOURCE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def te_dtype(dtype: torch.dtype, arg: str) -> int:
    """The te dtype int of a torch dtype; TypeError naming ``arg`` if te has no such dtype."""
    try:
        return TE_DTYPE[dtype]
    except KeyError:
        raise TypeError(
            f"{arg}: expected one of float32, float16, bfloat16 (or a te storage dtype), got {dtype}"
        ) from None


def check_fp8_dtype(fp8_dtype: object, arg: str = "fp8_dtype") -> torch.dtype:
    """Returns ``fp8_dtype`` if it is torch.float8_e4m3fn or torch.float8_e5m2, else raises."""
    if fp8_dtype in FP8_DTYPES:
        return fp8_dtype  # type: ignore[return-value]
    if isinstance(fp8_dtype, torch.dtype):
        raise ValueError(f"{arg}: expected torch.float8_e4m3fn or torch.float8_e5m2, got {fp8_dtype}")
    raise TypeError(
        f"{arg}: expected torch.float8_e4m3fn or torch.float8_e5m2, got {fp8_dtype!r} "
        f"({type(fp8_dtype).__name__})"
    )
