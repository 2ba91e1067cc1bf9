"""te.make_graphed_callables on CUDA: the replayed graphs against an eager twin of each module.

A graph replays the kernels the eager step launches, with the same arguments (cuBLASLt's plan
cache gives both the same algorithm), and the DelayedScaling updates run inside the graphs, so
outputs, every gradient and the scaling state must agree bit for bit step after step. Also: the
warmup before capture leaves the scaling state and main_grad as they were, a region with
enabled=False evaluates a graphed FP8 model in BF16, and the graph really is replayed (the
module's Python forward does not run)."""

from __future__ import annotations

import copy
import gc
import sys
import warnings
import weakref
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")

# The CPU tests' helpers (tests/torch/_module_ref.py): one snapshot of the scaling state for both.
_TORCH_TESTS = Path(__file__).resolve().parents[1] / "torch"
if str(_TORCH_TESTS) not in sys.path:
    sys.path.insert(0, str(_TORCH_TESTS))

from _module_ref import delayed_states  # noqa: E402

CUDA = torch.device("cuda")
BF16 = torch.bfloat16
RECIPES = {
    "bf16": None,
    "delayed": te.recipe.DelayedScaling(amax_history_len=4),
    "current": te.recipe.Float8CurrentScaling(),
    "block": te.recipe.Float8BlockScaling(),
}
MODULES = {
    "Linear": lambda: te.Linear(256, 384, params_dtype=BF16, device=CUDA),
    "LayerNormLinear": lambda: te.LayerNormLinear(256, 384, params_dtype=BF16, device=CUDA),
    "LayerNormMLP": lambda: te.LayerNormMLP(256, 512, params_dtype=BF16, device=CUDA),
    "Sequential": lambda: torch.nn.Sequential(
        te.LayerNormLinear(256, 512, params_dtype=BF16, device=CUDA),
        te.Linear(512, 256, params_dtype=BF16, device=CUDA),
    ),
}
OUT = {"Linear": 384, "LayerNormLinear": 384, "LayerNormMLP": 256, "Sequential": 256}


def _step(m, x, dy, r):
    x = x.detach().requires_grad_(True)
    with te.autocast(enabled=r is not None, recipe=r):
        y = m(x)
    y.backward(dy)
    grads = [p.grad.clone() for p in m.parameters() if p.grad is not None]
    m.zero_grad(set_to_none=True)
    return [y.detach().clone(), x.grad.clone(), *grads]


def _graphed_step(g, x, dy):
    x = x.detach().requires_grad_(True)
    y = g(x)
    y.backward(dy)
    grads = [p.grad.clone() for p in g.parameters() if p.grad is not None]
    g.zero_grad(set_to_none=True)
    return [y.detach().clone(), x.grad.clone(), *grads]


@pytest.mark.parametrize("name", list(MODULES))
@pytest.mark.parametrize("rname", list(RECIPES))
def test_graphs_replay_the_eager_step_bit_for_bit(name, rname):
    r = RECIPES[rname]
    torch.manual_seed(0)
    graphed = MODULES[name]()
    eager = copy.deepcopy(graphed)
    before = delayed_states(graphed)
    sample = torch.randn(64, 256, device=CUDA, dtype=BF16, requires_grad=True)
    g = te.make_graphed_callables(graphed, (sample,), enabled=r is not None, recipe=r)
    after = delayed_states(graphed)
    if before:
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    else:  # created by the warmup, then reset: a fresh state
        for h, s in zip(after[0::2], after[1::2], strict=True):
            assert not h.any() and bool((s == 1).all())
    calls = []
    hook_target = graphed if name != "Sequential" else graphed[0]
    hook_target.register_forward_pre_hook(lambda *a: calls.append(1))
    for _ in range(3):
        x = torch.randn(64, 256, device=CUDA, dtype=BF16)
        dy = torch.randn(64, OUT[name], device=CUDA, dtype=BF16)
        got, want = _graphed_step(g, x, dy), _step(eager, x, dy, r)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
        assert all(
            torch.equal(a, b) for a, b in zip(delayed_states(graphed), delayed_states(eager), strict=True)
        )
    if name == "Sequential":
        assert not calls  # the inner modules' Python never ran: the graph did
    if rname == "delayed":
        assert any(t.abs().sum() > 0 for t in delayed_states(graphed)[0::2])


def test_warmup_leaves_main_grad_alone_and_graphs_accumulate_into_it():
    torch.manual_seed(1)
    m = te.Linear(256, 384, params_dtype=BF16, device=CUDA, fuse_wgrad_accumulation=True)
    m.weight.main_grad = torch.full((384, 256), 0.5, device=CUDA)
    twin = copy.deepcopy(m)
    twin.weight.main_grad = m.weight.main_grad.clone()
    r = RECIPES["delayed"]
    sample = torch.randn(64, 256, device=CUDA, dtype=BF16, requires_grad=True)
    # allow_unused_input: with main_grad the weight's gradient goes there, not to weight.grad
    g = te.make_graphed_callables(m, (sample,), allow_unused_input=True, enabled=True, recipe=r)
    assert bool((m.weight.main_grad == 0.5).all())
    for _ in range(2):
        x = torch.randn(64, 256, device=CUDA, dtype=BF16)
        dy = torch.randn(64, 384, device=CUDA, dtype=BF16)
        got, want = _graphed_step(g, x, dy), _step(twin, x, dy, r)
        assert len(got) == len(want) == 3  # y, dx, the bias gradient (the weight's is in main_grad)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert torch.equal(m.weight.main_grad, twin.weight.main_grad)
    assert not torch.equal(m.weight.main_grad, torch.full_like(m.weight.main_grad, 0.5))


