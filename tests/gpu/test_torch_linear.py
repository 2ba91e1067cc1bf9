"""te.Linear under te.autocast on CUDA against the same module on the CPU backend (the reference):
identical parameters and inputs, each recipe, fp32 and bf16, 2-D and 3-D inputs, two steps so
delayed scaling runs on updated scales. Quantization is bit-exact between backends, so the
delayed-scaling state must match exactly; GEMM results are compared normwise: fp32 output 1e-3
with split accumulation, 5e-3 with fast accumulation (fprop of the per-tensor recipes), bf16
output 1e-2. Looser than tests/gpu/test_gemm.py's single GEMMs (4e-4 / 2e-3; Hopper's FP8 tensor
cores round inside each MMA): measured up to 4.7e-4 / 2.1e-3 here on the H200, where y also
carries the bias and the 3-D case reduces over 384 features; a scale or layout error would be
near 1.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")
recipe = te.recipe
CUDA = torch.device("cuda")
RECIPES = {
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    # TE-JAX's accumulation: fast in every GEMM (te's keyword-only DelayedScaling fields)
    "delayed_fast": lambda: recipe.DelayedScaling(
        amax_history_len=4,
        fp8_gemm_dgrad=recipe.MMParams(use_split_accumulator=False),
        fp8_gemm_wgrad=recipe.MMParams(use_split_accumulator=False),
    ),
    "current": recipe.Float8CurrentScaling,
    "block": recipe.Float8BlockScaling,
}


def relerr(got, ref):
    got, ref = got.double().cpu(), ref.double().cpu()
    return ((got - ref).norm() / ref.norm()).item()


def step(m, x, dy, r):
    x = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        y = m(x)
    y.backward(dy)
    out = (y.detach(), x.grad, m.weight.grad, m.bias.grad)
    m.weight.grad = m.bias.grad = None
    return out


@pytest.mark.parametrize("shape", [(64, 256), (2, 48, 384)], ids=["2d", "3d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_linear_cuda_matches_cpu(name, dtype, shape):
    torch.manual_seed(0)
    r = RECIPES[name]()
    cpu = te.Linear(shape[-1], 256, params_dtype=dtype, device="cpu")
    with torch.no_grad():
        cpu.bias.normal_(0, 0.5)
    gpu = copy.deepcopy(cpu).to(CUDA)
    assert gpu.weight.is_cuda
    # y, dx, dW: their GEMM's fast accumulation (no fp32 promotion) against the CPU's exact sums
    fast = [not mm.use_split_accumulator for mm in (r.fp8_gemm_fprop, r.fp8_gemm_dgrad, r.fp8_gemm_wgrad)]
    fast.append(False)  # db
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(shape, generator=g).to(dtype)
        dy = torch.randn(*shape[:-1], 256, generator=g).to(dtype)
        want = step(cpu, x, dy, r)
        got = step(gpu, x.to(CUDA), dy.to(CUDA), r)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert a.is_cuda and a.dtype == b.dtype and a.shape == b.shape
            tol = 1e-2 if dtype == torch.bfloat16 else (5e-3 if fast[i] else 1e-3)
            assert relerr(a, b) <= tol, (i, relerr(a, b))
    if r.delayed():
        for sg, sc in ((gpu._fwd_state, cpu._fwd_state), (gpu._bwd_state, cpu._bwd_state)):
            assert torch.equal(sg.amax_history.cpu(), sc.amax_history)
            assert torch.equal(sg.scale.cpu(), sc.scale)


def test_main_grad_accumulation_cuda_matches_cpu():
    torch.manual_seed(1)
    r = recipe.Float8CurrentScaling()
    cpu = te.Linear(256, 128, fuse_wgrad_accumulation=True, params_dtype=torch.bfloat16, device="cpu")
    gpu = copy.deepcopy(cpu).to(CUDA)
    cpu.weight.main_grad = torch.zeros(128, 256)
    gpu.weight.main_grad = torch.zeros(128, 256, device=CUDA)
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(32, 256, generator=g).bfloat16()
        dy = torch.randn(32, 128, generator=g).bfloat16()
        step(cpu, x, dy, r)
        step(gpu, x.to(CUDA), dy.to(CUDA), r)
    assert gpu.weight.grad is None
    assert relerr(gpu.weight.main_grad, cpu.weight.main_grad) <= 4e-4


def test_default_device_and_recipe_on_gpu():
    m = te.Linear(64, 64)
    assert m.weight.is_cuda
    ok, why = te.is_fp8_available(return_reason=True)
    cc = torch.cuda.get_device_capability()
    assert ok == (cc >= (8, 9)), why
    r = te.get_default_recipe()
    assert isinstance(r, recipe.DelayedScaling if (8, 9) <= cc < (10, 0) else recipe.Float8CurrentScaling)


def _chain_step(m1, m2, x, dy, r):
    """fc1(fp8_output, fp8_grad) -> fc2(fp8_grad): the quantized h, y, the quantized dx, dW1, dW2."""
    x = x.clone().requires_grad_(True)
    with te.autocast(recipe=r):
        h = m1(x, fp8_output=True, fp8_grad=True)
        y = m2(h, fp8_grad=True)
    y.backward(dy)
    out = (h.detach(), y.detach(), x.grad, m1.weight.grad, m2.weight.grad)
    for m in (m1, m2):
        m.weight.grad = m.bias.grad = None
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_fp8_output_and_grad_cuda_matches_cpu(name, dtype):
    """fp8_output / fp8_grad on CUDA against the CPU backend, two chained layers over two steps
    (DelayedScaling: te_gemm writes the FP8 y and dx through cuBLASLt or te's epilogue; the
    others quantize the fp32 GEMM result). The quantized tensors have the same type and FP8
    dtype and the row-wise copy the same scale layout; their values are compared normwise after
    dequantization with 5e-2: h and dx are FP8 roundings of GEMM results that differ between
    backends by ~2e-3 (test_linear_cuda_matches_cpu), which moves an element by one FP8 step
    (E4M3 6-12%, E5M2 12-25%) where it sits near a rounding boundary, and y, dW read them (a
    scale or layout error would be near 1). DelayedScaling state: the slots filled by quantizing
    the same data match exactly, the GEMM-result slots (fc1's output and both grad-inputs) within
    1e-2."""
    torch.manual_seed(3)
    r = RECIPES[name]()
    cpu1 = te.Linear(256, 256, params_dtype=dtype, device="cpu")
    cpu2 = te.Linear(256, 128, params_dtype=dtype, device="cpu")
    gpu1, gpu2 = copy.deepcopy(cpu1).to(CUDA), copy.deepcopy(cpu2).to(CUDA)
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(2, 64, 256, generator=g).to(dtype)
        dy = torch.randn(2, 64, 128, generator=g).to(dtype)
        want = _chain_step(cpu1, cpu2, x, dy, r)
        got = _chain_step(gpu1, gpu2, x.to(CUDA), dy.to(CUDA), r)
        for i in (0, 2):  # h, dx: quantized
            a, b = got[i], want[i]
            assert type(a) is type(b) and a._fp8_dtype == b._fp8_dtype and a.dtype == b.dtype
            assert a.shape == b.shape
            assert relerr(a.dequantize(torch.float32), b.dequantize(torch.float32)) <= 5e-2, (i, seed)
        for i in (1, 3, 4):
            assert got[i].is_cuda and got[i].dtype == want[i].dtype
            assert relerr(got[i], want[i]) <= 5e-2, (i, seed, relerr(got[i], want[i]))
    if r.delayed():
        exact = {("fwd", 1): (0, 1), ("fwd", 2): (1,), ("bwd", 2): (0,)}
        for k, (mg, mc) in enumerate(((gpu1, cpu1), (gpu2, cpu2)), start=1):
            for d, sg, sc in (("fwd", mg._fwd_state, mc._fwd_state), ("bwd", mg._bwd_state, mc._bwd_state)):
                hg, hc = sg.amax_history.cpu(), sc.amax_history
                for col in range(hc.shape[1]):
                    if col in exact.get((d, k), ()):
                        assert torch.equal(hg[:, col], hc[:, col]), (k, d, col)
                    else:
                        assert torch.allclose(hg[:, col], hc[:, col], rtol=1e-2), (k, d, col)


@pytest.mark.parametrize("name", list(RECIPES))
def test_steps_across_streams_and_sizes_are_bit_identical(name):
    """Default-stream steps reuse one temporary buffer per device (te_torch._kernels.take_tmp)
    and te-core's kept scratch blocks; a side stream's steps use neither. Steps of two layer
    sizes (the buffer grows, then serves the smaller one), on the default stream, a side stream
    and the default stream again, give the bits of each layer's first default-stream step."""
    torch.manual_seed(0)
    r = RECIPES[name]()
    layers = [
        te.Linear(k, n, params_dtype=torch.bfloat16, device=CUDA) for k, n in ((256, 512), (1024, 2048))
    ]
    xs = [torch.randn(64, m.in_features, device=CUDA, dtype=torch.bfloat16) for m in layers]
    dys = [torch.randn(64, m.out_features, device=CUDA, dtype=torch.bfloat16) for m in layers]
    for i, m in enumerate(layers):  # a first step creates the scaling state the copies hold
        step(m, xs[i], dys[i], r)
    states = [copy.deepcopy(m.state_dict()) for m in layers]

    def run(i):
        layers[i].load_state_dict(states[i])  # the same scaling state for every repetition
        return step(layers[i], xs[i], dys[i], r)

    want = [run(0), run(1)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = [run(1), run(0)]
    torch.cuda.current_stream().wait_stream(side)
    again = [run(1), run(0)]
    for got in (on_side, again):
        for got_step, want_step in zip(got, (want[1], want[0]), strict=True):
            for g, e in zip(got_step, want_step, strict=True):
                assert torch.equal(g, e)
