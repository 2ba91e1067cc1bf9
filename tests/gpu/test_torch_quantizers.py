"""te_torch's quantizers on CUDA: bit-exact against the CPU backend (te-core's reference), plus
the quantized-tensor and torch.compile checks of tests/torch on a CUDA device."""

import io

import pytest
import te_torch as te
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: te_torch's CUDA quantizers are compared with the CPU backend here",
)

SHAPES = [(1, 1), (7, 13), (1000, 3), (2, 3, 5), (129, 257), (256, 384), (4, 128, 1024)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _input(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 2)
    x.view(-1)[:: max(1, x.numel() // 5)] = 0.0
    return x.to(dtype)


def _make(kind, fp8_dtype, device):
    if kind == "current":
        return te.Float8CurrentScalingQuantizer(fp8_dtype, device)
    if kind == "current_pow2_eps":
        return te.Float8CurrentScalingQuantizer(fp8_dtype, device, force_pow_2_scales=True, amax_epsilon=1.0)
    if kind == "delayed":
        return te.Float8Quantizer(
            torch.tensor([3.0], device=device), torch.zeros(1, device=device), fp8_dtype
        )
    if kind == "block1d":
        return te.Float8BlockQuantizer(fp8_dtype, block_scaling_dim=1, force_pow_2_scales=False)
    return te.Float8BlockQuantizer(fp8_dtype, block_scaling_dim=2)


def _parts(qt):
    if isinstance(qt, te.Float8Tensor):
        return [qt._data, qt._transpose, qt._scale_inv]
    m = qt.numel() // qt.shape[-1]
    k = qt.shape[-1]
    rs, cs = qt._rowwise_scale_inv, qt._columnwise_scale_inv
    if qt._is_2D_scaled:  # compare the written region only (padding is never written)
        rs, cs = rs[:, : -(-k // 128)], cs[:, : -(-m // 128)]
    else:
        rs, cs = rs[:, :m], cs[:, :k]
    return [qt._rowwise_data, rs, qt._columnwise_data, cs]


KINDS = ["current", "current_pow2_eps", "delayed", "block1d", "block2d"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_cuda_matches_cpu_bit_exact(kind, shape, dtype, fp8_dtype):
    x = _input(shape, dtype, seed=hash((kind, shape)) % 1000)
    q_cpu, q_gpu = _make(kind, fp8_dtype, "cpu"), _make(kind, fp8_dtype, "cuda")
    a, b = q_cpu(x), q_gpu(x.cuda())
    assert b.device.type == "cuda" and type(a) is type(b)
    for pa, pb in zip(_parts(a), _parts(b), strict=True):
        assert pb.is_cuda and torch.equal(_bits(pa), _bits(pb.cpu()))
    assert torch.equal(_bits(a.dequantize()), _bits(b.dequantize().cpu()))
    if kind != "block1d" and kind != "block2d":
        assert torch.equal(q_cpu.amax, q_gpu.amax.cpu())
        assert torch.equal(q_cpu.scale, q_gpu.scale.cpu())


@pytest.mark.parametrize("kind", KINDS)
def test_cuda_tensor_ops_and_save_load(kind):
    q = _make(kind, torch.float8_e4m3fn, "cuda")
    x = _input((130, 257), torch.bfloat16, seed=3).cuda()
    qt = q(x)
    ref = qt.dequantize()
    w = torch.randn(257, 5, dtype=torch.bfloat16, device="cuda")
    assert torch.equal(qt @ w, ref @ w) and torch.equal(qt + 1, ref + 1)
    c = qt.clone()
    c.copy_(x * 0.5)
    assert torch.equal(c.dequantize(), q(x * 0.5).dequantize())
    buf = io.BytesIO()
    torch.save(qt, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert loaded.device.type == "cuda" and torch.equal(loaded.dequantize(), ref)
    if isinstance(qt, te.Float8Tensor):
        qt.update_usage(columnwise_usage=False)
        qt.update_usage(columnwise_usage=True)
        assert torch.equal(_bits(qt._transpose), _bits(qt._data.reshape(130, 257).t().contiguous()))


def test_cuda_uses_current_stream():
    q = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cuda")
    x = _input((512, 1024), torch.bfloat16, seed=4).cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        qt = q(x)
        deq = qt.dequantize()
    s.synchronize()
    assert torch.equal(deq.cpu(), te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn)(x.cpu()).dequantize())


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_cuda_compile_matches_eager(backend):
    torch._dynamo.reset()
    cq = te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, "cuda")
    bq = te.Float8BlockQuantizer(torch.float8_e4m3fn, block_scaling_dim=1)

    def f(x):
        return cq(x).dequantize(), bq(x).dequantize()

    x = _input((256, 384), torch.bfloat16, seed=5).cuda()
    got = torch.compile(f, fullgraph=True, backend=backend)(x)
    want = f(x)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
