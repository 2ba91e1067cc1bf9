"""te.autocast and DelayedScaling state: step-by-step histories and scales against NUMERICS.md's
rule computed by hand, batched updates, nesting, calibration, state_dict round trips."""

import io
import logging
import warnings

import pytest
import te_torch as te
import torch
from _module_ref import columns, hand_update, with_amax
from te_core import _C
from te_torch import _recipe_state, recipe

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
f32 = torch.float32


@pytest.mark.parametrize(("algo", "margin"), [("max", 0), ("most_recent", 0), ("max", 1)])
def test_delayed_scaling_history_and_scale_step_by_step(algo, margin):
    r = recipe.DelayedScaling(margin=margin, amax_history_len=3, amax_compute_algo=algo)
    m = te.Linear(64, 32, device="cpu")
    x_amax, w_amax, g_amax = [4.0, 1.5, 2.5], [0.5, 0.25, 0.75], [3.0, 0.125, 10.0]
    fwd_h, fwd_s = [[0.0] * 3 for _ in range(3)], [1.0] * 3
    bwd_h, bwd_s = [[0.0] * 3 for _ in range(2)], [1.0] * 2
    prev_fwd_s = [1.0] * 3
    for step in range(3):
        with torch.no_grad():
            m.weight.copy_(with_amax((32, 64), w_amax[step], 100 + step))
        x = with_amax((4, 64), x_amax[step], step).requires_grad_(True)
        used_fwd_scale = m._fwd_state.scale.clone() if step else torch.ones(3)
        with te.autocast(recipe=r):
            y = m(x)
            # inside the region: this step's amaxes are staged in row 0, nothing updated yet
            assert m._fwd_state.amax_history[0, :2].tolist() == [x_amax[step], w_amax[step]]
            assert m._fwd_state.scale.tolist() == fwd_s
        fwd_h[0][0], fwd_h[1][0] = x_amax[step], w_amax[step]
        fwd_h, fwd_s = hand_update(fwd_h, fwd_s, 448.0, margin, algo)
        assert columns(m._fwd_state.amax_history) == fwd_h
        assert m._fwd_state.scale.tolist() == fwd_s
        # step k's forward used step k-1's scale: delayed scaling really adapts across steps
        assert used_fwd_scale.tolist() == prev_fwd_s
        assert step == 0 or (used_fwd_scale[:2] != 1).all()
        qx = te.Float8Quantizer(used_fwd_scale[0:1].clone(), torch.zeros(1), E4M3)
        qw = te.Float8Quantizer(used_fwd_scale[1:2].clone(), torch.zeros(1), E4M3)
        want = qx(x.detach()).dequantize() @ qw(m.weight.detach()).dequantize().T + m.bias.detach()
        assert torch.allclose(y, want, rtol=1e-6, atol=1e-6)
        y.backward(with_amax((4, 32), g_amax[step], 50 + step))
        bwd_h[0][0] = g_amax[step]
        bwd_h, bwd_s = hand_update(bwd_h, bwd_s, 57344.0, margin, algo)
        assert columns(m._bwd_state.amax_history) == bwd_h
        assert m._bwd_state.scale.tolist() == bwd_s
        prev_fwd_s = list(fwd_s)
    assert fwd_s[2] == 1.0 and bwd_s[1] == 1.0  # roles never quantized keep their scale


def test_current_and_block_scaling_adapt_within_the_step():
    for r in (recipe.Float8CurrentScaling(), recipe.Float8BlockScaling()):
        m = te.Linear(128, 64, device="cpu")
        for amax in (1e-3, 1e3):  # no history: a tiny then a huge input both quantize well
            x = with_amax((8, 128), amax, 7)
            with te.autocast(recipe=r):
                y = m(x)
            ref = x @ m.weight.detach().T + m.bias.detach()
            assert ((y - ref).norm() / ref.norm()).item() < 0.1
        assert m._fwd_state is None  # stateless recipes keep no delayed-scaling state


def spy_updates(monkeypatch) -> list:
    """Records each delayed-scaling update call as the sizes of its groups."""
    calls = []
    real = _C.DelayedScalingUpdate

    class Spy:
        def __init__(self, groups):
            self.sizes, self.real = tuple(len(g[0]) for g in groups), real(groups)

        def __call__(self, stream=0):
            calls.append(self.sizes)
            self.real(stream)

    monkeypatch.setattr(_C, "DelayedScalingUpdate", Spy)
    monkeypatch.setattr(_recipe_state, "_PLANS", {})
    return calls


