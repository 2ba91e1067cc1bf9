"""te.quantized_model_init on CUDA: modules built inside hold only quantized weights, on the GPU,
the GEMMs read them as they are, and the documented fp32-master-weight recipe (the optimizer on
fp32 masters, then ``p.quantize_(master)``) trains as the same model built normally does, both on
CUDA. The CPU twin is tests/torch/test_quantized_model_init.py.

Tolerance: under Float8CurrentScaling and Float8BlockScaling both models quantize identical
weights identically and run the same kernels, so the losses agree to fp32 rounding (1e-5
relative); under DelayedScaling the normally built model quantizes W with the delayed scale (1 at
the first step) while a stored weight is current-scaled, so the losses only track (10%).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")
F = torch.nn.functional
recipe = te.recipe
CUDA = torch.device("cuda")
RECIPES = {
    "delayed": recipe.DelayedScaling,
    "current": recipe.Float8CurrentScaling,
    "block": recipe.Float8BlockScaling,
}
QTYPE = {"delayed": te.Float8Tensor, "current": te.Float8Tensor, "block": te.Float8BlockwiseQTensor}


def _model(r, qinit: bool):
    torch.manual_seed(3)
    init = lambda w: w.normal_(0.0, 0.1)  # noqa: E731
    with te.quantized_model_init(enabled=qinit, recipe=r):
        return torch.nn.Sequential(
            te.LayerNormLinear(128, 256, device=CUDA, init_method=init),
            torch.nn.GELU(),
            te.Linear(256, 64, device=CUDA, init_method=init),
        )


def _train(model, params, step_hook, r, steps=6):
    torch.manual_seed(4)
    x = torch.randn(96, 128, device=CUDA)
    target = torch.tanh(x @ torch.randn(128, 64, device=CUDA) * 0.1)
    opt = torch.optim.Adam(params, lr=1e-2)
    losses = []
    for _ in range(steps):
        with te.autocast(recipe=r):
            loss = F.mse_loss(model(x), target)
        loss.backward()
        step_hook(opt)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", list(RECIPES))
def test_master_weight_training_on_cuda_matches_the_normally_built_model(name):
    r = RECIPES[name]()
    qmodel, plain = _model(r, True), _model(r, False)
    qparams = [p for p in qmodel.parameters() if isinstance(p, te.QuantizedTensor)]
    assert len(qparams) == 2
    for p in qparams:
        assert type(p) is QTYPE[name] and p.is_cuda and p.dequantize().is_cuda
    masters = [p.dequantize().float().requires_grad_() for p in qparams]
    others = [p for p in qmodel.parameters() if not isinstance(p, te.QuantizedTensor)]
    with torch.no_grad():
        for pq, pp in zip(qmodel.parameters(), plain.parameters(), strict=True):
            pp.copy_(pq.dequantize() if isinstance(pq, te.QuantizedTensor) else pq)

    def master_step(opt):
        with torch.no_grad():
            for p, m in zip(qparams, masters, strict=True):
                m.grad, p.grad = p.grad.float(), None
            opt.step()
            opt.zero_grad()
            for p, m in zip(qparams, masters, strict=True):
                p.quantize_(m)

    def plain_step(opt):
        opt.step()
        opt.zero_grad()

    got = _train(qmodel, masters + others, master_step, r)
    want = _train(plain, list(plain.parameters()), plain_step, r)
    assert all(type(p) is QTYPE[name] and p.is_cuda for p in qparams)
    assert got[-1] < got[0], got
    tol = 0.1 if name == "delayed" else 1e-5
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= tol * abs(w), (got, want)
