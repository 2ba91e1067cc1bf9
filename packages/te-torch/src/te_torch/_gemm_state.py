"""Per-GEMM recipe state of te's modules: quantizers, delayed-scaling state, extra_state.

Every quantized GEMM of a module (Linear's one, LayerNormMLP's fc1 and fc2) owns a ``GemmState``:

- ``FP8Context`` for the active recipe: the quantizers of its input, weight and grad-output
  (built once per recipe, in the four usages), of its output (``fp8_output``) and grad-input
  (``fp8_grad``), the split-accumulator flags of fprop / dgrad / wgrad, the update keys, and the
  cached quantized weight (``is_first_microbatch``); for MXFP8BlockScaling / NVFP4BlockScaling
  also the block length every GEMM dimension must be a multiple of (``block``, 32 / 16;
  ``check_dims``);
- under DelayedScaling, two ``DelayedState`` (NUMERICS.md; TE's layout): forward amax_history
  [L, 3] / scale [3] (input, weight, output) and backward [L, 2] / [2] (grad_output,
  grad_input), fp32, created on first use;
- its part of ``state_dict()``'s ``_extra_state``: a dict of plain tensors (``fwd_amax_history``,
  ``fwd_scale``, ``bwd_amax_history``, ``bwd_scale``; empty before any delayed-scaling step), so
  ``torch.load(..., weights_only=True)`` reads it.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from te_core.recipe import Format

from te_torch import _autocast
from te_torch._model_init import check_stored_weight
from te_torch._mx_quantizers import MXFP8Quantizer, NVFP4Quantizer
from te_torch._quantized_tensor import QuantizedTensor
from te_torch._quantizers import Float8BlockQuantizer, Float8CurrentScalingQuantizer, Float8Quantizer
from te_torch._recipe_state import DelayedState, recipe_key

_E4M3, _E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FWD_ROLES, BWD_ROLES = 3, 2  # input, weight, output / grad_output, grad_input
EXTRA_KEYS = ("fwd_amax_history", "fwd_scale", "bwd_amax_history", "bwd_scale")


def recipe_fields(recipe) -> tuple:
    """A recipe's class and field values: what an FP8Context is built from."""
    return (type(recipe), *(getattr(recipe, f.name) for f in dataclasses.fields(recipe)))


def _dtypes(fmt: Format) -> tuple[torch.dtype, torch.dtype]:
    return _E4M3, (_E5M2 if fmt == Format.HYBRID else _E4M3)


def _variants(q) -> tuple:
    """``q`` in the four (rowwise, columnwise) usages, indexed ``2 * row + col`` (0 unused)."""
    out = [None]
    for row, col in ((False, True), (True, False), (True, True)):
        v = q.copy()
        v.set_usage(rowwise=row, columnwise=col)
        out.append(v)
    return tuple(out)


def _one_d(q) -> bool:
    """Whether ``q``'s column-wise copy has blocks of its own that only the quantizer can make
    (1x128 blocks; MXFP8's 32x1 and NVFP4's 16x1 column blocks), not an exact transpose of the
    row-wise copy."""
    if isinstance(q, MXFP8Quantizer | NVFP4Quantizer):
        return not q.with_2d_quantization
    return isinstance(q, Float8BlockQuantizer) and q.block_scaling_dim == 1


def _reject_unimplemented(recipe, owner: str) -> None:
    """Recipe options te_torch does not implement: NotImplementedError naming them, rather than
    numerics that silently differ from what the recipe asks for."""
    name = type(recipe).__name__
    todo = []
    if getattr(recipe, "backward_override", None) is not None:
        todo.append(f"backward_override={recipe.backward_override!r}")
    if recipe.nvfp4():
        if recipe.row_scaled_activation:
            todo.append("row_scaled_activation=True")
        if recipe.nvfp4_4over6 != "none":
            todo.append(f"nvfp4_4over6={recipe.nvfp4_4over6!r}")
    if todo:
        raise NotImplementedError(
            f"{owner}: {name}: {', '.join(todo)} is not implemented in te yet; use the default "
            f"(backward_override=None, row_scaled_activation=False, nvfp4_4over6='none')"
        )


