"""te-core's CUDA LayerNorm / RMSNorm against its CPU backend, through te_core._C.

Forward: the CUDA y, mu and rsigma against the CPU backend's (the sums run in another order on the
GPU, so to fp32 rounding: a few ulps for fp32 outputs, whose bound grows like sqrt(H) because the
CPU reference sums a row sequentially; 1 ulp for fp16/bf16 outputs). FP8 outputs: bit-identical,
every part (data, scale_inv with untouched padding, amax, scale), to te_quantize on CUDA of the
CUDA fp32-output run with the same config, and mu/rsigma the same bits as that run's.
Backward: dx, dgamma, dbeta against the CPU backend within fp32 summation error, and dgamma/dbeta
(and dx) bitwise identical across two CUDA runs.

Shapes reach every kernel layout: one warp per row with several rows per CTA (H <= 256), 1, 2, 4
and 8 register chunks per thread, the re-read path (H = 65536), H not a multiple of 8, M = 0,
inputs and outputs offset by one element (unaligned views). Outputs are poisoned before each run.
Only collected where torch and a GPU exist (tests/gpu/conftest.py skips everything otherwise).
"""

# The per-case closures run at once, inside their loop iteration:
# ruff: noqa: B023
from __future__ import annotations

import math
import re
import zlib

import pytest
from te_core import _C
from test_core_kernels import (
    CUDA,
    POISON_F32_BITS,
    D,
    M,
    P,
    desc,
    fp8_enum,
    on_gpu,
    poison_f32,
    poison_u8,
    rows_cols,
    same_bits,
    src_enum,
    stream_of,
)

EPS = 1e-5
F32 = int(D.FLOAT32)


def _torch():
    return pytest.importorskip("torch")


def dt(name):
    return getattr(_torch(), name)


def te_dtype(t) -> int:
    """te's dtype enum of a fp32/fp16/bf16 torch tensor."""
    return src_enum(str(t.dtype).removeprefix("torch."))


def gen(shape, dtype, key, scale=1.0, offset=0.0):
    """Seeded normal data (made on the CPU, so the same bytes every run)."""
    torch = _torch()
    g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    return (torch.randn(shape, generator=g) * scale + offset).to(dt(dtype)).contiguous()


def place(t, device, unaligned):
    """t on `device`; unaligned (CUDA only): a view one element into a larger buffer."""
    return t if device == "cpu" else on_gpu(t, unaligned)


def empty_out(shape, dtype, device, unaligned, fill):
    torch = _torch()
    n = math.prod(shape)
    if device == "cpu" or not unaligned:
        return torch.full(shape, fill, dtype=dtype, device=device)
    flat = torch.full((n + 1,), fill, dtype=dtype, device=device)
    return flat[1:].view(shape)


def ordinal(t):
    """16-bit float bits as a signed ordinal: neighbouring values differ by 1, +0 == -0."""
    torch = _torch()
    b = t.cpu().contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    return torch.where(b >= 0x8000, -(b & 0x7FFF), b)


def sum_rtol(h):
    """Relative error of a fp32 row sum of h terms, as the CPU reference sums (sequentially)."""
    return 2e-7 * (1.0 + math.sqrt(h) / 4.0)


def assert_close(got, want, what, rtol, atol):
    """fp32: |got - want| <= atol + rtol |want|. fp16/bf16: within 1 ulp, or within that fp32
    tolerance (near zero a 16-bit ulp is finer than the fp32 math's absolute error)."""
    torch = _torch()
    got, want = got.cpu(), want.cpu()
    assert got.shape == want.shape and got.dtype == want.dtype, what
    g64, w64 = got.double(), want.double()
    assert torch.equal(torch.isnan(g64), torch.isnan(w64)), f"{what}: NaN positions differ"
    fin = ~torch.isnan(w64)
    close = (g64 - w64).abs() <= atol + rtol * w64.abs()
    if got.dtype == torch.float32:
        bad = fin & ~close
    else:
        bad = fin & ~close & ((ordinal(got) - ordinal(want)).abs() > 1)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {got.numel()} off; first got {g64[bad][:3].tolist()}, "
        f"want {w64[bad][:3].tolist()} (rtol {rtol}, atol {atol})"
    )


# ---- forward --------------------------------------------------------------------------------


