"""Which recipes can run where, and the default recipe (TE's ``is_fp8_available`` & co.).

te has two backends. On a CUDA GPU a recipe is available when the silicon has the format (TE's
checks, TE_REFERENCE.md §2.7). Without a usable GPU, te's CPU backend emulates every per-tensor
and block FP8 recipe bit-exactly (slowly), so those report available, with a reason saying it is
emulation. MXFP8 and NVFP4 are not available to te_torch's modules yet (te-core has them).

Every function takes ``return_reason`` (TE's keyword): with it, returns ``(bool, reason)``.
Answers are computed once per process (the hardware does not change).
"""

from __future__ import annotations

import functools

import torch
from te_core import recipe as _recipe

__all__ = [
    "is_fp8_available",
    "is_fp8_block_scaling_available",
    "is_mxfp8_available",
    "is_nvfp4_available",
    "get_default_recipe",
    "default_device",
]

_NO_MX = (
    "te_torch's modules do not run {} yet (te-core quantizes it and runs its GEMMs by block "
    "dequantization; the Blackwell-native path is not written); use Float8CurrentScaling, "
    "DelayedScaling or Float8BlockScaling"
)


@functools.cache
def _cuda_capability() -> tuple[int, int] | None:
    """Compute capability of the current CUDA device when te can run CUDA kernels, else None."""
    try:
        import te_core
        from te_core import _C
    except ImportError:
        return None
    if not (_C.BUILT_WITH_CUDA and te_core.cuda_available() and torch.cuda.is_available()):
        return None
    return torch.cuda.get_device_capability()


def default_device() -> torch.device:
    """Where te's modules put their parameters by default: CUDA when te can run on it, else CPU."""
    return torch.device("cuda") if _cuda_capability() is not None else torch.device("cpu")


def _answer(ok: bool, reason: str, return_reason: bool):
    return (ok, reason) if return_reason else ok


@functools.cache
def _fp8() -> tuple[bool, str]:
    cc = _cuda_capability()
    if cc is None:
        return True, "CPU emulation: no usable CUDA GPU, te's CPU backend runs FP8 recipes bit-exactly"
    if cc < (8, 9):
        return (
            False,
            f"FP8 needs compute capability >= 8.9 (Ada, Hopper, Blackwell); this GPU is {cc[0]}.{cc[1]}",
        )
    return True, ""


@functools.cache
def _block() -> tuple[bool, str]:
    cc = _cuda_capability()
    if cc is None:
        return True, "CPU emulation: no usable CUDA GPU, te's CPU backend runs block scaling bit-exactly"
    if cc < (9, 0):
        return False, f"FP8 block scaling needs compute capability >= 9.0; this GPU is {cc[0]}.{cc[1]}"
    cuda = tuple(int(p) for p in (torch.version.cuda or "0.0").split(".")[:2])
    if cuda < (12, 9):
        return False, f"FP8 block scaling needs CUDA >= 12.9; torch was built with {torch.version.cuda}"
    return True, ""


def is_fp8_available(return_reason: bool = False):
    """Whether DelayedScaling / Float8CurrentScaling run here (on CPU: emulated)."""
    return _answer(*_fp8(), return_reason)


def is_fp8_block_scaling_available(return_reason: bool = False):
    """Whether Float8BlockScaling runs here (on CPU: emulated)."""
    return _answer(*_block(), return_reason)


def is_mxfp8_available(return_reason: bool = False):
    """Always False for now: te_torch's modules do not run MXFP8 yet."""
    return _answer(False, _NO_MX.format("MXFP8"), return_reason)


def is_nvfp4_available(return_reason: bool = False):
    """Always False for now: te_torch's modules do not run NVFP4 yet."""
    return _answer(False, _NO_MX.format("NVFP4"), return_reason)


def get_default_recipe(return_reason: bool = False):
    """The recipe ``autocast(recipe=None)`` uses (a new object per call).

    - CUDA, compute capability 8.9 / 9.x: ``DelayedScaling()`` (TE's default there).
    - CUDA >= 10.0: ``Float8CurrentScaling()`` (TE picks MXFP8 on 10.x; te has no MXFP8 yet).
    - CPU (no usable GPU): ``Float8CurrentScaling()``: stateless (no first-step saturation while
      a history fills), every step's numbers depend on that step only, and it traces under
      torch.compile; the numerics a CPU emulation is most often asked to reproduce.
    """
    cc = _cuda_capability()
    if cc is None:
        r, why = _recipe.Float8CurrentScaling(), "CPU emulation default (stateless, compile-friendly)"
    elif cc < (10, 0):
        r, why = _recipe.DelayedScaling(), f"TE's default on compute capability {cc[0]}.{cc[1]}"
    else:
        r, why = _recipe.Float8CurrentScaling(), "Blackwell: TE's MXFP8 default is not implemented in te yet"
    return (r, why) if return_reason else r
