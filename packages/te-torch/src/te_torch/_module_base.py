"""What te's GEMM modules (Linear, GroupedLinear, LayerNormLinear, LayerNormMLP) share: argument
checks, the TE-named weight/bias parameters, and the recipe state of their GEMMs
(``QuantizedModule``).

``_extra_state`` (``state_dict()``): a module with one GEMM saves that GEMM's dict
(_gemm_state.EXTRA_KEYS, Linear's format); a module with several saves ``{gemm name: dict}``
(LayerNormMLP: ``{"fc1": ..., "fc2": ...}``). Only plain tensors in dicts, so
``torch.load(..., weights_only=True)`` reads a checkpoint; empty dicts before any
delayed-scaling step. The dict is wrapped in an ExtraState (te_torch._extra_state), which
torch.distributed.checkpoint saves and loads whole.
"""

from __future__ import annotations

import numbers
import warnings

import torch

from te_torch._extra_state import ExtraState, as_dict
from te_torch._gemm_state import GemmState
from te_torch._info_once import info_once
from te_torch._te_extra_state import is_te_extra_state, read_te_extra_state

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
UNSUPPORTED_KWARGS = (
    "ub_overlap_ag",
    "ub_overlap_rs",
    "ub_overlap_rs_dgrad",
    "ub_bulk_dgrad",
    "ub_bulk_wgrad",
    "ub_name",
    "save_original_input",
)
# TE's delay_wgrad_compute asks for the weight gradients in a later backward_dw() call, so a
# pipeline schedule can overlap them with communication. te computes them in backward (the same
# gradients, without the overlap) and says so once; backward_dw() then has nothing to do.
DELAY_WGRAD = "delay_wgrad_compute"
# TE's symmetric_ar_type picks a symmetric-memory all-reduce for a row-parallel output; the sum is
# the same with torch.distributed's all_reduce, which te runs (said once).
SYMMETRIC_AR = "symmetric_ar_type"
_SYMMETRIC_AR_TYPES = ("multimem_all_reduce", "two_shot", "one_shot")


def reject_kwargs(owner: str, kwargs: dict, accepted: tuple[str, ...] = UNSUPPORTED_KWARGS) -> None:
    """TE arguments te does not implement: unknown names are a TypeError, known ones set to a
    true value a NotImplementedError naming them (False / None / 0 are TE's defaults);
    ``delay_wgrad_compute`` and ``symmetric_ar_type`` are taken for every module (DELAY_WGRAD,
    SYMMETRIC_AR)."""
    for key, value in kwargs.items():
        if key == DELAY_WGRAD:
            if value:
                info_once(
                    DELAY_WGRAD,
                    f"te.{owner}: delay_wgrad_compute=True: te computes weight gradients in the "
                    "backward pass (the same gradients, without the overlap a delayed wgrad "
                    "allows); backward_dw() has nothing left to do",
                )
            continue
        if key == SYMMETRIC_AR:
            if value is not None:
                if value not in _SYMMETRIC_AR_TYPES:
                    raise ValueError(
                        f"{owner}: symmetric_ar_type: expected None or one of {_SYMMETRIC_AR_TYPES}, "
                        f"got {value!r}"
                    )
                info_once(
                    SYMMETRIC_AR,
                    f"te.{owner}: symmetric_ar_type={value!r}: te all-reduces with "
                    "torch.distributed.all_reduce (the same sum, without symmetric memory)",
                )
            continue
        if key not in accepted:
            raise TypeError(f"{owner}: unexpected keyword argument {key!r}")
        if value:
            raise NotImplementedError(f"{owner}: {key}={value!r} is not implemented in te yet")


