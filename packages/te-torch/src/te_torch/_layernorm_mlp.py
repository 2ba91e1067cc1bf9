"""``te.LayerNormMLP``: norm -> FC1 -> activation -> FC2 (TE's module and names).

Outside ``te.autocast`` it runs te's norm and activation kernels with torch's F.linear in high
precision. Inside, te_torch._layernorm_mlp_fn.LayerNormMLPFn fuses each step's output with the
quantization the next GEMM needs (the norm writes FC1's FP8 input, the activation writes FC2's;
in backward the activation's gradient is FC1's quantized grad-output plus FC1's bias gradient).
Eagerly each direction is one fused call into te-core (_layernorm_mlp_step).
FC1 and FC2 each have their own recipe state (_gemm_state.GemmState), saved in ``_extra_state``
as ``{"fc1": ..., "fc2": ...}``.

Gated activations (``geglu``, ``reglu``, ``swiglu``, ``qgeglu``, ``sreglu``, ``glu``,
``clamped_swiglu``) double FC1's output: fc1_weight is [2 * ffn_hidden_size, hidden_size], its
first half feeds the activation and its second half is the linear gate (TE's layout, so TE
checkpoints keep their meaning).
"""

from __future__ import annotations

import torch
from te_core import _ops
from te_core._ops import ACTIVATIONS

from te_torch import _autocast, _layernorm_mlp_step
from te_torch._availability import default_device
from te_torch._fast_apply import raw_apply, wrapper_needed
from te_torch._gemm_state import GemmState, check_dims
from te_torch._high_precision import activation, linear, norm
from te_torch._layernorm_mlp_fn import LayerNormMLPFn
from te_torch._layernorm_mlp_recompute import LayerNormMLPRecomputeFn, recomputed_mlp
from te_torch._linear import linear_step
from te_torch._model_init import quantize_module_weights
from te_torch._module_base import (
    FLOAT_DTYPES,
    UNSUPPORTED_KWARGS,
    QuantizedModule,
    bad_input,
    check_eps,
    check_init_method,
    check_normalization,
    check_params_dtype,
    check_size,
    detached,
    init_weight,
    norm_module_outputs,
    parameter,
    register_norm_params,
    reject_kwargs,
    reset_norm_params,
    warn_if_recomputed,
)
from te_torch._tensor_parallel import (
    SplitModule,
    local_features,
    mark_norm_parallel,
    mark_parallel,
    rng_fork,
    split_module,
)
from te_torch._token_pad import pad, pad_count, unpad

__all__ = ["LayerNormMLP"]

_STATE = _autocast.STATE
_APPLY = raw_apply(LayerNormMLPFn)
_NAMES = ", ".join(repr(n) for n in ACTIVATIONS)


def activation_kind(owner: str, name) -> int:
    """TE's activation name -> te_activation."""
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ValueError(f"{owner}: activation: expected one of {_NAMES}, got {name!r}")
    return ACTIVATIONS[name]


