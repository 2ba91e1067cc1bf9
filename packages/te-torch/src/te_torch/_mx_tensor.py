"""MXFP8Tensor and NVFP4Tensor: microscaled tensors (recipe.MXFP8BlockScaling, NVFP4BlockScaling).

For a source of logical shape [..., K] viewed as M = numel / K rows (te/tensor.h's table):

    field                  MXFP8Tensor (block b = 32)           NVFP4Tensor (block b = 16)
    _rowwise_data          float8 [..., K]                      uint8 [..., K / 2]: E2M1 pairs
    _rowwise_scale_inv     uint8 E8M0 [R(M, 128), R(K/b, 4)]    uint8 E4M3 [R(M, 128), R(K/b, 4)]
    _columnwise_data       float8 [K, M]                        uint8 [K, M / 2]
    _columnwise_scale_inv  uint8 E8M0 [R(K, 128), R(M/b, 4)]    uint8 E4M3 [R(K, 128), R(M/b, 4)]
    _amax                  (none)                               fp32 [2]: the global amax each copy
                                                                was encoded with (row, column)

R(n, m) rounds n (for n / b: ceil(n / b)) up to a multiple of m. Scales are raw bytes (uint8)
because torch's float8_e8m0fnu is missing from older torch versions; te reads them by mode.

Each copy has one scale per block of 32 (MXFP8) / 16 (NVFP4) consecutive elements of its own
stored rows, so the column-wise copy is a separate quantization of the source (its blocks are the
source's 32x1 / 16x1 columns), not the row-wise copy transposed; with 2-D tiles
(``_with_2d_quantization``: 32x32 / 16x16, weights) the two copies hold the same values. E2M1
packs two elements per byte, the first in the low nibble. NVFP4's column-wise copy may carry the
random Hadamard transform (``_columnwise_rht``; its amax is then taken after the transform):
te_dequantize undoes it, and te_gemm needs it on both operands of a contraction or on neither.
Scale tables are padded to the tile cuBLASLt's block-scaled GEMM reads; te never writes or reads
the padding.

A view that changes the last dimension (FSDP2 keeps a flat ``view(-1)`` of each shard) keeps
the row-wise copy in its [..., K] shape: the parts' geometry is then that copy's shape, not the
view's, and dequantize / quantize_ go through ``_as_matrix()``. Weights split into equal pieces of
whole blocks along the rows (a multiple of 32 rows for MXFP8, 16 for NVFP4) keep their format
(FSDP2's shards: te_torch._fsdp); NVFP4 pieces keep the whole tensor's global amaxes.

The numerics are te-core's (te_quantize / te_dequantize / te_gemm); nothing here computes a value.
These tensors are eager-only for now: under torch.compile te has no MXFP8/NVFP4 ops registered.
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch import _fsdp, _kernels
from te_torch._dtypes import check_fp8_dtype
from te_torch._quantized_tensor import (
    QuantizedTensor,
    aten,
    block_view,
    even_piece,
    even_split,
    is_eager,
    row_handlers,
    slice_args,
)

_MXFP8 = int(_C.ScalingMode.MXFP8_1D)
_NVFP4 = int(_C.ScalingMode.NVFP4_1D)
_INNER = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")


def not_traceable(owner: str) -> NotImplementedError:
    return NotImplementedError(
        f"{owner}: MXFP8 / NVFP4 under torch.compile (or on fake tensors) is not implemented in te "
        "yet (te registers no MXFP8/NVFP4 ops for tracing); run the MXFP8BlockScaling / "
        "NVFP4BlockScaling step eagerly, or compile with Float8CurrentScaling / Float8BlockScaling"
    )


class _MXTensor(QuantizedTensor):
    """What MXFP8Tensor and NVFP4Tensor share: the four parts, dequantize, usage, torch glue."""

    _rowwise_data: torch.Tensor | None
    _rowwise_scale_inv: torch.Tensor | None
    _columnwise_data: torch.Tensor | None
    _columnwise_scale_inv: torch.Tensor | None
    _with_2d_quantization: bool
    _quantizer: object
    _mode: int
    _block_size: int  # elements of a block along the rows (each copy's own rows)
    _elements_per_byte: int  # of the stored data (NVFP4 packs two)
    # Subclasses define _like(rd, rs, cd, cs, amax=None, shape=None, dtype=None) (a tensor of the
    # same format over other parts; amax is NVFP4's), _own_amax(zeros) (a piece's global amaxes:
    # None for MXFP8), _same_format(other), _default_quantizer() and _describe() (for repr).

    @classmethod
    def _make(cls, shape, dtype, rd, rs, cd, cs, requires_grad) -> _MXTensor:
        src = rd if rd is not None else cd
        if src is None:
            raise ValueError(f"{cls.__name__}: rowwise_data and columnwise_data are both None; need one")
        self = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=dtype, device=src.device, requires_grad=requires_grad
        )
        self._rowwise_data, self._rowwise_scale_inv = rd, rs
        self._columnwise_data, self._columnwise_scale_inv = cd, cs
        return self

    def _parts(self) -> tuple:
        return self._rowwise_data, self._rowwise_scale_inv, self._columnwise_data, self._columnwise_scale_inv

    def _tensors(self) -> tuple:
        return self._parts()

    def _operand(self) -> tuple:
        """te_gemm's operand tuple (_kernels.Operand) of both copies present."""
        return (self._mode, *self._parts())

    def _as_matrix(self) -> _MXTensor:
        """This tensor in the shape its parts encode (itself but for a flat view)."""
        rd = self._rowwise_data
        if rd is None:
            return self
        shape = (*rd.shape[:-1], rd.shape[-1] * self._elements_per_byte)
        return self if shape == tuple(self.shape) else self._like(*self._parts(), shape=shape)

    # -- numerics -------------------------------------------------------------------------------

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:  # type: ignore[override]
        """The high-precision tensor (``dtype``, default self.dtype) of self.shape, by
        te_dequantize: the row-wise copy if present, else the column-wise one."""
        dtype = self.dtype if dtype is None else dtype
        src = self._rowwise_data if self._rowwise_data is not None else self._columnwise_data
        if not is_eager(src):
            raise not_traceable(f"{type(self).__name__}.dequantize")
        matrix = self._as_matrix()
        out = _kernels.dequantize_mx(matrix._operand(), matrix.shape, dtype)
        return out if matrix is self else out.view(self.shape)

    def update_usage(self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None) -> None:
        """Drops the row-wise or column-wise copy. A missing copy cannot be made from the other
        (each is its own quantization of the source): asking for one raises RuntimeError."""
        want_row = (self._rowwise_data is not None) if rowwise_usage is None else rowwise_usage
        want_col = (self._columnwise_data is not None) if columnwise_usage is None else columnwise_usage
        name = type(self).__name__
        if not want_row and not want_col:
            raise ValueError(
                f"{name}.update_usage: rowwise_usage and columnwise_usage cannot both be False "
                "(the tensor would hold no data)"
            )
        for want, have, which in (
            (want_row, self._rowwise_data, "rowwise"),
            (want_col, self._columnwise_data, "columnwise"),
        ):
            if want and have is None:
                raise RuntimeError(
                    f"{name}.update_usage: the {which} copy is missing and te does not derive one "
                    "copy from the other (each has its own blocks, quantized from the "
                    f"high-precision source); quantize again with {which}=True"
                )
        if not want_row:
            self._rowwise_data = self._rowwise_scale_inv = None
        if not want_col:
            self._columnwise_data = self._columnwise_scale_inv = None

    def quantize_(self, src: torch.Tensor) -> _MXTensor:
        """Quantizes ``src`` (broadcast to self.shape) into this tensor in place, both copies
        present, with its quantizer (or one made from this tensor's format if it has none)."""
        quantizer = self._quantizer if self._quantizer is not None else self._default_quantizer()
        matrix = self._as_matrix()
        if matrix is not self:  # a flat view: quantize the rows it holds
            src = torch.broadcast_to(src, self.shape).reshape(matrix.shape)
        group = _fsdp.amax_group(self._amax) if self._mode == _NVFP4 else None
        if group is None:
            quantizer.update_quantized(src, matrix)
        else:  # an FSDP2 shard: the global amaxes of the whole weight, which every shard shares
            quantizer.update_quantized(src, matrix, _fsdp.reduced_amaxes(quantizer, src, group))
        return self

    # -- torch integration ----------------------------------------------------------------------

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """FSDP2's all-gather extension: the shard's bytes and block scales (te_torch._fsdp)."""
        return _fsdp.mx_pre_all_gather(self, mesh, outer_size)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        """The unsharded weight from the gathered copies (te_torch._fsdp)."""
        return _fsdp.mx_post_all_gather(self, all_gather_outputs, metadata, param_dtype, out)

    def __repr__(self, *, tensor_contents=None) -> str:  # noqa: D105
        some = self._rowwise_data if self._rowwise_data is not None else self._columnwise_data
        data = f", data={self.dequantize()}" if is_eager(some) else ""
        return (
            f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self.dtype}{self._describe()}, "
            f"rowwise={self._rowwise_data is not None}, "
            f"columnwise={self._columnwise_data is not None}{data})"
        )


