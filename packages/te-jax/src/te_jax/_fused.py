"""The FP8 side of te's fused ops (norm and activation forward, activation backward, dbias +
quantize): which output they write and how the six parts come back as a ScaledTensor.

A fused op's output is either high precision (``Fp8Out`` None: one array in the op's dtype) or
FP8 exactly as te_jax.quantize would quantize the fp32 result (te/normalization.h,
te/activation.h); the FFI handlers take te_quantize_ffi's attributes for it.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from te_core import _ops

from te_jax import _dtypes
from te_jax._scaled_tensor import ScaledTensor

_F32 = np.dtype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class Fp8Out:
    """How a fused op quantizes its output (static, hashable): current or block scaling
    compute their scales; ``delayed`` per-tensor scaling takes the caller's scale (an operand)."""

    dtype: np.dtype = np.dtype(jnp.float8_e4m3fn)
    scaling_mode: str = "per_tensor"
    rowwise: bool = True
    columnwise: bool = False
    force_pow2_scales: bool = False
    amax_epsilon: float = 0.0
    delayed: bool = False

    def __post_init__(self):
        object.__setattr__(self, "dtype", _dtypes.as_dtype(self.dtype, "dtype", _dtypes.FP8))
        if self.scaling_mode not in _ops.SCALING_MODES:
            raise ValueError(
                f"scaling_mode: expected one of {', '.join(map(repr, _ops.SCALING_MODES))}, "
                f"got {self.scaling_mode!r}"
            )
        if not (self.rowwise or self.columnwise):
            raise ValueError("rowwise, columnwise: expected at least one of them True")
        if self.delayed and self.scaling_mode != "per_tensor":
            raise ValueError(f"delayed: expected scaling_mode 'per_tensor', got {self.scaling_mode!r}")

    @property
    def mode(self) -> int:
        return _ops.SCALING_MODES[self.scaling_mode]

    @property
    def per_tensor(self) -> bool:
        return self.scaling_mode == "per_tensor"


def output_specs(shape, hp_dtype, fp8: Fp8Out | None):
    """The six output specs (te_core._ops.fused_output) of a source of ``shape``; a delayed
    output's scale is the caller's operand, so its result is [0]."""
    if fp8 is None:
        return _ops.fused_output(tuple(shape), _dtypes.to_te(hp_dtype), None)
    specs = _ops.fused_output(
        tuple(shape),
        _dtypes.to_te(fp8.dtype),
        fp8.mode,
        fp8.rowwise,
        fp8.columnwise,
        fp8.per_tensor,
    )
    return without_scale(specs) if fp8.delayed else specs


def without_scale(specs):
    """Quantize-order ``specs`` whose scale result (5) is absent: delayed scaling reads the
    scale operand where it is (aliasing it to a result made XLA copy it before the step)."""
    return (*specs[:5], _ops.TensorSpec(_ops.ABSENT_SHAPE, _ops.FLOAT32), *specs[6:])


def attrs(fp8: Fp8Out | None, with_quantized: bool = True) -> dict:
    """The handler attributes for the output: quantized, scaling_mode, ... (numpy scalars)."""
    a = {} if not with_quantized else {"quantized": np.bool_(fp8 is not None)}
    fp8_or_default = fp8 or Fp8Out()
    a.update(
        scaling_mode=np.int32(fp8_or_default.mode),
        rowwise=np.bool_(fp8_or_default.rowwise),
        columnwise=np.bool_(fp8_or_default.columnwise),
        compute_scale=np.bool_(not fp8_or_default.delayed),
        force_pow2_scales=np.bool_(fp8_or_default.force_pow2_scales),
        amax_epsilon=np.float32(fp8_or_default.amax_epsilon),
    )
    return a


def absent_stats():
    """The scale and amax operands of a computed-scale (current or block) output: [0]."""
    z = jnp.zeros(_ops.ABSENT_SHAPE, _F32)
    return z, z


def stat_operands(fp8: Fp8Out | None, scale):
    """(scale, amax) operands of an op: delayed scaling passes ``scale`` (fp32 [1]), read by the
    handler, and a [0] amax, so the handler writes amax(output) to a fresh result (no zeroed
    operand for XLA to copy in); otherwise [0] placeholders."""
    if fp8 is None or not fp8.delayed:
        if scale is not None:
            raise ValueError("scale: expected None unless the FP8 output is delayed-scaled")
        return absent_stats()
    if scale is None:
        raise ValueError("scale: expected the delayed scale (fp32 [1]) for a delayed-scaled output")
    return as_scale(scale), jnp.zeros(_ops.ABSENT_SHAPE, _F32)


def as_scale(scale):
    """A delayed scale as the handlers take it: fp32 [1]."""
    return jnp.reshape(scale.astype(_F32), (1,))


def assemble(parts, shape, hp_dtype, fp8: Fp8Out | None, scale=None):
    """The six parts as the op's output: the array itself (high precision) or a ScaledTensor
    (``scale``: the delayed scale it was quantized with, which the op does not return)."""
    rw_data, rw_sinv, cw_data, cw_sinv, amax, out_scale = parts
    if fp8 is None:
        return rw_data
    scale = as_scale(scale) if fp8.delayed else out_scale
    return ScaledTensor(
        data=rw_data if fp8.rowwise else None,
        scale_inv=rw_sinv if fp8.rowwise else None,
        columnwise_data=cw_data if fp8.columnwise else None,
        columnwise_scale_inv=cw_sinv if fp8.columnwise else None,
        amax=amax if fp8.per_tensor else None,
        scale=scale if fp8.per_tensor else None,
        scaling_mode=fp8.scaling_mode,
        fp8_dtype=fp8.dtype,
        shape=tuple(shape),
        dq_dtype=np.dtype(hp_dtype),
    )
