"""numpy buffers of MXFP8 / NVFP4 quantized tensors (te/tensor.h layouts) and their descriptors, for
the tests of te_quantize, te_dequantize and te_gemm with those modes."""

from __future__ import annotations

import numpy as np
from _buffers import FP8_DTYPE, tensor
from _oracle import matrix_dims, mx_scale_shape
from te_core import _C

D, M = _C.DType, _C.ScalingMode
MODE = {"mxfp8": int(M.MXFP8_1D), "nvfp4": int(M.NVFP4_1D)}
SCALE_DTYPE = {"mxfp8": int(D.FLOAT8_E8M0), "nvfp4": int(D.FLOAT8_E4M3)}
E2M1 = int(D.FLOAT4_E2M1)
# Sentinels te must never write: data and scale bytes start as 0xAB, NVFP4 amax as a NaN payload.
SENTINEL = 0xAB
AMAX_SENTINEL_BITS = np.uint32(0x7FBADBAD)


class MxQuantized:
    """The buffers of one MXFP8 or NVFP4 te_quantized_tensor, sentinel-filled, and its descriptor.

    family: "mxfp8" (fmt "e4m3"/"e5m2") or "nvfp4" (fmt ignored). NVFP4 data is packed: a copy
    stored [R, C] is R * C / 2 bytes."""

    def __init__(self, family, shape, fmt="e4m3", rowwise=True, columnwise=True, rht=False, amax=True):
        self.family, self.fmt, self.shape = family, fmt, tuple(shape)
        self.rows, self.cols = matrix_dims(shape)
        self.rht = rht
        nv = family == "nvfp4"

        def data(stored_shape):
            n = int(np.prod(stored_shape, dtype=np.int64))
            return np.full(n // 2 if nv else stored_shape, SENTINEL, np.uint8)

        self.rowwise = data(self.shape) if rowwise else None
        self.rowwise_scale_inv = (
            np.full(mx_scale_shape(family, self.rows, self.cols), SENTINEL, np.uint8) if rowwise else None
        )
        self.columnwise = data((self.cols, self.rows)) if columnwise else None
        self.columnwise_scale_inv = (
            np.full(mx_scale_shape(family, self.cols, self.rows), SENTINEL, np.uint8) if columnwise else None
        )
        self.amax = np.full(2, AMAX_SENTINEL_BITS, np.uint32).view(np.float32) if (nv and amax) else None

    @property
    def data_dtype(self) -> int:
        return E2M1 if self.family == "nvfp4" else FP8_DTYPE[self.fmt]

    def descriptor(self) -> _C.QuantizedTensor:
        dd, sd = self.data_dtype, SCALE_DTYPE[self.family]
        row_shape, col_shape = list(self.shape), [self.cols, self.rows]
        return _C.QuantizedTensor(
            MODE[self.family],
            rowwise_data=None if self.rowwise is None else tensor(self.rowwise, dd, row_shape),
            rowwise_scale_inv=None if self.rowwise is None else tensor(self.rowwise_scale_inv, sd),
            columnwise_data=None if self.columnwise is None else tensor(self.columnwise, dd, col_shape),
            columnwise_scale_inv=None if self.columnwise is None else tensor(self.columnwise_scale_inv, sd),
            amax=None if self.amax is None else tensor(self.amax),
            columnwise_rht=self.rht,
        )

    def quantize(self, x: np.ndarray, config=None) -> MxQuantized:
        _C.quantize(tensor(x), self.descriptor(), config)
        return self

    def dequantize(self, out_dtype=np.float32, copy: str = "rowwise") -> np.ndarray:
        """te_dequantize of one copy ("rowwise" or "columnwise", the other left out)."""
        d = self.descriptor()
        if copy == "rowwise":
            d.columnwise_data = _C.Tensor(0, 0, [])
        else:
            d.rowwise_data = _C.Tensor(0, 0, [])
        out = np.zeros(self.shape, out_dtype)
        _C.dequantize(d, tensor(out))
        return out