class MXFP8Tensor(_MXTensor):
    """MXFP8 (OCP MX): FP8 elements with one E8M0 scale per 32 (NUMERICS.md "MXFP8BlockScaling").
    Built by MXFP8Quantizer; see the module docstring for the fields and layouts."""

    _mode = _MXFP8
    _block_size = 32
    _elements_per_byte = 1
    _fp8_dtype: torch.dtype
    _SPLIT_KEEPS_FP8 = (
        "MXFP8Tensor pieces stay MXFP8 when split along dim 0 into equal pieces of a multiple of "
        "32 rows: under FSDP2, a weight whose rows are the shard count x a multiple of 32"
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
        with_2d_quantization: bool = False,
        quantizer: object = None,
        requires_grad: bool = False,
    ) -> MXFP8Tensor:
        parts = (rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv)
        self = cls._make(shape, dtype, *parts, requires_grad)
        self._fp8_dtype = fp8_dtype
        self._with_2d_quantization = bool(with_2d_quantization)
        self._quantizer = quantizer
        return self

    def _like(self, rd, rs, cd, cs, amax=None, shape=None, dtype=None) -> MXFP8Tensor:
        return MXFP8Tensor(
            shape=self.shape if shape is None else shape,
            dtype=self.dtype if dtype is None else dtype,
            fp8_dtype=self._fp8_dtype,
            rowwise_data=rd,
            rowwise_scale_inv=rs,
            columnwise_data=cd,
            columnwise_scale_inv=cs,
            with_2d_quantization=self._with_2d_quantization,
            quantizer=self._quantizer,
        )

    def _own_amax(self, zeros: bool = False) -> None:
        return None

    def _same_format(self, other) -> bool:
        return (
            isinstance(other, MXFP8Tensor)
            and other._fp8_dtype == self._fp8_dtype
            and other._with_2d_quantization == self._with_2d_quantization
        )

    def _default_quantizer(self):
        from te_torch._mx_quantizers import MXFP8Quantizer

        return MXFP8Quantizer(self._fp8_dtype, with_2d_quantization=self._with_2d_quantization)

    def _describe(self) -> str:
        tiles = "32x32" if self._with_2d_quantization else "1x32"
        return f", fp8_dtype={self._fp8_dtype}, blocks={tiles}"

    def __tensor_flatten__(self):
        names = [n for n in _INNER if getattr(self, n) is not None]
        return names, (self._fp8_dtype, self.dtype, self._with_2d_quantization)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        fp8_dtype, dtype, tiles = ctx
        return MXFP8Tensor(
            shape=outer_size,
            dtype=dtype,
            fp8_dtype=fp8_dtype,
            rowwise_data=inner.get("_rowwise_data"),
            rowwise_scale_inv=inner.get("_rowwise_scale_inv"),
            columnwise_data=inner.get("_columnwise_data"),
            columnwise_scale_inv=inner.get("_columnwise_scale_inv"),
            with_2d_quantization=tiles,
        )

    def __reduce_ex__(self, protocol):
        # The quantizer is not saved; a loaded tensor has none.
        return (
            _rebuild_mxfp8_tensor,
            (
                tuple(self.shape),
                self.dtype,
                self._fp8_dtype,
                *self._parts(),
                self._with_2d_quantization,
                self.requires_grad,
            ),
        )