class LayerNormMLP(QuantizedModule, SplitModule):
    """TE's ``LayerNormMLP``: ``y = act(norm(x) W1^T + b1) W2^T + b2`` for x [..., hidden_size].

    Args:
        hidden_size: input and output size; ffn_hidden_size: the activation's width.
        eps, normalization (``"LayerNorm"`` / ``"RMSNorm"``), zero_centered_gamma: the norm's,
            as ``te.LayerNormLinear`` (parameters ``layer_norm_weight``, ``layer_norm_bias``).
        activation: one of ``gelu`` (tanh approximation), ``relu``, ``silu``, ``qgelu``
            (x * sigmoid(1.702 x)), ``srelu`` (relu squared), and the gated ``geglu``, ``reglu``,
            ``swiglu``, ``qgeglu``, ``sreglu``, ``glu`` (sigmoid gate), ``clamped_swiglu``
            (GPT-OSS's, te/activation.h), whose FC1 is twice as wide.
        activation_params: ``clamped_swiglu``'s ``{"limit": 7.0, "alpha": 1.702,
            "glu_linear_offset": 1.0}`` (TE's names and defaults; any subset), None for the
            defaults; other activations take none.
        bias: FC1 and FC2 biases (``fc1_bias``, ``fc2_bias``; zeros). Weights ``fc1_weight``
            [(2 *) ffn_hidden_size, hidden_size] and ``fc2_weight`` [hidden_size,
            ffn_hidden_size] start from ``init_method`` / ``output_layer_init_method`` (default
            normal(0, 0.023), TE's).
        return_bias: return fc2_bias instead of adding it; return_layernorm_output: also return
            the norm's output (high precision). ``forward`` returns ``out``, then the bias, then
            the norm output (a tuple when more than one).
        fuse_wgrad_accumulation: both weight gradients go into ``fc*_weight.main_grad``, as in
            ``te.Linear``.
        params_dtype, device, name: as ``te.Linear``. seq_length / micro_batch_size (TE's
            userbuffer sizes) are accepted and unused.
        set_parallel_mode, tp_group, tp_size, sequence_parallel, get_rng_state_tracker,
        rng_tracker_name: TE's tensor parallelism (te_torch._tensor_parallel): FC1 split by
            columns (each rank's ``ffn_hidden_size / tp_size`` rows of ``fc1_weight`` and
            ``fc1_bias``; a gated activation's two halves each split so) and FC2 by rows (its
            columns of ``fc2_weight``; ``fc2_bias`` whole, added after the sum), as Megatron's
            MLP; ``sequence_parallel`` all-gathers the norm output and reduce-scatters the
            output along dim 0. Split, the norm, GEMMs and activation run as separate steps.
        checkpoint: selective recompute (te_torch._layernorm_mlp_recompute): FC1's output and
            the activation's are not kept for backward, which runs FC1 and the activation again
            (not FC2); the same outputs and gradients, bit for bit. Not with tensor parallelism.
    Userbuffers and delayed wgrad are not implemented yet (NotImplementedError).
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        eps: float = 1e-5,
        *,
        sequence_parallel: bool = False,
        return_bias: bool = False,
        get_rng_state_tracker=None,
        rng_tracker_name=None,
        tp_group=None,
        tp_size: int = 1,
        init_method=None,
        bias: bool = True,
        normalization: str = "LayerNorm",
        activation: str = "gelu",
        activation_params: dict | None = None,
        output_layer_init_method=None,
        fuse_wgrad_accumulation: bool = False,
        params_dtype: torch.dtype | None = None,
        return_layernorm_output: bool = False,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        set_parallel_mode: bool = False,
        zero_centered_gamma: bool = False,
        device=None,
        checkpoint: bool = False,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__()
        owner = "LayerNormMLP"
        accepted = (*UNSUPPORTED_KWARGS, "return_layernorm_output_gathered")
        reject_kwargs(owner, kwargs, accepted)
        if not isinstance(checkpoint, bool):
            raise TypeError(f"{owner}: checkpoint: expected a bool, got {type(checkpoint).__name__}")
        check_size(owner, "hidden_size", hidden_size)
        check_size(owner, "ffn_hidden_size", ffn_hidden_size)
        check_init_method(owner, "init_method", init_method)
        check_init_method(owner, "output_layer_init_method", output_layer_init_method)
        check_init_method(owner, "get_rng_state_tracker", get_rng_state_tracker)
        rng = (get_rng_state_tracker, rng_tracker_name)
        # FC1's split; FC2 is split by rows, and column_input / row_output share the group
        mode = "column" if set_parallel_mode else None
        mode, size = split_module(self, owner, tp_group, tp_size, mode, sequence_parallel, rng)
        self.set_parallel_mode = mode is not None
        if checkpoint and self._tp is not None:
            # the split path runs te.Linear's steps, which keep FC1's input only column-wise
            raise NotImplementedError(
                f"{owner}: checkpoint=True with tensor parallelism (set_parallel_mode=True, "
                f"tp_size={size}) is not implemented in te yet; use checkpoint=False, or "
                "te.checkpoint around the layer"
            )
        self.checkpoint = checkpoint
        ffn_local = ffn_hidden_size  # TE's size_per_partition
        if mode is not None:
            ffn_local = local_features(owner, "ffn_hidden_size", ffn_hidden_size, size, mode)
        self.eps = check_eps(owner, eps)
        self._rms = check_normalization(owner, normalization)
        self._kind = activation_kind(owner, activation)
        # (limit, alpha, glu_linear_offset) for clamped_swiglu, else None
        self._act_params = _ops.activation_params(
            activation, activation_params, f"{owner}: activation_params"
        )
        self.activation_params = activation_params
        params_dtype = check_params_dtype(owner, params_dtype)
        device = default_device() if device is None else torch.device(device)
        self.hidden_size, self.ffn_hidden_size, self.size_per_partition = (
            hidden_size,
            ffn_hidden_size,
            ffn_local,
        )
        self.normalization, self.activation = normalization, activation
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.return_layernorm_output = bool(return_layernorm_output)
        self.use_bias, self.return_bias = bool(bias), bool(return_bias)
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self.init_method, self.output_layer_init_method = init_method, output_layer_init_method
        self.params_dtype, self.name = params_dtype, name
        fc1_out = 2 * ffn_local if self._kind >= 100 else ffn_local

        def param(*shape):
            return torch.nn.Parameter(torch.empty(shape, dtype=params_dtype, device=device))

        register_norm_params(self, hidden_size, self._rms, params_dtype, device)
        self.fc1_weight = param(fc1_out, hidden_size)
        self.fc1_bias = param(fc1_out) if bias else None
        self.fc2_weight = param(hidden_size, ffn_local)
        self.fc2_bias = param(hidden_size) if bias else None
        self._features = (("hidden_size", hidden_size), ("ffn_hidden_size", ffn_local))
        self._fc1 = GemmState("te.LayerNormMLP", self._features)
        self._fc2 = GemmState("te.LayerNormMLP", self._features)
        self._gemms = {"fc1": self._fc1, "fc2": self._fc2}
        self.reset_parameters()
        quantize_module_weights(self, ("fc1_weight", "fc2_weight"), "LayerNormMLP", None)

    def reset_parameters(self, defer_init: bool = False) -> None:
        """Norm weight ones (zeros with zero_centered_gamma), norm bias zeros; FC weights from
        init_method / output_layer_init_method (default normal(0, 0.023)), FC biases zero."""
        if defer_init:
            return
        reset_norm_params(self)
        with rng_fork(*self._rng):
            init_weight(self.fc1_weight, self.init_method)
            init_weight(self.fc2_weight, self.output_layer_init_method)
        with torch.no_grad():
            for b in (self.fc1_bias, self.fc2_bias):
                if b is not None and b.device.type != "meta":
                    b.zero_()
        split, sp = self.set_parallel_mode, self.sequence_parallel
        fc1_bias, fc2_bias = ([b] if b is not None else [] for b in (self.fc1_bias, self.fc2_bias))
        mark_parallel([self.fc1_weight], fc1_bias, "column" if split else None, sp)
        mark_parallel([self.fc2_weight], fc2_bias, "row" if split else None, sp)
        mark_norm_parallel(self)
        self._fc1.ctx = self._fc2.ctx = None

    def _state_device(self) -> torch.device:
        return self.fc1_weight.device

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
            f"activation={self.activation}, normalization={self.normalization}, bias={self.use_bias}"
        )

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None):
        """The MLP of ``inp`` [..., hidden_size]; quantized inside te.autocast. See the class
        docstring. is_first_microbatch: as ``te.Linear``, for both weights."""
        try:  # free unless it raises: a 0-dim tensor or a non-tensor fails in shape[-1]
            if inp.shape[-1] != self.hidden_size or inp.dtype not in FLOAT_DTYPES:
                bad_input("LayerNormMLP", inp, self.hidden_size, "hidden_size")
        except (AttributeError, IndexError):
            bad_input("LayerNormMLP", inp, self.hidden_size, "hidden_size")
        if self._tp is not None:
            return self._forward_tp(inp, is_first_microbatch)
        ln_w, ln_b = parameter(self, "layer_norm_weight"), parameter(self, "layer_norm_bias")
        w1, b1 = parameter(self, "fc1_weight"), parameter(self, "fc1_bias")
        w2, b2 = parameter(self, "fc2_weight"), parameter(self, "fc2_bias")
        gemm_b2 = None if self.return_bias else b2
        fuse = self.fuse_wgrad_accumulation
        s = _STATE
        if s.fp8:
            c1 = self._fc1.ctx_for(s.recipe, s.group, w1.device)
            c2 = self._fc2.ctx_for(s.recipe, s.group, w1.device)
            if c1.delayed:
                _autocast.register_forward(c1.fwd_entry)
                _autocast.register_forward(c2.fwd_entry)
            elif c1.block:  # FC1's output width (ffn or 2 * ffn) follows from ffn_hidden_size
                check_dims("LayerNormMLP", c1.recipe, c1.block, inp, self._features)
            ret_ln = self.return_layernorm_output
            grad = torch.is_grad_enabled()
            recompute = grad and self.checkpoint  # op by op (te_torch._layernorm_mlp_recompute)
            direct = not grad and _layernorm_mlp_step.eager(c1, c2, ret_ln, inp)
            x = inp
            if not (grad or direct):
                x, ln_w, ln_b, w1, b1, w2, gemm_b2 = detached(inp, ln_w, ln_b, w1, b1, w2, gemm_b2)
            n_pad = 0 if c1.block else pad_count(inp, w1, w2, any_rows=c1.per_tensor)
            if n_pad and c1.per_tensor and not recompute:
                if _layernorm_mlp_step.runs(c1, c2, ret_ln, x, ln_w, ln_b, w1, b1):
                    n_pad = 0  # the fused step pads inside
            x = pad(x, n_pad) if n_pad else x
            cfg = (self._rms, self.eps, self.zero_centered_gamma, self._kind, ret_ln, self._act_params)
            if direct:  # _layernorm_mlp_step.forward's ctx None
                res = _layernorm_mlp_step.forward(
                    None, x, ln_w, ln_b, w1, b1, w2, gemm_b2, c1, c2, is_first_microbatch, False, cfg
                )
            elif recompute:
                args = (x, ln_w, ln_b, w1, b1, w2, gemm_b2, c1, c2, is_first_microbatch, fuse, cfg)
                res = LayerNormMLPRecomputeFn.apply(*args)
            else:
                apply = LayerNormMLPFn.apply if wrapper_needed() else _APPLY
                res = apply(x, ln_w, ln_b, w1, b1, w2, gemm_b2, c1, c2, is_first_microbatch, fuse, cfg)
            out, ln_out = res if self.return_layernorm_output else (res, None)
            if n_pad:
                out = unpad(out, inp.shape[:-1])
                ln_out = None if ln_out is None else unpad(ln_out, inp.shape[:-1])
        else:
            warn_if_recomputed("LayerNormMLP", self._fc1)
            ln_out = norm(inp, ln_w, ln_b, self._rms, self.eps, self.zero_centered_gamma)
            if s.calibrating:
                self._fc1.calibrate(ln_out, w1, s.recipe, s.group)
            if self.checkpoint and torch.is_grad_enabled():  # te_torch._layernorm_mlp_recompute
                act_fn = (self._kind, self._act_params)
                out, act = recomputed_mlp(ln_out, w1, b1, w2, gemm_b2, act_fn, fuse)
                if s.calibrating:
                    self._fc2.calibrate(act, w2, s.recipe, s.group)
            else:
                act = activation(linear(ln_out, w1, b1, fuse), self._kind, self._act_params)
                if s.calibrating:
                    self._fc2.calibrate(act, w2, s.recipe, s.group)
                out = linear(act, w2, gemm_b2, fuse)
        return norm_module_outputs(self, out, b2, ln_out)

    @torch.compiler.disable
    def _forward_tp(self, inp, first):
        """forward() split over the group: the norm on this rank's input, FC1's column
        collective and GEMM, the activation, FC2's GEMM and row collective (the bias after it)."""
        w1, b1 = parameter(self, "fc1_weight"), parameter(self, "fc1_bias")
        w2, b2 = parameter(self, "fc2_weight"), parameter(self, "fc2_bias")
        fuse, owner, features = self.fuse_wgrad_accumulation, "LayerNormMLP", self._features
        ln_w, ln_b = parameter(self, "layer_norm_weight"), parameter(self, "layer_norm_bias")
        ln_out = norm(inp, ln_w, ln_b, self._rms, self.eps, self.zero_centered_gamma)
        h = linear_step(owner, self._fc1, features, self._tp.column_input(ln_out), w1, b1, first, fuse)
        a = activation(h, self._kind, self._act_params)
        out = linear_step(owner, self._fc2, features, a, w2, None, first, fuse)
        out = self._tp.row_output(out, b2, self.return_bias)
        return norm_module_outputs(self, out, b2, ln_out)
