"""te's FP8 quantization kernels against the copy ceiling and against torch.compile.

For a 16384x8192 BF16 CUDA input (256 MiB, several times the H200's L2) it times, with CUDA events
after warm-up: the median of --iters CUDA-graph replays of 10 back-to-back calls (kernel time, the
way TE's figures in GPU.md were taken) and, beside it, the same 10 calls launched from Python:

  copy            device-to-device copy, the ceiling (4 B/elem: 2 read + 2 written)
  delayed         per-tensor cast with scale from *scale, amax max-accumulated (3 B/elem)
  current         per-tensor current scaling: amax pass + cast pass (counted 3 B/elem; it reads
                  the input twice, so 5 B/elem actually move; reported as "actual")
  delayed_ct      delayed cast + transpose, both copies from one read (4 B/elem)
  current_ct      current cast + transpose (counted 4 B/elem as TE's figure is; 6 B/elem actually
                  move: 2 + 2 read, 1 + 1 written; reported as "actual")
  block1d_ct      Float8BlockScaling 1x128 with the column-wise copy (4 B/elem + scales)
  block2d_ct      Float8BlockScaling 128x128 with the column-wise copy (4 B/elem + scales)
  amax            the amax pass alone (te_core._C.amax; 2 B/elem read)

and the same operation written in plain torch and run through torch.compile as the peer. It checks
te's FP8 bytes against the eager torch formula first (bit-exact expected), prints a table and
writes everything to --json.

Calls te through te_core._C; descriptors are built once, outside the timed loops.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import te_core._C as C
import torch

CUDA = 1
E4M3_MAX = 448.0
# Transformer Engine 2.20.2 on the same H200 (GPU.md), TB/s over the same counted bytes.
TE_REF = {"delayed": 3.92, "delayed_ct": 3.59, "current": 2.48, "current_ct": 2.47, "block1d_ct": 2.72}


def desc(t: torch.Tensor, dtype: int) -> C.Tensor:
    return C.Tensor(t.data_ptr(), int(dtype), tuple(t.shape), CUDA, t.device.index or 0)


def dtype_of(t: torch.Tensor) -> int:
    return {torch.float32: C.DType.FLOAT32, torch.float16: C.DType.FLOAT16, torch.bfloat16: C.DType.BFLOAT16}[
        t.dtype
    ]


def stream() -> int:
    # the raw cudaStream_t without building a torch.cuda.Stream object per call
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())


REPS = 10  # calls per timed sample: the stream stays busy, so host latency overlaps the kernels


def time_ms(fn, iters: int, warmup: int, graph: bool) -> float:
    """Median milliseconds per call over `iters` samples of REPS back-to-back calls; with `graph`,
    REPS calls captured in one CUDA graph (kernel time, as TE's figures in GPU.md are taken)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()  # warm the side stream too
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(REPS):
                fn()
        run = g.replay
        for _ in range(3):
            run()
    else:

        def run():
            for _ in range(REPS):
                fn()

    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / REPS)
    return statistics.median(times)


def pow2_round_down(s: torch.Tensor) -> torch.Tensor:
    return (s.view(torch.int32) & -8388608).view(torch.float32)  # 0xff800000 as int32


def scale_from_amax(amax: torch.Tensor, pow2: bool) -> torch.Tensor:
    ok = torch.isfinite(amax) & (amax > 0)
    # A true division (Python-number / tensor is reciprocal() * number in torch, an ulp off the
    # correctly rounded quotient for about 1 amax in 4)
    one = torch.ones_like(amax)
    s = torch.where(ok, torch.full_like(amax, E4M3_MAX) / torch.where(ok, amax, one), one)
    s = torch.where(torch.isinf(s), torch.full_like(s, torch.finfo(torch.float32).max), s)
    return pow2_round_down(s) if pow2 else s


def to_fp8(v: torch.Tensor) -> torch.Tensor:
    return v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


# ---- the peers, in plain torch (run eagerly for the check, compiled for timing)


def peer_delayed(x, scale, amax):
    q = to_fp8(x.float() * scale)
    return q, torch.maximum(amax, x.abs().amax().float()), 1.0 / scale


def peer_current(x):
    amax = x.abs().amax().float()
    scale = scale_from_amax(amax, False)
    return to_fp8(x.float() * scale), amax, 1.0 / scale


def peer_delayed_ct(x, scale, amax):
    q = to_fp8(x.float() * scale)
    return q, q.t().contiguous(), torch.maximum(amax, x.abs().amax().float()), 1.0 / scale


def peer_current_ct(x):
    amax = x.abs().amax().float()
    scale = scale_from_amax(amax, False)
    q = to_fp8(x.float() * scale)
    return q, q.t().contiguous(), amax, 1.0 / scale