class DropsTeExtraState:
    """A mixin for te modules without scaling state whose Transformer Engine counterparts write an
    ``_extra_state`` entry (LayerNorm, RMSNorm, L2Normalization, DotProductAttention): a TE
    checkpoint's entry is accepted and dropped on loading; te writes none."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # torch hands each module its own copy of the dict to change
        state_dict.pop(prefix + "_extra_state", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def norm_module_outputs(module, out, bias, ln_out):
    """A norm module's (LayerNormLinear's, LayerNormMLP's) forward return: ``out``, then ``bias``
    if ``return_bias``, then the norm output if ``return_layernorm_output`` (a tuple when more
    than one)."""
    if module.return_bias:
        return (out, bias, ln_out) if module.return_layernorm_output else (out, bias)
    return (out, ln_out) if module.return_layernorm_output else out


def check_size(owner: str, arg: str, v) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{owner}: {arg}: expected an int >= 1, got {v!r}")
    return v


def check_params_dtype(owner: str, params_dtype) -> torch.dtype:
    params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
    if params_dtype not in FLOAT_DTYPES:
        raise TypeError(f"{owner}: params_dtype: expected float32, bfloat16 or float16, got {params_dtype}")
    return params_dtype


def check_eps(owner: str, eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 <= eps < float("inf")):
        raise ValueError(f"{owner}: eps: expected a finite float >= 0, got {eps!r}")
    return float(eps)


def bad_input(owner: str, inp, features: int, what: str = "in_features") -> None:
    """Raises the error for an input whose dtype or last dimension is wrong."""
    if not isinstance(inp, torch.Tensor):
        raise TypeError(f"{owner}: inp: expected a torch.Tensor, got {type(inp).__name__}")
    if inp.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{owner}: inp: expected float32, bfloat16 or float16 (the output and the GEMMs use "
            f"the input's dtype), got {inp.dtype}; cast it, e.g. inp.to(torch.bfloat16)"
        )
    raise ValueError(
        f"{owner}: inp: expected the last dimension to be {what}={features}, got shape "
        f"{tuple(inp.shape)}; reshape the input to [..., {features}]"
    )


def split_sizes(owner: str, split, out_features: int) -> dict[str, int] | None:
    """TE's parameters_split: a tuple of names (equal parts) or a dict name -> size. Each name
    (trailing ``_`` dropped, as TE) names the parameters ``{name}_weight`` / ``{name}_bias``."""
    if split is None:
        return None
    if isinstance(split, dict):
        items = list(split.items())
    else:
        names = tuple(split)
        if not names or out_features % len(names):
            raise ValueError(
                f"{owner}: parameters_split: {len(names)} names do not divide out_features="
                f"{out_features}; pass a dict name -> size"
            )
        items = [(n, out_features // len(names)) for n in names]
    sizes: dict[str, int] = {}
    for name, size in items:
        if not isinstance(size, numbers.Integral) or isinstance(size, bool) or size < 0:
            raise ValueError(
                f"{owner}: parameters_split: size of {name!r}: expected an int >= 0, got {size!r}"
            )
        key = str(name).rstrip("_")
        if key in sizes or "." in key:
            raise ValueError(
                f"{owner}: parameters_split: name {name!r}: expected distinct names without '.' "
                f"(each names the parameters '{{name}}_weight' / '{{name}}_bias', a trailing '_' "
                f"dropped), got {[n for n, _ in items]}"
            )
        sizes[key] = int(size)
    if sum(sizes.values()) != out_features:
        raise ValueError(
            f"{owner}: parameters_split: sizes {list(sizes.values())} sum to "
            f"{sum(sizes.values())}, expected out_features={out_features}"
        )
    return sizes


def check_init_method(owner: str, arg: str, init_method) -> None:
    if init_method is not None and not callable(init_method):
        raise TypeError(f"{owner}: {arg}: expected a callable(weight) or None, got {init_method!r}")


def init_weight(w: torch.Tensor, init_method) -> None:
    """``init_method(w)``, or TE's default normal(0, 0.023); meta tensors are left alone."""
    if w.device.type == "meta":
        return
    with torch.no_grad():
        if init_method is not None:
            init_method(w)
        else:
            w.normal_(0.0, 0.023)


