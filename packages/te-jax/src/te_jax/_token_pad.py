"""Any token count under per-tensor and block FP8: each shard's rows padded to a multiple of 16.

cuBLASLt's FP8 GEMMs need every dimension a multiple of 16, and a layer's weight-gradient GEMM
reduces over its tokens (the rows of the [M, K] view), so TE refuses other token counts. te pads
instead, as te_torch does (te_torch/_token_pad.py has the argument that it is exact): the
forward appends copies of the last row to x, which change no amax (per tensor or along any
1x128 block: the copies share the last 16-row group with it) and give copies of the last row's
outputs, which are sliced off; the backward appends zero rows to dy, which add nothing to the
kernel and bias gradients and give zero input-gradient rows, also sliced off.

Inside a sharded op the padding is per shard: each device's wgrad reduces over its own rows
before the psum, so its local count is what must be a multiple of 16. Done on every platform,
so the CPU backend runs what CUDA runs. MXFP8 / NVFP4 keep their own rule
(_op_common.check_blocks); high precision needs none.
"""

from __future__ import annotations

import logging

import jax.numpy as jnp

from te_jax._op_common import FP8_RECIPE_OF_KIND
from te_jax._quantizer import Plan

ALIGN = 16
_told = False


def count(plan: Plan, rows: int, train: bool = True) -> int:
    """How many rows pad ``rows`` to a multiple of ALIGN under ``plan`` (0: none needed). Only
    the weight-gradient GEMMs reduce over the rows: an inference forward (``train`` False) under
    per-tensor scaling pads nothing, its GEMMs take any row count; cuBLASLt's 1x128 block-scaled
    GEMMs need a multiple of 4, so block scaling pads always (te_torch/_token_pad.py)."""
    if plan.x is None or plan.x.kind not in FP8_RECIPE_OF_KIND:
        return 0
    if not train and plan.x.kind != "block":
        return 0
    return -rows % ALIGN


def _say_once() -> None:
    global _told
    if not _told:
        _told = True
        logging.getLogger("te").info(
            "te_jax: FP8 GEMMs need each shard's token count (the input's leading dims "
            "flattened) to be a multiple of %d; padding with copies of the last token and "
            "slicing the outputs back (exact; one extra copy of the input and of the output "
            "gradient)",
            ALIGN,
        )


def pad_copies(plan: Plan, x2, train: bool = True):
    """(x2 [M, K] followed by copies of its last row up to a multiple of ALIGN, M); ``train``:
    as count's."""
    m = x2.shape[0]
    n = count(plan, m, train)
    if n == 0:
        return x2, m
    _say_once()
    return jnp.concatenate([x2, jnp.broadcast_to(x2[-1:], (n, x2.shape[1]))]), m


def pad_zeros(plan: Plan, g2):
    """(g2 [M, N] followed by zero rows up to a multiple of ALIGN, M): a padded op's gradient."""
    m = g2.shape[0]
    n = count(plan, m)
    if n == 0:
        return g2, m
    return jnp.pad(g2, ((0, n), (0, 0))), m
