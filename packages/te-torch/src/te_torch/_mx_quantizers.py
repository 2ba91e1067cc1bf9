"""MXFP8Quantizer and NVFP4Quantizer (TE's names): microscaled quantization through te-core.

Every value is te_quantize's (te/quantize.h; NUMERICS.md "MXFP8BlockScaling", "NVFP4BlockScaling"):
these classes only hold the options, allocate the outputs and pick the random seed of stochastic
rounding. Outputs: te_torch.MXFP8Tensor / NVFP4Tensor (layouts in _mx_tensor.py), or, on the
modules' hot path, te_gemm operand tuples (``_operand``).

te's norm and activation kernels cannot write these formats (te-core rejects an MXFP8/NVFP4 output
of a fused op), so ``_fusable`` is False: _fused runs the kernel into fp32 and quantizes that.

Input of every quantizer: a float32 / bfloat16 / float16 tensor [..., K] (made contiguous if it is
not). Eager only (torch.compile: NotImplementedError).
"""

from __future__ import annotations

import torch
from te_core import _C

from te_torch import _kernels
from te_torch._dtypes import check_fp8_dtype
from te_torch._mx_tensor import MXFP8Tensor, NVFP4Tensor, not_traceable
from te_torch._quantized_tensor import QuantizedTensor, is_eager
from te_torch._quantizers import Quantizer, expand_source

_MXFP8 = int(_C.ScalingMode.MXFP8_1D)
_NVFP4 = int(_C.ScalingMode.NVFP4_1D)
_SOURCE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_SEED_HIGH = 2**63 - 1
_FP4_DTYPES = (None,) + ((torch.float4_e2m1fn_x2,) if hasattr(torch, "float4_e2m1fn_x2") else ())


def _check_bool(owner: str, name: str, v) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{owner}: {name}: expected a bool, got {v!r} ({type(v).__name__})")
    return v


def _check_amax(owner: str, amax, dst) -> None:
    """update_quantized's ``amax``: NVFP4's fp32 [2] global amaxes on ``dst``'s device."""
    if owner != "NVFP4Quantizer":
        raise ValueError(f"{owner}.update_quantized: amax: MXFP8 has no global amax; pass None")
    ok = (
        isinstance(amax, torch.Tensor)
        and amax.dtype == torch.float32
        and amax.shape == (2,)
        and amax.device == dst.device
    )
    if not ok:
        got = (amax.dtype, tuple(amax.shape), str(amax.device)) if isinstance(amax, torch.Tensor) else amax
        raise ValueError(
            f"{owner}.update_quantized: amax: expected the fp32 [2] global amaxes (row-wise, "
            f"column-wise copy) on {dst.device}, got {got}"
        )


class _MXQuantizer(Quantizer):
    """What MXFP8Quantizer and NVFP4Quantizer share: eager checks, in-place re-quantization."""

    _fusable = False
    _mode: int
    with_2d_quantization: bool
    # Subclasses define _run(x) -> (rd, rs, cd, cs, amax), _quantize(x, dtype) and copy().

    def _source(self, x) -> torch.Tensor:
        """``x`` checked as a quantization source (a torch.Tensor of a float dtype, eager)."""
        owner = type(self).__name__
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{owner}: tensor: expected a torch.Tensor, got {type(x).__name__}")
        if not is_eager(x):
            raise not_traceable(owner)
        if x.dtype not in _SOURCE_DTYPES:
            raise TypeError(f"{owner}: tensor: expected float32, bfloat16 or float16, got {x.dtype}")
        return x

    def _run4(self, tensor: torch.Tensor) -> tuple:
        return self._run(tensor)[:4]

    def update_quantized(
        self, src: torch.Tensor, dst: QuantizedTensor, amax: torch.Tensor | None = None
    ) -> QuantizedTensor:
        """Quantizes ``src`` (broadcast to ``dst.shape``) into ``dst``'s buffers, the copies
        ``dst`` holds. Quantized out of place and copied in (torch checks the sizes): this runs
        once per optimizer step on a stored weight, not per GEMM. ``amax`` (NVFP4 only): the
        fp32 [2] global amaxes to encode with instead of ``src``'s own (an FSDP2 shard's, those
        of the whole weight)."""
        cls = MXFP8Tensor if self._mode == _MXFP8 else NVFP4Tensor
        if not isinstance(dst, cls):
            raise TypeError(f"dst: expected a {cls.__name__}, got {type(dst).__name__}")
        if amax is not None:
            _check_amax(type(self).__name__, amax, dst)
        if src.shape != dst.shape:
            src = expand_source(src, dst)
        if src.dtype not in _SOURCE_DTYPES:
            src = src.to(dst.dtype)
        q = self.copy()
        q.set_usage(rowwise=dst._rowwise_data is not None, columnwise=dst._columnwise_data is not None)
        new = q._quantize(src, dst.dtype) if amax is None else q._quantize(src, dst.dtype, amax)
        for d, s in zip(dst._parts(), new._parts(), strict=True):
            if d is not None:
                d.copy_(s)
        if isinstance(dst, NVFP4Tensor):
            dst._amax.copy_(new._amax)
        return dst


