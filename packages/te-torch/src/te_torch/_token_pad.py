"""Any token count under per-tensor and block FP8: the rows padded to a multiple of 16.

cuBLASLt's FP8 GEMMs need every dimension a multiple of 16, and a layer's weight-gradient GEMM
reduces over its tokens (the input's leading dimensions flattened). TE refuses other token counts
("FP8 execution requires ... divisible by 16"), a standing complaint of its users with sequence
packing, sequence or context parallelism (../shared/TE_REFERENCE.md). te pads instead: the rows
go to the next multiple of 16 as copies of the last row, and the outputs are sliced back.

Exact, not approximate: a copied row leaves every amax the same (per tensor, and along each 1x128
block, row- or column-wise), so the real rows quantize to the same bytes; the output gradient of
the padding rows is zero, so they add nothing to the weight and bias gradients, and exactly zero
to the last row's input gradient (a LayerNorm backward of a zero gradient is zero). The price, only
for such counts: one copy of the input, one of the output gradient. Done on every device, so the
CPU backend runs what CUDA runs. MXFP8 / NVFP4 keep their own rule (_gemm_state.check_dims).
"""

from __future__ import annotations

import logging

import torch

ALIGN = 16
_told = False


def pad_count(inp: torch.Tensor) -> int:
    """How many rows pad ``inp``'s tokens to a multiple of ALIGN (0: none)."""
    k = inp.shape[-1]
    return -(inp.numel() // k) % ALIGN if k else 0


def pad(inp: torch.Tensor, count: int) -> torch.Tensor:
    """``inp`` as [rows + count, K]: its rows, then ``count`` copies of the last one."""
    global _told
    if not _told:
        _told = True
        logging.getLogger("te").info(
            "te: FP8 GEMMs need the token count (the input's leading dims flattened) to be a "
            "multiple of %d; padding with copies of the last token and slicing the outputs back "
            "(exact; one extra copy of the input and of the output gradient)",
            ALIGN,
        )
    x = inp.reshape(-1, inp.shape[-1])
    return torch.cat([x, x[-1:].expand(count, -1)])


def unpad(out: torch.Tensor, lead: torch.Size) -> torch.Tensor:
    """A padded output's first rows, back in the input's leading shape ``lead``."""
    rows = lead.numel()
    return out[:rows].reshape(*lead, out.shape[-1])
