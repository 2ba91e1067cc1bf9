"""The op table: what each te-core op takes and returns, described once for both bindings.

te_torch's fake kernels and output allocation, and te_jax's abstract evaluation and FFI result
types, all come from these functions, so the two bindings cannot disagree about a shape. Shapes
come from the C API itself (``te_quantized_shape``), the single source of the layouts.
Dtypes are te dtype ints (``te_core._C.DType``).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import NamedTuple

from te_core import _C

FLOAT32 = int(_C.DType.FLOAT32)
SOURCE_DTYPES = (int(_C.DType.FLOAT32), int(_C.DType.FLOAT16), int(_C.DType.BFLOAT16))
FP8_DTYPES = (int(_C.DType.FLOAT8_E4M3), int(_C.DType.FLOAT8_E5M2))
FLOAT4_E2M1 = int(_C.DType.FLOAT4_E2M1)

# The modes the bindings' quantize ops take today.
SCALING_MODES = {
    "per_tensor": int(_C.ScalingMode.PER_TENSOR),
    "block_1d": int(_C.ScalingMode.BLOCK_1D),
    "block_2d": int(_C.ScalingMode.BLOCK_2D),
}
# MXFP8 and NVFP4 (te/tensor.h): te-core quantizes, dequantizes and multiplies them; the functions
# below describe their outputs, ahead of the bindings' modules using them.
MX_SCALING_MODES = {
    "mxfp8_1d": int(_C.ScalingMode.MXFP8_1D),
    "nvfp4_1d": int(_C.ScalingMode.NVFP4_1D),
}
MXFP8 = MX_SCALING_MODES["mxfp8_1d"]
NVFP4 = MX_SCALING_MODES["nvfp4_1d"]

# The dtype of each mode's scale_inv tables.
SCALE_DTYPES = {
    **{mode: FLOAT32 for mode in SCALING_MODES.values()},
    MXFP8: int(_C.DType.FLOAT8_E8M0),
    NVFP4: int(_C.DType.FLOAT8_E4M3),
}
# NVFP4's amax holds each copy's global amax: [0] row-wise, [1] column-wise.
NVFP4_AMAX_SHAPE = (2,)


class TensorSpec(NamedTuple):
    shape: tuple[int, ...]
    dtype: int


ABSENT_SHAPE = (0,)

# The fixed output order of the quantize op; parts not requested come back with ABSENT_SHAPE.
QUANTIZE_OUTPUTS = (
    "rowwise_data",
    "rowwise_scale_inv",
    "columnwise_data",
    "columnwise_scale_inv",
    "amax",
    "scale",
)


@functools.lru_cache(maxsize=4096)
def quantize_outputs(
    shape: tuple[int, ...],
    scaling_mode: int,
    fp8_dtype: int,
    rowwise: bool,
    columnwise: bool,
    per_tensor_stats: bool,
) -> tuple[TensorSpec, ...]:
    """Output specs of quantizing a source of ``shape``, in QUANTIZE_OUTPUTS order.

    ``fp8_dtype`` is the data dtype (FLOAT4_E2M1 for NVFP4). Scales are fp32, E8M0 for MXFP8,
    E4M3 for NVFP4 (SCALE_DTYPES). ``per_tensor_stats``: whether the op returns an fp32 [1] amax
    and scale (current scaling); otherwise they are absent (delayed scaling updates the caller's
    own buffers in place, and block modes and MXFP8 have none). NVFP4 always returns its fp32 [2]
    amax (the global amaxes it encoded each copy with) and no scale.
    """
    scale_dtype = SCALE_DTYPES.get(scaling_mode, FLOAT32)

    def part(which: int, dtype: int, wanted: bool) -> TensorSpec:
        if not wanted:
            return TensorSpec(ABSENT_SHAPE, dtype)
        return TensorSpec(tuple(_C.quantized_shape(scaling_mode, which, shape)), dtype)

    stat = TensorSpec((1,) if per_tensor_stats else ABSENT_SHAPE, FLOAT32)
    amax = TensorSpec(NVFP4_AMAX_SHAPE, FLOAT32) if scaling_mode == NVFP4 else stat
    scale = TensorSpec(ABSENT_SHAPE, FLOAT32) if scaling_mode == NVFP4 else stat
    return (
        part(int(_C.Part.ROWWISE_DATA), fp8_dtype, rowwise),
        part(int(_C.Part.ROWWISE_SCALE_INV), scale_dtype, rowwise),
        part(int(_C.Part.COLUMNWISE_DATA), fp8_dtype, columnwise),
        part(int(_C.Part.COLUMNWISE_SCALE_INV), scale_dtype, columnwise),
        amax,
        scale,
    )


def storage_shape(spec: TensorSpec) -> tuple[int, ...]:
    """The shape of the bytes that hold ``spec``: its own, but an E2M1 tensor packs two elements
    per byte along its last dim (te/tensor.h), so [..., K] is stored as [..., K / 2] (K even)."""
    if spec.dtype != FLOAT4_E2M1 or spec.shape == ABSENT_SHAPE:
        return tuple(spec.shape)
    shape = tuple(spec.shape)
    if not shape or shape[-1] % 2:
        raise ValueError(
            f"shape: float4_e2m1 packs two elements per byte and each row must start on a byte, "
            f"so the last dim must be even, got {shape}"
        )
    return shape[:-1] + (shape[-1] // 2,)


def dequantize_output(source_shape: tuple[int, ...], out_dtype: int) -> TensorSpec:
    """The dequantize op returns the source's shape in ``out_dtype``."""
    return TensorSpec(tuple(source_shape), out_dtype)


