"""te_torch: te for PyTorch. ``import te_torch as te`` where TE code has
``import transformer_engine.pytorch as te``.

This slice provides TE's quantizers and quantized tensors:

- ``Float8Quantizer`` (delayed scaling), ``Float8CurrentScalingQuantizer`` (current scaling)
  -> ``Float8Tensor`` (FP8 data, optional transposed copy, one fp32 scale_inv);
- ``Float8BlockQuantizer`` (1x128 / 128x128 block scaling) -> ``Float8BlockwiseQTensor``;
- ``MXFP8Quantizer`` (1x32 blocks, E8M0 scales) -> ``MXFP8Tensor``; ``NVFP4Quantizer`` (E2M1 with
  1x16 E4M3 block scales and an fp32 global scale) -> ``NVFP4Tensor``;
- ``recipe``: te_core's recipes (``te.recipe.DelayedScaling``, ...);
- ``Linear``, ``LayerNormLinear``, ``LayerNormMLP`` and ``autocast`` (alias ``fp8_autocast``):
  TE's GEMM modules, quantized inside an autocast region with DelayedScaling,
  Float8CurrentScaling or Float8BlockScaling (the norm and activation kernels write the next
  GEMM's FP8 input directly), or MXFP8BlockScaling / NVFP4BlockScaling (emulated: te-core
  dequantizes the operands to BF16 for each GEMM, on CPU and on Hopper alike); the three split
  over a tensor-parallel group (``parallel_mode`` / ``set_parallel_mode``, ``tp_group``,
  ``sequence_parallel``);
- ``GroupedLinear``: ``num_gemms`` weights over consecutive row groups of one input (a
  mixture-of-experts layer's experts), each GEMM a te.Linear step with its own recipe state;
  ``Fp8Padding`` / ``Fp8Unpadding`` pad each group's rows to the recipe's alignment and back;
  ``moe_permute`` / ``moe_permute_with_probs`` / ``moe_unpermute`` group tokens by expert and
  merge them back, ``moe_permute_and_pad_with_probs`` also pads each expert's group to an aligned
  size, ``moe_sort_chunks_by_index`` (``_with_probs``) reorders chunks of rows (TE's MoE
  permutation helpers);
- ``make_graphed_callables``: modules (or models of them) captured as CUDA graphs, the FP8
  recipe and its scaling updates inside the graphs;
- ``CudaRNGStatesTracker``: Megatron's named RNG states (``get_rng_state_tracker``'s tracker);
  ``distributed``: TE's ``transformer_engine.pytorch.distributed`` names (``checkpoint``,
  ``CudaRNGStatesTracker``);
- ``checkpoint``: activation recomputation under the forward's FP8 state (torch's checkpoint
  recomputes te modules outside their te.autocast region);
- ``quantized_model_init`` (alias ``fp8_model_init``): modules built inside hold quantized
  weights only (train them with fp32 master weights; see its docstring);
- ``init_scaling_state``: a model's DelayedScaling state made before its first step, in the
  recipe's layout;
- ``LayerNorm``, ``RMSNorm``: TE's normalization modules over te's fused kernels;
- ``DotProductAttention``: TE's attention core (its layouts, masks, windows, biases, grouped
  heads and softmax variants) on torch's scaled_dot_product_attention, in high precision;
  ``RotaryPositionEmbedding`` / ``apply_rotary_pos_emb``: rotary position embedding;
  ``MultiheadAttention`` and ``TransformerLayer``: TE's attention block and Transformer layer
  built from te's modules, with TE's submodule and parameter names; ``InferenceParams``: TE's
  KV cache for generation (non-paged or paged; ``KVCacheManager`` the base of a custom one);
- ``is_fp8_available``, ``is_fp8_block_scaling_available``, ``is_mxfp8_available``,
  ``is_nvfp4_available``, ``get_default_recipe``;
- ``functional``: the GEMMs of a Linear layer on torch and quantized tensors
  (``te.functional.gemm``, ``gemm_dgrad``, ``gemm_wgrad``).

Everything not listed in ``__all__`` is private.
"""

import torch as _torch
from te_core import recipe as recipe

