"""The op table: what each te-core op takes and returns, described once for both bindings.

te_torch's fake kernels and output allocation, and te_jax's abstract evaluation and FFI result
types, all come from these functions, so the two bindings cannot disagree about a shape. Shapes
come from the C API itself (``te_quantized_shape``), the single source of the layouts.
Dtypes are te dtype ints (``te_core._C.DType``).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from te_core import _C

FLOAT32 = int(_C.DType.FLOAT32)
SOURCE_DTYPES = (int(_C.DType.FLOAT32), int(_C.DType.FLOAT16), int(_C.DType.BFLOAT16))
FP8_DTYPES = (int(_C.DType.FLOAT8_E4M3), int(_C.DType.FLOAT8_E5M2))

SCALING_MODES = {
    "per_tensor": int(_C.ScalingMode.PER_TENSOR),
    "block_1d": int(_C.ScalingMode.BLOCK_1D),
    "block_2d": int(_C.ScalingMode.BLOCK_2D),
}


class TensorSpec(NamedTuple):
    shape: tuple[int, ...]
    dtype: int


ABSENT_SHAPE = (0,)

# The fixed output order of the quantize op; parts not requested come back with ABSENT_SHAPE.
QUANTIZE_OUTPUTS = (
    "rowwise_data",
    "rowwise_scale_inv",
    "columnwise_data",
    "columnwise_scale_inv",
    "amax",
    "scale",
)


@functools.lru_cache(maxsize=4096)
def quantize_outputs(
    shape: tuple[int, ...],
    scaling_mode: int,
    fp8_dtype: int,
    rowwise: bool,
    columnwise: bool,
    per_tensor_stats: bool,
) -> tuple[TensorSpec, ...]:
    """Output specs of quantizing a source of ``shape``, in QUANTIZE_OUTPUTS order.

    ``per_tensor_stats``: whether the op returns an fp32 [1] amax and scale (current scaling);
    otherwise they are absent (delayed scaling updates the caller's own buffers in place, and
    block modes have none).
    """

    def part(which: int, dtype: int, wanted: bool) -> TensorSpec:
        if not wanted:
            return TensorSpec(ABSENT_SHAPE, dtype)
        return TensorSpec(tuple(_C.quantized_shape(scaling_mode, which, shape)), dtype)

    stat = TensorSpec((1,) if per_tensor_stats else ABSENT_SHAPE, FLOAT32)
    return (
        part(int(_C.Part.ROWWISE_DATA), fp8_dtype, rowwise),
        part(int(_C.Part.ROWWISE_SCALE_INV), FLOAT32, rowwise),
        part(int(_C.Part.COLUMNWISE_DATA), fp8_dtype, columnwise),
        part(int(_C.Part.COLUMNWISE_SCALE_INV), FLOAT32, columnwise),
        stat,
        stat,
    )


def dequantize_output(source_shape: tuple[int, ...], out_dtype: int) -> TensorSpec:
    """The dequantize op returns the source's shape in ``out_dtype``."""
    return TensorSpec(tuple(source_shape), out_dtype)


def transpose_output(shape: tuple[int, ...], dtype: int) -> TensorSpec:
    """A [.., K] tensor viewed as [M, K] transposes to [K, M]."""
    cols = shape[-1] if shape else 1
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return TensorSpec((cols, rows), dtype)


GEMM_OUTPUTS = ("d", "aux", "bias_grad")


def gemm_dims(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], trans_a: bool, trans_b: bool
) -> tuple[int, int, int]:
    """(M, N, K) of D = op(A) op(B) for sources of these shapes (te/gemm.h: row-major; A is
    [M, K], or [K, M] with trans_a; B is [K, N], or [N, K] with trans_b; leading dims of an
    operand flatten into its rows)."""

    def matrix(shape: tuple[int, ...]) -> tuple[int, int]:
        cols = shape[-1] if shape else 1
        rows = 1
        for d in shape[:-1]:
            rows *= d
        return rows, cols

    a_rows, a_cols = matrix(a_shape)
    b_rows, b_cols = matrix(b_shape)
    m, k = (a_cols, a_rows) if trans_a else (a_rows, a_cols)
    n, k_b = (b_rows, b_cols) if trans_b else (b_cols, b_rows)
    if k != k_b:
        raise ValueError(
            f"gemm: op(A) is [{m}, {k}] but op(B) is [{k_b}, {n}]: the inner dimensions must match "
            f"(A {tuple(a_shape)}, trans_a={trans_a}; B {tuple(b_shape)}, trans_b={trans_b})"
        )
    return m, n, k


def gemm_outputs(
    m: int, n: int, out_dtype: int, aux: bool, bias_grad: bool, bias_grad_dtype: int
) -> tuple[TensorSpec, ...]:
    """Output specs of te_gemm in GEMM_OUTPUTS order: D [M, N] in ``out_dtype``; the GELU
    pre-activation ``aux`` [M, N] (same dtype) when asked; ``bias_grad`` [M] when asked. Absent
    ones have ABSENT_SHAPE."""
    return (
        TensorSpec((m, n), out_dtype),
        TensorSpec((m, n) if aux else ABSENT_SHAPE, out_dtype),
        TensorSpec((m,) if bias_grad else ABSENT_SHAPE, bias_grad_dtype),
    )
