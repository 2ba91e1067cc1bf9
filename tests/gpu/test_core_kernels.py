"""te-core's CUDA kernels against its CPU backend, bit for bit, through te_core._C.

The CPU backend is checked against the independent numpy oracle in tests/core; here every CUDA
kernel must give exactly the CPU backend's bytes on awkward shapes and data (+-max-ish values,
subnormals, FP8 ties, zeros, +-inf, NaN), for fp32/fp16/bf16 inputs and E4M3/E5M2 outputs. Device
memory is torch's; outputs are poisoned (0xAB bytes, NaN scales) before each run so unwritten
elements and written padding both show. Inputs offset by one element reach the scalar paths.
Only collected where torch and a GPU exist (tests/gpu/conftest.py skips everything otherwise).
"""

# The per-case closures handed to both() run at once, inside their loop iteration, so capturing
# the loop variables is intended:
# ruff: noqa: B023
from __future__ import annotations

import zlib

import pytest
from te_core import _C

D, M, P = _C.DType, _C.ScalingMode, _C.Part
CUDA = int(_C.DeviceType.CUDA)
FMTS = ["e4m3", "e5m2"]
SRC = ["float32", "bfloat16", "float16"]
SHAPES = [(1, 1), (7, 13), (1000, 3), (1, 100000), (100000, 1), (129, 257), (3, 33, 65), (4096, 4096)]
POISON_BYTE = 0xAB
POISON_F32_BITS = 0x7FBADBAD  # a NaN no kernel computes
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def _torch():
    return pytest.importorskip("torch")


def fp8_enum(fmt):
    return int(D.FLOAT8_E4M3 if fmt == "e4m3" else D.FLOAT8_E5M2)


def src_enum(name):
    return int({"float32": D.FLOAT32, "float16": D.FLOAT16, "bfloat16": D.BFLOAT16}[name])


def desc(t, dtype: int):
    """A te_tensor for a torch tensor on the CPU or a CUDA device."""
    assert t.is_contiguous()
    if t.is_cuda:
        return _C.Tensor(t.data_ptr(), dtype, list(t.shape), device_type=CUDA, device_index=t.device.index)
    return _C.Tensor(t.data_ptr(), dtype, list(t.shape))


def stream_of(t):
    torch = _torch()
    return torch.cuda.current_stream().cuda_stream if t.is_cuda else 0


def rows_cols(shape):
    cols = shape[-1]
    rows = 1
    for s in shape[:-1]:
        rows *= s
    return rows, cols


def gen(shape, dtype_name, key, fmt="e4m3", specials=True):
    """Awkward data, made on the CPU with a seeded generator (same bytes on every run)."""
    torch = _torch()
    g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    dtype = getattr(torch, dtype_name)
    n = 1
    for s in shape:
        n *= s
    x = torch.randn(n, generator=g) * torch.exp2(torch.empty(n).uniform_(-8, 8, generator=g))
    if specials and n:
        kind = torch.randint(0, 16, (n,), generator=g)
        big = torch.finfo(dtype).max
        tiny = torch.finfo(dtype).smallest_normal * 2.0**-3  # a subnormal of the source dtype
        # exact FP8 ties: midpoints between neighbouring FP8 values
        fp8 = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
        grid = torch.arange(256, dtype=torch.uint8).view(fp8).float()
        grid = torch.unique(grid[torch.isfinite(grid) & (grid >= 0)])
        mids = ((grid[1:] + grid[:-1]) / 2)[torch.randint(0, grid.numel() - 1, (n,), generator=g)]
        sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
        x = torch.where(kind == 0, torch.zeros(()), x)
        x = torch.where(kind == 1, -torch.zeros(()), x)
        x = torch.where(kind == 2, big * torch.rand(n, generator=g) * sign, x)
        x = torch.where(kind == 3, tiny * torch.randint(1, 8, (n,), generator=g).float() * sign, x)
        x = torch.where((kind == 4) | (kind == 5), mids * sign, x)
        x = torch.where(kind == 6, FP8_MAX[fmt] * (0.9 + 0.2 * torch.rand(n, generator=g)) * sign, x)
        m = torch.rand(n, generator=g)
        x[m < 0.002] = float("inf")
        x[(m >= 0.002) & (m < 0.004)] = float("-inf")
        x[(m >= 0.004) & (m < 0.006)] = float("nan")
    return x.to(dtype).reshape(shape).contiguous()


