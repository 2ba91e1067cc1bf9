"""te.GroupedLinear on CUDA: each group's rows give the bits of the same rows through a CUDA
te.Linear of that group's weight (the same kernels, so equal bits; te.Linear's CUDA numerics are
checked against the CPU backend in test_torch_linear.py), for every recipe and in high
precision, two steps (delayed scaling on updated scales), with an empty group and rows that
per-tensor FP8 pads; and the whole step against the CPU backend's GroupedLinear normwise (1e-2:
bf16 outputs, as test_torch_linear.py's bound)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")
recipe = te.recipe
CUDA = torch.device("cuda")
RECIPES = {
    "none": lambda: None,
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling,
    "block": recipe.Float8BlockScaling,
}
# unaligned rows (per-tensor steps pad them inside; block groups then take te.Linear's padded
# path) and 16-aligned ones (every recipe's eager steps in one GroupedStepFn)
SPLITS = {"unaligned": [37, 0, 200, 64], "aligned": [48, 0, 208, 64]}
K, N = 256, 384


def relerr(got, ref):
    got, ref = got.double().cpu(), ref.double().cpu()
    return ((got - ref).norm() / ref.norm()).item()


def grouped_step(m, x, dy, r, splits):
    x = x.clone().requires_grad_(True)
    with te.autocast(enabled=r is not None, recipe=r):
        y = m(x, splits)
    y.backward(dy)
    out = [y.detach(), x.grad, *(p.grad for p in m.parameters())]
    m.zero_grad(set_to_none=True)
    return out


def linears_step(lins, x, dy, r, splits):
    xs = [c.clone().requires_grad_(True) for c in torch.split(x, splits)]
    with te.autocast(enabled=r is not None, recipe=r):
        ys = [lin(c) for lin, c in zip(lins, xs, strict=True)]
    torch.autograd.backward(ys, list(torch.split(dy, splits)))
    grads = []
    for lin in lins:
        for p in lin.parameters():
            grads.append(torch.zeros_like(p) if p.grad is None else p.grad)
        lin.zero_grad(set_to_none=True)
    return [torch.cat([y.detach() for y in ys]), torch.cat([c.grad for c in xs]), *grads]


@pytest.mark.parametrize("rows", list(SPLITS))
@pytest.mark.parametrize("name", list(RECIPES))
def test_grouped_linear_cuda_vs_te_linear_and_cpu(name, rows):
    splits = SPLITS[rows]
    torch.manual_seed(0)
    m = te.GroupedLinear(len(splits), K, N, params_dtype=torch.bfloat16, device=CUDA)
    with torch.no_grad():
        for i in range(len(splits)):
            getattr(m, f"bias{i}").normal_(0, 0.5)
    cpu = copy.deepcopy(m).to("cpu")
    lins = []
    for i in range(len(splits)):
        lin = te.Linear(K, N, params_dtype=torch.bfloat16, device=CUDA)
        with torch.no_grad():
            lin.weight.copy_(getattr(m, f"weight{i}"))
            lin.bias.copy_(getattr(m, f"bias{i}"))
        lins.append(lin)
    for s in range(2):
        r = RECIPES[name]()
        x = (torch.randn(sum(splits), K) * (1 + s)).to(torch.bfloat16)
        dy = torch.randn(sum(splits), N).to(torch.bfloat16)
        got = grouped_step(m, x.to(CUDA), dy.to(CUDA), r, splits)
        want = linears_step(lins, x.to(CUDA), dy.to(CUDA), r, splits)
        ref = grouped_step(cpu, x, dy, r, splits)
        for k, (g, w, c) in enumerate(zip(got, want, ref, strict=True)):
            assert torch.equal(g, w), (name, s, k)
            if c.any():
                assert relerr(g, c) <= 1e-2, (name, s, k, relerr(g, c))
            else:
                assert not g.any(), (name, s, k)