def transpose_output(shape: tuple[int, ...], dtype: int) -> TensorSpec:
    """A [.., K] tensor viewed as [M, K] transposes to [K, M]."""
    cols = shape[-1] if shape else 1
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return TensorSpec((cols, rows), dtype)


GEMM_OUTPUTS = ("d", "aux", "bias_grad")


def gemm_dims(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], trans_a: bool, trans_b: bool
) -> tuple[int, int, int]:
    """(M, N, K) of D = op(A) op(B) for sources of these shapes (te/gemm.h: row-major; A is
    [M, K], or [K, M] with trans_a; B is [K, N], or [N, K] with trans_b; leading dims of an
    operand flatten into its rows)."""

    def matrix(shape: tuple[int, ...]) -> tuple[int, int]:
        cols = shape[-1] if shape else 1
        rows = 1
        for d in shape[:-1]:
            rows *= d
        return rows, cols

    a_rows, a_cols = matrix(a_shape)
    b_rows, b_cols = matrix(b_shape)
    m, k = (a_cols, a_rows) if trans_a else (a_rows, a_cols)
    n, k_b = (b_rows, b_cols) if trans_b else (b_cols, b_rows)
    if k != k_b:
        raise ValueError(
            f"gemm: op(A) is [{m}, {k}] but op(B) is [{k_b}, {n}]: the inner dimensions must match "
            f"(A {tuple(a_shape)}, trans_a={trans_a}; B {tuple(b_shape)}, trans_b={trans_b})"
        )
    return m, n, k


def gemm_outputs(
    m: int, n: int, out_dtype: int, aux: bool, bias_grad: bool, bias_grad_dtype: int
) -> tuple[TensorSpec, ...]:
    """Output specs of te_gemm in GEMM_OUTPUTS order: D [M, N] in ``out_dtype``; the GELU
    pre-activation ``aux`` [M, N] (same dtype) when asked; ``bias_grad`` [M] when asked. Absent
    ones have ABSENT_SHAPE."""
    return (
        TensorSpec((m, n), out_dtype),
        TensorSpec((m, n) if aux else ABSENT_SHAPE, out_dtype),
        TensorSpec((m,) if bias_grad else ABSENT_SHAPE, bias_grad_dtype),
    )


# The fused ops whose output is "high precision or FP8" (norm forward, activation forward and
# backward, dbias_quantize) return that output as the quantize op's six parts, in
# QUANTIZE_OUTPUTS order; high precision is rowwise_data alone in its dtype, the rest absent.
NORM_TYPES = {"layernorm": 0, "rmsnorm": 1}

# te_activation values (te/activation.h); gated kinds take [..., 2N] and give [..., N].
ACTIVATIONS = {
    "gelu": 0,
    "relu": 1,
    "silu": 2,
    "qgelu": 3,
    "srelu": 4,
    "geglu": 100,
    "reglu": 101,
    "swiglu": 102,
    "qgeglu": 103,
    "sreglu": 104,
    "glu": 105,
    "clamped_swiglu": 106,
}
# The parameterized kinds' parameters and defaults (te_activation_config; TE's LayerNormMLP
# activation_params), in te_core._C.ActivationConfig's order.
ACTIVATION_PARAMS = {"clamped_swiglu": {"limit": 7.0, "alpha": 1.702, "glu_linear_offset": 1.0}}


