"""``te.Fp8Padding`` / ``te.Fp8Unpadding``: each row group of a grouped input padded with zero
rows to a multiple of the recipe's alignment, and the padding taken off again (TE's modules, for
te.GroupedLinear's ``m_splits`` under recipes whose GEMMs need aligned rows).

The alignment (TE's): 32 under MXFP8BlockScaling, 128 under NVFP4BlockScaling, 16 under every
other recipe; without ``align_size`` it is read from the enclosing ``te.autocast``'s recipe, or
te.get_default_recipe()'s outside one.
"""

from __future__ import annotations

import torch

from te_torch import _autocast
from te_torch._availability import get_default_recipe
from te_torch._grouped_linear import check_m_splits
from te_torch._module_base import check_size

__all__ = ["Fp8Padding", "Fp8Unpadding", "align_size_for"]


def align_size_for(recipe) -> int:
    """Rows each group is padded to a multiple of under ``recipe`` (TE's rule)."""
    if recipe.mxfp8():
        return 32
    if recipe.nvfp4():
        return 128
    return 16


def _align(align_size: int | None) -> int:
    if align_size is not None:
        return align_size
    s = _autocast.STATE
    recipe = s.recipe if (s.fp8 or s.calibrating) and s.recipe is not None else get_default_recipe()
    return align_size_for(recipe)


def _padded(splits: list[int], align: int) -> list[int]:
    return [-(-m // align) * align for m in splits]


def _rows(owner: str, inp) -> torch.Tensor:
    """``inp`` [..., hidden] as [rows, hidden]."""
    if not isinstance(inp, torch.Tensor) or inp.dim() < 1:
        raise TypeError(f"{owner}: inp: expected a torch.Tensor [..., hidden], got {inp!r}")
    return inp.reshape(-1, inp.shape[-1])


class Fp8Padding(torch.nn.Module):
    """Pads each of ``num_gemms`` consecutive row groups of ``inp`` with zero rows up to a multiple
    of ``align_size`` (default: the recipe's, see the module docstring).

    forward(inp [..., hidden], m_splits) -> (out [sum(padded_m_splits), hidden], padded_m_splits):
    the input itself (leading dims flattened) when every group is already aligned. The padding's
    gradient is dropped.
    """

    def __init__(self, num_gemms: int, align_size: int | None = None) -> None:
        super().__init__()
        self.num_gemms = check_size("Fp8Padding", "num_gemms", num_gemms)
        self.align_size = None if align_size is None else check_size("Fp8Padding", "align_size", align_size)

    def forward(self, inp: torch.Tensor, m_splits) -> tuple[torch.Tensor, list[int]]:
        owner = "Fp8Padding"
        x = _rows(owner, inp)
        splits = check_m_splits(owner, m_splits, self.num_gemms, x.shape[0])
        align = _align(self.align_size)
        padded = _padded(splits, align)
        if padded == splits:
            return x, splits
        pieces = []
        for chunk, m, p in zip(torch.split(x, splits), splits, padded, strict=True):
            pieces.append(chunk)
            if p > m:
                pieces.append(x.new_zeros(p - m, x.shape[1]))
        return torch.cat(pieces), padded


class Fp8Unpadding(torch.nn.Module):
    """Takes Fp8Padding's zero rows off again: ``m_splits`` are the groups' unpadded sizes, each
    group of ``inp`` holding its size rounded up to ``align_size`` (default: the recipe's).

    forward(inp [sum(padded sizes), hidden], m_splits) -> out [sum(m_splits), hidden]; the
    padding rows get zero gradients.
    """

    def __init__(self, num_gemms: int, align_size: int | None = None) -> None:
        super().__init__()
        self.num_gemms = check_size("Fp8Unpadding", "num_gemms", num_gemms)
        self.align_size = None if align_size is None else check_size("Fp8Unpadding", "align_size", align_size)

    def forward(self, inp: torch.Tensor, m_splits) -> torch.Tensor:
        owner = "Fp8Unpadding"
        x = _rows(owner, inp)
        align = _align(self.align_size)
        splits = check_m_splits(owner, m_splits, self.num_gemms, None)
        padded = _padded(splits, align)
        if sum(padded) != x.shape[0]:
            raise ValueError(
                f"{owner}: inp has {x.shape[0]} rows, expected {sum(padded)}: m_splits {splits} each "
                f"padded to a multiple of {align} ({padded})"
            )
        if padded == splits:
            return x
        return torch.cat([c[:m] for c, m in zip(torch.split(x, padded), splits, strict=True)])
