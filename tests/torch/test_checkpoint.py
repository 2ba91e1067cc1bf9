"""te.checkpoint: a checkpointed segment trains exactly as the same segment run plainly, under
every recipe, reentrant or not: outputs, input and parameter gradients and the delayed-scaling
state agree bit for bit step after step (the recomputation runs under the forward's region and
scales and leaves the scaling state as it found it)."""

import copy
import warnings

import pytest
import te_torch as te
import torch
from _module_ref import delayed_states as _states
from te_torch import _autocast, recipe

RECIPES = {
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling,
    "block": recipe.Float8BlockScaling,
}


class _Experts(torch.nn.Module):
    """te.GroupedLinear over two halves of the segment's rows and an empty group."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = te.GroupedLinear(3, 64, 64)

    def forward(self, x):
        half = x.shape[0] // 2
        return self.experts(x, [half, 0, x.shape[0] - half])


SEGMENTS = {
    "linear": lambda: te.Linear(64, 64),
    "grouped": _Experts,
    "ln_mlp": lambda: te.LayerNormMLP(64, 128),
    "stack": lambda: torch.nn.Sequential(te.LayerNormLinear(64, 128), torch.nn.GELU(), te.Linear(128, 64)),
}


def _run(m, x, r, ckpt):
    x = x.detach().requires_grad_(True)
    with te.autocast(recipe=r):
        y = ckpt(m, x) if ckpt else m(x)
    (y * y).sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    return [y.detach(), x.grad, *grads]


@pytest.fixture(params=[True, False], ids=["deferred", "at_pass_end"])
def defer(request, monkeypatch):
    """Backward updates deferred (the default), or run from the pass's end-of-pass callback (as
    where torch.distributed is initialized or on a side stream)."""
    if not request.param:
        monkeypatch.setattr(_autocast, "_may_defer", lambda cuda_index: False)
    return request.param


@pytest.mark.parametrize("seg", list(SEGMENTS))
@pytest.mark.parametrize("rname", list(RECIPES))
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_checkpointed_segment_trains_as_the_plain_one(seg, rname, reentrant, defer):
    torch.manual_seed(0)
    plain = SEGMENTS[seg]()
    ckpt = copy.deepcopy(plain)
    r = RECIPES[rname]()

    def run_ckpt(m, x):
        return te.checkpoint(m, x, use_reentrant=reentrant)

    for step in range(3):
        x = torch.randn(32, 64)
        got, want = _run(ckpt, x, r, run_ckpt), _run(plain, x, r, None)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), step
        for a, b in zip(_states(ckpt), _states(plain), strict=True):
            assert torch.equal(a, b), step
    if rname == "delayed":  # the scales moved between forward and recomputation, and were replayed
        assert any(not torch.equal(s, torch.ones_like(s)) for s in _states(ckpt)[1::2])


def test_a_region_inside_the_segment_and_rng_are_replayed():
    torch.manual_seed(1)
    lin = te.Linear(64, 64)
    twin = copy.deepcopy(lin)
    r = RECIPES["delayed"]()

    def segment(m, x):
        with te.autocast(recipe=r):  # updated at its exit, inside the checkpointed forward
            h = m(x)
        return torch.nn.functional.dropout(h, 0.5, training=True)

    for _ in range(3):
        x = torch.randn(16, 64)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        torch.manual_seed(7)
        ya = te.checkpoint(segment, lin, xa)
        ya.sum().backward()
        torch.manual_seed(7)
        yb = segment(twin, xb)
        yb.sum().backward()
        assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)
        assert torch.equal(lin.weight.grad, twin.weight.grad)
        lin.zero_grad(set_to_none=True)
        twin.zero_grad(set_to_none=True)
        for a, b in zip(_states(lin), _states(twin), strict=True):
            assert torch.equal(a, b)


def test_bad_arguments():
    with pytest.raises(TypeError, match="function: expected a callable"):
        te.checkpoint(3, torch.ones(2))
    with pytest.raises(NotImplementedError, match="distribute_saved_activations"):
        te.checkpoint(torch.nn.Identity(), torch.ones(2), distribute_saved_activations=True)
    with pytest.raises(TypeError, match="tp_group: expected a torch.distributed ProcessGroup or None, got 3"):
        te.checkpoint(torch.nn.Identity(), torch.ones(2), tp_group=3)
    with pytest.raises(
        TypeError, match="get_rng_state_tracker: expected a callable returning the RNG tracker"
    ):
        te.checkpoint(torch.nn.Identity(), torch.ones(2), get_rng_state_tracker=object())


@pytest.mark.parametrize("reentrant", [True, False])
def test_rng_trackers_forks_draw_the_same_masks_when_recomputed(reentrant):
    # Megatron's dropout inside tensor-parallel regions draws from its tracker's fork; the
    # recomputation must see the tracker as the forward did, or its masks (and gradients) differ
    torch.manual_seed(0)
    lin = te.Linear(64, 64, device="cpu")
    x = torch.randn(16, 64)

    def make(tracker):
        def segment(inp):
            with tracker.fork():
                return torch.nn.functional.dropout(lin(inp), p=0.5)

        return segment

    grads = []
    for ckpt in (False, True):
        tracker = te.CudaRNGStatesTracker(device="cpu")
        tracker.add("model-parallel-rng", 1)
        xi = x.clone().requires_grad_()
        seg = make(tracker)
        with te.autocast(recipe=recipe.Float8CurrentScaling()):
            y = (
                te.checkpoint(seg, xi, get_rng_state_tracker=lambda t=tracker: t, use_reentrant=reentrant)
                if ckpt
                else seg(xi)
            )
        y.sum().backward()
        grads.append((y.detach(), xi.grad, lin.weight.grad.clone(), tracker.get_states()))
        lin.zero_grad(set_to_none=True)
    (y0, gx0, gw0, s0), (y1, gx1, gw1, s1) = grads
    assert torch.equal(y0, y1) and torch.equal(gx0, gx1) and torch.equal(gw0, gw1)
    # after the recomputation the tracker is where the forward left it
    assert torch.equal(s0["model-parallel-rng"], s1["model-parallel-rng"])


# torch's non-reentrant mode recomputes only to refill what the segment saved through
# save_for_backward; te.Linear's fused FP8 step saves nothing that way (its quantized copies stay
# with the first forward), so a lone Linear is never recomputed there: no warning, no harm.
@pytest.mark.parametrize(
    ("seg", "reentrant"),
    [(s, True) for s in SEGMENTS] + [("ln_mlp", False), ("stack", False)],
    ids=lambda v: v if isinstance(v, str) else ("reentrant" if v else "non_reentrant"),
)
def test_torch_checkpoint_around_te_modules_warns_and_te_checkpoint_does_not(seg, reentrant):
    m = SEGMENTS[seg]()
    r = RECIPES["current"]()
    x = torch.randn(8, 64, requires_grad=True)
    with pytest.warns(UserWarning, match="during a backward pass after running quantized.*te.checkpoint"):
        with te.autocast(recipe=r):
            y = torch.utils.checkpoint.checkpoint(m, x, use_reentrant=reentrant)
        try:
            y.sum().backward()
        except torch.utils.checkpoint.CheckpointError:
            assert not reentrant  # torch's non-reentrant mode may also notice, after te's warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with te.autocast(recipe=r):
            y = te.checkpoint(m, x, use_reentrant=reentrant)
        y.sum().backward()
        m(x).sum().backward()  # high precision outside a backward pass: no warning


@pytest.mark.parametrize("rname", list(RECIPES))
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_a_module_used_inside_and_outside_the_segment(rname, reentrant, defer):
    # The same Linear inside a checkpointed segment and after it: its recomputation runs inside
    # the backward pass that also records the outer use, which must not update (roll) the
    # backward state that pass is still recording: one update per step, as without checkpoint.
    torch.manual_seed(0)
    plain = te.Linear(64, 64)
    ckpt = copy.deepcopy(plain)
    r = RECIPES[rname]()

    def run(m, x, checkpointed):
        x = x.detach().requires_grad_(True)
        with te.autocast(recipe=r):
            if checkpointed:
                h = te.checkpoint(lambda t: torch.relu(m(t)), x, use_reentrant=reentrant)
            else:
                h = torch.relu(m(x))
            y = m(h)
        (y * y).sum().backward()
        grads = [p.grad.clone() for p in m.parameters()]
        m.zero_grad(set_to_none=True)
        return [y.detach(), x.grad, *grads]

    for step in range(3):
        x = torch.randn(32, 64)
        got, want = run(ckpt, x, True), run(plain, x, False)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), step
        for a, b in zip(_states(ckpt), _states(plain), strict=True):
            assert torch.equal(a, b), step


def test_a_pass_that_raised_after_its_recomputation():
    # The backward pass that ran a reentrant recomputation raises after it: later steps still
    # update once per pass, as the plain segment's do after the same failure.
    torch.manual_seed(0)
    plain = te.Linear(64, 64)
    ckpt = copy.deepcopy(plain)
    r = RECIPES["delayed"]()

    def run(m, x, checkpointed, fail):
        x = x.detach().requires_grad_(True)
        if fail:
            x.register_hook(lambda g: (_ for _ in ()).throw(RuntimeError("hook failed")))
        with te.autocast(recipe=r):
            h = te.checkpoint(lambda t: torch.relu(m(t)), x) if checkpointed else torch.relu(m(x))
            y = m(h)
        if fail:
            with pytest.raises(RuntimeError, match="hook failed"):
                (y * y).sum().backward()
        else:
            (y * y).sum().backward()
        m.zero_grad(set_to_none=True)
        return y.detach()

    for step in range(4):
        x = torch.randn(32, 64)
        assert torch.equal(run(ckpt, x, True, step == 1), run(plain, x, False, step == 1)), step
        for a, b in zip(_states(ckpt), _states(plain), strict=True):
            assert torch.equal(a, b), step
