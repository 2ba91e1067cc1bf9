"""ScaledTensor: the result of te_jax.quantize, a pytree of te's quantized-tensor parts."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class ScaledTensor:
    """An FP8 tensor with its decode scales, in te's layouts (te/tensor.h, NUMERICS.md).

    Children (arrays, or None where the part is absent):
      data, scale_inv: the row-wise copy, source-shaped [..., K], and its scale_inv (fp32 [1] for
        per_tensor; the transposed, 4-padded block-scale layout for block modes).
      columnwise_data, columnwise_scale_inv: the transposed copy [K, M] a GEMM's transposed use
        of the operand needs, and its scale_inv.
      amax, scale: fp32 [1], per_tensor only. Current scaling: amax(x) and the scale computed from
        it. Delayed scaling: max(the given amax, amax(x)) and the given scale.
    Static (pytree aux data): scaling_mode ("per_tensor", "block_1d", "block_2d"), fp8_dtype,
    shape (the source's shape) and dq_dtype (the source's dtype, dequantize's default).
    """

    data: Any
    scale_inv: Any
    columnwise_data: Any
    columnwise_scale_inv: Any
    amax: Any
    scale: Any
    scaling_mode: str
    fp8_dtype: np.dtype
    shape: tuple[int, ...]
    dq_dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dequantize(self, dtype=None) -> jax.Array:
        """The source-shaped tensor in ``dtype`` (default: the source's), through te-core.

        Reads the row-wise copy when present, else the column-wise one (transposing back).
        """
        from te_jax._quantize import dequantize

        return dequantize(self, dtype)


jax.tree_util.register_dataclass(
    ScaledTensor,
    data_fields=["data", "scale_inv", "columnwise_data", "columnwise_scale_inv", "amax", "scale"],
    meta_fields=["scaling_mode", "fp8_dtype", "shape", "dq_dtype"],
)