class NVFP4Tensor(_MXTensor):
    """NVFP4: E2M1 elements, one E4M3 scale per 16 and an fp32 global scale per copy
    (NUMERICS.md "NVFP4BlockScaling"). Built by NVFP4Quantizer; see the module docstring."""

    _mode = _NVFP4
    _block_size = 16
    _elements_per_byte = 2
    _amax: torch.Tensor
    _columnwise_rht: bool
    _SPLIT_KEEPS_FP8 = (
        "NVFP4Tensor pieces stay NVFP4 when split along dim 0 into equal pieces of a multiple of "
        "16 rows: under FSDP2, a weight whose rows are the shard count x a multiple of 16"
    )

    def __new__(
        cls,
        *,
        shape: torch.Size | tuple[int, ...],
        dtype: torch.dtype,
        rowwise_data: torch.Tensor | None,
        rowwise_scale_inv: torch.Tensor | None,
        columnwise_data: torch.Tensor | None,
        columnwise_scale_inv: torch.Tensor | None,
        amax: torch.Tensor,
        columnwise_rht: bool = False,
        with_2d_quantization: bool = False,
        quantizer: object = None,
        requires_grad: bool = False,
    ) -> NVFP4Tensor:
        if not isinstance(amax, torch.Tensor) or amax.dtype != torch.float32 or amax.numel() != 2:
            raise ValueError(
                "NVFP4Tensor: amax: expected the fp32 [2] global amaxes (row-wise, column-wise), "
                f"got {amax if not isinstance(amax, torch.Tensor) else (amax.dtype, tuple(amax.shape))}"
            )
        parts = (rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv)
        self = cls._make(shape, dtype, *parts, requires_grad)
        self._amax = amax
        self._columnwise_rht = bool(columnwise_rht)
        self._with_2d_quantization = bool(with_2d_quantization)
        self._quantizer = quantizer
        return self

    @property
    def _amax_rowwise(self) -> torch.Tensor:
        """fp32 [1]: the global amax the row-wise copy was encoded with (TE's field)."""
        return self._amax[0:1]

    @property
    def _amax_columnwise(self) -> torch.Tensor:
        """fp32 [1]: the column-wise copy's (after the Hadamard transform, if it has it)."""
        return self._amax[1:2]

    def _tensors(self) -> tuple:
        return (*self._parts(), self._amax)

    def _operand(self) -> tuple:
        return (self._mode, *self._parts(), self._amax, self._columnwise_rht)

    def _like(self, rd, rs, cd, cs, amax=None, shape=None, dtype=None) -> NVFP4Tensor:
        return NVFP4Tensor(
            shape=self.shape if shape is None else shape,
            dtype=self.dtype if dtype is None else dtype,
            rowwise_data=rd,
            rowwise_scale_inv=rs,
            columnwise_data=cd,
            columnwise_scale_inv=cs,
            amax=self._amax if amax is None else amax,
            columnwise_rht=self._columnwise_rht,
            with_2d_quantization=self._with_2d_quantization,
            quantizer=self._quantizer,
        )

    def _own_amax(self, zeros: bool = False) -> torch.Tensor:
        """The global amaxes of a piece (this tensor's, its own copy) or of zeros."""
        return torch.zeros_like(self._amax) if zeros else self._amax.clone()

    def _same_format(self, other) -> bool:
        return (
            isinstance(other, NVFP4Tensor)
            and other._columnwise_rht == self._columnwise_rht
            and other._with_2d_quantization == self._with_2d_quantization
        )

    def _default_quantizer(self):
        from te_torch._mx_quantizers import NVFP4Quantizer

        return NVFP4Quantizer(with_rht=self._columnwise_rht, with_2d_quantization=self._with_2d_quantization)

    def _describe(self) -> str:
        tiles = "16x16" if self._with_2d_quantization else "1x16"
        return f", blocks={tiles}, columnwise_rht={self._columnwise_rht}"

    def __tensor_flatten__(self):
        names = [n for n in _INNER if getattr(self, n) is not None] + ["_amax"]
        return names, (self.dtype, self._columnwise_rht, self._with_2d_quantization)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        dtype, rht, tiles = ctx
        return NVFP4Tensor(
            shape=outer_size,
            dtype=dtype,
            rowwise_data=inner.get("_rowwise_data"),
            rowwise_scale_inv=inner.get("_rowwise_scale_inv"),
            columnwise_data=inner.get("_columnwise_data"),
            columnwise_scale_inv=inner.get("_columnwise_scale_inv"),
            amax=inner["_amax"],
            columnwise_rht=rht,
            with_2d_quantization=tiles,
        )

    def __reduce_ex__(self, protocol):
        return (
            _rebuild_nvfp4_tensor,
            (
                tuple(self.shape),
                self.dtype,
                *self._parts(),
                self._amax,
                self._columnwise_rht,
                self._with_2d_quantization,
                self.requires_grad,
            ),
        )


