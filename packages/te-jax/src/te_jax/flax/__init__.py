"""te_jax.flax: Flax linen modules with TE Flax's names, parameters and defaults.

``DenseGeneral``, ``LayerNorm``, ``LayerNormDenseGeneral`` and ``LayerNormMLP`` run te's fused
kernels; inside ``te_jax.autocast(enabled=True, recipe=...)`` their GEMMs are quantized. Under
DelayedScaling they keep per-tensor scales and amax histories in the ``"fp8_metas"`` variable
collection (``FP8_COLLECTION_NAME``): initialise the model inside the autocast region, pass the
collection to ``apply`` with the params, and take its next value from ``jax.grad`` with respect
to it (``te_jax.update_collections``). Needs flax (``pip install te-jax[flax]``).

``DotProductAttention``, ``MultiHeadAttention`` and ``TransformerLayer`` (with
``TransformerLayerType`` and T5's ``RelativePositionBiases``) are built on those: their
projections and MLP are quantized like the modules above, while the attention core (QK^T,
mask, softmax, dropout, PV) runs in plain jax.numpy in high precision, as TE-JAX's unfused path.
``AttnMaskType``, ``AttnBiasType``, ``QKVLayout`` and ``AttnSoftmaxType`` hold TE's option
values; the modules take a member or its string. Packed sequences (the THD layouts) are
described by ``te_jax.attention.SequenceDescriptor``.
"""

from __future__ import annotations

from te_jax.flax._attention import AttnBiasType as AttnBiasType
from te_jax.flax._attention import AttnMaskType as AttnMaskType
from te_jax.flax._attention import AttnSoftmaxType as AttnSoftmaxType
from te_jax.flax._attention import DotProductAttention as DotProductAttention
from te_jax.flax._attention import MultiHeadAttention as MultiHeadAttention
from te_jax.flax._attention import QKVLayout as QKVLayout
from te_jax.flax._common import FP8_COLLECTION_NAME as FP8_COLLECTION_NAME
from te_jax.flax._layers import DenseGeneral as DenseGeneral
from te_jax.flax._layers import LayerNorm as LayerNorm
from te_jax.flax._layers import LayerNormDenseGeneral as LayerNormDenseGeneral
from te_jax.flax._mlp import LayerNormMLP as LayerNormMLP
from te_jax.flax._transformer import RelativePositionBiases as RelativePositionBiases
from te_jax.flax._transformer import TransformerLayer as TransformerLayer
from te_jax.flax._transformer import TransformerLayerType as TransformerLayerType

__all__ = [
    "DenseGeneral",
    "LayerNorm",
    "LayerNormDenseGeneral",
    "LayerNormMLP",
    "DotProductAttention",
    "MultiHeadAttention",
    "TransformerLayer",
    "TransformerLayerType",
    "RelativePositionBiases",
    "AttnMaskType",
    "AttnBiasType",
    "QKVLayout",
    "AttnSoftmaxType",
    "FP8_COLLECTION_NAME",
]