def test_one_update_call_per_step(monkeypatch):
    """Step 1: the forward states at the region's exit; the backward pass only defers its
    states; step 2's exit updates them together with its forward states, in one call."""
    calls = spy_updates(monkeypatch)
    model = torch.nn.Sequential(*(te.Linear(32, 32, device="cpu") for _ in range(3)))
    for step in range(3):
        with te.autocast(recipe=recipe.DelayedScaling()):
            y = model(torch.randn(4, 32, requires_grad=True))
        assert calls == [(3,)] + [(3, 3)] * step  # three modules' forward states, one call
        y.sum().backward()
        assert len(calls) == step + 1, "the backward pass launches nothing"
    assert model[0]._bwd_state is not None  # reading a deferred state updates it first
    assert calls == [(3,), (3, 3), (3, 3), (3,)]
    assert model[1]._bwd_state is not None
    assert len(calls) == 4, "one call updated every deferred state"


def run_steps(r, steps: int, read_each: bool) -> te.Linear:
    m = te.Linear(64, 32, device="cpu")
    with torch.no_grad():
        m.weight.copy_(with_amax((32, 64), 0.5, 100))
    for step in range(steps):
        with te.autocast(recipe=r):
            y = m(with_amax((4, 64), 1.0 + step, step).requires_grad_(True))
        y.backward(with_amax((4, 32), 2.0 ** (step - 3), 50 + step))
        if read_each:
            assert m._bwd_state is not None  # the read runs the deferred update
    return m


def test_deferred_backward_update_reads_the_same_state():
    """Three steps read after every backward pass (each update at once) and read only at the
    end (updates deferred to the next exit): the same histories and scales, bit for bit."""
    r = recipe.DelayedScaling(amax_history_len=4)
    eager, deferred = run_steps(r, 3, True), run_steps(r, 3, False)
    for st in ("_fwd_state", "_bwd_state"):
        a, b = getattr(eager, st), getattr(deferred, st)
        assert torch.equal(a.amax_history, b.amax_history), st
        assert torch.equal(a.scale, b.scale), st
    want = eager.state_dict()["_extra_state"]
    got = run_steps(r, 3, False).state_dict()["_extra_state"]  # state_dict reads it too
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_interleaved_backward_passes_update_between_them():
    """Two forwards, then their two backward passes: the second pass quantizes with the scale
    the first pass's update produced (its state was deferred, so it is updated first), and the
    history holds both passes' amaxes in order."""
    r = recipe.DelayedScaling(amax_history_len=3)
    m = te.Linear(64, 32, device="cpu")
    ys = []
    for step in range(2):
        with te.autocast(recipe=r):
            ys.append(m(with_amax((4, 64), 1.0, step).requires_grad_(True)))
    ys[0].backward(with_amax((4, 32), 4.0, 50))
    ys[1].backward(with_amax((4, 32), 2.0, 51))
    assert columns(m._bwd_state.amax_history)[0] == [0.0, 4.0, 2.0]
    assert m._bwd_state.scale[0].item() == 57344.0 / 4.0


@pytest.mark.parametrize("at_pass_end", [False, True])
def test_backward_pass_that_raised_does_not_stop_later_updates(monkeypatch, at_pass_end):
    """A backward pass that raises after te's backward ran. Deferred as they register (the
    default), its states are updated at the next region's exit like any pass's. Updated at the
    pass's end (a process group, a side stream), it never reaches its end-of-pass callback; the
    next pass must still queue its own, and its update must run."""

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a.view_as(a)

        @staticmethod
        def backward(ctx, g):
            raise ValueError("boom")

    if at_pass_end:
        monkeypatch.setattr(te._autocast, "_may_defer", lambda dev: False)
    r = recipe.DelayedScaling(amax_history_len=3)
    m = te.Linear(64, 32, device="cpu")
    x = with_amax((4, 64), 1.0, 0).requires_grad_(True)
    with te.autocast(recipe=r):
        y = m(Boom.apply(x))
    with pytest.raises(ValueError, match="boom"):
        y.backward(with_amax((4, 32), 4.0, 50))
    for step in range(2):
        with te.autocast(recipe=r):
            y = m(with_amax((4, 64), 1.0, 1 + step).requires_grad_(True))
        y.backward(with_amax((4, 32), 2.0 + step, 51 + step))
    if at_pass_end:
        # the failed pass's amax (4) stayed staged and joined the next pass's (2); then 3
        assert columns(m._bwd_state.amax_history)[0] == [0.0, 4.0, 3.0]
    else:
        # 4 updated at the first step's exit, then 2 and 3 rolled it out of the history
        assert columns(m._bwd_state.amax_history)[0] == [0.0, 2.0, 3.0]


