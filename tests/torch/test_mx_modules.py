"""te.Linear, te.LayerNormLinear and te.LayerNormMLP under MXFP8BlockScaling and NVFP4BlockScaling
on CPU: output and every gradient against the independent plain-torch reference of _mx_ref.py
(tight: the same numerics, float64 products of the BF16-rounded dequantized operands, NUMERICS.md
"How to test numerics") and against unquantized fp32 torch (loose); stochastic rounding (default
NVFP4) against fp32 loosely and for reproducibility; shapes that break the block rule; state_dict
round trips; quantized_model_init; a short training run; the emulation's log line.

Tight tolerances: 1e-5 normwise for fp32 modules (accumulation order), 1e-2 for bf16 (the output
rounding). NVFP4 is checked tight with stochastic rounding off (``disable_stochastic_rounding``;
the transform stays on: the reference reproduces te's butterfly), and with it on only loosely.
Loose bounds against fp32 (normwise): MXFP8 0.1 per GEMM (NUMERICS.md), NVFP4 0.25 (TE's E2M1
rtol), twice that through LayerNormMLP's two quantized GEMMs in a row.
"""

from __future__ import annotations

import copy
import functools
import io
import os
import subprocess
import sys

import pytest
import te_torch as te
import torch
import torch.nn.functional as F
from _module_ref import norm32, rel
from _mx_ref import (
    fp32_layernorm_mlp,
    layernorm_linear_ref,
    layernorm_mlp_ref,
    linear_ref,
    mxfp8_qdq,
    nvfp4_qdq,
)
from te_torch import recipe

TIGHT = {
    "mxfp8": recipe.MXFP8BlockScaling,
    "mxfp8_hybrid_2d": lambda: recipe.MXFP8BlockScaling(
        fp8_format=recipe.Format.HYBRID, enable_2d_quantization=True
    ),
    "nvfp4": lambda: recipe.NVFP4BlockScaling(disable_stochastic_rounding=True),
    "nvfp4_1d_no_rht": lambda: recipe.NVFP4BlockScaling(
        disable_stochastic_rounding=True, disable_rht=True, disable_2d_quantization=True
    ),
}
LOOSE = {"mxfp8": 0.1, "nvfp4": 0.25}


def family(r) -> str:
    return "mxfp8" if r.mxfp8() else "nvfp4"


