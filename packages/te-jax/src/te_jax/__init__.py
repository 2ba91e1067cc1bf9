"""te for JAX: FP8 quantization, GEMMs and fused Transformer layers over te-core's XLA FFI
handlers, with Flax modules in ``te_jax.flax`` and TE's attention names (``SequenceDescriptor``,
the option enums) in ``te_jax.attention``.

The public API is what this file re-exports; every other module is private. Importing te_jax
registers te-core's FFI targets with jax once (te_jax._ffi) and imports neither torch nor flax.
"""

from __future__ import annotations

from te_core import recipe as recipe

from te_jax import _ffi  # noqa: F401  (registers the FFI targets)
from te_jax import attention as attention
from te_jax._activation import activation as activation
from te_jax._autocast import MeshResource as MeshResource
from te_jax._autocast import autocast as autocast
from te_jax._autocast import fp8_autocast as fp8_autocast
from te_jax._autocast import get_autocast_state as get_autocast_state
from te_jax._dense import dense as dense
from te_jax._gemm import gemm as gemm
from te_jax._layernorm_dense import layernorm_dense as layernorm_dense
from te_jax._layernorm_mlp import layernorm_mlp as layernorm_mlp
from te_jax._norm import layernorm as layernorm
from te_jax._quantize import quantize as quantize
from te_jax._recipe_state import init_recipe_state as init_recipe_state
from te_jax._recipe_state import update_collections as update_collections
from te_jax._scaled_tensor import ScaledTensor as ScaledTensor

__version__ = "0.1.0"


def __getattr__(name: str):
    # te_jax.flax needs flax, which te-jax does not require: imported on first use only
    if name == "flax":
        import importlib

        return importlib.import_module("te_jax.flax")
    raise AttributeError(f"module 'te_jax' has no attribute {name!r}")


__all__ = [
    "__version__",
    "recipe",
    "attention",
    "autocast",
    "fp8_autocast",
    "get_autocast_state",
    "MeshResource",
    "quantize",
    "gemm",
    "ScaledTensor",
    "dense",
    "layernorm",
    "activation",
    "layernorm_dense",
    "layernorm_mlp",
    "init_recipe_state",
    "update_collections",
]
