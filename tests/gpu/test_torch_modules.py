"""te.LayerNorm / RMSNorm / LayerNormLinear / LayerNormMLP on CUDA against the same modules on the
CPU backend (the reference): identical parameters and inputs, each recipe, fp32 and bf16, two
steps so delayed scaling runs on updated scales.

Tolerances (normwise relative error): the norm and activation kernels reduce in another order on
CUDA, so their fp32 results agree to fp32 rounding, not bit for bit (te/normalization.h,
te/activation.h): high precision 1e-5 (fp32) / 1e-2 (bf16). Under FP8 an fp32-rounding
difference can move a value across an FP8 rounding boundary (one element one FP8 step), which
moves a GEMM's result by ~1e-3 normwise at these sizes: 5e-3 (fp32) / 1e-2 (bf16), and the
delayed-scaling state to fp32 rounding (rtol 1e-6) since amaxes of fused outputs come from
those values. LayerNormMLP: 3e-2. Its FC2 input is FC1's output re-quantized to FP8, and FC1's
result differs between the backends by the H200's FP8 tensor-core rounding (~1e-4, fast
accumulation ~2e-3, tests/gpu/test_gemm.py), so about 0.1% of those FP8 values land one FP8 step
(6-12%) apart: measured 0.5-1.9% normwise on the H200 (2026-11-30) for output and gradients,
every recipe; amaxes of GEMM outputs in the delayed-scaling state apart by that rounding (more
than 1e-3 with fast accumulation; rtol 1e-2). A scale,
layout or copy error is an error near 1.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")
recipe = te.recipe
CUDA = torch.device("cuda")
MLP_FP8_TOL = 3e-2  # see the top of this file
RECIPES = {
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling,
    "block": recipe.Float8BlockScaling,
}


def relerr(got, ref):
    got, ref = got.double().cpu(), ref.double().cpu()
    return ((got - ref).norm() / ref.norm()).item()


def randomize(m):
    """Non-trivial parameters (norm weights around 1, biases non-zero), the same on any device."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            v = torch.randn(p.shape, generator=g)
            if "layer_norm_weight" in name or (
                name == "weight" and isinstance(m, (te.LayerNorm, te.RMSNorm))
            ):
                v = 1 + 0.3 * v
            elif "weight" in name:
                v = v * (0.15 if "fc" in name else 0.05)
            else:
                v = 0.3 * v
            p.copy_(v.to(p.dtype))


def step(m, x, dy, r):
    """(out, dx, grads of every parameter...) of one step on m's device."""
    x = x.to(next(m.parameters()).device).clone().requires_grad_(True)
    with te.autocast(enabled=r is not None, recipe=r):
        y = m(x)
    y.backward(dy.to(x.device))
    out = [y.detach(), x.grad] + [p.grad for p in m.parameters()]
    m.zero_grad(set_to_none=True)
    return out


def compare(cpu, gpu, shape, out_features, dtype, r, tol):
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype)
        dy = torch.randn(*shape[:-1], out_features, generator=g).to(dtype)
        want = step(cpu, x, dy, r)
        got = step(gpu, x, dy, r)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            if b is None:  # a gradient that went into main_grad
                assert a is None, i
                continue
            assert a.is_cuda and a.dtype == b.dtype and a.shape == b.shape, i
            assert relerr(a, b) <= tol, (i, relerr(a, b))


def compare_state(gpu, cpu, rtol=1e-6):
    for gg, gc in zip(gpu._gemms.values(), cpu._gemms.values(), strict=True):
        for sg, sc in ((gg.fwd, gc.fwd), (gg.bwd, gc.bwd)):
            assert torch.allclose(sg.amax_history.cpu(), sc.amax_history, rtol=rtol, atol=0)
            assert torch.allclose(sg.scale.cpu(), sc.scale, rtol=rtol, atol=0)