def _rebuild_mxfp8_tensor(shape, dtype, fp8_dtype, rd, rs, cd, cs, tiles, requires_grad):
    return MXFP8Tensor(
        shape=shape,
        dtype=dtype,
        fp8_dtype=check_fp8_dtype(fp8_dtype),
        rowwise_data=rd,
        rowwise_scale_inv=rs,
        columnwise_data=cd,
        columnwise_scale_inv=cs,
        with_2d_quantization=tiles,
        requires_grad=requires_grad,
    )


def _rebuild_nvfp4_tensor(shape, dtype, rd, rs, cd, cs, amax, rht, tiles, requires_grad):
    return NVFP4Tensor(
        shape=shape,
        dtype=dtype,
        rowwise_data=rd,
        rowwise_scale_inv=rs,
        columnwise_data=cd,
        columnwise_scale_inv=cs,
        amax=amax,
        columnwise_rht=rht,
        with_2d_quantization=tiles,
        requires_grad=requires_grad,
    )


# -- row ops (FSDP2 shards a weight with split, new_zeros, narrow -> slice, view, as_strided) ---
# A piece of whole blocks of rows (b x n rows: 32 for MXFP8, 16 for NVFP4) is a tensor of its own:
# its rows' bytes and row-wise scales, and its columns of the column-wise copy with their b x 1
# blocks' scales (each table re-padded); an NVFP4 piece keeps the whole tensor's global amaxes
# (each block's scale is relative to them). The pieces are copies (the column-wise copy's
# columns are no view of its rows).


