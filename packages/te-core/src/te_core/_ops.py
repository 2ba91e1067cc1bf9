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
