"""te.GroupedLinear and te.Fp8Padding / te.Fp8Unpadding on CPU.

Each group's rows through GroupedLinear give the bits of the same rows through a te.Linear of that
group's weight and bias (te.Linear's numerics are checked against the emulated and fp32
references in test_linear.py), under every recipe and in high precision, forward and backward;
against the fp32 per-group reference loosely; each GEMM's own DelayedScaling state; an empty
group; caching, main_grad, return_bias, TE's parameter names and tensor-parallel sizes,
state_dict, torch.compile, and the errors."""

from __future__ import annotations

import copy
import io
import logging

import pytest
import te_torch as te
import torch
import torch.nn.functional as F
from _module_ref import RECIPES, rel
from te_torch import recipe
from te_torch._info_once import told

SPLITS = [37, 0, 21, 64]  # an empty group, and rows that per-tensor FP8 pads inside (make's 4 GEMMs)
K, N = 160, 96


def make(num_gemms=4, dtype=torch.float32, **kw):
    torch.manual_seed(0)
    m = te.GroupedLinear(num_gemms, K, N, params_dtype=dtype, device="cpu", **kw)
    with torch.no_grad():
        for i in range(num_gemms):
            b = getattr(m, f"bias{i}")
            if b is not None:
                b.normal_(0, 0.5)
    return m


def per_group_linears(m) -> list:
    """One te.Linear per group holding that group's weight and bias (copies)."""
    out = []
    for i in range(m.num_gemms):
        w, b = getattr(m, f"weight{i}"), getattr(m, f"bias{i}")
        lin = te.Linear(K, N, bias=b is not None, params_dtype=w.dtype, device="cpu")
        with torch.no_grad():
            lin.weight.copy_(w)
            if b is not None:
                lin.bias.copy_(b)
        out.append(lin)
    return out


def grouped_step(m, x, dy, splits, r):
    x = x.detach().clone().requires_grad_(True)
    with te.autocast(enabled=r is not None, recipe=r):
        y = m(x, splits)
    y.backward(dy)
    grads = [p.grad for p in m.parameters()]
    return [y.detach(), x.grad, *grads]


def linears_step(lins, x, dy, splits, r):
    """The same step with each group through its own te.Linear."""
    xs = [c.detach().clone().requires_grad_(True) for c in torch.split(x, splits)]
    with te.autocast(enabled=r is not None, recipe=r):
        ys = [lin(c) for lin, c in zip(lins, xs, strict=True)]
    torch.autograd.backward(ys, list(torch.split(dy, splits)))
    grads = [g for lin in lins for g in (lin.weight.grad, lin.bias.grad)]
    zero = [torch.zeros_like(p) for lin in lins for p in lin.parameters()]
    # te.Linear on 0 rows returns no gradient at all; GroupedLinear's are zeros
    grads = [z if g is None else g for g, z in zip(grads, zero, strict=True)]
    return [torch.cat([y.detach() for y in ys]), torch.cat([c.grad for c in xs]), *grads]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", [None, *RECIPES])
