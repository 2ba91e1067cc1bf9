"""Which recipes can run where, and the default recipe (TE's ``is_fp8_available`` & co.).

te has two backends. On a CUDA GPU a per-tensor or block FP8 recipe is available when the
silicon has the format (TE's checks, TE_REFERENCE.md §2.7). Without a usable GPU, te's CPU
backend emulates every recipe bit-exactly (slowly), so each reports available, with a reason
saying it is emulation.

MXFP8BlockScaling and NVFP4BlockScaling differ from TE here: TE offers them only where the GPU
has block-scaled MXFP8 / FP4 GEMMs (Blackwell, SM 10.x). te has no such native path on any GPU
yet; it quantizes with its own kernels (CPU or CUDA) and runs every GEMM of these formats by
dequantizing the operands to BF16 and calling the BF16 GEMM: the recipe's numerics exactly, at
BF16 speed plus the dequantization (te-core logs this once, at INFO, to the ``te`` logger). So
these functions answer True wherever te runs a BF16 GEMM (the CPU, CUDA compute capability
>= 8.0), and the reason says it is emulated.

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


@functools.cache
def _mx(fmt: str) -> tuple[bool, str]:
    how = (
        f"te quantizes {fmt} with its own kernels and runs each {fmt} GEMM by dequantizing the "
        "operands to BF16 (the recipe's numerics, at BF16 speed plus the dequantization)"
    )
    cc = _cuda_capability()
    if cc is None:
        return True, f"CPU emulation: no usable CUDA GPU; {how}"
    here = f"{cc[0]}.{cc[1]}"
    if cc < (8, 0):
        return False, f"{fmt} emulation needs BF16 GEMMs (compute capability >= 8.0); this GPU is {here}"
    if cc >= (10, 0):
        native = f"this GPU has native {fmt} GEMMs, which te does not use yet"
    else:
        native = f"native {fmt} GEMMs need Blackwell (compute capability 10.x)"
    # False on a GPU, as TE answers where its GEMM is not native: code that picks a recipe by
    # availability should not land on one slower than BF16. The recipe is still accepted.
    return False, (
        f"emulated on compute capability {here}: {native}; {how}; the recipe still runs, slower than BF16"
    )


def is_mxfp8_available(return_reason: bool = False):
    """Whether MXFP8BlockScaling runs natively here: False on every GPU for now (te's MXFP8 GEMM
    dequantizes its operands to BF16 on Hopper and Blackwell alike, slower than BF16; the recipe is
    still accepted, and the reason says so), True on the CPU, whose backend emulates every format.
    TE answers True only on Blackwell, where its GEMM is native."""
    return _answer(*_mx("MXFP8"), return_reason)


def is_nvfp4_available(return_reason: bool = False):
    """Whether NVFP4BlockScaling runs natively here: as ``is_mxfp8_available`` (False on every GPU
    for now, the recipe emulated but accepted; True on the CPU backend); TE answers True only on
    Blackwell."""
    return _answer(*_mx("NVFP4"), return_reason)


def get_default_recipe(return_reason: bool = False):
    """The recipe ``autocast(recipe=None)`` uses (a new object per call).

    - CUDA, compute capability 8.9 / 9.x: ``DelayedScaling()`` (TE's default there).
    - CUDA >= 10.0: ``Float8CurrentScaling()`` (TE picks MXFP8 on 10.x, where its GEMM is
      native; te runs MXFP8 only emulated, slower than a native per-tensor FP8 GEMM).
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
        r, why = (
            _recipe.Float8CurrentScaling(),
            "Blackwell: TE's default there is MXFP8BlockScaling, which te runs only emulated "
            "(no native block-scaled GEMM yet)",
        )
    return (r, why) if return_reason else r