def test_states_of_two_devices_update_in_a_call_each(monkeypatch):
    """One update call reaches one device: states registered under keys of two devices (a CPU
    module and a CUDA one in one process) are updated by one call per device."""
    calls = []

    class Spy:
        def __init__(self, groups):
            self.sizes = tuple(len(g[0]) for g in groups)

        def __call__(self, stream=0):
            calls.append(self.sizes)

    monkeypatch.setattr(_C, "DelayedScalingUpdate", Spy)
    monkeypatch.setattr(_recipe_state, "_PLANS", {})
    r = recipe.DelayedScaling()
    cpu, other = torch.device("cpu"), torch.device("meta")  # the key's device is what counts
    states = [_recipe_state.DelayedState(4, 3, cpu) for _ in range(4)]
    fwd_cpu = _recipe_state.recipe_key(r, False, None, cpu)
    entries = [
        (fwd_cpu, r, states[0]),
        (_recipe_state.recipe_key(r, True, None, other), r, states[2]),
        (fwd_cpu, r, states[1]),
        (_recipe_state.recipe_key(r, False, None, other), r, states[3]),
        (fwd_cpu, r, states[0]),  # a state used twice is updated once
    ]
    _recipe_state.run_updates(entries)
    assert calls == [(2,), (1, 1)]