def on_gpu(x, unaligned):
    """x on the GPU; unaligned: inside a buffer offset by one element (only element-aligned)."""
    torch = _torch()
    if not unaligned:
        return x.cuda()
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
    view = flat[1:].view(x.shape)
    view.copy_(x)
    return view


def poison_u8(shape, device):
    torch = _torch()
    return torch.full(shape, POISON_BYTE, dtype=torch.uint8, device=device)


def poison_f32(shape, device):
    torch = _torch()
    return torch.full(shape, POISON_F32_BITS, dtype=torch.int32, device=device).view(torch.float32)


def same_bits(got, want, what):
    torch = _torch()
    got, want = got.cpu(), want.cpu()
    assert got.shape == want.shape, what
    if got.element_size() == 1:
        g, w = got.view(torch.uint8), want.view(torch.uint8)
    elif got.element_size() == 2:
        g, w = got.view(torch.int16), want.view(torch.int16)
    else:
        g, w = got.view(torch.int32), want.view(torch.int32)
    bad = (g != w).nonzero()
    assert bad.numel() == 0, (
        f"{what}: {bad.shape[0]} of {g.numel()} differ, first at {bad[:3].tolist()}: "
        f"got {g[tuple(bad[0])].item()} want {w[tuple(bad[0])].item()}"
    )


def same_floats(got, want, what):
    """Bit-equal floats except NaNs, which must only be NaN on both sides."""
    torch = _torch()
    got, want = got.cpu(), want.cpu()
    gn, wn = torch.isnan(got.float()), torch.isnan(want.float())
    assert torch.equal(gn, wn), f"{what}: NaN positions differ"
    same_bits(
        torch.where(gn, torch.zeros((), dtype=got.dtype), got),
        torch.where(wn, torch.zeros((), dtype=want.dtype), want),
        what,
    )


def both(fn):
    """Runs fn(device) on 'cpu' and 'cuda' and returns both results."""
    torch = _torch()
    cpu = fn("cpu")
    gpu = fn("cuda")
    torch.cuda.synchronize()
    return cpu, gpu


# ---- amax -------------------------------------------------------------------------------------


