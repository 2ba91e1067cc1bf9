"""Float8BlockwiseQTensor: FP8 with 1x128 or 128x128 block scales (Float8BlockScaling).

For a source of logical shape [..., K] viewed as M = numel / K rows (te/tensor.h's table):

    field                  1x128 blocks (is_2D_scaled False)   128x128 blocks (True)
    _rowwise_data          FP8 [..., K]                        FP8 [..., K]
    _rowwise_scale_inv     fp32 [ceil(K/128), roundup(M, 4)]   fp32 [ceil(M/128), roundup(ceil(K/128), 4)]
    _columnwise_data       FP8 [K, M]                          FP8 [K, M]
    _columnwise_scale_inv  fp32 [ceil(M/128), roundup(K, 4)]   fp32 [ceil(K/128), roundup(ceil(M/128), 4)]

Scales are stored transposed with the leading dimension padded to a multiple of 4 (what
cuBLASLt's block-scaled GEMM reads); the padding is never written or read. The 1x128 column-wise
copy has its own 128x1 blocks along the original columns, quantized from the high-precision
source, so it cannot be made from the row-wise copy; with 128x128 tiles it can (an exact
transpose of the data and of the tile scales).

A view that changes the last dimension (FSDP2 keeps a flat ``view(-1)`` of each shard) keeps the
row-wise copy in its [..., K] shape: the parts' geometry is then ``_matrix_shape``, not the
view's shape, and dequantize / quantize_ go through it. Weights split into equal pieces of a
multiple of 128 rows keep their format (FSDP2's shards: te_torch._fsdp).
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch import _fsdp, _kernels
from te_torch._dtypes import check_fp8_dtype
from te_torch._quantized_tensor import (
    QuantizedTensor,
    block_view,
    even_piece,
    even_split,
    is_eager,
    row_handlers,
    slice_args,
)

_BLOCK_1D = int(_C.ScalingMode.BLOCK_1D)
_BLOCK_2D = int(_C.ScalingMode.BLOCK_2D)
_PART_CS = int(_C.Part.COLUMNWISE_SCALE_INV)
_PART_RS = int(_C.Part.ROWWISE_SCALE_INV)
_BLOCK = 128


class Float8BlockwiseQTensor(QuantizedTensor):
    """FP8 tensor with per-block fp32 scales. Built by Float8BlockQuantizer; see the module
    docstring for the fields and layouts."""

    _rowwise_data: torch.Tensor | None
    _rowwise_scale_inv: torch.Tensor | None
    _columnwise_data: torch.Tensor | None
    _columnwise_scale_inv: torch.Tensor | None
    _fp8_dtype: torch.dtype
    _is_2D_scaled: bool
    _quantizer: object
    _SPLIT_KEEPS_FP8 = (
        "Float8BlockwiseQTensor pieces stay FP8 when split along dim 0 into equal pieces of a "
        "multiple of 128 rows: under FSDP2, a weight whose rows are the shard count x a multiple "
        "of 128"
    )

    def __new__(
        cls,
        *,
        shape: torch.Size | tuple[int, ...],
        dtype: torch.dtype,
        fp8_dtype: torch.dtype,
        rowwise_data: torch.Tensor | None,
        rowwise_scale_inv: torch.Tensor | None,
        columnwise_data: torch.Tensor | None,
        columnwise_scale_inv: torch.Tensor | None,
        is_2D_scaled: bool,
        quantizer: object = None,
        requires_grad: bool = False,
    ) -> Float8BlockwiseQTensor:
        src = rowwise_data if rowwise_data is not None else columnwise_data
        if src is None:
            raise ValueError(
                "Float8BlockwiseQTensor: rowwise_data and columnwise_data are both None; need one"
            )
        self = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=dtype, device=src.device, requires_grad=requires_grad
        )
        self._rowwise_data = rowwise_data
        self._rowwise_scale_inv = rowwise_scale_inv
        self._columnwise_data = columnwise_data
        self._columnwise_scale_inv = columnwise_scale_inv
        self._fp8_dtype = fp8_dtype
        self._is_2D_scaled = is_2D_scaled
        self._quantizer = quantizer
        return self

    @property
    def _matrix_shape(self) -> torch.Size:
        """The shape the parts encode: the row-wise copy's, which a flat view keeps."""
        rd = self._rowwise_data
        return rd.shape if rd is not None else self.shape

    @property
    def _mode(self) -> int:
        return _BLOCK_2D if self._is_2D_scaled else _BLOCK_1D

    def _like(self, rd, rs, cd, cs, shape=None) -> Float8BlockwiseQTensor:
        return Float8BlockwiseQTensor(
            shape=self.shape if shape is None else shape,
            dtype=self.dtype,
            fp8_dtype=self._fp8_dtype,
            rowwise_data=rd,
            rowwise_scale_inv=rs,
            columnwise_data=cd,
            columnwise_scale_inv=cs,
            is_2D_scaled=self._is_2D_scaled,
            quantizer=self._quantizer,
        )

    def _same_format(self, other) -> bool:
        return (
            isinstance(other, Float8BlockwiseQTensor)
            and other._fp8_dtype == self._fp8_dtype
            and other._is_2D_scaled == self._is_2D_scaled
        )

    def _tensors(self) -> tuple:
        return self._parts()

    def _parts(self):
        return (
            self._rowwise_data,
            self._rowwise_scale_inv,
            self._columnwise_data,
            self._columnwise_scale_inv,
        )

    # -- numerics -------------------------------------------------------------------------------

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:  # type: ignore[override]
        """x = q * scale_inv per block, as a new ``dtype`` tensor (default self.dtype) of
        self.shape. Reads the row-wise copy if present, else the column-wise one."""
        dtype = self.dtype if dtype is None else dtype
        rd, rs, cd, cs = self._parts()
        shape = self._matrix_shape
        if is_eager(rd if rd is not None else cd):
            out = _kernels.dequantize(rd, rs, cd, cs, self._mode, shape, dtype)
        else:
            out = torch.ops.te.dequantize(rd, rs, cd, cs, self._mode, list(shape), dtype)
        return out if shape == self.shape else out.view(self.shape)

    def quantize_(self, src: torch.Tensor) -> Float8BlockwiseQTensor:
        """Quantizes ``src`` into this tensor in place with its quantizer (a Float8BlockQuantizer
        with pow2 scales and this tensor's block dim if it has none)."""
        quantizer = self._quantizer
        if quantizer is None:
            from te_torch._quantizers import Float8BlockQuantizer

            quantizer = Float8BlockQuantizer(
                self._fp8_dtype, block_scaling_dim=2 if self._is_2D_scaled else 1
            )
        if self._matrix_shape != self.shape:  # a flat view: quantize the rows it holds
            src = torch.broadcast_to(src, self.shape).reshape(self._matrix_shape)
            quantizer.update_quantized(src, self._like(*self._parts(), shape=self._matrix_shape))
            return self
        quantizer.update_quantized(src, self)
        return self

    def update_usage(self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None) -> None:
        """Drops a copy, or makes one from the other (128x128 tiles only: an exact transpose).

        Raises RuntimeError when asked for a copy that 1x128 scaling cannot derive."""
        want_row = (self._rowwise_data is not None) if rowwise_usage is None else rowwise_usage
        want_col = (self._columnwise_data is not None) if columnwise_usage is None else columnwise_usage
        if not want_row and not want_col:
            raise ValueError(
                "Float8BlockwiseQTensor.update_usage: rowwise_usage and columnwise_usage cannot "
                "both be False (the tensor would hold no data)"
            )
        for want, have, which in (
            (want_col, self._columnwise_data, "column-wise"),
            (want_row, self._rowwise_data, "row-wise"),
        ):
            if want and have is None and not self._is_2D_scaled:
                raise RuntimeError(
                    f"Float8BlockwiseQTensor.update_usage: the {which} copy is missing and "
                    "cannot be made from the other one with 1x128 block scaling (each copy has "
                    "its own blocks, quantized from the high-precision source); quantize with "
                    f"{'columnwise' if which == 'column-wise' else 'rowwise'}=True instead"
                )
        if want_col and self._columnwise_data is None:
            self._columnwise_data, self._columnwise_scale_inv = self._transposed_2d(
                self._rowwise_data, self._rowwise_scale_inv, _PART_CS
            )
        if want_row and self._rowwise_data is None:
            data, scale_inv = self._transposed_2d(self._columnwise_data, self._columnwise_scale_inv, _PART_RS)
            self._rowwise_data, self._rowwise_scale_inv = data.view(self.shape), scale_inv
        if not want_row:
            self._rowwise_data = self._rowwise_scale_inv = None
        if not want_col:
            self._columnwise_data = self._columnwise_scale_inv = None

    def _transposed_2d(self, data, scale_inv, part, out=(None, None)):
        # 128x128 tiles: the other copy is the data transposed, with tile scales transposed
        # into the other padded layout (padding left unwritten, as the kernels do); ``out``:
        # write them into that copy's existing tensors.
        out_data, out_scale = out
        if is_eager(data):
            data_t = _kernels.transpose(data, out_data)
        else:
            data_t = torch.ops.te.transpose(data)
        matrix = tuple(self._matrix_shape)
        k = matrix[-1] if matrix else 1
        m = self.numel() // k if k else 0
        mb, kb = -(-m // _BLOCK), -(-k // _BLOCK)
        rows, cols = (kb, mb) if part == _PART_CS else (mb, kb)
        if out_scale is None:
            out_scale = scale_inv.new_empty(tuple(_C.quantized_shape(_BLOCK_2D, part, matrix)))
        out_scale[:rows, :cols] = scale_inv[:cols, :rows].t()
        return data_t, out_scale

    # -- torch integration ----------------------------------------------------------------------

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """FSDP2's all-gather extension: the shard's FP8 bytes and block scales (te_torch._fsdp)."""
        if self._is_2D_scaled:
            return _fsdp.block_pre_all_gather(self, mesh, outer_size)
        return _fsdp.block1d_pre_all_gather(self, mesh, outer_size)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        """The unsharded weight from the gathered bytes and scales (te_torch._fsdp)."""
        if self._is_2D_scaled:
            return _fsdp.block_post_all_gather(self, all_gather_outputs, metadata, param_dtype, out)
        return _fsdp.block1d_post_all_gather(self, all_gather_outputs, metadata, param_dtype, out)

    def __repr__(self, *, tensor_contents=None) -> str:  # noqa: D105
        def shape_of(t):
            return None if t is None else tuple(t.shape)

        # Under tracing the parts are fake tensors with no values to show.
        some_part = self._rowwise_data if self._rowwise_data is not None else self._columnwise_data
        data = f", data={self.dequantize()}" if is_eager(some_part) else ""

        return (
            f"Float8BlockwiseQTensor(shape={tuple(self.shape)}, fp8_dtype={self._fp8_dtype}, "
            f"dtype={self.dtype}, blocks={'128x128' if self._is_2D_scaled else '1x128'}, "
            f"rowwise_scale_inv={shape_of(self._rowwise_scale_inv)}, "
            f"columnwise_scale_inv={shape_of(self._columnwise_scale_inv)}{data})"
        )

    _INNER = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")

    def __tensor_flatten__(self):
        names = [n for n in self._INNER if getattr(self, n) is not None]
        return names, (self._fp8_dtype, self.dtype, self._is_2D_scaled)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        fp8_dtype, dtype, is_2d = ctx
        return Float8BlockwiseQTensor(
            shape=outer_size,
            dtype=dtype,
            fp8_dtype=fp8_dtype,
            rowwise_data=inner.get("_rowwise_data"),
            rowwise_scale_inv=inner.get("_rowwise_scale_inv"),
            columnwise_data=inner.get("_columnwise_data"),
            columnwise_scale_inv=inner.get("_columnwise_scale_inv"),
            is_2D_scaled=is_2d,
        )

    def __reduce_ex__(self, protocol):
        # The quantizer is not saved; a loaded tensor has none.
        return (
            _rebuild_blockwise_tensor,
            (
                tuple(self.shape),
                self.dtype,
                self._fp8_dtype,
                *self._parts(),
                self._is_2D_scaled,
                self.requires_grad,
            ),
        )


def _rebuild_blockwise_tensor(shape, dtype, fp8_dtype, rd, rs, cd, cs, is_2d, requires_grad):
    return Float8BlockwiseQTensor(
        shape=shape,
        dtype=dtype,
        fp8_dtype=check_fp8_dtype(fp8_dtype),
        rowwise_data=rd,
        rowwise_scale_inv=rs,
        columnwise_data=cd,
        columnwise_scale_inv=cs,
        is_2D_scaled=is_2d,
        requires_grad=requires_grad,
    )


# -- natively implemented ops ---------------------------------------------------------------------
# FSDP2 shards a weight by rows with split, new_zeros, narrow (-> slice), view and as_strided.
# Pieces of 128 x n rows keep the format, their blocks being their own. 128x128 tiles: a piece is
# its rows' bytes and its tile rows' scales (a row range of the row-wise scale table), row-wise
# only (a view cannot also slice the column-wise copy), so of a tensor that has that copy, split
# gives copies and slice takes the fallback (dequantized). 1x128 blocks: a piece is a copy of
# both copies' parts (its columns of the row-wise scales, stored transposed, and of the
# column-wise copy; its block rows of the column-wise scales), and slice keeps the whole tensor
# only.


def _rows(t: Float8BlockwiseQTensor, rd: torch.Tensor, rs: torch.Tensor) -> Float8BlockwiseQTensor:
    return t._like(rd, rs, None, None, shape=rd.shape)


def _row_cut(t: Float8BlockwiseQTensor, dim: int) -> bool:
    """Whether ``t`` is a 2-D matrix with its row-wise copy (not a flat view) cut along its rows
    (``dim`` 0)."""
    return t._rowwise_data is not None and t.dim() == 2 and t._matrix_shape == t.shape and dim % 2 == 0


def _piece_1d(t: Float8BlockwiseQTensor, start: int, rows: int) -> Float8BlockwiseQTensor:
    """Rows [start, start + rows) of the 2-D 1x128-block ``t`` (multiples of 128), as copies."""
    shape = (rows, t.shape[1])
    rd, rs, cd, cs = t._parts()
    rd = rd[start : start + rows].clone()
    table = rs.new_zeros(tuple(_C.quantized_shape(_BLOCK_1D, _PART_RS, shape)))
    table[:, :rows] = rs[:, start : start + rows]
    rs = table
    if cd is not None:
        cd = cd[:, start : start + rows].contiguous()
        cs = cs[start // _BLOCK : (start + rows) // _BLOCK].clone()
    return t._like(rd, rs, cd, cs, shape=shape)


def _split(func, args, kwargs):
    t, how = args[0], args[1]
    dim = kwargs.get("dim", args[2] if len(args) > 2 else 0)
    rows = even_split(t, how, _BLOCK) if _row_cut(t, dim) else None
    if rows is None:
        return NotImplemented
    count = t.shape[0] // rows
    if not t._is_2D_scaled:
        return [_piece_1d(t, i * rows, rows) for i in range(count)]
    per = rows // _BLOCK
    rd, rs = t._rowwise_data, t._rowwise_scale_inv
    pieces = [(rd[i * rows : (i + 1) * rows], rs[i * per : (i + 1) * per]) for i in range(count)]
    if t._columnwise_data is not None:
        pieces = [(d.clone(), s.clone()) for d, s in pieces]
    return [_rows(t, d, s) for d, s in pieces]


def _slice(func, args, kwargs):
    t = args[0]
    dim, start, end, step = slice_args(args, kwargs)
    if not _row_cut(t, dim) or step != 1:
        return NotImplemented
    m = t.shape[0]
    start, end, _ = slice(start, end).indices(m)
    if not t._is_2D_scaled:  # FSDP2's sharded parameter over its padded shard: the whole tensor
        return t._like(*t._parts()) if (start, end) == (0, m) else NotImplemented
    if start % _BLOCK or t._columnwise_data is not None:
        return NotImplemented
    end = max(end, start)
    rs = t._rowwise_scale_inv[start // _BLOCK : -(-end // _BLOCK)]
    return _rows(t, t._rowwise_data[start:end], rs)


def _as_strided(func, args, kwargs):
    # FSDP2's unsharded weight over its gathered parts: the whole tensor, as it is
    t = args[0]
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset", 0)
    rd = t._rowwise_data
    whole = (
        rd is not None
        and t._matrix_shape == t.shape
        and tuple(args[1]) == tuple(t.shape)
        and tuple(args[2]) == rd.stride()
        and not offset
        and rd.storage_offset() == 0
    )
    return t._like(*t._parts()) if whole else NotImplemented


def _new_zeros(func, args, kwargs):
    # FSDP2's padded shard: zeros of the shape of a piece that _split keeps (equal pieces of whole
    # blocks), else the shards would be FP8 where the split made them high precision
    t, size = args[0], tuple(args[1])
    if not _row_cut(t, 0) or kwargs.get("dtype") not in (None, t.dtype) or not even_piece(t, size, _BLOCK):
        return NotImplemented
    device = kwargs.get("device") or t.device

    def scales(part):
        return torch.zeros(tuple(_C.quantized_shape(t._mode, part, size)), dtype=torch.float32, device=device)

    rd = torch.zeros(size, dtype=t._rowwise_data.dtype, device=device)
    if t._is_2D_scaled:
        return _rows(t, rd, scales(_PART_RS))
    cd = cs = None
    if t._columnwise_data is not None:
        cd = torch.zeros((size[1], size[0]), dtype=t._columnwise_data.dtype, device=device)
        cs = scales(_PART_CS)
    return t._like(rd, scales(_PART_RS), cd, cs, shape=size)


Float8BlockwiseQTensor._HANDLERS = row_handlers(block_view, _split, _slice, _as_strided, _new_zeros)
