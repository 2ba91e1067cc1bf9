"""te_activation_fwd / _bwd and te_dbias_quantize on CUDA against te's CPU backend, through
te_core._C.

The CPU backend is checked against an independent float64 reference in tests/core; here:
  - high-precision results equal the CPU's within what CUDA's fast exponential and divide may
    differ by, propagated through each formula (per-element bound below); 16-bit results within
    1 ulp of the CPU's, or within that fp32 bound; NaN and inf at the same places;
  - an FP8 result equals te_quantize (CUDA) of the CUDA fp32-output run with the same config, every
    part bit for bit (data, scale_inv with its padding, amax, scale);
  - dbias equals the CPU's within the summation-order bound, equals the float64 column sums of
    the CUDA fp32 dx within the GPU's own summation bound, is the same bits on two runs, and the
    same bits whatever dx's output mode (the partials come from the same tiles).
Outputs are poisoned (0xAB bytes, a NaN no kernel computes) before each run, so unwritten
elements and written padding both show. Inputs offset by one element reach the scalar paths.
CLAMPED_SWIGLU runs every case above with its default parameters, and test_clamped_swiglu_params
with others (te_activation_config through the _v2 entry points).
Only collected where torch and a GPU exist (tests/gpu/conftest.py skips everything otherwise).
"""

# The per-case closures run at once, inside their loop iteration, so capturing the loop
# variables is intended:
# ruff: noqa: B023
from __future__ import annotations

import re
import zlib

import pytest
from te_core import _C

A, D, M, P = _C.Activation, _C.DType, _C.ScalingMode, _C.Part
CUDA = int(_C.DeviceType.CUDA)
PLAIN = [A.GELU, A.RELU, A.SILU, A.QGELU, A.SRELU]
GATED = [A.GEGLU, A.REGLU, A.SWIGLU, A.QGEGLU, A.SREGLU, A.GLU, A.CLAMPED_SWIGLU]
KINDS = PLAIN + GATED
CLAMPED_DEFAULTS = (7.0, 1.702, 1.0)  # te_activation_config's (limit, alpha, glu_linear_offset)
# Output shapes (a gated kind's input has the last dim doubled). 4097: no 8-element alignment,
# and a gated unit straddles the two halves of dx.
SHAPES = [(1, 1), (3, 7), (17, 1000), (129, 4097), (2, 3, 40)]


def layouts(shapes):
    """(shape, unaligned) pairs: an unaligned view only where the aligned run takes the vector
    paths (last dim a multiple of 8); elsewhere the row pitch already forces the scalar paths."""
    return [(s, u) for s in shapes for u in ([False, True] if s[-1] % 8 == 0 else [False])]


def layout_id(p):
    return f"{p[0]}{'-unaligned' if p[1] else ''}"


# (input dtype, output dtype) samples; backward uses the input dtype for grad too, except in
# test_bwd_mixed_dtypes.
DTYPES = [("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16"), ("bfloat16", "float32")]
EPS32 = 2.0**-23
POISON_BYTE = 0xAB
POISON_F32_BITS = 0x7FBADBAD

# FP8 output configs: (mode, rowwise, columnwise, initial amax, initial scale, QuantConfig kwargs)
CASES = {
    "delayed": (M.PER_TENSOR, True, False, 0.25, 3.0, {}),
    "delayed_ct": (M.PER_TENSOR, True, True, 0.0, 0.5, {}),
    "delayed_reset": (M.PER_TENSOR, True, True, 1e30, 0.5, {"reset_amax": True}),
    "current": (M.PER_TENSOR, True, False, 0.0, 1.0, {"compute_scale": True}),
    "current_ct": (M.PER_TENSOR, True, True, 0.0, 1.0, {"compute_scale": True}),
    "current_colonly": (M.PER_TENSOR, False, True, 0.0, None, {"compute_scale": True}),
    "block1d": (M.BLOCK_1D, True, True, None, None, {"force_pow2_scales": True}),
    "block1d_eps": (M.BLOCK_1D, True, True, None, None, {"amax_epsilon": 1e-3}),
    "block2d": (M.BLOCK_2D, True, True, None, None, {"force_pow2_scales": True}),
}


def _torch():
    return pytest.importorskip("torch")


