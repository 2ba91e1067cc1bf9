"""te.Linear's fused eager step (te_torch._linear_step over te_core._C.linear_fwd / linear_bwd)
against the unfused path (quantize and GEMM ops one by one, what torch.compile traces).

Both run the same te_quantize / te_dbias_quantize / te_gemm calls, so every output, gradient and
delayed-scaling state must agree bit for bit; the numerics themselves are checked against fp32
references in test_linear.py. Also: the packed-buffer sizes, and errors of the _C entry points.
"""

from __future__ import annotations

import copy
import weakref

import pytest
import te_torch as te
import torch
from te_core import _C
from te_torch._dtypes import TE_DTYPE
from te_torch._kernels import packed

RECIPES = {
    "delayed": lambda: te.recipe.DelayedScaling(amax_history_len=4),
    "current": te.recipe.Float8CurrentScaling,
    "block": te.recipe.Float8BlockScaling,
}


def _run(m, x, dy, recipe, unfused: bool, **fwd):
    m._gemm.context(recipe, None, m.weight.device).packed_ok = not unfused
    with te.autocast(recipe=recipe):
        y = m(x, **fwd)
    y.backward(dy)
    return y


def _grads(m, x):
    out = [x.grad]
    for p in m.parameters():
        out.append(getattr(p, "main_grad", None) if hasattr(p, "main_grad") else p.grad)
    return out


def _pair(make, recipe_name):
    torch.manual_seed(0)
    a = make()
    b = copy.deepcopy(a)
    return a, b, RECIPES[recipe_name]()


def _assert_same(got, want):
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None
        else:
            assert torch.equal(g, w), (g - w).abs().max()


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_grad", [True, False])
def test_fused_step_matches_unfused(recipe_name, dtype, bias, x_grad):
    a, b, recipe = _pair(lambda: te.Linear(128, 80, bias=bias, params_dtype=dtype, device="cpu"), recipe_name)
    xs = [torch.randn(3, 7, 128, dtype=dtype) for _ in range(3)]
    dys = [torch.randn(3, 7, 80, dtype=dtype) for _ in range(3)]
    for step in range(3):  # delayed scaling: steps 2 and 3 use the scales the first produced
        xa = xs[step].clone().requires_grad_(x_grad)
        xb = xs[step].clone().requires_grad_(x_grad)
        ya = _run(a, xa, dys[step], recipe, unfused=False)
        yb = _run(b, xb, dys[step], recipe, unfused=True)
        assert a._gemm.ctx.packed_ok and not b._gemm.ctx.packed_ok
        assert torch.equal(ya, yb)
        _assert_same(_grads(a, xa), _grads(b, xb))
    sa, sb = a.state_dict(), b.state_dict()
    for key, value in sa["_extra_state"].items():
        assert torch.equal(value, sb["_extra_state"][key]), key


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_one_module_many_kinds_of_call(recipe_name):
    # The fused step keeps what it derives from a kind of call (shapes, dtypes, which gradients,
    # bias) in a per-context plan (_linear_step.StepPlan): one module called with every kind in
    # turn, each kind twice and out of order, must match the unfused path on every call,
    # including token counts that pad (7 x 3, 5) next to ones that do not (16, 2 x 8).
    a, b, recipe = _pair(lambda: te.Linear(64, 48, params_dtype=torch.float32, device="cpu"), recipe_name)
    kinds = [
        ((7, 3), torch.float32, True, True),
        ((16,), torch.float32, True, True),
        ((16,), torch.bfloat16, True, True),
        ((5,), torch.bfloat16, False, True),
        ((2, 8), torch.float32, True, False),
        ((5,), torch.float32, False, False),
    ]
    for kind in kinds + kinds[::-1]:
        lead, dtype, x_grad, w_grad = kind
        for m in (a, b):
            m.weight.requires_grad_(w_grad)
            m.bias.requires_grad_(w_grad)
        x = torch.randn(*lead, 64, dtype=dtype)
        dy = torch.randn(*lead, 48, dtype=dtype)
        xa, xb = x.clone().requires_grad_(x_grad), x.clone().requires_grad_(x_grad)
        if not (x_grad or w_grad):
            with te.autocast(recipe=recipe):
                ya, yb = a(xa), b(xb)
            assert torch.equal(ya, yb), kind
            continue
        ya = _run(a, xa, dy, recipe, unfused=False)
        yb = _run(b, xb, dy, recipe, unfused=True)
        assert ya.shape == (*lead, 48) and ya.dtype == dtype
        assert torch.equal(ya, yb), kind
        _assert_same(_grads(a, xa), _grads(b, xb))
    assert a._gemm.ctx.packed_ok and len(a._gemm.ctx.plans) >= 4


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_frozen_weight_and_microbatch_cache(recipe_name):
    # A frozen weight (no wgrad: x's column-wise copy is not made) and is_first_microbatch's
    # cached weight: True quantizes and caches, False reuses the cache, even after the weight
    # changed (the caller's promise), until the next True.
    a, b, recipe = _pair(lambda: te.Linear(64, 48, params_dtype=torch.float32, device="cpu"), recipe_name)
    a.bias.requires_grad_(False)
    b.bias.requires_grad_(False)
    for first in (True, False, False, True):
        x = torch.randn(5, 64)
        dy = torch.randn(5, 48)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya = _run(a, xa, dy, recipe, unfused=False, is_first_microbatch=first)
        yb = _run(b, xb, dy, recipe, unfused=True, is_first_microbatch=first)
        assert torch.equal(ya, yb)
        _assert_same(_grads(a, xa), _grads(b, xb))
        with torch.no_grad():
            a.weight.mul_(1.5)
            b.weight.mul_(1.5)
    for m in (a, b):
        m.weight.requires_grad_(False)
    x = torch.randn(5, 64)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya = _run(a, xa, torch.ones(5, 48), recipe, unfused=False)
    yb = _run(b, xb, torch.ones(5, 48), recipe, unfused=True)
    assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)
    assert a.weight.grad is not None  # from the steps before it was frozen, unchanged since
    assert torch.equal(a.weight.grad, b.weight.grad)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("overwrite", [False, True])
