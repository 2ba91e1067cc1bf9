"""te_jax.flax.LayerNormMLP: TE Flax's LayerNormMLP over te_jax.layernorm_mlp (norm, fc1,
activation, intermediate dropout, fc2 in one custom_vjp, each quantization fused into the kernel
before it)."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from te_jax import _layernorm_mlp, _sharding
from te_jax._activation import activation_kind
from te_jax.flax import _common
from te_jax.flax._layers import _input_spec, _norm_params, _not_supported

Initializer = Callable[..., Any]


class LayerNormMLP(nn.Module):
    """norm -> fc1 -> activation(s) -> fc2, TE Flax's LayerNormMLP. Returns (y, ln_output):
    ln_output is the norm's output with ``return_layernorm_output``, else None.

    Attributes (TE's names and defaults):
      intermediate_dim: F (2048).
      enable_layernorm (True; False is not supported yet), layernorm_type ("layernorm" |
        "rmsnorm"), epsilon (1e-6), zero_centered_gamma, scale_init, scale_axes (("embed",)),
        ln_bias_init, ln_bias_axes (("embed",)).
      kernel_init: default variance_scaling(1.0, "fan_in", "truncated_normal"), drawn per
        activation slice of ``wi_kernel``.
      kernel_axes_1 (("embed", "act", "mlp")) and kernel_axes_2 (("mlp", "embed")): logical
        axes of ``wi_kernel`` [H, len(activations), F] and ``wo_kernel`` [F, H]; a rule mapping
        "mlp" to the tensor-parallel axis (te_jax's default under MeshResource(tp_resource=...))
        splits F: fc1 column-parallel, fc2 row-parallel.
      use_bias (False), bias_init, bias_axes_1 (("act", "mlp")) for ``wi_bias`` [A, F],
        bias_axes_2 (("embed",)) for ``wo_bias`` [H].
      return_layernorm_output (False).
      activations: TE's tuple, e.g. ("gelu",), ("gelu", "linear"), ("silu", "linear").
      intermediate_dropout_rate (0.0; in [0, 1)): dropout on the activations' output [..., F]
        before fc2, as TE's flax.linen.Dropout there: each element kept with probability
        1 - rate and scaled by 1 / (1 - rate), the mask drawn from
        ``make_rng(intermediate_dropout_rng_name)`` ('dropout'), one draw shared along the
        dims in intermediate_hidden_dropout_dims (()); off with ``deterministic=True``. It runs
        inside the fused op (the activation's output masked, then quantized for fc2), so the
        parameters and the fp8_metas state are the same with and without it.
      axis (-1), dtype (the parameters'), layernorm_input_axes (x's logical axes; None: the
        batch dim over MeshResource), dot_1_input_axes / dot_2_input_axes (accepted; the fused op
        keeps its intermediates where it made them), transpose_batch_sequence.
    """

    intermediate_dim: int = 2048
    enable_layernorm: bool = True
    layernorm_type: str = "layernorm"
    epsilon: float = 1e-6
    zero_centered_gamma: bool = False
    scale_init: Initializer | None = None
    scale_axes: tuple[str, ...] = ("embed",)
    ln_bias_init: Initializer = nn.initializers.zeros
    ln_bias_axes: tuple[str, ...] = ("embed",)
    kernel_init: Initializer | None = None
    kernel_axes_1: tuple[str, ...] = ("embed", "act", "mlp")
    kernel_axes_2: tuple[str, ...] = ("mlp", "embed")
    use_bias: bool = False
    bias_init: Initializer = nn.initializers.zeros
    bias_axes_1: tuple[str, ...] = ("act", "mlp")
    bias_axes_2: tuple[str, ...] = ("embed",)
    return_layernorm_output: bool = False
    activations: tuple[str, ...] = ("gelu",)
    intermediate_dropout_rng_name: str = "dropout"
    intermediate_dropout_rate: float = 0.0
    intermediate_hidden_dropout_dims: tuple[int, ...] = ()
    enable_low_rank_adaptation: bool = False
    low_rank_adaptation_dim: int = 32
    low_rank_adaptation_alpha: float | None = None
    axis: int | tuple[int, ...] = -1
    dtype: Any = jnp.float32
    layernorm_input_axes: tuple[str, ...] | None = None
    dot_1_input_axes: tuple[str, ...] | None = None
    dot_2_input_axes: tuple[str, ...] | None = None
    transpose_batch_sequence: bool = False
    quantization_checkpoint_name: str | None = None

    @nn.compact
    def __call__(self, inputs, deterministic: bool = False):
        _not_supported(
            self,
            enable_low_rank_adaptation=self.enable_low_rank_adaptation,
            enable_layernorm=not self.enable_layernorm,
        )
        x = jnp.asarray(inputs)
        rate, dims = self._dropout(x.ndim)
        if _common.canonical_axes(self.axis, x.ndim) != (x.ndim - 1,):
            raise ValueError(
                f"axis: expected -1 (the normalized dim is the contracted one), got {self.axis!r}"
            )
        activation_kind(self.activations, "LayerNormMLP.activations")
        acts = (self.activations,) if isinstance(self.activations, str) else tuple(self.activations)
        (f,) = _common.check_size(self, "intermediate_dim", self.intermediate_dim, allow_tuple=False)
        _common.check_param_dtype(self)
        h, a = x.shape[-1], len(acts)
        scale, ln_bias = _norm_params(
            self, h, self.scale_init, self.ln_bias_init, self.scale_axes, self.ln_bias_axes
        )
        kernel_init = self.kernel_init or _common.default_kernel_init()
        k1 = _common.param(
            self,
            "wi_kernel",
            _common.stacked_init(kernel_init, a),
            (h, a, f),
            self.dtype,
            self.kernel_axes_1,
            "kernel_axes_1",
        )
        k2 = _common.param(
            self, "wo_kernel", kernel_init, (f, h), self.dtype, self.kernel_axes_2, "kernel_axes_2"
        )
        b1 = b2 = None
        if self.use_bias:
            b1 = _common.param(
                self, "wi_bias", self.bias_init, (a, f), self.dtype, self.bias_axes_1, "bias_axes_1"
            )
            b2 = _common.param(
                self, "wo_bias", self.bias_init, (h,), self.dtype, self.bias_axes_2, "bias_axes_2"
            )
        recipe, plan = _common.active_plan()
        state = _common.recipe_state(self, _layernorm_mlp.roles_of(plan), plan)
        if not plan.quantized:
            k1, k2 = k1.astype(x.dtype), k2.astype(x.dtype)
        x_spec = _input_spec(
            self.layernorm_input_axes, x.ndim, self.transpose_batch_sequence, "layernorm_input_axes"
        )
        k1_entries = _common.entries_of(_common.to_spec(self.kernel_axes_1, 3, "kernel_axes_1"), 3)
        k1_entries = _common.gathered(k1_entries, _common.entries_of(x_spec, x.ndim))
        k1_spec = _sharding.P(*k1_entries) if any(e is not None for e in k1_entries) else None
        if deterministic:  # flax.linen.Dropout's: no mask, no key drawn
            rate = 0.0
        drop_rng = self.make_rng(self.intermediate_dropout_rng_name) if rate > 0.0 else None
        return _layernorm_mlp.layernorm_mlp(
            x,
            scale,
            ln_bias,
            k1,
            b1,
            k2,
            b2,
            activations=acts,
            layernorm_type=self.layernorm_type,
            epsilon=self.epsilon,
            zero_centered_gamma=self.zero_centered_gamma,
            return_layernorm_output=self.return_layernorm_output,
            recipe=recipe,
            recipe_state=state,
            input_spec=x_spec,
            kernel_1_spec=k1_spec,
            rng=_common.sr_rng(self, plan),
            dropout_rate=rate,
            dropout_rng=drop_rng,
            dropout_broadcast_dims=dims,
        )

    def _dropout(self, ndim: int) -> tuple[float, tuple[int, ...]]:
        """intermediate_dropout_rate and intermediate_hidden_dropout_dims, checked (also when
        deterministic, so a bad value fails at init)."""
        rate = self.intermediate_dropout_rate
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0.0 <= rate < 1.0:
            raise ValueError(
                f"LayerNormMLP.intermediate_dropout_rate: expected a float in [0, 1), got {rate!r}"
            )
        dims = self.intermediate_hidden_dropout_dims
        if isinstance(dims, str) or not isinstance(dims, Sequence) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and -ndim <= d < ndim for d in dims
        ):  # fmt: skip
            raise ValueError(
                f"LayerNormMLP.intermediate_hidden_dropout_dims: expected a tuple of dims of the "
                f"[..., intermediate_dim] activations ({ndim} dims; one draw shared along each), "
                f"got {dims!r}"
            )
        return float(rate), tuple(int(d) for d in dims)