def _nvfp4_quantizers(recipe, owner: str) -> tuple:
    """(x, w, g, output, grad_input) NVFP4 quantizers from the recipe's QParams (output: the
    input's, grad_input: the gradient's, as TE's NVFP4 recipe state makes them; NUMERICS.md: RHT
    on the inputs' and gradients' column-wise copies, 16x16 tiles for weights, stochastic
    rounding of gradients)."""
    inp, wt, grad = recipe.fp4_quant_fwd_inp, recipe.fp4_quant_fwd_weight, recipe.fp4_quant_bwd_grad
    # te_gemm needs the transform on both operands of a contraction or on neither: wgrad pairs
    # x's and dy's column-wise copies, dgrad pairs W's column-wise copy with dy's row-wise one.
    if wt.random_hadamard_transform or inp.random_hadamard_transform != grad.random_hadamard_transform:
        raise ValueError(
            f"{owner}: NVFP4BlockScaling: the random Hadamard transform must be on "
            "fp4_quant_fwd_inp and fp4_quant_bwd_grad together (the wgrad GEMM's operands) and "
            "never on fp4_quant_fwd_weight, got "
            f"inp={inp.random_hadamard_transform}, weight={wt.random_hadamard_transform}, "
            f"grad={grad.random_hadamard_transform}"
        )

    def q(qp):
        return NVFP4Quantizer(
            with_rht=qp.random_hadamard_transform,
            with_2d_quantization=qp.fp4_2d_quantization,
            stochastic_rounding=qp.stochastic_rounding,
        )

    return q(inp), q(wt), q(grad), q(inp), q(grad)


def check_dims(owner: str, recipe, block: int, inp: torch.Tensor, features: tuple) -> None:
    """MXFP8 / NVFP4: every GEMM operand's two dimensions must be multiples of the block (32 /
    16), as TE requires (Blackwell's block-scaled GEMM reads whole blocks and their scale tiles):
    the input's rows (its leading dims flattened) and each named feature size in ``features``
    ((name, size) pairs). te-core itself would quantize edge blocks; the rule is the GEMM's."""
    name = type(recipe).__name__
    k = inp.shape[-1]
    rows = inp.numel() // k if k else 0
    if rows % block:
        lead = tuple(inp.shape[:-1])
        raise ValueError(
            f"{owner}: {name} quantizes every GEMM operand in blocks of {block} along both of its "
            f"dimensions, so the input's rows (the product of its leading dims {lead}) must be a "
            f"multiple of {block}, got {rows}; pad the tokens (e.g. the sequence) up to a multiple "
            f"of {block} ({-(-rows // block) * block} here), or run this layer under a recipe "
            "without the rule (Float8CurrentScaling, DelayedScaling)"
        )
    for what, n in features:
        if n % block:
            raise ValueError(
                f"{owner}: {name} quantizes every GEMM operand in blocks of {block} along both of "
                f"its dimensions, so {what} must be a multiple of {block}, got {n}; build the layer "
                f"with {what} a multiple of {block}, or run it under a recipe without the rule "
                "(Float8CurrentScaling, DelayedScaling)"
            )


def check_fp8_features(owner: str, recipe, features: tuple) -> None:
    """Per-tensor and block FP8: each of a GEMM's fixed dimensions (``features``, (name, size)
    pairs) must be a multiple of 16, as cuBLASLt's FP8 GEMMs need (TE has the same rule); checked
    on every device, so a layer that trains on the CPU backend runs on the GPU too. Token counts
    are padded instead (_token_pad); MXFP8 / NVFP4 have check_dims."""
    if not (recipe.float8_per_tensor_scaling() or recipe.float8_block_scaling()):
        return
    for what, n in features:
        if n % 16:
            raise ValueError(
                f"{owner}: {type(recipe).__name__} runs the layer's GEMMs in FP8, whose cuBLASLt "
                f"kernels need every dimension a multiple of 16, and {what} is {n}; build the layer "
                f"with {what} a multiple of 16 ({-(-n // 16) * 16} here), or run it outside "
                "te.autocast (high precision)"
            )


def _splits(recipe) -> tuple[bool, bool, bool]:
    return (
        recipe.fp8_gemm_fprop.use_split_accumulator,
        recipe.fp8_gemm_dgrad.use_split_accumulator,
        recipe.fp8_gemm_wgrad.use_split_accumulator,
    )


