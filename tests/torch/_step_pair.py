"""Helpers of the fused-step tests (test_layernorm_linear_step.py, test_layernorm_mlp_step.py):
two copies of a module, one on the fused eager step and one op by op (``packed_ok`` off), run
on the same data and compared bit for bit."""

from __future__ import annotations

import copy

import te_torch as te
import torch

RECIPES = {
    "delayed": lambda: te.recipe.DelayedScaling(amax_history_len=4),
    "current": te.recipe.Float8CurrentScaling,
    "block": te.recipe.Float8BlockScaling,
}


def pair(make, recipe_name: str) -> tuple:
    """(fused module, op-by-op copy, recipe)."""
    torch.manual_seed(0)
    a = make()
    with torch.no_grad():  # non-trivial norm parameters and biases
        for name, p in a.named_parameters():
            if name == "layer_norm_weight":
                p.normal_(0.0 if a.zero_centered_gamma else 1.0, 0.3)
            elif "bias" in name:
                p.normal_(0.0, 0.3)
    return a, copy.deepcopy(a), RECIPES[recipe_name]()


def step(m, x, dy, recipe, fused: bool, **fwd):
    """One forward + backward of ``m`` under ``recipe`` on the fused step or op by op."""
    for g in m._gemms.values():
        g.context(recipe, None, x.device).packed_ok = fused
    with te.autocast(recipe=recipe):
        y = m(x, **fwd)
    y.backward(dy)
    return y


def grads(m, x) -> list:
    """x's gradient and every parameter's (main_grad where the parameter has one)."""
    out = [x.grad]
    for p in m.parameters():
        out.append(p.main_grad if hasattr(p, "main_grad") else p.grad)
    return out


def assert_same(got, want) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w is None:
            assert g is None, i
        else:
            assert g is not None and g.dtype == w.dtype and torch.equal(g, w), (i, (g - w).abs().max())


def assert_same_state(a, b) -> None:
    """The delayed-scaling state (amax histories, scales) of both modules."""
    sa, sb = a.state_dict()["_extra_state"], b.state_dict()["_extra_state"]
    assert sa.keys() == sb.keys()
    for key, value in sa.items():
        if isinstance(value, dict):
            for k, v in value.items():
                assert torch.equal(v, sb[key][k]), (key, k)
        else:
            assert torch.equal(value, sb[key]), key


def calls(monkeypatch, module, name: str) -> list:
    """Counts the calls of ``module.name`` (a fused entry point) while the test runs."""
    seen = []
    f = getattr(module, name)

    def counted(*args):
        seen.append(1)
        return f(*args)

    monkeypatch.setattr(module, name, counted)
    return seen


# Kinds of call a fused step keeps a plan for: (leading dims, input dtype, the input needs a
# gradient, the weights need one). Token counts that pad (7 x 3, 5) beside ones that do not.
KINDS = [
    ((7, 3), torch.float32, True, True),
    ((16,), torch.float32, True, True),
    ((16,), torch.bfloat16, True, True),
    ((5,), torch.float32, False, True),
    ((2, 8), torch.float32, True, False),
]


def each_kind(a, b, recipe, features: tuple[int, int], weights: tuple[str, ...]) -> None:
    """``a`` on the fused step and ``b`` op by op, called with every one of KINDS in turn, each
    twice and out of order, freezing the named weight parameters where a kind says so: output,
    gradients and delayed-scaling state must agree bit for bit on every call."""
    k, n = features
    for kind in KINDS + KINDS[::-1]:
        lead, dtype, x_grad, w_grad = kind
        for m in (a, b):
            for name in weights:
                getattr(m, name).requires_grad_(w_grad)
        g = torch.Generator().manual_seed(len(lead) + lead[0])
        x = torch.randn(*lead, k, generator=g).to(dtype)
        dy = torch.randn(*lead, n, generator=g).to(dtype)
        xa, xb = x.clone().requires_grad_(x_grad), x.clone().requires_grad_(x_grad)
        ya = step(a, xa, dy, recipe, True)
        yb = step(b, xb, dy, recipe, False)
        assert ya.shape == (*lead, n) and ya.dtype == dtype
        assert torch.equal(ya, yb), kind
        assert_same(grads(a, xa), grads(b, xb))
    assert_same_state(a, b)