def test_a_graphed_fp8_model_evaluates_in_bf16_inside_a_disabled_region():
    torch.manual_seed(2)
    m = te.LayerNormMLP(256, 512, params_dtype=BF16, device=CUDA)
    twin = copy.deepcopy(m)
    g = te.make_graphed_callables(
        m,
        (torch.randn(64, 256, device=CUDA, dtype=BF16, requires_grad=True),),
        enabled=True,
        recipe=RECIPES["current"],
    )
    x = torch.randn(64, 256, device=CUDA, dtype=BF16)
    with torch.no_grad():
        with te.autocast(enabled=False):
            hp = g(x)
        fp8 = g(x)
        assert torch.equal(hp, twin(x))
        with te.autocast(recipe=RECIPES["current"]):
            assert torch.equal(fp8, twin(x))
    assert not torch.equal(hp, fp8)


def test_manual_capture_after_eager_steps_replays_the_eager_step():
    """torch.cuda.graph by hand, the way torch documents it, after eager steps on the default
    stream (whose backward updates are deferred to the next region's exit): side-stream warmup,
    then capture. Each replay must run exactly one forward and one backward update, like the
    eager twin's step: outputs and scaling state bit for bit, step after step."""
    r = RECIPES["delayed"]
    torch.manual_seed(3)
    m = te.Linear(256, 384, params_dtype=BF16, device=CUDA)
    twin = copy.deepcopy(m)

    def data():
        return torch.randn(64, 256, device=CUDA, dtype=BF16), torch.randn(64, 384, device=CUDA, dtype=BF16)

    for _ in range(2):  # eager steps on the default stream
        x, dy = data()
        _step(m, x, dy, r)
        _step(twin, x, dy, r)
    static_x = torch.randn(64, 256, device=CUDA, dtype=BF16, requires_grad=True)
    static_dy = torch.randn(64, 384, device=CUDA, dtype=BF16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warmup, as torch.cuda.graph requires
            _step(m, static_x.detach(), static_dy, r)
            _step(twin, static_x.detach(), static_dy, r)
    torch.cuda.current_stream().wait_stream(side)
    assert all(torch.equal(a, b) for a, b in zip(delayed_states(m), delayed_states(twin), strict=True))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with te.autocast(recipe=r):
            static_y = m(static_x)
        static_y.backward(static_dy)
    for _ in range(3):
        x, dy = data()
        static_x.data.copy_(x)
        static_dy.copy_(dy)
        graph.replay()
        want = _step(twin, x, dy, r)
        assert torch.equal(static_y, want[0])
        assert all(torch.equal(a, b) for a, b in zip(delayed_states(m), delayed_states(twin), strict=True))


def test_a_dropped_graphed_module_is_not_collected_inside_the_next_capture():
    """A dropped graphed module is garbage only to the cyclic collector, and a collection that
    frees its CUDA graphs inside another capture invalidates that capture. With a threshold of 1
    the collector would run at nearly every allocation of the warmup and capture:
    te.make_graphed_callables must collect the garbage first, run no collection while capturing,
    and leave the collector as it found it."""
    sample = torch.randn(64, 256, device=CUDA, dtype=BF16, requires_grad=True)
    during_capture = []

    def watch(phase, info):
        if phase == "start" and torch.cuda.is_current_stream_capturing():
            during_capture.append(info["generation"])

    threshold = gc.get_threshold()
    gc.disable()  # the dropped module survives until make_graphed_callables
    try:
        dropped = te.Linear(256, 384, params_dtype=BF16, device=CUDA)
        te.make_graphed_callables(dropped, (sample,), enabled=True, recipe=RECIPES["delayed"])
        gone = weakref.ref(dropped)
        del dropped
        assert gone() is not None  # cyclic garbage holding CUDA graphs
        torch.manual_seed(4)
        m = te.Linear(256, 384, params_dtype=BF16, device=CUDA)
        twin = copy.deepcopy(m)
        gc.set_threshold(1)
        gc.enable()
        gc.callbacks.append(watch)
        try:
            g = te.make_graphed_callables(m, (sample,), enabled=True, recipe=RECIPES["delayed"])
        finally:
            gc.callbacks.remove(watch)
            gc.set_threshold(*threshold)
        assert gc.isenabled()
    finally:
        gc.enable()
    assert gone() is None
    assert not during_capture
    for _ in range(2):
        x = torch.randn(64, 256, device=CUDA, dtype=BF16)
        dy = torch.randn(64, 384, device=CUDA, dtype=BF16)
        got, want = _graphed_step(g, x, dy), _step(twin, x, dy, RECIPES["delayed"])
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_make_graphed_callables_leaves_a_disabled_collector_disabled():
    gc.disable()
    try:
        m = te.Linear(256, 384, params_dtype=BF16, device=CUDA)
        te.make_graphed_callables(m, (torch.randn(64, 256, device=CUDA, dtype=BF16, requires_grad=True),))
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("rname", ["delayed", "current"])
def test_capture_and_replays_raise_no_stream_mismatch_warning(rname):
    """torch's capture raises "The AccumulateGrad node's stream does not match ..." (torch 2.10
    on: its warm-up runs on a side stream); te's capture keeps it from its users, and a replayed
    step raises none either."""
    m = te.Linear(256, 384, params_dtype=BF16, device=CUDA)
    x = torch.randn(32, 256, device=CUDA, dtype=BF16, requires_grad=True)
    dy = torch.randn(32, 384, device=CUDA, dtype=BF16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        g = te.make_graphed_callables(
            m, (x.detach().clone().requires_grad_(),), enabled=True, recipe=RECIPES[rname]
        )
        for _ in range(3):
            g(x).backward(dy)
        torch.cuda.synchronize()
    mismatch = [str(w.message)[:120] for w in seen if "AccumulateGrad" in str(w.message)]
    assert not mismatch, mismatch
