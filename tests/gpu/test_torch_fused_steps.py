"""te.Linear / LayerNormLinear / LayerNormMLP: the fused eager step (one _C call each way) against
the op-by-op path on CUDA. Both make the same C API calls with the same arguments on the same
stream, so the output, every gradient and the delayed-scaling state must agree bit for bit; the
CPU suite checks the same on the reference backend (tests/torch/test_*_step.py), and
test_torch_modules.py checks the CUDA numerics against the CPU. Also LayerNormMLP(checkpoint=True)
against checkpoint=False, bit for bit, in high precision and under every recipe."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")
CUDA = torch.device("cuda")
RECIPES = {
    "delayed": lambda: te.recipe.DelayedScaling(amax_history_len=4),
    "current": te.recipe.Float8CurrentScaling,
    "block": te.recipe.Float8BlockScaling,
}
MODULES = {
    "Linear": lambda dt: te.Linear(256, 384, params_dtype=dt, device=CUDA),
    "LayerNormLinear": lambda dt: te.LayerNormLinear(256, 384, params_dtype=dt, device=CUDA),
    "LayerNormLinear_rms": lambda dt: te.LayerNormLinear(
        256, 384, normalization="RMSNorm", zero_centered_gamma=True, params_dtype=dt, device=CUDA
    ),
    "LayerNormMLP_gelu": lambda dt: te.LayerNormMLP(256, 512, params_dtype=dt, device=CUDA),
    "LayerNormMLP_swiglu": lambda dt: te.LayerNormMLP(
        256, 512, activation="swiglu", normalization="RMSNorm", params_dtype=dt, device=CUDA
    ),
}


def _step(m, x, dy, recipe, fused):
    for g in m._gemms.values():
        g.context(recipe, None, x.device).packed_ok = fused
    x = x.clone().requires_grad_(True)
    with te.autocast(recipe=recipe):
        y = m(x)
    y.backward(dy)
    out = [y.detach(), x.grad] + [p.grad for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    return out


def _randomize(m) -> None:
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.normal_(
                1.0 if name == "layer_norm_weight" else 0.0,
                0.3 if "bias" in name or "layer_norm" in name else 0.05,
            )


def _assert_same_bits(got, want, step: int) -> None:
    for k, (u, v) in enumerate(zip(got, want, strict=True)):
        assert u is not None and u.device.type == CUDA.type and u.dtype == v.dtype, k
        assert torch.equal(u, v), (step, k, (u.float() - v.float()).abs().max().item())


def _assert_same_scaling_state(a, b) -> None:
    for ga, gb in zip(a._gemms.values(), b._gemms.values(), strict=True):
        for sa, sb in ((ga.fwd, gb.fwd), (ga.bwd, gb.bwd)):
            if sa is not None:
                assert torch.equal(sa.amax_history, sb.amax_history)
                assert torch.equal(sa.scale, sb.scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("module", list(MODULES))
def test_fused_step_matches_op_by_op_on_cuda(module, recipe_name, dtype):
    torch.manual_seed(0)
    a = MODULES[module](dtype)
    _randomize(a)
    b = copy.deepcopy(a)
    recipe = RECIPES[recipe_name]()
    # 400 tokens: cuBLASLt's FP8 GEMMs need every dimension a multiple of 16 (wgrad reduces over
    # the tokens), so awkward token counts are the CPU suite's (te-core refuses them on CUDA).
    for i in range(3):  # delayed scaling: later steps run on the scales the first produced
        g = torch.Generator().manual_seed(i)
        x = (torch.randn(5, 80, 256, generator=g) * 2 + 0.5).to(dtype).to(CUDA)
        dy = torch.randn(5, 80, 384 if "Linear" in module else 256, generator=g).to(dtype).to(CUDA)
        got, want = _step(a, x, dy, recipe, True), _step(b, x, dy, recipe, False)
        _assert_same_bits(got, want, i)
    _assert_same_scaling_state(a, b)


# LayerNormMLP(checkpoint=True) (selective recompute: FC1 and the activation run again in
# backward) against checkpoint=False, the fused step: the recompute makes the forward's calls on
# the forward's operands, so both must agree bit for bit on CUDA too (the CPU suite:
# tests/torch/test_layernorm_mlp_checkpoint.py). None: high precision.
CHECKPOINT_RECIPES = {
    "high_precision": None,
    **RECIPES,
    "mxfp8": te.recipe.MXFP8BlockScaling,
    "nvfp4": te.recipe.NVFP4BlockScaling,
}


def _ckpt_step(m, x, dy, recipe, seed):
    x = x.clone().requires_grad_(True)
    torch.manual_seed(seed)  # NVFP4's stochastic rounding draws its seeds from torch's generator
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = m(x)
    torch.manual_seed(seed + 1)
    y.backward(dy)
    out = [y.detach(), x.grad] + [p.grad for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
@pytest.mark.parametrize("recipe_name", list(CHECKPOINT_RECIPES))
def test_layernorm_mlp_checkpoint_matches_plain_on_cuda(recipe_name, act):
    torch.manual_seed(0)
    a = te.LayerNormMLP(256, 512, activation=act, params_dtype=torch.bfloat16, device=CUDA)
    _randomize(a)
    b = te.LayerNormMLP(256, 512, activation=act, params_dtype=torch.bfloat16, device=CUDA, checkpoint=True)
    b.load_state_dict(a.state_dict())
    make = CHECKPOINT_RECIPES[recipe_name]
    recipe = make() if make is not None else None
    for i in range(3):  # delayed scaling: later steps run on the scales the first produced
        g = torch.Generator().manual_seed(i)
        x = (torch.randn(4, 96, 256, generator=g) * 2 + 0.5).to(torch.bfloat16).to(CUDA)
        dy = torch.randn(4, 96, 256, generator=g).to(torch.bfloat16).to(CUDA)
        got, want = _ckpt_step(b, x, dy, recipe, 10 * i), _ckpt_step(a, x, dy, recipe, 10 * i)
        _assert_same_bits(got, want, i)
    _assert_same_scaling_state(a, b)