def hp_output(shape, dtype, device, unaligned=False):
    y = empty_out(shape, dt(dtype), device, unaligned, float("nan"))
    return _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=desc(y, src_enum(dtype))), {"y": y}


def run_fwd(device, x, gamma, beta, output, rms, *, zcg=False, stats=True, unaligned=False, quant=None):
    """The forward on `device`; output(device) -> (QuantizedTensor, its buffers). Returns the
    buffers, mu and rsigma (poisoned where not written)."""
    rows, _ = rows_cols(tuple(x.shape))
    xi = place(x, device, unaligned)
    g = place(gamma, device, unaligned)
    b = None if beta is None else place(beta, device, unaligned)
    mu, rs = poison_f32((rows,), device), poison_f32((rows,), device)
    q, bufs = output(device)
    cfg = _C.NormConfig(eps=EPS, zero_centered_gamma=zcg)
    s = stream_of(xi)
    if rms:
        _C.rmsnorm_fwd(
            desc(xi, te_dtype(x)),
            desc(g, te_dtype(gamma)),
            q,
            desc(rs, F32) if stats else None,
            cfg,
            quant,
            s,
        )
    else:
        _C.layernorm_fwd(
            desc(xi, te_dtype(x)),
            desc(g, te_dtype(gamma)),
            None if b is None else desc(b, te_dtype(beta)),
            q,
            desc(mu, F32) if stats else None,
            desc(rs, F32) if stats else None,
            cfg,
            quant,
            s,
        )
    if device == "cuda":
        _torch().cuda.synchronize()
    return bufs, mu, rs


def fwd_inputs(shape, x_dtype, g_dtype, b_dtype, key):
    h = shape[-1]
    x = gen(shape, x_dtype, ("x", key), scale=1.7, offset=0.6)
    gamma = gen((h,), g_dtype, ("g", key), scale=0.3, offset=0.5)
    beta = None if b_dtype is None else gen((h,), b_dtype, ("b", key), scale=0.2)
    return x, gamma, beta


def fp32_tolerance(y_ref, h):
    """atol for y: the fp32 error of y is relative to the row's terms, ~max |y|, not to y."""
    scale = float(y_ref.double().abs().nan_to_num(0).max()) if y_ref.numel() else 0.0
    rtol = 4 * sum_rtol(h)
    return rtol, rtol * scale


# (x, gamma, beta, y) dtypes; beta None: no bias.
COMBOS = [
    ("bfloat16", "bfloat16", "bfloat16", "bfloat16"),
    ("float32", "float32", "float32", "float32"),
    ("float16", "float32", "float16", "float16"),
    ("bfloat16", "float32", None, "float32"),
    ("float32", "bfloat16", "float32", "bfloat16"),
    ("float16", "float16", None, "float32"),
]
# Every layout: one warp per row (H <= 256), 1/2/4/8 chunks per thread, 512 threads x 8 chunks
# (16-bit, H = 32768), re-read (H = 65536), H not a multiple of 8, no rows; and several rows per
# CTA at 4 chunks, where RMSNorm's 16-bit rows with a high-precision output rotate 3 stages;
# H 8000 is H 8192's layout (8 chunks) with the row's last threads partly outside it.
FWD_SHAPES = [
    (1, 1),
    (3, 7),
    (4, 3, 33),
    (17, 1000),
    (5, 2048),
    (7, 3000),
    (6151, 3000),
    (129, 4097),
    (9, 8192),
    (5, 8000),
    (6, 16384),
    (3, 32768),
    (2, 65536),
    (0, 5),
]


