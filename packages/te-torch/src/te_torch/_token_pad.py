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

Only the weight-gradient GEMM reduces over the tokens: fprop and dgrad take them as their M, which
per-tensor FP8 GEMMs accept at any count. So under per-tensor scaling nothing is padded where no
weight gradient is computed: under torch.no_grad() (inference, decoding with any batch size) and
for frozen weights (adapters such as LoRA training beside a frozen FP8 base layer). cuBLASLt's
1x128 block-scaled GEMMs refuse an M that is not a multiple of 4 (measured on the H200, cuBLASLt
13.1: M 15, 17, 31 fail, 16 and 100 run), so Float8BlockScaling always pads.
"""

from __future__ import annotations

import logging

import torch

from te_torch._fast_apply import raw_apply, wrapper_needed

ALIGN = 16
_told = False


def pad_count(inp: torch.Tensor, *weights: torch.Tensor, any_rows: bool = False) -> int:
    """How many rows pad ``inp``'s tokens to a multiple of ALIGN for a module whose GEMMs use
    ``weights``: 0 when the count is one already, or, where the recipe's fprop and dgrad GEMMs
    take any token count (``any_rows``: per-tensor scaling), when no weight gradient is computed
    (grad mode off, or none of ``weights`` requires a gradient)."""
    k = inp.shape[-1]
    count = -(inp.numel() // k) % ALIGN if k else 0
    if count and any_rows and not (torch.is_grad_enabled() and any(w.requires_grad for w in weights)):
        return 0
    return count


def pad_rows(t: torch.Tensor, count: int, zeros: bool) -> torch.Tensor:
    """``t`` as [rows + count, last dim]: then ``count`` copies of its last row, or zero rows."""
    t2 = t.reshape(-1, t.shape[-1])
    tail = t2.new_zeros(count, t2.shape[1]) if zeros else t2[-1:].expand(count, -1)
    return torch.cat([t2, tail])


def step_pad(inp: torch.Tensor, per_tensor: bool, need_wgrad: bool) -> int:
    """How many rows a fused step that pads inside adds to ``inp``'s tokens: up to a multiple of
    ALIGN when a per-tensor weight gradient reduces over them, else 0. Called inside a Function's
    forward, where grad mode is off: ``need_wgrad`` decides (the modules detach their weights
    under no_grad)."""
    return -(inp.numel() // inp.shape[-1]) % ALIGN if per_tensor and need_wgrad and inp.shape[-1] else 0


def padded_source(inp: torch.Tensor, count: int) -> torch.Tensor:
    """A fused step's source: ``inp`` with ``count`` (step_pad's, non-zero) copies of its last row
    appended, logged once (say_once)."""
    say_once()
    return pad_rows(inp, count, False)


def say_once() -> None:
    """Logs, once per process, at INFO, that a token count is being padded."""
    global _told
    if not _told:
        _told = True
        logging.getLogger("te").info(
            "te: FP8 weight-gradient GEMMs need the token count (the input's leading dims "
            "flattened) to be a multiple of %d; padding with copies of the last token (exact; "
            "one extra copy of the input and of the output gradient)",
            ALIGN,
        )


def pad(inp: torch.Tensor, count: int) -> torch.Tensor:
    """``inp`` as [rows + count, K]: its rows, then ``count`` copies of the last one."""
    say_once()
    x2 = inp.reshape(-1, inp.shape[-1])
    if not torch.is_grad_enabled():  # nothing records a graph: the Function's apply is host time only
        return pad_rows(x2, count, False)
    return (PadRows.apply if wrapper_needed() else _PAD_APPLY)(x2, count)


class PadRows(torch.autograd.Function):
    """[M, K] -> [M + count, K], the last row copied ``count`` times; the gradient is the first M
    rows of the padded one. The padding rows' gradients are exactly zero (see the module
    docstring: their output gradient is zero), so dropping them is what adding them would give,
    without torch's own graph for cat / slice / expand: its backward allocated and zero-filled
    an input-sized gradient, copied into it, summed the copies' rows and added the two (four
    kernels and four autograd nodes on every step with such a count; on the H200 host a 16-token
    step's time more than doubled)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, count: int) -> torch.Tensor:
        ctx.rows = x.shape[0]
        return pad_rows(x, count, False)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad[: ctx.rows], None


_PAD_APPLY = raw_apply(PadRows)


def unpad(out: torch.Tensor, lead: torch.Size) -> torch.Tensor:
    """A padded output's first rows, back in the input's leading shape ``lead``."""
    rows = lead.numel()
    return out[:rows].reshape(*lead, out.shape[-1])