class FP8Context:
    """What one GEMM's quantized call reuses for one recipe: quantizers (built once), the GEMMs'
    split-accumulator flags, the delayed-scaling states and their update keys, and the cached
    quantized weight (``is_first_microbatch``). ``owner`` names the module in errors.

    ``x_q``, ``w_q``, ``g_q``, ``o_q``, ``gi_q``: the input, weight, grad-output, output and
    grad-input quantizers, each in the four usages (``_variants``). Output and grad-input use the
    forward and backward formats of the recipe (HYBRID: E4M3 / E5M2) and, under DelayedScaling,
    the forward slot 2 ("output") and backward slot 1 ("grad_input") of the module's state;
    under current scaling the settings of the input / grad-output quantizers (they are the next
    GEMM's input / the previous GEMM's grad-output); under block scaling those too (1x128
    blocks by default), and under MXFP8BlockScaling the input's / grad-output's (1x32 / 32x1
    blocks, never 32x32 tiles), and under NVFP4BlockScaling the input's / grad-output's QParams
    (1x16 blocks; the Hadamard transform on the column-wise copy and stochastic rounding of
    gradients as the recipe sets them)."""

    __slots__ = (
        "recipe",
        "delayed",
        "x_q",
        "w_q",
        "g_q",
        "o_q",
        "gi_q",
        "split",
        "fwd",
        "bwd",
        "fwd_key",
        "bwd_key",
        "fwd_entry",
        "bwd_entry",
        "weight_cache",
        "weight_operand_cache",
        "packed_ok",
        "device",
        "owner",
        "block",
        "group",
        "generation",
        "fields",
        "per_tensor",
        "plans",
    )

    def __init__(
        self,
        recipe,
        device: torch.device,
        fwd: DelayedState | None,
        bwd: DelayedState | None,
        group,
        owner: str = "te.Linear",
    ) -> None:
        self.recipe, self.device, self.fwd, self.bwd = recipe, device, fwd, bwd
        self.owner, self.group = owner, group
        self.generation, self.fields = recipe._generation, recipe_fields(recipe)
        self.delayed = recipe.delayed()
        self.per_tensor = self.delayed or recipe.float8_current_scaling()
        self.weight_cache = self.weight_operand_cache = None
        self.plans = {}  # the fused eager steps' StepPlan / LnLinearPlan / MlpPlan, by kind of call
        self.fwd_key = self.bwd_key = self.fwd_entry = self.bwd_entry = None
        self.block = 0
        _reject_unimplemented(recipe, owner)
        if self.delayed:
            fdt, bdt = _dtypes(recipe.fp8_format)
            x = Float8Quantizer(fwd.scale_of(0), fwd.amax(0), fdt)
            w = Float8Quantizer(fwd.scale_of(1), fwd.amax(1), fdt)
            g = Float8Quantizer(bwd.scale_of(0), bwd.amax(0), bdt)
            o = Float8Quantizer(fwd.scale_of(2), fwd.amax(2), fdt)
            gi = Float8Quantizer(bwd.scale_of(1), bwd.amax(1), bdt)
            self.fwd_key = recipe_key(recipe, False, group, device)
            self.bwd_key = recipe_key(recipe, True, group, device)
            # the registrations te_torch._autocast queues: the same objects every step, which
            # the update's cached plan is found by
            self.fwd_entry = (self.fwd_key, recipe, fwd)
            self.bwd_entry = (self.bwd_key, recipe, bwd)
            self.split = _splits(recipe)
        elif recipe.float8_current_scaling():
            fdt, bdt = _dtypes(recipe.fp8_format)

            def cs(dtype, qp):
                return Float8CurrentScalingQuantizer(
                    dtype, device, force_pow_2_scales=qp.power_2_scale, amax_epsilon=qp.amax_epsilon
                )

            x, w = cs(fdt, recipe.fp8_quant_fwd_inp), cs(fdt, recipe.fp8_quant_fwd_weight)
            g = cs(bdt, recipe.fp8_quant_bwd_grad)
            o, gi = cs(fdt, recipe.fp8_quant_fwd_inp), cs(bdt, recipe.fp8_quant_bwd_grad)
            self.split = _splits(recipe)
        elif recipe.float8_block_scaling():

            def bq(dim, qp):
                return Float8BlockQuantizer(
                    _E4M3,
                    block_scaling_dim=dim,
                    force_pow_2_scales=qp.power_2_scale,
                    amax_epsilon=qp.amax_epsilon,
                )

            x = bq(recipe.x_block_scaling_dim, recipe.fp8_quant_fwd_inp)
            w = bq(recipe.w_block_scaling_dim, recipe.fp8_quant_fwd_weight)
            g = bq(recipe.grad_block_scaling_dim, recipe.fp8_quant_bwd_grad)
            o = bq(recipe.x_block_scaling_dim, recipe.fp8_quant_fwd_inp)
            gi = bq(recipe.grad_block_scaling_dim, recipe.fp8_quant_bwd_grad)
            self.split = _splits(recipe)
        elif recipe.mxfp8():
            # fp8_format E4M3 (TE's MXFP8 default): every role E4M3; HYBRID: gradients E5M2.
            fdt, bdt = _dtypes(recipe.fp8_format)
            x = MXFP8Quantizer(fdt)
            w = MXFP8Quantizer(fdt, with_2d_quantization=recipe.enable_2d_quantization)
            g = MXFP8Quantizer(bdt)
            # fp8_output / fp8_grad: the next GEMM's input / the previous GEMM's grad-output
            o, gi = MXFP8Quantizer(fdt), MXFP8Quantizer(bdt)
            self.split = (None, None, None)  # no MMParams in the recipe: te_gemm's default
            self.block = 32
        elif recipe.nvfp4():
            x, w, g, o, gi = _nvfp4_quantizers(recipe, owner)
            self.split = (None, None, None)
            self.block = 16
        else:
            raise NotImplementedError(
                f"{owner}: {type(recipe).__name__} is not supported yet (custom quantizer "
                "factories); use DelayedScaling, Float8CurrentScaling, Float8BlockScaling, "
                "MXFP8BlockScaling or NVFP4BlockScaling"
            )
        self.x_q, self.w_q, self.g_q = _variants(x), _variants(w), _variants(g)
        self.o_q, self.gi_q = _variants(o), _variants(gi)  # fp8_output / fp8_grad
        # The fused eager steps (_linear_step, _layernorm_linear_step, _layernorm_mlp_step) take
        # formats a _flat() tuple describes.
        self.packed_ok = all(q[3]._flat() is not None for q in (self.x_q, self.w_q, self.g_q))

    def output_quantizer(self, grad_enabled: bool):
        """The quantizer of a returned output (``fp8_output``): the row-wise copy the next GEMM's
        fprop reads, and with ``grad_enabled`` the column-wise copy its wgrad reads when that
        copy cannot be made from the row-wise one later (1x128 blocks, MXFP8 / NVFP4 blocks:
        each copy has its own blocks). Per-tensor FP8 and 128x128 tiles are row-wise only, as in
        TE: the consumer makes the exact FP8 transpose if it needs one."""
        return self.o_q[2 + (grad_enabled and _one_d(self.o_q[2]))]

    def grad_input_quantizer(self):
        """The quantizer of a returned input gradient (``fp8_grad``): row-wise (the previous
        GEMM's dgrad) and, with 1x128, MXFP8 or NVFP4 blocks, column-wise (its wgrad) too; see
        output_quantizer."""
        return self.gi_q[2 + _one_d(self.gi_q[2])]

    def weight(self, weight: torch.Tensor, first: bool | None, need_columnwise: bool):
        """The quantized weight: fresh (``first`` None: with the column-wise copy only when
        dgrad needs it), quantized and cached (``first`` True, or no cache yet), or the cache.
        A weight stored quantized (``te.quantized_model_init``) is used as it is."""
        if isinstance(weight, QuantizedTensor):
            check_stored_weight(weight, self.recipe, need_columnwise, self.owner)
            return weight
        if first is None:
            return self.w_q[2 + need_columnwise](weight)
        if first or self.weight_cache is None:
            self.weight_cache = self.w_q[3](weight)
        return self.weight_cache

    def weight_operand(self, weight: torch.Tensor, first: bool | None, need_columnwise: bool) -> tuple:
        """``weight()`` as te_gemm's operand tuple (Quantizer._operand), for te.Linear's lean path."""
        if isinstance(weight, QuantizedTensor):
            return check_stored_weight(weight, self.recipe, need_columnwise, self.owner)
        if first is None:
            return self.w_q[2 + need_columnwise]._operand(weight)
        if first or self.weight_operand_cache is None:
            self.weight_operand_cache = self.w_q[3]._operand(weight)
        return self.weight_operand_cache

    def register_forward(self) -> None:
        if self.delayed:
            _autocast.register_forward(self.fwd_entry)

    def register_backward(self) -> None:
        if self.delayed:
            _autocast.register_backward(self.bwd_entry)