# "unaligned" alone keeps 16-bit weights of x's dtype on the path that reads them unconverted
# (zero-centered gamma leaves it), through a padded copy.
@pytest.mark.parametrize("variant", ["plain", "unaligned", "zcg_nostats_unaligned"])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(str(v) for v in c))
@pytest.mark.parametrize("shape", FWD_SHAPES, ids=str)
def test_fwd_vs_cpu(shape, combo, rms, variant):
    x_dt, g_dt, b_dt, y_dt = combo
    odd = variant != "plain"
    zcg = variant.startswith("zcg")
    x, gamma, beta = fwd_inputs(shape, x_dt, g_dt, b_dt, (shape, combo))
    out = {}
    for device in ["cpu", "cuda"]:
        out[device] = run_fwd(
            device,
            x,
            gamma,
            beta,
            lambda d: hp_output(shape, y_dt, d, unaligned=odd),
            rms,
            zcg=zcg,
            stats=not zcg,
            unaligned=odd,
        )
    (cy, cmu, crs), (gy, gmu, grs) = out["cpu"], out["cuda"]
    rtol, atol = fp32_tolerance(cy["y"], shape[-1])
    assert_close(gy["y"], cy["y"], "y", rtol, atol)
    if zcg:
        same_bits(gmu, poison_f32(gmu.shape, "cuda"), "mu absent: untouched")
        same_bits(grs, poison_f32(grs.shape, "cuda"), "rsigma absent: untouched")
        return
    assert_close(grs, crs, "rsigma", 4 * sum_rtol(shape[-1]), 0.0)
    if rms:
        same_bits(gmu, poison_f32(gmu.shape, "cuda"), "RMSNorm writes no mu")
    else:
        xmax = float(x.double().abs().max()) if x.numel() else 0.0
        assert_close(gmu, cmu, "mu", 0.0, 4 * sum_rtol(shape[-1]) * xmax)


@pytest.mark.parametrize("h", [8192, 8000, 16384])
@pytest.mark.parametrize("kind", ["offset", "outlier_first"])
def test_fwd_rows_that_defeat_fp32_sums_vs_cpu(h, kind):
    """Rows whose mean dwarfs their spread (100 +- 4), or whose first element does (3000 beside
    N(0, 1) values), through the 16-bit rows kernels: the kernels' statistics must not cancel, and
    the CPU reference's own sums (double since the thirty-sixth session: index-order fp32 ones
    were 2-4e-5 off float64 here, the kernels within 2e-7) must agree with them."""
    shape = (7, h)
    if kind == "offset":
        x = gen(shape, "bfloat16", ("ox", kind, h), scale=4.0, offset=100.0)
    else:
        x = gen(shape, "bfloat16", ("ox", kind, h), scale=1.0)
        x[:, 0] = 3000.0
    gamma = gen((h,), "bfloat16", ("og", h), scale=0.3, offset=0.5)
    beta = gen((h,), "bfloat16", ("ob", h), scale=0.2)
    (cy, cmu, crs), (gy, gmu, grs) = (
        run_fwd(d, x, gamma, beta, lambda dd: hp_output(shape, "float32", dd), False) for d in ["cpu", "cuda"]
    )
    rtol, atol = fp32_tolerance(cy["y"], h)
    assert_close(gy["y"], cy["y"], "y", rtol, atol)
    assert_close(grs, crs, "rsigma", 4 * sum_rtol(h), 0.0)
    xmax = float(x.double().abs().max())
    assert_close(gmu, cmu, "mu", 0.0, 4 * sum_rtol(h) * xmax)


def test_fwd_16384x8192_vs_cpu():
    torch = _torch()
    shape = (16384, 8192)
    x, gamma, beta = fwd_inputs(shape, "bfloat16", "bfloat16", "bfloat16", "big")
    for rms in [False, True]:
        (cy, cmu, crs), (gy, gmu, grs) = (
            run_fwd(d, x, gamma, beta, lambda dd: hp_output(shape, "bfloat16", dd), rms)
            for d in ["cpu", "cuda"]
        )
        rtol, atol = fp32_tolerance(cy["y"], shape[-1])
        assert_close(gy["y"], cy["y"], f"y rms={rms}", rtol, atol)
        assert_close(grs, crs, f"rsigma rms={rms}", 4 * sum_rtol(shape[-1]), 0.0)
    del cy, gy
    torch.cuda.empty_cache()


# LayerNorm's rows of 8 chunks (16-bit x) with 16-bit weights of x's dtype and a full wave of rows
# take the kernels holding several rows a CTA and the weights in shared memory, on a 132-SM GPU:
# six rows of H 8192 / 8000 a CTA (792 rows a wave), eight of H 6144 with a per-tensor FP8 output
# (1056; its high-precision output stays one row a CTA: that kernel fits nine CTAs an SM), four /
# five with 1x128 blocks (528 / 660) where DRAM feeds each SM at >= 30 GB/s (an H200; an H100 keeps
# them one row a CTA: test_fwd_block1d_kernel_choice). H 8000 has the row's last thread partly outside it. The rows
# interleave across CTAs; the row counts leave 40 rows past the last whole wave of every kernel
# (1624 = 2 x 792 + 40 = 3 x 528 + 40; 5320 = 5 x 1056 + 40 = 8 x 660 + 40), so 40 CTAs take one
# turn more than the others, with one live row in it.
SHARED_W_SHAPES = [(1624, 8192), (1624, 8000), (5320, 6144)]


