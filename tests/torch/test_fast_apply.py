"""te_torch._fast_apply: te modules' eager FP8 steps call Function.apply's C entry point directly.
The step must be the wrapper's step bit for bit (the same forward, the same autograd node and
backward), and the wrapper must still run where it is needed (under functorch transforms)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")
from te_torch import _fast_apply, _linear  # noqa: E402
from te_torch._linear_fn import LinearFn  # noqa: E402


def _step(m, x, dy):
    x = x.clone().requires_grad_(True)
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        y = m(x)
    y.backward(dy)
    out = (y.detach(), x.grad, m.weight.grad, m.bias.grad, type(y.grad_fn).__name__)
    m.weight.grad = m.bias.grad = None
    return out


def test_raw_apply_step_equals_wrapper_step(monkeypatch):
    # Eagerly te.Linear applies LinearStepFn (the fused step as the Function itself) through its
    # C entry point; under a transform LinearFn goes through the wrapper. Same numbers either way.
    torch.manual_seed(0)
    m = te.Linear(64, 32, device="cpu")
    x, dy = torch.randn(16, 64), torch.randn(16, 32)
    calls = []
    real = _linear._STEP_APPLY

    def spy(*args):
        calls.append(len(args))
        return real(*args)

    monkeypatch.setattr(_linear, "_STEP_APPLY", spy)
    raw = _step(m, x, dy)
    assert calls == [6]  # the eager step went through the C entry point
    monkeypatch.setattr(_linear, "transforms_active", lambda: True)
    monkeypatch.setattr(_linear, "_LINEAR_APPLY", LinearFn.apply)
    wrapped = _step(m, x, dy)
    assert calls == [6]
    assert (raw[4], wrapped[4]) == ("LinearStepFnBackward", "LinearFnBackward")
    for a, b in zip(raw[:4], wrapped[:4], strict=True):
        assert torch.equal(a, b)


def test_wrapper_needed_only_under_transforms():
    assert not _fast_apply.wrapper_needed()
    seen = []

    def f(t):
        seen.append(_fast_apply.wrapper_needed())
        return t * 2

    torch.func.vmap(f)(torch.randn(3, 4))
    assert seen == [True]