def te_dtype(name: str) -> int:
    return int(
        {
            "float32": D.FLOAT32,
            "float16": D.FLOAT16,
            "bfloat16": D.BFLOAT16,
            "e4m3": D.FLOAT8_E4M3,
            "e5m2": D.FLOAT8_E5M2,
        }[name]
    )


def name_of(t) -> str:
    """'float32' for torch.float32 etc."""
    return str(t.dtype).removeprefix("torch.")


def desc(t, dtype: int):
    assert t.is_contiguous()
    if t.is_cuda:
        return _C.Tensor(t.data_ptr(), dtype, list(t.shape), device_type=CUDA, device_index=t.device.index)
    return _C.Tensor(t.data_ptr(), dtype, list(t.shape))


def stream_of(t):
    torch = _torch()
    return torch.cuda.current_stream().cuda_stream if t.is_cuda else 0


def rows_cols(shape):
    rows = 1
    for s in shape[:-1]:
        rows *= s
    return rows, shape[-1]


def in_shape(shape, kind):
    return tuple(shape[:-1]) + (2 * shape[-1],) if kind in GATED else tuple(shape)


def gen(shape, dtype_name, key, specials=True):
    """Inputs around the activations' interesting range (|x| up to ~12), some far out (+-40, where
    tanh and exp saturate), zeros of both signs, tiny values, and with specials a few +-inf / NaN.
    Made on the CPU with a seeded generator, so every run reads the same bytes."""
    torch = _torch()
    g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    n = 1
    for s in shape:
        n *= s
    x = torch.randn(n, generator=g, dtype=torch.float64) * 3
    kind = torch.randint(0, 32, (n,), generator=g)
    x = torch.where(kind == 0, torch.zeros(()), x)
    x = torch.where(kind == 1, -torch.zeros(()), x)
    x = torch.where(kind == 2, 40 * (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 2, x)
    x = torch.where(kind == 3, x * 1e-6, x)
    if specials:
        m = torch.rand(n, generator=g)
        x[m < 0.002] = float("inf")
        x[(m >= 0.002) & (m < 0.004)] = float("-inf")
        x[(m >= 0.004) & (m < 0.006)] = float("nan")
    return x.to(getattr(torch, dtype_name)).reshape(shape).contiguous()


def on_gpu(x, unaligned):
    """x on the GPU; unaligned: inside a buffer offset by one element (only element-aligned)."""
    torch = _torch()
    if not unaligned:
        return x.cuda()
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
    view = flat[1:].view(x.shape)
    view.copy_(x)
    return view


def poison(shape, dtype_name, device):
    torch = _torch()
    if dtype_name in ("e4m3", "e5m2"):
        return torch.full(shape, POISON_BYTE, dtype=torch.uint8, device=device)
    t = torch.full(shape, POISON_F32_BITS, dtype=torch.int32, device=device).view(torch.float32)
    return t if dtype_name == "float32" else t.to(getattr(torch, dtype_name))


def hp(y, dtype_name):
    return _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=desc(y, te_dtype(dtype_name)))


def bits(t):
    torch = _torch()
    t = t.detach().cpu().contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same_bits(got, want, what):
    g, w = bits(got), bits(want)
    assert g.shape == w.shape, f"{what}: shape {tuple(g.shape)} != {tuple(w.shape)}"
    bad = (g != w).nonzero()
    assert bad.numel() == 0, (
        f"{what}: {bad.shape[0]} of {g.numel()} differ, first at {bad[:3].tolist()}: "
        f"got {g[tuple(bad[0])].item()} want {w[tuple(bad[0])].item()}"
    )


# ---- the per-element bound --------------------------------------------------------------------


