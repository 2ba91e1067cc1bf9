"""te.LayerNormLinear's fused eager step (te_torch._layernorm_linear_step over
te_core._C.layernorm_linear_fwd / layernorm_linear_bwd) against the op-by-op path
(LayerNormLinearFn with ``packed_ok`` off): the same C calls, so the output, every gradient and
the delayed-scaling state must agree bit for bit (the numerics themselves: test_layernorm_linear.py).
Also what falls back to the op-by-op path, and the entry points' argument errors."""

from __future__ import annotations

import copy

import pytest
import te_torch as te
import torch
from _step_pair import RECIPES, assert_same, assert_same_state, calls, each_kind, grads, pair, step
from te_core import _C
from te_torch import _layernorm_linear_step
from te_torch._dtypes import TE_DTYPE
from te_torch._kernels import spec


def _make(k=128, n=80, dtype=torch.float32, **kw):
    return lambda: te.LayerNormLinear(k, n, params_dtype=dtype, device="cpu", **kw)


def _compare(a, b, recipe, shape, n, dtype, steps=2, x_grad=True, **fwd):
    for i in range(steps):  # delayed scaling: later steps use the scales the first produced
        g = torch.Generator().manual_seed(i)
        x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype)
        dy = torch.randn(*shape[:-1], n, generator=g).to(dtype)
        xa, xb = x.clone().requires_grad_(x_grad), x.clone().requires_grad_(x_grad)
        ya = step(a, xa, dy, recipe, True, **fwd)
        yb = step(b, xb, dy, recipe, False, **fwd)
        assert torch.equal(ya, yb)
        assert_same(grads(a, xa), grads(b, xb))
    assert_same_state(a, b)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("zcg", [False, True])
def test_fused_step_matches_op_by_op(monkeypatch, recipe_name, norm, dtype, bias, zcg):
    seen = calls(monkeypatch, _layernorm_linear_step, "_bwd")
    make = _make(dtype=dtype, bias=bias, normalization=norm, zero_centered_gamma=zcg)
    a, b, recipe = pair(make, recipe_name)
    _compare(a, b, recipe, (3, 7, 128), 80, dtype)
    assert len(seen) == 2  # the fused module's steps, and only those


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("shape", [(1, 128), (37, 128), (2, 1, 128), (5, 13, 128)])
def test_awkward_token_counts(recipe_name, shape):
    a, b, recipe = pair(_make(), recipe_name)
    _compare(a, b, recipe, shape, 80, torch.float32)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_input_without_grad_and_frozen_parts(recipe_name):
    # x without grad (the norm's gradients still flow to its parameters), then a frozen norm
    # (no norm backward, no dgrad), then a frozen weight (no wgrad: no column-wise input copy).
    a, b, recipe = pair(_make(), recipe_name)
    _compare(a, b, recipe, (6, 128), 80, torch.float32, x_grad=False)
    for m in (a, b):
        m.layer_norm_weight.requires_grad_(False)
        m.layer_norm_bias.requires_grad_(False)
    _compare(a, b, recipe, (6, 128), 80, torch.float32, x_grad=False)
    for m in (a, b):
        m.weight.requires_grad_(False)
        m.layer_norm_weight.requires_grad_(True)
    _compare(a, b, recipe, (6, 128), 80, torch.float32)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_microbatch_weight_cache(recipe_name):
    # is_first_microbatch: True quantizes and caches, False reuses the cache even after the
    # weight changed (the caller's promise), until the next True.
    a, b, recipe = pair(_make(64, 48), recipe_name)
    for first in (True, False, False, True):
        _compare(a, b, recipe, (5, 64), 48, torch.float32, steps=1, is_first_microbatch=first)
        with torch.no_grad():
            a.weight.mul_(1.5)
            b.weight.mul_(1.5)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("overwrite", [False, True])
def test_main_grad_accumulation(recipe_name, overwrite):
    a, b, recipe = pair(_make(64, 32, torch.bfloat16, fuse_wgrad_accumulation=True), recipe_name)
    start = torch.randn(32, 64)
    for m in (a, b):  # deepcopy does not carry a Parameter's extra attributes
        m.weight.main_grad = start.clone()
        if overwrite:
            m.weight.overwrite_main_grad = True
        m.weight.grad_added_to_main_grad = False
    _compare(a, b, recipe, (6, 64), 32, torch.bfloat16)
    assert a.weight.grad is None and a.weight.grad_added_to_main_grad
    assert not torch.equal(a.weight.main_grad, start)


@pytest.mark.parametrize("recipe_name", ["delayed", "block"])
def test_stored_quantized_weight(recipe_name):
    recipe = RECIPES[recipe_name]()
    torch.manual_seed(0)
    with te.quantized_model_init(recipe=recipe):
        a = te.LayerNormLinear(128, 64, params_dtype=torch.float32, device="cpu")
    _, b, _ = pair(lambda: a, recipe_name)
    _compare(a, b, recipe, (4, 128), 64, torch.float32)