@pytest.mark.parametrize("variant", ["plain", "no_beta", "out_16bit", "unaligned"])
@pytest.mark.parametrize("x_dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", SHARED_W_SHAPES, ids=str)
def test_fwd_shared_weights_vs_cpu_and_one_row(shape, x_dt, variant):
    """Against the CPU backend, and bit for bit against the same rows run below a wave (one row a
    CTA: the sums run in the same order, so any difference is the shared-weights path's)."""
    b_dt = None if variant == "no_beta" else x_dt
    y_dt = x_dt if variant == "out_16bit" else "float32"
    odd = variant == "unaligned"
    x, gamma, beta = fwd_inputs(shape, x_dt, x_dt, b_dt, ("shared-w", shape, variant))

    def run(device, xs):
        def out(dd):
            return hp_output(tuple(xs.shape), y_dt, dd, unaligned=odd)

        return run_fwd(device, xs, gamma, beta, out, False, unaligned=odd)

    (cy, cmu, crs), (gy, gmu, grs) = run("cpu", x), run("cuda", x)
    rtol, atol = fp32_tolerance(cy["y"], shape[-1])
    assert_close(gy["y"], cy["y"], "y", rtol, atol)
    assert_close(grs, crs, "rsigma", 4 * sum_rtol(shape[-1]), 0.0)
    xmax = float(x.double().abs().max())
    assert_close(gmu, cmu, "mu", 0.0, 4 * sum_rtol(shape[-1]) * xmax)
    for rows in (slice(0, 100), slice(shape[0] - 99, shape[0])):
        oy, omu, ors = run("cuda", x[rows].contiguous())
        same_bits(gy["y"][rows], oy["y"], f"y of rows {rows} vs one row a CTA")
        same_bits(gmu[rows], omu, f"mu of rows {rows} vs one row a CTA")
        same_bits(grs[rows], ors, f"rsigma of rows {rows} vs one row a CTA")


# ---- FP8 outputs: bit-identical to te_quantize of the fp32 y --------------------------------

PT, B1, B2 = M.PER_TENSOR, M.BLOCK_1D, M.BLOCK_2D
# name: (mode, rowwise, columnwise, initial amax, initial scale, QuantConfig kwargs)
FP8_CASES = {
    "delayed": (PT, True, False, 0.25, 3.0, {}),
    "delayed_ct": (PT, True, True, 0.0, 0.5, {}),
    "delayed_colonly": (PT, False, True, 0.5, 2.0, {}),
    "delayed_reset": (PT, True, True, 1e30, 0.5, {"reset_amax": True}),
    "current": (PT, True, False, 5.0, 1.0, {"compute_scale": True}),
    "current_ct": (PT, True, True, 0.0, 1.0, {"compute_scale": True, "force_pow2_scales": True}),
    "current_colonly": (PT, False, True, 0.0, None, {"compute_scale": True, "amax_epsilon": 1e-3}),
    "existing_amax": (PT, True, True, 3.5, 1.0, {"compute_scale": True, "use_existing_amax": True}),
    "block1d_row": (B1, True, False, None, None, {"force_pow2_scales": True}),
    "block1d_ct": (B1, True, True, None, None, {"force_pow2_scales": True}),
    "block1d_fp32_scales": (B1, True, False, None, None, {"amax_epsilon": 1e-3}),
    "block2d": (B2, True, True, None, None, {"force_pow2_scales": True}),
    "block2d_row": (B2, True, False, None, None, {}),
}