def magnitude(kind, x, grad=None, params=CLAMPED_DEFAULTS):
    """Per result element, the size of what CUDA's __expf / __fdividef can move it by, in units
    of fp32 eps. Every kind's transcendental part is a sigmoid s = 1 / (1 + e): __expf's relative
    error (2 + 1.16|v| ulps at e^v) moves s by s (1 - s) times that, at most ~0.5 eps over all v,
    and the divide by 2 ulps of s; that enters each formula multiplied by at most ~|x| (fwd) or
    ~|x|^3 (GELU's derivative: x s (1 - s)(1.596 + 0.214 x^2)), times the gate and grad.
    CLAMPED_SWIGLU: of the clamped a (its sigmoid's argument alpha a for the derivative) and the
    clamped, offset gate. Non-finite inputs give 0: there both backends must agree exactly."""
    torch = _torch()
    x = x.double().cpu()
    n = x.shape[-1] // 2 if kind in GATED else x.shape[-1]
    a = x[..., :n]
    b = x[..., n:].abs() if kind in GATED else torch.ones_like(a)
    slope = a
    if kind == A.CLAMPED_SWIGLU:
        limit, alpha, offset = params
        a = a.clamp(max=limit)
        b = (x[..., n:].clamp(-limit, limit) + offset).abs()
        slope = alpha * a
    if grad is None:
        mag = (1 + a.abs()) * b
    else:
        g = grad.double().cpu().abs()
        first = g * (1 + slope.abs()) ** 3 * b
        mag = torch.cat([first, g * (1 + a.abs())], dim=-1) if kind in GATED else first
    return torch.nan_to_num(mag, nan=0.0, posinf=0.0)


def ulp(v, dtype_name):
    """The spacing of dtype at |v| (its subnormal spacing at the bottom)."""
    torch = _torch()
    info = torch.finfo(getattr(torch, dtype_name))
    e = torch.floor(torch.log2(v.abs().clamp(min=info.smallest_normal)))
    return torch.exp2(e) * info.eps


def assert_close_to_cpu(got, want, mag, dtype_name, what):
    """got (CUDA) vs want (CPU): NaN/inf at the same places; finite elements within
    4 ulp(want) + 8 eps32 * mag (plus one output ulp for 16-bit outputs, whose rounding may fall
    on either side of a boundary)."""
    torch = _torch()
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    mag = mag.reshape(w.shape)
    assert torch.equal(torch.isnan(g), torch.isnan(w)), f"{what}: NaN positions differ"
    fin = torch.isfinite(w)
    assert torch.equal(g[~fin & ~torch.isnan(w)], w[~fin & ~torch.isnan(w)]), f"{what}: inf differ"
    assert torch.isfinite(g[fin]).all(), f"{what}: CUDA non-finite where the CPU is finite"
    tol = 4 * ulp(w, "float32") + 8 * EPS32 * mag
    if dtype_name != "float32":
        tol = tol + ulp(w, dtype_name)
    err = (g - w).abs()
    bad = fin & (err > tol)
    if bad.any():
        i = bad.nonzero()[0].tolist()
        pytest.fail(
            f"{what}: {int(bad.sum())} of {w.numel()} beyond the bound; first at {i}: got "
            f"{g[tuple(i)].item()!r} want {w[tuple(i)].item()!r} (tol {tol[tuple(i)].item():.3g})"
        )


def dbias_bound(dx64, dtype_name):
    """The float64 column sums of dx [rows, cols], and per column the summation bound of either
    fixed order (recursive summation of the CPU's rows, or the GPU's 128-row tiles added in
    order: terms * eps * sum |dx|), plus the dtype's rounding, and which columns' sums stay clear of
    the dtype's overflow (elsewhere either side may round to inf)."""
    torch = _torch()
    rows = dx64.shape[0]
    exact = dx64.sum(dim=0)
    tol = (rows + 2) * EPS32 * dx64.abs().sum(dim=0)
    if dtype_name != "float32":
        tol = tol + ulp(exact, dtype_name)
    fits = exact.abs() + tol < 0.99 * torch.finfo(getattr(torch, dtype_name)).max
    return exact, tol, fits


def assert_dbias_close(got, want, dx64, dtype_name, what):
    """CUDA's dbias vs the CPU's: each within its bound of the exact sum, so within both bounds
    of each other."""
    _, tol, fits = dbias_bound(dx64, dtype_name)
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    err = (g - w).abs()
    assert (err[fits] <= 2 * tol[fits]).all(), f"{what}: max error {err[fits].max().item():.3g}"


# ---- runners ----------------------------------------------------------------------------------


def run_fwd(x, kind, out_dtype, device, unaligned=False, act_config=None):
    torch = _torch()
    xi = x if device == "cpu" else on_gpu(x, unaligned)
    rows, _ = rows_cols(tuple(x.shape))
    n = x.shape[-1] // 2 if kind in GATED else x.shape[-1]
    y = poison(tuple(x.shape[:-1]) + (n,), out_dtype, device)
    _C.activation_fwd(
        desc(xi, te_dtype(name_of(x))),
        hp(y, out_dtype),
        int(kind),
        None,
        stream_of(xi),
        act_config=act_config,
    )
    if device == "cuda":
        torch.cuda.synchronize()
    return y