def test_each_group_is_its_own_te_linear_bit_for_bit(name, dtype):
    r = None if name is None else RECIPES[name]()
    m = make(dtype=dtype)
    lins = per_group_linears(m)
    rows = sum(SPLITS)
    torch.manual_seed(1)
    for step in range(2):  # delayed scaling: the second step runs on the first one's scales
        x = torch.randn(rows, K, dtype=dtype) * (1 + step)
        dy = torch.randn(rows, N, dtype=dtype)
        m.zero_grad(set_to_none=True)
        for lin in lins:
            lin.zero_grad(set_to_none=True)
        got = grouped_step(m, x, dy, SPLITS, r)
        want = linears_step(lins, x, dy, SPLITS, r)
        names = ["y", "dx", *(f"d{n}" for n, _ in m.named_parameters())]
        for g, w, what in zip(got, want, names, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape, what
            assert torch.equal(g, w), (name, step, what, (g.float() - w.float()).abs().max())
    if r is not None and r.delayed():
        for i, lin in enumerate(lins):
            g = m._gemm_states[i]
            if SPLITS[i]:
                assert torch.equal(g.fwd.amax_history, lin._fwd_state.amax_history), i
                assert torch.equal(g.bwd.scale, lin._bwd_state.scale), i


@pytest.mark.parametrize("name", list(RECIPES))
def test_against_the_fp32_reference(name):
    r = RECIPES[name]()
    m = make(dtype=torch.bfloat16)
    torch.manual_seed(2)
    x = torch.randn(2, sum(SPLITS) // 2, K, dtype=torch.bfloat16)  # leading dims flattened
    dy = torch.randn(*x.shape[:-1], N, dtype=torch.bfloat16)
    y, dx, *grads = grouped_step(m, x, dy, SPLITS, r)
    assert y.shape == (*x.shape[:-1], N)
    xf, dyf = x.float().reshape(-1, K), dy.float().reshape(-1, N)
    ys, dxs = [], []
    for i, (xc, dc) in enumerate(zip(torch.split(xf, SPLITS), torch.split(dyf, SPLITS), strict=True)):
        w, b = getattr(m, f"weight{i}").detach().float(), getattr(m, f"bias{i}").detach().float()
        ys.append(F.linear(xc, w, b))
        dxs.append(dc @ w)
        dw, db = grads[2 * i], grads[2 * i + 1]
        if SPLITS[i] == 0:
            assert not dw.any() and not db.any(), "an empty group's gradients are zeros"
            continue
        assert rel(dw, dc.T @ xc) <= 0.2, (i, rel(dw, dc.T @ xc))
        assert rel(db, dc.sum(0)) <= 1e-2, i
    yf = torch.cat(ys)
    assert rel(y.reshape(-1, N), yf) <= 0.1
    assert rel(y.reshape(-1, N), yf) > 1e-4  # it really was quantized
    assert rel(dx.reshape(-1, K), torch.cat(dxs)) <= 0.2


def test_each_gemm_keeps_its_own_delayed_state():
    """Group i's input amax lands in GEMM i's forward history (column 0; the last row after the
    exit's update rolled it), its weight's in column 1; the groups' scales differ because their
    inputs do."""
    m = make(num_gemms=3)
    splits = [16, 32, 16]
    x = torch.cat([torch.randn(n, K) * s for n, s in zip(splits, (1.0, 5.0, 0.25), strict=True)])
    with te.autocast(recipe=recipe.DelayedScaling(amax_history_len=4)):
        y = m(x, splits)
    y.sum().backward()
    for i, c in enumerate(torch.split(x, splits)):
        hist = m._gemm_states[i].fwd.amax_history
        assert hist[-1, 0].item() == c.abs().max().item(), i
        assert hist[-1, 1].item() == getattr(m, f"weight{i}").detach().abs().max().item(), i
    assert len({m._gemm_states[i].fwd.scale[0].item() for i in range(3)}) == 3


def test_state_dict_round_trip_steps_bit_for_bit_and_loads_weights_only():
    r = recipe.DelayedScaling(amax_history_len=4)
    a = make(num_gemms=2)
    torch.manual_seed(3)
    splits = [24, 40]
    x, dy = torch.randn(64, K), torch.randn(64, N)
    grouped_step(a, x, dy, splits, r)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    assert sorted(sd) == ["_extra_state", "bias0", "bias1", "weight0", "weight1"]
    assert set(sd["_extra_state"]) == {"gemm0", "gemm1"}
    b = make(num_gemms=2)
    b.load_state_dict(sd)
    a.zero_grad(set_to_none=True)
    for got, want in zip(
        grouped_step(b, x * 3, dy, splits, r), grouped_step(a, x * 3, dy, splits, r), strict=True
    ):
        assert torch.equal(got, want)


def test_is_first_microbatch_caches_each_weight():
    r = recipe.Float8CurrentScaling()
    m = make(num_gemms=2)
    splits = [16, 16]
    x = torch.randn(32, K)
    with te.autocast(recipe=r):
        first = m(x, splits, is_first_microbatch=True)
        with torch.no_grad():
            m.weight0.mul_(2)
            m.weight1.mul_(2)
        cached = m(x, splits, is_first_microbatch=False)
        fresh = m(x, splits, is_first_microbatch=None)
    assert torch.equal(first, cached)
    assert not torch.equal(first, fresh)


def test_fuse_wgrad_accumulation_into_each_main_grad():
    m = make(num_gemms=2, fuse_wgrad_accumulation=True)
    splits = [16, 0]
    for i in range(2):
        getattr(m, f"weight{i}").main_grad = torch.full((N, K), 0.5)
    x, dy = torch.randn(16, K), torch.randn(16, N)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        y = m(x, splits)
    y.backward(dy)
    ref = [dy.T @ x, torch.zeros(N, K)]
    for i in range(2):
        w = getattr(m, f"weight{i}")
        assert w.grad is None
        assert (
            rel(w.main_grad - 0.5, ref[i]) <= 0.2
            if splits[i]
            else torch.equal(w.main_grad, torch.full((N, K), 0.5))
        )


def test_return_bias_and_a_row_split_add_the_biases_outside():
    splits = [8, 24]
    x = torch.randn(32, K)
    plain = make(num_gemms=2)
    y = plain(x, splits)
    rb = make(num_gemms=2, return_bias=True)
    out, biases = rb(x, splits)
    assert [b is getattr(rb, f"bias{i}") for i, b in enumerate(biases)] == [True, True]
    added = torch.cat([o + b for o, b in zip(torch.split(out, splits), biases, strict=True)])
    torch.testing.assert_close(added, y)
    nob = te.GroupedLinear(2, K, N, bias=False, device="cpu")
    assert nob.bias0 is None and nob.bias1 is None and len(list(nob.parameters())) == 2


def test_te_parameter_names_defaults_and_tensor_parallel_sizes():
    m = te.GroupedLinear(3, 64, 32, device="cpu")
    assert [n for n, _ in m.named_parameters()] == [
        "weight0",
        "bias0",
        "weight1",
        "bias1",
        "weight2",
        "bias2",
    ]
    assert m.weight0.dtype == torch.get_default_dtype() and not m.bias1.any()
    assert 0.015 < m.weight2.std().item() < 0.031  # TE's normal(0, 0.023)
    col = te.GroupedLinear(2, 64, 32, parallel_mode="column", tp_size=2, device="cpu")
    assert col.out_features == 16 and col.weight1.shape == (16, 64) and col.bias0.shape == (16,)
    assert col.weight0.tensor_model_parallel and col.weight0.partition_dim == 0
    row = te.GroupedLinear(2, 64, 32, parallel_mode="row", tp_size=2, device="cpu")
    assert row.in_features == 32 and row.weight0.shape == (32, 32) and row.weight1.partition_dim == 1
    x = torch.randn(10, 32)
    y = row(x, [4, 6])  # no collective: the rank's partial product plus its (whole) bias
    want = torch.cat(
        [
            F.linear(c, getattr(row, f"weight{i}"), getattr(row, f"bias{i}"))
            for i, c in enumerate(x.split([4, 6]))
        ]
    )
    torch.testing.assert_close(y, want)


def test_quantized_model_init_holds_fp8_weights_and_runs():
    with te.quantized_model_init(recipe=recipe.Float8CurrentScaling()):
        m = te.GroupedLinear(2, 64, 32, device="cpu")
    assert isinstance(m.weight0, te.Float8Tensor) and isinstance(m.weight1, te.Float8Tensor)
    x = torch.randn(32, 64, requires_grad=True)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        y = m(x, [16, 16])
    y.sum().backward()
    ref = torch.cat(
        [F.linear(c, getattr(m, f"weight{i}").dequantize()) for i, c in enumerate(x.detach().split(16))]
    )
    assert rel(y.detach(), ref) <= 0.1 and x.grad is not None


@pytest.mark.parametrize("name", ["current", "block"])
def test_compile_fullgraph_matches_eager(name):
    r = RECIPES[name]()
    m = make(num_gemms=2)
    x = torch.randn(48, K)
    splits = [16, 32]

    def step(x):
        with te.autocast(recipe=r):
            return m(x, splits)

    eager = step(x)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(compiled, eager)


def test_m_splits_as_a_tensor():
    m = make(num_gemms=2)
    x = torch.randn(20, K)
    torch.testing.assert_close(m(x, torch.tensor([5, 15])), m(x, [5, 15]), rtol=0, atol=0)


@pytest.mark.parametrize(
    "call, err, match",
    [
        (lambda m: m(torch.randn(8, K), [8]), ValueError, "m_splits: expected 2 sizes"),
        (lambda m: m(torch.randn(8, K), [4, 5]), ValueError, r"sum to 9, expected the input's rows .* = 8"),
        (lambda m: m(torch.randn(8, K), [10, -2]), ValueError, r"m_splits\[1\]: expected an int >= 0"),
        (lambda m: m(torch.randn(8, K), [4.0, 4]), ValueError, r"m_splits\[0\]"),
        (lambda m: m(torch.randn(8, K), 8), TypeError, "m_splits: expected a list of ints"),
        (lambda m: m(torch.randn(8, K), torch.tensor([4.0, 4.0])), TypeError, "integer tensor"),
        (lambda m: m(torch.randn(8, K + 1), [4, 4]), ValueError, f"in_features={K}"),
        (lambda m: m(torch.randn(8, K).double(), [4, 4]), TypeError, "float32, bfloat16 or float16"),
    ],
)
def test_bad_inputs_are_named(call, err, match):
    with pytest.raises(err, match=match):
        call(make(num_gemms=2))


def test_mxfp8_needs_each_group_aligned_and_fp8_padding_provides_it():
    m = make(num_gemms=2)
    splits = [20, 44]
    x = torch.randn(64, K)
    r = recipe.MXFP8BlockScaling()
    with te.autocast(recipe=r), pytest.raises(ValueError, match=r"GEMM 0, m_splits\[0\]=20.*multiple of 32"):
        m(x, splits)
    pad, unpad = te.Fp8Padding(2), te.Fp8Unpadding(2)
    with te.autocast(recipe=r):
        xp, padded = pad(x, splits)
        y = unpad(m(xp, padded), splits)
    assert padded == [32, 64]
    ref = torch.cat(
        [F.linear(c, getattr(m, f"weight{i}"), getattr(m, f"bias{i}")) for i, c in enumerate(x.split(splits))]
    )
    assert y.shape == (64, N) and rel(y.detach(), ref) <= 0.1


@pytest.mark.parametrize(
    "kw, err",
    [
        ({"single_grouped_weight": True}, NotImplementedError),
        ({"save_original_input": True}, NotImplementedError),
        ({"bogus": 1}, TypeError),
    ],
)
def test_unimplemented_and_unknown_options_are_named(kw, err):
    with pytest.raises(err, match=next(iter(kw))):
        te.GroupedLinear(2, 16, 16, device="cpu", **kw)


def test_use_grouped_tensor_is_accepted_and_said_once(caplog):
    told.discard("GroupedLinear use_grouped_tensor")
    with caplog.at_level(logging.INFO, logger="te"):
        te.GroupedLinear(2, 16, 16, device="cpu", use_grouped_tensor=True)
        te.GroupedLinear(2, 16, 16, device="cpu", use_grouped_tensor=True)
    said = [r for r in caplog.records if "use_grouped_tensor" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO


# -- Fp8Padding / Fp8Unpadding ------------------------------------------------------------------


@pytest.mark.parametrize(
    "r, align",
    [
        (None, 16),
        (recipe.Float8CurrentScaling(), 16),
        (recipe.MXFP8BlockScaling(), 32),
        (recipe.NVFP4BlockScaling(), 128),
    ],
)
def test_padding_aligns_each_group_to_the_recipe_and_unpadding_undoes_it(r, align):
    splits = [5, 0, 33, 16]
    x = torch.randn(sum(splits), 8, requires_grad=True)
    with te.autocast(enabled=r is not None, recipe=r):
        xp, padded = te.Fp8Padding(4)(x, splits)
        back = te.Fp8Unpadding(4)(xp, splits)
    assert padded == [-(-m // align) * align for m in splits]
    start = 0
    for c, m, p in zip(torch.split(xp.detach(), padded), splits, padded, strict=True):
        assert torch.equal(c[:m], x.detach()[start : start + m]) and not c[m:p].any()
        start += m
    assert torch.equal(back, x)
    g = torch.randn_like(back)
    back.backward(g)
    assert torch.equal(x.grad, g)


def test_padding_passes_aligned_groups_through_and_checks_sizes():
    x = torch.randn(48, 8)
    xp, padded = te.Fp8Padding(2, align_size=16)(x, [16, 32])
    assert xp.data_ptr() == x.data_ptr() and xp.shape == x.shape and padded == [16, 32]  # no copy
    with pytest.raises(ValueError, match=r"inp has 40 rows, expected 48"):
        te.Fp8Unpadding(2, align_size=16)(torch.randn(40, 8), [10, 20])
    with pytest.raises(ValueError, match="align_size"):
        te.Fp8Padding(2, align_size=0)


def test_deepcopy_keeps_each_gemm_state():
    m = make(num_gemms=2)
    with te.autocast(recipe=recipe.DelayedScaling()):
        m(torch.randn(32, K), [16, 16]).sum().backward()
    c = copy.deepcopy(m)
    for a, b in zip(m._gemm_states, c._gemm_states, strict=True):
        assert torch.equal(a.fwd.amax_history, b.fwd.amax_history)
        assert a.fwd.amax_history.data_ptr() != b.fwd.amax_history.data_ptr()


@pytest.mark.parametrize("name", ["delayed", "current"])
def test_eager_steps_run_in_one_function_with_the_per_group_numbers(name):
    """Eagerly under the per-tensor and block recipes the groups run in one GroupedStepFn (one
    autograd node, rows written in place); torch.compile's trace runs group by group, so the
    compiled step is the per-group path: both give the same bits, forward and backward."""
    r = RECIPES[name]()
    m = make()
    m2, m3 = copy.deepcopy(m), copy.deepcopy(m)  # delayed scaling: each run from the same state
    x = torch.randn(sum(SPLITS), K)
    dy = torch.randn(sum(SPLITS), N)

    def step(x, m):
        with te.autocast(recipe=r):
            return m(x, SPLITS)

    xe = x.clone().requires_grad_(True)
    ye = step(xe, m)
    assert type(ye.grad_fn).__name__ == "GroupedStepFnBackward"
    ye.backward(dy)
    eager = [ye.detach(), xe.grad, *(p.grad for p in m.parameters())]
    xc = x.clone().requires_grad_(True)
    yc = torch.compile(step, backend="aot_eager")(xc, m2)
    yc.backward(dy)
    traced = [yc.detach(), xc.grad, *(p.grad for p in m2.parameters())]
    for k, (a, b) in enumerate(zip(eager, traced, strict=True)):
        assert torch.equal(a, b), k
    with torch.no_grad():
        assert torch.equal(step(x, m3), eager[0])  # the inference forward: no Function at all


def test_grouped_step_backward_twice_needs_retain_graph():
    m = make(num_gemms=2)
    x = torch.randn(32, K, requires_grad=True)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        y = m(x, [16, 16])
    y.sum().backward(retain_graph=True)
    first = x.grad.clone()
    y.sum().backward()
    assert torch.equal(x.grad, 2 * first)
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        y = m(x, [16, 16])
    y.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()


def test_block_groups_not_16_aligned_take_the_per_group_path():
    """cuBLASLt's 1x128 block-scaled GEMMs refuse such row counts (M=37 on an H100), so those
    groups go through te.Linear's step, which pads them; the per-tensor steps pad inside."""
    m = make()
    x = torch.randn(sum(SPLITS), K, requires_grad=True)
    for r, grouped in ((recipe.Float8BlockScaling(), False), (recipe.Float8CurrentScaling(), True)):
        with te.autocast(recipe=r):
            y = m(x, SPLITS)
        assert (type(y.grad_fn).__name__ == "GroupedStepFnBackward") == grouped, r
    with te.autocast(recipe=recipe.Float8BlockScaling()):
        y = m(x[:112], [32, 0, 48, 32])
    assert type(y.grad_fn).__name__ == "GroupedStepFnBackward"


def test_mxfp8_and_row_split_biases_take_the_per_group_path():
    m = make(num_gemms=2)
    x = torch.randn(64, K, requires_grad=True)
    with te.autocast(recipe=recipe.MXFP8BlockScaling()):
        y = m(x, [32, 32])
    assert type(y.grad_fn).__name__ != "GroupedStepFnBackward"
    row = te.GroupedLinear(2, 2 * K, N, parallel_mode="row", tp_size=2, device="cpu")
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        y = row(x, [32, 32])
    assert type(y.grad_fn).__name__ != "GroupedStepFnBackward"
