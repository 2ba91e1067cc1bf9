"""FP8 / FP4 training recipes, drop-in for `transformer_engine.common.recipe`.

A TE user switches by changing the import: the class names, field names, field order, defaults
and derived `QParams`/`MMParams` are TE's (NUMERICS.md gives the numerics each field controls).
Framework-free: stdlib dataclasses only, shared by te-torch and te-jax.

Differences from TE, all deliberate:

- Defaults that TE reads from `NVTE_*` environment variables are read when a recipe is
  constructed (TE: once, at import), and `TE_*` spellings of the same variables win over `NVTE_*`.
- Invalid values raise ValueError/TypeError naming the field (TE: `assert`), also on assignment
  after construction; a failed assignment leaves the recipe unchanged.
- `Float8CurrentScaling` and `Float8BlockScaling` have an `amax_epsilon` keyword (NUMERICS.md),
  and their `fp8_quant_*` QParams follow the recipe's own `use_power_2_scales` /
  `use_f32_scales` / `amax_epsilon` (TE computes them once, from the environment, at import).
- `DelayedScaling` ignores `NVTE_BACKWARD_OVERRIDE` (it supports only None; TE fails instead).
- `DelayedScaling` has keyword-only `fp8_gemm_fprop` / `_dgrad` / `_wgrad` MMParams like the other
  per-tensor recipe's, defaulting to TE-PyTorch's fixed split accumulation (off / on / on), so a
  user can ask for TE-JAX's fast accumulation in all three GEMMs.
- `repr()` is constructor-like: `DelayedScaling(margin=0, fp8_format=Format.HYBRID, ...)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from te_core import _recipe_base as _b
from te_core._recipe_base import ElementFormat, Format, MMParams, QParams, Recipe

__all__ = [
    "CustomRecipe",
    "DelayedScaling",
    "ElementFormat",
    "Float8BlockScaling",
    "Float8CurrentScaling",
    "Format",
    "MMParams",
    "MXFP8BlockScaling",
    "NVFP4BlockScaling",
    "QParams",
    "Recipe",
]

_FP8_FORMATS = (Format.E4M3, Format.HYBRID)
_NVFP4_4OVER6_SCOPES = ("none", "weights", "activations", "all")
_NVFP4_4OVER6_ERR_MODES = ("MAE", "MSE")


def _backward_override_default() -> str | None:
    return _b.env_str("BACKWARD_OVERRIDE", None)


def _flag(name: str) -> Callable[[], bool]:
    return lambda: _b.env_flag(name)


def _check_fp8_common(r: Recipe, formats=_FP8_FORMATS, overrides=_b.BACKWARD_OVERRIDES) -> None:
    owner = type(r).__name__
    _b.check_format(owner, "fp8_format", r.fp8_format, formats)
    _b.check_bool(owner, "fp8_dpa", r.fp8_dpa)
    _b.check_bool(owner, "fp8_mha", r.fp8_mha)
    _b.check_backward_override(owner, r.backward_override, overrides)


def _check_qparams(r: Recipe, names) -> None:
    for name in names:
        _b.check_type(type(r).__name__, name, getattr(r, name), QParams)


def _check_mmparams(r: Recipe, require_split: bool = False) -> None:
    owner = type(r).__name__
    for name in ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"):
        value = getattr(r, name)
        _b.check_type(owner, name, value, MMParams)
        if require_split and not value.use_split_accumulator:
            _b.fail(
                ValueError,
                owner,
                name,
                "MMParams(use_split_accumulator=True) (block scaling needs split accumulation)",
                value,
            )


@dataclass(repr=True)
class DelayedScaling(Recipe):
    """Per-tensor scaling from an amax history (NUMERICS.md "DelayedScaling").

    Attributes:
        margin: scale = (fp8_max / amax) / 2**margin; a number >= 0 (powers of two of headroom).
        fp8_format: Format.HYBRID (E4M3 forward, E5M2 gradients) or Format.E4M3.
        amax_history_len: steps of amax history per tensor role, >= 1.
        amax_compute_algo: "max" (over the history), "most_recent", or callable(history) -> amax.
        scaling_factor_compute_algo: None (the rule above) or callable(amax, old_scale, fp8_max,
            recipe) -> scale.
        reduce_amax: all-reduce (max) amaxes across the amax reduction group before the update.
        fp8_dpa / fp8_mha: FP8 attention core / also FP8 between QKV, attention and projection.
        backward_override: only None is supported.
        fp8_gemm_fprop / _dgrad / _wgrad (keyword only, te): split accumulation off / on / on,
            TE-PyTorch's fixed choice. TE's DelayedScaling has no such fields, and TE-JAX runs all
            three GEMMs with fast accumulation (MMParams(use_split_accumulator=False) for dgrad
            and wgrad gives that: faster, less accurate over long reductions).
    """

    margin: int | float = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str | Callable = "max"
    scaling_factor_compute_algo: Callable | None = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = None
    _: KW_ONLY
    fp8_gemm_fprop: MMParams = field(default=MMParams(use_split_accumulator=False))
    fp8_gemm_dgrad: MMParams = field(default=MMParams(use_split_accumulator=True))
    fp8_gemm_wgrad: MMParams = field(default=MMParams(use_split_accumulator=True))

    _KINDS = frozenset({"delayed"})

    def _validate(self) -> None:
        owner = "DelayedScaling"
        _check_fp8_common(self, overrides=(None,))
        _check_mmparams(self)
        _b.check_number(owner, "margin", self.margin)
        _b.check_int(owner, "amax_history_len", self.amax_history_len, minimum=1)
        algo = self.amax_compute_algo
        if not callable(algo) and algo not in ("max", "most_recent"):
            _b.fail(
                ValueError,
                owner,
                "amax_compute_algo",
                "'max', 'most_recent' or a callable",
                algo,
            )
        sf = self.scaling_factor_compute_algo
        if sf is not None and not callable(sf):
            _b.fail(
                TypeError,
                owner,
                "scaling_factor_compute_algo",
                "None or a callable",
                sf,
            )
        _b.check_bool(owner, "reduce_amax", self.reduce_amax)


@dataclass(repr=True)
class Float8CurrentScaling(Recipe):
    """Per-tensor scaling from the tensor's own amax (NUMERICS.md "Float8CurrentScaling").

    Attributes:
        use_power_2_scales: round scales down to powers of two. Default from
            ``TE_FP8_CURRENT_SCALING_POWER_2_SCALES`` (or ``NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES``) (0).
        fp8_format: Format.HYBRID (default) or Format.E4M3.
        fp8_gemm_fprop / _dgrad / _wgrad: split accumulation off / on / on.
        amax_epsilon (keyword only, te): amax = max(amax, amax_epsilon) before the scale; >= 0.
        fp8_quant_fwd_inp / _fwd_weight / _bwd_grad (derived): QParams(power_2_scale=
            use_power_2_scales, amax_epsilon=amax_epsilon).
    """

    use_power_2_scales: bool = field(default_factory=_flag("FP8_CURRENT_SCALING_POWER_2_SCALES"))
    fp8_format: Format = Format.HYBRID
    fp8_gemm_fprop: MMParams = field(default=MMParams(use_split_accumulator=False))
    fp8_gemm_dgrad: MMParams = field(default=MMParams(use_split_accumulator=True))
    fp8_gemm_wgrad: MMParams = field(default=MMParams(use_split_accumulator=True))
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_backward_override_default)
    _: KW_ONLY
    amax_epsilon: float = 0.0
    fp8_quant_fwd_inp: QParams = field(default=None, init=False)  # derived
    fp8_quant_fwd_weight: QParams = field(default=None, init=False)  # derived
    fp8_quant_bwd_grad: QParams = field(default=None, init=False)  # derived

    _KINDS = frozenset({"current"})
    _DERIVED = ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad")
    _POW2_FIELD = "use_power_2_scales"

    def _derive(self) -> None:
        owner = type(self).__name__
        _b.check_bool(owner, self._POW2_FIELD, getattr(self, self._POW2_FIELD))
        _b.check_number(owner, "amax_epsilon", self.amax_epsilon)
        pow2 = getattr(self, self._POW2_FIELD)
        if self._POW2_FIELD == "use_f32_scales":
            pow2 = not pow2
        for name in self._DERIVED:
            if name not in self._overridden:
                object.__setattr__(
                    self,
                    name,
                    QParams(power_2_scale=pow2, amax_epsilon=self.amax_epsilon),
                )

    def _validate(self) -> None:
        _check_fp8_common(self)
        _check_mmparams(self)
        _check_qparams(self, self._DERIVED)


@dataclass(repr=True)
class Float8BlockScaling(Recipe):
    """FP8 with 1x128 / 128x128 block scales, DeepSeek-V3 style (NUMERICS.md "Float8BlockScaling").

    Attributes:
        use_f32_scales: keep fp32 scales as computed; default (False) rounds them down to powers of
            two. Default from ``TE_FP8_BLOCK_SCALING_FP32_SCALES`` (or
            ``NVTE_FP8_BLOCK_SCALING_FP32_SCALES``), 0.
        fp8_format: Format.E4M3 only.
        x_block_scaling_dim / w_block_scaling_dim / grad_block_scaling_dim: 1 (1x128 blocks along a
            row) or 2 (128x128 tiles) for inputs / weights / gradients. Each GEMM (fprop x*w, dgrad
            dy*w, wgrad x^T*dy) may have at most one 2D operand.
        fp8_gemm_*: split accumulation must stay on for all three GEMMs.
        fp8_dpa / fp8_mha: must be False (no FP8 attention with block scaling).
        amax_epsilon (keyword only, te): lower bound on each block's amax; >= 0.
        fp8_quant_fwd_inp / _fwd_weight / _bwd_grad (derived): QParams(power_2_scale=
            not use_f32_scales, amax_epsilon=amax_epsilon).
    """

    use_f32_scales: bool = field(default_factory=_flag("FP8_BLOCK_SCALING_FP32_SCALES"))
    fp8_format: Format = Format.E4M3
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: MMParams = field(default=MMParams(use_split_accumulator=True))
    fp8_gemm_dgrad: MMParams = field(default=MMParams(use_split_accumulator=True))
    fp8_gemm_wgrad: MMParams = field(default=MMParams(use_split_accumulator=True))
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_backward_override_default)
    _: KW_ONLY
    amax_epsilon: float = 0.0
    fp8_quant_fwd_inp: QParams = field(default=None, init=False)  # derived
    fp8_quant_fwd_weight: QParams = field(default=None, init=False)  # derived
    fp8_quant_bwd_grad: QParams = field(default=None, init=False)  # derived

    _KINDS = frozenset({"block"})
    _DERIVED = Float8CurrentScaling._DERIVED
    _POW2_FIELD = "use_f32_scales"
    _derive = Float8CurrentScaling._derive

    def _validate(self) -> None:
        owner = "Float8BlockScaling"
        _check_fp8_common(self, formats=(Format.E4M3,))
        dims = ("x_block_scaling_dim", "w_block_scaling_dim", "grad_block_scaling_dim")
        for name in dims:
            _b.check_int(owner, name, getattr(self, name), allowed=(1, 2))
        x, w, g = (getattr(self, name) for name in dims)
        for gemm, (a, b), (da, db) in (
            ("fprop", dims[:2], (x, w)),
            ("dgrad", dims[2:0:-1], (g, w)),
            ("wgrad", dims[::2], (x, g)),
        ):
            if da == 2 and db == 2:
                raise ValueError(
                    f"{owner}: {a}=2 with {b}=2 makes the {gemm} GEMM 2D x 2D (128x128 blocks "
                    "on both operands), which is not supported: at most one operand of each "
                    "GEMM may use 2D blocks"
                )
        _check_mmparams(self, require_split=True)
        for name in ("fp8_dpa", "fp8_mha"):
            if getattr(self, name):
                _b.fail(
                    ValueError,
                    owner,
                    name,
                    "False (FP8 attention is not supported with Float8BlockScaling)",
                    True,
                )
        _check_qparams(self, self._DERIVED)


@dataclass(repr=True)
class MXFP8BlockScaling(Recipe):
    """OCP MXFP8: 1x32 / 32x1 blocks with E8M0 scales (NUMERICS.md "MXFP8BlockScaling").

    Attributes:
        margin: accepted for TE compatibility and ignored (a number >= 0).
        fp8_format: Format.E4M3 (default; gradients E4M3 too) or Format.HYBRID.
        enable_2d_quantization: weights use one scale per 32x32 block.
    """

    margin: int | float = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_backward_override_default)
    enable_2d_quantization: bool = False

    _KINDS = frozenset({"mxfp8"})

    def _validate(self) -> None:
        _check_fp8_common(self)
        _b.check_number("MXFP8BlockScaling", "margin", self.margin)
        _b.check_bool("MXFP8BlockScaling", "enable_2d_quantization", self.enable_2d_quantization)


@dataclass(repr=True)
class NVFP4BlockScaling(Recipe):
    """NVFP4: E2M1 elements, E4M3 scales per 16 elements, fp32 global scale (NUMERICS.md).

    Attributes:
        disable_rht / disable_stochastic_rounding / disable_2d_quantization / row_scaled_activation:
            defaults from ``TE_NVFP4_DISABLE_RHT`` (or ``NVTE_NVFP4_DISABLE_RHT``),
            _DISABLE_STOCHASTIC_ROUNDING, _DISABLE_2D_QUANTIZATION, _ROW_SCALED_ACTIVATION (all 0).
        nvfp4_4over6: 'none', 'weights', 'activations' or 'all' (env NVFP4_4OVER6, default 'none').
        nvfp4_4over6_e4m3_use_256: same choices (env NVFP4_4OVER6_E4M3_USE_256, default 'all').
        nvfp4_4over6_err_mode: 'MAE' or 'MSE' (env NVFP4_4OVER6_ERR_MODE, upper-cased; default 'MAE').
        fp4_format: Format.E2M1 only. fp8_format: Format.E4M3 only (the block-scale format).
        fp4_quant_fwd_inp (derived): QParams(random_hadamard_transform=not disable_rht).
        fp4_quant_fwd_weight (derived): QParams(fp4_2d_quantization=not disable_2d_quantization).
        fp4_quant_bwd_grad (derived): QParams(random_hadamard_transform=not disable_rht,
            stochastic_rounding=not disable_stochastic_rounding).
    """

    disable_rht: bool = field(default_factory=_flag("NVFP4_DISABLE_RHT"))
    disable_stochastic_rounding: bool = field(default_factory=_flag("NVFP4_DISABLE_STOCHASTIC_ROUNDING"))
    disable_2d_quantization: bool = field(default_factory=_flag("NVFP4_DISABLE_2D_QUANTIZATION"))
    row_scaled_activation: bool = field(default_factory=_flag("NVFP4_ROW_SCALED_ACTIVATION"))
    nvfp4_4over6: str = field(default_factory=lambda: _b.env_str("NVFP4_4OVER6", "none"))
    nvfp4_4over6_e4m3_use_256: str = field(
        default_factory=lambda: _b.env_str("NVFP4_4OVER6_E4M3_USE_256", "all")
    )
    nvfp4_4over6_err_mode: str = field(
        default_factory=lambda: _b.env_str("NVFP4_4OVER6_ERR_MODE", "MAE").upper()
    )
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_backward_override_default)
    fp4_quant_fwd_inp: QParams = field(default=None, init=False)  # derived
    fp4_quant_fwd_weight: QParams = field(default=None, init=False)  # derived
    fp4_quant_bwd_grad: QParams = field(default=None, init=False)  # derived

    _KINDS = frozenset({"nvfp4"})
    _DERIVED = ("fp4_quant_fwd_inp", "fp4_quant_fwd_weight", "fp4_quant_bwd_grad")

    def _derive(self) -> None:
        owner = "NVFP4BlockScaling"
        for name in (
            "disable_rht",
            "disable_stochastic_rounding",
            "disable_2d_quantization",
        ):
            _b.check_bool(owner, name, getattr(self, name))
        values = {
            "fp4_quant_fwd_inp": QParams(random_hadamard_transform=not self.disable_rht),
            "fp4_quant_fwd_weight": QParams(fp4_2d_quantization=not self.disable_2d_quantization),
            "fp4_quant_bwd_grad": QParams(
                random_hadamard_transform=not self.disable_rht,
                stochastic_rounding=not self.disable_stochastic_rounding,
            ),
        }
        for name, value in values.items():
            if name not in self._overridden:
                object.__setattr__(self, name, value)

    def _validate(self) -> None:
        owner = "NVFP4BlockScaling"
        _b.check_format(owner, "fp4_format", self.fp4_format, (Format.E2M1,))
        _check_fp8_common(self, formats=(Format.E4M3,))
        _b.check_bool(owner, "row_scaled_activation", self.row_scaled_activation)
        for name, allowed in (
            ("nvfp4_4over6", _NVFP4_4OVER6_SCOPES),
            ("nvfp4_4over6_e4m3_use_256", _NVFP4_4OVER6_SCOPES),
            ("nvfp4_4over6_err_mode", _NVFP4_4OVER6_ERR_MODES),
        ):
            if getattr(self, name) not in allowed:
                _b.fail(ValueError, owner, name, f"one of {allowed}", getattr(self, name))
        _check_qparams(self, self._DERIVED)


@dataclass(repr=True)
class CustomRecipe(Recipe):
    """Experimental: quantizers come from a user factory, `qfactory(role) -> quantizer | request`.

    Attributes:
        fp8_format: read by internals (dtype and backend choice), not by the factory's quantizers.
        quantization_alignment: row alignment (elements) the factory's quantizers need; an int >= 1.
    """

    qfactory: Callable[..., Any]
    fp8_format: Format = Format.HYBRID
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_backward_override_default)
    quantization_alignment: int = 128

    _KINDS = frozenset({"custom"})

    def _validate(self) -> None:
        if not callable(self.qfactory):
            _b.fail(TypeError, "CustomRecipe", "qfactory", "a callable", self.qfactory)
        _check_fp8_common(self)
        _b.check_int(
            "CustomRecipe",
            "quantization_alignment",
            self.quantization_alignment,
            minimum=1,
        )
