"""te.checkpoint on CUDA: a checkpointed segment of te modules (BF16 parameters) trains bit for bit
as the plain segment under each recipe, reentrant or not (the CPU suite: tests/torch/test_checkpoint.py)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")
CUDA = torch.device("cuda")
BF16 = torch.bfloat16
RECIPES = {
    "delayed": lambda: te.recipe.DelayedScaling(amax_history_len=4),
    "current": te.recipe.Float8CurrentScaling,
    "block": te.recipe.Float8BlockScaling,
}


def _stack():
    return torch.nn.Sequential(
        te.LayerNormLinear(256, 512, params_dtype=BF16, device=CUDA),
        torch.nn.GELU(),
        te.LayerNormMLP(512, 1024, params_dtype=BF16, device=CUDA),
        te.Linear(512, 256, params_dtype=BF16, device=CUDA),
    )


def _run(m, x, r, reentrant):
    x = x.detach().requires_grad_(True)
    with te.autocast(recipe=r):
        y = m(x) if reentrant is None else te.checkpoint(m, x, use_reentrant=reentrant)
    (y.float() ** 2).sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    return [y.detach(), x.grad, *grads]


@pytest.mark.parametrize("rname", list(RECIPES))
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_checkpointed_stack_trains_as_the_plain_one(rname, reentrant):
    torch.manual_seed(0)
    plain = _stack()
    ckpt = copy.deepcopy(plain)
    r = RECIPES[rname]()
    for _ in range(3):
        x = torch.randn(128, 256, device=CUDA, dtype=BF16)
        for a, b in zip(_run(ckpt, x, r, reentrant), _run(plain, x, r, None), strict=True):
            assert torch.equal(a, b)
