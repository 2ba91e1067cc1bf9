"""te_jax.flax's DenseGeneral, LayerNorm and LayerNormDenseGeneral: TE Flax's modules, names,
parameters and defaults, over te_jax.dense / layernorm / layernorm_dense.

Quantization comes from the enclosing te_jax.autocast region (read when the module is traced).
Parameters carry their logical axis names (nn.with_logical_partitioning), so a user's flax
logical axis rules give their shardings; the same rules (then te_jax's defaults from
autocast's MeshResource) tell the ops how their operands are split over the mesh.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from te_jax import _dense, _sharding
from te_jax._layernorm_dense import layernorm_dense
from te_jax._norm import layernorm
from te_jax.flax import _common

Initializer = Callable[..., Any]


def _batch_dim(transpose_batch_sequence: bool) -> int:
    return 1 if transpose_batch_sequence else 0


def _input_spec(axes, ndim: int, transpose_batch_sequence: bool, name: str):
    spec = _common.to_spec(axes, ndim, name)
    if spec is None:
        spec = _sharding.default_input_spec(ndim, _batch_dim(transpose_batch_sequence))
    return spec


def _not_supported(module, **flags):
    for name, value in flags.items():
        if value:
            raise NotImplementedError(
                f"{type(module).__name__}: {name}={value!r} is not supported by te_jax yet"
            )


class DenseGeneral(nn.Module):
    """y = x @ kernel (+ bias) over x's trailing ``axis`` dims, TE Flax's DenseGeneral.

    Attributes (TE's names and defaults):
      features: output size, an int or a tuple (the output's trailing dims).
      kernel_init: default variance_scaling(1.0, "fan_in", "truncated_normal").
      kernel_axes, bias_axes: logical axis names of ``kernel`` [*in, *features] and ``bias``
        [*features]; () leaves them unannotated (replicated).
      use_bias, bias_init: a ``bias`` parameter (zeros).
      axis: the contracted dims of x (trailing), default -1.
      dtype: the parameters' dtype (float32). Inputs keep theirs; so does the output.
      input_axes: x's logical axis names; () splits x's batch dim over autocast's MeshResource.
      transpose_batch_sequence: x is [sequence, batch, ...] (the batch dim is 1).
      enable_low_rank_adaptation, low_rank_adaptation_dim, low_rank_adaptation_alpha,
      quantization_checkpoint_name: accepted for TE compatibility; LoRA is not supported yet.
    """

    features: int | tuple[int, ...]
    kernel_init: Initializer | None = None
    kernel_axes: tuple[str, ...] = ()
    use_bias: bool = True
    bias_init: Initializer = nn.initializers.zeros
    bias_axes: tuple[str, ...] = ()
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    axis: int | tuple[int, ...] = -1
    dtype: Any = jnp.float32
    input_axes: tuple[str, ...] = ()
    transpose_batch_sequence: bool = False
    quantization_checkpoint_name: str | None = None

    @nn.compact
    def __call__(self, inputs):
        _not_supported(self, enable_low_rank_adaptation=self.enable_low_rank_adaptation)
        x = jnp.asarray(inputs)
        features = _common.check_size(self, "features", self.features)
        _common.check_param_dtype(self)
        axes = _common.canonical_axes(self.axis, x.ndim)
        _common.check_contracted(self, x.shape, axes)
        in_shape = tuple(x.shape[a] for a in axes)
        k, n = math.prod(in_shape), math.prod(features)
        kernel_init = self.kernel_init or _common.default_kernel_init()
        kernel = _common.param(
            self, "kernel", kernel_init, in_shape + features, self.dtype, self.kernel_axes, "kernel_axes"
        )
        bias = None
        if self.use_bias:
            bias = _common.param(
                self, "bias", self.bias_init, features, self.dtype, self.bias_axes, "bias_axes"
            )
        recipe, plan = _common.active_plan()
        state = _common.recipe_state(self, _dense.roles_of(plan), plan)
        if not plan.quantized:
            kernel = kernel.astype(x.dtype)

        lead = x.shape[: x.ndim - len(axes)]
        x_entries = _common.entries_of(
            _input_spec(self.input_axes, x.ndim, self.transpose_batch_sequence, "input_axes"), x.ndim
        )
        k_entries = _common.gathered(
            _common.entries_of(_common.to_spec(self.kernel_axes, kernel.ndim, "kernel_axes"), kernel.ndim),
            x_entries,
        )
        in_entry = _common.merge(x_entries[len(lead) :], "input_axes")
        k_in = _common.merge(k_entries[: len(in_shape)], "kernel_axes")
        k_out = _common.merge(k_entries[len(in_shape) :], "kernel_axes")
        has_spec = any(e is not None for e in x_entries + k_entries)
        y = _dense.dense(
            jnp.reshape(x, lead + (k,)),
            jnp.reshape(kernel, (k, n)),
            None if bias is None else jnp.reshape(bias, (n,)),
            recipe=recipe,
            recipe_state=state,
            input_spec=_sharding.P(*x_entries[: len(lead)], in_entry) if has_spec else None,
            kernel_spec=_sharding.P(k_in, k_out) if has_spec else None,
            rng=_common.sr_rng(self, plan),
        )
        return jnp.reshape(y, lead + features)


class LayerNorm(nn.Module):
    """LayerNorm or RMSNorm over the last dim, TE Flax's LayerNorm (te's norm kernels).

    Attributes: epsilon (1e-6), layernorm_type ("layernorm" | "rmsnorm"), zero_centered_gamma
    (the scale is applied as 1 + scale and initialised to 0), scale_init (ones, or zeros when
    zero-centered), scale_axes (("embed",)), bias_init (zeros), bias_axes (("embed",)), dtype
    (the parameters'), transpose_batch_sequence. Parameters: ``scale`` [H], ``ln_bias`` [H]
    (layernorm only).
    """

    epsilon: float = 1e-6
    layernorm_type: str = "layernorm"
    zero_centered_gamma: bool = False
    scale_init: Initializer | None = None
    scale_axes: tuple[str, ...] = ("embed",)
    bias_init: Initializer = nn.initializers.zeros
    bias_axes: tuple[str, ...] = ("embed",)
    dtype: Any = jnp.float32
    transpose_batch_sequence: bool = False

    @nn.compact
    def __call__(self, x):
        x = jnp.asarray(x)
        if x.ndim < 1:
            raise ValueError(f"LayerNorm: expected x of shape [..., H] (H normalized), got {tuple(x.shape)}")
        _common.check_param_dtype(self)
        scale, bias = _norm_params(
            self, x.shape[-1], self.scale_init, self.bias_init, self.scale_axes, self.bias_axes
        )
        return layernorm(
            x,
            scale,
            bias,
            epsilon=self.epsilon,
            zero_centered_gamma=self.zero_centered_gamma,
            layernorm_type=self.layernorm_type,
            input_spec=_sharding.default_input_spec(x.ndim, _batch_dim(self.transpose_batch_sequence)),
        )


def _norm_params(module, h: int, scale_init, bias_init, scale_axes, bias_axes, bias_name: str = "ln_bias"):
    if module.layernorm_type not in ("layernorm", "rmsnorm"):
        raise ValueError(f"layernorm_type: expected 'layernorm' or 'rmsnorm', got {module.layernorm_type!r}")
    if scale_init is None:
        scale_init = nn.initializers.zeros if module.zero_centered_gamma else nn.initializers.ones
    scale = _common.param(module, "scale", scale_init, (h,), module.dtype, scale_axes, "scale_axes")
    bias = None
    if module.layernorm_type == "layernorm":
        bias = _common.param(module, bias_name, bias_init, (h,), module.dtype, bias_axes, "bias_axes")
    return scale, bias


class LayerNormDenseGeneral(nn.Module):
    """LayerNorm/RMSNorm then DenseGeneral, fused (te's norm writes the GEMM's FP8 input),
    TE Flax's LayerNormDenseGeneral. Returns (y, ln_output): ln_output is the norm's output
    with ``return_layernorm_output``, else None.

    Attributes (TE's names and defaults): features; enable_layernorm (True); layernorm_type,
    epsilon (1e-6), zero_centered_gamma, scale_init, scale_axes (("embed",)), ln_bias_init,
    ln_bias_axes (("embed",)); kernel_init, kernel_axes (()), use_bias (False), bias_init,
    bias_axes (()); return_layernorm_output (False); axis (-1 only: the normalized dim is the
    contracted one); dtype; layernorm_input_axes (x's logical axes; None: the batch dim over
    MeshResource), dot_input_axes (accepted; the fused op keeps the norm's output where the
    norm made it); depth_scaling (None, or a factor applied to y); transpose_batch_sequence;
    LoRA options and quantization_checkpoint_name as in DenseGeneral.
    Parameters: scale, ln_bias (layernorm), kernel [H, *features], bias.
    """

    features: int | tuple[int, ...]
    enable_layernorm: bool = True
    layernorm_type: str = "layernorm"
    epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    scale_init: Initializer | None = None
    scale_axes: tuple[str, ...] = ("embed",)
    ln_bias_init: Initializer = nn.initializers.zeros
    ln_bias_axes: tuple[str, ...] = ("embed",)
    kernel_init: Initializer | None = None
    kernel_axes: tuple[str, ...] = ()
    use_bias: bool = False
    bias_init: Initializer = nn.initializers.zeros
    bias_axes: tuple[str, ...] = ()
    return_layernorm_output: bool = False
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    axis: int | tuple[int, ...] = -1
    dtype: Any = jnp.float32
    layernorm_input_axes: tuple[str, ...] | None = None
    dot_input_axes: tuple[str, ...] | None = None
    depth_scaling: float | None = None
    transpose_batch_sequence: bool = False
    quantization_checkpoint_name: str | None = None

    @nn.compact
    def __call__(self, inputs):
        _not_supported(self, enable_low_rank_adaptation=self.enable_low_rank_adaptation)
        x = jnp.asarray(inputs)
        if _common.canonical_axes(self.axis, x.ndim) != (x.ndim - 1,):
            raise ValueError(
                f"axis: expected -1 (the normalized dim is the contracted one), got {self.axis!r}"
            )
        _common.check_contracted(self, x.shape, (x.ndim - 1,))
        h = x.shape[-1]
        features = _common.check_size(self, "features", self.features)
        _common.check_param_dtype(self)
        if self.depth_scaling is not None and (
            isinstance(self.depth_scaling, bool) or not isinstance(self.depth_scaling, numbers.Real)
        ):
            raise TypeError(
                f"LayerNormDenseGeneral.depth_scaling: expected None or a float, got {self.depth_scaling!r}"
            )
        n = math.prod(features)
        scale = ln_bias = None
        if self.enable_layernorm:
            scale, ln_bias = _norm_params(
                self, h, self.scale_init, self.ln_bias_init, self.scale_axes, self.ln_bias_axes
            )
        kernel_init = self.kernel_init or _common.default_kernel_init()
        kernel = _common.param(
            self, "kernel", kernel_init, (h,) + features, self.dtype, self.kernel_axes, "kernel_axes"
        )
        bias = None
        if self.use_bias:
            bias = _common.param(
                self, "bias", self.bias_init, features, self.dtype, self.bias_axes, "bias_axes"
            )
        recipe, plan = _common.active_plan()
        state = _common.recipe_state(self, _dense.roles_of(plan), plan)
        if not plan.quantized:
            kernel = kernel.astype(x.dtype)
        x_spec = _input_spec(
            self.layernorm_input_axes, x.ndim, self.transpose_batch_sequence, "layernorm_input_axes"
        )
        k_entries = _common.gathered(
            _common.entries_of(_common.to_spec(self.kernel_axes, kernel.ndim, "kernel_axes"), kernel.ndim),
            _common.entries_of(x_spec, x.ndim),
        )
        k_spec = None
        if any(e is not None for e in k_entries):
            k_spec = _sharding.P(k_entries[0], _common.merge(k_entries[1:], "kernel_axes"))
        common = dict(
            recipe=recipe,
            recipe_state=state,
            input_spec=x_spec,
            kernel_spec=k_spec,
            rng=_common.sr_rng(self, plan),
        )
        k2 = jnp.reshape(kernel, (h, n))
        b2 = None if bias is None else jnp.reshape(bias, (n,))
        if not self.enable_layernorm:
            y = _dense.dense(x, k2, b2, **common)
            ln_out = x if self.return_layernorm_output else None
            return self._scaled(jnp.reshape(y, x.shape[:-1] + features)), ln_out
        y, ln_out = layernorm_dense(
            x,
            scale,
            ln_bias,
            k2,
            b2,
            layernorm_type=self.layernorm_type,
            epsilon=self.epsilon,
            zero_centered_gamma=self.zero_centered_gamma,
            return_layernorm_output=self.return_layernorm_output,
            **common,
        )
        return self._scaled(jnp.reshape(y, x.shape[:-1] + features)), ln_out

    def _scaled(self, y):
        return y if self.depth_scaling is None else y * jnp.asarray(self.depth_scaling, y.dtype)