from te_torch import _blockwise_tensor, _float8_tensor, _mx_tensor
from te_torch import _ops as _ops  # registers torch.ops.te.*
from te_torch import distributed as distributed
from te_torch import functional as functional
from te_torch._autocast import autocast as autocast
from te_torch._autocast import fp8_autocast as fp8_autocast
from te_torch._availability import get_default_recipe as get_default_recipe
from te_torch._availability import is_fp8_available as is_fp8_available
from te_torch._availability import is_fp8_block_scaling_available as is_fp8_block_scaling_available
from te_torch._availability import is_mxfp8_available as is_mxfp8_available
from te_torch._availability import is_nvfp4_available as is_nvfp4_available
from te_torch._blockwise_tensor import Float8BlockwiseQTensor as Float8BlockwiseQTensor
from te_torch._checkpoint import checkpoint as checkpoint
from te_torch._dot_product_attention import DotProductAttention as DotProductAttention
from te_torch._float8_tensor import Float8Tensor as Float8Tensor
from te_torch._fp8_padding import Fp8Padding as Fp8Padding
from te_torch._fp8_padding import Fp8Unpadding as Fp8Unpadding
from te_torch._graphs import make_graphed_callables as make_graphed_callables
from te_torch._grouped_linear import GroupedLinear as GroupedLinear
from te_torch._inference import InferenceParams as InferenceParams
from te_torch._inference import KVCacheManager as KVCacheManager
from te_torch._layernorm_linear import LayerNormLinear as LayerNormLinear
from te_torch._layernorm_mlp import LayerNormMLP as LayerNormMLP
from te_torch._linear import Linear as Linear
from te_torch._model_init import fp8_model_init as fp8_model_init
from te_torch._model_init import quantized_model_init as quantized_model_init
from te_torch._moe_permute import moe_permute as moe_permute
from te_torch._moe_permute import moe_permute_and_pad_with_probs as moe_permute_and_pad_with_probs
from te_torch._moe_permute import moe_permute_with_probs as moe_permute_with_probs
from te_torch._moe_permute import moe_sort_chunks_by_index as moe_sort_chunks_by_index
from te_torch._moe_permute import moe_sort_chunks_by_index_with_probs as moe_sort_chunks_by_index_with_probs
from te_torch._moe_permute import moe_unpermute as moe_unpermute
from te_torch._multihead_attention import MultiheadAttention as MultiheadAttention
from te_torch._mx_quantizers import MXFP8Quantizer as MXFP8Quantizer
from te_torch._mx_quantizers import NVFP4Quantizer as NVFP4Quantizer
from te_torch._mx_tensor import MXFP8Tensor as MXFP8Tensor
from te_torch._mx_tensor import NVFP4Tensor as NVFP4Tensor
from te_torch._norm import LayerNorm as LayerNorm
from te_torch._norm import RMSNorm as RMSNorm
from te_torch._quantized_tensor import QuantizedTensor as QuantizedTensor
from te_torch._quantizers import Float8BlockQuantizer as Float8BlockQuantizer
from te_torch._quantizers import Float8CurrentScalingQuantizer as Float8CurrentScalingQuantizer
from te_torch._quantizers import Float8Quantizer as Float8Quantizer
from te_torch._quantizers import Quantizer as Quantizer
from te_torch._rng_tracker import CudaRNGStatesTracker as CudaRNGStatesTracker
from te_torch._rope import RotaryPositionEmbedding as RotaryPositionEmbedding
from te_torch._rope import apply_rotary_pos_emb as apply_rotary_pos_emb
from te_torch._scaling_state import init_scaling_state as init_scaling_state
from te_torch._transformer_layer import TransformerLayer as TransformerLayer
from te_torch._version import __version__ as __version__

__all__ = [
    "__version__",
    "recipe",
    "functional",
    "Quantizer",
    "Float8Quantizer",
    "Float8CurrentScalingQuantizer",
    "Float8BlockQuantizer",
    "MXFP8Quantizer",
    "NVFP4Quantizer",
    "QuantizedTensor",
    "Float8Tensor",
    "Float8BlockwiseQTensor",
    "MXFP8Tensor",
    "NVFP4Tensor",
    "Linear",
    "GroupedLinear",
    "Fp8Padding",
    "Fp8Unpadding",
    "moe_permute",
    "moe_permute_with_probs",
    "moe_permute_and_pad_with_probs",
    "moe_unpermute",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
    "LayerNormLinear",
    "LayerNormMLP",
    "LayerNorm",
    "RMSNorm",
    "DotProductAttention",
    "InferenceParams",
    "KVCacheManager",
    "MultiheadAttention",
    "TransformerLayer",
    "RotaryPositionEmbedding",
    "apply_rotary_pos_emb",
    "autocast",
    "fp8_autocast",
    "make_graphed_callables",
    "checkpoint",
    "CudaRNGStatesTracker",
    "distributed",
    "quantized_model_init",
    "fp8_model_init",
    "init_scaling_state",
    "is_fp8_available",
    "is_fp8_block_scaling_available",
    "is_mxfp8_available",
    "is_nvfp4_available",
    "get_default_recipe",
]

# torch.load(..., weights_only=True) may rebuild te's quantized tensors (quantized_model_init
# checkpoints): their pickles call these functions with plain tensors, dtypes and shapes only.
if hasattr(_torch.serialization, "add_safe_globals"):  # torch >= 2.4
    _torch.serialization.add_safe_globals(
        [
            _float8_tensor._rebuild_float8_tensor,
            _blockwise_tensor._rebuild_blockwise_tensor,
            _mx_tensor._rebuild_mxfp8_tensor,
            _mx_tensor._rebuild_nvfp4_tensor,
        ]
    )
