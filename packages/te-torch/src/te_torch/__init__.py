"""te_torch: te for PyTorch. ``import te_torch as te`` where TE code has
``import transformer_engine.pytorch as te``.

This slice provides TE's quantizers and quantized tensors:

- ``Float8Quantizer`` (delayed scaling), ``Float8CurrentScalingQuantizer`` (current scaling)
  -> ``Float8Tensor`` (FP8 data, optional transposed copy, one fp32 scale_inv);
- ``Float8BlockQuantizer`` (1x128 / 128x128 block scaling) -> ``Float8BlockwiseQTensor``;
- ``recipe``: te_core's recipes (``te.recipe.DelayedScaling``, ...);
- ``functional``: the GEMMs of a Linear layer on torch and quantized tensors
  (``te.functional.gemm``, ``gemm_dgrad``, ``gemm_wgrad``).

Everything not listed in ``__all__`` is private.
"""

from te_core import recipe as recipe

from te_torch import _ops as _ops  # registers torch.ops.te.*
from te_torch import functional as functional
from te_torch._blockwise_tensor import Float8BlockwiseQTensor as Float8BlockwiseQTensor
from te_torch._float8_tensor import Float8Tensor as Float8Tensor
from te_torch._quantized_tensor import QuantizedTensor as QuantizedTensor
from te_torch._quantizers import Float8BlockQuantizer as Float8BlockQuantizer
from te_torch._quantizers import Float8CurrentScalingQuantizer as Float8CurrentScalingQuantizer
from te_torch._quantizers import Float8Quantizer as Float8Quantizer
from te_torch._quantizers import Quantizer as Quantizer
from te_torch._version import __version__ as __version__

__all__ = [
    "__version__",
    "recipe",
    "functional",
    "Quantizer",
    "Float8Quantizer",
    "Float8CurrentScalingQuantizer",
    "Float8BlockQuantizer",
    "QuantizedTensor",
    "Float8Tensor",
    "Float8BlockwiseQTensor",
]
