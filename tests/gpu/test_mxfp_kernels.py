"""MXFP8 and NVFP4 on CUDA against te's CPU backend (itself checked against the numpy oracle in
tests/core): quantization bit for bit (data, scale tables with their poisoned padding, NVFP4's
amaxes; 2-D tiles, stochastic rounding, the Hadamard transform, given amaxes), dequantization bit
for bit, and te_gemm's block-dequantized path within NUMERICS.md's GEMM tolerances. Inputs offset by
one element reach the scalar paths. Skipped, loudly, without a GPU (tests/gpu/conftest.py)."""

# The per-case closures handed to both() run at once, inside their loop iteration:
# ruff: noqa: B023
from __future__ import annotations

import zlib

import pytest
from te_core import _C

D, M = _C.DType, _C.ScalingMode
CUDA = int(_C.DeviceType.CUDA)
SRC = ["float32", "bfloat16", "float16"]
POISON = 0xAB
MODE = {"mxfp8": int(M.MXFP8_1D), "nvfp4": int(M.NVFP4_1D)}
SCALE_DTYPE = {"mxfp8": int(D.FLOAT8_E8M0), "nvfp4": int(D.FLOAT8_E4M3)}
FP8 = {"e4m3": int(D.FLOAT8_E4M3), "e5m2": int(D.FLOAT8_E5M2)}
MX_SHAPES = [(1, 1), (7, 13), (33, 65), (1000, 3), (3, 1000), (129, 257), (2, 3, 100), (256, 4096)]
NV_SHAPES = [(2, 2), (6, 14), (34, 66), (1000, 4), (4, 1000), (130, 258), (256, 4096)]
LARGE = (4096, 4096)  # many CTAs; its CPU reference takes seconds, so fewer variants
NV_RHT_SHAPES = [(16, 2), (48, 66), (160, 258), (1024, 4096)]


def _torch():
    return pytest.importorskip("torch")


def src_enum(name):
    return int({"float32": D.FLOAT32, "float16": D.FLOAT16, "bfloat16": D.BFLOAT16}[name])


def desc(t, dtype, shape=None):
    """A te_tensor over a torch tensor's memory (CPU or CUDA), with an optional logical shape."""
    shape = list(t.shape) if shape is None else list(shape)
    if t.is_cuda:
        return _C.Tensor(t.data_ptr(), dtype, shape, device_type=CUDA, device_index=t.device.index)
    return _C.Tensor(t.data_ptr(), dtype, shape)


def stream_of(t):
    return _torch().cuda.current_stream().cuda_stream if t.is_cuda else 0


def rows_cols(shape):
    rows = 1
    for s in shape[:-1]:
        rows *= s
    return rows, shape[-1]