def test_main_grad_accumulation(recipe_name, overwrite):
    a, b, recipe = _pair(
        lambda: te.Linear(64, 32, fuse_wgrad_accumulation=True, params_dtype=torch.bfloat16, device="cpu"),
        recipe_name,
    )
    start = torch.randn(32, 64)
    for m in (a, b):  # deepcopy does not carry a Parameter's extra attributes
        m.weight.main_grad = start.clone()
        if overwrite:
            m.weight.overwrite_main_grad = True
        m.weight.grad_added_to_main_grad = False
    before = a.weight.main_grad.clone()
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    dy = torch.randn(6, 32, dtype=torch.bfloat16)
    _run(a, x, dy, recipe, unfused=False)
    _run(b, x, dy, recipe, unfused=True)
    assert torch.equal(a.weight.main_grad, b.weight.main_grad)
    assert a.weight.grad is None and a.weight.grad_added_to_main_grad
    assert not torch.equal(a.weight.main_grad, before)


@pytest.mark.parametrize("recipe_name", ["delayed", "block"])
def test_stored_quantized_weight(recipe_name):
    recipe = RECIPES[recipe_name]()
    torch.manual_seed(0)
    with te.quantized_model_init(recipe=recipe):
        a = te.Linear(128, 64, params_dtype=torch.float32, device="cpu")
    b = copy.deepcopy(a)
    x = torch.randn(4, 128)
    dy = torch.randn(4, 64)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya = _run(a, xa, dy, recipe, unfused=False)
    yb = _run(b, xb, dy, recipe, unfused=True)
    assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)
    assert torch.equal(a.weight.grad, b.weight.grad)