def parameter(module: torch.nn.Module, name: str):
    """``getattr(module, name)`` for a module's parameter, read from ``_parameters`` first:
    nn.Module's __getattr__ costs a forward ~0.5 us per parameter on the dev machine (several on
    the H200 host). What is not a registered parameter there (a parametrization, a wrapper's
    plain tensor, an absent bias's None) is read as an attribute."""
    p = module._parameters.get(name)
    return p if p is not None else getattr(module, name)


def detached(*ts):
    """``ts`` detached (None stays None): the tensors of a quantized step under torch.no_grad()
    or inference_mode. An autograd Function's ``needs_input_grad`` follows ``requires_grad`` even
    with grad mode off, so without this an inference step would quantize and keep the column-wise
    copies (x's for wgrad, W's for dgrad; in LayerNormMLP also the activation's) for a backward
    that cannot run."""
    return tuple(None if t is None else t.detach() for t in ts)


def warn_if_recomputed(owner: str, gemm: GemmState) -> None:
    """Called by a module's high-precision forward: a module that has run quantized running in
    high precision inside a backward pass is torch.utils.checkpoint recomputing it outside its
    te.autocast region, so its gradients would belong to another function (te.checkpoint replays
    the region). Costs one attribute read for a module that never ran quantized."""
    if gemm.ctx is not None and not torch.compiler.is_compiling() and torch._C._current_graph_task_id() != -1:
        warnings.warn(
            f"te.{owner} ran in high precision during a backward pass after running quantized: "
            "torch.utils.checkpoint recomputes a segment outside its te.autocast region, so the "
            "recomputed forward differs from the original one. Use te.checkpoint, which replays "
            "the region and its scales.",
            UserWarning,
            stacklevel=3,
        )


