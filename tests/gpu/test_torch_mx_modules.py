"""te_torch under MXFP8BlockScaling / NVFP4BlockScaling on CUDA against the CPU backend (the
reference): te.MXFP8Quantizer / te.NVFP4Quantizer bit for bit (te-core's CUDA kernels match its CPU
ones; this checks te_torch's wiring: layouts, amax, the transform flag, the stochastic-rounding
seed), and te.Linear / LayerNormLinear / LayerNormMLP with identical parameters and inputs, two
steps, fp32 and bf16.

Stochastic rounding (default NVFP4): each quantization draws its seed from torch's CPU generator,
so ``torch.manual_seed`` before each step makes both devices draw the same seeds; te-core's Philox
stream then gives the same bits on both.

Tolerances (normwise relative error). Every MXFP8 / NVFP4 GEMM is emulated on both devices
(dequantize to BF16, a BF16 GEMM with fp32 accumulation), so te.Linear, whose operands are
quantized bit-exactly alike, differs only by accumulation order: 1e-4 (fp32; ~1e-6 expected) / 1e-2 (bf16 output
rounding). Where a module quantizes a value it computed (the norm output; LayerNormMLP's FC1
output after the activation, and its activation gradient), an fp32 rounding difference between
the backends can move an element across a rounding boundary: one E4M3 step (~6%) for MXFP8, one
E2M1 step (up to 33% of the block scale) for NVFP4. Bounds below are estimates scaled from the
FP8 recipes' measured ones in test_torch_modules.py (5e-3 / 3e-2) by those step sizes, not yet
measured on the H200: LayerNormLinear 1e-2 (MXFP8) / 3e-2 (NVFP4), LayerNormMLP 3e-2 / 8e-2. A
layout, scale or transform error is an error near 1.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")
recipe = te.recipe
CUDA = torch.device("cuda")
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
RECIPES = {"mxfp8": recipe.MXFP8BlockScaling, "nvfp4": recipe.NVFP4BlockScaling}
TOL = {  # (module, family) -> fp32 bound; bf16 outputs: at least 1e-2
    ("Linear", "mxfp8"): 1e-4,
    ("Linear", "nvfp4"): 1e-4,
    ("LayerNormLinear", "mxfp8"): 1e-2,
    ("LayerNormLinear", "nvfp4"): 3e-2,
    ("LayerNormMLP", "mxfp8"): 3e-2,
    ("LayerNormMLP", "nvfp4"): 8e-2,
}


def relerr(got, ref):
    got, ref = got.double().cpu(), ref.double().cpu()
    return ((got - ref).norm() / ref.norm()).item()


def source(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(
        torch.randint(-6, 7, (*shape[:-1], 1), generator=g).float()
    )
    x.view(-1)[: shape[-1]] = 0.0
    return x.to(dtype)


QUANTIZERS = {
    "mxfp8_e4m3": lambda: te.MXFP8Quantizer(E4M3),
    "mxfp8_e5m2_32x32": lambda: te.MXFP8Quantizer(E5M2, with_2d_quantization=True),
    "nvfp4": lambda: te.NVFP4Quantizer(),
    "nvfp4_16x16": lambda: te.NVFP4Quantizer(with_2d_quantization=True),
    "nvfp4_rht_sr": lambda: te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
}


def written(t):
    """The parts te writes: data, the valid region of the scale tables (the padding is never
    written), NVFP4's amaxes."""
    k = t.shape[-1]
    m = t.numel() // k
    b = 32 if isinstance(t, te.MXFP8Tensor) else 16
    out = [
        t._rowwise_data,
        t._rowwise_scale_inv[:m, : -(-k // b)],
        t._columnwise_data,
        t._columnwise_scale_inv[:k, : -(-m // b)],
    ]
    return out + ([t._amax] if isinstance(t, te.NVFP4Tensor) else [])


@pytest.mark.parametrize("shape", [(64, 96), (2, 48, 160), (256, 1024)], ids=["2d", "3d", "large"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", list(QUANTIZERS))
def test_quantizers_cuda_match_cpu_bit_exact(kind, dtype, shape):
    x = source(shape, dtype, seed=0)
    q = QUANTIZERS[kind]()
    torch.manual_seed(3)
    want = q(x)
    torch.manual_seed(3)
    got = q(x.to(CUDA))
    assert got._rowwise_data.is_cuda and type(got) is type(want)
    for i, (a, b) in enumerate(zip(written(got), written(want), strict=True)):
        assert torch.equal(a.cpu(), b), (kind, i)
    assert torch.equal(got.dequantize().cpu(), want.dequantize())


def step(m, x, dy, r, seed):
    torch.manual_seed(seed)  # the same stochastic-rounding seeds on both devices
    x = x.to(next(m.parameters()).device).clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y = m(x)
    y.backward(dy.to(x.device))
    out = [y.detach(), x.grad] + [p.grad for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    return out


def randomize(m):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            v = torch.randn(p.shape, generator=g)
            if "layer_norm_weight" in name:
                v = 1 + 0.3 * v
            elif "weight" in name:
                v = v * (0.15 if "fc" in name else 0.05)
            else:
                v = 0.3 * v
            p.copy_(v.to(p.dtype))


def build(cls, dtype):
    if cls == "Linear":
        return te.Linear(384, 256, params_dtype=dtype, device="cpu"), (2, 48, 384), 256
    if cls == "LayerNormLinear":
        return te.LayerNormLinear(384, 256, params_dtype=dtype, device="cpu"), (2, 48, 384), 256
    return te.LayerNormMLP(256, 512, activation="swiglu", params_dtype=dtype, device="cpu"), (96, 256), 256


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("cls", ["Linear", "LayerNormLinear", "LayerNormMLP"])
def test_modules_cuda_match_cpu(cls, name, dtype):
    r = RECIPES[name]()
    cpu, shape, n = build(cls, dtype)
    randomize(cpu)
    gpu = copy.deepcopy(cpu).to(CUDA)
    tol = TOL[(cls, name)] if dtype == torch.float32 else max(1e-2, TOL[(cls, name)])
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype)
        dy = torch.randn(*shape[:-1], n, generator=g).to(dtype)
        want = step(cpu, x, dy, r, seed)
        got = step(gpu, x, dy, r, seed)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert a.is_cuda and a.dtype == b.dtype and a.shape == b.shape, i
            assert relerr(a, b) <= tol, (i, relerr(a, b))


def chain_step(fc1, fc2, x, dy, r, seed):
    """fc2(fc1(x, fp8_output=True), fp8_grad=True): h as fc1 returned it (dequantized) and dh as
    fc2 returned it, y, dx and every parameter gradient."""
    torch.manual_seed(seed)
    dev = next(fc1.parameters()).device
    x = x.to(dev).clone().requires_grad_(True)
    seen = {}
    with te.autocast(recipe=r):
        h = fc1(x, fp8_output=True)
        h.register_hook(lambda g: seen.setdefault("dh", g))
        y = fc2(h, fp8_grad=True)
    y.backward(dy.to(dev))
    assert type(h) is type(seen["dh"]) and type(h).__name__ in ("MXFP8Tensor", "NVFP4Tensor")
    out = [h.dequantize(torch.float32), seen["dh"].dequantize(torch.float32), y.detach(), x.grad]
    return out + [p.grad for m in (fc1, fc2) for p in m.parameters()]


@pytest.mark.parametrize("name", list(RECIPES))
def test_fp8_output_and_grad_chain_cuda_matches_cpu(name):
    """fp8_output / fp8_grad under the MX recipes: the quantized h and dh handed between two
    Linear layers, and everything computed from them, on CUDA against the CPU backend. h and dh
    are quantized from GEMM results whose accumulation order differs between the backends, so an
    element may cross a rounding boundary: LayerNormLinear's bound (a quantized computed value)."""
    r = RECIPES[name]()
    fc1, fc2 = te.Linear(384, 256, device="cpu"), te.Linear(256, 128, device="cpu")
    randomize(fc1)
    randomize(fc2)
    g1, g2 = copy.deepcopy(fc1).to(CUDA), copy.deepcopy(fc2).to(CUDA)
    g = torch.Generator().manual_seed(5)
    x, dy = torch.randn(2, 48, 384, generator=g), torch.randn(2, 48, 128, generator=g)
    want = chain_step(fc1, fc2, x, dy, r, 7)
    got = chain_step(g1, g2, x, dy, r, 7)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.is_cuda and a.shape == b.shape, i
        assert relerr(a, b) <= TOL[("LayerNormLinear", name)], (i, relerr(a, b))


def test_availability_says_emulated_on_this_gpu():
    cc = torch.cuda.get_device_capability()
    for fn, fmt in ((te.is_mxfp8_available, "MXFP8"), (te.is_nvfp4_available, "NVFP4")):
        ok, why = fn(return_reason=True)
        assert ok is False and why.startswith(f"emulated on compute capability {cc[0]}.{cc[1]}"), why
        assert "the recipe still runs" in why
        assert f"each {fmt} GEMM by dequantizing the operands to BF16" in why
