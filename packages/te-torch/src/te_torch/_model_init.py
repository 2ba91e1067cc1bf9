"""``te.quantized_model_init``: modules built inside hold their GEMM weights quantized only.

A te GEMM module (Linear, LayerNormLinear, LayerNormMLP) constructed inside the region
initialises its weights as usual, quantizes each one with the region's recipe and registers the
quantized tensor as the parameter; the high-precision values are dropped (kept on the CPU only
with ``preserve_high_precision_init_val``). Per-tensor recipes (DelayedScaling,
Float8CurrentScaling) give a ``Float8Tensor`` with both copies (row-wise for fprop, column-wise
for dgrad), Float8BlockScaling a ``Float8BlockwiseQTensor`` with the recipe's
``w_block_scaling_dim``, MXFP8BlockScaling an E4M3 ``MXFP8Tensor`` (32x32 tiles with
``enable_2d_quantization``, else 1x32 blocks) and NVFP4BlockScaling an ``NVFP4Tensor`` quantized
as the recipe quantizes weights (16x16 tiles unless ``disable_2d_quantization``).

Why a per-tensor weight is current-scaled even under DelayedScaling: a stored weight is quantized
only when it changes (at init and at each ``param.quantize_(master)`` after an optimizer step), so
its own amax is at hand and no history is needed; a delayed scale would start at 1, which leaves
small initial weights subnormal in E4M3.

The GEMM modules read the stored tensor through ``check_stored_weight`` (FP8Context, under
``te.autocast``: no re-quantization) and _high_precision's dequantized weight (outside it).
"""

from __future__ import annotations

import types
import warnings

import torch
from te_core import _C
from te_core.recipe import Recipe

from te_torch._availability import get_default_recipe
from te_torch._blockwise_tensor import Float8BlockwiseQTensor
from te_torch._float8_tensor import Float8Tensor
from te_torch._mx_quantizers import MXFP8Quantizer, NVFP4Quantizer
from te_torch._mx_tensor import MXFP8Tensor, NVFP4Tensor
from te_torch._quantized_tensor import QuantizedTensor
from te_torch._quantizers import Float8BlockQuantizer, Float8CurrentScalingQuantizer, Quantizer

__all__ = ["quantized_model_init", "fp8_model_init"]

_PER_TENSOR_HINT = "DelayedScaling() or Float8CurrentScaling()"
_PER_TENSOR = int(_C.ScalingMode.PER_TENSOR)
_E4M3 = torch.float8_e4m3fn


class _InitState:
    __slots__ = ("enabled", "recipe", "preserve")

    def __init__(self) -> None:
        self.enabled = False
        self.recipe: Recipe | None = None
        self.preserve = False


STATE = _InitState()


def _check_recipe(recipe) -> Recipe:
    if recipe is None:
        return get_default_recipe()
    if not isinstance(recipe, Recipe):
        raise TypeError(
            "quantized_model_init: recipe: expected a te.recipe recipe (DelayedScaling(), "
            "Float8CurrentScaling(), Float8BlockScaling(), MXFP8BlockScaling(), "
            f"NVFP4BlockScaling()) or None, got {type(recipe).__name__}"
        )
    if recipe.custom():
        raise NotImplementedError(
            "quantized_model_init: recipe: CustomRecipe weights are not supported yet; use "
            "DelayedScaling, Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling or "
            "NVFP4BlockScaling"
        )
    return recipe