def activation_params(name: str, params, arg: str = "activation_params") -> tuple[float, ...] | None:
    """TE's ``activation_params`` for activation ``name`` as the tuple te_core._C.ActivationConfig
    takes (its defaults filled in), or None for a kind without parameters (then ``params`` must
    be None or empty). Raises TypeError / ValueError naming ``arg`` and the key."""
    if params is not None and not isinstance(params, dict):
        raise TypeError(f"{arg}: expected a dict or None, got {type(params).__name__}")
    defaults = ACTIVATION_PARAMS.get(name)
    if defaults is None:
        if params:
            raise ValueError(
                f"{arg}: activation={name!r} takes no parameters (only "
                f"{', '.join(repr(k) for k in ACTIVATION_PARAMS)} does), got {params!r}"
            )
        return None
    params = params or {}
    unknown = [k for k in params if k not in defaults]
    if unknown:
        raise ValueError(
            f"{arg}: unexpected key {unknown[0]!r} for activation={name!r}; expected some of "
            f"{', '.join(repr(k) for k in defaults)}"
        )
    values = []
    for key, default in defaults.items():
        v = params.get(key, default)
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{arg}[{key!r}]: expected a number, got {type(v).__name__}")
        v = float(v)
        if key == "limit" and not v > 0:
            raise ValueError(f"{arg}['limit']: expected a value > 0 (the clamp bound), got {v}")
        if key != "limit" and not math.isfinite(v):
            raise ValueError(f"{arg}[{key!r}]: expected a finite value, got {v}")
        values.append(v)
    return tuple(values)


def _rows(shape: tuple[int, ...]) -> int:
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows


def fused_output(
    shape: tuple[int, ...],
    out_dtype: int,
    scaling_mode: int | None,
    rowwise: bool = True,
    columnwise: bool = False,
    per_tensor_stats: bool = False,
) -> tuple[TensorSpec, ...]:
    """A fused op's output of source ``shape``: ``scaling_mode`` None is high precision in
    ``out_dtype`` (fp32/fp16/bf16); otherwise ``quantize_outputs`` with ``out_dtype`` the FP8
    dtype."""
    if scaling_mode is None:
        absent = TensorSpec(ABSENT_SHAPE, FLOAT32)
        return (TensorSpec(tuple(shape), out_dtype), absent, absent, absent, absent, absent)
    return quantize_outputs(tuple(shape), scaling_mode, out_dtype, rowwise, columnwise, per_tensor_stats)


def norm_fwd_outputs(
    shape: tuple[int, ...], norm_type: int, output: tuple[TensorSpec, ...]
) -> tuple[TensorSpec, ...]:
    """Norm forward: ``output`` (from fused_output) then mu [M] (layernorm; rmsnorm absent) and
    rsigma [M], fp32, M the rows of x [..., H]."""
    m = _rows(shape)
    mu = (m,) if norm_type == NORM_TYPES["layernorm"] else ABSENT_SHAPE
    return tuple(output) + (TensorSpec(mu, FLOAT32), TensorSpec((m,), FLOAT32))


def norm_bwd_outputs(
    x_shape: tuple[int, ...], norm_type: int, dx_dtype: int, gamma_dtype: int
) -> tuple[TensorSpec, ...]:
    """Norm backward: dx (x's shape), dgamma [H], dbeta [H] (layernorm; rmsnorm absent)."""
    h = x_shape[-1]
    dbeta = (h,) if norm_type == NORM_TYPES["layernorm"] else ABSENT_SHAPE
    return (
        TensorSpec(tuple(x_shape), dx_dtype),
        TensorSpec((h,), gamma_dtype),
        TensorSpec(dbeta, gamma_dtype),
    )


def activation_out_shape(x_shape: tuple[int, ...], activation: int) -> tuple[int, ...]:
    """act(x)'s shape: gated kinds (>= 100) halve the last dim ([..., 2N] -> [..., N])."""
    if activation >= 100:
        if not x_shape or x_shape[-1] % 2:
            raise ValueError(
                f"x: a gated activation expects an even last dim ([..., 2N]: activation input "
                f"then gate), got shape {tuple(x_shape)}"
            )
        return tuple(x_shape[:-1]) + (x_shape[-1] // 2,)
    return tuple(x_shape)


def dbias_output(x_shape: tuple[int, ...], dtype: int, wanted: bool) -> TensorSpec:
    """The column sums of x [..., K]: [K], or absent."""
    return TensorSpec((x_shape[-1],) if wanted else ABSENT_SHAPE, dtype)