def run_bwd(grad, x, kind, out_dtype, device, dbias_dtype=None, unaligned=False, q=None, act_config=None):
    """dx (high precision, or the quantized parts of `q`) and dbias (None without one)."""
    torch = _torch()
    gi = grad if device == "cpu" else on_gpu(grad, unaligned)
    xi = x if device == "cpu" else on_gpu(x, unaligned)
    db = poison((x.shape[-1],), dbias_dtype, device) if dbias_dtype else None
    dbd = desc(db, te_dtype(dbias_dtype)) if db is not None else None
    if q is None:
        dx = poison(tuple(x.shape), out_dtype, device)
        out, cfg = hp(dx, out_dtype), None
    else:
        dx, out, cfg = None, q["desc"], q["cfg"]
    _C.activation_bwd(
        desc(gi, te_dtype(name_of(grad))),
        desc(xi, te_dtype(name_of(x))),
        out,
        dbd,
        int(kind),
        cfg,
        stream_of(xi),
        act_config=act_config,
    )
    if device == "cuda":
        torch.cuda.synchronize()
    return dx, db


def make_q(case, shape, fmt, device):
    """Poisoned quantized-output buffers for `case`, their descriptor and config."""
    torch = _torch()
    mode, row, col, amax0, scale0, kw = CASES[case]
    rows, cols = rows_cols(tuple(shape))
    e, f = te_dtype(fmt), int(D.FLOAT32)
    parts = {}
    if row:
        parts["rw"] = poison(tuple(shape), fmt, device)
        parts["rs"] = poison(
            tuple(_C.quantized_shape(int(mode), int(P.ROWWISE_SCALE_INV), list(shape))), "float32", device
        )
    if col:
        parts["cw"] = poison((cols, rows), fmt, device)
        parts["cs"] = poison(
            tuple(_C.quantized_shape(int(mode), int(P.COLUMNWISE_SCALE_INV), list(shape))), "float32", device
        )
    if amax0 is not None:
        parts["amax"] = torch.full((1,), amax0, dtype=torch.float32, device=device)
    if scale0 is not None:
        parts["scale"] = torch.full((1,), scale0, dtype=torch.float32, device=device)
    kwargs = {}
    for key, name, dt in [
        ("rw", "rowwise_data", e),
        ("rs", "rowwise_scale_inv", f),
        ("cw", "columnwise_data", e),
        ("cs", "columnwise_scale_inv", f),
        ("amax", "amax", f),
        ("scale", "scale", f),
    ]:
        if key in parts:
            kwargs[name] = desc(parts[key], dt)
    return {"parts": parts, "desc": _C.QuantizedTensor(int(mode), **kwargs), "cfg": _C.QuantConfig(**kw)}


def te_quantize(x, dtype_name, case, fmt):
    """te_quantize (on x's device) of x with `case`'s config: the parts it writes."""
    torch = _torch()
    q = make_q(case, tuple(x.shape), fmt, x.device.type)
    _C.quantize(desc(x, te_dtype(dtype_name)), q["desc"], q["cfg"], stream_of(x))
    torch.cuda.synchronize()
    return q["parts"]


def assert_parts_equal(got, want, what):
    assert got.keys() == want.keys()
    for k in got:
        assert_same_bits(got[k], want[k], f"{what}: {k}")


# ---- forward ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{d[0]}-{d[1]}")
@pytest.mark.parametrize("layout", layouts(SHAPES), ids=layout_id)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_fwd_high_precision(kind, layout, dtypes):
    (shape, unaligned), (in_dt, out_dt) = layout, dtypes
    x = gen(in_shape(shape, kind), in_dt, ("fwd", kind.name, shape, in_dt))
    cpu = run_fwd(x, kind, out_dt, "cpu")
    gpu = run_fwd(x, kind, out_dt, "cuda", unaligned)
    assert_close_to_cpu(gpu, cpu, magnitude(kind, x), out_dt, f"{kind.name} y")


def test_fwd_empty_rows():
    torch = _torch()
    for kind in [A.GELU, A.SWIGLU]:
        x = torch.empty(in_shape((0, 5), kind), dtype=torch.bfloat16, device="cuda")
        y = run_fwd(x, kind, "float32", "cuda")
        assert y.shape == (0, 5)


