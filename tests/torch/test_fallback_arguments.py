"""TE arguments te takes with a fallback that keeps the numbers (said once at INFO):
delay_wgrad_compute (weight gradients still computed in backward) and symmetric_ar_type
(torch.distributed's all-reduce)."""

import logging

import pytest
import te_torch as te
import torch
import torch.nn.functional as F
from te_torch import recipe
from te_torch._info_once import told


@pytest.mark.parametrize(
    "make_module, call",
    [
        (lambda **kw: te.Linear(64, 32, device="cpu", **kw), lambda m, x: m(x)),
        (lambda **kw: te.LayerNormLinear(64, 32, device="cpu", **kw), lambda m, x: m(x)),
        (lambda **kw: te.LayerNormMLP(64, 32, device="cpu", **kw), lambda m, x: m(x)),
        (lambda **kw: te.GroupedLinear(2, 64, 32, device="cpu", **kw), lambda m, x: m(x, [16, 16])),
    ],
    ids=["Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear"],
)
def test_delay_wgrad_compute_is_taken_with_the_gradients_in_backward(make_module, call, caplog):
    """TE's delay_wgrad_compute: te computes the weight gradients in backward (said once at
    INFO), need_backward_dw() is False, backward_dw() changes nothing, and a hook meant for after
    backward_dw is refused rather than never run."""
    told.discard("delay_wgrad_compute")
    torch.manual_seed(0)
    plain = make_module()
    with caplog.at_level(logging.INFO, logger="te"):
        delayed = make_module(delay_wgrad_compute=True)
    said = [r for r in caplog.records if "delay_wgrad_compute" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    delayed.load_state_dict(plain.state_dict())
    x = torch.randn(32, 64)
    grads = []
    for m in (plain, delayed):
        with te.autocast(recipe=recipe.Float8CurrentScaling()):
            call(m, x).sum().backward()
        assert m.need_backward_dw() is False
        m.backward_dw()
        grads.append([p.grad for p in m.parameters()])
    for a, b in zip(*grads, strict=True):
        assert a is not None and torch.equal(a, b)
    with pytest.raises(RuntimeError, match="would never run"):
        delayed.register_wgrad_accumulation_and_reduce_hooks(lambda: None)


def test_symmetric_ar_type_is_taken_and_checked(caplog):
    told.discard("symmetric_ar_type")
    with caplog.at_level(logging.INFO, logger="te"):
        m = te.Linear(64, 32, device="cpu", symmetric_ar_type="two_shot")
    assert [r.levelno for r in caplog.records if "symmetric_ar_type" in r.getMessage()] == [logging.INFO]
    x = torch.randn(8, 64)
    torch.testing.assert_close(m(x), F.linear(x, m.weight, m.bias))
    with pytest.raises(ValueError, match="symmetric_ar_type: expected None or one of"):
        te.LayerNormMLP(64, 32, device="cpu", symmetric_ar_type="ring")