def fp8_output(case, shape, fmt, device, unaligned=False):
    torch = _torch()
    mode, row, col, amax0, scale0, _ = FP8_CASES[case]
    rows, cols = rows_cols(shape)
    e = fp8_enum(fmt)
    bufs, parts = {}, {}
    if row:
        bufs["rw"] = empty_out(tuple(shape), torch.uint8, device, unaligned, 0xAB)
        bufs["rs"] = poison_f32(_C.quantized_shape(int(mode), int(P.ROWWISE_SCALE_INV), list(shape)), device)
        parts.update(rowwise_data=desc(bufs["rw"], e), rowwise_scale_inv=desc(bufs["rs"], F32))
    if col:
        bufs["cw"] = poison_u8((cols, rows), device)
        bufs["cs"] = poison_f32(
            _C.quantized_shape(int(mode), int(P.COLUMNWISE_SCALE_INV), list(shape)), device
        )
        parts.update(columnwise_data=desc(bufs["cw"], e), columnwise_scale_inv=desc(bufs["cs"], F32))
    if amax0 is not None:
        bufs["amax"] = torch.full((1,), amax0, dtype=torch.float32, device=device)
        parts["amax"] = desc(bufs["amax"], F32)
    if scale0 is not None:
        bufs["scale"] = torch.full((1,), scale0, dtype=torch.float32, device=device)
        parts["scale"] = desc(bufs["scale"], F32)
    return _C.QuantizedTensor(int(mode), **parts), bufs


def quant_config(case):
    return _C.QuantConfig(**FP8_CASES[case][5])


FP8_SHAPES = [(1, 1), (3, 7), (17, 1000), (130, 257), (129, 4097), (256, 384), (3, 65536), (0, 7)]


@pytest.mark.parametrize("unaligned", [False, True], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("case", list(FP8_CASES))
@pytest.mark.parametrize("shape", FP8_SHAPES, ids=str)
def test_fwd_fp8_equals_quantize_of_fp32(shape, case, rms, unaligned):
    fmt = "e5m2" if zlib.crc32(repr((shape, case)).encode()) % 3 == 0 else "e4m3"
    x_dt = ["bfloat16", "float32", "float16"][zlib.crc32(repr((shape, case, rms)).encode()) % 3]
    x, gamma, beta = fwd_inputs(shape, x_dt, "float32", "bfloat16", (shape, case))
    check_fp8(shape, case, fmt, x, gamma, beta, rms, unaligned)


def check_fp8(shape, case, fmt, x, gamma, beta, rms, unaligned=False, zcg=True):
    torch = _torch()
    y32, mu32, rs32 = run_fwd(
        "cuda", x, gamma, beta, lambda d: hp_output(shape, "float32", d), rms, zcg=zcg, unaligned=unaligned
    )
    fused, mu, rs = run_fwd(
        "cuda",
        x,
        gamma,
        beta,
        lambda d: fp8_output(case, shape, fmt, d, unaligned),
        rms,
        zcg=zcg,
        unaligned=unaligned,
        quant=quant_config(case),
    )
    sep_q, sep = fp8_output(case, shape, fmt, "cuda")
    _C.quantize(desc(y32["y"], F32), sep_q, quant_config(case), stream_of(y32["y"]))
    torch.cuda.synchronize()
    what = f"{case} {fmt} rms={rms}"
    same_bits(rs, rs32, f"{what}: rsigma vs the fp32-output run")
    same_bits(mu, mu32, f"{what}: mu vs the fp32-output run")
    assert fused.keys() == sep.keys()
    for k in fused:
        same_bits(fused[k], sep[k], f"{what}: {k} vs te_quantize of the fp32 y")
    if "rs" in fused and FP8_CASES[case][0] != PT and x.numel():
        assert (fused["rs"].cpu().view(torch.int32) != POISON_F32_BITS).any(), "no scale written"
    if "amax" in fused and FP8_CASES[case][5].get("reset_amax"):
        want = y32["y"].abs().max().item() if x.numel() else 0.0
        assert fused["amax"].item() == want, f"{what}: reset amax is max |y|, not the 1e30 it held"
    if "amax" in fused and FP8_CASES[case][5].get("compute_scale") and x.numel():
        want = y32["y"].abs().max().item()
        if not FP8_CASES[case][5].get("use_existing_amax"):
            assert fused["amax"].item() == want, f"{what}: amax is max |y|"


@pytest.mark.parametrize(
    "case", ["delayed", "delayed_ct", "current", "current_ct", "block1d_row", "block1d_ct", "block2d"]
)
def test_fwd_fp8_16384x8192(case):
    torch = _torch()
    shape = (16384, 8192)
    x, gamma, beta = fwd_inputs(shape, "bfloat16", "bfloat16", "bfloat16", "big-fp8")
    for rms in [False, True]:
        check_fp8(shape, case, "e4m3", x, gamma, None if rms else beta, rms, zcg=False)
    torch.cuda.empty_cache()


@pytest.mark.parametrize(
    "case",
    [
        "delayed",
        "delayed_ct",
        "current",
        "current_colonly",
        "delayed_reset",
        "block1d_row",
        "block1d_fp32_scales",
    ],
)
@pytest.mark.parametrize("x_dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", SHARED_W_SHAPES, ids=str)
def test_fwd_fp8_shared_weights(shape, x_dt, case):
    """The FP8 forms of test_fwd_shared_weights_vs_cpu_and_one_row's LayerNorm (per-tensor; 1x128
    blocks): every part the same bits as te_quantize of the fp32 y (whose path is checked against
    the CPU and the one-row kernel there)."""
    fmt = "e5m2" if case == "current_colonly" else "e4m3"
    x, gamma, beta = fwd_inputs(shape, x_dt, x_dt, x_dt, ("shared-w-fp8", shape, case))
    check_fp8(shape, case, fmt, x, gamma, beta, False, zcg=False)


# te-core's line for LayerNorm's 1x128 shared-weights rows (norm_fwd.cuh,
# kSharedWBlockMinMbpsPerSm): peak DRAM MB/s over the SM count.
SHARED_W_BLOCK_MIN_MBPS_PER_SM = 30000


def norm_kernels(fn):
    """Names of the norm forward kernels `fn` launches (torch.profiler's CUDA activity)."""
    torch = _torch()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if "norm_fwd" in e.name})


