"""DelayedScaling state through torch.distributed.checkpoint (DCP, one process here): a trained
model's scaling state restored into a model that has not run (whose state is empty) or whose
state has another history length, and the restored model's next step the original's bit for
bit; te.init_scaling_state, the state made before the first step; the _extra_state value
(te_torch._extra_state.ExtraState) through torch.save / weights_only loads and copies."""

import collections
import copy
import io
import warnings
from collections.abc import Mapping

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


@pytest.mark.parametrize("made", [None, 4, 16])  # the destination's state: none, or a history of 4 / 16
def test_dcp_restores_the_scaling_state_into_a_model_that_has_not_run(tmp_path, made):
    torch.manual_seed(0)
    a = _model()
    for seed in (1, 2):
        _step(a, seed)
    b = _model()
    if made is not None:
        te.init_scaling_state(b, te.recipe.DelayedScaling(amax_history_len=made))
    _dcp_round_trip(a, b, tmp_path / "ckpt")
    assert torch.equal(b[2].weight, a[2].weight)
    assert_same_state(a, b)
    for got, want in zip(_step(b, 3), _step(a, 3), strict=True):
        assert torch.equal(got, want)
    assert_same_state(a, b)


def test_the_extra_state_value_reads_as_a_dict_and_saves_as_one():
    torch.manual_seed(0)
    a = _model()
    _step(a, 1)
    sd = a.state_dict()
    extra = sd["3._extra_state"]  # LayerNormMLP: {"fc1": {...}, "fc2": {...}}
    assert not isinstance(extra, Mapping)  # DCP keeps it one object
    assert set(extra) == {"fc1", "fc2"} and len(extra) == 2 and "fc1" in extra
    assert set(extra["fc1"]) == {"fwd_amax_history", "fwd_scale", "bwd_amax_history", "bwd_scale"}
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert type(loaded["3._extra_state"]) is collections.OrderedDict
    assert torch.equal(loaded["2._extra_state"]["fwd_scale"], sd["2._extra_state"]["fwd_scale"])
    for state in (loaded, sd, copy.deepcopy(sd)):  # a pickled checkpoint, the values, a copy
        b = _model()
        b.load_state_dict(state)
        assert_same_state(a, b)
    assert type(copy.deepcopy(sd)["2._extra_state"]) is type(extra)
    assert _model()[2].state_dict()["_extra_state"] == {}


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