class quantized_model_init:  # noqa: N801 (TE's name)
    """Context manager: te GEMM modules constructed inside hold FP8 weights only.

    Args:
        enabled: quantize the weights of modules built inside (False: a region that turns an
            enclosing one off).
        recipe: the ``te.recipe`` whose weight format the parameters take: DelayedScaling or
            Float8CurrentScaling -> ``Float8Tensor`` (E4M3, one current-scaled fp32 scale,
            row-wise [out, in] and column-wise [in, out] FP8 copies); Float8BlockScaling ->
            ``Float8BlockwiseQTensor`` (``w_block_scaling_dim``: 128x128 tiles or 1x128 blocks,
            both copies); MXFP8BlockScaling -> ``MXFP8Tensor`` (E4M3, both copies; 32x32 tiles
            with ``enable_2d_quantization``); NVFP4BlockScaling -> ``NVFP4Tensor`` (both copies;
            16x16 tiles unless ``disable_2d_quantization``). None: ``te.get_default_recipe()``.
        preserve_high_precision_init_val: keep a CPU copy of each weight's initial
            high-precision value, read with ``param.get_high_precision_init_val()`` and freed with
            ``param.clear_high_precision_init_val()`` (e.g. to seed fp32 master weights exactly).

    The modules (``te.Linear``, ``te.LayerNormLinear``, ``te.LayerNormMLP``; not with
    ``parameters_split`` or on the meta device) then behave as follows:

    - inside ``te.autocast`` with a recipe of the weight's family (per-tensor: DelayedScaling or
      Float8CurrentScaling; block: Float8BlockScaling with the same ``w_block_scaling_dim``;
      MXFP8BlockScaling / NVFP4BlockScaling with the same weight tiling) the GEMMs read the
      stored weight directly; any other recipe raises ValueError.
      ``is_first_microbatch`` has nothing to cache and is ignored;
    - outside ``te.autocast`` the weight is dequantized into the input's dtype and the layer runs
      in high precision;
    - the weight gradient has the parameter's nominal dtype (``params_dtype``) and lands in
      ``param.grad`` (or in ``param.main_grad`` with ``fuse_wgrad_accumulation``).

    A quantized weight cannot be trained by an ordinary ``torch.optim`` step (its values are FP8).
    Keep fp32 master weights beside the model and re-quantize after each step::

        with te.quantized_model_init(recipe=recipe):
            model = te.Linear(1024, 1024)
        qparams = [p for p in model.parameters() if isinstance(p, te.QuantizedTensor)]
        masters = [p.dequantize().float().requires_grad_() for p in qparams]
        opt = torch.optim.AdamW(masters, lr=1e-3)
        ...
        with te.autocast(recipe=recipe):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        with torch.no_grad():
            for p, m in zip(qparams, masters):
                m.grad = p.grad.float()
                p.grad = None
            opt.step()
            for p, m in zip(qparams, masters):
                p.quantize_(m)  # re-quantizes in place, both copies

    ``state_dict()`` holds the quantized weights (FP8 bytes and fp32 scales) and
    ``load_state_dict`` copies them back byte for byte (a plain tensor is quantized);
    ``torch.load(..., weights_only=True)`` reads such a checkpoint (te_torch registers its
    quantized tensors as safe globals). The fp32 masters are yours to save.
    """

    __slots__ = ("enabled", "recipe", "preserve_high_precision_init_val", "_saved")

    def __init__(
        self,
        enabled: bool = True,
        recipe: Recipe | None = None,
        preserve_high_precision_init_val: bool = False,
    ) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"quantized_model_init: enabled: expected a bool, got {type(enabled).__name__}")
        self.enabled = enabled
        self.recipe = _check_recipe(recipe) if enabled else recipe
        self.preserve_high_precision_init_val = bool(preserve_high_precision_init_val)
        self._saved = None

    def __enter__(self) -> quantized_model_init:
        if self._saved is not None:
            raise RuntimeError(
                "quantized_model_init: this instance is already active; nest a new "
                "te.quantized_model_init(...) instead of entering the same one twice"
            )
        s = STATE
        self._saved = (s.enabled, s.recipe, s.preserve)
        s.enabled, s.recipe, s.preserve = self.enabled, self.recipe, self.preserve_high_precision_init_val
        return self

    def __exit__(self, *exc) -> None:
        s = STATE
        s.enabled, s.recipe, s.preserve = self._saved
        self._saved = None


def fp8_model_init(
    enabled: bool = True,
    recipe: Recipe | None = None,
    preserve_high_precision_init_val: bool = False,
) -> quantized_model_init:
    """TE's old name of ``quantized_model_init`` (same arguments). Deprecated, as in TE."""
    warnings.warn(
        "fp8_model_init is deprecated; use te.quantized_model_init(enabled, recipe, "
        "preserve_high_precision_init_val)",
        DeprecationWarning,
        stacklevel=2,
    )
    return quantized_model_init(enabled, recipe, preserve_high_precision_init_val)


def weight_quantizer(recipe: Recipe, device: torch.device) -> Quantizer:
    """The quantizer a stored weight of ``recipe`` is made (and re-quantized) with."""
    if recipe.mxfp8():  # the forward format is E4M3 under E4M3 and HYBRID alike
        return MXFP8Quantizer(_E4M3, with_2d_quantization=recipe.enable_2d_quantization)
    if recipe.nvfp4():
        qp = recipe.fp4_quant_fwd_weight
        return NVFP4Quantizer(
            with_2d_quantization=qp.fp4_2d_quantization, stochastic_rounding=qp.stochastic_rounding
        )
    if recipe.float8_block_scaling():
        qp = recipe.fp8_quant_fwd_weight
        return Float8BlockQuantizer(
            torch.float8_e4m3fn,
            block_scaling_dim=recipe.w_block_scaling_dim,
            force_pow_2_scales=qp.power_2_scale,
            amax_epsilon=qp.amax_epsilon,
        )
    # Every per-tensor recipe's forward format is E4M3 (HYBRID keeps E5M2 for gradients).
    if recipe.float8_current_scaling():
        qp = recipe.fp8_quant_fwd_weight
        return Float8CurrentScalingQuantizer(
            _E4M3, device, force_pow_2_scales=qp.power_2_scale, amax_epsilon=qp.amax_epsilon
        )
    return Float8CurrentScalingQuantizer(_E4M3, device)