def test_fwd_block1d_kernel_choice():
    """LayerNorm's 1x128 rows hold several rows a CTA with the weights in shared memory exactly
    where DRAM is fast per SM (H200: 0.140 -> 0.128 ms at 16384 x 8192; H100: 7% slower), and the
    per-tensor rows on every card; RMSNorm's 1x128 rows keep one row a CTA."""
    torch = _torch()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if not hasattr(props, "memory_clock_rate"):
        pytest.skip(f"torch {torch.__version__} does not report the memory clock to predict the choice")
    mbps = props.memory_clock_rate * props.memory_bus_width * 2 // 8 // 1000
    fast = mbps // props.multi_processor_count >= SHARED_W_BLOCK_MIN_MBPS_PER_SM
    shape = (1624, 8192)
    x, gamma, beta = fwd_inputs(shape, "bfloat16", "bfloat16", "bfloat16", "choice")

    def one(case, rms):
        return norm_kernels(
            lambda: run_fwd(
                "cuda",
                x,
                gamma,
                None if rms else beta,
                lambda d: fp8_output(case, shape, "e4m3", d),
                rms,
                quant=quant_config(case),
            )
        )

    where = f"{props.name}, {mbps // props.multi_processor_count} MB/s an SM"
    block = one("block1d_row", False)
    assert len(block) == 1 and ("shared_w_block" in block[0]) == fast, (where, block)
    per_tensor = one("delayed", False)
    assert len(per_tensor) == 1 and "shared_w_kernel" in per_tensor[0], (where, per_tensor)
    rms_block = one("block1d_row", True)
    assert len(rms_block) == 1 and "shared_w" not in rms_block[0], (where, rms_block)


# ---- backward -------------------------------------------------------------------------------


def bwd_inputs(shape, x_dt, dz_dt, g_dt, add_dt, rms, key):
    """x, dz, gamma, add and the fp32 mu/rsigma of x (from the CPU forward)."""
    torch = _torch()
    h = shape[-1]
    x = gen(shape, x_dt, ("bx", key), scale=1.3, offset=-0.4)
    dz = gen(shape, dz_dt, ("bdz", key))
    gamma = gen((h,), g_dt, ("bg", key), scale=0.3, offset=0.5)
    add = None if add_dt is None else gen(shape, add_dt, ("badd", key))
    x64 = x.double().reshape(-1, h)
    mu = x64.mean(dim=1).float()
    centered = x64 if rms else x64 - mu.double()[:, None]
    rs = (1.0 / torch.sqrt((centered**2).mean(dim=1) + EPS)).float()
    return x, dz, gamma, add, mu, rs


