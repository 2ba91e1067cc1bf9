"""``te.init_scaling_state``: a model's DelayedScaling state made before its first step.

A te module creates its DelayedScaling state (amax histories and scales) on its first quantized
step, so a model that has not run has an empty ``_extra_state``. Loading a checkpoint restores
the state into such a model anyway (``load_state_dict``, and ``torch.distributed.checkpoint``,
which loads te's ``_extra_state`` whole: te_torch._extra_state). Creating it first, as the first
step under the recipe would, gives the modules the recipe's layout before any step.
"""

from __future__ import annotations

import torch

from te_torch._autocast import _resolve
from te_torch._module_base import QuantizedModule

__all__ = ["init_scaling_state"]


def init_scaling_state(model: torch.nn.Module, recipe=None) -> None:
    """Create the scaling state ``recipe`` keeps in every te module of ``model`` (Linear,
    LayerNormLinear, LayerNormMLP) that has none yet, as its first step under ``recipe`` would.

    Under DelayedScaling each GEMM gets its forward amax history [amax_history_len, 3] and
    scales [3] and its backward ones [amax_history_len, 2] / [2], fp32 on the module's weight
    device: zeros and ones, so the next step is a first step. A GEMM whose history has another
    length is resized to the recipe's (the newest rows kept), as the next step would. Other
    recipes keep no state between steps: nothing changes.

    Args:
        model: a te module or a module containing them.
        recipe: the recipe training will use; None: autocast's default (``te.get_default_recipe()``).

    Raises:
        TypeError: ``model`` is not a torch.nn.Module, or ``recipe`` is not a te recipe.
        ValueError: ``model`` holds no te module with a quantized GEMM.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"init_scaling_state: model: expected a torch.nn.Module, got {type(model).__name__}")
    recipe = _resolve(recipe, "init_scaling_state")
    modules = [m for m in model.modules() if isinstance(m, QuantizedModule)]
    if not modules:
        raise ValueError(
            f"init_scaling_state: model: no te Linear, LayerNormLinear or LayerNormMLP in this "
            f"{type(model).__name__}, so there is no scaling state to create"
        )
    if not recipe.delayed():
        return
    for m in modules:
        device = m._state_device()
        for g in m._gemms.values():
            g.delayed_states(recipe.amax_history_len, device)
