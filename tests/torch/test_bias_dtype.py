"""The bias of a quantized GEMM is added in the output's dtype (TE's rule), whatever the
parameter's dtype: fp32 parameters with 16-bit activations (fp32 master weights under
torch.autocast) must give exactly the output of the same module with its biases stored in the
activation dtype, on the fused eager step and op by op; the bias gradient stays in the
parameter's dtype (fp32 sums, rounded once)."""

from __future__ import annotations

import copy

import pytest
import te_torch as te
import torch
from _step_pair import RECIPES, step

MODULES = {
    "Linear": lambda: te.Linear(128, 96, device="cpu"),
    "LayerNormLinear": lambda: te.LayerNormLinear(128, 96, device="cpu"),
    "LayerNormMLP": lambda: te.LayerNormMLP(128, 256, device="cpu"),
}


def _step(m, x, dy, recipe, fused):
    x = x.clone().requires_grad_(True)
    y = step(m, x, dy, recipe, fused)
    return y, x.grad, {n: p.grad for n, p in m.named_parameters()}


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "op_by_op"])
@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("module", list(MODULES))
def test_fp32_bias_is_added_in_the_activation_dtype(module, recipe_name, fused):
    torch.manual_seed(0)
    m32 = MODULES[module]()  # fp32 parameters
    with torch.no_grad():
        for name, p in m32.named_parameters():
            if "bias" in name:
                p.normal_(0.0, 0.3)
    m16 = copy.deepcopy(m32)
    bias_names = [n for n, _ in m16.named_parameters() if "bias" in n and "layer_norm" not in n]
    assert bias_names
    for n in bias_names:  # the same biases, stored in bf16 (exactly: rounded once)
        mod, attr = m16.get_submodule(".".join(n.split(".")[:-1])), n.split(".")[-1]
        setattr(mod, attr, torch.nn.Parameter(getattr(mod, attr).detach().to(torch.bfloat16)))
    recipe = RECIPES[recipe_name]()
    x = (torch.randn(2, 32, 128) * 2).to(torch.bfloat16)
    dy = torch.randn(2, 32, 96 if "Linear" in module else 128).to(torch.bfloat16)
    y32, dx32, g32 = _step(m32, x, dy, recipe, fused)
    y16, dx16, g16 = _step(m16, x, dy, recipe, fused)
    assert y32.dtype == torch.bfloat16 and torch.equal(y32, y16)
    assert torch.equal(dx32, dx16)
    for n, g in g32.items():
        if n in bias_names:
            assert g.dtype == torch.float32, n  # the parameter's dtype
            assert torch.equal(g.to(torch.bfloat16), g16[n]), n
        else:
            assert torch.equal(g, g16[n]), n
