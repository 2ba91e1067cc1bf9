"""te-core's XLA FFI targets: registered with jax once, on import, and called through `call`.

The handlers are compiled into te_core._C (te-core's csrc/xla/) for both platforms and come out
of `_C.ffi_targets(platform)` as PyCapsules. The CUDA ones are registered unconditionally: jaxlib
keeps a registration for a platform whose plugin has not loaded (or is not installed) pending and
applies it when the plugin loads, so this import never initialises a backend to ask whether a GPU
is there, and a CUDA plugin loaded later still finds te's targets.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from te_core import _C, _ops
from te_core._ops import TensorSpec

from te_jax._dtypes import to_jnp

QUANTIZE = "te_quantize_ffi"
DEQUANTIZE = "te_dequantize_ffi"
AMAX = "te_amax_ffi"
TRANSPOSE = "te_transpose_ffi"
GEMM = "te_gemm_ffi"
GEMM_ACT = "te_gemm_act_ffi"
NORM_FWD = "te_norm_fwd_ffi"
NORM_BWD = "te_norm_bwd_ffi"
ACT_FWD = "te_act_fwd_ffi"
ACT_BWD = "te_act_bwd_ffi"
DBIAS_QUANTIZE = "te_dbias_quantize_ffi"
DELAYED_UPDATE = "te_delayed_update_ffi"

# (te_core's platform name, jax's platform name for register_ffi_target)
_PLATFORMS = (("cpu", "cpu"), ("cuda", "CUDA"))


def _register() -> None:
    try:
        tables = [(jax_name, _C.ffi_targets(te_name)) for te_name, jax_name in _PLATFORMS]
    except NotImplementedError as e:  # te-core built without jaxlib's FFI headers
        raise ImportError(f"te_jax cannot use this te-core: {e}") from e
    for jax_name, targets in tables:
        for name, capsule in targets.items():
            jax.ffi.register_ffi_target(name, capsule, platform=jax_name)


_register()


def _result_type(spec: TensorSpec) -> jax.ShapeDtypeStruct:
    # E2M1 data travels as the bytes te stores (two elements a byte): uint8 [..., K / 2]
    if spec.dtype == _ops.FLOAT4_E2M1:
        return jax.ShapeDtypeStruct(_ops.storage_shape(spec), np.uint8)
    return jax.ShapeDtypeStruct(tuple(spec.shape), to_jnp(spec.dtype))


def call(target: str, results: Sequence[TensorSpec], *operands, aliases=None, **attrs):
    """Calls te's FFI `target`; `results` come from te_core._ops, so shapes match te_torch's.

    Attributes must be numpy scalars of the handler's attribute types (np.int32, np.bool_,
    np.float32): a Python int would arrive as int64 and fail to decode. E2M1 (NVFP4) results
    come back as the bytes te stores, uint8 [..., K / 2].
    Batching (vmap) runs the op once per batch element: per-tensor scaling of a batch element
    must not see its neighbours.
    """
    result_types = [_result_type(s) for s in results]
    return jax.ffi.ffi_call(
        target,
        result_types,
        vmap_method="sequential",
        input_output_aliases=aliases,
    )(*operands, **attrs)
