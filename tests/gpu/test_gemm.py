"""te_gemm on CUDA (cuBLASLt) against te's CPU backend (the reference: fp32 accumulation of the
dequantized operands), through te_core._C.

Operands are made once on the GPU with te's own quantize (both copies, so every layout has the
copy it needs), then copied byte for byte to the CPU, so both backends read identical inputs.
Outputs are poisoned (NaN / 0xAB) before each run. Tolerances (NUMERICS.md "How to test"),
normwise relative error ||gpu - cpu||_F / ||cpu||_F:
  fp32 output, fp32 operands            <= 1e-5 (different summation order only)
  fp32 output, bf16/fp16 operands       <= 1e-5 (products exact in fp32; summation order only)
  fp32 output, FP8 operands             <= 4e-4 with split accumulation, 2e-3 with fast
                                        accumulation. Hopper's FP8 tensor cores add the products
                                        inside each MMA with fewer mantissa bits than fp32 (about
                                        14) before promoting to fp32: measured 1.0-1.35e-4 on the
                                        H200 at every K from 96 to 4096, per-tensor and block
                                        scaling alike, so this is the hardware's rounding, not a
                                        scale or layout error (those give errors near 1).
  bf16/fp16 output                      <= 1e-2
  FP8 output                            within one FP8 ulp on >= 99.9% of elements; scale_inv
                                        bit-exact; amax within 4e-4 relative
Only collected where torch and a GPU exist (tests/gpu/conftest.py skips everything otherwise).
"""

# ruff: noqa: B023
from __future__ import annotations

import logging
import zlib

import pytest
from te_core import _C

D, M, P, E = _C.DType, _C.ScalingMode, _C.Part, _C.Epilogue
CUDA = int(_C.DeviceType.CUDA)
POISON_BYTE = 0xAB
FP8_SPLIT_TOL = 4e-4  # see the top of this file

FPROP, DGRAD, WGRAD = (False, True), (False, False), (True, False)  # (trans_a, trans_b)
LAYOUTS = {"fprop": FPROP, "dgrad": DGRAD, "wgrad": WGRAD, "tt": (True, True)}


def _torch():
    return pytest.importorskip("torch")


def te_dtype(t) -> int:
    torch = _torch()
    return int(
        {
            torch.float32: D.FLOAT32,
            torch.float16: D.FLOAT16,
            torch.bfloat16: D.BFLOAT16,
            torch.float8_e4m3fn: D.FLOAT8_E4M3,
            torch.float8_e5m2: D.FLOAT8_E5M2,
        }[t.dtype]
    )


def fp8_id(fmt: str) -> int:
    """te's dtype id of an FP8 format named "e4m3" or "e5m2"."""
    return int(D.FLOAT8_E4M3 if fmt == "e4m3" else D.FLOAT8_E5M2)


def desc(t, dtype: int | None = None):
    assert t.is_contiguous()
    dt = te_dtype(t) if dtype is None else dtype
    if t.is_cuda:
        return _C.Tensor(t.data_ptr(), dt, list(t.shape), device_type=CUDA, device_index=t.device.index)
    return _C.Tensor(t.data_ptr(), dt, list(t.shape))


def stream():
    return _torch().cuda.current_stream().cuda_stream


def randn(shape, key, dtype="float32", scale=1.0):
    torch = _torch()
    g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    return (torch.randn(shape, generator=g) * scale).to(getattr(torch, dtype))


# ---- operands -----------------------------------------------------------------------------------


class Operand:
    """A te operand: a dict of named buffers (CUDA), their te dtypes, and the scaling mode.
    .on(device) builds the _C.QuantizedTensor over the buffers on that device (CPU: copies)."""

    def __init__(self, mode, parts):
        self.mode, self.parts = mode, parts  # parts: name -> (tensor, te dtype)
        self._cpu = {k: (t.cpu(), dt) for k, (t, dt) in parts.items()}

    def on(self, device):
        src = self.parts if device == "cuda" else self._cpu
        return _C.QuantizedTensor(int(self.mode), **{k: desc(t, dt) for k, (t, dt) in src.items()})


