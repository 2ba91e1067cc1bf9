"""te.make_graphed_callables on the CPU, where nothing is captured and the graphed callables run
eagerly under the captured te.autocast arguments: which calls take the "graph" path (the captured
region) and which the caller's own, against eager modules run by hand; errors and TE's old
argument names. The CUDA graphs themselves: tests/gpu/test_torch_graphs.py."""

import copy
import logging

import pytest
import te_torch as te
import torch
from _module_ref import delayed_states as _states
from te_torch import recipe

RECIPES = {
    "delayed": recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling(),
    "block": recipe.Float8BlockScaling(),
}


def _pair(make):
    torch.manual_seed(0)
    m = make()
    return m, copy.deepcopy(m)


def _step(m, x, dy, r=None, region=True):
    """(y, dx, grads) of one step of ``m``; under te.autocast(recipe=r) when ``region``."""
    x = x.detach().requires_grad_(True)
    if region:
        with te.autocast(enabled=r is not None, recipe=r):
            y = m(x)
    else:
        y = m(x)
    y.backward(dy)
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    return y.detach(), x.grad, grads


def _assert_same(a, b):
    for u, v in zip(a, b, strict=True):
        if isinstance(u, list):
            _assert_same(u, v)
        else:
            assert torch.equal(u, v)


MODULES = {
    "linear": lambda: te.Linear(64, 48),
    "ln_linear": lambda: te.LayerNormLinear(64, 48),
    "ln_mlp": lambda: te.LayerNormMLP(64, 96),
}


@pytest.mark.parametrize("name", list(MODULES))
@pytest.mark.parametrize("rname", list(RECIPES))
def test_graphed_module_trains_as_its_eager_twin(name, rname):
    r = RECIPES[rname]
    graphed, eager = _pair(MODULES[name])
    x0 = torch.randn(32, 64, requires_grad=True)
    g = te.make_graphed_callables(graphed, (x0,), enabled=True, recipe=r)
    assert g is graphed
    for _ in range(3):
        x, dy = torch.randn(32, 64), torch.randn(32, 48 if name != "ln_mlp" else 64)
        _assert_same(_step(g, x, dy, region=False), _step(eager, x, dy, r))
        # inside a region with an equal recipe object the graph path runs too
        _assert_same(_step(g, x, dy, copy.deepcopy(r)), _step(eager, x, dy, r))
        _assert_same(_states(graphed), _states(eager))
    if rname == "delayed":
        assert graphed._gemms[next(iter(graphed._gemms))].fwd.amax_history.abs().sum() > 0


def test_a_region_that_differs_runs_the_module_eagerly_and_says_so(caplog):
    graphed, eager = _pair(MODULES["linear"])
    x0 = torch.randn(32, 64, requires_grad=True)
    g = te.make_graphed_callables(graphed, (x0,), enabled=True, recipe=RECIPES["current"])
    x, dy = torch.randn(32, 64), torch.randn(32, 48)
    with caplog.at_level(logging.INFO, logger="te"):
        hp = _step(g, x, dy, None)  # te.autocast(enabled=False): high precision
        _step(g, x, dy, None)
    _assert_same(hp, _step(eager, x, dy, None))
    fp8 = _step(g, x, dy, region=False)
    assert not torch.equal(hp[0], fp8[0])
    msgs = [r.getMessage() for r in caplog.records if "runs eagerly" in r.getMessage()]
    assert len(msgs) == 1 and "enabled" in msgs[0]
    _assert_same(_step(g, x, dy, RECIPES["block"]), _step(eager, x, dy, RECIPES["block"]))


def test_a_recipe_changed_in_place_after_capture_runs_eagerly(caplog):
    r = recipe.DelayedScaling(amax_history_len=4)
    graphed, eager = _pair(MODULES["linear"])
    g = te.make_graphed_callables(graphed, (torch.randn(32, 64, requires_grad=True),), enabled=True, recipe=r)
    r.fp8_format = recipe.Format.E4M3  # the graphs hold the HYBRID quantizers
    x, dy = torch.randn(32, 64), torch.randn(32, 48)
    with caplog.at_level(logging.INFO, logger="te"):
        got = _step(g, x, dy, region=False)
    assert any("changed in place" in m.getMessage() for m in caplog.records)
    _assert_same(got, _step(eager, x, dy, r))