def round_up(a, b):
    return -(-a // b) * b


def scale_shape(family, rows, cols):
    block = 32 if family == "mxfp8" else 16
    return round_up(rows, 128), round_up(-(-cols // block), 4)


def gen(shape, dtype_name, key, specials=True, nan=True):
    """Normal values spread over 2^[-12, 12] per row, with zeros of both signs, values near the
    dtype's max, subnormals of the dtype, and a few +-inf and (if nan) NaN (made on the CPU,
    seeded). NVFP4 tests leave NaN out where a NaN would make the whole tensor's amax NaN."""
    torch = _torch()
    g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    dtype = getattr(torch, dtype_name)
    rows, cols = rows_cols(shape)
    x = torch.randn(rows, cols, generator=g) * torch.exp2(torch.empty(rows, 1).uniform_(-12, 12, generator=g))
    if specials and x.numel():
        kind = torch.randint(0, 24, (rows, cols), generator=g)
        sign = torch.where(torch.rand(rows, cols, generator=g) < 0.5, -1.0, 1.0)
        x = torch.where(kind == 0, torch.zeros(()), x)
        x = torch.where(kind == 1, -torch.zeros(()), x)
        x = torch.where(kind == 2, torch.finfo(dtype).max * torch.rand(rows, cols, generator=g) * sign, x)
        x = torch.where(kind == 3, torch.finfo(dtype).smallest_normal * 2.0**-3 * sign, x)
        m = torch.rand(rows, cols, generator=g)
        x[m < 0.001] = float("inf")
        x[(m >= 0.001) & (m < 0.002)] = float("-inf")
        if nan:
            x[(m >= 0.002) & (m < 0.003)] = float("nan")
    return x.to(dtype).reshape(shape).contiguous()


def on_device(x, device, unaligned):
    torch = _torch()
    if device == "cpu":
        return x
    if not unaligned:
        return x.cuda()
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
    view = flat[1:].view(x.shape)
    view.copy_(x)
    return view


def both(fn):
    torch = _torch()
    cpu = fn("cpu")
    gpu = fn("cuda")
    torch.cuda.synchronize()
    return cpu, gpu


def same_bytes(got, want, what):
    torch = _torch()
    g, w = got.cpu().view(torch.uint8), want.cpu().view(torch.uint8)
    assert g.shape == w.shape, what
    bad = (g != w).nonzero()
    assert bad.numel() == 0, (
        f"{what}: {bad.shape[0]} of {g.numel()} bytes differ, first at {bad[:3].tolist()}"
    )


def same_floats(got, want, what):
    """fp32 equal bit for bit except NaNs, which need only be NaN on both sides."""
    torch = _torch()
    g, w = got.cpu(), want.cpu()
    assert torch.equal(torch.isnan(g), torch.isnan(w)), f"{what}: NaN positions differ"
    keep = ~torch.isnan(w)
    assert torch.equal(g[keep].view(torch.int32), w[keep].view(torch.int32)), f"{what}: values differ"


class Buffers:
    """Poisoned buffers of one MXFP8 / NVFP4 quantized tensor on `device`, and its descriptor."""

    def __init__(
        self, family, shape, device, fmt="e4m3", rowwise=True, columnwise=True, rht=False, amax=None
    ):
        torch = _torch()
        self.family, self.shape = family, tuple(shape)
        rows, cols = rows_cols(self.shape)
        nv = family == "nvfp4"
        self.data_dtype = int(D.FLOAT4_E2M1) if nv else FP8[fmt]
        self.rht = rht

        def data(n):
            return torch.full((n // 2 if nv else n,), POISON, dtype=torch.uint8, device=device)

        def scales(r, c):
            return torch.full(scale_shape(family, r, c), POISON, dtype=torch.uint8, device=device)

        self.rw = data(rows * cols) if rowwise else None
        self.rs = scales(rows, cols) if rowwise else None
        self.cw = data(rows * cols) if columnwise else None
        self.cs = scales(cols, rows) if columnwise else None
        self.amax = None
        if nv:
            init = [float("nan")] * 2 if amax is None else list(amax)
            self.amax = torch.tensor(init, dtype=torch.float32, device=device)

    def descriptor(self, rowwise=True, columnwise=True):
        rows, cols = rows_cols(self.shape)
        sd = SCALE_DTYPE[self.family]
        use_rw = rowwise and self.rw is not None
        use_cw = columnwise and self.cw is not None
        return _C.QuantizedTensor(
            MODE[self.family],
            rowwise_data=desc(self.rw, self.data_dtype, self.shape) if use_rw else None,
            rowwise_scale_inv=desc(self.rs, sd) if use_rw else None,
            columnwise_data=desc(self.cw, self.data_dtype, (cols, rows)) if use_cw else None,
            columnwise_scale_inv=desc(self.cs, sd) if use_cw else None,
            amax=desc(self.amax, int(D.FLOAT32)) if self.amax is not None else None,
            columnwise_rht=self.rht,
        )

    def parts(self):
        return {k: getattr(self, k) for k in ("rw", "rs", "cw", "cs", "amax") if getattr(self, k) is not None}


def quantize(x, dtype, family, device, fmt="e4m3", unaligned=False, rowwise=True, columnwise=True, rht=False,
             amax=None, **config):  # fmt: skip
    xi = on_device(x, device, unaligned)
    b = Buffers(family, x.shape, device, fmt, rowwise, columnwise, rht, amax)
    _C.quantize(desc(xi, src_enum(dtype)), b.descriptor(), _C.QuantConfig(**config), stream_of(xi))
    return b


def compare(cpu: Buffers, gpu: Buffers, what):
    for k, want in cpu.parts().items():
        if k == "amax":
            same_floats(gpu.amax, want, f"{what} amax")
        else:
            same_bytes(getattr(gpu, k), want, f"{what} {k}")


# ---- quantization ------------------------------------------------------------------------------


@pytest.mark.parametrize("unaligned", [False, True], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("tile_2d", [False, True], ids=["1d", "2d"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", SRC)
@pytest.mark.parametrize("shape", MX_SHAPES, ids=str)
def test_mxfp8_quantize(shape, dtype, fmt, tile_2d, unaligned):
    x = gen(shape, dtype, ("mxfp8", shape, dtype))
    cpu, gpu = both(
        lambda d: quantize(x, dtype, "mxfp8", d, fmt, unaligned and d == "cuda", with_2d_quantization=tile_2d)
    )
    compare(cpu, gpu, f"mxfp8 {fmt} 2d={tile_2d}")


@pytest.mark.parametrize("tile_2d", [False, True], ids=["1d", "2d"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mxfp8_quantize_large(dtype, tile_2d):
    x = gen(LARGE, dtype, ("mxfp8-large", dtype))
    cpu, gpu = both(lambda d: quantize(x, dtype, "mxfp8", d, with_2d_quantization=tile_2d))
    compare(cpu, gpu, f"mxfp8 large 2d={tile_2d}")


@pytest.mark.parametrize("which", ["rowwise", "columnwise"])
def test_mxfp8_one_copy(which):
    x = gen((300, 200), "bfloat16", ("mx-one", which))
    cpu, gpu = both(
        lambda d: quantize(
            x, "bfloat16", "mxfp8", d, rowwise=which == "rowwise", columnwise=which == "columnwise"
        )
    )
    compare(cpu, gpu, which)


@pytest.mark.parametrize("unaligned", [False, True], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("mode", ["plain", "2d", "sr", "2d_sr"])
@pytest.mark.parametrize("dtype", SRC)
@pytest.mark.parametrize("shape", NV_SHAPES, ids=str)
def test_nvfp4_quantize(shape, dtype, mode, unaligned):
    x = gen(shape, dtype, ("nvfp4", shape, dtype), nan=shape[0] * shape[1] < 100)
    cfg = dict(
        with_2d_quantization="2d" in mode, stochastic_rounding="sr" in mode, rng_seed=2**40 + 7, rng_offset=3
    )
    cpu, gpu = both(lambda d: quantize(x, dtype, "nvfp4", d, unaligned=unaligned and d == "cuda", **cfg))
    compare(cpu, gpu, f"nvfp4 {mode}")


@pytest.mark.parametrize("mode", ["plain", "2d", "sr"])
def test_nvfp4_quantize_large(mode):
    x = gen(LARGE, "bfloat16", ("nvfp4-large",), nan=False)
    cfg = dict(
        with_2d_quantization=mode == "2d", stochastic_rounding=mode == "sr", rng_seed=5, rng_offset=2**33
    )
    cpu, gpu = both(lambda d: quantize(x, "bfloat16", "nvfp4", d, **cfg))
    compare(cpu, gpu, f"nvfp4 large {mode}")


@pytest.mark.parametrize("tile_2d", [False, True], ids=["1d", "2d"])
def test_nvfp4_rng_state_read_on_the_device(tile_2d):
    """config->rng_state {seed, offset} in device memory (what te_jax passes under jit): the CUDA
    kernel reads it and gives the CPU's bits for rng_seed / rng_offset."""
    torch = _torch()
    x = gen((160, 258), "bfloat16", ("nvfp4-rng-state", tile_2d), nan=False)
    seed, offset = 0x0123_4567_89AB_CDEF, 2**35 + 9
    cpu = quantize(x, "bfloat16", "nvfp4", "cpu", rht=not tile_2d, with_2d_quantization=tile_2d,
                   stochastic_rounding=True, rng_seed=seed, rng_offset=offset)  # fmt: skip
    state = torch.tensor([seed - 2**64 if seed >= 2**63 else seed, offset], dtype=torch.int64, device="cuda")
    xg = x.cuda()
    gpu = Buffers("nvfp4", x.shape, "cuda", "e4m3", True, True, not tile_2d, None)
    cfg = _C.QuantConfig(with_2d_quantization=tile_2d, stochastic_rounding=True, rng_seed=1, rng_offset=1)
    cfg.rng_state = desc(state, int(_C.DType.INT64))
    _C.quantize(desc(xg, src_enum("bfloat16")), gpu.descriptor(), cfg, stream_of(xg))
    torch.cuda.synchronize()
    compare(cpu, gpu, f"nvfp4 rng_state 2d={tile_2d}")


@pytest.mark.parametrize("sr", [False, True], ids=["rn", "sr"])
@pytest.mark.parametrize("dtype", SRC)
@pytest.mark.parametrize("shape", NV_RHT_SHAPES, ids=str)
def test_nvfp4_quantize_hadamard(shape, dtype, sr):
    x = gen(shape, dtype, ("nvfp4-rht", shape, dtype), specials=False)
    cpu, gpu = both(lambda d: quantize(x, dtype, "nvfp4", d, rht=True, stochastic_rounding=sr, rng_seed=11))
    compare(cpu, gpu, f"nvfp4 rht sr={sr}")
    # and with NaN/inf in the input: the transformed amax and blocks propagate them alike
    y = gen(shape, dtype, ("nvfp4-rht-specials", shape, dtype))
    cpu, gpu = both(lambda d: quantize(y, dtype, "nvfp4", d, rht=True, stochastic_rounding=sr, rng_seed=11))
    compare(cpu, gpu, f"nvfp4 rht specials sr={sr}")


@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
def test_nvfp4_given_amax_and_one_copy(rht):
    x = gen((64, 96), "bfloat16", ("nv-given", rht), specials=False)
    cpu, gpu = both(
        lambda d: quantize(
            x, "bfloat16", "nvfp4", d, rht=rht, amax=[3.0, 70.0], compute_scale=True, use_existing_amax=True
        )
    )
    compare(cpu, gpu, "given amax")
    assert gpu.amax.tolist() == [3.0, 70.0]
    for which in ["rowwise", "columnwise"]:
        cpu, gpu = both(
            lambda d: quantize(
                x,
                "bfloat16",
                "nvfp4",
                d,
                rht=rht,
                rowwise=which == "rowwise",
                columnwise=which == "columnwise",
            )
        )
        compare(cpu, gpu, which)
    odd_m = gen((7, 20), "float16", ("nv-odd-m",))
    cpu, gpu = both(lambda d: quantize(odd_m, "float16", "nvfp4", d, columnwise=False))
    compare(cpu, gpu, "rowwise only, M odd")


@pytest.mark.parametrize("family", ["mxfp8", "nvfp4"])
def test_empty(family):
    torch = _torch()
    for shape in [(0, 4), (4, 0)]:
        x = torch.zeros(shape, dtype=torch.float32)
        cpu, gpu = both(lambda d: quantize(x, "float32", family, d))
        compare(cpu, gpu, f"empty {shape}")


# ---- dequantization ----------------------------------------------------------------------------


def dequantize(b: Buffers, shape, out_dtype, device, copy):
    torch = _torch()
    out = torch.full(shape, float("nan"), dtype=getattr(torch, out_dtype), device=device)
    d = b.descriptor(rowwise=copy == "rowwise", columnwise=copy == "columnwise")
    _C.dequantize(d, desc(out, src_enum(out_dtype)), stream_of(out))
    return out


@pytest.mark.parametrize("copy", ["rowwise", "columnwise"])
@pytest.mark.parametrize("out_dtype", SRC)
@pytest.mark.parametrize(
    "family,shape,rht",
    [("mxfp8", (129, 257), False), ("mxfp8", (2, 3, 100), False), ("nvfp4", (130, 258), False),
     ("nvfp4", (160, 258), True), ("nvfp4", (4096, 4096), True)],
    ids=str,
)  # fmt: skip
def test_dequantize(family, shape, rht, out_dtype, copy):
    x = gen(shape, "float32", ("dq", family, shape), nan=family == "mxfp8")
    q = quantize(x, "float32", family, "cpu", rht=rht)

    def run(device):
        b = q if device == "cpu" else _to_cuda(q)
        return dequantize(b, shape, out_dtype, device, copy)

    cpu, gpu = both(run)
    same_floats(gpu.float(), cpu.float(), f"{family} from {copy}")  # widening to fp32 is exact


def _to_cuda(b: Buffers) -> Buffers:
    c = Buffers.__new__(Buffers)
    c.__dict__.update(b.__dict__)
    for k in ("rw", "rs", "cw", "cs", "amax"):
        v = getattr(b, k)
        setattr(c, k, None if v is None else v.cuda())
    return c


# ---- te_gemm -----------------------------------------------------------------------------------


def hp(t):
    dt = {"torch.float32": D.FLOAT32, "torch.bfloat16": D.BFLOAT16, "torch.float16": D.FLOAT16}[str(t.dtype)]
    return _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=desc(t, int(dt)))


def normwise(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    return ((got - want).norm() / max(want.norm().item(), 1e-30)).item()


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("family,mnk", [("mxfp8", (129, 70, 130)), ("mxfp8", (256, 384, 512)),
                                        ("nvfp4", (130, 70, 34)), ("nvfp4", (256, 384, 512))], ids=str)  # fmt: skip
def test_gemm(family, mnk, trans_a, trans_b, out_dtype):
    """CUDA (dequantize to BF16 + cuBLASLt) against the CPU reference (the same BF16 operands,
    fp32 accumulation in another order): normwise relative error <= 1e-5 (fp32 out), 1e-2 (bf16)."""
    torch = _torch()
    m, n, k = mnk
    a = gen((k, m) if trans_a else (m, k), "float32", ("ga", mnk), specials=False)
    b = gen((n, k) if trans_b else (k, n), "float32", ("gb", mnk), specials=False)
    qa, qb = quantize(a, "float32", family, "cpu"), quantize(b, "float32", family, "cpu")
    bias = torch.randn(n, dtype=getattr(torch, out_dtype))

    def run(device):
        ia, ib = (qa, qb) if device == "cpu" else (_to_cuda(qa), _to_cuda(qb))
        d = torch.full((m, n), float("nan"), dtype=getattr(torch, out_dtype), device=device)
        cfg = _C.GemmConfig(trans_a=trans_a, trans_b=trans_b, epilogue=int(_C.Epilogue.BIAS),
                            bias=desc(bias.to(device), src_enum(out_dtype)))  # fmt: skip
        _C.gemm(ia.descriptor(), ib.descriptor(), hp(d), cfg, stream_of(d))
        return d

    cpu, gpu = both(run)
    assert normwise(gpu, cpu) <= (1e-5 if out_dtype == "float32" else 1e-2)


def test_gemm_nvfp4_wgrad_hadamard():
    torch = _torch()
    x = gen((256, 192), "bfloat16", ("w-x",), specials=False)
    dy = gen((256, 128), "bfloat16", ("w-dy",), specials=False)
    qx = quantize(x, "bfloat16", "nvfp4", "cpu", rht=True)
    qdy = quantize(dy, "bfloat16", "nvfp4", "cpu", rht=True)

    def run(device):
        a, b = (qdy, qx) if device == "cpu" else (_to_cuda(qdy), _to_cuda(qx))
        dw = torch.zeros((128, 192), dtype=torch.float32, device=device)
        _C.gemm(a.descriptor(), b.descriptor(), hp(dw), _C.GemmConfig(trans_a=True), stream_of(dw))
        return dw

    cpu, gpu = both(run)
    assert normwise(gpu, cpu) <= 1e-5
    assert normwise(gpu, dy.double().T @ x.double()) <= 0.2


LOG_SNIPPET = """
import logging, sys
import torch
sys.path.insert(0, {here!r})
import te_core
from test_mxfp_kernels import Buffers, desc, quantize, _to_cuda, hp
from te_core import _C
said = []
handler = logging.Handler()
handler.emit = lambda r: said.append((r.levelno, r.getMessage()))
logging.getLogger("te").addHandler(handler)
logging.getLogger("te").setLevel(logging.INFO)
x = torch.ones(32, 64)
for family in ["nvfp4", "nvfp4", "mxfp8"]:
    q = _to_cuda(quantize(x, "float32", family, "cpu"))
    d = torch.zeros(32, 32, device="cuda")
    _C.gemm(q.descriptor(), q.descriptor(), hp(d), _C.GemmConfig(trans_b=True), torch.cuda.current_stream().cuda_stream)
torch.cuda.synchronize()
for level, message in said:
    print(level, message)
"""


def test_gemm_logs_the_emulated_path_once_per_format():
    """In a fresh process (log_info_once is once per process): one INFO line per format naming the
    block-dequantized path and the GPU's compute capability."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", LOG_SNIPPET.format(here=here)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    lines = [line for line in out if "block dequantization" in line]
    assert len(lines) == 2, out
    assert (
        lines[0].startswith("20 te_gemm: nvfp4_1d operands on compute capability") and "not fast" in lines[0]
    )
    assert "mxfp8_1d" in lines[1]