@pytest.mark.parametrize("kind", [A.GELU, A.SWIGLU], ids=lambda k: k.name)
def test_fwd_8192(kind):
    torch = _torch()
    x = gen(in_shape((8192, 8192), kind), "bfloat16", ("big", kind.name), specials=False)
    cpu = run_fwd(x, kind, "bfloat16", "cpu")
    gpu = run_fwd(x, kind, "bfloat16", "cuda")
    assert_close_to_cpu(gpu, cpu, magnitude(kind, x), "bfloat16", f"{kind.name} 8192")
    del gpu
    torch.cuda.empty_cache()


# ---- backward ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{d[0]}-{d[1]}")
@pytest.mark.parametrize("layout", layouts(SHAPES), ids=layout_id)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_bwd_high_precision_with_dbias(kind, layout, dtypes):
    """dx against the CPU, with and without the bias gradient (flat pass vs tile kernel)."""
    (shape, unaligned), (in_dt, out_dt) = layout, dtypes
    x = gen(in_shape(shape, kind), in_dt, ("bwd", kind.name, shape, in_dt), specials=False)
    grad = gen(tuple(shape), in_dt, ("grad", kind.name, shape, in_dt), specials=False)
    mag = magnitude(kind, x, grad)
    cpu_dx, cpu_db = run_bwd(grad, x, kind, out_dt, "cpu", dbias_dtype=in_dt)
    for with_dbias in [False, True]:
        dx, db = run_bwd(grad, x, kind, out_dt, "cuda", in_dt if with_dbias else None, unaligned)
        assert_close_to_cpu(dx, cpu_dx, mag, out_dt, f"{kind.name} dx dbias={with_dbias}")
    # dbias: against the CPU, against the float64 sums of the CUDA fp32 dx, and run to run.
    dx32, db = run_bwd(grad, x, kind, "float32", "cuda", in_dt, unaligned)
    dx64 = dx32.double().cpu().reshape(-1, x.shape[-1])
    assert_dbias_close(db, cpu_db, dx64, in_dt, f"{kind.name} dbias vs CPU")
    exact, tol, fits = dbias_bound(dx64, in_dt)
    err = (db.double().cpu() - exact).abs()
    assert (err[fits] <= tol[fits]).all(), f"{kind.name}: dbias vs the exact sums of CUDA's dx"
    _, db2 = run_bwd(grad, x, kind, out_dt, "cuda", in_dt, unaligned)
    assert_same_bits(db2, db, f"{kind.name} dbias run to run / across dx dtypes")


def test_bwd_specials_nan_and_inf_places():
    """NaN/inf in input and grad: the same places as the CPU, dx and dbias."""
    for kind in [A.GELU, A.RELU, A.SRELU, A.SWIGLU, A.GLU, A.SREGLU, A.CLAMPED_SWIGLU]:
        shape = (130, 72)
        x = gen(in_shape(shape, kind), "float32", ("spec", kind.name))
        grad = gen(shape, "float32", ("specg", kind.name))
        cpu_dx, cpu_db = run_bwd(grad, x, kind, "float32", "cpu", "float32")
        dx, db = run_bwd(grad, x, kind, "float32", "cuda", "float32")
        assert_close_to_cpu(dx, cpu_dx, magnitude(kind, x, grad), "float32", f"{kind.name} dx")
        torch = _torch()
        assert torch.equal(torch.isnan(db.cpu()), torch.isnan(cpu_db)), f"{kind.name} dbias NaN places"


@pytest.mark.parametrize("kind", [A.GELU, A.SWIGLU, A.QGEGLU], ids=lambda k: k.name)
def test_bwd_mixed_dtypes(kind):
    """grad and input of different dtypes, and a dbias of a third."""
    shape = (33, 136)
    x = gen(in_shape(shape, kind), "bfloat16", ("mx", kind.name), specials=False)
    grad = gen(shape, "float32", ("mg", kind.name), specials=False)
    cpu_dx, cpu_db = run_bwd(grad, x, kind, "float16", "cpu", "float32")
    dx, db = run_bwd(grad, x, kind, "float16", "cuda", "float32")
    assert_close_to_cpu(dx, cpu_dx, magnitude(kind, x, grad), "float16", f"{kind.name} dx")
    cpu_dx32, _ = run_bwd(grad, x, kind, "float32", "cpu")
    assert_dbias_close(db, cpu_db, cpu_dx32.double().reshape(-1, x.shape[-1]), "float32", "dbias")


