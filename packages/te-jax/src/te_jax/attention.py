"""te_jax.attention: TE JAX's ``transformer_engine.jax.attention`` names that te_jax has, so
``from transformer_engine.jax.attention import SequenceDescriptor, QKVLayout`` becomes
``from te_jax.attention import ...``. Needs no flax; the Flax modules that take these are in
``te_jax.flax``.

``SequenceDescriptor`` says which tokens of each batch row are real and, for the THD layouts,
which packed sequence each belongs to; ``AttnMaskType``, ``AttnBiasType``, ``QKVLayout`` and
``AttnSoftmaxType`` hold TE's option values (the same classes as ``te_jax.flax``'s).
"""

from __future__ import annotations

from te_jax._attention import AttnBiasType as AttnBiasType
from te_jax._attention import AttnMaskType as AttnMaskType
from te_jax._attention import AttnSoftmaxType as AttnSoftmaxType
from te_jax._attention import QKVLayout as QKVLayout
from te_jax._attention import SequenceDescriptor as SequenceDescriptor

__all__ = ["SequenceDescriptor", "AttnMaskType", "AttnBiasType", "QKVLayout", "AttnSoftmaxType"]
