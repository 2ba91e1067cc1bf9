"""Quantizers: objects that turn a high-precision tensor into a quantized tensor (TE's names).

A quantizer is built once (per module and tensor role) and called per step: it caches its
te_quant_config and the descriptors of its fp32 [1] scale/amax buffers, so a call allocates only
the outputs. In eager mode a call goes straight into te_core._C; under torch.compile it calls
``torch.ops.te.quantize`` (same kernels, plus a fake kernel for tracing).

Input of every quantizer: a float32 / bfloat16 / float16 tensor of any shape [..., K] (made
contiguous if it is not), on the device of the quantizer's buffers.
"""

from __future__ import annotations

import numbers

import torch
from te_core import _C

from te_torch import _kernels
from te_torch._blockwise_tensor import Float8BlockwiseQTensor
from te_torch._dtypes import TE_DTYPE, check_fp8_dtype
from te_torch._float8_tensor import Float8Tensor
from te_torch._fused_kernels import QuantSpec
from te_torch._ops import quant_config
from te_torch._quantized_tensor import QuantizedTensor, is_eager

_PER_TENSOR = int(_C.ScalingMode.PER_TENSOR)
_BLOCK_1D = int(_C.ScalingMode.BLOCK_1D)
_BLOCK_2D = int(_C.ScalingMode.BLOCK_2D)


