"""Recipes as static plans: how each GEMM operand role is quantized (every format through
te-core's quantize and GEMM handlers), and the GEMM dispatch over quantized and high-precision
operands.

A dense layer has three quantized roles (NUMERICS.md): its input x and kernel in the forward
format, the output gradient dy in the backward format. Every GEMM reads both operands with the
reduction dim contiguous, so each operand comes in up to two copies: row-wise (scales/blocks
along the last dim of its [M, K] view) and column-wise (along the first dim):

    fprop  y  = x @ w     x row-wise,    w [K, N] column-wise
    dgrad  dx = dy @ w^T  dy row-wise,   w row-wise
    wgrad  dw = x^T @ dy  x column-wise, dy column-wise

Quantizing on a mesh: a per-tensor amax (NVFP4's global amaxes too) is max-reduced over the
axes the tensor is split on before the scale is taken from it, so every device uses the scale
the unsharded tensor would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from te_core import recipe as _recipe

from te_jax import _sharding
from te_jax._fused import Fp8Out
from te_jax._gemm import gemm
from te_jax._quantize import amax as _amax
from te_jax._quantize import quantize
from te_jax._scaled_tensor import ScaledTensor

E4M3 = np.dtype(jnp.float8_e4m3fn)
E5M2 = np.dtype(jnp.float8_e5m2)
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
_F32 = np.dtype(jnp.float32)
FLT_MAX = float(np.finfo(np.float32).max)
# the kinds te's fused norm / activation kernels can write their output in
_FUSABLE = ("current", "delayed", "block")
# the elements one scale covers along a block (MX: a tile's side with 2-D quantization)
MX_BLOCK = {"mxfp8": 32, "nvfp4": 16}


@dataclasses.dataclass(frozen=True)
class Quantizer:
    """How one tensor role is quantized (static, hashable).

    kind: "current" | "delayed" (per-tensor FP8), "block" (1x128 / 128x128 blocks), "mxfp8" |
      "nvfp4" (OCP MXFP8, NVFP4: te_gemm multiplies them by BF16 block dequantization).
    dtype: the FP8 element dtype (None for NVFP4's E2M1).
    scaling_mode: te-core's mode ("per_tensor", "block_1d", "block_2d", "mxfp8_1d", "nvfp4_1d").
    tile_2d: MX modes: one scale per square tile (32x32, 16x16), so both copies are equal.
    rht, stochastic_rounding: NVFP4: the column-wise copy's Hadamard transform; stochastic E2M1
      rounding (with the op's rng key).
    """

    kind: str
    dtype: np.dtype | None
    scaling_mode: str = "per_tensor"
    force_pow2_scales: bool = False
    amax_epsilon: float = 0.0
    tile_2d: bool = False
    rht: bool = False
    stochastic_rounding: bool = False

    @property
    def fusable(self) -> bool:
        """Whether te's fused norm / activation kernels can write their output in this format."""
        return self.kind in _FUSABLE

    @property
    def fp8_max(self) -> float:
        return FP8_MAX[self.dtype]

    def fp8_out(self, rowwise: bool, columnwise: bool) -> Fp8Out:
        return Fp8Out(
            self.dtype,
            self.scaling_mode,
            rowwise,
            columnwise,
            self.force_pow2_scales,
            self.amax_epsilon,
            delayed=self.kind == "delayed",
        )


@dataclasses.dataclass(frozen=True)
class DelayedParams:
    """DelayedScaling's update rule (NUMERICS.md), static."""

    margin: float
    amax_history_len: int
    amax_compute_algo: str | Callable
    scaling_factor_compute_algo: Callable | None
    recipe: object = dataclasses.field(compare=False, hash=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The quantizers of a dense layer's three roles (None: high precision) and its GEMMs'
    split accumulation; ``delayed`` when the roles keep DelayedScaling state."""

    x: Quantizer | None = None
    w: Quantizer | None = None
    grad: Quantizer | None = None
    split_fprop: bool | None = None
    split_dgrad: bool | None = None
    split_wgrad: bool | None = None
    delayed: DelayedParams | None = None

    @property
    def quantized(self) -> bool:
        return self.x is not None


_BLOCK_MODE = {1: "block_1d", 2: "block_2d"}


def _splits(recipe) -> dict[str, bool]:
    """A per-tensor recipe's split accumulation per GEMM (its fp8_gemm_* MMParams)."""
    return {
        f"split_{g}": bool(getattr(recipe, f"fp8_gemm_{g}").use_split_accumulator)
        for g in ("fprop", "dgrad", "wgrad")
    }


def plan_for(recipe) -> Plan:
    """The Plan of ``recipe`` (None: high precision); TypeError/NotImplementedError otherwise."""
    if recipe is None:
        return Plan()
    if not isinstance(recipe, _recipe.Recipe):
        raise TypeError(
            "recipe: expected None or a te_jax.recipe recipe (DelayedScaling, Float8CurrentScaling, "
            f"Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling), got {type(recipe).__name__}"
        )
    hybrid = getattr(recipe, "fp8_format", None) == _recipe.Format.HYBRID
    bwd = E5M2 if hybrid else E4M3
    if isinstance(recipe, _recipe.DelayedScaling):
        q = Quantizer("delayed", E4M3)
        return Plan(
            x=q,
            w=q,
            grad=dataclasses.replace(q, dtype=bwd),
            **_splits(recipe),
            delayed=DelayedParams(
                float(recipe.margin),
                int(recipe.amax_history_len),
                recipe.amax_compute_algo,
                recipe.scaling_factor_compute_algo,
                recipe,
            ),
        )
    if isinstance(recipe, (_recipe.Float8CurrentScaling, _recipe.Float8BlockScaling)):
        block = isinstance(recipe, _recipe.Float8BlockScaling)
        dims = (
            (recipe.x_block_scaling_dim, recipe.w_block_scaling_dim, recipe.grad_block_scaling_dim)
            if block
            else (None, None, None)
        )

        def role(dtype, dim, qp):
            return Quantizer(
                "block" if block else "current",
                dtype,
                _BLOCK_MODE[dim] if block else "per_tensor",
                bool(qp.power_2_scale),
                float(qp.amax_epsilon),
            )

        return Plan(
            x=role(E4M3, dims[0], recipe.fp8_quant_fwd_inp),
            w=role(E4M3, dims[1], recipe.fp8_quant_fwd_weight),
            grad=role(E4M3 if block else bwd, dims[2], recipe.fp8_quant_bwd_grad),
            **_splits(recipe),
        )
    if isinstance(recipe, _recipe.MXFP8BlockScaling):
        q = Quantizer("mxfp8", E4M3, "mxfp8_1d")
        w = dataclasses.replace(q, tile_2d=bool(recipe.enable_2d_quantization))
        return Plan(x=q, w=w, grad=dataclasses.replace(q, dtype=bwd))
    if isinstance(recipe, _recipe.NVFP4BlockScaling):
        q = Quantizer("nvfp4", None, "nvfp4_1d")
        return Plan(
            x=dataclasses.replace(q, rht=recipe.fp4_quant_fwd_inp.random_hadamard_transform),
            w=dataclasses.replace(q, tile_2d=bool(recipe.fp4_quant_fwd_weight.fp4_2d_quantization)),
            grad=dataclasses.replace(
                q,
                rht=recipe.fp4_quant_bwd_grad.random_hadamard_transform,
                stochastic_rounding=recipe.fp4_quant_bwd_grad.stochastic_rounding,
            ),
        )
    raise NotImplementedError(
        f"recipe: {type(recipe).__name__} is not supported by te_jax; use DelayedScaling, "
        "Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling or NVFP4BlockScaling"
    )


def scale_from_amax(amax, fp8_max: float, pow2: bool, eps: float):
    """Current scaling's scale (NUMERICS.md) from an fp32 [1] amax, in JAX: amax = max(amax,
    eps) (NaN stays NaN); 0, inf or NaN -> 1; else fp8_max / amax (inf -> FLT_MAX); pow2 rounds
    down to a power of two by clearing the mantissa bits."""
    a = jnp.where(jnp.isnan(amax), amax, jnp.maximum(amax, jnp.float32(eps)))
    ok = jnp.isfinite(a) & (a > 0)
    s = jnp.float32(fp8_max) / jnp.where(ok, a, jnp.float32(1.0))
    s = jnp.where(jnp.isinf(s), jnp.float32(FLT_MAX), s)
    s = jnp.where(ok, s, jnp.float32(1.0))
    if pow2:
        bits = jax.lax.bitcast_convert_type(s, jnp.uint32) & jnp.uint32(0xFF800000)
        s = jax.lax.bitcast_convert_type(bits, jnp.float32)
    return s


def quantize_operand(
    x,
    q: Quantizer | None,
    *,
    rowwise: bool,
    columnwise: bool,
    reduce_axes: tuple[str, ...] = (),
    scale=None,
    rng=None,
):
    """(operand, amax) of x [M, K] (per shard) for role ``q``.

    operand: x itself (q None) or a ScaledTensor. amax: the per-tensor amax of x max-reduced
    over ``reduce_axes`` for delayed scaling (the state's new entry), else None. ``scale``: the
    delayed scale (fp32 [1]); ``rng``: NVFP4's stochastic rounding key.
    """
    if q is None:
        return x, None
    if q.kind in MX_BLOCK:
        return _quantize_mx(x, q, rowwise, columnwise, reduce_axes, rng), None
    common = dict(dtype=q.dtype, rowwise=rowwise, columnwise=columnwise)
    if q.kind == "delayed":
        t = quantize(x, scale=scale, **common)
        return t, _sharding.pmax(t.amax, reduce_axes)
    if q.kind == "current" and reduce_axes:
        # the scale of the whole tensor: amax reduced across shards, then quantized with it
        a = _sharding.pmax(_amax(x), reduce_axes)
        s = scale_from_amax(a, q.fp8_max, q.force_pow2_scales, q.amax_epsilon)
        return quantize(x, scale=s, **common), None
    t = quantize(
        x,
        scaling_mode=q.scaling_mode,
        force_pow2_scales=q.force_pow2_scales,
        amax_epsilon=q.amax_epsilon,
        **common,
    )
    return t, None


def _quantize_mx(x, q: Quantizer, rowwise: bool, columnwise: bool, reduce_axes, rng) -> ScaledTensor:
    """An MXFP8 / NVFP4 operand through te_jax.quantize (te-core's kernels). On a mesh, NVFP4's
    global amaxes are those of the whole tensor, so sharded numbers are the unsharded ones;
    stochastic rounding uses ``rng`` as given (every shard draws from the same key)."""
    common = dict(
        scaling_mode=q.scaling_mode, rowwise=rowwise, columnwise=columnwise, with_2d_quantization=q.tile_2d
    )
    if q.kind == "mxfp8":  # scales per block of 32 alone: nothing to agree on across shards
        return quantize(x, dtype=q.dtype, **common)
    rht = q.rht and columnwise  # the transform is the column-wise (wgrad) copy's only
    if q.stochastic_rounding and rng is None:
        raise ValueError(
            "rng: NVFP4BlockScaling rounds gradients stochastically and needs a jax.random "
            "key (te_jax.flax modules take it from the 'sr_rng' stream: "
            "apply(..., rngs={'sr_rng': key})); or set disable_stochastic_rounding=True"
        )
    amax = None
    if reduce_axes:
        # each copy's global amax over the whole tensor: te's own amaxes of this shard, reduced.
        # A transformed copy's amax is taken after the transform, which te quantizes to find.
        a = _amax(x)
        if rht:
            t = quantize(x, scaling_mode=q.scaling_mode, rowwise=False, columnwise=True, columnwise_rht=True)
            a_col = t.amax[1:]
        else:
            a_col = a
        amax = _sharding.pmax(jnp.concatenate([a, a_col]), reduce_axes)
    return quantize(x, amax=amax, columnwise_rht=rht, rng=rng if q.stochastic_rounding else None, **common)


def keep(operand, *, rowwise: bool):
    """The operand with only its row-wise (or column-wise) copy, what a residual needs."""
    if isinstance(operand, ScaledTensor):
        if rowwise:
            return dataclasses.replace(operand, columnwise_data=None, columnwise_scale_inv=None)
        return dataclasses.replace(operand, data=None, scale_inv=None)
    return operand


def mm(a, b, *, trans_a: bool = False, trans_b: bool, out_dtype, bias=None, split=None):
    """op(a) op(b) (+ bias) for operands from quantize_operand (both of one kind)."""
    if isinstance(a, ScaledTensor):
        return gemm(
            a,
            b,
            bias=bias,
            trans_a=trans_a,
            trans_b=trans_b,
            out_dtype=out_dtype,
            use_split_accumulator=split,
        )
    return gemm(a, b, bias=bias, trans_a=trans_a, trans_b=trans_b).astype(out_dtype)


def bias_for(bias, dtype):
    """The bias in the output's dtype, as TE adds it and as the row-parallel path here does:
    cuBLASLt has no fused FP8 kernel for a float32 bias beside a 16-bit output, and te-core's
    fallback for one (the fp32 product, then a separate bias pass) cost te_torch's demo 4.8 ms of
    a 30 ms step on the H200 (benchmarks/NOTES.md). The bias gradient keeps the bias's dtype."""
    if bias is None or np.dtype(bias.dtype) == np.dtype(dtype):
        return bias
    return bias.astype(dtype)