def peer_block1d_ct(x):
    m, k = x.shape
    xr = x.float().reshape(m, k // 128, 128)
    sr = scale_from_amax(xr.abs().amax(-1, keepdim=True), True)
    qr = to_fp8(xr * sr).reshape(m, k)
    xc = x.t().float().reshape(k, m // 128, 128)
    sc = scale_from_amax(xc.abs().amax(-1, keepdim=True), True)
    qc = to_fp8(xc * sc).reshape(k, m)
    return qr, (1.0 / sr).reshape(m, k // 128).t(), qc, (1.0 / sc).reshape(k, m // 128).t()


def peer_block2d_ct(x):
    m, k = x.shape
    xr = x.float().reshape(m // 128, 128, k // 128, 128)
    s = scale_from_amax(xr.abs().amax((1, 3), keepdim=True), True)
    q = to_fp8(xr * s).reshape(m, k)
    sinv = (1.0 / s).reshape(m // 128, k // 128)
    return q, sinv, q.t().contiguous(), sinv.t()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()

    torch.manual_seed(0)
    dev = torch.device("cuda")
    M, K = args.rows, args.cols
    N = M * K
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16) * 3
    x_d = desc(x, dtype_of(x))
    E4M3 = C.DType.FLOAT8_E4M3
    F32 = C.DType.FLOAT32
    PT, B1, B2 = C.ScalingMode.PER_TENSOR, C.ScalingMode.BLOCK_1D, C.ScalingMode.BLOCK_2D
    P = C.Part

    def fp8_buf(shape):
        return torch.full(shape, 0x55, device=dev, dtype=torch.uint8)  # poisoned

    def f32_buf(shape, v=float("nan")):
        return torch.full(shape, v, device=dev, dtype=torch.float32)

    # ---- buffers and descriptors (built once)
    q_row, q_col = fp8_buf((M, K)), fp8_buf((K, M))
    sinv_r, sinv_c, amax, scale = f32_buf((1,)), f32_buf((1,)), f32_buf((1,), 0.0), f32_buf((1,))
    scale.fill_(E4M3_MAX / float(x.abs().amax()) / 2)
    qt_row = dict(
        rowwise_data=desc(q_row, E4M3),
        rowwise_scale_inv=desc(sinv_r, F32),
        amax=desc(amax, F32),
        scale=desc(scale, F32),
    )
    qt_col = dict(columnwise_data=desc(q_col, E4M3), columnwise_scale_inv=desc(sinv_c, F32))
    per_tensor = C.QuantizedTensor(PT, **qt_row)
    per_tensor_ct = C.QuantizedTensor(PT, **qt_row, **qt_col)
    cfg_delayed = C.QuantConfig(compute_scale=False)
    cfg_current = C.QuantConfig(compute_scale=True)
    cfg_block = C.QuantConfig(force_pow2_scales=True)

    def block_tensor(mode):
        shp = (M, K)
        sr = f32_buf(C.quantized_shape(mode, P.ROWWISE_SCALE_INV, shp))
        sc = f32_buf(C.quantized_shape(mode, P.COLUMNWISE_SCALE_INV, shp))
        t = C.QuantizedTensor(
            mode,
            rowwise_data=desc(q_row, E4M3),
            rowwise_scale_inv=desc(sr, F32),
            columnwise_data=desc(q_col, E4M3),
            columnwise_scale_inv=desc(sc, F32),
        )
        return t, sr, sc

    b1, b1_sr, b1_sc = block_tensor(B1)
    b2, b2_sr, b2_sc = block_tensor(B2)
    scale_bytes_1d = 4 * (b1_sr.numel() + b1_sc.numel())
    scale_bytes_2d = 4 * (b2_sr.numel() + b2_sc.numel())

    dst = torch.empty_like(x)
    ops = {
        "delayed": (
            lambda: C.quantize(x_d, per_tensor, cfg_delayed, stream()),
            3.0 * N,
            lambda: peer_delayed(x, scale, amax),
        ),
        "current": (
            lambda: C.quantize(x_d, per_tensor, cfg_current, stream()),
            3.0 * N,
            lambda: peer_current(x),
        ),
        "delayed_ct": (
            lambda: C.quantize(x_d, per_tensor_ct, cfg_delayed, stream()),
            4.0 * N,
            lambda: peer_delayed_ct(x, scale, amax),
        ),
        "current_ct": (
            lambda: C.quantize(x_d, per_tensor_ct, cfg_current, stream()),
            4.0 * N,
            lambda: peer_current_ct(x),
        ),
        "block1d_ct": (
            lambda: C.quantize(x_d, b1, cfg_block, stream()),
            4.0 * N + scale_bytes_1d,
            lambda: peer_block1d_ct(x),
        ),
        "block2d_ct": (
            lambda: C.quantize(x_d, b2, cfg_block, stream()),
            4.0 * N + scale_bytes_2d,
            lambda: peer_block2d_ct(x),
        ),
    }
    amax_out = f32_buf((1,))
    amax_d = desc(amax_out, F32)
    ops["amax"] = (lambda: C.amax(x_d, amax_d, stream()), 2.0 * N, lambda: x.abs().amax().float())
    actual_bytes = {"current": 5.0 * N, "current_ct": 6.0 * N}

    # ---- correctness first: te's bytes against the eager formula
    checks = {}

    def u8(t):
        return t.view(torch.uint8)

    with torch.no_grad():
        C.quantize(x_d, per_tensor, cfg_delayed, stream())
        ref = peer_delayed(x, scale, torch.zeros(1, device=dev))
        checks["delayed"] = int((q_row != u8(ref[0])).sum())
        C.quantize(x_d, per_tensor, cfg_current, stream())
        ref = peer_current(x)
        checks["current"] = int((q_row != u8(ref[0])).sum()) + int(amax.item() != ref[1].item())
        C.quantize(x_d, per_tensor_ct, cfg_current, stream())
        ref = peer_current_ct(x)
        checks["current_ct"] = int((q_row != u8(ref[0])).sum() + (q_col != u8(ref[1])).sum())
        C.quantize(x_d, per_tensor_ct, cfg_delayed, stream())
        ref = peer_delayed_ct(x, scale, torch.zeros(1, device=dev))
        checks["delayed_ct"] = int((q_row != u8(ref[0])).sum() + (q_col != u8(ref[1])).sum())
        C.quantize(x_d, b1, cfg_block, stream())
        ref = peer_block1d_ct(x)
        checks["block1d_ct"] = int(
            (q_row != u8(ref[0])).sum()
            + (q_col != u8(ref[2])).sum()
            + (b1_sr[:, :M] != ref[1]).sum()
            + (b1_sc[:, :K] != ref[3]).sum()
        )
        C.quantize(x_d, b2, cfg_block, stream())
        ref = peer_block2d_ct(x)
        checks["block2d_ct"] = int(
            (q_row != u8(ref[0])).sum()
            + (q_col != u8(ref[2])).sum()
            + (b2_sr[:, : K // 128] != ref[1]).sum()
            + (b2_sc[:, : M // 128] != ref[3]).sum()
        )
        C.amax(x_d, amax_d, stream())
        checks["amax"] = int(amax_out.item() != float(x.abs().amax().float()))
        torch.cuda.synchronize()

    # ---- timing
    copy_ms = time_ms(lambda: dst.copy_(x), args.iters, args.warmup, graph=True)
    copy_tbs = 4.0 * N / copy_ms / 1e9
    results = []
    for name, (te_fn, counted, peer) in ops.items():
        te_ms = time_ms(te_fn, args.iters, args.warmup, graph=True)
        eager_ms = time_ms(te_fn, args.iters, args.warmup, graph=False)
        row = {
            "op": name,
            "te_ms": te_ms,
            "te_tbs": counted / te_ms / 1e9,
            "eager_ms": eager_ms,
            "eager_tbs": counted / eager_ms / 1e9,
            "bytes_counted": counted,
            "mismatches": checks.get(name),
        }
        row["frac_copy"] = row["te_tbs"] / copy_tbs
        if name in actual_bytes:
            row["te_tbs_actual"] = actual_bytes[name] / te_ms / 1e9
        if not args.no_compile:
            compiled = torch.compile(peer, fullgraph=True)
            tc_ms = time_ms(compiled, args.iters, max(args.warmup, 3), graph=True)
            row.update(compile_ms=tc_ms, compile_tbs=counted / tc_ms / 1e9, te_over_compile=tc_ms / te_ms)
        row["te2_20_ref_tbs"] = TE_REF.get(name)
        results.append(row)

    # ---- report
    print(
        f"device: {torch.cuda.get_device_name()}  input {M}x{K} bf16  "
        f"copy {copy_ms:.3f} ms = {copy_tbs:.2f} TB/s  (CUDA-graph replays of {REPS} calls; "
        f"'eager': the same calls launched from Python)"
    )
    hdr = (
        f"{'op':<12}{'te ms':>9}{'te TB/s':>9}{'x copy':>8}{'eager TB/s':>12}{'compile TB/s':>14}"
        f"{'te/compile':>12}{'TE2.20':>8}{'bad bytes':>11}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        ctb = f"{r['compile_tbs']:.2f}" if "compile_tbs" in r else "-"
        rat = f"{r['te_over_compile']:.2f}x" if "te_over_compile" in r else "-"
        ref = f"{r['te2_20_ref_tbs']:.2f}" if r["te2_20_ref_tbs"] else "-"
        extra = f"   (actual {r['te_tbs_actual']:.2f} TB/s)" if "te_tbs_actual" in r else ""
        print(
            f"{r['op']:<12}{r['te_ms']:>9.3f}{r['te_tbs']:>9.2f}{r['frac_copy']:>8.2f}"
            f"{r['eager_tbs']:>12.2f}{ctb:>14}{rat:>12}{ref:>8}{r['mismatches']:>11}{extra}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "rows": M,
                    "cols": K,
                    "timing": f"CUDA graph of {REPS} calls",
                    "copy_ms": copy_ms,
                    "copy_tbs": copy_tbs,
                    "results": results,
                },
                f,
                indent=2,
            )
    return 1 if any(r["mismatches"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
