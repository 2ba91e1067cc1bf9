"""te_jax.flax: Flax linen modules with TE Flax's names, parameters and defaults.

``DenseGeneral``, ``LayerNorm``, ``LayerNormDenseGeneral`` and ``LayerNormMLP`` run te's fused
kernels; inside ``te_jax.autocast(enabled=True, recipe=...)`` their GEMMs are quantized. Under
DelayedScaling they keep per-tensor scales and amax histories in the ``"fp8_metas"`` variable
collection (``FP8_COLLECTION_NAME``): initialise the model inside the autocast region, pass the
collection to ``apply`` with the params, and take its next value from ``jax.grad`` with respect
to it (``te_jax.update_collections``). Needs flax (``pip install te-jax[flax]``).
"""

from __future__ import annotations

from te_jax.flax._common import FP8_COLLECTION_NAME as FP8_COLLECTION_NAME
from te_jax.flax._layers import DenseGeneral as DenseGeneral
from te_jax.flax._layers import LayerNorm as LayerNorm
from te_jax.flax._layers import LayerNormDenseGeneral as LayerNormDenseGeneral
from te_jax.flax._mlp import LayerNormMLP as LayerNormMLP

__all__ = ["DenseGeneral", "LayerNorm", "LayerNormDenseGeneral", "LayerNormMLP", "FP8_COLLECTION_NAME"]