def test_pending_update_refused_during_capture(monkeypatch):
    """A deferred update reached during CUDA-graph capture would be replayed with the graph:
    RuntimeError saying what to do, and the update stays pending."""
    r = recipe.DelayedScaling()
    st = _recipe_state.DelayedState(4, 2, torch.device("cpu"))
    key = _recipe_state.recipe_key(r, True, None, torch.device("cuda", 0))
    monkeypatch.setattr(te._autocast.STATE, "deferred", [(key, r, st)])
    monkeypatch.setattr(te._autocast, "_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="run a warmup step on the capture's side stream first"):
        te._autocast.flush_deferred()
    assert te._autocast.STATE.deferred


@pytest.mark.parametrize("why", ["collective", "side stream"])
def test_backward_update_at_pass_end_where_it_must(monkeypatch, why):
    """Amaxes all-reduced across ranks, or a pass ending on a CUDA side stream (graph capture,
    its warmup): the backward states are updated when the pass ends, not deferred."""
    calls = spy_updates(monkeypatch)
    if why == "collective":
        monkeypatch.setattr(te._autocast, "dist_initialized", lambda: True)
        monkeypatch.setattr(te._autocast, "needs_collective", lambda plan: True)
    else:  # a CPU key has no stream: both stream checks made to answer as a CUDA side stream's
        monkeypatch.setattr(te._autocast, "_on_default_stream", lambda dev: False)
        monkeypatch.setattr(te._autocast, "_on_default_streams", lambda plan: False)
    m = te.Linear(32, 32, device="cpu")
    with te.autocast(recipe=recipe.DelayedScaling()):
        y = m(torch.randn(4, 32, requires_grad=True))
    y.sum().backward()
    assert calls == [(1,), (1,)]
    assert not te._autocast.STATE.deferred


@pytest.mark.parametrize("at_pass_end", [False, True])
def test_backward_pass_queues_a_callback_only_where_it_must(monkeypatch, at_pass_end):
    """On the default stream without a process group a backward pass defers its states as they
    register, with no end-of-pass callback; otherwise one callback per pass, not per state."""
    ends = []
    real = te._autocast._end_backward
    monkeypatch.setattr(te._autocast, "_end_backward", lambda: (ends.append(1), real())[1])
    if at_pass_end:
        monkeypatch.setattr(te._autocast, "dist_initialized", lambda: True)
    model = torch.nn.Sequential(te.Linear(32, 32, device="cpu"), te.Linear(32, 32, device="cpu"))
    for step in range(2):
        with te.autocast(recipe=recipe.DelayedScaling()):
            y = model(torch.randn(4, 32, requires_grad=True))
        y.sum().backward()
        assert len(te._autocast.STATE.deferred) == 2  # both states await the next exit
        assert len(ends) == (step + 1 if at_pass_end else 0)


def test_module_used_twice_max_accumulates_amax():
    r = recipe.DelayedScaling(amax_history_len=2)
    m = te.Linear(32, 16, device="cpu")
    with te.autocast(recipe=r):
        a = m(with_amax((4, 32), 2.0, 0))
        b = m(with_amax((4, 32), 5.0, 1))
        c = m(with_amax((4, 32), 3.0, 2))
    assert m._fwd_state.amax_history[:, 0].tolist() == [0.0, 5.0]  # the step's true max
    assert m._fwd_state.scale[0].item() == pytest.approx(448.0 / 5.0)
    (a.sum() + b.sum() + c.sum()).backward()  # backward of all three uses, one update
    assert m._bwd_state.amax_history[1, 0].item() == 1.0


def test_nested_regions_and_single_update_at_outermost_exit():
    m = te.Linear(32, 16, device="cpu")
    x = torch.randn(4, 32)
    ref = x @ m.weight.detach().T + m.bias.detach()
    with te.autocast(recipe=recipe.DelayedScaling(amax_history_len=2)):
        with te.autocast(enabled=False):
            assert torch.equal(m(x), ref)  # inner region: high precision
            assert not te._autocast.is_fp8_enabled()
        assert te._autocast.is_fp8_enabled()
        with te.autocast(recipe=recipe.DelayedScaling(amax_history_len=2)):
            y = m(x)
        assert m._fwd_state.amax_history[0, 0].item() == x.abs().max().item()  # not updated yet
        assert not torch.equal(y, ref)
    assert m._fwd_state.amax_history[0, 0].item() == 0.0  # updated at the outermost exit
    assert m._fwd_state.amax_history[1, 0].item() == x.abs().max().item()
    assert not te._autocast.is_fp8_enabled() and te._autocast.get_fp8_recipe() is None


def test_same_instance_cannot_be_entered_twice():
    ctx = te.autocast(recipe=recipe.Float8CurrentScaling())
    with ctx:
        with pytest.raises(RuntimeError, match="already active; nest a new te.autocast"):
            ctx.__enter__()
    with ctx:  # but it can be reused after it exited
        pass


def test_fp8_autocast_alias_with_te_argument_names():
    m = te.Linear(32, 16, device="cpu")
    x = torch.randn(4, 32)
    r = recipe.DelayedScaling()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with te.fp8_autocast(enabled=True, fp8_recipe=r, fp8_group=None):
            y = m(x)
    assert any(issubclass(i.category, DeprecationWarning) for i in w)
    # updated on exit: the step's amax rolled to the end of the 1024-long history
    assert m._fwd_state.amax_history[-1, 0].item() == x.abs().max().item()
    assert m._fwd_state.scale[0].item() == pytest.approx(448.0 / x.abs().max().item())
    assert y.shape == (4, 16)


def test_calibrating_runs_high_precision_and_records_amax():
    m = te.Linear(32, 16, device="cpu")
    x = with_amax((4, 32), 6.0, 3)
    r = recipe.DelayedScaling(amax_history_len=4)
    with te.autocast(enabled=False, calibrating=True, recipe=r):
        y = m(x)
    assert torch.equal(y, x @ m.weight.detach().T + m.bias.detach())
    w_amax = m.weight.detach().abs().max().item()
    assert m._fwd_state.amax_history[:, :2].tolist() == [[0, 0], [0, 0], [0, 0], [6.0, w_amax]]
    assert m._fwd_state.scale[:2].tolist() == [
        (torch.tensor(448.0) / torch.tensor(6.0)).item(),
        (torch.tensor(448.0) / torch.tensor(w_amax)).item(),
    ]


def test_callable_amax_and_scale_algorithms():
    r = recipe.DelayedScaling(
        amax_history_len=2,
        amax_compute_algo=lambda h: h.amax(dim=0) * 2,
        scaling_factor_compute_algo=lambda amax, scale, fp8_max, rec: torch.where(
            amax > 0, fp8_max / amax, scale
        ),
    )
    m = te.Linear(32, 16, device="cpu")
    with te.autocast(recipe=r):
        m(with_amax((4, 32), 7.0, 0))
    assert m._fwd_state.scale[0].item() == pytest.approx(448.0 / 14.0)
    assert m._fwd_state.amax_history[:, 0].tolist() == [0.0, 7.0]


def _train_steps(m, steps, seed, r=None):
    r = recipe.DelayedScaling(amax_history_len=4) if r is None else r
    outs = []
    for s in range(steps):
        g = torch.Generator().manual_seed(seed + s)
        x = torch.randn(8, 64, generator=g).requires_grad_(True)
        with te.autocast(recipe=r):
            y = m(x)
        y.backward(torch.randn(8, 32, generator=g))
        outs.append((y.detach(), x.grad, m.weight.grad.clone()))
        m.weight.grad = m.bias.grad = None
    return outs


def test_state_dict_round_trip_reproduces_next_step_bit_for_bit(tmp_path):
    torch.manual_seed(0)
    a = te.Linear(64, 32, device="cpu")
    _train_steps(a, 2, seed=10)
    sd = a.state_dict()
    assert set(sd["_extra_state"]) == {"fwd_amax_history", "fwd_scale", "bwd_amax_history", "bwd_scale"}
    path = tmp_path / "linear.pt"
    torch.save(sd, path)
    loaded = torch.load(path, weights_only=True)  # plain tensors only, no pickled objects
    b = te.Linear(64, 32, device="cpu")
    b.load_state_dict(loaded)
    assert torch.equal(b._fwd_state.amax_history, a._fwd_state.amax_history)
    ((ya, dxa, dwa),) = _train_steps(a, 1, seed=20)
    ((yb, dxb, dwb),) = _train_steps(b, 1, seed=20)
    assert torch.equal(ya, yb) and torch.equal(dxa, dxb) and torch.equal(dwa, dwb)
    for sa, sb in ((a._fwd_state, b._fwd_state), (a._bwd_state, b._bwd_state)):
        assert torch.equal(sa.amax_history, sb.amax_history) and torch.equal(sa.scale, sb.scale)
    # a fresh module's state_dict (no delayed state yet) round-trips too
    buf = io.BytesIO()
    torch.save(te.Linear(8, 8, device="cpu").state_dict(), buf)
    buf.seek(0)
    c = te.Linear(8, 8, device="cpu")
    c.load_state_dict(torch.load(buf, weights_only=True))
    assert c._fwd_state is None


def test_checkpoint_without_extra_state_loads_strictly_as_no_scaling_state(caplog):
    """torch's nn.Linear checkpoint (weight, bias) loads into te.Linear with strict=True, and a
    te checkpoint whose _extra_state was dropped into any te module: the missing key means no
    DelayedScaling state (a trained module's is reset), said once at INFO."""
    from te_torch import _info_once

    _info_once.told.discard("no _extra_state")
    torch.manual_seed(0)
    ref = torch.nn.Linear(64, 32)
    a = te.Linear(64, 32, device="cpu")
    _train_steps(a, 2, seed=10)
    assert a.state_dict()["_extra_state"]
    with caplog.at_level(logging.INFO, logger="te"):
        result = a.load_state_dict(ref.state_dict())
        mlp = te.LayerNormMLP(64, 128, device="cpu")
        with te.autocast(recipe=recipe.DelayedScaling(amax_history_len=4)):
            mlp(torch.randn(8, 64, requires_grad=True)).sum().backward()
        assert mlp.state_dict()["_extra_state"]
        sd = {k: v for k, v in mlp.state_dict().items() if k != "_extra_state"}
        mlp.load_state_dict(sd)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(a.weight, ref.weight) and torch.equal(a.bias, ref.bias)
    assert a.state_dict()["_extra_state"] == {} and mlp.state_dict()["_extra_state"] == {}
    said = [r.getMessage() for r in caplog.records if "no '_extra_state'" in r.getMessage()]
    assert len(said) == 1 and "te.Linear.load_state_dict" in said[0], said
    # the reloaded module steps as a fresh te.Linear holding torch's weights does
    b = te.Linear(64, 32, device="cpu")
    with torch.no_grad():
        b.weight.copy_(ref.weight)
        b.bias.copy_(ref.bias)
    for got, want in zip(_train_steps(a, 1, seed=20)[0], _train_steps(b, 1, seed=20)[0], strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["delayed", "current"])
def test_whole_module_pickles_after_a_quantized_step(name):
    """torch.save(module) (and pickle) failed once a module had run quantized: its FP8Context
    and delayed-scaling state hold te_core._C descriptors. Now the state travels, the context is
    rebuilt, and the copy's next step is the original's bit for bit."""
    r = {"delayed": recipe.DelayedScaling, "current": recipe.Float8CurrentScaling}[name]
    torch.manual_seed(0)
    a = te.Linear(64, 32, device="cpu")
    _train_steps(a, 2, seed=10, r=r())
    buf = io.BytesIO()
    torch.save(a, buf)
    buf.seek(0)
    b = torch.load(buf, weights_only=False)
    ((ya, dxa, dwa),) = _train_steps(a, 1, seed=20, r=r())
    ((yb, dxb, dwb),) = _train_steps(b, 1, seed=20, r=r())
    assert torch.equal(ya, yb) and torch.equal(dxa, dxb) and torch.equal(dwa, dwb)


def test_adjust_amax_history_length_checks_length():
    m = te.Linear(64, 32, device="cpu")
    _train_steps(m, 1, seed=1)
    for bad in (0, -3, 4.5, True):
        with pytest.raises(
            ValueError, match=rf"Linear.adjust_amax_history_length: length: expected an int >= 1, got {bad}"
        ):
            m.adjust_amax_history_length(bad)
    m.adjust_amax_history_length(8)
    assert m._fwd_state.amax_history.shape == (8, 3)


@pytest.mark.parametrize(
    "key, value, match",
    [
        (
            "fwd_amax_history",
            torch.zeros(5, 7),
            r"\['fwd_amax_history'\]: expected a float tensor "
            r"\[amax_history_len, 3\], got Tensor torch.float32 \[5, 7\]",
        ),
        ("bwd_scale", torch.ones(3), r"\['bwd_scale'\]: expected a float tensor \[2\], got .*\[3\]"),
        ("fwd_scale", 1.0, r"\['fwd_scale'\]: expected a float tensor \[3\], got 1.0"),
        ("fwd_scale", torch.zeros(3), r"\['fwd_scale'\]: expected finite scales > 0, got \[0.0, 0.0, 0.0\]"),
        (
            "fwd_scale",
            torch.full((3,), float("nan")),
            r"\[.fwd_scale.\]: expected finite scales > 0, got \[nan, nan, nan\]",
        ),
    ],
)
def test_bad_extra_state_is_named_and_loads_nothing(key, value, match):
    """A wrong-shape _extra_state entry was a broadcasting error from copy_; a zero or NaN scale
    loaded silently and made the next step's output all NaN."""
    a = te.Linear(64, 32, device="cpu")
    _train_steps(a, 1, seed=1)
    sd = a.state_dict()
    b = te.Linear(64, 32, device="cpu")
    _train_steps(b, 1, seed=2)
    before = b.state_dict()["_extra_state"]
    with pytest.raises(ValueError, match=f"te.Linear: _extra_state{match}"):
        b.load_state_dict({**sd, "_extra_state": {**sd["_extra_state"], key: value}})
    after = b.state_dict()["_extra_state"]
    assert all(torch.equal(before[k], after[k]) for k in before)  # checked before anything is replaced


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="what a machine without a GPU reports: tests/gpu/test_torch_linear.py checks a GPU's",
)
def test_availability_and_default_recipe_on_cpu():
    ok, why = te.is_fp8_available(return_reason=True)
    assert ok is True and "CPU emulation" in why
    assert te.is_fp8_block_scaling_available() is True
    for fn, fmt in ((te.is_mxfp8_available, "MXFP8"), (te.is_nvfp4_available, "NVFP4")):
        ok, why = fn(return_reason=True)
        assert ok is True and fn() is True
        assert why.startswith("CPU emulation") and f"each {fmt} GEMM by dequantizing" in why
    r, why = te.get_default_recipe(return_reason=True)
    assert isinstance(r, recipe.Float8CurrentScaling) and "CPU" in why
    m = te.Linear(128, 32, device="cpu")
    x = torch.randn(4, 128)
    with te.autocast():
        y = m(x)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        assert torch.equal(m(x), y)


