"""te.init_scaling_state: DelayedScaling state made before the first step, so
torch.distributed.checkpoint (DCP, one process here) restores a trained model's scaling state
into a model that has not run, and the restored model's next step is the original's bit for bit.
Without it DCP skips the state (the destination has none to load into): shown, not hidden."""

from __future__ import annotations

import warnings

import pytest
import te_torch as te
import torch

dcp = pytest.importorskip("torch.distributed.checkpoint")

DELAYED = te.recipe.DelayedScaling(amax_history_len=4)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        te.LayerNormLinear(64, 96, device="cpu"),
        torch.nn.GELU(),
        te.Linear(96, 64, device="cpu"),
        te.LayerNormMLP(64, 128, device="cpu"),
    )


def _step(model, seed: int, recipe=DELAYED) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 64, generator=g, requires_grad=True)
    with te.autocast(recipe=recipe):
        y = model(x)
    y.backward(torch.randn(16, 64, generator=g))
    out = [y.detach(), x.grad, *(p.grad.clone() for p in model.parameters())]
    model.zero_grad(set_to_none=True)
    return out


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Every te module's _extra_state in both models, tensor for tensor."""

    def flat(sd) -> dict:
        out = {}
        for key, value in sd.items():
            if key.endswith("_extra_state"):
                for k, v in value.items():
                    items = v.items() if isinstance(v, dict) else [("", v)]
                    out.update({(key, k, kk): vv for kk, vv in items})
        return out

    fa, fb = flat(a.state_dict()), flat(b.state_dict())
    assert fa.keys() == fb.keys() and fa
    for key, value in fa.items():
        assert torch.equal(value, fb[key]), key


def _dcp_round_trip(src: torch.nn.Module, dst: torch.nn.Module, path) -> None:
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized": one process
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(src.state_dict(), checkpoint_id=str(path))
        sd = dst.state_dict()
        dcp.load(sd, checkpoint_id=str(path))
    dst.load_state_dict(sd)


def test_dcp_restores_the_scaling_state_into_a_model_that_has_not_run(tmp_path):
    torch.manual_seed(0)
    a = _model()
    for seed in (1, 2):
        _step(a, seed)
    b = _model()
    te.init_scaling_state(b, DELAYED)
    _dcp_round_trip(a, b, tmp_path / "ckpt")
    assert_same_state(a, b)
    for got, want in zip(_step(b, 3), _step(a, 3), strict=True):
        assert torch.equal(got, want)
    assert_same_state(a, b)


def test_without_it_dcp_skips_the_scaling_state(tmp_path):
    torch.manual_seed(0)
    a = _model()
    _step(a, 1)
    b = _model()
    _dcp_round_trip(a, b, tmp_path / "ckpt")
    assert all(m.state_dict()["_extra_state"] == {} for m in b if hasattr(m, "_gemms"))
    assert torch.equal(b[2].weight, a[2].weight)  # the weights came through


def test_made_state_is_a_first_steps():
    """Zero histories and unit scales in the recipe's layout, the weights' device and dtype:
    the next step under the recipe is the step a fresh model would take."""
    torch.manual_seed(0)
    a = _model()
    b = _model()
    b.load_state_dict(a.state_dict())
    te.init_scaling_state(b, DELAYED)
    for layer in (b[0], b[2]):
        st = layer.state_dict()["_extra_state"]
        assert st["fwd_amax_history"].shape == (4, 3) and st["bwd_amax_history"].shape == (4, 2)
        assert not st["fwd_amax_history"].any() and bool((st["fwd_scale"] == 1).all())
        assert st["fwd_scale"].dtype == torch.float32
    assert set(b[3].state_dict()["_extra_state"]) == {"fc1", "fc2"}
    for got, want in zip(_step(b, 5), _step(a, 5), strict=True):
        assert torch.equal(got, want)
    assert_same_state(a, b)


def test_a_trained_models_state_is_kept_and_a_new_length_resized():
    torch.manual_seed(0)
    m = te.Linear(64, 32, device="cpu")
    _step(torch.nn.Sequential(m, torch.nn.Linear(32, 64)), 1)
    before = m.state_dict()["_extra_state"]
    te.init_scaling_state(m, DELAYED)
    after = m.state_dict()["_extra_state"]
    assert all(torch.equal(before[k], after[k]) for k in before)
    te.init_scaling_state(m, te.recipe.DelayedScaling(amax_history_len=2))
    resized = m.state_dict()["_extra_state"]
    assert resized["fwd_amax_history"].shape == (2, 3)
    assert torch.equal(resized["fwd_amax_history"], before["fwd_amax_history"][:2])


@pytest.mark.parametrize("recipe", [te.recipe.Float8CurrentScaling(), te.recipe.Float8BlockScaling()])
def test_stateless_recipes_make_nothing(recipe):
    m = te.Linear(64, 32, device="cpu")
    te.init_scaling_state(m, recipe)
    assert m.state_dict()["_extra_state"] == {}


def test_bad_arguments_say_what_was_expected():
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module, got dict"):
        te.init_scaling_state({}, DELAYED)
    with pytest.raises(TypeError, match="recipe: expected a te.recipe recipe .* got str"):
        te.init_scaling_state(te.Linear(8, 8, device="cpu"), "delayed")
    with pytest.raises(ValueError, match="no te Linear, LayerNormLinear or LayerNormMLP in this Sequential"):
        te.init_scaling_state(
            torch.nn.Sequential(torch.nn.Linear(8, 8), te.LayerNorm(8, device="cpu")), DELAYED
        )