def part_shape(mode: int, part: int, shape) -> tuple:
    return tuple(_C.quantized_shape(mode, part, tuple(shape)))


_PART_RS, _PART_CS = int(_C.Part.ROWWISE_SCALE_INV), int(_C.Part.COLUMNWISE_SCALE_INV)


def _mx_piece(t: _MXTensor, start: int, rows: int) -> _MXTensor:
    """Rows [start, start + rows) of the 2-D ``t`` (start and rows whole blocks), as copies."""
    shape = (rows, t.shape[1])
    rd, rs, cd, cs = t._parts()
    if rd is not None:
        rd = rd[start : start + rows].clone()
        table = rs.new_zeros(part_shape(t._mode, _PART_RS, shape))
        table[:rows] = rs[start : start + rows, : table.shape[1]]
        rs = table
    if cd is not None:
        pack, b = t._elements_per_byte, t._block_size
        cd = cd[:, start // pack : (start + rows) // pack].contiguous()
        table = cs.new_zeros(part_shape(t._mode, _PART_CS, shape))
        table[:, : rows // b] = cs[: table.shape[0], start // b : (start + rows) // b]
        cs = table
    return t._like(rd, rs, cd, cs, t._own_amax(), shape=shape)


def _mx_rows(t: _MXTensor, dim: int) -> bool:
    """Whether ``t`` is a 2-D matrix (not a flat view) cut along its rows (``dim`` 0)."""
    return t.dim() == 2 and t._as_matrix() is t and dim % 2 == 0


def _mx_split(func, args, kwargs):
    t, how = args[0], args[1]
    dim = kwargs.get("dim", args[2] if len(args) > 2 else 0)
    rows = even_split(t, how, t._block_size) if _mx_rows(t, dim) else None
    if rows is None:
        return NotImplemented
    return [_mx_piece(t, i * rows, rows) for i in range(t.shape[0] // rows)]


def _mx_whole(func, args, kwargs):
    # narrow(0, 0, all rows) and as_strided over the whole tensor (FSDP2's padded shard and its
    # unsharded weight, both as they are); any other piece takes the fallback
    t = args[0]
    if not _mx_rows(t, 0):
        return NotImplemented
    if func is aten.slice.Tensor:
        dim, start, end, step = slice_args(args, kwargs)
        whole = dim % 2 == 0 and slice(start, end, step).indices(t.shape[0]) == (0, t.shape[0], 1)
    else:
        offset = args[3] if len(args) > 3 else kwargs.get("storage_offset", 0)
        whole = tuple(args[1]) == tuple(t.shape) and tuple(args[2]) == t.stride() and not offset
    return t._like(*t._parts()) if whole else NotImplemented


def _mx_new_zeros(func, args, kwargs):
    # FSDP2's padded shard: zeros of the shape of a piece that _mx_split keeps, as _new_zeros of
    # te_torch._blockwise_tensor
    t, size = args[0], tuple(args[1])
    ok = _mx_rows(t, 0) and kwargs.get("dtype") in (None, t.dtype) and even_piece(t, size, t._block_size)
    if not ok:
        return NotImplemented
    device = kwargs.get("device") or t.device
    pack = t._elements_per_byte
    rd, rs, cd, cs = t._parts()
    if rd is not None:
        rd = torch.zeros((size[0], size[1] // pack), dtype=rd.dtype, device=device)
        rs = torch.zeros(part_shape(t._mode, _PART_RS, size), dtype=torch.uint8, device=device)
    if cd is not None:
        cd = torch.zeros((size[1], size[0] // pack), dtype=cd.dtype, device=device)
        cs = torch.zeros(part_shape(t._mode, _PART_CS, size), dtype=torch.uint8, device=device)
    amax = t._own_amax(zeros=True)
    return t._like(rd, rs, cd, cs, None if amax is None else amax.to(device), shape=size)


MXFP8Tensor._HANDLERS = NVFP4Tensor._HANDLERS = row_handlers(
    block_view, _mx_split, _mx_whole, _mx_whole, _mx_new_zeros
)
