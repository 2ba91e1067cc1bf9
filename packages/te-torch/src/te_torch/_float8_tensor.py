"""Float8Tensor: an FP8 tensor with one per-tensor scale (delayed or current scaling).

Fields (TE's names): ``_data`` row-wise FP8 data with the logical shape [..., K];
``_transpose`` the column-wise copy, FP8 [K, M] with M = numel / K (the transposed operand a
Hopper TN GEMM needs); ``_scale_inv`` fp32 [1], the decode scale (x ~= q * scale_inv); either
copy may be absent (None), not both. ``dtype`` is the high-precision dtype it was quantized from
(what ``dequantize()`` returns by default); ``_fp8_dtype`` the FP8 element type.
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch import _fsdp, _kernels
from te_torch._dtypes import check_fp8_dtype
from te_torch._quantized_tensor import QuantizedTensor, is_eager, row_handlers

_PER_TENSOR = int(_C.ScalingMode.PER_TENSOR)


class Float8Tensor(QuantizedTensor):
    """FP8 tensor with a per-tensor scale. Built by Float8Quantizer /
    Float8CurrentScalingQuantizer; see the module docstring for the fields and layouts."""

    _data: torch.Tensor | None
    _transpose: torch.Tensor | None
    _scale_inv: torch.Tensor
    _fp8_dtype: torch.dtype
    _quantizer: object
    _SPLIT_KEEPS_FP8 = "Float8Tensor pieces stay FP8 when split along dim 0 with a row-wise copy"

    def __new__(
        cls,
        *,
        shape: torch.Size | tuple[int, ...],
        dtype: torch.dtype,
        data: torch.Tensor | None,
        fp8_scale_inv: torch.Tensor,
        fp8_dtype: torch.dtype,
        data_transpose: torch.Tensor | None = None,
        quantizer: object = None,
        requires_grad: bool = False,
    ) -> Float8Tensor:
        src = data if data is not None else data_transpose
        if src is None:
            raise ValueError("Float8Tensor: data and data_transpose are both None; need one")
        self = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=dtype, device=src.device, requires_grad=requires_grad
        )
        self._data = data
        self._transpose = data_transpose
        self._scale_inv = fp8_scale_inv
        self._fp8_dtype = fp8_dtype
        self._quantizer = quantizer
        return self

    def _tensors(self) -> tuple:
        return self._data, self._transpose, self._scale_inv

    def _same_format(self, other) -> bool:
        return isinstance(other, Float8Tensor) and other._fp8_dtype == self._fp8_dtype

    def _like(self, data, transpose, scale_inv, requires_grad=False) -> Float8Tensor:
        return Float8Tensor(
            shape=self.shape,
            dtype=self.dtype,
            data=data,
            fp8_scale_inv=scale_inv,
            fp8_dtype=self._fp8_dtype,
            data_transpose=transpose,
            quantizer=self._quantizer,
            requires_grad=requires_grad,
        )

    # -- numerics -------------------------------------------------------------------------------

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:  # type: ignore[override]
        """x = q * scale_inv as a new ``dtype`` tensor (default: self.dtype) of self.shape.

        Reads ``_data`` if present, else ``_transpose`` (transposed back)."""
        dtype = self.dtype if dtype is None else dtype
        src = self._data if self._data is not None else self._transpose
        if is_eager(src):
            return _kernels.dequantize(
                self._data,
                self._scale_inv,
                self._transpose,
                self._scale_inv,
                _PER_TENSOR,
                self.shape,
                dtype,
            )
        return torch.ops.te.dequantize(
            self._data,
            self._scale_inv,
            self._transpose,
            self._scale_inv,
            _PER_TENSOR,
            list(self.shape),
            dtype,
        )

    def quantize_(self, src: torch.Tensor) -> Float8Tensor:
        """Quantizes ``src`` into this tensor in place with its quantizer (a current-scaling one
        of the same FP8 dtype if it has none); both copies present are rewritten."""
        from te_torch._quantizers import Float8CurrentScalingQuantizer

        quantizer = self._quantizer
        if quantizer is None:
            quantizer = Float8CurrentScalingQuantizer(self._fp8_dtype, self.device)
        group = _fsdp.amax_group(self._scale_inv)
        if group is not None and isinstance(quantizer, Float8CurrentScalingQuantizer):
            # an FSDP2 shard: the scale of the whole weight, which every shard shares
            amax = _fsdp.reduced_amax(src, group)
            quantizer = Float8CurrentScalingQuantizer(
                self._fp8_dtype,
                self.device,
                use_existing_amax=True,
                force_pow_2_scales=quantizer.force_pow_2_scales,
                amax_epsilon=quantizer.amax_epsilon,
            )
            quantizer.amax.copy_(amax)
        quantizer.update_quantized(src, self)
        return self

    def update_usage(self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None) -> None:
        """Makes (by an FP8 transpose, exact) or drops the row-wise / column-wise copy."""
        want_row = (self._data is not None) if rowwise_usage is None else rowwise_usage
        want_col = (self._transpose is not None) if columnwise_usage is None else columnwise_usage
        if not want_row and not want_col:
            raise ValueError(
                "Float8Tensor.update_usage: rowwise_usage and columnwise_usage cannot both be "
                "False (the tensor would hold no data)"
            )
        if want_col and self._transpose is None:
            self._transpose = _transpose(self._data)
        if want_row and self._data is None:
            self._data = _transpose(self._transpose).view(self.shape)
        if not want_row:
            self._data = None
        if not want_col:
            self._transpose = None

    # -- torch integration ----------------------------------------------------------------------

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """FSDP2's all-gather extension: the shard's FP8 bytes go over the wire (te_torch._fsdp)."""
        return _fsdp.pre_all_gather(self, mesh, outer_size)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        """The unsharded weight from the gathered bytes (te_torch._fsdp)."""
        return _fsdp.post_all_gather(self, all_gather_outputs, metadata, param_dtype, out)

    def __repr__(self, *, tensor_contents=None) -> str:  # noqa: D105
        # Under tracing the parts are fake tensors with no values to show.
        values = is_eager(self._scale_inv)
        scale_inv = f"{self._scale_inv.item():.6g}" if values else "?"
        data = f", data={self.dequantize()}" if values else ""
        return (
            f"Float8Tensor(shape={tuple(self.shape)}, fp8_dtype={self._fp8_dtype}, "
            f"dtype={self.dtype}, scale_inv={scale_inv}, "
            f"rowwise={self._data is not None}, columnwise={self._transpose is not None}{data})"
        )

    def __tensor_flatten__(self):
        names = [n for n in ("_data", "_transpose", "_scale_inv") if getattr(self, n) is not None]
        return names, (self._fp8_dtype, self.dtype)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        fp8_dtype, dtype = ctx
        return Float8Tensor(
            shape=outer_size,
            dtype=dtype,
            data=inner.get("_data"),
            fp8_scale_inv=inner["_scale_inv"],
            fp8_dtype=fp8_dtype,
            data_transpose=inner.get("_transpose"),
        )

    def __reduce_ex__(self, protocol):
        # The quantizer is not saved (it may own recipe state); a loaded tensor has none.
        return (
            _rebuild_float8_tensor,
            (
                tuple(self.shape),
                self.dtype,
                self._data,
                self._scale_inv,
                self._fp8_dtype,
                self._transpose,
                self.requires_grad,
            ),
        )


def _rebuild_float8_tensor(shape, dtype, data, scale_inv, fp8_dtype, transpose, requires_grad):
    return Float8Tensor(
        shape=shape,
        dtype=dtype,
        data=data,
        fp8_scale_inv=scale_inv,
        fp8_dtype=check_fp8_dtype(fp8_dtype),
        data_transpose=transpose,
        requires_grad=requires_grad,
    )


def _transpose(data: torch.Tensor) -> torch.Tensor:
    return _kernels.transpose(data) if is_eager(data) else torch.ops.te.transpose(data)


# -- natively implemented ops ---------------------------------------------------------------------


def _rows(t: Float8Tensor, data: torch.Tensor, transpose: torch.Tensor | None = None) -> Float8Tensor:
    """A Float8Tensor over ``data`` (a view or piece of t's row-wise bytes) with t's scale."""
    return Float8Tensor(
        shape=data.shape,
        dtype=t.dtype,
        data=data,
        fp8_scale_inv=t._scale_inv,
        fp8_dtype=t._fp8_dtype,
        data_transpose=transpose,
        quantizer=t._quantizer,
    )


def _view(func, args, kwargs):
    # A view that keeps the last dim keeps the [K, M] column-wise layout: alias both copies.
    # Without a column-wise copy any view of the bytes is one (FSDP2 flattens its shards).
    t, size = args[0], args[1]
    if t._data is None:
        return NotImplemented
    data = func(t._data, size)
    if t._transpose is not None and data.shape[-1:] != t.shape[-1:]:
        return NotImplemented
    return _rows(t, data, t._transpose)


# Row ops FSDP2 shards a parameter with (split, new_zeros, narrow -> slice, as_strided) keep
# the FP8 format: the pieces share the scale. A view cannot also slice the column-wise copy, so
# of a tensor that has one, split gives row-wise copies (written pieces do not write back) and
# slice / as_strided take the fallback (dequantized).


def _split(func, args, kwargs):
    t = args[0]
    dim = kwargs.get("dim", args[2] if len(args) > 2 else 0)
    if t._data is None or t.dim() == 0 or dim % t.dim() != 0:
        return NotImplemented
    pieces = func(t._data, args[1], 0)
    if t._transpose is not None:
        pieces = [p.clone() for p in pieces]
    return [_rows(t, p) for p in pieces]


def _slice(func, args, kwargs):
    t = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if t._data is None or t._transpose is not None or t.dim() == 0 or dim % t.dim() != 0:
        return NotImplemented
    return _rows(t, func(t._data, *args[1:], **kwargs))


def _as_strided(func, args, kwargs):
    t = args[0]
    if t._data is None:
        return NotImplemented
    if t._transpose is None:
        return _rows(t, func(t._data, *args[1:], **kwargs))
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset", 0)
    whole = tuple(args[1]) == tuple(t.shape) and tuple(args[2]) == t._data.stride() and not offset
    if whole and t._data.storage_offset() == 0:
        return t._like(*t._tensors())  # FSDP2's unsharded weight over its gathered bytes
    return NotImplemented


def _new_zeros(func, args, kwargs):
    t, size = args[0], args[1]
    if t._data is None or kwargs.get("dtype") not in (None, t.dtype):
        return NotImplemented
    zeros = torch.zeros(size, dtype=t._data.dtype, device=kwargs.get("device") or t.device)
    out = _rows(t, zeros)
    out._scale_inv = t._scale_inv.clone()
    return out


Float8Tensor._HANDLERS = row_handlers(_view, _split, _slice, _as_strided, _new_zeros)