_REDUCE_SCRIPT = """
import sys, torch, torch.distributed as dist, te_torch as te
rank, path = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=2)
torch.manual_seed(0)
m = te.Linear(16, 16, device="cpu")
x = torch.full((2, 16), 1.0 + 3.0 * rank)  # amax 1 on rank 0, 4 on rank 1
with te.autocast(recipe=te.recipe.DelayedScaling(amax_history_len=2)):
    y = m(x)
# the backward update all-reduces too, so it runs at the pass's end (not deferred)
y.backward(torch.full((2, 16), 2.0 + 6.0 * rank))  # amax 2 on rank 0, 8 on rank 1
assert not te._autocast.STATE.deferred and te._recipe_state.dist_initialized()
f, b = m._fwd_state, m._bwd_state
print(f.amax_history[1, 0].item(), f.scale[0].item(), b.amax_history[1, 0].item(), b.scale[0].item())
dist.destroy_process_group()
assert not te._recipe_state.dist_initialized()
"""


def test_amax_reduction_over_gloo_group(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "reduce.py"
    script.write_text(_REDUCE_SCRIPT)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(tmp_path / "rdzv")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        for rank in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        amax, scale, g_amax, g_scale = map(float, out.split())
        assert amax == 4.0 and scale == 448.0 / 4.0  # both ranks: the max over the group
        assert g_amax == 8.0 and g_scale == 57344.0 / 8.0  # HYBRID: E5M2 gradients


def _step(m, r, x, dy):
    with te.autocast(recipe=r):
        y = m(x)
    y.backward(dy)
    return y.detach(), x.grad.clone(), m.weight.grad.clone()


def _pair(seed=0):
    torch.manual_seed(seed)
    a = te.Linear(64, 32, device="cpu")
    b = te.Linear(64, 32, device="cpu")
    b.load_state_dict(a.state_dict())
    return a, b


def test_a_new_equal_recipe_each_step_keeps_the_context_and_the_numbers():
    # te.autocast(recipe=DelayedScaling()) written inside the loop: an equal recipe per step
    a, b = _pair()
    shared = recipe.DelayedScaling(amax_history_len=4)
    contexts = set()
    for step in range(3):
        x = with_amax((8, 64), 2.0 + step, step).requires_grad_(True)
        dy = with_amax((8, 32), 1.0 + step, 10 + step)
        want = _step(a, shared, x, dy)
        x.grad = None
        got = _step(b, recipe.DelayedScaling(amax_history_len=4), x, dy)
        contexts.add(id(b._gemm.ctx))
        for w, g in zip(want, got, strict=True):
            assert torch.equal(w, g)
        assert torch.equal(a._fwd_state.amax_history, b._fwd_state.amax_history)
        assert torch.equal(a._bwd_state.scale, b._bwd_state.scale)
    assert len(contexts) == 1


def test_a_recipe_changed_in_place_takes_effect_at_the_next_call():
    # HYBRID -> E4M3 gradients on the same recipe object must not keep the E5M2 quantizers
    r = recipe.Float8CurrentScaling()
    a, b = _pair(1)
    x = torch.randn(8, 64, requires_grad=True)
    dy = torch.randn(8, 32)
    _step(a, r, x, dy)
    r.fp8_format = recipe.Format.E4M3
    assert a._gemm.ctx.fields != te._gemm_state.recipe_fields(r)
    x.grad = None
    a.zero_grad()
    got = _step(a, r, x, dy)
    x.grad = None
    want = _step(b, recipe.Float8CurrentScaling(fp8_format=recipe.Format.E4M3), x, dy)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)
    assert a._gemm.ctx.g_q[3].dtype == E4M3


def test_an_invalid_assignment_leaves_the_recipe_and_its_generation_unchanged():
    r = recipe.DelayedScaling()
    gen = r._generation
    with pytest.raises(ValueError):
        r.amax_history_len = 0
    assert r._generation == gen and r.amax_history_len == 1024
    r.margin = 1
    assert r._generation == gen + 1