class MXFP8Quantizer(_MXQuantizer):
    """MXFP8 (recipe.MXFP8BlockScaling): FP8 elements, one E8M0 scale per 32 consecutive elements.

    fp8_dtype: torch.float8_e4m3fn or torch.float8_e5m2.
    with_2d_quantization: one scale per 32x32 tile instead of per 1x32 run, so the row-wise and
        column-wise copies hold the same values (weights under
        ``MXFP8BlockScaling(enable_2d_quantization=True)``).
    Per block: e = the E8M0 of block_amax / fp8_max rounded up (so the block's largest element
    never saturates), q = fp8(x * 2^(127 - e)); the column-wise copy [K, M] has its own blocks
    along the source's columns. Layouts: te_torch.MXFP8Tensor.
    """

    _mode = _MXFP8

    def __init__(
        self,
        fp8_dtype: torch.dtype,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
        with_2d_quantization: bool = False,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = check_fp8_dtype(fp8_dtype)
        tiles = _check_bool("MXFP8Quantizer", "with_2d_quantization", with_2d_quantization)
        self.with_2d_quantization = tiles
        self._config = _C.QuantConfig(with_2d_quantization=self.with_2d_quantization)

    @property
    def fp8_dtype(self) -> torch.dtype:
        return self.dtype

    def _run(self, x: torch.Tensor) -> tuple:
        """(rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, None)."""
        x = self._source(x)
        return _kernels.quantize_mx(
            x, _MXFP8, self.dtype, self.rowwise_usage, self.columnwise_usage, self._config
        )

    def _quantize(self, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> MXFP8Tensor:
        rd, rs, cd, cs, _ = self._run(tensor)
        return MXFP8Tensor(
            shape=tensor.shape,
            dtype=tensor.dtype if dtype is None else dtype,
            fp8_dtype=self.dtype,
            rowwise_data=rd,
            rowwise_scale_inv=rs,
            columnwise_data=cd,
            columnwise_scale_inv=cs,
            with_2d_quantization=self.with_2d_quantization,
            quantizer=self._owner(),
        )

    def copy(self) -> MXFP8Quantizer:
        return MXFP8Quantizer(
            self.dtype,
            rowwise=self.rowwise_usage,
            columnwise=self.columnwise_usage,
            with_2d_quantization=self.with_2d_quantization,
        )

    def __repr__(self) -> str:
        return (
            f"MXFP8Quantizer(fp8_dtype={self.dtype}, rowwise={self.rowwise_usage}, "
            f"columnwise={self.columnwise_usage}, with_2d_quantization={self.with_2d_quantization})"
        )


class NVFP4Quantizer(_MXQuantizer):
    """NVFP4 (recipe.NVFP4BlockScaling): E2M1 elements, E4M3 scales per 16, fp32 global scale.

    fp4_dtype: None (E2M1, the only FP4 format; TE's default) or torch.float4_e2m1fn_x2.
    with_rht: the column-wise copy (the wgrad operand) holds the random Hadamard transform of the
        source: each run of 16 along M times (1/4) diag(s) H16, te's fixed sign vector s
        (NUMERICS.md); M must then be a multiple of 16. Both operands of a wgrad GEMM must have
        it, or neither.
    with_post_rht_amax: the transformed copy's global amax is taken after the transform (True,
        te's only behaviour; None means True).
    with_2d_quantization: one scale per 16x16 tile (weights), so both copies hold the same
        values. Not with ``with_rht``.
    stochastic_rounding: round elements to E2M1 stochastically (gradients). Each quantization
        draws a fresh 63-bit seed from torch's default CPU generator (so ``torch.manual_seed``
        makes runs reproducible, and CPU and CUDA give the same bits for the same seed); te's
        Philox4x32-10 stream of that seed decides every element (te/quantize.h).
    with_random_sign_mask: the sign vector of the transform (True: te's fixed one; False is not
        implemented). with_amax_reduction / amax_reduction_group: not implemented yet.
    Per copy: S_enc = 2688 / global_amax; per block s_block = e4m3(block_amax / 6 * S_enc);
    q = e2m1(x * S_enc / s_block). Layouts: te_torch.NVFP4Tensor.
    """

    _mode = _NVFP4

    def __init__(
        self,
        fp4_dtype: object = None,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
        with_amax_reduction: bool = False,
        amax_reduction_group: object = None,
        with_rht: bool = False,
        with_post_rht_amax: bool | None = None,
        with_2d_quantization: bool = False,
        stochastic_rounding: bool = False,
        with_random_sign_mask: bool = True,
    ) -> None:
        owner = "NVFP4Quantizer"
        if fp4_dtype not in _FP4_DTYPES:
            raise ValueError(
                f"{owner}: fp4_dtype: expected None (E2M1) or torch.float4_e2m1fn_x2, got {fp4_dtype!r}"
            )
        if with_amax_reduction or amax_reduction_group is not None:
            raise NotImplementedError(
                f"{owner}: with_amax_reduction is not supported yet (te has no distributed "
                "amax reduction for NVFP4; quantize unsharded tensors)"
            )
        self.with_rht = _check_bool(owner, "with_rht", with_rht)
        if with_post_rht_amax is not None:
            _check_bool(owner, "with_post_rht_amax", with_post_rht_amax)
        if self.with_rht and with_post_rht_amax is False:
            raise NotImplementedError(
                f"{owner}: with_post_rht_amax=False is not implemented: te-core encodes the "
                "transformed column-wise copy with its own amax, taken after the transform "
                "(NUMERICS.md); pass True or leave it None"
            )
        if not _check_bool(owner, "with_random_sign_mask", with_random_sign_mask):
            raise NotImplementedError(
                f"{owner}: with_random_sign_mask=False is not implemented: te's transform uses "
                "the fixed sign vector of NUMERICS.md"
            )
        self.with_2d_quantization = _check_bool(owner, "with_2d_quantization", with_2d_quantization)
        if self.with_rht and self.with_2d_quantization:
            raise ValueError(
                f"{owner}: with_rht and with_2d_quantization: expected at most one (16x16 tiles make "
                "the column-wise copy the row-wise one transposed; the transform would change it)"
            )
        self.stochastic_rounding = _check_bool(owner, "stochastic_rounding", stochastic_rounding)
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.with_post_rht_amax = self.with_rht
        self._config = _C.QuantConfig(with_2d_quantization=self.with_2d_quantization)

    def _call_config(self, existing_amax: bool = False) -> _C.QuantConfig:
        """The te_quant_config of one quantization: with stochastic rounding, a fresh seed;
        ``existing_amax``: the global amaxes are given, not taken from the source."""
        if not self.stochastic_rounding and not existing_amax:
            return self._config
        seed = 0
        if self.stochastic_rounding:
            seed = int(torch.randint(_SEED_HIGH, (1,), dtype=torch.int64).item())
        return _C.QuantConfig(
            compute_scale=existing_amax,  # te_quant_config reads a given amax only with it
            use_existing_amax=existing_amax,
            with_2d_quantization=self.with_2d_quantization,
            stochastic_rounding=self.stochastic_rounding,
            rng_seed=seed,
        )

    def _run(self, x: torch.Tensor, amax: torch.Tensor | None = None) -> tuple:
        """(rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, amax);
        ``amax``: fp32 [2] global amaxes to encode with (returned as given), else the source's."""
        x = self._source(x)
        if not x.shape:
            raise ValueError(
                "NVFP4Quantizer: tensor: expected at least 1 dim, the last one even (E2M1 packs "
                "two elements per byte along it), got a 0-dim tensor"
            )
        return _kernels.quantize_mx(
            x,
            _NVFP4,
            None,
            self.rowwise_usage,
            self.columnwise_usage,
            self._call_config(amax is not None),
            self.with_rht,
            amax,
        )

    def _operand(self, tensor: torch.Tensor) -> tuple:
        """te_gemm's operand tuple (mode, rd, rs, cd, cs, amax, columnwise_rht)."""
        rd, rs, cd, cs, amax = self._run(tensor)
        return _NVFP4, rd, rs, cd, cs, amax, self.with_rht

    def _quantize(
        self, tensor: torch.Tensor, dtype: torch.dtype | None = None, amax: torch.Tensor | None = None
    ) -> NVFP4Tensor:
        rd, rs, cd, cs, amax = self._run(tensor, amax)
        return NVFP4Tensor(
            shape=tensor.shape,
            dtype=tensor.dtype if dtype is None else dtype,
            rowwise_data=rd,
            rowwise_scale_inv=rs,
            columnwise_data=cd,
            columnwise_scale_inv=cs,
            amax=amax,
            columnwise_rht=self.with_rht,
            with_2d_quantization=self.with_2d_quantization,
            quantizer=self._owner(),
        )

    def copy(self) -> NVFP4Quantizer:
        return NVFP4Quantizer(
            rowwise=self.rowwise_usage,
            columnwise=self.columnwise_usage,
            with_rht=self.with_rht,
            with_2d_quantization=self.with_2d_quantization,
            stochastic_rounding=self.stochastic_rounding,
        )

    def __repr__(self) -> str:
        return (
            f"NVFP4Quantizer(rowwise={self.rowwise_usage}, columnwise={self.columnwise_usage}, "
            f"with_rht={self.with_rht}, with_2d_quantization={self.with_2d_quantization}, "
            f"stochastic_rounding={self.stochastic_rounding})"
        )
