"""te for JAX: FP8 quantization, GEMMs, dense, norms and activations over te-core's XLA FFI handlers.

The public API is what this file re-exports; every other module is private. Importing te_jax
registers te-core's FFI targets with jax once (te_jax._ffi) and never imports torch.
"""

from __future__ import annotations

from te_core import recipe as recipe

from te_jax import _ffi  # noqa: F401  (registers the FFI targets)
from te_jax._activation import activation as activation
from te_jax._dense import dense as dense
from te_jax._gemm import gemm as gemm
from te_jax._norm import layernorm as layernorm
from te_jax._quantize import quantize as quantize
from te_jax._scaled_tensor import ScaledTensor as ScaledTensor

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "recipe",
    "quantize",
    "gemm",
    "ScaledTensor",
    "dense",
    "layernorm",
    "activation",
]
