"""Formats, GEMM/quantization parameters, environment defaults and the `Recipe` base.

Private: the public names are re-exported by `te_core.recipe`. Framework-free (stdlib only), so
te-torch, te-jax and a CPU-only install share one definition. NUMERICS.md is the specification.
"""

from __future__ import annotations

import enum
import math
import numbers
import os
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

__all__ = ["ElementFormat", "Format", "MMParams", "QParams", "Recipe"]

BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")


# --------------------------------------------------------------------------------------------
# Element formats and Format
# --------------------------------------------------------------------------------------------
class ElementFormat(enum.Enum):
    """An element (storage) format. The value is the dtype name torch / ml_dtypes use."""

    E4M3 = "float8_e4m3fn"
    E5M2 = "float8_e5m2"
    E2M1 = "float4_e2m1fn"

    @property
    def max(self) -> float:
        """Largest finite value (OCP FP8 / MX specifications): 448, 57344 or 6."""
        return _ELEMENT_MAX[self]

    def __repr__(self) -> str:
        return f"ElementFormat.{self.name}"


_ELEMENT_MAX = {
    ElementFormat.E4M3: 448.0,
    ElementFormat.E5M2: 57344.0,
    ElementFormat.E2M1: 6.0,
}


class _FormatHelper(NamedTuple):
    """Largest finite value of the forward (max_fwd) and backward (max_bwd) element format."""

    max_fwd: float
    max_bwd: float


class Format(enum.Enum):
    """Which element format forward tensors and gradients use (TE's `recipe.Format`).

    E4M3: every tensor E4M3. HYBRID: forward tensors E4M3, gradients E5M2. E5M2: every tensor
    E5M2 (rejected by every recipe). E2M1: FP4, for NVFP4. `.value` is TE's `(max_fwd, max_bwd)`
    named tuple, so `fmt.value.max_fwd` works as in TE; `fmt.max_fwd` is a shortcut.
    """

    E2M1 = _FormatHelper(max_fwd=6, max_bwd=6)
    E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
    E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
    HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)

    @property
    def max_fwd(self) -> float:
        """fp8_max (fp4_max for E2M1) of forward tensors: inputs, weights, outputs."""
        return self.value.max_fwd

    @property
    def max_bwd(self) -> float:
        """fp8_max of backward tensors: grad-output, grad-input."""
        return self.value.max_bwd

    @property
    def fwd_dtype(self) -> ElementFormat:
        """Element format of forward tensors."""
        return _FORMAT_DTYPES[self][0]

    @property
    def bwd_dtype(self) -> ElementFormat:
        """Element format of gradients."""
        return _FORMAT_DTYPES[self][1]

    def __repr__(self) -> str:
        return f"Format.{self.name}"


_FORMAT_DTYPES = {
    Format.E2M1: (ElementFormat.E2M1, ElementFormat.E2M1),
    Format.E4M3: (ElementFormat.E4M3, ElementFormat.E4M3),
    Format.E5M2: (ElementFormat.E5M2, ElementFormat.E5M2),
    Format.HYBRID: (ElementFormat.E4M3, ElementFormat.E5M2),
}


# --------------------------------------------------------------------------------------------
# Validation helpers: every message names the field, the expected and the actual value.
# --------------------------------------------------------------------------------------------
def fail(exc: type, owner: str, name: str, expected: str, got: Any) -> None:
    raise exc(f"{owner}.{name}: expected {expected}, got {got!r}")


def check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        fail(TypeError, owner, name, "a bool", value)