@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cls", ["LayerNorm", "RMSNorm"])
def test_norm_cuda_matches_cpu(cls, dtype, zcg):
    cpu = getattr(te, cls)(1000, zero_centered_gamma=zcg, dtype=dtype, device="cpu")
    randomize(cpu)
    gpu = copy.deepcopy(cpu).to(CUDA)
    compare(cpu, gpu, (3, 77, 1000), 1000, dtype, None, 1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_layernorm_linear_cuda_matches_cpu(name, dtype, norm):
    r = RECIPES[name]()
    cpu = te.LayerNormLinear(384, 256, normalization=norm, params_dtype=dtype, device="cpu")
    randomize(cpu)
    gpu = copy.deepcopy(cpu).to(CUDA)
    compare(cpu, gpu, (2, 48, 384), 256, dtype, r, 5e-3 if dtype == torch.float32 else 1e-2)
    if r.delayed():
        compare_state(gpu, cpu)


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_layernorm_mlp_cuda_matches_cpu(name, dtype, act):
    r = RECIPES[name]()
    cpu = te.LayerNormMLP(256, 512, activation=act, params_dtype=dtype, device="cpu")
    randomize(cpu)
    gpu = copy.deepcopy(cpu).to(CUDA)
    compare(cpu, gpu, (2, 48, 256), 256, dtype, r, MLP_FP8_TOL)
    if r.delayed():
        compare_state(gpu, cpu, rtol=1e-2)  # amaxes of GEMM outputs: tensor-core rounding


# The GEMM modules on the CPU, 256 -> 256 (LayerNormMLP: ffn 512), parameters in the given dtype.
GEMM_MODULES = {
    "Linear": lambda dtype: te.Linear(256, 256, params_dtype=dtype, device="cpu"),
    "LayerNormLinear": lambda dtype: te.LayerNormLinear(256, 256, params_dtype=dtype, device="cpu"),
    "LayerNormMLP": lambda dtype: te.LayerNormMLP(256, 512, params_dtype=dtype, device="cpu"),
}


@pytest.mark.parametrize("module", list(GEMM_MODULES))
@pytest.mark.parametrize("name", list(RECIPES))
def test_any_token_count_cuda_matches_cpu(name, module):
    # 231 tokens: cuBLASLt's FP8 GEMMs need multiples of 16; te pads the rows (_token_pad).
    r = RECIPES[name]()
    cpu = GEMM_MODULES[module](torch.bfloat16)
    randomize(cpu)
    gpu = copy.deepcopy(cpu).to(CUDA)
    compare(cpu, gpu, (3, 77, 256), 256, torch.bfloat16, r, MLP_FP8_TOL if module == "LayerNormMLP" else 1e-2)


# The GEMM weights of each module in GEMM_MODULES.
GEMM_WEIGHTS = {
    "Linear": ("weight",),
    "LayerNormLinear": ("weight",),
    "LayerNormMLP": ("fc1_weight", "fc2_weight"),
}


@pytest.mark.parametrize("module", list(GEMM_MODULES))
@pytest.mark.parametrize("name", list(RECIPES))
def test_token_count_without_weight_gradient_cuda_matches_cpu(name, module):
    # 231 tokens and no weight gradient (frozen GEMM weights; inference): per-tensor scaling pads
    # nothing, so cuBLASLt's FP8 fprop and dgrad GEMMs run with M = 231 and 15; 1x128 blocks pad
    # still (their GEMMs refuse such an M: _token_pad).
    r = RECIPES[name]()
    cpu = GEMM_MODULES[module](torch.bfloat16)
    randomize(cpu)
    for n in GEMM_WEIGHTS[module]:
        getattr(cpu, n).requires_grad_(False)
    gpu = copy.deepcopy(cpu).to(CUDA)
    tol = MLP_FP8_TOL if module == "LayerNormMLP" else 1e-2
    compare(cpu, gpu, (3, 77, 256), 256, torch.bfloat16, r, tol)
    x = torch.randn(5, 3, 256).to(torch.bfloat16)
    with torch.no_grad(), te.autocast(recipe=r):
        want, got = cpu(x), gpu(x.to(CUDA))
    assert got.shape == want.shape == (5, 3, 256)
    assert relerr(got, want) <= tol


@pytest.mark.parametrize("grad", [True, False], ids=["train", "no_grad"])
@pytest.mark.parametrize("module_on", ["cuda", "cpu"])
@pytest.mark.parametrize("module", list(GEMM_MODULES))
@pytest.mark.parametrize("name", list(RECIPES))
def test_input_on_another_device_is_refused(name, module, module_on, grad):
    # A CUDA module given a CPU input (or the reverse) under autocast: a ValueError naming both
    # devices, not a crash (the CPU backend once read the CUDA weight's pointer: segfault), and
    # the module still trains on its own device afterwards.
    r = RECIPES[name]()
    m = GEMM_MODULES[module](torch.bfloat16).to(module_on)
    wrong = torch.randn(32, 256, dtype=torch.bfloat16, device="cpu" if module_on == "cuda" else CUDA)
    with torch.set_grad_enabled(grad), te.autocast(recipe=r):
        with pytest.raises(ValueError, match="device") as e:
            m(wrong.requires_grad_(grad))
    assert "cpu" in str(e.value) and "cuda" in str(e.value), str(e.value)
    x = torch.randn(32, 256, dtype=torch.bfloat16, device=module_on, requires_grad=True)
    with te.autocast(recipe=r):
        y = m(x)
    y.float().sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("module", list(GEMM_MODULES))
@pytest.mark.parametrize("name", list(RECIPES))
def test_inference_keeps_no_copies_for_backward(name, module):
    # Under no_grad a step whose parameters require grad must not quantize the column-wise
    # copies a backward would read: it allocates what the same step with every parameter frozen
    # (where no gradient can be asked for at all) allocates. Compared as the tensors the call
    # allocates, not as peak memory: the caching allocator accounts a reused cached block at its
    # own size, which depends on what the worker ran before (a 16 KB difference for block
    # LayerNormMLP under xdist on an H100, forty-fourth session).
    from torch.utils._python_dispatch import TorchDispatchMode

    class Allocations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.made = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default):
                self.made.append((tuple(out.shape), out.dtype))
            return out

    r = RECIPES[name]()
    m = GEMM_MODULES[module](torch.bfloat16).to(CUDA)
    frozen = copy.deepcopy(m).requires_grad_(False)
    x = torch.randn(4096, 256, device=CUDA, dtype=torch.bfloat16, requires_grad=True)

    def allocations(mod, inp):
        with torch.no_grad(), te.autocast(recipe=r):
            mod(inp)  # first call: quantizer setup, delayed-scaling state
            with Allocations() as a:
                y = mod(inp)
        return a.made, y

    want, y_frozen = allocations(frozen, x.detach())
    got, y = allocations(m, x)
    assert got == want and got, (got, want)
    assert torch.equal(y, y_frozen)


