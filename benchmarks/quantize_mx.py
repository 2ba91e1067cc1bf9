"""te's MXFP8 / NVFP4 kernels on one GPU: quantization and dequantization against the copy ceiling,
and te_gemm's emulated (block-dequantized) path against torch's BF16 matmul.

For a 16384x8192 BF16 CUDA input it times, with CUDA events after warm-up, the median over --iters
samples of 10 back-to-back calls launched from Python (descriptors built once):

  copy             device-to-device copy of the input, the ceiling (4 B/elem)
  mxfp8            both copies, 1x32 and 32x1 blocks (2 read + 1 + 1 written = 4 B/elem counted)
  nvfp4            both copies (2 read + 0.5 + 0.5 written = 3 B/elem counted; the global amax
                   pass reads the input once more: 5 B/elem actual)
  nvfp4_rht_sr     the same with the Hadamard transform on the column-wise copy and stochastic
                   rounding (its amax pass transforms too: 7 B/elem actual)
  mxfp8_dequant    the row-wise MXFP8 copy back to BF16 (1 read + 2 written = 3 B/elem)
  gemm_mxfp8 / gemm_nvfp4 / torch_bf16
                   an --gemm^3 product: te_gemm with MXFP8 / NVFP4 operands (dequantize both to
                   BF16, then cuBLASLt BF16) and torch.matmul in BF16, as TFLOP/s

The emulated GEMM is expected to be slower than BF16 (te/gemm.h: correct, not fast); the figure
says by how much. Writes everything to --json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import te_core._C as C
import torch

CUDA = 1
D, M = C.DType, C.ScalingMode
REPS = 10


def desc(t: torch.Tensor, dtype, shape=None) -> C.Tensor:
    return C.Tensor(
        t.data_ptr(), int(dtype), list(t.shape if shape is None else shape), CUDA, t.device.index or 0
    )


def stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def time_ms(fn, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(REPS):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / REPS)
    return statistics.median(times)


def round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def mx_buffers(family: str, rows: int, cols: int, rht: bool = False) -> tuple[C.QuantizedTensor, list]:
    """A quantized tensor's device buffers (both copies) and its descriptor."""
    nv = family == "nvfp4"
    block = 16 if nv else 32
    data_dtype = D.FLOAT4_E2M1 if nv else D.FLOAT8_E4M3
    scale_dtype = D.FLOAT8_E4M3 if nv else D.FLOAT8_E8M0
    n = rows * cols // (2 if nv else 1)
    rw, cw = (
        torch.empty(n, dtype=torch.uint8, device="cuda"),
        torch.empty(n, dtype=torch.uint8, device="cuda"),
    )
    rs = torch.empty(round_up(rows, 128), round_up(-(-cols // block), 4), dtype=torch.uint8, device="cuda")
    cs = torch.empty(round_up(cols, 128), round_up(-(-rows // block), 4), dtype=torch.uint8, device="cuda")
    amax = torch.zeros(2, dtype=torch.float32, device="cuda")
    q = C.QuantizedTensor(
        int(M.NVFP4_1D if nv else M.MXFP8_1D),
        rowwise_data=desc(rw, data_dtype, (rows, cols)),
        rowwise_scale_inv=desc(rs, scale_dtype),
        columnwise_data=desc(cw, data_dtype, (cols, rows)),
        columnwise_scale_inv=desc(cs, scale_dtype),
        amax=desc(amax, D.FLOAT32) if nv else None,
        columnwise_rht=rht,
    )
    return q, [rw, cw, rs, cs, amax]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--gemm", type=int, default=8192, help="M = N = K of the GEMMs")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("quantize_mx.py: no CUDA GPU; nothing to measure", file=sys.stderr)
        return 1
    rows, cols, n = args.rows, args.cols, args.rows * args.cols
    x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
    xd = desc(x, D.BFLOAT16)
    results: dict[str, dict] = {}

    def record(name: str, ms: float, counted_bytes: float, actual_bytes: float | None = None) -> None:
        r = {"ms": ms, "tb_s": counted_bytes / ms / 1e9}
        if actual_bytes is not None:
            r["actual_tb_s"] = actual_bytes / ms / 1e9
        results[name] = r

    y = torch.empty_like(x)
    record("copy", time_ms(lambda: y.copy_(x), args.iters, args.warmup), 4 * n)

    mx, keep_mx = mx_buffers("mxfp8", rows, cols)
    record("mxfp8", time_ms(lambda: C.quantize(xd, mx, None, stream()), args.iters, args.warmup), 4 * n)
    nv, keep_nv = mx_buffers("nvfp4", rows, cols)
    record(
        "nvfp4", time_ms(lambda: C.quantize(xd, nv, None, stream()), args.iters, args.warmup), 3 * n, 5 * n
    )
    nv_rht, keep_rht = mx_buffers("nvfp4", rows, cols, rht=True)
    cfg = C.QuantConfig(stochastic_rounding=True, rng_seed=1234)
    record(
        "nvfp4_rht_sr",
        time_ms(lambda: C.quantize(xd, nv_rht, cfg, stream()), args.iters, args.warmup),
        3 * n,
        7 * n,
    )
    out = torch.empty_like(x)
    row_only = C.QuantizedTensor(
        int(M.MXFP8_1D), rowwise_data=mx.rowwise_data, rowwise_scale_inv=mx.rowwise_scale_inv
    )
    od = desc(out, D.BFLOAT16)
    record(
        "mxfp8_dequant", time_ms(lambda: C.dequantize(row_only, od, stream()), args.iters, args.warmup), 3 * n
    )

    g = args.gemm
    flops = 2.0 * g**3
    a = torch.randn(g, g, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(g, g, dtype=torch.bfloat16, device="cuda")
    d = torch.empty(g, g, dtype=torch.bfloat16, device="cuda")
    dd = C.QuantizedTensor(int(M.PER_TENSOR), rowwise_data=desc(d, D.BFLOAT16))
    nt = C.GemmConfig(trans_b=True)
    for family in ["mxfp8", "nvfp4"]:
        qa, keep_a = mx_buffers(family, g, g)
        qb, keep_b = mx_buffers(family, g, g)
        C.quantize(desc(a, D.BFLOAT16), qa, None, stream())
        C.quantize(desc(b, D.BFLOAT16), qb, None, stream())
        ms = time_ms(
            lambda qa=qa, qb=qb: C.gemm(qa, qb, dd, nt, stream()), max(args.iters // 5, 5), args.warmup
        )
        results[f"gemm_{family}"] = {"ms": ms, "tflop_s": flops / ms / 1e9}
    ms = time_ms(lambda: torch.matmul(a, b.t(), out=d), max(args.iters // 5, 5), args.warmup)
    results["torch_bf16"] = {"ms": ms, "tflop_s": flops / ms / 1e9}

    copy = results["copy"]["tb_s"]
    print(f"{'op':16} {'ms':>9} {'TB/s':>7} {'of copy':>8} {'actual':>7} {'TFLOP/s':>8}")
    nan = float("nan")
    for name, r in results.items():
        tb = r.get("tb_s", nan)
        print(
            f"{name:16} {r['ms']:9.4f} {tb:7.2f} {tb / copy:8.2f} {r.get('actual_tb_s', nan):7.2f} "
            f"{r.get('tflop_s', nan):8.1f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"shape": [rows, cols], "gemm": g, "gpu": torch.cuda.get_device_name(), "results": results},
                f,
                indent=1,
            )
    del keep_mx, keep_nv, keep_rht
    return 0


if __name__ == "__main__":
    sys.exit(main())