def test_other_shapes_and_eval_mode_run_eagerly():
    graphed, eager = _pair(MODULES["linear"])
    g = te.make_graphed_callables(graphed, (torch.randn(32, 64, requires_grad=True),), enabled=True)
    x, dy = torch.randn(16, 64), torch.randn(16, 48)
    r = te.get_default_recipe()
    _assert_same(_step(g, x, dy, region=False), _step(eager, x, dy, r))  # 16 rows, not 32
    x3 = torch.randn(2, 16, 64)
    with torch.no_grad(), te.autocast(recipe=r):
        want = eager(x3)
    assert torch.equal(g(x3), want)
    g.eval()  # captured in train mode: eager, still under the captured region
    eager.eval()
    ones = torch.ones(32, 64)
    with torch.no_grad():
        out = g(ones)
        with te.autocast(recipe=r):
            assert torch.equal(out, eager(ones))
        with te.autocast(enabled=False):
            assert torch.equal(g(ones), eager(ones))


def test_functions_and_keyword_arguments():
    lin = te.Linear(64, 48)
    twin = copy.deepcopy(lin)

    def f(x, *, scale, shift=0.0):
        return lin(x * scale) + shift

    x0, s0 = torch.randn(8, 64, requires_grad=True), torch.rand(1, 64)
    g = te.make_graphed_callables(f, (x0,), sample_kwargs={"scale": s0, "shift": 1.5}, enabled=True)
    x, s = torch.randn(8, 64), torch.rand(1, 64)
    with te.autocast(recipe=te.get_default_recipe()):
        want = twin(x * s) + 1.5
    assert torch.equal(g(x, scale=s, shift=1.5), want)
    with te.autocast(recipe=te.get_default_recipe()):
        want = twin(x * s) + 2.0
    assert torch.equal(g(x, scale=s, shift=2.0), want)  # another fixed value: eager, same numbers


def test_several_callables_with_per_callable_enabled():
    a, b = te.Linear(64, 64), te.Linear(64, 32)
    ta, tb = copy.deepcopy(a), copy.deepcopy(b)
    x0 = torch.randn(16, 64, requires_grad=True)
    ga, gb = te.make_graphed_callables(
        (a, b), ((x0,), (x0.detach().requires_grad_(),)), enabled=(True, False), recipe=RECIPES["current"]
    )
    x = torch.randn(16, 64)
    with te.autocast(recipe=RECIPES["current"]):
        h = ta(x)
    assert torch.equal(gb(ga(x)), tb(h))  # b captured in high precision, called outside a region


def test_bad_arguments_say_what_was_expected():
    m = te.Linear(64, 32)
    x = torch.randn(8, 64)
    with pytest.raises(TypeError, match="sample_args: expected a tuple of tensors"):
        te.make_graphed_callables(m, (x, 3))
    with pytest.raises(TypeError, match="modules: expected a callable"):
        te.make_graphed_callables((m, 3), ((x,), (x,)))
    with pytest.raises(ValueError, match="expected a tuple of 2 tuples"):
        te.make_graphed_callables((m, m), (x,))
    with pytest.raises(ValueError, match="enabled: expected one value per callable"):
        te.make_graphed_callables((m, m), ((x,), (x,)), enabled=(True,))
    with pytest.raises(ValueError, match="num_warmup_iters"):
        te.make_graphed_callables(m, (x,), num_warmup_iters=-1)
    with pytest.raises(TypeError, match="recipe: expected a te.recipe recipe"):
        te.make_graphed_callables(m, (x,), enabled=True, recipe="delayed")
    with pytest.raises(TypeError, match="unexpected keyword argument 'fp8_bogus'"):
        te.make_graphed_callables(m, (x,), fp8_bogus=True)
    for kw in ("cache_quantized_params", "retain_graph_in_backward", "_order"):
        with pytest.raises(NotImplementedError, match=kw):
            te.make_graphed_callables(m, (x,), **{kw: True if kw != "_order" else [1, -1]})


def test_old_argument_names_still_work_with_a_warning():
    graphed, eager = _pair(MODULES["linear"])
    with pytest.warns(DeprecationWarning, match="fp8_recipe is deprecated"):
        g = te.make_graphed_callables(
            graphed, (torch.randn(32, 64, requires_grad=True),), fp8_enabled=True, fp8_recipe=RECIPES["block"]
        )
    x, dy = torch.randn(32, 64), torch.randn(32, 48)
    _assert_same(_step(g, x, dy, region=False), _step(eager, x, dy, RECIPES["block"]))
