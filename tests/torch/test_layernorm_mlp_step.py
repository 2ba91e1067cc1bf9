"""te.LayerNormMLP's fused eager step (te_torch._layernorm_mlp_step over
te_core._C.layernorm_mlp_fwd / layernorm_mlp_bwd) against the op-by-op path (LayerNormMLPFn with
``packed_ok`` off): the same C calls, so the output, every gradient and the delayed-scaling state
must agree bit for bit (the numerics themselves: test_layernorm_mlp.py). Also what falls back to
the op-by-op path, and the entry points' argument errors."""

from __future__ import annotations

import copy

import pytest
import te_torch as te
import torch
from _step_pair import RECIPES, assert_same, assert_same_state, calls, each_kind, grads, pair, step
from te_core import _C
from te_torch import _layernorm_mlp_step
from te_torch._dtypes import TE_DTYPE
from te_torch._kernels import spec


def _make(hidden=128, ffn=256, dtype=torch.float32, **kw):
    return lambda: te.LayerNormMLP(hidden, ffn, params_dtype=dtype, device="cpu", **kw)


def _compare(a, b, recipe, shape, dtype=torch.float32, steps=2, x_grad=True, **fwd):
    for i in range(steps):  # delayed scaling: later steps use the scales the first produced
        g = torch.Generator().manual_seed(i)
        x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype)
        dy = torch.randn(shape, generator=g).to(dtype)
        xa, xb = x.clone().requires_grad_(x_grad), x.clone().requires_grad_(x_grad)
        ya = step(a, xa, dy, recipe, True, **fwd)
        yb = step(b, xb, dy, recipe, False, **fwd)
        assert torch.equal(ya, yb)
        assert_same(grads(a, xa), grads(b, xb))
    assert_same_state(a, b)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("activation", ["gelu", "swiglu", "relu", "geglu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_step_matches_op_by_op(monkeypatch, recipe_name, norm, activation, dtype):
    seen = calls(monkeypatch, _layernorm_mlp_step, "_bwd")
    a, b, recipe = pair(_make(dtype=dtype, normalization=norm, activation=activation), recipe_name)
    _compare(a, b, recipe, (3, 7, 128), dtype)
    assert len(seen) == 2  # the fused module's steps, and only those


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_clamped_swiglu_params_match_op_by_op(monkeypatch, recipe_name):
    """activation_params reach te_activation_fwd_v2 / _bwd_v2 inside the fused step as they do op
    by op (a limit low enough that the clamps hold for many elements)."""
    seen = calls(monkeypatch, _layernorm_mlp_step, "_bwd")
    params = {"limit": 0.75, "alpha": 1.5, "glu_linear_offset": 0.5}
    a, b, recipe = pair(_make(activation="clamped_swiglu", activation_params=params), recipe_name)
    _compare(a, b, recipe, (3, 7, 128))
    assert len(seen) == 2


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("zcg", [False, True])
@pytest.mark.parametrize("activation", ["silu", "qgelu", "sreglu"])
def test_biases_and_zero_centered_gamma(recipe_name, bias, zcg, activation):
    make = _make(bias=bias, zero_centered_gamma=zcg, activation=activation)
    a, b, recipe = pair(make, recipe_name)
    _compare(a, b, recipe, (10, 128))


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("shape", [(1, 128), (37, 128), (2, 1, 128), (5, 13, 128)])
def test_awkward_token_counts(recipe_name, shape):
    a, b, recipe = pair(_make(activation="swiglu"), recipe_name)
    _compare(a, b, recipe, shape)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_input_without_grad_and_frozen_parts(monkeypatch, recipe_name):
    # x without grad, then a frozen norm (no norm backward, no FC1 dgrad), then frozen FC1 and
    # FC2 weights (no wgrads: no column-wise input copies), then only FC1's bias below the
    # activation needs a gradient (op by op: the fused step always quantizes FC1's gradient).
    seen = calls(monkeypatch, _layernorm_mlp_step, "_fwd")
    a, b, recipe = pair(_make(), recipe_name)
    _compare(a, b, recipe, (6, 128), x_grad=False)
    for m in (a, b):
        m.layer_norm_weight.requires_grad_(False)
        m.layer_norm_bias.requires_grad_(False)
    _compare(a, b, recipe, (6, 128), x_grad=False)
    for m in (a, b):
        m.fc1_weight.requires_grad_(False)
        m.fc2_weight.requires_grad_(False)
        m.layer_norm_weight.requires_grad_(True)
    _compare(a, b, recipe, (6, 128))
    assert len(seen) == 6
    for m in (a, b):
        m.layer_norm_weight.requires_grad_(False)
    _compare(a, b, recipe, (6, 128), x_grad=False)
    assert len(seen) == 6


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_one_module_many_kinds_of_call(recipe_name):
    # The step keeps what it derives from a kind of call in a plan (MlpPlan): one module
    # called with each kind in turn must match the op-by-op path on every call (_step_pair.KINDS).
    a, b, recipe = pair(_make(hidden=64, ffn=96), recipe_name)
    each_kind(a, b, recipe, (64, 64), ("fc1_weight", "fc2_weight"))
    assert len(a._fc1.ctx.plans) >= 4


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_microbatch_weight_cache(recipe_name):
    # is_first_microbatch caches both weights: False reuses them even after they changed.
    a, b, recipe = pair(_make(64, 96), recipe_name)
    for first in (True, False, False, True):
        _compare(a, b, recipe, (5, 64), steps=1, is_first_microbatch=first)
        with torch.no_grad():
            for m in (a, b):
                m.fc1_weight.mul_(1.5)
                m.fc2_weight.mul_(0.5)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("overwrite", [False, True])
def test_main_grad_accumulation(recipe_name, overwrite):
    a, b, recipe = pair(_make(64, 96, torch.bfloat16, fuse_wgrad_accumulation=True), recipe_name)
    starts = torch.randn(96, 64), torch.randn(64, 96)
    for m in (a, b):  # deepcopy does not carry a Parameter's extra attributes
        for w, start in zip((m.fc1_weight, m.fc2_weight), starts, strict=True):
            w.main_grad = start.clone()
            if overwrite:
                w.overwrite_main_grad = True
            w.grad_added_to_main_grad = False
    _compare(a, b, recipe, (6, 64), torch.bfloat16)
    for w, start in zip((a.fc1_weight, a.fc2_weight), starts, strict=True):
        assert w.grad is None and w.grad_added_to_main_grad
        assert not torch.equal(w.main_grad, start)


@pytest.mark.parametrize("recipe_name", ["delayed", "block"])
def test_stored_quantized_weights(recipe_name):
    recipe = RECIPES[recipe_name]()
    torch.manual_seed(0)
    with te.quantized_model_init(recipe=recipe):
        a = te.LayerNormMLP(128, 256, params_dtype=torch.float32, device="cpu")
    _, b, _ = pair(lambda: a, recipe_name)
    _compare(a, b, recipe, (4, 128))


def test_fallbacks_run_op_by_op(monkeypatch):
    # return_layernorm_output and MXFP8 are not on the fused step.
    seen = calls(monkeypatch, _layernorm_mlp_step, "_fwd")
    x = torch.randn(32, 64, requires_grad=True)
    m = te.LayerNormMLP(64, 64, return_layernorm_output=True, device="cpu")
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        m(x)
    n = te.LayerNormMLP(64, 64, device="cpu")
    with te.autocast(recipe=te.recipe.MXFP8BlockScaling()):
        n(x)
    assert seen == []
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        n(x)
    assert len(seen) == 1


def test_entry_point_errors():
    x, g, h, out = torch.randn(4, 16), torch.ones(16), torch.empty(4, 32), torch.empty(4, 16)
    mu, rs = torch.empty(4), torch.empty(4)
    w1 = (2, 0, spec(torch.randn(32, 16)), None, None, None)
    w2 = (2, 0, spec(torch.randn(16, 32)), None, None, None)
    cfg = _C.GemmConfig(False, True, 1.0, 0.0, 0)
    ncfg = _C.NormConfig(eps=1e-5, zero_centered_gamma=False)
    quant = (0, TE_DTYPE[torch.float8_e4m3fn], None, None, None)
    norm = [False, spec(x), spec(g), None, (quant, 1, 0), spec(mu), spec(rs), ncfg]
    args = [*norm, w1, None, spec(h), cfg, 0, (quant, 1, 0), w2, None, spec(out), cfg, 0]

    def fwd(i, value):
        bad = list(args)
        bad[i] = value
        _C.layernorm_mlp_fwd(*bad)

    with pytest.raises(ValueError, match="beta: expected None for RMSNorm"):
        _C.layernorm_mlp_fwd(True, *args[1:3], spec(g), *args[4:])
    with pytest.raises(TypeError, match=r"ln_out: expected a packed target"):
        fwd(4, None)
    with pytest.raises(TypeError, match="w1: expected an operand tuple"):
        fwd(8, None)
    with pytest.raises(TypeError, match="fc1_config: expected a GemmConfig, got None"):
        fwd(11, None)
    with pytest.raises(TypeError, match=r"act_out: expected a packed target"):
        fwd(13, (quant,))
    with pytest.raises(TypeError, match=r"w2: expected \(0, src, quant, row, col\)"):
        fwd(14, (5,))
    with pytest.raises(TypeError, match="fc2_config: expected a GemmConfig, got None"):
        fwd(17, None)
    dy = (2, 0, spec(out), None, None, None)
    da = spec(h)
    fc2 = (dy, None, None, w2, da, cfg, None, None)
    with pytest.raises(
        TypeError, match=r"fc2: expected \(dy, dbias, x, w, dx, dgrad_config, dw, wgrad_config\)"
    ):
        _C.layernorm_mlp_bwd(fc2[:3], 0, None, None, None, 0)
    with pytest.raises(ValueError, match="fc1: expected FC1's backward tuple exactly when fc2's dx"):
        _C.layernorm_mlp_bwd(fc2, 0, spec(h), None, None, 0)
    with pytest.raises(TypeError, match="fc2.dgrad_config: expected a GemmConfig"):
        _C.layernorm_mlp_bwd((*fc2[:5], None, None, None), 0, spec(h), None, None, 0)
    fc1 = ((quant, 1, 0), None, None, w1, spec(x), cfg, None, None)
    with pytest.raises(TypeError, match=r"fc1.g1: expected a packed target"):
        _C.layernorm_mlp_bwd(fc2, 0, spec(h), (dy, *fc1[1:]), None, 0)
    with pytest.raises(ValueError, match="norm: expected the norm backward's tuple exactly when fc1's dx"):
        _C.layernorm_mlp_bwd(fc2, 0, spec(h), fc1, None, 0)


@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("module", ["LayerNormLinear", "LayerNormMLP"])
def test_empty_batch(recipe_name, module):
    # No rows: every packed part is empty yet has its own address; zero weight gradients.
    a, b, recipe = pair(lambda: getattr(te, module)(64, 64, device="cpu"), recipe_name)
    _compare(a, b, recipe, (0, 64))
    assert all(torch.count_nonzero(p.grad) == 0 for p in a.parameters())


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_quantized_grad_from_the_next_layer(recipe_name):
    # The next te.Linear's fp8_grad: dy arrives quantized and is dequantized first, as op by op.
    a, b, recipe = pair(_make(), recipe_name)
    nxt_a = te.Linear(128, 64, device="cpu")
    nxt_b = copy.deepcopy(nxt_a)
    x = torch.randn(8, 128)
    outs = []
    for m, nxt, fused in ((a, nxt_a, True), (b, nxt_b, False)):
        for g in m._gemms.values():
            g.context(recipe, None, x.device).packed_ok = fused
        xi = x.clone().requires_grad_()
        with te.autocast(recipe=recipe):
            y = nxt(m(xi), fp8_grad=True)
        y.sum().backward()
        outs.append((y, grads(m, xi)))
    assert torch.equal(outs[0][0], outs[1][0])
    assert_same(outs[0][1], outs[1][1])