class GemmState:
    """The recipe state of one quantized GEMM of a module (see the module docstring)."""

    __slots__ = ("ctx", "fwd", "_bwd", "owner", "features")

    def __init__(self, owner: str, features: tuple = ()) -> None:
        """``features``: the GEMM's fixed (name, size) dimensions, checked by check_fp8_features
        when a per-tensor or block FP8 recipe first runs it."""
        self.ctx: FP8Context | None = None
        self.fwd: DelayedState | None = None
        self._bwd: DelayedState | None = None
        self.owner = owner
        self.features = features

    @property
    def bwd(self) -> DelayedState | None:
        """The backward state, its deferred update run first (te_torch._autocast)."""
        _autocast.flush_deferred()
        return self._bwd

    def __deepcopy__(self, memo) -> GemmState:
        """A copy with its own delayed-scaling buffers; the FP8Context (quantizers viewing the
        original's buffers, the weight cache) is rebuilt on the copy's next quantized call."""
        new = GemmState(self.owner, self.features)
        new.fwd, new._bwd = copy.deepcopy(self.fwd, memo), copy.deepcopy(self.bwd, memo)
        return new

    def __getstate__(self) -> dict:
        """Pickling (``torch.save`` of a whole module), as __deepcopy__: the delayed-scaling
        buffers; the FP8Context (C descriptors, quantizers) is rebuilt on the next quantized call."""
        return {"fwd": self.fwd, "bwd": self.bwd, "owner": self.owner, "features": self.features}

    def __setstate__(self, state: dict) -> None:
        self.ctx = None
        self.fwd, self._bwd = state["fwd"], state["bwd"]
        self.owner, self.features = state["owner"], state["features"]

    def ctx_for(self, recipe, group, device: torch.device) -> FP8Context:
        """The FP8Context of this call: the current one while the same recipe object, unchanged
        since (its ``_generation``), the same group and device are in use; else ``context()``."""
        c = self.ctx
        if (
            c is None
            or c.recipe is not recipe
            or c.generation != recipe._generation
            or c.group is not group
            or c.device != device
        ):
            c = self.context(recipe, group, device)
        return c

    def context(self, recipe, group, device: torch.device) -> FP8Context:
        """The FP8Context for ``recipe``, rebuilt when the recipe's fields, the group or the
        device change. A new recipe object equal to the last one (``te.autocast(recipe=
        DelayedScaling())`` written inside the training loop) keeps the context: rebuilding its
        quantizers costs 0.1-0.3 ms per GEMM per step."""
        c = self.ctx
        if c is not None and c.group is group and c.device == device and c.fields == recipe_fields(recipe):
            c.recipe, c.generation = recipe, recipe._generation
            return c
        check_fp8_features(self.owner, recipe, self.features)
        fwd = bwd = None
        if recipe.delayed():
            fwd, bwd = self.delayed_states(recipe.amax_history_len, device)
        c = self.ctx = FP8Context(recipe, device, fwd, bwd, group, self.owner)
        return c

    def delayed_states(self, history_len: int, device) -> tuple[DelayedState, DelayedState]:
        if self.fwd is None:
            self.fwd = DelayedState(history_len, FWD_ROLES, device)
            self._bwd = DelayedState(history_len, BWD_ROLES, device)
        elif self.fwd.amax_history.shape[0] != history_len:
            self.fwd.resize(history_len)
            self.bwd.resize(history_len)
            self.ctx = None  # its quantizers view the old buffers
        return self.fwd, self._bwd

    def adjust_amax_history_length(self, length: int, fwd: bool | None = None) -> None:
        for st, is_fwd in ((self.fwd, True), (self.bwd, False)):
            if st is not None and (fwd is None or fwd == is_fwd):
                st.resize(length)
        self.ctx = None

    def calibrate(self, inp: torch.Tensor, weight: torch.Tensor, recipe, group) -> None:
        """autocast(calibrating=True): record the input's and weight's amaxes (DelayedScaling)."""
        if recipe is None or not recipe.delayed():
            return
        fwd, _ = self.delayed_states(recipe.amax_history_len, weight.device)
        with torch.no_grad():
            for i, t in ((0, inp), (1, weight)):
                a = fwd.amax(i)
                torch.maximum(a, t.detach().abs().amax().float().reshape(1), out=a)
        _autocast.register_forward((recipe_key(recipe, False, group, weight.device), recipe, fwd))

    def to(self, device: torch.device) -> None:
        """Moves the delayed-scaling buffers (after the module's parameters moved)."""
        for st in (self.fwd, self.bwd):
            if st is not None:
                st.move_to(device)
        self.ctx = None

    def extra_state(self) -> dict[str, torch.Tensor]:
        if self.fwd is None:
            return {}
        f, b = self.fwd, self.bwd
        return dict(
            zip(
                EXTRA_KEYS,
                (f.amax_history.clone(), f.scale.clone(), b.amax_history.clone(), b.scale.clone()),
                strict=True,
            )
        )

    def load(self, state: dict, device: torch.device, what: str) -> None:
        """Restores ``extra_state()``'s dict (empty: no delayed-scaling state)."""
        self.ctx = None
        _autocast.flush_deferred()  # the replaced state's own update first, as if it had run
        if not isinstance(state, dict):
            raise TypeError(
                f"{self.owner}: {what}: expected a dict of tensors with the keys {list(EXTRA_KEYS)} "
                f"(or an empty dict: no delayed-scaling state), got {type(state).__name__}"
            )
        if not state:
            self.fwd = self._bwd = None
            return
        missing = [k for k in EXTRA_KEYS if k not in state]
        if missing:
            raise ValueError(f"{self.owner}: {what}: missing {missing}; expected the keys {list(EXTRA_KEYS)}")
        for pre, n in (("fwd", FWD_ROLES), ("bwd", BWD_ROLES)):  # all checked before any is loaded
            _check_extra(self.owner, what, f"{pre}_amax_history", state, f"[amax_history_len, {n}]", 2, n)
            _check_extra(self.owner, what, f"{pre}_scale", state, f"[{n}]", 1, n)
            scale = state[f"{pre}_scale"]
            if not bool(torch.isfinite(scale).all()) or bool((scale <= 0).any()):
                raise ValueError(
                    f"{self.owner}: {what}['{pre}_scale']: expected finite scales > 0, got "
                    f"{scale.tolist()}; the checkpoint's delayed-scaling state is corrupt (drop "
                    "_extra_state to start from fresh scales)"
                )
        self.fwd = DelayedState(state["fwd_amax_history"].shape[0], FWD_ROLES, device)
        self._bwd = DelayedState(state["bwd_amax_history"].shape[0], BWD_ROLES, device)
        for st, pre in ((self.fwd, "fwd"), (self._bwd, "bwd")):
            st.amax_history.copy_(state[f"{pre}_amax_history"])
            st.scale.copy_(state[f"{pre}_scale"])


def _check_extra(owner: str, what: str, key: str, state: dict, expected: str, dim: int, n: int) -> None:
    """GemmState.load: ``state[key]`` must be a float tensor of ``dim`` dims whose last is ``n``
    (the history length, dim 0 of a 2-D one, is the checkpoint's own)."""
    t = state[key]
    if (
        not isinstance(t, torch.Tensor)
        or not t.is_floating_point()
        or t.dim() != dim
        or t.shape[-1] != n
        or t.shape[0] < 1
    ):
        got = f"{type(t).__name__} {t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else repr(t)
        raise ValueError(f"{owner}: {what}[{key!r}]: expected a float tensor {expected}, got {got}")