def hp_operand(x):
    return Operand(M.PER_TENSOR, {"rowwise_data": (x.cuda(), te_dtype(x))})


def fp8_operand(x, fmt="e4m3", mode=None):
    """x (a CPU tensor, the source) quantized on the GPU by te with both copies."""
    torch = _torch()
    mode = M.PER_TENSOR if mode is None else mode
    e = fp8_id(fmt)
    f = int(D.FLOAT32)
    xc = x.cuda()
    rows, cols = x.shape
    rw = torch.full((rows, cols), POISON_BYTE, dtype=torch.uint8, device="cuda")
    cw = torch.full((cols, rows), POISON_BYTE, dtype=torch.uint8, device="cuda")
    if mode == M.PER_TENSOR:
        rs = torch.zeros(1, device="cuda")
        cs = torch.zeros(1, device="cuda")
        amax = torch.zeros(1, device="cuda")
        scale = torch.ones(1, device="cuda")
        q = _C.QuantizedTensor(
            int(mode),
            rowwise_data=desc(rw, e),
            rowwise_scale_inv=desc(rs, f),
            columnwise_data=desc(cw, e),
            columnwise_scale_inv=desc(cs, f),
            amax=desc(amax, f),
            scale=desc(scale, f),
        )
        _C.quantize(desc(xc), q, _C.QuantConfig(compute_scale=True), stream())
    else:
        rs = torch.zeros(
            _C.quantized_shape(int(mode), int(P.ROWWISE_SCALE_INV), list(x.shape)), device="cuda"
        )
        cs = torch.zeros(
            _C.quantized_shape(int(mode), int(P.COLUMNWISE_SCALE_INV), list(x.shape)), device="cuda"
        )
        q = _C.QuantizedTensor(
            int(mode),
            rowwise_data=desc(rw, e),
            rowwise_scale_inv=desc(rs, f),
            columnwise_data=desc(cw, e),
            columnwise_scale_inv=desc(cs, f),
        )
        _C.quantize(desc(xc), q, _C.QuantConfig(force_pow2_scales=True), stream())
    torch.cuda.synchronize()
    return Operand(
        mode,
        {
            "rowwise_data": (rw, e),
            "rowwise_scale_inv": (rs, f),
            "columnwise_data": (cw, e),
            "columnwise_scale_inv": (cs, f),
        },
    )


def sources(m, n, k, trans_a, trans_b, key, dtype="float32"):
    a = randn((k, m) if trans_a else (m, k), ("a", key), dtype)
    b = randn((n, k) if trans_b else (k, n), ("b", key), dtype)
    return a, b


# ---- running both backends ---------------------------------------------------------------------


def run(device, a, b, m, n, out_dtype, *, d_init=None, fp8_out=None, amax_init=0.0, extras=None, **cfg):
    """Runs te_gemm on `device`; returns the output tensors (CPU copies). An FP8 output's amax
    slot starts at ``amax_init`` (te_gemm max-accumulates into it)."""
    torch = _torch()
    out = {}
    if fp8_out is None:
        d = (
            d_init.clone().to(device)
            if d_init is not None
            else torch.full((m, n), float("nan"), dtype=out_dtype, device=device)
        )
        dq = _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=desc(d))
    else:
        e = fp8_id(fp8_out)
        d = torch.full((m, n), POISON_BYTE, dtype=torch.uint8, device=device)
        scale = torch.tensor([fp8_out_scale], dtype=torch.float32, device=device)
        amax = torch.full((1,), amax_init, device=device)
        sinv = torch.full((1,), float("nan"), device=device)
        dq = _C.QuantizedTensor(
            int(M.PER_TENSOR),
            rowwise_data=desc(d, e),
            scale=desc(scale),
            amax=desc(amax),
            rowwise_scale_inv=desc(sinv),
        )
        out.update(amax=amax, scale_inv=sinv)
    kw = dict(cfg)
    for name, t in (extras or {}).items():
        t = t.clone().to(device)
        out[name] = t
        kw[name] = desc(t)
    _C.gemm(a.on(device), b.on(device), dq, _C.GemmConfig(**kw), stream() if device == "cuda" else 0)
    if device == "cuda":
        torch.cuda.synchronize()
    out["d"] = d
    return {k: v.cpu() for k, v in out.items()}