def tol(dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 1e-2


def data(shape, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype)
    return x, torch.randn(*shape[:-1], n, generator=g).to(dtype)


def run(m, x, dy, r, params):
    """(y, dx, grads of ``params``...) of one step under ``r``; clears the grads."""
    x = x.detach().clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y = m(x)
    y.backward(dy)
    out = (y.detach(), x.grad, *[None if p is None else p.grad for p in params])
    m.zero_grad(set_to_none=True)
    return out


def check(got, want, tolerance, names, dtype):
    for g, w, what in zip(got, want, names, strict=True):
        assert (g is None) == (w is None), what
        if w is not None:
            assert g.dtype == dtype and g.shape == w.shape, what
            assert rel(g, w) <= tolerance, (what, rel(g, w))


def randomize(m, seed=0):
    """Norm weights around 1, biases non-zero, FC weights big enough to reach the activation's
    non-linear region; the same on every call."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            v = torch.randn(p.shape, generator=g)
            if "layer_norm_weight" in name:
                v = 1 + 0.3 * v
            elif "weight" in name:
                v = v * (0.15 if "fc1" in name else 0.1)
            else:
                v = 0.3 * v
            p.copy_(v.to(p.dtype))


# -- tight: against the plain-torch emulation --------------------------------------------------


@pytest.mark.parametrize("shape", [(64, 96), (2, 32, 160)], ids=["2d", "3d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(TIGHT))
def test_linear_matches_emulated_and_fp32_reference(name, dtype, shape):
    r = TIGHT[name]()
    m = te.Linear(shape[-1], 128, params_dtype=dtype, device="cpu")
    randomize(m)
    x, dy = data(shape, 128, dtype, seed=1)
    got = run(m, x, dy, r, [m.weight, m.bias])
    want = linear_ref(r, x, m.weight, m.bias, dy)
    check(got, want, tol(dtype), ("y", "dx", "dw", "db"), dtype)
    # loose: the unquantized fp32 math
    xf, wf = x.float(), m.weight.detach().float()
    k = shape[-1]
    exact = (
        F.linear(xf, wf, m.bias.detach().float()),
        dy.float() @ wf,
        dy.float().reshape(-1, 128).T @ xf.reshape(-1, k),
    )
    for g, e, what in zip(got, exact, ("y", "dx", "dw"), strict=False):
        assert 1e-3 < rel(g, e) <= LOOSE[family(r)], (what, rel(g, e))


@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("name", list(TIGHT))
def test_layernorm_linear_matches_emulated_reference(name, norm):
    r = TIGHT[name]()
    dtype = torch.bfloat16 if norm == "RMSNorm" else torch.float32
    m = te.LayerNormLinear(96, 64, normalization=norm, params_dtype=dtype, device="cpu")
    randomize(m)
    x, dy = data((2, 16, 96), 64, dtype, seed=2)
    params = [m.layer_norm_weight, m.layer_norm_bias, m.weight, m.bias]
    got = run(m, x, dy, r, params)
    want = layernorm_linear_ref(m, r, x, dy)
    check(got, want, tol(dtype), ("y", "dx", "dln_weight", "dln_bias", "dw", "db"), dtype)
    lb = None if m.layer_norm_bias is None else m.layer_norm_bias.detach().float()
    ln = norm32(x.float(), m.layer_norm_weight.detach().float(), lb, norm == "RMSNorm", m.eps, False)
    y32 = F.linear(ln, m.weight.detach().float(), m.bias.detach().float())
    assert 1e-3 < rel(got[0], y32) <= LOOSE[family(r)]


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
@pytest.mark.parametrize("name", list(TIGHT))
def test_layernorm_mlp_matches_emulated_and_fp32_reference(name, act):
    r = TIGHT[name]()
    dtype = torch.bfloat16 if act == "swiglu" and name.startswith("nvfp4") else torch.float32
    m = te.LayerNormMLP(64, 96, activation=act, params_dtype=dtype, device="cpu")
    randomize(m)
    x, dy = data((64, 64), 64, dtype, seed=3)
    params = [m.layer_norm_weight, m.layer_norm_bias, m.fc1_weight, m.fc1_bias, m.fc2_weight, m.fc2_bias]
    got = run(m, x, dy, r, params)
    want = layernorm_mlp_ref(m, r, x, dy)
    names = ("y", "dx", "dln_weight", "dln_bias", "dfc1_weight", "dfc1_bias", "dfc2_weight", "dfc2_bias")
    check(got, want, tol(dtype), names, dtype)
    exact = fp32_layernorm_mlp(m, x, dy)
    for g, e, what in zip(got, exact, names, strict=True):
        assert rel(g, e) <= 2 * LOOSE[family(r)], (what, rel(g, e))
    assert rel(got[0], exact[0]) > 1e-3


# -- stochastic rounding (NVFP4's default) -----------------------------------------------------


def test_default_nvfp4_rounds_gradients_stochastically_and_reproducibly():
    """Default NVFP4 (transform + stochastic rounding of gradients): loose against fp32; the same
    torch.manual_seed gives the same bits (te-core's Philox stream from a seed drawn off torch's
    CPU generator); another seed moves only the gradients: y is rounded to nearest."""
    r = recipe.NVFP4BlockScaling()
    m = te.LayerNormMLP(64, 64, activation="gelu", device="cpu")
    randomize(m)
    x, dy = data((2, 32, 64), 64, torch.float32, seed=4)
    params = list(m.parameters())
    runs = {}
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        runs.setdefault(seed, []).append(run(m, x, dy, r, params))
    (a, b), (c,) = runs[0], runs[1]
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert torch.equal(a[0], c[0])  # forward: round to nearest
    assert not torch.equal(a[1], c[1]) and not torch.equal(a[4], c[4])  # dx, dfc1_weight
    exact = fp32_layernorm_mlp(m, x, dy)
    for g, e in zip(a, exact, strict=True):
        assert rel(g, e) <= 2 * LOOSE["nvfp4"]
    # Round to nearest instead (the tightly checked path): the same forward, other gradients.
    rn = run(m, x, dy, recipe.NVFP4BlockScaling(disable_stochastic_rounding=True), params)
    assert torch.equal(rn[0], a[0]) and not torch.equal(rn[6], a[6])
    assert rel(a[6], rn[6]) <= LOOSE["nvfp4"]


# -- shapes, recipe options, state -------------------------------------------------------------


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4"])
def test_shapes_off_the_block_say_what_is_required(name):
    r, block = (recipe.MXFP8BlockScaling(), 32) if name == "mxfp8" else (recipe.NVFP4BlockScaling(), 16)
    lin = te.Linear(64, 2 * block, device="cpu")
    with te.autocast(recipe=r):
        lin(torch.randn(3, block, 64))  # rows 3 * block: fine
        with pytest.raises(
            ValueError,
            match=rf"Linear: {type(r).__name__} quantizes every GEMM operand in blocks of {block} along "
            rf"both of its dimensions, so the input's rows \(the product of its leading dims \(3, 5\)\) "
            rf"must be a multiple of {block}, got 15; pad the tokens .* \({block} here\)",
        ):
            lin(torch.randn(3, 5, 64))
        odd = block + block // 2
        with pytest.raises(ValueError, match=rf"so in_features must be a multiple of {block}, got {odd}"):
            te.Linear(odd, block, device="cpu")(torch.randn(block, odd))
        with pytest.raises(ValueError, match=rf"so out_features must be a multiple of {block}, got 8"):
            te.LayerNormLinear(64, 8, device="cpu")(torch.randn(block, 64))


def test_recipe_options_te_does_not_implement_raise():
    m = te.Linear(64, 64, device="cpu")
    x = torch.randn(32, 64)
    for r, what in (
        (recipe.NVFP4BlockScaling(row_scaled_activation=True), "row_scaled_activation=True"),
        (recipe.NVFP4BlockScaling(nvfp4_4over6="all"), "nvfp4_4over6='all'"),
        (recipe.MXFP8BlockScaling(backward_override="dequantized"), "backward_override='dequantized'"),
    ):
        with te.autocast(recipe=r), pytest.raises(NotImplementedError, match=f"{what} is not implemented"):
            m(x)
    bad = recipe.NVFP4BlockScaling()
    object.__setattr__(bad, "fp4_quant_fwd_weight", recipe.QParams(random_hadamard_transform=True))
    with te.autocast(recipe=bad), pytest.raises(ValueError, match="never on fp4_quant_fwd_weight"):
        m(x)


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4"])
def test_state_dict_round_trip(name):
    """No recipe state to save (these recipes keep none: _extra_state is empty); a reloaded
    model computes the same bits, weight cache included."""
    r = recipe.MXFP8BlockScaling() if name == "mxfp8" else recipe.NVFP4BlockScaling()

    def build():
        return torch.nn.Sequential(
            te.LayerNormLinear(64, 96, device="cpu"),
            te.LayerNormMLP(96, 64, activation="swiglu", device="cpu"),
            te.Linear(96, 32, device="cpu"),
        )

    model = build()
    randomize(model)
    x = torch.randn(2, 16, 64)
    with te.autocast(recipe=r):
        y = model(x)
    sd = model.state_dict()
    assert all(sd[f"{i}._extra_state"] == {} for i in range(3))
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    fresh = build()
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    h = torch.randn(2, 16, 96)
    with te.autocast(recipe=r):
        assert torch.equal(fresh(x), y)
        # is_first_microbatch caches the quantized weights (tensor path: LayerNormLinear; operand
        # path: Linear); the cache gives the same bits, also after the weight changed
        for i, inp in ((0, x), (2, h)):
            want = model[i](inp)
            assert torch.equal(fresh[i](inp, is_first_microbatch=True), want)
            with torch.no_grad():
                fresh[i].weight.mul_(2.0)
            assert torch.equal(fresh[i](inp, is_first_microbatch=False), want)
            with torch.no_grad():
                fresh[i].weight.div_(2.0)
    copied = copy.deepcopy(fresh)
    with te.autocast(recipe=r):
        assert torch.equal(copied(x), y)


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4"])
def test_fuse_wgrad_accumulation_into_main_grad(name):
    """The wgrad GEMM accumulates into weight.main_grad (fp32), as for the other recipes."""
    r = TIGHT[name]()
    m = te.Linear(64, 32, fuse_wgrad_accumulation=True, params_dtype=torch.bfloat16, device="cpu")
    randomize(m)
    m.weight.main_grad = torch.full((32, 64), 0.25)
    x, dy = data((32, 64), 32, torch.bfloat16, seed=8)
    got = run(m, x, dy, r, [m.weight, m.bias])
    assert got[2] is None  # the gradient went into main_grad
    want = linear_ref(r, x, m.weight, m.bias, dy)
    assert m.weight.main_grad.dtype == torch.float32
    assert rel(m.weight.main_grad - 0.25, want[2]) <= 1e-5


@pytest.mark.parametrize("name", ["mxfp8_hybrid_2d", "nvfp4"])
def test_quantized_model_init_stores_mx_weights(name):
    r = TIGHT[name]()
    cls = te.MXFP8Tensor if r.mxfp8() else te.NVFP4Tensor
    torch.manual_seed(5)
    with te.quantized_model_init(recipe=r, preserve_high_precision_init_val=True):
        m = te.Linear(96, 64, device="cpu")
    w = m.weight
    assert type(w) is cls and w.shape == (64, 96) and w.requires_grad
    assert w._rowwise_data is not None and w._columnwise_data is not None
    # the stored weight is the recipe's weight quantization of the initial value (2-D tiles: both
    # copies hold the same values)
    init = w.get_high_precision_init_val()
    q = mxfp8_qdq(init, torch.float8_e4m3fn, tile=True) if r.mxfp8() else nvfp4_qdq(init, tile=True)
    assert torch.equal(w.dequantize(), q)
    w.clear_high_precision_init_val()
    # the GEMMs read the stored weight (a 2-D tiled weight would quantize to itself again, so
    # the reference, which quantizes the dequantized weight, sees the same values)
    x, dy = data((32, 96), 64, torch.float32, seed=6)
    got = run(m, x, dy, r, [m.weight, m.bias])
    want = linear_ref(r, x, w.dequantize(), m.bias, dy)
    check(got, want, 1e-5, ("y", "dx", "dw", "db"), torch.float32)
    assert type(got[2]) is torch.Tensor and got[2].dtype == torch.float32  # the nominal dtype
    # a checkpoint: bytes back exactly, weights_only
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    with te.quantized_model_init(recipe=r):
        fresh = te.Linear(96, 64, device="cpu")
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    for a, b in zip(fresh.weight._parts(), w._parts(), strict=True):
        assert torch.equal(a, b)
    with (
        te.autocast(recipe=recipe.Float8CurrentScaling()),
        pytest.raises(ValueError, match=f"is a {cls.__name__} made for"),
    ):
        m(x)


@functools.cache
def _train(r_name: str | None, steps: int = 12) -> list[float]:
    r = {None: None, "mxfp8": recipe.MXFP8BlockScaling, "nvfp4": recipe.NVFP4BlockScaling}[r_name]
    r = r() if r is not None else None
    torch.manual_seed(7)
    model = torch.nn.Sequential(
        te.LayerNormMLP(64, 128, activation="swiglu", device="cpu"), te.Linear(64, 32, device="cpu")
    )
    x = torch.randn(64, 64)
    target = torch.randn(64, 32) * 0.5
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        with te.autocast(enabled=r is not None, recipe=r):
            loss = F.mse_loss(model(x).float(), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4"])
def test_training_reduces_the_loss(name):
    """A few AdamW steps of a norm -> MLP -> linear regression under the recipe (NVFP4 with its
    defaults: transform and stochastic rounding on) bring the loss down as high precision does
    (measured: 0.255 -> 0.054 (MXFP8), 0.060 (NVFP4), 0.053 (high precision))."""
    losses, reference = _train(name), _train(None)
    assert losses[-1] < 0.4 * losses[0], losses
    assert losses[-1] < 1.3 * reference[-1], (losses, reference)


LOG_SNIPPET = """
import logging, torch, te_torch as te
said = []
h = logging.Handler()
h.emit = lambda rec: said.append((rec.name, rec.levelno, rec.getMessage()))
logging.getLogger("te").addHandler(h)
logging.getLogger("te").setLevel(logging.INFO)
m = te.Linear(64, 64, device="cpu")
for r in [te.recipe.MXFP8BlockScaling(), te.recipe.NVFP4BlockScaling()] * 2:
    with te.autocast(recipe=r):
        m(torch.randn(32, 64, requires_grad=True)).sum().backward()
for name, level, msg in said:
    print(name, level, msg)
"""


def test_emulated_gemms_log_once_per_format_to_the_te_logger():
    """A fresh process (te-core logs each kind once per process): one INFO line per format on
    Python's ``te`` logger, however many GEMMs ran."""
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, "-c", LOG_SNIPPET], capture_output=True, text=True, check=True, env=env
    ).stdout.splitlines()
    lines = [line for line in out if "block dequantization" in line]
    assert len(lines) == 2, out
    assert lines[0].startswith("te 20 te_gemm: mxfp8_1d operands on the CPU"), lines
    assert lines[1].startswith("te 20 te_gemm: nvfp4_1d operands on the CPU"), lines