@pytest.mark.parametrize("module", list(GEMM_MODULES))
@pytest.mark.parametrize("name", list(RECIPES))
def test_fp32_params_with_bf16_inputs_cuda_matches_cpu(name, module):
    # fp32 master weights under 16-bit activations: the bias is added in bf16 (TE's rule), which
    # cuBLASLt fuses into the FP8 GEMM; the bias gradients stay fp32.
    r = RECIPES[name]()
    cpu = GEMM_MODULES[module](torch.float32)
    randomize(cpu)
    gpu = copy.deepcopy(cpu).to(CUDA)
    compare(cpu, gpu, (2, 48, 256), 256, torch.bfloat16, r, MLP_FP8_TOL if module == "LayerNormMLP" else 1e-2)


@pytest.mark.parametrize(
    "act", ["gelu", "relu", "silu", "qgelu", "srelu", "geglu", "reglu", "swiglu", "qgeglu", "sreglu", "glu"]
)
def test_layernorm_mlp_high_precision_cuda_matches_cpu(act):
    cpu = te.LayerNormMLP(256, 384, activation=act, normalization="RMSNorm", device="cpu")
    randomize(cpu)
    gpu = copy.deepcopy(cpu).to(CUDA)
    compare(cpu, gpu, (96, 256), 256, torch.float32, None, 1e-5)


def test_main_grad_accumulation_cuda_matches_cpu():
    r = recipe.Float8CurrentScaling()
    cpu = te.LayerNormMLP(
        256, 256, activation="swiglu", fuse_wgrad_accumulation=True, params_dtype=torch.bfloat16, device="cpu"
    )
    randomize(cpu)
    gpu = copy.deepcopy(cpu).to(CUDA)
    for m, dev in ((cpu, "cpu"), (gpu, CUDA)):
        m.fc1_weight.main_grad = torch.zeros(m.fc1_weight.shape, device=dev)
        m.fc2_weight.main_grad = torch.zeros(m.fc2_weight.shape, device=dev)
    compare(cpu, gpu, (64, 256), 256, torch.bfloat16, r, MLP_FP8_TOL)
    assert gpu.fc1_weight.grad is None
    assert relerr(gpu.fc1_weight.main_grad, cpu.fc1_weight.main_grad) <= MLP_FP8_TOL
    assert relerr(gpu.fc2_weight.main_grad, cpu.fc2_weight.main_grad) <= MLP_FP8_TOL


def test_compiled_layernorm_linear_on_cuda_matches_eager():
    torch._dynamo.reset()
    r = recipe.Float8CurrentScaling()
    m = te.LayerNormLinear(256, 256, params_dtype=torch.bfloat16, device=CUDA)
    randomize(m)

    def fwd(x):
        with te.autocast(recipe=r):
            return m(x)

    cfwd = torch.compile(fwd, fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 32, 256, device=CUDA, dtype=torch.bfloat16)
    want = fwd(x)  # eager first: the module builds its quantizers outside the trace (as Linear)
    assert torch.equal(cfwd(x), want)


def test_default_device_is_cuda():
    assert te.LayerNormMLP(64, 128).fc1_weight.is_cuda
    assert te.RMSNorm(64).weight.is_cuda