def test_bwd_empty_rows_zero_dbias():
    torch = _torch()
    for kind in [A.SILU, A.REGLU]:
        x = torch.empty(in_shape((0, 6), kind), dtype=torch.float32, device="cuda")
        grad = torch.empty((0, 6), dtype=torch.float32, device="cuda")
        _, db = run_bwd(grad, x, kind, "float32", "cuda", "bfloat16")
        assert (db.float().cpu() == 0).all() and not torch.signbit(db.float().cpu()).any()


@pytest.mark.parametrize("kind", [A.GELU, A.SWIGLU], ids=lambda k: k.name)
def test_bwd_8192(kind):
    torch = _torch()
    shape = (8192, 8192)
    x = gen(in_shape(shape, kind), "bfloat16", ("bigb", kind.name), specials=False)
    grad = gen(shape, "bfloat16", ("bigg", kind.name), specials=False)
    cpu_dx, cpu_db = run_bwd(grad, x, kind, "bfloat16", "cpu", "float32")
    dx, db = run_bwd(grad, x, kind, "bfloat16", "cuda", "float32")
    assert_close_to_cpu(dx, cpu_dx, magnitude(kind, x, grad), "bfloat16", f"{kind.name} dx 8192")
    del dx
    dx32, db2 = run_bwd(grad, x, kind, "float32", "cuda", "float32")
    assert_same_bits(db2, db, "dbias: bf16 dx vs fp32 dx")
    assert_dbias_close(db, cpu_db, dx32.double().cpu().reshape(-1, x.shape[-1]), "float32", "dbias 8192")
    del dx32
    torch.cuda.empty_cache()


# ---- FP8 outputs ------------------------------------------------------------------------------

Q_SHAPES = [(1, 1), (3, 7), (129, 4097), (256, 384), (2, 3, 40)]
SPECIALS = (A.GELU, A.SWIGLU)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layout", layouts(Q_SHAPES), ids=layout_id)
def test_fwd_fp8_equals_te_quantize_of_fp32_result(layout, case, fmt):
    shape, unaligned = layout
    for kind in KINDS:
        in_dt = "bfloat16" if kind in GATED else "float32"
        # NaN/inf (which make amax NaN) for two kinds; real amaxes and scales for the rest.
        x = gen(in_shape(shape, kind), in_dt, ("q", kind.name, shape, case), kind in SPECIALS)
        xi = on_gpu(x, unaligned)
        y32 = run_fwd(x, kind, "float32", "cuda", unaligned)
        want = te_quantize(y32, "float32", case, fmt)
        q = make_q(case, shape, fmt, "cuda")
        _C.activation_fwd(desc(xi, te_dtype(in_dt)), q["desc"], int(kind), q["cfg"], stream_of(xi))
        assert_parts_equal(q["parts"], want, f"{kind.name} {case}")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layout", layouts(Q_SHAPES), ids=layout_id)
def test_bwd_fp8_equals_te_quantize_of_fp32_result(layout, case, fmt):
    """dx quantized (with and without the bias gradient) == te_quantize of the fp32 dx; dbias the
    same bits as the fp32-dx run's."""
    shape, unaligned = layout
    for kind in KINDS:
        in_dt = "float16" if kind in GATED else "bfloat16"
        x = gen(in_shape(shape, kind), in_dt, ("qb", kind.name, shape, case), kind in SPECIALS)
        grad = gen(tuple(shape), in_dt, ("qg", kind.name, shape, case), specials=False)
        dx32, db32 = run_bwd(grad, x, kind, "float32", "cuda", "float32", unaligned)
        want = te_quantize(dx32, "float32", case, fmt)
        for dbias in [None, "float32"]:
            q = make_q(case, tuple(x.shape), fmt, "cuda")
            _, db = run_bwd(grad, x, kind, None, "cuda", dbias, unaligned, q=q)
            assert_parts_equal(q["parts"], want, f"{kind.name} {case} dbias={dbias}")
            if dbias:
                assert_same_bits(db, db32, f"{kind.name} {case}: dbias vs the fp32-dx run")