def _check_stat(owner: str, name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{owner}: {name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32 or t.numel() != 1 or not t.is_contiguous():
        raise ValueError(
            f"{owner}: {name}: expected a contiguous float32 tensor with 1 element, got "
            f"{t.dtype} of shape {list(t.shape)}"
        )
    return t


def _check_eps(amax_epsilon) -> None:
    if (
        isinstance(amax_epsilon, bool)
        or not isinstance(amax_epsilon, numbers.Real)
        or amax_epsilon < 0
        or amax_epsilon != amax_epsilon
    ):
        raise ValueError(f"amax_epsilon: expected a number >= 0, got {amax_epsilon!r}")


def _check_source(q, x) -> None:
    """A quantization source that is no tensor (eager tensors never reach this check)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{type(q).__name__}: tensor: expected a torch.Tensor, got {type(x).__name__}")


def expand_source(src: torch.Tensor, dst: QuantizedTensor) -> torch.Tensor:
    """``update_quantized``'s ``src`` broadcast to ``dst``'s shape, or a ValueError naming both."""
    try:
        return src.expand(dst.shape)
    except RuntimeError:
        raise ValueError(
            f"src: expected a tensor of dst's shape {list(dst.shape)} (or one that broadcasts to "
            f"it), got shape {list(src.shape)}"
        ) from None


class _CachedDesc:
    """The te_tensor descriptor of a caller-owned buffer, rebuilt only if its storage moved."""

    __slots__ = ("name", "ptr", "desc")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ptr = -1
        self.desc = None

    def __deepcopy__(self, memo) -> _CachedDesc:
        return _CachedDesc(self.name)  # a copy's buffers live elsewhere: rebuilt on first use

    def get(self, t: torch.Tensor) -> _C.Tensor:
        try:
            ptr = t.data_ptr()
        except AttributeError:
            ptr = None  # not a tensor: _check_stat below names it
        if ptr != self.ptr:
            # a new buffer (the caller may reassign quantizer.scale / .amax): checked once here
            _check_stat("quantizer", self.name, t)
            self.desc, self.ptr = _kernels.desc(t), ptr
        return self.desc


class Quantizer:
    """Base of te's quantizers: usage flags and the call protocol.

    rowwise_usage: produce the row-wise copy (the tensor as is, [..., K]).
    columnwise_usage: produce the column-wise copy ([K, M], for the transposed GEMM use).
    """

    rowwise_usage: bool
    columnwise_usage: bool
    # Whether te's fused kernels (norm, activation, dbias) can write this quantizer's format.
    _fusable = True

    def __init__(self, *, rowwise: bool = True, columnwise: bool = True) -> None:
        self.rowwise_usage = bool(rowwise)
        self.columnwise_usage = bool(columnwise)
        self.internal = False

    def set_usage(self, *, rowwise: bool | None = None, columnwise: bool | None = None) -> None:
        """Sets which copies later quantizations produce (None leaves a flag as it is)."""
        if rowwise is not None:
            self.rowwise_usage = bool(rowwise)
        if columnwise is not None:
            self.columnwise_usage = bool(columnwise)

    def __call__(self, tensor: torch.Tensor) -> QuantizedTensor:
        return self.quantize(tensor)

    def quantize(
        self, tensor: torch.Tensor, *, out: QuantizedTensor | None = None, dtype=None
    ) -> QuantizedTensor:
        """Quantizes ``tensor``; with ``out``, into ``out``'s buffers in place (returns ``out``).

        ``dtype`` (TE compatibility) is the nominal high-precision dtype of the result; by
        default the input's."""
        if out is not None:
            return self.update_quantized(tensor, out)
        qt = self._quantize(tensor)
        if dtype is not None and dtype != qt.dtype:
            qt = self._retag(qt, dtype)
        return qt

    def _quantize(self, tensor: torch.Tensor) -> QuantizedTensor:
        raise NotImplementedError

    def _operand(self, tensor: torch.Tensor) -> tuple:
        """``tensor`` quantized as te_gemm's operand tuple (scaling_mode, rowwise_data,
        rowwise_scale_inv, columnwise_data, columnwise_scale_inv), None where absent: what te's
        modules use between their GEMMs, with no tensor subclass built (about a third of a
        quantization's host time)."""
        return self._parts_operand(*self._run4(tensor))

    def _run4(self, tensor: torch.Tensor) -> tuple:
        raise NotImplementedError

    def _parts_operand(self, rd, rs, cd, cs) -> tuple:
        """The operand tuple of a fused op's four output parts (the copies not asked for: None)."""
        row, col = self.rowwise_usage, self.columnwise_usage
        if not row:
            rd = rs = None
        if not col:
            cd = cs = None
        return self._mode, rd, rs, cd, cs

    def _owner(self) -> Quantizer | None:
        # The quantizer a new tensor refers to. Traced code cannot put a Python object into a
        # graph, so tensors made under torch.compile have none (like tensors loaded from disk).
        return None if torch.compiler.is_compiling() else self

    def _retag(self, qt: QuantizedTensor, dtype: torch.dtype) -> QuantizedTensor:
        inner, ctx = qt.__tensor_flatten__()
        ctx = tuple(dtype if c is qt.dtype else c for c in ctx)
        out = type(qt).__tensor_unflatten__({n: getattr(qt, n) for n in inner}, ctx, qt.shape, None)
        out._quantizer = self
        return out

    def update_quantized(self, src: torch.Tensor, dst: QuantizedTensor) -> QuantizedTensor:
        """Quantizes ``src`` (broadcast to ``dst.shape``) into ``dst``'s buffers, in place."""
        raise NotImplementedError

    def _flat(self) -> tuple | None:
        """(mode, te fp8 dtype, QuantConfig, amax, scale) as te_core._C's fused steps (linear_fwd /
        linear_bwd, layernorm_linear_*, layernorm_mlp_*; csrc/python/step_operands.h) take a
        quantization, or None where those steps do not apply (formats with more state than
        that: MXFP8 / NVFP4)."""
        return None

    def _fused_spec(self, eager: bool = True) -> QuantSpec:
        """How a fused op (norm, activation, dbias) quantizes its output as this quantizer would.
        ``eager`` False (tracing): no cached descriptors (they read data pointers)."""
        raise NotImplementedError

    def _wrap(self, rd, rs, cd, cs, shape: torch.Size, dtype: torch.dtype) -> QuantizedTensor:
        """The quantized tensor of a fused op's output parts (None where absent), of the logical
        ``shape`` and nominal high-precision ``dtype``."""
        raise NotImplementedError

    def copy(self) -> Quantizer:
        raise NotImplementedError


class _PerTensorQuantizer(Quantizer):
    """Shared per-tensor logic: ``scale``/``amax`` fp32 [1] buffers and the cached config."""

    _compute_scale = False
    _mode = _PER_TENSOR

    def __init__(self, fp8_dtype, *, rowwise, columnwise, pow2=False, eps=0.0) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = check_fp8_dtype(fp8_dtype)
        self._config = quant_config(self._compute_scale, bool(pow2), float(eps))
        self._pow2 = bool(pow2)
        self._eps = float(eps)
        self._scale_desc = _CachedDesc("scale")
        self._amax_desc = _CachedDesc("amax")

    @property
    def fp8_dtype(self) -> torch.dtype:
        return self.dtype

    def _run(self, x: torch.Tensor, out=None):
        """(rowwise_data, scale_inv, columnwise_data) of ``x``, None where absent."""
        rowwise, columnwise = self.rowwise_usage, self.columnwise_usage
        if is_eager(x):
            rd, rs, cd, cs = _kernels.quantize(
                x,
                self.amax,
                self.scale,
                _PER_TENSOR,
                self.dtype,
                rowwise,
                columnwise,
                self._config,
                self._amax_desc.get(self.amax),
                self._scale_desc.get(self.scale),
                out,
                True,  # one scale_inv for both copies: only one is kept below
            )
        else:
            _check_source(self, x)
            rd, rs, cd, cs = torch.ops.te.quantize(
                x,
                self.amax,
                self.scale,
                _PER_TENSOR,
                self.dtype,
                rowwise,
                columnwise,
                self._compute_scale,
                self._pow2,
                self._eps,
            )
        return (rd if rowwise else None), (rs if rowwise else cs), (cd if columnwise else None)

    def _run4(self, tensor: torch.Tensor) -> tuple:
        data, scale_inv, transpose = self._run(tensor)
        return data, scale_inv, transpose, scale_inv

    def _flat(self) -> tuple:
        return (
            _PER_TENSOR,
            TE_DTYPE[self.dtype],
            self._config,
            self._amax_desc.get(self.amax),
            self._scale_desc.get(self.scale),
        )

    def _parts_operand(self, rd, rs, cd, cs) -> tuple:
        row, col = self.rowwise_usage, self.columnwise_usage
        return (
            _PER_TENSOR,
            rd if row else None,
            rs if row else None,
            cd if col else None,
            cs if col else None,
        )

    def _quantize(self, tensor: torch.Tensor) -> Float8Tensor:
        data, scale_inv, transpose = self._run(tensor)
        return Float8Tensor(
            shape=tensor.shape,
            dtype=tensor.dtype,
            data=data,
            fp8_scale_inv=scale_inv,
            fp8_dtype=self.dtype,
            data_transpose=transpose,
            quantizer=self._owner(),
        )

    def _fused_spec(self, eager: bool = True) -> QuantSpec:
        return QuantSpec(
            _PER_TENSOR,
            self.dtype,
            self.rowwise_usage,
            self.columnwise_usage,
            self._config,
            self.amax,
            self.scale,
            self._amax_desc.get(self.amax) if eager else None,
            self._scale_desc.get(self.scale) if eager else None,
            self._compute_scale,
            self._pow2,
            self._eps,
        )

    def _wrap(self, rd, rs, cd, cs, shape, dtype) -> Float8Tensor:
        return Float8Tensor(
            shape=shape,
            dtype=dtype,
            data=rd if self.rowwise_usage else None,
            fp8_scale_inv=rs if self.rowwise_usage else cs,
            fp8_dtype=self.dtype,
            data_transpose=cd if self.columnwise_usage else None,
            quantizer=self._owner(),
        )

    def update_quantized(self, src: torch.Tensor, dst: QuantizedTensor) -> QuantizedTensor:
        if not isinstance(dst, Float8Tensor):
            raise TypeError(f"dst: expected a Float8Tensor, got {type(dst).__name__}")
        if src.shape != dst.shape:
            src = expand_source(src, dst)
        if src.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            src = src.to(dst.dtype)
        saved = self.rowwise_usage, self.columnwise_usage
        self.rowwise_usage, self.columnwise_usage = dst._data is not None, dst._transpose is not None
        try:
            if is_eager(src) and is_eager(dst._scale_inv):
                row, col = dst._data is not None, dst._transpose is not None
                self._run(
                    src,
                    out=(
                        dst._data,
                        dst._scale_inv if row else None,
                        dst._transpose,
                        dst._scale_inv if col else None,
                    ),
                )
            else:  # traced: quantize out of place, then copy into dst's buffers
                data, scale_inv, transpose = self._run(src)
                for d, s in ((dst._data, data), (dst._transpose, transpose)):
                    if d is not None:
                        d.copy_(s)
                dst._scale_inv.copy_(scale_inv)
        finally:
            self.rowwise_usage, self.columnwise_usage = saved
        return dst


class Float8Quantizer(_PerTensorQuantizer):
    """Delayed scaling (recipe.DelayedScaling): quantizes with a scale the caller owns.

    scale: fp32 [1], read by each quantization (q = fp8(x * scale), saturating); the decode
        scale 1/scale is stored on the output as ``_scale_inv``.
    amax: fp32 [1], updated in place to max(amax, max|x|) (NaN propagates), so every
        quantization of a step lands in the same amax-history slot.
    fp8_dtype: torch.float8_e4m3fn or torch.float8_e5m2.
    Both buffers are the caller's (the recipe state); reassigning them is allowed.
    """

    def __init__(
        self,
        scale: torch.Tensor,
        amax: torch.Tensor,
        fp8_dtype: torch.dtype,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
    ) -> None:
        super().__init__(fp8_dtype, rowwise=rowwise, columnwise=columnwise)
        self.scale = _check_stat("Float8Quantizer", "scale", scale)
        self.amax = _check_stat("Float8Quantizer", "amax", amax)

    def copy(self) -> Float8Quantizer:
        """A quantizer sharing this one's scale/amax buffers, with its own usage flags."""
        return Float8Quantizer(
            self.scale,
            self.amax,
            self.dtype,
            rowwise=self.rowwise_usage,
            columnwise=self.columnwise_usage,
        )

    def __repr__(self) -> str:
        return (
            f"Float8Quantizer(fp8_dtype={self.dtype}, rowwise={self.rowwise_usage}, "
            f"columnwise={self.columnwise_usage})"
        )


class Float8CurrentScalingQuantizer(_PerTensorQuantizer):
    """Current scaling (recipe.Float8CurrentScaling): the scale comes from the tensor itself.

    Each quantization writes amax = max|x| into ``self.amax`` and
    scale = fp8_max / max(amax, amax_epsilon) (1 if that is 0/inf/NaN; FLT_MAX if it
    overflows; rounded down to a power of two with ``force_pow_2_scales``) into ``self.scale``
    (both fp32 [1] on ``device``, overwritten by every call, as in TE), and stores
    1/scale on the output as ``_scale_inv``.
    """

    _compute_scale = True

    def __init__(
        self,
        fp8_dtype: torch.dtype,
        device: torch.device | str | int | None = None,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
        use_existing_amax: bool = False,
        with_amax_reduction: bool = False,
        amax_reduction_group: object = None,
        force_pow_2_scales: bool = False,
        amax_epsilon: float = 0.0,
    ) -> None:
        if with_amax_reduction or amax_reduction_group is not None:
            raise NotImplementedError(
                "Float8CurrentScalingQuantizer: with_amax_reduction is not supported yet "
                "(all-reduce `amax` yourself and pass use_existing_amax=True)"
            )
        _check_eps(amax_epsilon)
        super().__init__(
            fp8_dtype,
            rowwise=rowwise,
            columnwise=columnwise,
            pow2=force_pow_2_scales,
            eps=amax_epsilon,
        )
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.amax_epsilon = float(amax_epsilon)
        self.use_existing_amax = bool(use_existing_amax)
        if self.use_existing_amax:
            self._config = _C.QuantConfig(True, True, self._pow2, self._eps)
        device = torch.device("cpu") if device is None else torch.device(device)
        self.device = device
        self.scale = torch.ones(1, dtype=torch.float32, device=device)
        self.amax = torch.zeros(1, dtype=torch.float32, device=device)

    def _run(self, x, out=None):
        if self.use_existing_amax and not is_eager(x):
            raise NotImplementedError(
                "Float8CurrentScalingQuantizer: use_existing_amax is eager-only for now"
            )
        return super()._run(x, out)

    def copy(self) -> Float8CurrentScalingQuantizer:
        """A new quantizer with the same settings and its own amax/scale buffers."""
        return Float8CurrentScalingQuantizer(
            self.dtype,
            self.device,
            rowwise=self.rowwise_usage,
            columnwise=self.columnwise_usage,
            use_existing_amax=self.use_existing_amax,
            force_pow_2_scales=self.force_pow_2_scales,
            amax_epsilon=self.amax_epsilon,
        )

    def __repr__(self) -> str:
        return (
            f"Float8CurrentScalingQuantizer(fp8_dtype={self.dtype}, device={self.device}, "
            f"rowwise={self.rowwise_usage}, columnwise={self.columnwise_usage}, "
            f"force_pow_2_scales={self.force_pow_2_scales}, amax_epsilon={self.amax_epsilon})"
        )


class Float8BlockQuantizer(Quantizer):
    """Block scaling (recipe.Float8BlockScaling): one fp32 scale per block of the tensor.

    block_scaling_dim: 1 for 1x128 blocks along rows (the column-wise copy gets its own 128x1
        blocks along the original columns), 2 for 128x128 tiles.
    Each block's scale = fp8_max / max(block_amax, amax_epsilon) (1 if that is 0/inf/NaN),
    rounded down to a power of two when ``force_pow_2_scales`` (the default); edge blocks use
    only their valid elements. Layouts: te_torch.Float8BlockwiseQTensor.
    """

    def __init__(
        self,
        fp8_dtype: torch.dtype,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
        amax_epsilon: float = 0.0,
        force_pow_2_scales: bool = True,
        block_scaling_dim: int = 2,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = check_fp8_dtype(fp8_dtype)
        if block_scaling_dim not in (1, 2) or isinstance(block_scaling_dim, bool):
            raise ValueError(f"block_scaling_dim: expected 1 or 2, got {block_scaling_dim!r}")
        _check_eps(amax_epsilon)
        self.block_scaling_dim = int(block_scaling_dim)
        self.amax_epsilon = float(amax_epsilon)
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self._mode = _BLOCK_2D if block_scaling_dim == 2 else _BLOCK_1D
        self._config = quant_config(False, self.force_pow_2_scales, self.amax_epsilon)

    @property
    def fp8_dtype(self) -> torch.dtype:
        return self.dtype

    def _run(self, x: torch.Tensor, out=None):
        rowwise, columnwise = self.rowwise_usage, self.columnwise_usage
        if is_eager(x):
            return _kernels.quantize(
                x,
                None,
                None,
                self._mode,
                self.dtype,
                rowwise,
                columnwise,
                self._config,
                None,
                None,
                out,
            )
        _check_source(self, x)
        rd, rs, cd, cs = torch.ops.te.quantize(
            x,
            None,
            None,
            self._mode,
            self.dtype,
            rowwise,
            columnwise,
            False,
            self.force_pow_2_scales,
            self.amax_epsilon,
        )
        if not rowwise:
            rd = rs = None
        if not columnwise:
            cd = cs = None
        return rd, rs, cd, cs

    def _quantize(self, tensor: torch.Tensor) -> Float8BlockwiseQTensor:
        return self._wrap(*self._run(tensor), tensor.shape, tensor.dtype)

    def _run4(self, tensor: torch.Tensor) -> tuple:
        return self._run(tensor)

    def _flat(self) -> tuple:
        return self._mode, TE_DTYPE[self.dtype], self._config, None, None

    def _parts_operand(self, rd, rs, cd, cs) -> tuple:
        row, col = self.rowwise_usage, self.columnwise_usage
        return (
            self._mode,
            rd if row else None,
            rs if row else None,
            cd if col else None,
            cs if col else None,
        )

    def _fused_spec(self, eager: bool = True) -> QuantSpec:
        return QuantSpec(
            self._mode,
            self.dtype,
            self.rowwise_usage,
            self.columnwise_usage,
            self._config,
            None,
            None,
            None,
            None,
            False,
            self.force_pow_2_scales,
            self.amax_epsilon,
        )

    def _wrap(self, rd, rs, cd, cs, shape, dtype) -> Float8BlockwiseQTensor:
        row, col = self.rowwise_usage, self.columnwise_usage
        return Float8BlockwiseQTensor(
            shape=shape,
            dtype=dtype,
            fp8_dtype=self.dtype,
            rowwise_data=rd if row else None,
            rowwise_scale_inv=rs if row else None,
            columnwise_data=cd if col else None,
            columnwise_scale_inv=cs if col else None,
            is_2D_scaled=self._mode == _BLOCK_2D,
            quantizer=self._owner(),
        )

    def update_quantized(self, src: torch.Tensor, dst: QuantizedTensor) -> QuantizedTensor:
        if not isinstance(dst, Float8BlockwiseQTensor):
            raise TypeError(f"dst: expected a Float8BlockwiseQTensor, got {type(dst).__name__}")
        if dst._is_2D_scaled != (self._mode == _BLOCK_2D):
            raise ValueError(
                f"dst: expected {self.block_scaling_dim}D block scaling (this quantizer's), got "
                f"{2 if dst._is_2D_scaled else 1}D"
            )
        if src.shape != dst.shape:
            src = expand_source(src, dst)
        if src.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            src = src.to(dst.dtype)
        saved = self.rowwise_usage, self.columnwise_usage
        self.rowwise_usage = dst._rowwise_data is not None
        self.columnwise_usage = dst._columnwise_data is not None
        try:
            if is_eager(src) and all(p is None or is_eager(p) for p in dst._parts()):
                self._run(src, out=dst._parts())
            else:
                for d, s in zip(dst._parts(), self._run(src), strict=True):
                    if d is not None:
                        d.copy_(s)
        finally:
            self.rowwise_usage, self.columnwise_usage = saved
        return dst

    def copy(self) -> Float8BlockQuantizer:
        return Float8BlockQuantizer(
            self.dtype,
            rowwise=self.rowwise_usage,
            columnwise=self.columnwise_usage,
            amax_epsilon=self.amax_epsilon,
            force_pow_2_scales=self.force_pow_2_scales,
            block_scaling_dim=self.block_scaling_dim,
        )

    def __repr__(self) -> str:
        return (
            f"Float8BlockQuantizer(fp8_dtype={self.dtype}, rowwise={self.rowwise_usage}, "
            f"columnwise={self.columnwise_usage}, block_scaling_dim={self.block_scaling_dim}, "
            f"force_pow_2_scales={self.force_pow_2_scales}, amax_epsilon={self.amax_epsilon})"
        )
