"""ScaledTensor: the result of te_jax.quantize, a pytree of te's quantized-tensor parts."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class ScaledTensor:
    """A quantized tensor with its decode scales, in te's layouts (te/tensor.h, NUMERICS.md).

    Children (arrays, or None where the part is absent):
      data, scale_inv: the row-wise copy, source-shaped [..., K], and its scale_inv (fp32 [1] for
        per_tensor; the transposed, 4-padded block-scale layout for block modes; one byte per
        block of 32 (E8M0, mxfp8_1d) or 16 (E4M3, nvfp4_1d), row-major, padded to 128 x 4, for
        the MX modes). nvfp4_1d data is the bytes te stores, uint8 [..., K / 2]: two E2M1
        elements a byte, the first in the low nibble.
      columnwise_data, columnwise_scale_inv: the transposed copy [K, M] a GEMM's transposed use
        of the operand needs, and its scale_inv (for the MX modes, a quantization of its own
        along M, not the row-wise copy transposed).
      amax, scale: per_tensor: fp32 [1] each. Current scaling: amax(x) and the scale computed
        from it. Delayed scaling: max(the given amax, amax(x)) and the given scale. nvfp4_1d:
        amax is the fp32 [2] global amaxes the row-wise and column-wise copies were encoded with;
        no scale.
    Static (pytree aux data): scaling_mode ("per_tensor", "block_1d", "block_2d", "mxfp8_1d",
    "nvfp4_1d"), fp8_dtype (the element format: float8_e4m3fn, float8_e5m2 or float4_e2m1fn),
    shape (the source's shape), dq_dtype (the source's dtype, dequantize's default) and
    columnwise_rht (nvfp4_1d: the column-wise copy holds the random Hadamard transform of the
    source; a GEMM must read it against another such copy).
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
    columnwise_rht: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dequantize(self, dtype=None) -> jax.Array:
        """The source-shaped tensor in ``dtype`` (default: the source's), through te-core.

        Reads the row-wise copy when present, else the column-wise one (transposing back, and
        undoing the Hadamard transform where the copy carries it).
        """
        from te_jax._quantize import dequantize

        return dequantize(self, dtype)


jax.tree_util.register_dataclass(
    ScaledTensor,
    data_fields=["data", "scale_inv", "columnwise_data", "columnwise_scale_inv", "amax", "scale"],
    meta_fields=["scaling_mode", "fp8_dtype", "shape", "dq_dtype", "columnwise_rht"],
)