fp8_out_scale = 3.0


def rel_err(got, want):
    g, w = got.double(), want.double()
    assert torch_isfinite(g).all(), "non-finite values in the CUDA result (poison left?)"
    return ((g - w).norm() / w.norm().clamp_min(1e-30)).item()


def torch_isfinite(x):
    return _torch().isfinite(x)


def assert_close(got, want, tol, what):
    e = rel_err(got, want)
    assert e <= tol, f"{what}: normwise relative error {e:.3g} > {tol:g}"


def assert_fp8_close(got, want, what):
    torch = _torch()
    g, w = got.view(torch.uint8).int(), want.view(torch.uint8).int()
    same_sign = ((g ^ w) & 0x80) == 0
    close = (
        (g == w)
        | (same_sign & ((g & 0x7F) - (w & 0x7F)).abs().le(1))
        | (((g & 0x7F) <= 1) & ((w & 0x7F) <= 1))
    )
    frac = close.float().mean().item()
    assert frac >= 0.999, f"{what}: only {frac:.5f} of FP8 outputs within one ulp"


def tol_for(out_dtype, operand_kind, fast_accum=False):
    torch = _torch()
    if out_dtype in (torch.bfloat16, torch.float16):
        return 1e-2
    if operand_kind == "fp8":
        return 2e-3 if fast_accum else FP8_SPLIT_TOL
    return 1e-5


# ---- high precision ----------------------------------------------------------------------------

