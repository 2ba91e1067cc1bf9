"""te_torch._token_pad: the rows of an FP8 GEMM module's input padded to a multiple of 16 with
copies of the last row, the outputs sliced back, only when a weight gradient is computed (the
modules' numerics with such token counts are checked against the emulated references in
test_linear.py, test_layernorm_linear.py and test_layernorm_mlp.py)."""

from __future__ import annotations

import copy
import logging
import sys

import pytest
import te_torch as te
import torch
from _module_ref import RECIPES
from te_torch import _token_pad


@pytest.mark.parametrize(
    ("shape", "count"),
    [((16, 8), 0), ((32, 8), 0), ((21, 8), 11), ((3, 7, 8), 11), ((1, 8), 15), ((0, 8), 0)],
)
def test_pad_count(shape, count):
    w = torch.empty(4, 8, requires_grad=True)
    x = torch.empty(shape)
    assert _token_pad.pad_count(x, w, any_rows=True) == count
    # no weight gradient, no padding where fprop / dgrad take any row count (per-tensor scaling):
    # the weight-gradient GEMM is the only one reducing over tokens
    assert _token_pad.pad_count(x, w.detach(), any_rows=True) == 0
    assert _token_pad.pad_count(x, w.detach(), w, any_rows=True) == count
    assert _token_pad.pad_count(x, w.detach()) == count  # 1x128 blocks: always
    with torch.no_grad():
        assert _token_pad.pad_count(x, w, any_rows=True) == 0
        assert _token_pad.pad_count(x, w) == count


def test_pad_and_unpad():
    x = torch.randn(3, 7, 5)
    p = _token_pad.pad(x, 11)
    assert p.shape == (32, 5)
    assert torch.equal(p[:21], x.reshape(21, 5))
    assert torch.equal(p[21:], x.reshape(21, 5)[-1:].expand(11, 5))
    y = torch.randn(32, 4)
    assert torch.equal(_token_pad.unpad(y, x.shape[:-1]), y[:21].reshape(3, 7, 4))


def test_modules_pad_odd_token_counts_and_say_so_once(caplog, monkeypatch):
    monkeypatch.setattr(_token_pad, "_told", False)
    x = torch.randn(3, 7, 64, requires_grad=True)
    with caplog.at_level(logging.INFO, logger="te"):
        for m in (te.Linear(64, 64, device="cpu"), te.LayerNormMLP(64, 128, device="cpu")):
            for _ in range(2):
                with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
                    y = m(x)
                y.sum().backward()
            assert y.shape == (3, 7, 64) and x.grad.shape == x.shape
    said = [r for r in caplog.records if "multiple of 16" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO


# The GEMM modules and the names of their GEMM weights (frozen in the adapter case below).
MODULES = {
    "Linear": (lambda: te.Linear(64, 48, device="cpu"), ("weight",)),
    "LayerNormLinear": (lambda: te.LayerNormLinear(64, 48, device="cpu"), ("weight",)),
    "LayerNormMLP": (lambda: te.LayerNormMLP(64, 96, device="cpu"), ("fc1_weight", "fc2_weight")),
}


def _no_pad(monkeypatch, module):
    def refuse(*_):
        raise AssertionError("padded without a weight gradient")

    monkeypatch.setattr(sys.modules[type(module).__module__], "pad", refuse)


def _step(m, x, r, grad):
    with torch.set_grad_enabled(grad), te.autocast(recipe=r):
        y = m(x)
    if grad:
        y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape))
    return y.detach()


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("module", list(MODULES))
def test_no_padding_without_weight_gradient(monkeypatch, module, name):
    """Inference (no_grad) and frozen GEMM weights run 3 x 7 tokens unpadded under per-tensor
    scaling (fprop and dgrad take any token count), padded under 1x128 blocks (whose GEMMs need
    a multiple of 4), bit for bit what the padded training step computes."""
    make, weights = MODULES[module]
    r = RECIPES[name]()
    torch.manual_seed(0)
    base = make()
    x = torch.randn(3, 7, 64)
    ref = copy.deepcopy(base)
    xr = x.clone().requires_grad_(True)
    want = _step(ref, xr, r, grad=True)  # trains every weight: padded

    if name != "block":
        _no_pad(monkeypatch, base)
    assert torch.equal(_step(copy.deepcopy(base), x, r, grad=False), want)
    m = copy.deepcopy(base)
    with torch.inference_mode(), te.autocast(recipe=r):
        assert torch.equal(m(x), want)
    m = copy.deepcopy(base)
    for n in weights:
        getattr(m, n).requires_grad_(False)
    xu = x.clone().requires_grad_(True)
    assert torch.equal(_step(m, xu, r, grad=True), want)
    assert torch.equal(xu.grad, xr.grad)
    for n, p in m.named_parameters():  # norm weights and biases still train
        assert p.grad is None if n in weights else torch.equal(p.grad, ref.get_parameter(n).grad), n


@pytest.mark.parametrize("name", ["delayed", "current"])
@pytest.mark.parametrize("module", list(MODULES))
def test_eager_steps_pad_inside(module, name):
    """Eager per-tensor steps pad inside: y is the step's own [21, N] tensor, not a slice of a
    padded one (no slice backward either), and takes in-place updates."""
    m = MODULES[module][0]()
    x = torch.randn(3, 7, 64, requires_grad=True)
    with te.autocast(recipe=RECIPES[name]()):
        y = m(x)
    assert y.shape == (3, 7, 48 if module != "LayerNormMLP" else 64) and y._base is None
    y.mul_(2).sum().backward()
    assert x.grad.shape == x.shape and all(p.grad is not None for p in m.parameters())


# The modules' autograd Functions (the class each module's forward applies) and their raw applies.
FUNCTIONS = {
    "Linear": ("te_torch._linear", "LinearFn", ("_LINEAR_APPLY", "_STEP_APPLY")),
    "LayerNormLinear": ("te_torch._layernorm_linear", "LayerNormLinearFn", ("_APPLY",)),
    "LayerNormMLP": ("te_torch._layernorm_mlp", "LayerNormMLPFn", ("_APPLY",)),
}


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("module", list(MODULES))
def test_inference_runs_the_step_without_autograd(monkeypatch, module, name):
    """Under no_grad / inference_mode the eager steps are called directly, not through their
    autograd Function (whose apply, detaches and ctx fields cost a decoding step about a third of
    its host time), with the training forward's outputs; with grad on the Function runs."""
    make, _ = MODULES[module]
    r = RECIPES[name]()
    torch.manual_seed(0)
    base = make()
    x = torch.randn(3, 7, 64)
    with te.autocast(recipe=r):
        want = copy.deepcopy(base)(x.clone().requires_grad_(True)).detach()  # the Function's
    path, fn, raws = FUNCTIONS[module]
    mod = sys.modules[path]

    def refuse(*_):
        raise AssertionError("an autograd Function ran")

    for raw in raws:
        monkeypatch.setattr(mod, raw, refuse)
    monkeypatch.setattr(getattr(mod, fn), "apply", refuse)
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx(), te.autocast(recipe=r):
            y = copy.deepcopy(base)(x)
        assert torch.equal(y, want) and not y.requires_grad
    with te.autocast(recipe=r), pytest.raises(AssertionError, match="autograd Function ran"):
        base(x.requires_grad_(True))