def run_bwd(device, variant, x, dz, gamma, add, mu, rs, dx_dt, dg_dt, with_dbeta, zcg, unaligned):
    torch = _torch()
    h = x.shape[-1]
    xi, dzi = place(x, device, unaligned), place(dz, device, unaligned)
    gi = place(gamma, device, unaligned)
    ai = None if add is None else place(add, device, unaligned)
    mui, rsi = mu.to(device), rs.to(device)
    dx = empty_out(tuple(x.shape), dt(dx_dt), device, unaligned, float("nan"))
    dg = torch.full((h,), float("nan"), dtype=dt(dg_dt), device=device)
    db = torch.full((h,), float("nan"), dtype=dt(dg_dt), device=device) if with_dbeta else None
    cfg = _C.NormConfig(zero_centered_gamma=zcg)
    s = stream_of(xi)

    def d(t):
        return desc(t, te_dtype(t))

    if variant == "layernorm":
        _C.layernorm_bwd(
            d(dzi), d(xi), d(mui), d(rsi), d(gi), d(dx), d(dg), None if db is None else d(db), cfg, s
        )
    elif variant == "rmsnorm":
        _C.rmsnorm_bwd(d(dzi), d(xi), d(rsi), d(gi), d(dx), d(dg), cfg, s)
    else:
        _C.rmsnorm_bwd_add(d(dzi), d(xi), d(ai), d(rsi), d(gi), d(dx), d(dg), cfg, s)
    if device == "cuda":
        torch.cuda.synchronize()
    return dx, dg, db


def bwd_tolerances(x, dz, gamma, add, mu, rs, rms, zcg):
    """The magnitudes the fp32 errors are relative to: dx's terms (rsigma * dxhat, add) and, per
    column, the sums of |dz * xhat| and |dz| over rows."""
    h = x.shape[-1]
    x64, dy = x.double().reshape(-1, h), dz.double().reshape(-1, h)
    mu64 = 0.0 if rms else mu.double()[:, None]
    xhat = (x64 - mu64) * rs.double()[:, None]
    g = gamma.double() + (1.0 if zcg else 0.0)
    terms = float((rs.double()[:, None] * dy * g).abs().max()) if x.numel() else 0.0
    if add is not None and add.numel():
        terms += float(add.double().abs().max())
    return terms, (dy * xhat).abs().sum(dim=0), dy.abs().sum(dim=0)


# (x, dz, gamma, dx, dgamma/dbeta) dtypes; x != dz takes the generic path.
BWD_COMBOS = [
    ("bfloat16", "bfloat16", "bfloat16", "bfloat16", "float32"),
    ("float32", "float32", "float32", "float32", "float32"),
    ("float16", "float16", "float32", "float16", "float16"),
    ("bfloat16", "bfloat16", "float32", "float32", "bfloat16"),
    ("float32", "bfloat16", "bfloat16", "bfloat16", "float32"),
    ("float16", "float32", "float16", "float32", "float32"),
]
# Fused path with 1, 2 and 4 chunks (up to H = 16384) and several rows per
# CTA (H <= 256); the generic path for longer rows (and for x and dz of different dtypes).
BWD_SHAPES = [
    (1, 1),
    (3, 7),
    (4, 3, 33),
    (17, 1000),
    (300, 300),
    (129, 4097),
    (33, 8192),
    (5, 16384),
    (2, 65536),
    (0, 5),
]


@pytest.mark.parametrize("variant", ["layernorm", "rmsnorm", "rmsnorm_add"])
# "unaligned" alone keeps a 16-bit gamma of x's dtype on the fused kernel's unconverted path,
# through a padded copy.
@pytest.mark.parametrize("odd", ["plain", "unaligned", "zcg_unaligned"])
@pytest.mark.parametrize("combo", BWD_COMBOS, ids=lambda c: "-".join(c))
@pytest.mark.parametrize("shape", BWD_SHAPES, ids=str)
def test_bwd_vs_cpu_and_deterministic(shape, combo, odd, variant):
    x_dt, dz_dt, g_dt, dx_dt, dg_dt = combo
    rms = variant != "layernorm"
    zcg, unaligned = odd == "zcg_unaligned", odd != "plain"
    add_dt = g_dt if variant == "rmsnorm_add" else None
    x, dz, gamma, add, mu, rs = bwd_inputs(shape, x_dt, dz_dt, g_dt, add_dt, rms, (shape, combo))
    # LayerNorm computes dbeta, except in some odd cases (dbeta absent is an option too).
    with_dbeta = variant == "layernorm" and not (zcg and shape[-1] % 2 == 0)
    args = (variant, x, dz, gamma, add, mu, rs, dx_dt, dg_dt, with_dbeta, zcg, unaligned)
    cpu = run_bwd("cpu", *args)
    gpu = run_bwd("cuda", *args)
    again = run_bwd("cuda", *args)
    check_bwd(shape, cpu, gpu, again, x, dz, gamma, add, mu, rs, rms, zcg, dg_dt)