def check_number(owner: str, name: str, value: Any, what: str = "a finite number >= 0") -> None:
    """A real number (not a bool), finite and non-negative."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(TypeError, owner, name, what, value)
    if not math.isfinite(value) or value < 0:
        fail(ValueError, owner, name, what, value)


def check_int(owner: str, name: str, value: Any, allowed: tuple[int, ...] = (), minimum: int = 0):
    what = f"one of {allowed}" if allowed else f"an int >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(TypeError, owner, name, what, value)
    if (allowed and value not in allowed) or (not allowed and value < minimum):
        fail(ValueError, owner, name, what, value)


def check_type(owner: str, name: str, value: Any, cls: type) -> None:
    if not isinstance(value, cls):
        fail(TypeError, owner, name, f"a {cls.__name__}", value)


def check_format(owner: str, name: str, value: Any, allowed: tuple[Format, ...]) -> None:
    """`value` is a Format among `allowed`; E5M2 gets the message that says what to use."""
    expected = " or ".join(repr(f) for f in allowed)
    if not isinstance(value, Format):
        fail(TypeError, owner, name, f"a Format ({expected})", value)
    if value is Format.E5M2 and Format.HYBRID in allowed:
        raise ValueError(
            f"{owner}: {name}=Format.E5M2 is not supported: gradients-only E5M2 needs forward "
            "tensors in E4M3; use Format.HYBRID"
        )
    if value not in allowed:
        fail(ValueError, owner, name, expected, value)


def check_backward_override(owner: str, value: Any, allowed=BACKWARD_OVERRIDES) -> None:
    if value in allowed:
        return
    if allowed == (None,):
        note = f"None ({owner} supports no backward override)"
    else:
        note = (
            " or ".join(repr(a) for a in allowed)
            + " (the default comes from TE_BACKWARD_OVERRIDE / NVTE_BACKWARD_OVERRIDE)"
        )
    fail(ValueError, owner, "backward_override", note, value)


# --------------------------------------------------------------------------------------------
# Environment defaults: TE reads NVTE_<NAME>; te also reads TE_<NAME>, which wins when both are
# set. Read when a recipe is constructed (TE reads them once, at import).
# --------------------------------------------------------------------------------------------
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _env_lookup(name: str) -> tuple[str | None, str | None]:
    for key in ("TE_" + name, "NVTE_" + name):
        if key in os.environ:
            return key, os.environ[key]
    return None, None


def env_flag(name: str) -> bool:
    """Boolean default from TE_<name> or NVTE_<name>; unset or empty means False."""
    key, raw = _env_lookup(name)
    if key is None:
        return False
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"environment variable {key}: expected 0 or 1, got {raw!r}")


def env_str(name: str, default: str | None) -> str | None:
    """String default from TE_<name> or NVTE_<name>; unset or empty means `default`."""
    key, raw = _env_lookup(name)
    if key is None or not raw.strip():
        return default
    return raw.strip()


# --------------------------------------------------------------------------------------------
# GEMM and quantization parameters (immutable, as in TE)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MMParams:
    """Options of one quantized GEMM (fprop, dgrad or wgrad).

    use_split_accumulator: promote partial sums to fp32 in the tensor core (cuBLASLt fast-accumulate
    off). Slower and more accurate; TE's default is on for dgrad/wgrad and off for fprop.
    """

    use_split_accumulator: bool = True

    def __post_init__(self) -> None:
        check_bool("MMParams", "use_split_accumulator", self.use_split_accumulator)


@dataclass(frozen=True)
class QParams:
    """How one tensor role (input, weight or gradient) is quantized.

    power_2_scale: round each scale down to a power of two (clear its fp32 mantissa).
    amax_epsilon: lower bound on amax before the scale is computed (same unit as the tensor).
    random_hadamard_transform: NVFP4 only; 16-point RHT on the column-wise copy.
    stochastic_rounding: NVFP4 only; stochastic rounding to E2M1.
    fp4_2d_quantization: NVFP4 only; one scale per 16x16 tile instead of per 1x16 block.
    """

    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "amax_epsilon":
                check_number("QParams", f.name, self.amax_epsilon)
            else:
                check_bool("QParams", f.name, getattr(self, f.name))


# --------------------------------------------------------------------------------------------
# Recipe base
# --------------------------------------------------------------------------------------------
class Recipe:
    """Base class of every recipe. Recipes are mutable dataclasses, as in TE.

    Every assignment after construction re-runs the recipe's checks (a handful of comparisons);
    an invalid assignment raises and leaves the recipe unchanged. Fields listed in `_DERIVED`
    (e.g. `fp8_quant_fwd_inp`) are computed from the other fields and recomputed when those change,
    unless the user has assigned them directly.

    Subclasses set `_KINDS`, which the class predicates (`delayed()`, `mxfp8()`, ...) test.
    """

    _KINDS: frozenset = frozenset()
    _DERIVED: tuple[str, ...] = ()

    # -- class predicates (TE names) -----------------------------------------------------------
    @classmethod
    def delayed(cls) -> bool:
        """Per-tensor delayed scaling (DelayedScaling)."""
        return "delayed" in cls._KINDS

    @classmethod
    def float8_current_scaling(cls) -> bool:
        """Per-tensor current scaling (Float8CurrentScaling)."""
        return "current" in cls._KINDS

    @classmethod
    def float8_per_tensor_scaling(cls) -> bool:
        """Either per-tensor FP8 recipe (DelayedScaling or Float8CurrentScaling)."""
        return bool({"delayed", "current"} & cls._KINDS)

    @classmethod
    def float8_block_scaling(cls) -> bool:
        """FP8 1x128 / 128x128 block scaling (Float8BlockScaling)."""
        return "block" in cls._KINDS

    @classmethod
    def mxfp8(cls) -> bool:
        """MXFP8 block scaling (MXFP8BlockScaling)."""
        return "mxfp8" in cls._KINDS

    @classmethod
    def nvfp4(cls) -> bool:
        """NVFP4 block scaling (NVFP4BlockScaling)."""
        return "nvfp4" in cls._KINDS

    @classmethod
    def custom(cls) -> bool:
        """User-provided quantizer factory (CustomRecipe)."""
        return "custom" in cls._KINDS

    # -- validation machinery ------------------------------------------------------------------
    def _derive(self) -> None:
        """Compute the `_DERIVED` fields the user has not assigned. Subclasses override."""

    def _validate(self) -> None:
        """Raise ValueError/TypeError naming the field. Subclasses override."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_overridden", frozenset())
        object.__setattr__(self, "_generation", 0)
        self._derive()
        self._validate()
        object.__setattr__(self, "_ready", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or not self.__dict__.get("_ready", False):
            object.__setattr__(self, name, value)
            return
        saved = dict(self.__dict__)
        object.__setattr__(self, name, value)
        try:
            if name in self._DERIVED:  # a frozenset, so copy.copy()'d recipes never share it
                object.__setattr__(self, "_overridden", self._overridden | {name})
            self._derive()
            self._validate()
        except Exception:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise
        # What modules built from this recipe compare (with its identity) to see it changed.
        object.__setattr__(self, "_generation", self._generation + 1)