@pytest.mark.parametrize(
    "mode, shape",
    [
        (int(_C.ScalingMode.PER_TENSOR), (3, 7, 80)),
        (int(_C.ScalingMode.BLOCK_1D), (300, 130)),
        (int(_C.ScalingMode.BLOCK_2D), (300, 130)),
    ],
)
def test_packed_bytes(mode, shape):
    # Each packed copy: data, then its scale_inv from the next 256-byte boundary.
    fp8 = TE_DTYPE[torch.float8_e4m3fn]
    row, col = _C.packed_bytes(mode, fp8, shape)
    m = 1
    for d in shape[:-1]:
        m *= d
    k = shape[-1]
    numel = m * k
    aligned = (numel + 255) // 256 * 256
    if mode == int(_C.ScalingMode.PER_TENSOR):
        assert (row, col) == (aligned + 4, aligned + 4)
    elif mode == int(_C.ScalingMode.BLOCK_1D):
        assert row == aligned + 4 * ((k + 127) // 128) * ((m + 3) // 4 * 4)
        assert col == aligned + 4 * ((m + 127) // 128) * ((k + 3) // 4 * 4)
    else:
        assert row == aligned + 4 * ((m + 127) // 128) * (((k + 127) // 128 + 3) // 4 * 4)
        assert col == aligned + 4 * ((k + 127) // 128) * (((m + 127) // 128 + 3) // 4 * 4)
    assert packed(mode, fp8, torch.Size(shape)) == (
        (row + 255) // 256 * 256,
        (col + 255) // 256 * 256,
    )


def test_entry_point_errors():
    fp8 = TE_DTYPE[torch.float8_e4m3fn]
    with pytest.raises(ValueError, match="scaling_mode: expected a te_scaling_mode value"):
        _C.packed_bytes(99, fp8, (4, 4))
    with pytest.raises(TypeError, match="shape: expected a tuple of ints"):
        _C.packed_bytes(0, fp8, "x")
    x = torch.randn(4, 16)
    out = torch.empty(4, 8)
    cfg = _C.GemmConfig(False, True, 1.0, 0.0, 0)
    with pytest.raises(TypeError, match="x: expected an operand tuple"):
        _C.linear_fwd("nope", (2, 0, None, None, None, None), None, None, cfg, 0)
    with pytest.raises(TypeError, match=r"w: expected \(0, src, quant, row, col\)"):
        _C.linear_fwd((2, 0, None, None, None, None), (7, 1), None, None, cfg, 0)
    with pytest.raises(TypeError, match="config: expected a GemmConfig"):
        _C.linear_fwd((2, 0, None, None, None, None), (2, 0, None, None, None, None), None, None, None, 0)
    db = torch.empty(8)
    db_spec = (db.data_ptr(), TE_DTYPE[db.dtype], db.shape, -1)
    with pytest.raises(ValueError, match="dbias: expected None when dy is given quantized"):
        _C.linear_bwd((2, 0, None, None, None, None), db_spec, None, None, None, None, None, None, 0)
    # A high-precision GEMM through the same entry point: C's checks name te_gemm's arguments.
    spec = lambda t: (t.data_ptr(), TE_DTYPE[t.dtype], t.shape, -1)  # noqa: E731
    w = torch.randn(8, 16)
    _C.linear_fwd(
        (2, 0, spec(x), None, None, None), (2, 0, spec(w), None, None, None), None, spec(out), cfg, 0
    )
    assert torch.allclose(out, x @ w.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        _C.linear_fwd(
            (2, 0, spec(x), None, None, None), (2, 0, spec(x), None, None, None), None, spec(out), cfg, 0
        )


@pytest.mark.parametrize("recipe", [te.recipe.Float8CurrentScaling, te.recipe.MXFP8BlockScaling])
def test_main_grad_dtype_error(recipe):
    """The fused step and the unfused one (MXFP8) say the same (the unfused one named te_gemm's
    output ``out`` instead)."""
    m = te.Linear(32, 32, fuse_wgrad_accumulation=True, device="cpu")
    m.weight.main_grad = torch.zeros(32, 32, dtype=torch.bfloat16)
    x = torch.randn(32, 32)
    with te.autocast(recipe=recipe()):
        y = m(x)
    with pytest.raises(ValueError, match="weight.main_grad: expected a contiguous fp32 tensor"):
        y.sum().backward()


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_empty_batch(recipe_name):
    # No rows: every copy is empty (block scaling's scales too), yet each still has an address,
    # and the step gives empty outputs and zero weight / bias gradients.
    a, b, recipe = _pair(lambda: te.Linear(64, 32, device="cpu"), recipe_name)
    xa, xb = torch.randn(0, 64, requires_grad=True), torch.randn(0, 64, requires_grad=True)
    ya = _run(a, xa, torch.randn(0, 32), recipe, unfused=False)
    yb = _run(b, xb, torch.randn(0, 32), recipe, unfused=True)
    assert ya.shape == (0, 32) and torch.equal(ya, yb)
    _assert_same(_grads(a, xa), _grads(b, xb))
    assert torch.count_nonzero(a.weight.grad) == 0 and torch.count_nonzero(a.bias.grad) == 0


_FUSED_MODULES = {
    "Linear": lambda: te.Linear(32, 48, device="cpu"),
    "LayerNormLinear": lambda: te.LayerNormLinear(32, 48, device="cpu"),
    "LayerNormMLP": lambda: te.LayerNormMLP(32, 64, device="cpu"),
}


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("kind", list(_FUSED_MODULES))
def test_saved_copies_freed_by_backward(kind, recipe_name):
    """The fused steps keep their saved quantized copies (and LayerNormMLP's FC1 output) in one
    buffer outside save_for_backward. A backward without retain_graph frees it, as autograd frees
    saved tensors (it lived until the graph was dropped: in a training loop through the next
    step's forward), and a second backward then fails as torch's does; with retain_graph=True it
    stays and a second backward runs (the same gradients, where no delayed-scaling update ran
    between the two)."""
    torch.manual_seed(0)
    m = _FUSED_MODULES[kind]()
    x = torch.randn(16, 32, requires_grad=True)
    dy = torch.randn(16, 48 if kind != "LayerNormMLP" else 32)
    recipe = RECIPES[recipe_name]()
    with te.autocast(recipe=recipe):
        y = m(x)
    node = y.grad_fn
    assert node.packed and isinstance(node.saved_buf, torch.Tensor)
    kept = weakref.ref(node.saved_buf)
    y.backward(dy, retain_graph=True)
    first = [t.clone() for t in _grads(m, x)]
    assert kept() is not None  # retained: a second backward reads it
    for t in (x, *m.parameters()):
        t.grad = None
    y.backward(dy)
    if recipe_name != "delayed":  # delayed: the first pass's update rescales dy's quantization
        _assert_same(_grads(m, x), first)
    assert kept() is None  # freed by the backward that did not retain the graph
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward(dy)


@pytest.mark.parametrize(
    "make",
    [
        lambda: te.Linear(32, 32, device="cpu"),
        lambda: te.LayerNormLinear(32, 32, device="cpu"),
        lambda: te.LayerNormMLP(32, 64, device="cpu"),
    ],
    ids=["Linear", "LayerNormLinear", "LayerNormMLP"],
)
def test_a_meta_call_leaves_no_plan_for_the_cpu(make):
    # A meta tensor's device index is -1, as the CPU's: the step's plan (which allocates on its
    # device) must not be shared between them. The meta call fails, naming the meta device; the
    # CPU call of the same kind after it runs as if it had not happened.
    torch.manual_seed(0)
    a = make()
    b = copy.deepcopy(a)
    r = te.recipe.Float8CurrentScaling()
    x = torch.randn(16, 32)
    with te.autocast(recipe=r), pytest.raises(ValueError, match="meta device"):
        a(torch.empty(16, 32, device="meta"))
    with te.autocast(recipe=r):
        ya, yb = a(x), b(x)
    assert ya.device.type == "cpu" and torch.equal(ya, yb)


@pytest.mark.parametrize(
    "recipe, want",
    [
        (te.recipe.DelayedScaling(), (0, 1, 1)),
        (
            te.recipe.DelayedScaling(
                fp8_gemm_dgrad=te.recipe.MMParams(use_split_accumulator=False),
                fp8_gemm_wgrad=te.recipe.MMParams(use_split_accumulator=False),
            ),
            (0, 0, 0),
        ),
        (te.recipe.DelayedScaling(fp8_gemm_fprop=te.recipe.MMParams(use_split_accumulator=True)), (1, 1, 1)),
        (
            te.recipe.Float8CurrentScaling(fp8_gemm_wgrad=te.recipe.MMParams(use_split_accumulator=False)),
            (0, 1, 0),
        ),
    ],
    ids=["delayed", "delayed_fast_bwd", "delayed_split_fprop", "current_fast_wgrad"],
)
def test_recipe_split_accumulation_reaches_each_gemm(monkeypatch, recipe, want):
    """The step's three GEMM configs take the recipe's fp8_gemm_fprop / _dgrad / _wgrad (the CPU
    backend accumulates exactly either way, so the configs are what can be checked here)."""
    from te_torch import _linear_step

    made = {}
    real = _linear_step.gemm_config

    def spy(trans_a, trans_b, *rest):
        made[(trans_a, trans_b)] = rest[-1]
        return real(trans_a, trans_b, *rest)

    monkeypatch.setattr(_linear_step, "gemm_config", spy)
    m = te.Linear(32, 48, params_dtype=torch.float32)
    x = torch.randn(16, 32, requires_grad=True)
    with te.autocast(recipe=recipe):
        y = m(x)
    y.backward(torch.randn_like(y))
    # (trans_a, trans_b): fprop x w^T, dgrad dy w, wgrad dy^T x
    assert (made[(False, True)], made[(False, False)], made[(True, False)]) == want