def check_bwd(shape, cpu, gpu, again, x, dz, gamma, add, mu, rs, rms, zcg, dg_dt):
    h = shape[-1]
    rows = x.numel() // h
    terms, dg_abs, db_abs = bwd_tolerances(x, dz, gamma, add, mu, rs, rms, zcg)
    # Both sides round their fp32 sums: 16-bit results may be one ulp (up to 2^-7 / 2^-10) apart.
    rel16 = {"float32": 0.0, "bfloat16": 2.0**-7, "float16": 2.0**-10}[dg_dt]
    # dx is a difference of terms: its fp32 error is relative to them, not to dx.
    assert_close(gpu[0], cpu[0], "dx", 4 * sum_rtol(h), 4 * sum_rtol(h) * terms)
    for name, i, abs_sum in [("dgamma", 1, dg_abs), ("dbeta", 2, db_abs)]:
        if cpu[i] is None:
            continue
        got, want = gpu[i].cpu().double(), cpu[i].cpu().double()
        tol = 8 * sum_rtol(rows) * (abs_sum + 1.0) + want.abs() * rel16
        err = (got - want).abs()
        assert (err <= tol).all(), f"{name}: max err {float(err.max())}, tol {float(tol.min())}"
        same_bits(again[i], gpu[i], f"{name}: two CUDA runs")
    same_bits(again[0], gpu[0], "dx: two CUDA runs")


def test_bwd_16384x8192():
    torch = _torch()
    shape = (16384, 8192)
    for variant in ["layernorm", "rmsnorm"]:
        x, dz, gamma, add, mu, rs = bwd_inputs(
            shape, "bfloat16", "bfloat16", "bfloat16", None, variant != "layernorm", "big"
        )
        args = (
            variant,
            x,
            dz,
            gamma,
            add,
            mu,
            rs,
            "bfloat16",
            "bfloat16",
            variant == "layernorm",
            False,
            False,
        )
        cpu, gpu, again = run_bwd("cpu", *args), run_bwd("cuda", *args), run_bwd("cuda", *args)
        check_bwd(
            shape, cpu, gpu, again, x, dz, gamma, add, mu, rs, variant != "layernorm", False, "bfloat16"
        )
    torch.cuda.empty_cache()


# ---- errors on CUDA tensors -----------------------------------------------------------------


def test_errors_name_the_argument():
    torch = _torch()
    x = torch.randn(4, 8, device="cuda")
    g = torch.ones(8, device="cuda")
    y = torch.empty(4, 8, device="cuda")
    q = _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=desc(y, F32))
    with pytest.raises(
        ValueError,
        match=re.escape("te_layernorm_fwd: gamma.device: expected the device of input (cuda:0), got cpu"),
    ):
        _C.layernorm_fwd(desc(x, F32), desc(g.cpu(), F32), None, q)
    e4m3 = int(D.FLOAT8_E4M3)
    q8 = torch.empty(4, 8, dtype=torch.uint8, device="cuda")
    sinv = torch.empty(1, device="cuda")
    fp8 = _C.QuantizedTensor(
        int(M.PER_TENSOR), rowwise_data=desc(q8, e4m3), rowwise_scale_inv=desc(sinv, F32)
    )
    with pytest.raises(ValueError, match=re.escape("te_rmsnorm_fwd: output->amax: current scaling")):
        _C.rmsnorm_fwd(desc(x, F32), desc(g, F32), fp8, None, None, _C.QuantConfig(compute_scale=True))
    dx, dg = torch.empty_like(x), torch.empty_like(g)
    rs = torch.ones(3, device="cuda")
    with pytest.raises(ValueError, match=re.escape("te_rmsnorm_bwd: rsigma.shape: expected 4 elements")):
        _C.rmsnorm_bwd(desc(x, F32), desc(x, F32), desc(rs, F32), desc(g, F32), desc(dx, F32), desc(dg, F32))
    assert CUDA == int(_C.DeviceType.CUDA)
