"""te_torch._token_pad: the rows of an FP8 GEMM module's input padded to a multiple of 16 with
copies of the last row, the outputs sliced back (the modules' numerics with such token counts are
checked against the emulated references in test_linear.py, test_layernorm_linear.py and
test_layernorm_mlp.py)."""

from __future__ import annotations

import logging

import pytest
import te_torch as te
import torch
from te_torch import _token_pad


@pytest.mark.parametrize(
    ("shape", "count"),
    [((16, 8), 0), ((32, 8), 0), ((21, 8), 11), ((3, 7, 8), 11), ((1, 8), 15), ((0, 8), 0)],
)
def test_pad_count(shape, count):
    assert _token_pad.pad_count(torch.empty(shape)) == count


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
    m = te.LayerNormMLP(64, 128, device="cpu")
    x = torch.randn(3, 7, 64, requires_grad=True)
    with caplog.at_level(logging.INFO, logger="te"):
        for _ in range(2):
            with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
                y = m(x)
            y.sum().backward()
    assert y.shape == (3, 7, 64) and x.grad.shape == x.shape
    said = [r for r in caplog.records if "multiple of 16" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