def _get_init_val(self) -> torch.Tensor | None:
    return self._high_precision_init_val


def _clear_init_val(self) -> None:
    self._high_precision_init_val = None


def quantize_module_weights(module: torch.nn.Module, names: tuple[str, ...], owner: str, split) -> None:
    """Inside an enabled ``quantized_model_init``: replaces each initialised weight parameter
    ``names`` of ``module`` by an nn.Parameter wrapping its quantized tensor."""
    s = STATE
    if not s.enabled:
        return
    if split is not None:
        raise NotImplementedError(
            f"{owner}: parameters_split inside quantized_model_init is not implemented yet; "
            "build the module without parameters_split or outside quantized_model_init"
        )
    for name in names:
        w = getattr(module, name)
        if w.device.type == "meta":
            raise NotImplementedError(
                f"{owner}: device='meta' inside quantized_model_init is not implemented yet; "
                "create the module on a real device"
            )
        qt = weight_quantizer(s.recipe, w.device)(w.detach())
        param = torch.nn.Parameter(qt, requires_grad=w.requires_grad)
        if s.preserve:
            param._high_precision_init_val = w.detach().to("cpu", copy=True)
            param.get_high_precision_init_val = types.MethodType(_get_init_val, param)
            param.clear_high_precision_init_val = types.MethodType(_clear_init_val, param)
        setattr(module, name, param)


def _family(weight: QuantizedTensor) -> str:
    if isinstance(weight, Float8BlockwiseQTensor):
        dim = 2 if weight._is_2D_scaled else 1
        return f"Float8BlockScaling(w_block_scaling_dim={dim})"
    if isinstance(weight, MXFP8Tensor):
        return f"MXFP8BlockScaling(enable_2d_quantization={weight._with_2d_quantization})"
    if isinstance(weight, NVFP4Tensor):
        return f"NVFP4BlockScaling(disable_2d_quantization={not weight._with_2d_quantization})"
    return _PER_TENSOR_HINT


def check_stored_weight(weight: QuantizedTensor, recipe: Recipe, need_columnwise: bool, owner: str) -> tuple:
    """The te_gemm operand tuple of a stored quantized weight, after checking that ``recipe``
    (the active autocast's) can run it and that the copies the GEMMs read are present."""
    if isinstance(weight, Float8Tensor):
        ok = recipe.delayed() or recipe.float8_current_scaling()
        op = (_PER_TENSOR, weight._data, weight._scale_inv, weight._transpose, weight._scale_inv)
    elif isinstance(weight, Float8BlockwiseQTensor):
        ok = recipe.float8_block_scaling() and (recipe.w_block_scaling_dim == 2) == weight._is_2D_scaled
        op = (weight._mode, *weight._parts())
    elif isinstance(weight, MXFP8Tensor):
        ok = recipe.mxfp8() and recipe.enable_2d_quantization == weight._with_2d_quantization
        op = weight._operand()
    elif isinstance(weight, NVFP4Tensor):
        ok = (
            recipe.nvfp4()
            and recipe.fp4_quant_fwd_weight.fp4_2d_quantization == weight._with_2d_quantization
            and not weight._columnwise_rht
        )
        op = weight._operand()
    else:
        ok, op = False, None
    if not ok:
        raise ValueError(
            f"{owner}: the weight is a {type(weight).__name__} made for {_family(weight)}, which "
            f"te.autocast(recipe={type(recipe).__name__}(...)) cannot use; run the model under "
            f"te.autocast with {_family(weight)}, or build it under "
            f"te.quantized_model_init(recipe=<the autocast recipe>)"
        )
    if op[1] is None or (need_columnwise and op[3] is None):
        raise ValueError(
            f"{owner}: the quantized weight lacks its "
            f"{'row-wise' if op[1] is None else 'column-wise'} copy, which this GEMM reads; "
            "restore it with weight.update_usage(rowwise_usage=True, columnwise_usage=True) "
            "(the column-wise copy is needed only when the input requires a gradient)"
        )
    return op