@pytest.mark.parametrize("case", ["delayed", "current_ct", "block1d"])
def test_fp8_empty_rows_match_te_quantize(case):
    torch = _torch()
    for kind in [A.GELU, A.SWIGLU]:
        x = torch.empty(in_shape((0, 5), kind), dtype=torch.bfloat16, device="cuda")
        want = te_quantize(torch.empty((0, 5), dtype=torch.float32, device="cuda"), "float32", case, "e4m3")
        q = make_q(case, (0, 5), "e4m3", "cuda")
        _C.activation_fwd(desc(x, te_dtype("bfloat16")), q["desc"], int(kind), q["cfg"], stream_of(x))
        torch.cuda.synchronize()
        assert_parts_equal(q["parts"], want, f"{kind.name} {case} empty")


# ---- CLAMPED_SWIGLU's parameters -----------------------------------------------------------------

CLAMPED_PARAMS = [(0.75, 1.702, 0.5), (2.0, 3.0, 0.0), (float("inf"), 1.25, -1.0)]


@pytest.mark.parametrize("params", CLAMPED_PARAMS, ids=str)
@pytest.mark.parametrize("layout", layouts([(3, 7), (129, 4097), (2, 3, 40)]), ids=layout_id)
def test_clamped_swiglu_params(layout, params):
    """Non-default limit / alpha / glu_linear_offset (most elements beyond a limit of 0.75):
    high-precision forward and backward against the CPU, dx exactly 0 where a clamp holds (the
    masks are comparisons, no approximation), and FP8 outputs == te_quantize of the fp32 run."""
    torch = _torch()
    shape, unaligned = layout
    kind = A.CLAMPED_SWIGLU
    cfg = _C.ActivationConfig(*params)
    x = gen(in_shape(shape, kind), "bfloat16", ("cp", shape, params))
    cpu = run_fwd(x, kind, "float32", "cpu", act_config=cfg)
    gpu = run_fwd(x, kind, "float32", "cuda", unaligned, act_config=cfg)
    assert_close_to_cpu(gpu, cpu, magnitude(kind, x, params=params), "float32", f"y {params}")
    xs = gen(in_shape(shape, kind), "float32", ("cpb", shape, params), specials=False)
    grad = gen(tuple(shape), "float32", ("cpg", shape, params), specials=False)
    cpu_dx, cpu_db = run_bwd(grad, xs, kind, "float32", "cpu", "float32", act_config=cfg)
    dx, db = run_bwd(grad, xs, kind, "float32", "cuda", "float32", unaligned, act_config=cfg)
    assert_close_to_cpu(dx, cpu_dx, magnitude(kind, xs, grad, params), "float32", f"dx {params}")
    assert_dbias_close(db, cpu_db, dx.double().cpu().reshape(-1, xs.shape[-1]), "float32", "dbias")
    n = shape[-1]
    a, b = xs[..., :n], xs[..., n:]
    held = torch.cat([a > params[0], b.abs() > params[0]], dim=-1)
    assert (dx.cpu()[held] == 0).all() and (cpu_dx[held] == 0).all()
    for case in ["delayed_ct", "current_ct", "block1d"]:
        want = te_quantize(
            run_fwd(x, kind, "float32", "cuda", unaligned, act_config=cfg), "float32", case, "e4m3"
        )
        q = make_q(case, shape, "e4m3", "cuda")
        xi = on_gpu(x, unaligned)
        _C.activation_fwd(desc(xi, te_dtype("bfloat16")), q["desc"], int(kind), q["cfg"], stream_of(xi), cfg)
        assert_parts_equal(q["parts"], want, f"fwd {case} {params}")
        dx32, _ = run_bwd(grad, xs, kind, "float32", "cuda", None, unaligned, act_config=cfg)
        want = te_quantize(dx32, "float32", case, "e5m2")
        q = make_q(case, tuple(xs.shape), "e5m2", "cuda")
        run_bwd(grad, xs, kind, None, "cuda", None, unaligned, q=q, act_config=cfg)
        assert_parts_equal(q["parts"], want, f"bwd {case} {params}")


