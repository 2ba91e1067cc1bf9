"""te_torch.functional.gemm / gemm_dgrad / gemm_wgrad on CUDA against the same calls on the CPU
backend (the reference), on identical operands: each quantized tensor is made once on the CPU
and its parts copied to the GPU byte for byte.

Tolerances, normwise relative error against the CPU result (as tests/gpu/test_gemm.py):
fp32 output 1e-5 from high-precision operands, 4e-4 from FP8 (split accumulation; tests/gpu/test_gemm.py says why), 2e-3 (fast
accumulation); bf16/fp16 output 1e-2. Only runs where a GPU is (tests/gpu/conftest.py).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
te = pytest.importorskip("te_torch")
F = torch.nn.functional
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
CUDA = torch.device("cuda")


def relerr(got, ref):
    got, ref = got.double().cpu(), ref.double().cpu()
    return ((got - ref).norm() / ref.norm()).item()


def randn(shape, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def to_cuda(t):
    """A plain or quantized tensor with all its parts copied to the GPU."""
    if not isinstance(t, te.QuantizedTensor):
        return t.to(CUDA)
    names, ctx = t.__tensor_flatten__()
    inner = {n: getattr(t, n).to(CUDA) for n in names}
    return type(t).__tensor_unflatten__(inner, ctx, t.shape, None)


def quantizer(kind, fp8_dtype=E4M3):
    if kind == "per_tensor":
        return te.Float8CurrentScalingQuantizer(fp8_dtype, "cpu")
    return te.Float8BlockQuantizer(fp8_dtype, block_scaling_dim={"block1d": 1, "block2d": 2}[kind])


def check(fn, args, kwargs, tol):
    """fn on CPU operands and on their CUDA copies; every output within tol."""
    want = fn(*args, **kwargs)
    cuda_kwargs = {k: to_cuda(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    got = fn(*(to_cuda(a) for a in args), **cuda_kwargs)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want, strict=True):
        assert g.is_cuda and g.shape == w.shape and g.dtype == w.dtype
        assert relerr(g, w) <= tol, (relerr(g, w), tol)


SHAPES = [((32, 64), 48), ((7, 33), 21), ((2, 5, 40), 17), ((4, 96, 256), 384)]
HP_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("x_shape,n", SHAPES)
def test_high_precision_cuda_matches_cpu(dtype, x_shape, n):
    k = x_shape[-1]
    x, w = randn(x_shape, 1, dtype), randn((n, k), 2, dtype)
    bias, dy = randn((n,), 3, dtype), randn((*x_shape[:-1], n), 4, dtype)
    tol = HP_TOL[dtype]
    check(te.functional.gemm, (x, w), {}, tol)
    check(te.functional.gemm, (x, w), {"bias": bias}, tol)
    check(te.functional.gemm, (x, w), {"bias": bias, "gelu": True}, tol)
    check(te.functional.gemm, (x, w), {"out_dtype": torch.float32}, 1e-5)
    check(te.functional.gemm_dgrad, (dy, w), {}, tol)
    check(te.functional.gemm_wgrad, (dy, x), {"bias_grad": True}, tol)
    # cross-check the CUDA result against torch too
    y = te.functional.gemm(to_cuda(x), to_cuda(w), bias=to_cuda(bias))
    assert relerr(y, F.linear(x.float(), w.float(), bias.float())) <= tol


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kinds", [("per_tensor", "per_tensor"), ("block1d", "block2d")])
@pytest.mark.parametrize("x_shape,n", [((128, 256), 256), ((2, 64, 384), 128)])
def test_fp8_cuda_matches_cpu(out_dtype, kinds, x_shape, n):
    k = x_shape[-1]
    x, w = randn(x_shape, 5, torch.bfloat16), randn((n, k), 6, torch.bfloat16)
    dy = randn((*x_shape[:-1], n), 7, torch.bfloat16)
    act, wt = kinds
    grad_dtype = E5M2 if act == "per_tensor" else E4M3
    xq, wq, dyq = quantizer(act)(x), quantizer(wt)(w), quantizer(act, grad_dtype)(dy)
    fp32 = out_dtype == torch.float32
    accurate, fast = (4e-4, 2e-3) if fp32 else (1e-2, 1e-2)
    kw = {"out_dtype": out_dtype}
    check(te.functional.gemm, (xq, wq), {**kw, "use_split_accumulator": False}, fast)
    check(te.functional.gemm, (xq, wq), {**kw, "use_split_accumulator": True}, accurate)
    check(te.functional.gemm_dgrad, (dyq, wq), kw, accurate)
    check(te.functional.gemm_wgrad, (dyq, xq), kw, accurate)
    if fp32:
        check(te.functional.gemm, (xq, wq), {**kw, "bias": randn((n,), 8), "gelu": True}, accurate)
        check(te.functional.gemm_wgrad, (dyq, xq), {**kw, "bias_grad": True}, accurate)


def test_dgelu_and_accumulate_cuda_match_cpu():
    h, w1, w2 = randn((64, 32), 9), randn((48, 32), 10), randn((24, 48), 11)
    dy = randn((64, 24), 12)
    with torch.no_grad():
        _, pre = te.functional.gemm(h, w1, gelu=True)
    check(te.functional.gemm_dgrad, (dy, w2), {"gelu_input": pre}, 1e-5)
    main_cpu, main_cuda = torch.ones(24, 48), torch.ones(24, 48, device=CUDA)
    hh = randn((64, 48), 13)
    for _ in range(2):
        te.functional.gemm_wgrad(dy, hh, out=main_cpu, accumulate=True)
        te.functional.gemm_wgrad(to_cuda(dy), to_cuda(hh), out=main_cuda, accumulate=True)
    assert relerr(main_cuda, main_cpu) <= 1e-5
    assert relerr(main_cpu, 1 + 2 * dy.t() @ hh) <= 1e-5


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_cuda_equals_eager(backend):
    torch._dynamo.reset()
    x, w = to_cuda(randn((2, 64, 128), 14, torch.bfloat16)), to_cuda(randn((96, 128), 15, torch.bfloat16))
    dy = to_cuda(randn((2, 64, 96), 16, torch.bfloat16))
    qx = te.Float8CurrentScalingQuantizer(E4M3, "cuda")
    qw = te.Float8CurrentScalingQuantizer(E4M3, "cuda")
    qg = te.Float8CurrentScalingQuantizer(E5M2, "cuda")

    def f(x, w, dy, main_grad):
        xq, wq, dyq = qx(x), qw(w), qg(dy)
        y = te.functional.gemm(xq, wq, use_split_accumulator=False)
        g, pre = te.functional.gemm(x, w, gelu=True)
        dx = te.functional.gemm_dgrad(dyq, wq, out_dtype=torch.float32)
        te.functional.gemm_wgrad(dyq, xq, out=main_grad, accumulate=True)
        return y, g, pre, dx

    m_eager, m_comp = torch.zeros(96, 128, device=CUDA), torch.zeros(96, 128, device=CUDA)
    want = f(x, w, dy, m_eager)
    got = torch.compile(f, fullgraph=True, backend=backend)(x, w, dy, m_comp)
    for g, wt in zip(got, want, strict=True):
        assert g.shape == wt.shape and g.dtype == wt.dtype and torch.equal(g, wt)
    assert torch.equal(m_comp, m_eager)