HP_SHAPES = [(16, 16, 16), (48, 80, 32), (7, 13, 5), (129, 257, 65), (1, 1, 1), (256, 8, 1000)]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", HP_SHAPES, ids=str)
def test_high_precision(shape, dtype, layout):
    torch = _torch()
    m, n, k = shape
    ta, tb = LAYOUTS[layout]
    a, b = sources(m, n, k, ta, tb, (shape, dtype, layout), dtype)
    A, B = hp_operand(a), hp_operand(b)
    out_dtypes = [getattr(torch, dtype)] + ([torch.float32] if dtype != "float32" else [])
    for od in out_dtypes:
        cpu = run("cpu", A, B, m, n, od, trans_a=ta, trans_b=tb)
        gpu = run("cuda", A, B, m, n, od, trans_a=ta, trans_b=tb)
        assert_close(gpu["d"], cpu["d"], tol_for(od, "hp"), f"{dtype}->{od}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_large_fprop(dtype):
    torch = _torch()
    m, n, k = 1024, 4096, 4096
    a, b = sources(m, n, k, *FPROP, ("large", dtype), dtype)
    A, B = hp_operand(a), hp_operand(b)
    od = getattr(torch, dtype)
    cpu = run("cpu", A, B, m, n, od, trans_b=True)
    gpu = run("cuda", A, B, m, n, od, trans_b=True)
    assert_close(gpu["d"], cpu["d"], tol_for(od, "hp"), "1024x4096x4096")


@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_alpha_beta_accumulate(dtype, beta):
    torch = _torch()
    m, n, k = 96, 160, 64
    a, b = sources(m, n, k, *WGRAD, ("acc", dtype), dtype)
    A, B = hp_operand(a), hp_operand(b)
    d0 = randn((m, n), ("d0", dtype), "float32")  # an fp32 main_grad
    cfg = dict(trans_a=True, alpha=1.5, beta=beta)
    cpu = run("cpu", A, B, m, n, torch.float32, d_init=d0, **cfg)
    gpu = run("cuda", A, B, m, n, torch.float32, d_init=d0, **cfg)
    assert_close(gpu["d"], cpu["d"], 1e-5, f"beta={beta}")
    if beta == 1.0:  # really accumulated
        assert (gpu["d"] - d0).abs().max().item() > 0.1


# ---- epilogues ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bias_kind", ["out", "float32"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("epilogue", ["BIAS", "GELU_AUX", "GELU_AUX_nobias"])
def test_forward_epilogues(epilogue, dtype, bias_kind):
    torch = _torch()
    m, n, k = 129, 264, 96
    a, b = sources(m, n, k, *FPROP, ("ep", epilogue, dtype), dtype)
    A, B = hp_operand(a), hp_operand(b)
    od = getattr(torch, dtype)
    bias = randn((n,), ("bias", dtype), "float32").to(od if bias_kind == "out" else torch.float32)
    extras = {} if epilogue == "GELU_AUX_nobias" else {"bias": bias}
    if epilogue.startswith("GELU"):
        extras["aux"] = torch.full((m, n), float("nan"), dtype=od)
    ep = E.BIAS if epilogue == "BIAS" else E.GELU_AUX
    kw = dict(trans_b=True, epilogue=int(ep))
    cpu = run("cpu", A, B, m, n, od, extras=extras, **kw)
    gpu = run("cuda", A, B, m, n, od, extras=extras, **kw)
    assert_close(gpu["d"], cpu["d"], tol_for(od, "hp"), f"{epilogue} d")
    if "aux" in extras:
        assert_close(gpu["aux"], cpu["aux"], tol_for(od, "hp"), f"{epilogue} aux")


def test_te_epilogue_fallback_matches_and_logs_once(caplog):
    """cuBLASLt has no fused kernel for an fp32 bias on an fp16 product with an aux whose leading
    dimension (N = 13) is not a multiple of 8: te computes the plain product and runs its own
    epilogue, with the reference's numbers, and says so once at INFO on the "te" logger (the key
    is this combination of dtypes, epilogue and N % 8, which no other test here uses)."""
    torch = _torch()
    m, n, k = 70, 13, 48
    a, b = sources(m, n, k, *FPROP, ("fallback",), "float16")
    A, B = hp_operand(a), hp_operand(b)
    extras = {
        "bias": randn((n,), ("fallback-bias",), "float32"),
        "aux": torch.full((m, n), float("nan"), dtype=torch.float16),
    }
    kw = dict(trans_b=True, epilogue=int(E.GELU_AUX))
    cpu = run("cpu", A, B, m, n, torch.float16, extras=extras, **kw)
    with caplog.at_level(logging.INFO, logger="te"):
        gpus = [run("cuda", A, B, m, n, torch.float16, extras=extras, **kw) for _ in range(2)]
    for gpu in gpus:
        assert_close(gpu["d"], cpu["d"], 1e-2, "fallback d")
        assert_close(gpu["aux"], cpu["aux"], 1e-2, "fallback aux")
    said = [r for r in caplog.records if r.name == "te" and "no fused kernel" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO, [r.getMessage() for r in said]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_dgelu(dtype):
    torch = _torch()
    m, n, k = 200, 136, 72
    a, b = sources(m, n, k, *DGRAD, ("dgelu", dtype), dtype)
    A, B = hp_operand(a), hp_operand(b)
    od = getattr(torch, dtype)
    aux = randn((m, n), ("aux", dtype), "float32", 2.0).to(od)
    kw = dict(epilogue=int(E.DGELU))
    cpu = run("cpu", A, B, m, n, od, extras={"aux": aux}, **kw)
    gpu = run("cuda", A, B, m, n, od, extras={"aux": aux}, **kw)
    assert_close(gpu["d"], cpu["d"], tol_for(od, "hp"), "dgelu")


@pytest.mark.parametrize("bgrad_kind", ["out", "float32"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_bgrad_in_wgrad(dtype, bgrad_kind):
    torch = _torch()
    m, n, k = 136, 96, 512  # dw [M, N] = dy^T x over K tokens; bias_grad [M] = sum over tokens of dy
    a, b = sources(m, n, k, *WGRAD, ("bgrad", dtype), dtype)
    A, B = hp_operand(a), hp_operand(b)
    od = getattr(torch, dtype)
    bg = torch.full((m,), float("nan"), dtype=od if bgrad_kind == "out" else torch.float32)
    kw = dict(trans_a=True, epilogue=int(E.BGRAD))
    cpu = run("cpu", A, B, m, n, od, extras={"bias_grad": bg}, **kw)
    gpu = run("cuda", A, B, m, n, od, extras={"bias_grad": bg}, **kw)
    assert_close(gpu["d"], cpu["d"], tol_for(od, "hp"), "bgrad d")
    assert_close(gpu["bias_grad"], cpu["bias_grad"], tol_for(od, "hp"), "bias_grad")
    assert_close(cpu["bias_grad"].float(), a.float().sum(0), 1e-2, "bias_grad is dy's column sum")


# ---- FP8 per-tensor ----------------------------------------------------------------------------

FP8_SHAPES = [(16, 16, 16), (48, 80, 32), (33, 48, 64)]
LARGE = (1024, 4096, 4096)  # one layout and format pair only: the CPU reference's time
FMTS = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")]
LAYOUT_NAMES = ["fprop", "dgrad", "wgrad"]
FP8_CASES = [(s, lay, f) for s in FP8_SHAPES for lay in LAYOUT_NAMES for f in FMTS] + [
    (LARGE, "fprop", FMTS[0])
]


@pytest.mark.parametrize("split", [1, 0], ids=["split_acc", "fast_acc"])
@pytest.mark.parametrize(("shape", "layout", "fmts"), FP8_CASES, ids=lambda v: str(v))
def test_fp8_per_tensor(shape, layout, fmts, split):
    torch = _torch()
    m, n, k = shape
    ta, tb = LAYOUTS[layout]
    a, b = sources(m, n, k, ta, tb, (shape, layout, fmts))
    A, B = fp8_operand(a, fmts[0]), fp8_operand(b, fmts[1])
    for od in [torch.bfloat16, torch.float32]:
        kw = dict(trans_a=ta, trans_b=tb, use_split_accumulator=split)
        cpu = run("cpu", A, B, m, n, od, **kw)
        gpu = run("cuda", A, B, m, n, od, **kw)
        assert_close(gpu["d"], cpu["d"], tol_for(od, "fp8", fast_accum=not split), f"fp8 -> {od}")


@pytest.mark.parametrize("amax_init", [0.0, 1e30], ids=["fresh_slot", "larger_amax_kept"])
@pytest.mark.parametrize("out_fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [(16, 16, 16), (64, 128, 96), (512, 1024, 256)], ids=str)
def test_fp8_output(shape, out_fmt, amax_init):
    m, n, k = shape
    a, b = sources(m, n, k, *FPROP, ("fp8out", shape))
    A, B = fp8_operand(a), fp8_operand(b)
    kw = dict(trans_b=True, use_split_accumulator=1)
    cpu = run("cpu", A, B, m, n, None, fp8_out=out_fmt, amax_init=amax_init, **kw)
    gpu = run("cuda", A, B, m, n, None, fp8_out=out_fmt, amax_init=amax_init, **kw)
    assert_fp8_close(gpu["d"], cpu["d"], f"fp8 out {out_fmt}")
    assert gpu["scale_inv"].item() == cpu["scale_inv"].item() == _torch().tensor(1 / fp8_out_scale).item()
    assert abs(gpu["amax"].item() - cpu["amax"].item()) <= FP8_SPLIT_TOL * cpu["amax"].item()
    if amax_init:
        assert gpu["amax"].item() == cpu["amax"].item() == _torch().tensor(amax_init).item()


def test_fp8_bias_bf16():
    torch = _torch()
    m, n, k = 64, 128, 96
    a, b = sources(m, n, k, *FPROP, "fp8bias")
    A, B = fp8_operand(a), fp8_operand(b)
    bias = randn((n,), "fp8bias-b", "bfloat16")
    kw = dict(trans_b=True, epilogue=int(E.BIAS))
    cpu = run("cpu", A, B, m, n, torch.bfloat16, extras={"bias": bias}, **kw)
    gpu = run("cuda", A, B, m, n, torch.bfloat16, extras={"bias": bias}, **kw)
    assert_close(gpu["d"], cpu["d"], 1e-2, "fp8 + bf16 bias")


def test_fp8_fprop_at_transformer_scale_takes_the_preferred_tile(caplog):
    """te.Linear 4096 -> 4096's fprop at 16384 tokens (E4M3 x E4M3, fast accumulation, bf16 bias
    and output): on Hopper te_gemm runs the mid-size cuBLASLt tile its heuristic lists below a big
    one (faster at the power cap: benchmarks/NOTES.md, thirty-fifth session), says so once at
    INFO, and its output matches a float64 product of the dequantized operands. Elsewhere the
    heuristic's first stands and nothing is said. The reference is torch's, not te's CPU backend:
    at 0.55 TFLOP the CPU reference would take minutes."""
    torch = _torch()
    m, n, k = 16384, 4096, 4096
    a, b = sources(m, n, k, *FPROP, "fprop-tile")
    A, B = fp8_operand(a), fp8_operand(b)
    bias = randn((n,), "fprop-tile-bias", "bfloat16")
    kw = dict(trans_b=True, epilogue=int(E.BIAS), use_split_accumulator=0)
    with caplog.at_level(logging.INFO, logger="te"):
        gpus = [run("cuda", A, B, m, n, torch.bfloat16, extras={"bias": bias}, **kw) for _ in range(2)]

    def dequantized(op):
        data, _ = op.parts["rowwise_data"]
        sinv, _ = op.parts["rowwise_scale_inv"]
        return data.view(torch.float8_e4m3fn).float().double() * sinv.double()

    want = (dequantized(A) @ dequantized(B).T + bias.double().cuda()).cpu()
    for gpu in gpus:
        assert_close(gpu["d"], want, 1e-2, "fp8 fprop 16384 x 4096 x 4096")
    assert torch.equal(gpus[0]["d"].view(torch.int16), gpus[1]["d"].view(torch.int16)), "same plan, same bits"
    said = [
        r.getMessage() for r in caplog.records if r.name == "te" and "rather than its first" in r.getMessage()
    ]
    if torch.cuda.get_device_capability()[0] == 9:
        assert len(said) == 1 and "tile 128x160, 2x1 clusters" in said[0], said
    else:
        assert said == [], said


# ---- GELU_AUX with an FP8 output (an MLP's FC1 writing FC2's quantized input) -----------------


def run_act_fp8(
    device, A, B, m, n, out_fmt, amax_init, *, epilogue, aux, trans_b, split, bias=None, dbias_dtype=None
):
    """te_gemm GELU_AUX (aux written: pass its dtype) or DGELU (aux read: pass the tensor) into an
    FP8 D with both copies on `device`; CPU copies of every buffer back."""
    torch = _torch()
    e = fp8_id(out_fmt)
    t = {
        "aux": torch.full((m, n), float("nan"), dtype=aux, device=device)
        if isinstance(aux, torch.dtype)
        else aux.clone().to(device),
        "row": torch.full((m, n), POISON_BYTE, dtype=torch.uint8, device=device),
        "col": torch.full((n, m), POISON_BYTE, dtype=torch.uint8, device=device),
        "row_sinv": torch.full((1,), float("nan"), device=device),
        "col_sinv": torch.full((1,), float("nan"), device=device),
        "amax": torch.full((1,), amax_init, device=device),
        "scale": torch.tensor([fp8_out_scale], device=device),
    }
    if dbias_dtype is not None:
        t["dbias"] = torch.full((n,), float("nan"), dtype=dbias_dtype, device=device)
    dq = _C.QuantizedTensor(
        int(M.PER_TENSOR),
        rowwise_data=desc(t["row"], e),
        rowwise_scale_inv=desc(t["row_sinv"]),
        columnwise_data=desc(t["col"], e),
        columnwise_scale_inv=desc(t["col_sinv"]),
        amax=desc(t["amax"]),
        scale=desc(t["scale"]),
    )
    b = bias.to(device) if bias is not None else None
    cfg = _C.GemmConfig(
        trans_b=trans_b,
        epilogue=int(epilogue),
        aux=desc(t["aux"]),
        bias=None if b is None else desc(b),
        bias_grad=desc(t["dbias"]) if "dbias" in t else None,
        use_split_accumulator=split,
    )
    _C.gemm(A.on(device), B.on(device), dq, cfg, stream() if device == "cuda" else 0)
    if device == "cuda":
        torch.cuda.synchronize()
    return {k: v.cpu() for k, v in t.items()}


def check_fp8_copies(gpu, cpu, amax_init, amax_tol, what):
    """D's two copies and scales on the GPU against the CPU backend's: one FP8 ulp (the GEMM's
    accumulation order moves the rounded product, the activation's exp and divide are the
    backend's), the column-wise copy exactly the row-wise one transposed, scale_inv exact, the
    amax max-accumulated."""
    torch = _torch()
    assert_fp8_close(gpu["row"], cpu["row"], f"{what} rowwise")
    assert torch.equal(gpu["col"], gpu["row"].t().contiguous()), (
        f"{what}: columnwise is not rowwise transposed"
    )
    want_sinv = torch.tensor(1 / fp8_out_scale).item()
    assert gpu["row_sinv"].item() == gpu["col_sinv"].item() == cpu["row_sinv"].item() == want_sinv
    if amax_init:
        assert gpu["amax"].item() == torch.tensor(amax_init).item()
    else:
        assert abs(gpu["amax"].item() - cpu["amax"].item()) <= amax_tol * cpu["amax"].item(), what


GELU_FP8_SHAPES = [(16, 16, 16), (200, 144, 272), (1000, 1040, 512), (64, 4096, 1024)]


@pytest.mark.parametrize("amax_init", [0.0, 1e30], ids=["fresh_slot", "larger_amax_kept"])
@pytest.mark.parametrize("out_fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("aux_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("split", [0, 1], ids=["fast_acc", "split_acc"])
@pytest.mark.parametrize("shape", GELU_FP8_SHAPES, ids=str)
def test_fp8_gelu_output(shape, split, with_bias, aux_dtype, out_fmt, amax_init):
    """FC1 with gelu quantized for FC2: aux against the CPU backend's; D's copies against
    te_activation_fwd of the GPU's own aux on the CPU (one FP8 ulp: the activation's exp and
    divide are the backend's), and check_fp8_copies."""
    torch = _torch()
    m, n, k = shape
    a, b = sources(m, n, k, *FPROP, ("gelu_fp8", shape))
    A, B = fp8_operand(a), fp8_operand(b)
    adt = getattr(torch, aux_dtype)
    bias = randn((n,), ("gelu_fp8_bias", shape), aux_dtype) if with_bias else None
    kw = dict(epilogue=E.GELU_AUX, aux=adt, trans_b=True, split=split, bias=bias)
    cpu = run_act_fp8("cpu", A, B, m, n, out_fmt, amax_init, **kw)
    gpu = run_act_fp8("cuda", A, B, m, n, out_fmt, amax_init, **kw)
    assert_close(gpu["aux"], cpu["aux"], 1e-2, "aux")
    # te_activation_fwd of the GPU's aux on the CPU: what D must hold
    e = fp8_id(out_fmt)
    row = torch.full((m, n), POISON_BYTE, dtype=torch.uint8)
    amax = torch.full((1,), amax_init)
    sinv, scale = torch.zeros(1), torch.tensor([fp8_out_scale])
    ref = _C.QuantizedTensor(
        int(M.PER_TENSOR),
        rowwise_data=desc(row, e),
        rowwise_scale_inv=desc(sinv),
        amax=desc(amax),
        scale=desc(scale),
    )
    _C.activation_fwd(desc(gpu["aux"]), ref, int(_C.Activation.GELU), _C.QuantConfig())
    check_fp8_copies(gpu, {**cpu, "row": row, "amax": amax}, amax_init, 1e-5, f"gelu fp8 {out_fmt}")


@pytest.mark.parametrize("amax_init", [0.0, 1e30], ids=["fresh_slot", "larger_amax_kept"])
@pytest.mark.parametrize("out_fmt", ["e5m2", "e4m3"])
@pytest.mark.parametrize("aux_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    "dbias_dtype", [None, "float32", "bfloat16"], ids=["no_dbias", "dbias_fp32", "dbias_bf16"]
)
@pytest.mark.parametrize("shape", GELU_FP8_SHAPES, ids=str)
def test_fp8_dgelu_output(shape, dbias_dtype, aux_dtype, out_fmt, amax_init):
    """FC2's dgrad (dy E5M2 x w E4M3, w's column-wise copy) with the gelu backward quantized for
    FC1, against the CPU backend: D's copies by check_fp8_copies (the amax within the bf16
    rounding of the product), the bias gradient normwise."""
    torch = _torch()
    m, n, k = shape
    a, b = sources(m, n, k, *DGRAD, ("dgelu_fp8", shape))
    A, B = fp8_operand(a, "e5m2"), fp8_operand(b)
    adt = getattr(torch, aux_dtype)
    h = randn((m, n), ("dgelu_fp8_h", shape), aux_dtype, scale=2.0)
    ddt = None if dbias_dtype is None else getattr(torch, dbias_dtype)
    kw = dict(epilogue=E.DGELU, aux=h, trans_b=False, split=1, dbias_dtype=ddt)
    cpu = run_act_fp8("cpu", A, B, m, n, out_fmt, amax_init, **kw)
    gpu = run_act_fp8("cuda", A, B, m, n, out_fmt, amax_init, **kw)
    check_fp8_copies(gpu, cpu, amax_init, 1e-2 if adt != torch.float32 else 1e-4, f"dgelu fp8 {out_fmt}")
    if ddt is not None:
        assert_close(gpu["dbias"], cpu["dbias"], 1e-2, "dbias")


# ---- FP8 block scaling (1x128 x 128x128, 1x128 x 1x128) ----------------------------------------

BLOCK_SHAPES = [(128, 128, 128), (48, 80, 128), (256, 384, 640)]
BLOCK_CASES = [(s, lay) for s in BLOCK_SHAPES for lay in LAYOUT_NAMES] + [(LARGE, "fprop")]


@pytest.mark.parametrize("modes", ["1Dx2D", "1Dx1D"])
@pytest.mark.parametrize(("shape", "layout"), BLOCK_CASES, ids=lambda v: str(v))
def test_fp8_block(shape, layout, modes):
    torch = _torch()
    m, n, k = shape
    ta, tb = LAYOUTS[layout]
    a, b = sources(m, n, k, ta, tb, ("block", shape, layout, modes))
    # weights (B in fprop/dgrad) take 128x128 tiles; wgrad's operands are both activations/grads
    b_mode = M.BLOCK_2D if (modes == "1Dx2D" and layout != "wgrad") else M.BLOCK_1D
    a_mode = M.BLOCK_1D if layout != "wgrad" or modes == "1Dx1D" else M.BLOCK_2D
    A, B = fp8_operand(a, "e4m3", a_mode), fp8_operand(b, "e4m3", b_mode)
    for od in [torch.bfloat16, torch.float32]:
        kw = dict(trans_a=ta, trans_b=tb)
        cpu = run("cpu", A, B, m, n, od, **kw)
        gpu = run("cuda", A, B, m, n, od, **kw)
        assert_close(gpu["d"], cpu["d"], tol_for(od, "fp8"), f"block {modes} -> {od}")


# ---- shape errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,dim", [((32, 32, 24), "K"), ((32, 40, 32), "N"), ((16, 8, 16), "N")], ids=str)
def test_fp8_shape_not_multiple_of_16_is_a_clear_error(shape, dim):
    torch = _torch()
    m, n, k = shape
    a, b = sources(m, n, k, *FPROP, ("err", shape))
    A, B = fp8_operand(a), fp8_operand(b)
    d = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=rf"{dim} .*multiple of 16.*got {dim} = .*pad"):
        _C.gemm(
            A.on("cuda"),
            B.on("cuda"),
            _C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=desc(d)),
            _C.GemmConfig(trans_b=True),
            stream(),
        )


def test_repeated_calls_reuse_the_plan_and_follow_new_pointers():
    """The plan cache keys on shapes, not pointers: new buffers with the same shape must be read."""
    torch = _torch()
    m, n, k = 64, 96, 128
    for i in range(3):
        a, b = sources(m, n, k, *FPROP, ("repeat", i), "bfloat16")
        A, B = hp_operand(a), hp_operand(b)
        cpu = run("cpu", A, B, m, n, torch.float32, trans_b=True)
        gpu = run("cuda", A, B, m, n, torch.float32, trans_b=True)
        assert_close(gpu["d"], cpu["d"], 1e-5, f"call {i}")
