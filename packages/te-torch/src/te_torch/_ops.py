"""te's torch.library ops: what torch.compile / torch.export see.

Registered once, with ``torch.library.Library("te", "DEF")`` define + impl (CPU and CUDA kernels)
+ ``register_fake`` (shapes from te_core's op table). The kernels are _kernels' functions, the
same ones eager code calls directly: eager code does not go through the dispatcher
(DESIGN.md "The hot path"); only traced code calls ``torch.ops.te.*``.

Argument names avoid ``mode``: torch's auto_functionalized (mutable ops under torch.compile)
takes a ``mode`` argument of its own and fails on ops that have one.

Absent parts (a copy not requested) come back as empty [0] tensors, because an op returning
``Tensor?`` cannot be auto-functionalized; callers know statically which parts they asked for.
"""

from __future__ import annotations

import functools

import torch
from te_core import _C
from te_core._ops import ABSENT_SHAPE, quantize_outputs

from te_torch import _kernels
from te_torch._dtypes import TE_DTYPE

_lib = torch.library.Library("te", "DEF")  # noqa: TOR901 - one definition site per op

_lib.define(
    "quantize(Tensor x, Tensor(a!)? amax, Tensor(b!)? scale, int scaling_mode, ScalarType fp8_dtype, "
    "bool rowwise, bool columnwise, bool compute_scale, bool force_pow2_scales, "
    "float amax_epsilon) -> (Tensor, Tensor, Tensor, Tensor)"
)
_lib.define(
    "dequantize(Tensor? rowwise_data, Tensor? rowwise_scale_inv, Tensor? columnwise_data, "
    "Tensor? columnwise_scale_inv, int scaling_mode, SymInt[] shape, ScalarType dtype) -> Tensor"
)
_lib.define("transpose(Tensor x) -> Tensor")


@functools.lru_cache(maxsize=256)
def quant_config(compute_scale: bool, force_pow2_scales: bool, amax_epsilon: float) -> _C.QuantConfig:
    """A cached te_quant_config (configs are immutable once built; never mutate the result)."""
    return _C.QuantConfig(compute_scale, False, force_pow2_scales, amax_epsilon)


def _absent(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(ABSENT_SHAPE, dtype=dtype, device=device)


def _quantize_kernel(x, amax, scale, mode, fp8_dtype, rowwise, columnwise, compute_scale, pow2, eps):
    config = quant_config(compute_scale, pow2, eps)
    rd, rs, cd, cs = _kernels.quantize(x, amax, scale, mode, fp8_dtype, rowwise, columnwise, config)
    dev = x.device
    return (
        rd if rd is not None else _absent(fp8_dtype, dev),
        rs if rs is not None else _absent(torch.float32, dev),
        cd if cd is not None else _absent(fp8_dtype, dev),
        cs if cs is not None else _absent(torch.float32, dev),
    )


def _quantize_fake(x, amax, scale, mode, fp8_dtype, rowwise, columnwise, compute_scale, pow2, eps):
    # int() specializes symbolic sizes: block layouts are piecewise in the shape, and the op
    # table computes them from concrete shapes (te_quantized_shape).
    shape = tuple(int(d) for d in x.shape)
    specs = quantize_outputs(shape, mode, TE_DTYPE[fp8_dtype], rowwise, columnwise, False)
    dtypes = (fp8_dtype, torch.float32, fp8_dtype, torch.float32)
    return tuple(x.new_empty(s.shape, dtype=d) for s, d in zip(specs[:4], dtypes, strict=True))


def _dequantize_kernel(rd, rs, cd, cs, mode, shape, dtype):
    return _kernels.dequantize(rd, rs, cd, cs, mode, shape, dtype)


def _dequantize_fake(rd, rs, cd, cs, mode, shape, dtype):
    src = rd if rd is not None else cd
    return src.new_empty(shape, dtype=dtype)


def _transpose_fake(x):
    k = x.shape[-1] if x.dim() else 1
    m = x.numel() // k if x.dim() else 1
    return x.new_empty((k, m))


for _key in ("CPU", "CUDA"):
    _lib.impl("quantize", _quantize_kernel, _key)
    _lib.impl("dequantize", _dequantize_kernel, _key)
    _lib.impl("transpose", _kernels.transpose, _key)
torch.library.register_fake("te::quantize", _quantize_fake, lib=_lib)
torch.library.register_fake("te::dequantize", _dequantize_fake, lib=_lib)
torch.library.register_fake("te::transpose", _transpose_fake, lib=_lib)