class QuantizedModule(torch.nn.Module):
    """Base of the modules with quantized GEMMs: ``self._gemms`` maps each GEMM's name to its
    GemmState. Subclasses set ``_gemms`` and ``_state_device()``."""

    _gemms: dict[str, GemmState]

    def _state_device(self) -> torch.device:
        raise NotImplementedError

    def need_backward_dw(self) -> bool:
        """TE's: whether backward_dw() must run to finish the weight gradients. Never in te: they
        are computed in the backward pass (see ``delay_wgrad_compute`` in docs/migrating.rst), so
        frameworks keep their usual gradient hooks."""
        return False

    def backward_dw(self) -> None:
        """TE's delayed weight-gradient step: nothing to do in te (need_backward_dw)."""

    def register_wgrad_accumulation_and_reduce_hooks(self, hook) -> None:
        """TE's hooks for after backward_dw(). te computes weight gradients in backward and never
        defers them, so a hook registered here would never run: refused, rather than a gradient
        reduction silently skipped (register it on the parameter, as without delayed wgrad)."""
        raise RuntimeError(
            f"te.{type(self).__name__}.register_wgrad_accumulation_and_reduce_hooks: te computes weight "
            "gradients in the backward pass (need_backward_dw() is False), so this hook would never "
            "run; register it on the parameters' gradient accumulation as without delay_wgrad_compute"
        )

    def adjust_amax_history_length(self, length: int, fwd: bool | None = None) -> None:
        """Changes the DelayedScaling history length (keeps the newest rows), as TE's."""
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(
                f"{type(self).__name__}.adjust_amax_history_length: length: expected an int >= 1, "
                f"got {length!r}"
            )
        for g in self._gemms.values():
            g.adjust_amax_history_length(length, fwd)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        dev = self._state_device()
        for g in self._gemms.values():
            g.to(dev)
        return out

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # A checkpoint without this module's _extra_state (torch's nn.Linear's weight and bias, or
        # one whose scaling state was dropped) holds no DelayedScaling state: load it as the empty
        # state rather than fail load_state_dict(strict=True) on the missing key (TE's users
        # report that failure). torch hands each module its own copy of the dict to change.
        key = prefix + "_extra_state"
        if key not in state_dict:
            state_dict[key] = {}
            info_once(
                "no _extra_state",
                f"te.{type(self).__name__}.load_state_dict: the checkpoint has no {key!r} (no "
                "DelayedScaling state): the module starts from fresh scales",
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def get_extra_state(self) -> ExtraState:
        """DelayedScaling state as plain tensors (see the module docstring)."""
        if len(self._gemms) == 1:
            return ExtraState(next(iter(self._gemms.values())).extra_state())
        states = {name: g.extra_state() for name, g in self._gemms.items()}
        return ExtraState(states if any(states.values()) else {})

    def set_extra_state(self, state) -> None:
        owner = type(self).__name__
        dev = self._state_device()
        state = as_dict(state)
        if is_te_extra_state(state):  # a Transformer Engine checkpoint (TE 2.x's format)
            for g, st in zip(
                self._gemms.values(), read_te_extra_state(state, len(self._gemms), owner), strict=True
            ):
                g.load(st, dev, "_extra_state (Transformer Engine's)")
            return
        if state is None or (isinstance(state, torch.Tensor) and state.numel() == 0):
            state = {}
        if not isinstance(state, dict):
            raise TypeError(
                f"{owner}: _extra_state: expected a dict of tensors written by te.{owner} or Transformer "
                f"Engine's uint8 tensor, got {type(state).__name__} (drop the _extra_state keys to start "
                "from fresh scales)"
            )
        if len(self._gemms) == 1:
            next(iter(self._gemms.values())).load(state, dev, "_extra_state")
            return
        unknown = set(state) - set(self._gemms)
        if unknown:
            raise ValueError(
                f"{owner}: _extra_state: unexpected keys {sorted(unknown)}; expected a dict with "
                f"one entry per GEMM {list(self._gemms)}"
            )
        for name, g in self._gemms.items():
            g.load(state.get(name, {}), dev, f"_extra_state[{name!r}]")


class SingleGemmModule(QuantizedModule):
    """A module with one quantized GEMM, ``self._gemm`` (te.Linear, te.LayerNormLinear): its
    recipe state lives on the device of its (first) weight."""

    _gemm: GemmState
    _weight_names: tuple[str, ...]

    def _state_device(self) -> torch.device:
        return getattr(self, self._weight_names[0]).device

    @property
    def _fwd_state(self):
        return self._gemm.fwd

    @property
    def _bwd_state(self):
        return self._gemm.bwd


_NORMALIZATIONS = {"LayerNorm": False, "RMSNorm": True}


def check_normalization(owner: str, normalization) -> bool:
    """TE's ``normalization`` argument -> whether it is RMSNorm."""
    if normalization not in _NORMALIZATIONS:
        raise ValueError(f"{owner}: normalization: expected 'LayerNorm' or 'RMSNorm', got {normalization!r}")
    return _NORMALIZATIONS[normalization]


def register_norm_params(module, hidden: int, rms: bool, params_dtype, device) -> None:
    """TE's ``layer_norm_weight`` [hidden] and, for LayerNorm, ``layer_norm_bias`` [hidden]."""
    module.layer_norm_weight = torch.nn.Parameter(torch.empty(hidden, dtype=params_dtype, device=device))
    module.layer_norm_bias = (
        None if rms else torch.nn.Parameter(torch.empty(hidden, dtype=params_dtype, device=device))
    )


def reset_norm_params(module) -> None:
    """layer_norm_weight ones (zeros with zero_centered_gamma), layer_norm_bias zeros."""
    w, b = module.layer_norm_weight, module.layer_norm_bias
    if w.device.type == "meta":
        return
    with torch.no_grad():
        w.fill_(0.0 if module.zero_centered_gamma else 1.0)
        if b is not None:
            b.zero_()