@pytest.mark.parametrize("recipe_name", ["current", "block"])
def test_quantized_grad_from_the_next_layer(recipe_name):
    # The next te.Linear's fp8_grad: dy arrives quantized and is the GEMMs' operand as it is.
    recipe = RECIPES[recipe_name]()
    torch.manual_seed(0)
    a, nxt_a = te.LayerNormLinear(128, 128, device="cpu"), te.Linear(128, 64, device="cpu")
    b, nxt_b = copy.deepcopy(a), copy.deepcopy(nxt_a)
    x = torch.randn(8, 128)
    outs = []
    for m, nxt, fused in ((a, nxt_a, True), (b, nxt_b, False)):
        m._gemm.context(recipe, None, x.device).packed_ok = fused
        xi = x.clone().requires_grad_()
        with te.autocast(recipe=recipe):
            y = nxt(m(xi), fp8_grad=True)
        y.sum().backward()
        outs.append((y, grads(m, xi)))
    assert torch.equal(outs[0][0], outs[1][0])
    assert_same(outs[0][1], outs[1][1])


def test_fallbacks_run_op_by_op(monkeypatch):
    # return_layernorm_output, fp8_output / fp8_grad and MXFP8 are not on the fused step.
    seen = calls(monkeypatch, _layernorm_linear_step, "_fwd")
    x = torch.randn(32, 64, requires_grad=True)
    m = te.LayerNormLinear(64, 64, return_layernorm_output=True, device="cpu")
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        y, ln = m(x)
    n = te.LayerNormLinear(64, 64, device="cpu")
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        n(x, fp8_output=True)
        n(x, fp8_grad=True)
    with te.autocast(recipe=te.recipe.MXFP8BlockScaling()):
        n(x)
    assert seen == []
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        n(x)
    assert len(seen) == 1


def test_entry_point_errors():
    x, g = torch.randn(4, 16), torch.ones(16)
    mu, rs, out = torch.empty(4), torch.empty(4), torch.empty(4, 8)
    w = (2, 0, spec(torch.randn(8, 16)), None, None, None)
    cfg = _C.GemmConfig(False, True, 1.0, 0.0, 0)
    ncfg = _C.NormConfig(eps=1e-5, zero_centered_gamma=False)
    quant = (0, TE_DTYPE[torch.float8_e4m3fn], None, None, None)
    norm = [False, spec(x), spec(g), None, (quant, 1, 0), spec(mu), spec(rs), ncfg]
    args = [*norm, w, None, spec(out), cfg, 0]

    def fwd(i, value):
        bad = list(args)
        bad[i] = value
        _C.layernorm_linear_fwd(*bad)

    with pytest.raises(ValueError, match="beta: expected None for RMSNorm"):
        _C.layernorm_linear_fwd(True, *args[1:3], spec(g), *args[4:])
    with pytest.raises(TypeError, match=r"ln_out: expected a packed target \(quant, row ptr, col ptr\)"):
        fwd(4, (quant, 1))
    with pytest.raises(TypeError, match=r"ln_out: expected quant = \(mode, fp8 dtype"):
        fwd(4, ((0, 1), 1, 0))
    with pytest.raises(TypeError, match="norm_config: expected a NormConfig"):
        fwd(7, None)
    with pytest.raises(TypeError, match="w: expected an operand tuple"):
        fwd(8, "w")
    with pytest.raises(TypeError, match="config: expected a GemmConfig, got None"):
        fwd(11, None)
    with pytest.raises(TypeError, match="x: expected None, a Tensor or a"):
        fwd(1, "x")
    dy = (2, 0, spec(out), None, None, None)
    dln = spec(torch.empty(4, 16))
    with pytest.raises(
        ValueError, match="norm: expected the norm backward's tuple exactly when dln is given"
    ):
        _C.layernorm_linear_bwd(dy, None, None, w, dln, cfg, None, None, None, 0)
    with pytest.raises(
        TypeError, match=r"norm: expected \(rms, x, mu, rsigma, gamma, dx, dgamma, dbeta, NormConfig\)"
    ):
        _C.layernorm_linear_bwd(dy, None, None, w, dln, cfg, None, None, (False,), 0)
    with pytest.raises(ValueError, match="dbias: expected None when dy is given quantized"):
        _C.layernorm_linear_bwd(dy, spec(torch.empty(8)), None, None, None, None, None, None, None, 0)
    norm = (True, spec(x), spec(mu), spec(rs), spec(g), spec(x), spec(g), None, ncfg)
    with pytest.raises(ValueError, match="norm: expected mu and dbeta None for RMSNorm"):
        _C.layernorm_linear_bwd(dy, None, None, w, dln, cfg, None, None, norm, 0)
    with pytest.raises(TypeError, match=r"norm\[8\]: expected a NormConfig"):
        _C.layernorm_linear_bwd(dy, None, None, w, dln, cfg, None, None, (*norm[:8], None), 0)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_one_module_many_kinds_of_call(recipe_name):
    # The step keeps what it derives from a kind of call in a plan (LnLinearPlan): one module
    # called with each kind in turn must match the op-by-op path on every call (_step_pair.KINDS).
    a, b, recipe = pair(_make(k=64, n=48), recipe_name)
    each_kind(a, b, recipe, (64, 48), ("weight",))
    assert len(a._gemm.ctx.plans) >= 4
