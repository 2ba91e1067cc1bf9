"""Transformer Engine's ``transformer_engine.pytorch.distributed`` names that te has:
``checkpoint`` (FP8-aware activation recomputation) and ``CudaRNGStatesTracker`` (Megatron's
named RNG states), also at the top level as ``te.checkpoint`` / ``te.CudaRNGStatesTracker``."""

from te_torch._checkpoint import checkpoint as checkpoint
from te_torch._rng_tracker import CudaRNGStatesTracker as CudaRNGStatesTracker

__all__ = ["CudaRNGStatesTracker", "checkpoint"]