@pytest.mark.parametrize("unaligned", [False, True], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("dtype", SRC)
@pytest.mark.parametrize("shape", SHAPES + [(0, 7)], ids=str)
def test_amax(shape, dtype, unaligned):
    for specials in [False, True]:
        x = gen(shape, dtype, ("amax", shape, dtype, specials), specials=specials)

        def run(device):
            xi = x if device == "cpu" else on_gpu(x, unaligned)
            out = poison_f32((1,), device)
            _C.amax(desc(xi, src_enum(dtype)), desc(out, int(D.FLOAT32)), stream_of(xi))
            return out

        cpu, gpu = both(run)
        same_floats(gpu, cpu, f"amax specials={specials}")
        if not specials and x.numel():
            assert cpu.item() == x.float().abs().max().item()


# ---- per-tensor quantization -------------------------------------------------------------------


def per_tensor(
    x,
    dtype,
    fmt,
    device,
    *,
    current,
    unaligned=False,
    columnwise=True,
    amax0=0.5,
    scale0=1.0,
    pow2=False,
    eps=0.0,
    reset=False,
):
    torch = _torch()
    rows, cols = rows_cols(tuple(x.shape))
    xi = x if device == "cpu" else on_gpu(x, unaligned)
    rw = poison_u8(tuple(x.shape), device)
    cw = poison_u8((cols, rows), device) if columnwise else None
    rs, cs = poison_f32((1,), device), poison_f32((1,), device)
    amax = torch.full((1,), amax0, dtype=torch.float32, device=device)
    scale = torch.full((1,), scale0, dtype=torch.float32, device=device)
    e = fp8_enum(fmt)
    f = int(D.FLOAT32)
    q = _C.QuantizedTensor(
        int(M.PER_TENSOR),
        rowwise_data=desc(rw, e),
        rowwise_scale_inv=desc(rs, f),
        columnwise_data=desc(cw, e) if columnwise else None,
        columnwise_scale_inv=desc(cs, f) if columnwise else None,
        amax=desc(amax, f),
        scale=desc(scale, f),
    )
    cfg = _C.QuantConfig(compute_scale=current, force_pow2_scales=pow2, amax_epsilon=eps, reset_amax=reset)
    _C.quantize(desc(xi, src_enum(dtype)), q, cfg, stream_of(xi))
    return dict(rw=rw, cw=cw, rs=rs, cs=cs if columnwise else None, amax=amax, scale=scale)


def compare(cpu, gpu, what):
    for k in cpu:
        if cpu[k] is None:
            continue
        if k == "amax":
            same_floats(gpu[k], cpu[k], f"{what} {k}")
        else:
            same_bits(gpu[k], cpu[k], f"{what} {k}")


@pytest.mark.parametrize("unaligned", [False, True], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", SRC)
@pytest.mark.parametrize("shape", SHAPES + [(0, 5), (5, 0)], ids=str)
def test_delayed_cast_transpose_with_amax_accumulation(shape, dtype, fmt, unaligned):
    torch = _torch()
    x = gen(shape, dtype, ("delayed", shape, dtype, fmt), fmt)
    x2 = gen(shape, dtype, ("delayed2", shape, dtype, fmt), fmt, specials=False)
    for scale in [1.0, 8.0, 0.3]:
        cpu, gpu = both(
            lambda d: per_tensor(x, dtype, fmt, d, current=False, unaligned=unaligned, scale0=scale)
        )
        compare(cpu, gpu, f"delayed scale={scale}")
    # amax accumulates over calls: start from a big and from a small earlier amax
    for amax0 in [0.5, 1e30]:
        cpu, gpu = both(lambda d: per_tensor(x2, dtype, fmt, d, current=False, amax0=amax0, scale0=2.0))
        compare(cpu, gpu, f"delayed amax0={amax0}")
        if x2.numel():
            f32_amax0 = torch.tensor(amax0, dtype=torch.float32).item()
            assert cpu["amax"].item() == max(f32_amax0, x2.float().abs().max().item())
    # reset_amax (te_jax's fresh result buffer): the earlier amax is dropped on both backends
    cpu, gpu = both(
        lambda d: per_tensor(x2, dtype, fmt, d, current=False, amax0=1e30, scale0=2.0, reset=True)
    )
    compare(cpu, gpu, "delayed reset_amax")
    assert gpu["amax"].item() == (x2.float().abs().max().item() if x2.numel() else 0.0)


@pytest.mark.parametrize("unaligned", [False, True], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", SRC)
@pytest.mark.parametrize("shape", SHAPES + [(0, 5)], ids=str)
def test_current_scaling(shape, dtype, fmt, unaligned):
    for specials in [False, True]:
        x = gen(shape, dtype, ("current", shape, dtype, fmt, specials), fmt, specials=specials)
        for pow2, eps in [(False, 0.0), (True, 0.0), (False, 1e-3)]:
            cpu, gpu = both(
                lambda d: per_tensor(
                    x,
                    dtype,
                    fmt,
                    d,
                    current=True,
                    unaligned=unaligned,
                    pow2=pow2,
                    eps=eps,
                    columnwise=shape != (4096, 4096) or dtype == "bfloat16",
                )
            )
            compare(cpu, gpu, f"current pow2={pow2} eps={eps} specials={specials}")


def test_current_scaling_tiny_amax_and_special_amaxes():
    torch = _torch()
    for vals in [[1e-38, 0.0], [0.0, 0.0], [float("inf"), 1.0], [float("nan"), 1.0]]:
        x = torch.tensor([vals], dtype=torch.float32)
        for pow2 in [False, True]:
            cpu, gpu = both(lambda d: per_tensor(x, "float32", "e4m3", d, current=True, pow2=pow2))
            compare(cpu, gpu, f"{vals} pow2={pow2}")


def test_per_tensor_cast_16384x8192():
    torch = _torch()
    x = gen((16384, 8192), "bfloat16", "huge", specials=True)
    cpu, gpu = both(lambda d: per_tensor(x, "bfloat16", "e4m3", d, current=True, columnwise=False))
    compare(cpu, gpu, "16384x8192")
    del cpu, gpu
    torch.cuda.empty_cache()


# ---- block scaling ------------------------------------------------------------------------------


def block(x, dtype, fmt, mode, device, pow2, unaligned=False, eps=0.0):
    rows, cols = rows_cols(tuple(x.shape))
    xi = x if device == "cpu" else on_gpu(x, unaligned)
    rw = poison_u8(tuple(x.shape), device)
    cw = poison_u8((cols, rows), device)
    rs = poison_f32(_C.quantized_shape(int(mode), int(P.ROWWISE_SCALE_INV), list(x.shape)), device)
    cs = poison_f32(_C.quantized_shape(int(mode), int(P.COLUMNWISE_SCALE_INV), list(x.shape)), device)
    e, f = fp8_enum(fmt), int(D.FLOAT32)
    q = _C.QuantizedTensor(
        int(mode),
        rowwise_data=desc(rw, e),
        rowwise_scale_inv=desc(rs, f),
        columnwise_data=desc(cw, e),
        columnwise_scale_inv=desc(cs, f),
    )
    _C.quantize(
        desc(xi, src_enum(dtype)), q, _C.QuantConfig(force_pow2_scales=pow2, amax_epsilon=eps), stream_of(xi)
    )
    return dict(rw=rw, cw=cw, rs=rs, cs=cs)


@pytest.mark.parametrize("unaligned", [False, True], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("mode", [M.BLOCK_1D, M.BLOCK_2D], ids=str)
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", SRC)
@pytest.mark.parametrize("shape", SHAPES + [(0, 5), (5, 0), (256, 384)], ids=str)
def test_block_quantize(shape, dtype, fmt, mode, unaligned):
    torch = _torch()
    x = gen(shape, dtype, ("block", shape, dtype, fmt), fmt)
    for pow2, eps in [(True, 0.0), (False, 0.0), (False, 1e-2)]:
        cpu, gpu = both(lambda d: block(x, dtype, fmt, mode, d, pow2, unaligned, eps))
        compare(cpu, gpu, f"block {mode} pow2={pow2} eps={eps}")  # scale padding included
        pad = cpu["rs"].view(torch.int32) == POISON_F32_BITS
        assert pad.sum().item() == cpu["rs"].numel() - (  # padding, and only padding, untouched
            rows_cols(shape)[0] * -(-shape[-1] // 128)
            if mode == M.BLOCK_1D
            else -(-rows_cols(shape)[0] // 128) * -(-shape[-1] // 128)
        )


# ---- dequantize ---------------------------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", SRC)
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("mode", [M.PER_TENSOR, M.BLOCK_1D, M.BLOCK_2D], ids=str)
# No empty shape here: torch gives numel-0 tensors a NULL pointer, which te_dequantize currently
# rejects (tests/core/test_dequantize.py::test_dequantize_empty_with_null_pointers).
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dequantize(shape, mode, fmt, out_dtype):
    torch = _torch()
    g = torch.Generator().manual_seed(zlib.crc32(repr(("deq", shape, mode, fmt)).encode()))
    rows, cols = rows_cols(shape)
    data = torch.randint(0, 256, (rows, cols), generator=g, dtype=torch.uint8)
    for columnwise in [False, True]:
        part = P.COLUMNWISE_SCALE_INV if columnwise else P.ROWWISE_SCALE_INV
        sshape = _C.quantized_shape(int(mode), int(part), list(shape))
        sinv = torch.exp2(torch.empty(sshape).uniform_(-30, 30, generator=g)).float()
        d = data.t().contiguous() if columnwise else data.reshape(shape).contiguous()

        def run(device):
            out = torch.full(shape, float("nan"), dtype=getattr(torch, out_dtype), device=device)
            dd, ss = d.to(device), sinv.to(device)
            kw = {
                ("columnwise" if columnwise else "rowwise") + "_data": desc(dd, fp8_enum(fmt)),
                ("columnwise" if columnwise else "rowwise") + "_scale_inv": desc(ss, int(D.FLOAT32)),
            }
            _C.dequantize(_C.QuantizedTensor(int(mode), **kw), desc(out, src_enum(out_dtype)), stream_of(out))
            return out

        cpu, gpu = both(run)
        same_floats(gpu, cpu, f"dequantize columnwise={columnwise}")


# ---- transpose ----------------------------------------------------------------------------------


@pytest.mark.parametrize("unaligned", [False, True], ids=["aligned", "unaligned"])
@pytest.mark.parametrize(
    "elem",
    [(1, "FLOAT8_E4M3", "uint8"), (2, "BFLOAT16", "int16"), (4, "FLOAT32", "int32")],
    ids=lambda e: f"{e[0]}byte",
)
@pytest.mark.parametrize("shape", SHAPES + [(0, 5), (5, 0)], ids=str)
def test_transpose(shape, elem, unaligned):
    torch = _torch()
    _, te_name, container = elem
    g = torch.Generator().manual_seed(zlib.crc32(repr(("tr", shape, elem)).encode()))
    info = torch.iinfo(torch.uint8 if container == "uint8" else getattr(torch, container))
    x = torch.randint(info.min, info.max, shape, generator=g, dtype=getattr(torch, container))
    rows, cols = rows_cols(shape)
    te_dt = int(getattr(D, te_name))

    def run(device):
        xi = x if device == "cpu" else on_gpu(x, unaligned)
        out = torch.full((cols, rows), 0x5A, dtype=x.dtype, device=device)
        _C.transpose(desc(xi, te_dt), desc(out, te_dt), stream_of(xi))
        return out

    cpu, gpu = both(run)
    same_bits(gpu, cpu, "transpose")
    same_bits(cpu, x.reshape(rows, cols).t().contiguous(), "cpu transpose")


# ---- delayed scaling update ------------------------------------------------------------------


def history_shape(i: int, g):
    """The i-th history's shape in a batch: [L] or [L, cols], every 25th up to 1100 steps long.
    Wide histories (up to 70 columns: a CTA holds 32, 8 rows of threads) take many segments of
    the in-place roll; narrow ones one."""
    torch = _torch()
    L = int(torch.randint(1, 1100 if i % 25 == 0 else 20, (1,), generator=g))
    cols = int(torch.randint(1, 71 if i % 50 == 25 else 9, (1,), generator=g))
    return (L,) if i % 3 == 0 else (L, cols)


@pytest.mark.parametrize("algo", [_C.AmaxComputeAlgo.MAX, _C.AmaxComputeAlgo.MOST_RECENT], ids=str)
@pytest.mark.parametrize("margin", [0.0, 1.0])
@pytest.mark.parametrize("count", [3, 300])  # the small parameter block (<= 4), and 64 at a time
def test_delayed_scaling_update_many_tensors(algo, margin, count):
    torch = _torch()
    g = torch.Generator().manual_seed(zlib.crc32(repr(("dsu", algo, margin, count)).encode()))
    hs, ss = [], []
    for i in range(count):
        shape = history_shape(i, g)
        h = torch.exp2(torch.empty(shape).uniform_(-140, 40, generator=g))
        m = torch.rand(shape, generator=g)
        h[m < 0.05] = 0.0
        h[(m >= 0.05) & (m < 0.07)] = float("inf")
        h[(m >= 0.07) & (m < 0.09)] = float("nan")
        hs.append(h)
        ss.append(torch.rand(1 if len(shape) == 1 else shape[1], generator=g) * 10 + 0.1)

    def run(device):
        h = [t.to(device).clone() for t in hs]
        s = [t.to(device).clone() for t in ss]
        for _ in range(3):  # three steps, each rolling the histories
            _C.delayed_scaling_update(
                [desc(t, int(D.FLOAT32)) for t in h],
                [desc(t, int(D.FLOAT32)) for t in s],
                448.0,
                margin,
                int(algo),
                stream_of(h[0]),
            )
            for t in h:
                t.view(t.shape[0], -1)[0] = 2.5  # this step's amaxes
        return h, s

    (ch, cs), (gh, gs) = both(run)
    for i in range(len(hs)):
        same_floats(gh[i], ch[i], f"history {i}")
        same_floats(gs[i], cs[i], f"scale {i}")


@pytest.mark.parametrize("sizes", [(3, 1), (150, 150)])  # one small launch; 64 entries at a time
def test_delayed_scaling_update_groups(sizes):
    """Two groups in one call, each with its own fp8_max, margin and algo (a step's forward E4M3
    and backward E5M2 histories), through one DelayedScalingUpdate for three steps: GPU against
    CPU, bit for bit."""
    torch = _torch()
    g = torch.Generator().manual_seed(zlib.crc32(repr(("dsu groups", sizes)).encode()))
    params = [(448.0, 0.0, int(_C.AmaxComputeAlgo.MAX)), (57344.0, 1.0, int(_C.AmaxComputeAlgo.MOST_RECENT))]
    groups = []
    for n in sizes:
        hs = [
            torch.exp2(
                torch.empty(int(torch.randint(1, 40, (1,), generator=g)), 3).uniform_(-30, 30, generator=g)
            )
            for _ in range(n)
        ]
        ss = [torch.rand(3, generator=g) * 10 + 0.1 for _ in range(n)]
        groups.append((hs, ss))

    def run(device):
        mine = [([t.to(device).clone() for t in hs], [t.to(device).clone() for t in ss]) for hs, ss in groups]
        upd = _C.DelayedScalingUpdate(
            [
                ([desc(t, int(D.FLOAT32)) for t in hs], [desc(t, int(D.FLOAT32)) for t in ss], *p)
                for (hs, ss), p in zip(mine, params, strict=True)
            ]
        )
        for step in range(3):
            upd(stream_of(mine[0][0][0]))
            for hs, _ in mine:
                for t in hs:
                    t[0] = 1.5 + step  # the next step's amaxes
        return mine

    cpu, gpu = both(run)
    for k, ((chs, css), (ghs, gss)) in enumerate(zip(cpu, gpu, strict=True)):
        for i in range(len(chs)):
            same_floats(ghs[i], chs[i], f"groups[{k}] history {i}")
            same_floats(gss[i], css[i], f"groups[{k}] scale {i}")


@pytest.mark.parametrize("count", [3, 150])  # the small parameter block (<= 4), and 48 at a time
def test_delayed_scaling_next_groups(count):
    """te_delayed_scaling_next_groups (te_jax's out-of-place update with this step's amaxes):
    GPU against CPU bit for bit, on histories up to 1100 steps and 70 columns, with NaN, inf and
    zero amaxes; the inputs keep their bytes."""
    torch = _torch()
    g = torch.Generator().manual_seed(zlib.crc32(repr(("dsn", count)).encode()))
    params = [(448.0, 0.0, int(_C.AmaxComputeAlgo.MAX)), (57344.0, 2.0, int(_C.AmaxComputeAlgo.MOST_RECENT))]
    groups = []
    for _ in range(2):
        hs, ss, am = [], [], []
        for i in range(count):
            shape = history_shape(i, g)
            n = 1 if len(shape) == 1 else shape[1]
            hs.append(torch.exp2(torch.empty(shape).uniform_(-60, 40, generator=g)))
            ss.append(torch.rand(n, generator=g) * 10 + 0.1)
            a = torch.exp2(torch.empty(n).uniform_(-60, 40, generator=g))
            m = torch.rand(n, generator=g)
            a[m < 0.1] = 0.0
            a[(m >= 0.1) & (m < 0.15)] = float("nan")
            a[(m >= 0.15) & (m < 0.2)] = float("inf")
            am.append(a)
        groups.append((hs, ss, am))

    def run(device):
        f = int(D.FLOAT32)
        mine = [tuple([t.to(device).clone() for t in part] for part in grp) for grp in groups]
        outs = [
            (
                [poison_f32(tuple(t.shape), device) for t in hs],
                [poison_f32(tuple(t.shape), device) for t in ss],
            )
            for hs, ss, _ in mine
        ]
        _C.delayed_scaling_next(
            [
                (
                    [desc(t, f) for t in hs],
                    [desc(t, f) for t in ss],
                    [desc(t, f) for t in am],
                    [desc(t, f) for t in nh],
                    [desc(t, f) for t in ns],
                    *p,
                )
                for (hs, ss, am), (nh, ns), p in zip(mine, outs, params, strict=True)
            ],
            stream_of(mine[0][0][0]),
        )
        return mine, outs

    (cin, cout), (gin, gout) = both(run)
    for k in range(2):
        for i in range(count):
            same_floats(gout[k][0][i], cout[k][0][i], f"groups[{k}] next history {i}")
            same_floats(gout[k][1][i], cout[k][1][i], f"groups[{k}] next scale {i}")
            for part in range(3):
                same_floats(gin[k][part][i], groups[k][part][i], f"groups[{k}] input {part} {i} unchanged")