def test_clamped_swiglu_config_errors_on_cuda():
    torch = _torch()
    x = torch.zeros((4, 6), dtype=torch.float32, device="cuda")
    y = torch.zeros((4, 3), dtype=torch.float32, device="cuda")
    with raises("te_activation_fwd_v2: act_config->limit: expected a value > 0"):
        _C.activation_fwd(
            desc(x, int(D.FLOAT32)),
            hp(y, "float32"),
            int(A.CLAMPED_SWIGLU),
            act_config=_C.ActivationConfig(-1.0),
        )


# ---- te_dbias_quantize ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", list(CASES))
# (2176, 4224): 17 x 33 = 561 tiles, more than one wave of resident CTAs, so the separate-pass
# path runs (smaller inputs take the one cooperative launch: cast_tile.cuh's kCoop).
@pytest.mark.parametrize("layout", layouts(Q_SHAPES + [(17, 1000), (1000, 3), (2176, 4224)]), ids=layout_id)
def test_dbias_quantize(layout, case, dtype):
    """FP8 parts == te_quantize (CUDA) of the same input; dbias vs the CPU and run to run."""
    shape, unaligned = layout
    torch = _torch()
    x = gen(shape, dtype, ("dq", shape, case, dtype), specials=False)
    xi = on_gpu(x, unaligned)
    want = te_quantize(xi, dtype, case, "e5m2")
    cols = shape[-1]

    def run(device, xin):
        q = make_q(case, shape, "e5m2", device)
        db = poison((cols,), dtype, device)
        _C.dbias_quantize(
            desc(xin, te_dtype(dtype)), q["desc"], desc(db, te_dtype(dtype)), q["cfg"], stream_of(xin)
        )
        if device == "cuda":
            torch.cuda.synchronize()
        return q["parts"], db

    parts, db = run("cuda", xi)
    assert_parts_equal(parts, want, f"dbias_quantize {case}")
    _, cpu_db = run("cpu", x)
    assert_dbias_close(db, cpu_db, x.double().reshape(-1, cols), dtype, "dbias vs CPU")
    _, db2 = run("cuda", xi)
    assert_same_bits(db2, db, "dbias run to run")


def test_dbias_quantize_empty_rows():
    torch = _torch()
    x = torch.empty((0, 9), dtype=torch.bfloat16, device="cuda")
    q = make_q("current_ct", (0, 9), "e4m3", "cuda")
    db = poison((9,), "float32", "cuda")
    _C.dbias_quantize(
        desc(x, te_dtype("bfloat16")), q["desc"], desc(db, int(D.FLOAT32)), q["cfg"], stream_of(x)
    )
    torch.cuda.synchronize()
    assert (db.cpu() == 0).all()
    assert q["parts"]["amax"].item() == 0.0 and q["parts"]["scale"].item() == 1.0


# ---- errors -----------------------------------------------------------------------------------


def raises(text):
    return pytest.raises(ValueError, match=re.escape(text))


def test_errors_name_the_argument():
    torch = _torch()
    x = torch.zeros((4, 6), dtype=torch.float32, device="cuda")
    y_host = torch.zeros((4, 6), dtype=torch.float32)
    y = torch.zeros((4, 6), dtype=torch.float32, device="cuda")
    f = int(D.FLOAT32)
    with raises(
        "te_activation_fwd: output->rowwise_data.device: expected the device of input (cuda:0), got cpu"
    ):
        _C.activation_fwd(desc(x, f), hp(y_host, "float32"), int(A.GELU))
    with raises("te_activation_fwd: input.shape: expected an even last dim for a gated activation"):
        _C.activation_fwd(desc(torch.zeros((4, 5), device="cuda"), f), hp(y, "float32"), int(A.GEGLU))
    with raises("te_activation_bwd: grad.device: expected the device of input (cuda:0), got cpu"):
        _C.activation_bwd(desc(y_host, f), desc(x, f), hp(y, "float32"), None, int(A.GELU))
    db_host = torch.zeros((6,), dtype=torch.float32)
    with raises("te_activation_bwd: dbias.device: expected the device of input (cuda:0), got cpu"):
        _C.activation_bwd(desc(y, f), desc(x, f), hp(y, "float32"), desc(db_host, f), int(A.GELU))
    q = make_q("current_ct", (4, 6), "e4m3", "cpu")
    with raises(
        "te_dbias_quantize: output->rowwise_data.device: expected the device of input (cuda:0), got cpu"
    ):
        _C.dbias_quantize(desc(x, f), q["desc"], desc(torch.zeros(6, device="cuda"), f), q["cfg"])
