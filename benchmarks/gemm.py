"""te_gemm (cuBLASLt) against torch's GEMMs on the same inputs, TFLOP/s and ratios.

Problems: 8192^3, and the three GEMMs of a Linear layer with 16384 tokens, 4096->4096 and
4096->16384 (fprop y = x w^T, dgrad dx = dy w, wgrad dw = dy^T x). For each:
  bf16         te BF16 vs torch.matmul
  fp8          te FP8 per-tensor (E4M3; fprop fast accumulation, dgrad/wgrad split) vs
               torch._scaled_mm with per-tensor scales
  fp8_block    te FP8 1x128 x 128x128 (wgrad 1x128 x 1x128) vs torch._scaled_mm with block scales
               where this torch supports them (else the peer is reported as unsupported)
and fused epilogues on the 4096->16384 fprop / wgrad shapes:
  bias_gelu    te BF16 with GELU_AUX + bias vs torch matmul + bias + gelu(tanh), unfused
  accumulate   te BF16 wgrad with beta = 1 into an fp32 main_grad vs torch matmul then add_
CUDA events after warm-up, te and its peer timed alternately, median of --iters runs; te
descriptors are built once outside timing.
--json PATH writes every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import te_core._C as C
import torch
import torch.nn.functional as F
from _rounds import cuda_event_ms

CUDA = int(C.DeviceType.CUDA)
MODE = C.ScalingMode


def desc(t: torch.Tensor, dtype: int | None = None) -> C.Tensor:
    dt = (
        dtype
        if dtype is not None
        else int(
            {
                torch.float32: C.DType.FLOAT32,
                torch.float16: C.DType.FLOAT16,
                torch.bfloat16: C.DType.BFLOAT16,
            }[t.dtype]
        )
    )
    return C.Tensor(t.data_ptr(), dt, tuple(t.shape), CUDA, t.device.index or 0)


def stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def pair_ms(te_fn, peer_fn, iters: int, warmup: int = 5) -> tuple[float, float | None]:
    """Medians of te_fn and peer_fn (None: te only), timed alternately so that clock and thermal
    drift over the run affect both alike."""
    for _ in range(warmup):
        te_fn()
        if peer_fn is not None:
            peer_fn()
    torch.cuda.synchronize()
    te_t, peer_t = [], []
    for _ in range(iters):
        te_t.append(cuda_event_ms(te_fn))
        if peer_fn is not None:
            peer_t.append(cuda_event_ms(peer_fn))
    return statistics.median(te_t), (statistics.median(peer_t) if peer_t else None)


E4M3 = int(C.DType.FLOAT8_E4M3)
F32 = int(C.DType.FLOAT32)


def te_fp8(x: torch.Tensor, mode=MODE.PER_TENSOR):
    """x quantized by te (both copies); returns (QuantizedTensor, buffers kept alive)."""
    rows, cols = x.shape
    rw = torch.empty((rows, cols), dtype=torch.uint8, device="cuda")
    cw = torch.empty((cols, rows), dtype=torch.uint8, device="cuda")
    keep = [rw, cw]
    if mode == MODE.PER_TENSOR:
        rs, cs, amax, scale = (torch.zeros(1, device="cuda") for _ in range(4))
        keep += [rs, cs, amax, scale]
        q = C.QuantizedTensor(
            int(mode),
            rowwise_data=desc(rw, E4M3),
            rowwise_scale_inv=desc(rs, F32),
            columnwise_data=desc(cw, E4M3),
            columnwise_scale_inv=desc(cs, F32),
            amax=desc(amax, F32),
            scale=desc(scale, F32),
        )
        C.quantize(desc(x), q, C.QuantConfig(compute_scale=True), stream())
    else:
        rs = torch.zeros(
            C.quantized_shape(int(mode), int(C.Part.ROWWISE_SCALE_INV), list(x.shape)), device="cuda"
        )
        cs = torch.zeros(
            C.quantized_shape(int(mode), int(C.Part.COLUMNWISE_SCALE_INV), list(x.shape)), device="cuda"
        )
        keep += [rs, cs]
        q = C.QuantizedTensor(
            int(mode),
            rowwise_data=desc(rw, E4M3),
            rowwise_scale_inv=desc(rs, F32),
            columnwise_data=desc(cw, E4M3),
            columnwise_scale_inv=desc(cs, F32),
        )
        C.quantize(desc(x), q, C.QuantConfig(force_pow2_scales=True), stream())
    return q, keep


def hp(t):
    return C.QuantizedTensor(int(MODE.PER_TENSOR), rowwise_data=desc(t))


def te_call(a, b, d, cfg):
    s = stream()
    return lambda: C.gemm(a, b, d, cfg, s)


def gemm_cases(tokens: int):
    """(name, M, N, K, trans_a, trans_b) in te's terms; shapes of the sources follow."""
    cases = [("8192^3", 8192, 8192, 8192, False, True)]
    for fin, fout in [(4096, 4096), (4096, 16384)]:
        tag = f"{fin}->{fout}"
        cases += [
            (f"{tag} fprop", tokens, fout, fin, False, True),
            (f"{tag} dgrad", tokens, fin, fout, False, False),
            (f"{tag} wgrad", fout, fin, tokens, True, False),
        ]
    return cases


def src(m, n, k, ta, tb):
    a = torch.randn((k, m) if ta else (m, k), device="cuda", dtype=torch.bfloat16)
    b = torch.randn((n, k) if tb else (k, n), device="cuda", dtype=torch.bfloat16)
    return a, b


def op(x, trans):
    return x.t() if trans else x


def scaled_mm_per_tensor(a, b, ta, tb):
    """torch._scaled_mm needs row-major A [M,K] and column-major B [K,N]: makes those copies once."""
    a_mk = op(a, ta).contiguous().to(torch.float8_e4m3fn)
    b_nk = op(b, tb).t().contiguous().to(torch.float8_e4m3fn)  # [N, K]
    one = torch.ones((), device="cuda")
    return lambda: torch._scaled_mm(a_mk, b_nk.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def scaled_mm_block(a, b, ta, tb, b_2d: bool):
    m, k = op(a, ta).shape
    n = op(b, tb).shape[1]
    a_mk = op(a, ta).contiguous().to(torch.float8_e4m3fn)
    b_nk = op(b, tb).t().contiguous().to(torch.float8_e4m3fn)
    # 1x128 scales for A as [M, K/128] (column-major, as cuBLAS reads them), B 128x128 as
    # [K/128, N/128] (or 1x128 as [K/128, N]).
    sa = torch.ones((k // 128, m), device="cuda").t()
    sb = (
        torch.ones((n // 128, k // 128), device="cuda").t()
        if b_2d
        else torch.ones((k // 128, n), device="cuda")
    )
    fn = lambda: torch._scaled_mm(a_mk, b_nk.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)  # noqa: E731
    fn()
    return fn


def row(results, name, kind, flops, te_ms, peer_ms, peer_note=""):
    te_tf = flops / te_ms / 1e9
    r = {"problem": name, "kind": kind, "te_ms": te_ms, "te_tflops": te_tf}
    if peer_ms is not None:
        r.update(peer_ms=peer_ms, peer_tflops=flops / peer_ms / 1e9, ratio=peer_ms / te_ms)
    else:
        r["peer"] = peer_note or "unsupported"
    results.append(r)
    peer = f"{r['peer_tflops']:8.1f}  {r['ratio']:5.2f}x" if peer_ms is not None else f"  ({r['peer']})"
    print(f"{name:22s} {kind:11s} {te_tf:8.1f} {peer}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available() or not C.BUILT_WITH_CUDA:
        print("benchmarks/gemm.py: needs a CUDA GPU and a CUDA build of te-core", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    results = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; TFLOP/s te, peer, peer_ms/te_ms")
    print(f"{'problem':22s} {'kind':11s} {'te':>8s} {'peer':>8s}  ratio")
    ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    for name, m, n, k, ta, tb in gemm_cases(args.tokens):
        flops = 2.0 * m * n * k
        a, b = src(m, n, k, ta, tb)
        d = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
        # BF16
        cfg = C.GemmConfig(trans_a=ta, trans_b=tb, workspace=desc(ws, int(C.DType.UINT8)))
        oa, ob = op(a, ta), op(b, tb)
        te_ms, peer = pair_ms(
            te_call(hp(a), hp(b), hp(d), cfg), lambda oa=oa, ob=ob: torch.matmul(oa, ob), args.iters
        )
        row(results, name, "bf16", flops, te_ms, peer)
        # FP8 per-tensor
        qa, ka = te_fp8(a)
        qb, kb = te_fp8(b)
        split = 0 if "fprop" in name or name == "8192^3" else 1
        cfg8 = C.GemmConfig(
            trans_a=ta, trans_b=tb, use_split_accumulator=split, workspace=desc(ws, int(C.DType.UINT8))
        )
        try:
            peer_fn, note = scaled_mm_per_tensor(a, b, ta, tb), ""
        except Exception as e:  # noqa: BLE001
            peer_fn, note = None, f"torch._scaled_mm: {type(e).__name__}"
        te_ms, peer = pair_ms(te_call(qa, qb, hp(d), cfg8), peer_fn, args.iters)
        row(results, name, "fp8", flops, te_ms, peer, note)
        del qa, qb, ka, kb
        # FP8 block: weights 128x128 in fprop/dgrad (B), 1x128 otherwise
        b_2d = "wgrad" not in name
        try:
            qa, ka = te_fp8(a, MODE.BLOCK_1D)
            qb, kb = te_fp8(b, MODE.BLOCK_2D if b_2d else MODE.BLOCK_1D)
            cfgb = C.GemmConfig(trans_a=ta, trans_b=tb, workspace=desc(ws, int(C.DType.UINT8)))
            try:
                peer_fn, note = scaled_mm_block(a, b, ta, tb, b_2d), ""
            except Exception as e:  # noqa: BLE001
                peer_fn = None
                note = f"torch._scaled_mm block scales unsupported: {type(e).__name__}: {str(e)[:60]}"
            te_ms, peer = pair_ms(te_call(qa, qb, hp(d), cfgb), peer_fn, args.iters)
            row(results, name, "fp8_block", flops, te_ms, peer, note)
            del qa, qb, ka, kb
        except Exception as e:  # noqa: BLE001
            print(f"{name:22s} fp8_block   te failed: {e}", flush=True)
            results.append({"problem": name, "kind": "fp8_block", "error": str(e)})
        del a, b, d
        torch.cuda.empty_cache()

    # Fused epilogues, 4096 -> 16384.
    t, fin, fout = args.tokens, 4096, 16384
    x = torch.randn((t, fin), device="cuda", dtype=torch.bfloat16)
    w = torch.randn((fout, fin), device="cuda", dtype=torch.bfloat16)
    bias = torch.randn((fout,), device="cuda", dtype=torch.bfloat16)
    y = torch.empty((t, fout), device="cuda", dtype=torch.bfloat16)
    aux = torch.empty_like(y)
    cfg = C.GemmConfig(
        trans_b=True,
        epilogue=int(C.Epilogue.GELU_AUX),
        bias=desc(bias),
        aux=desc(aux),
        workspace=desc(ws, int(C.DType.UINT8)),
    )

    def torch_bias_gelu():
        pre = torch.matmul(x, w.t()) + bias
        return F.gelu(pre, approximate="tanh"), pre

    te_ms, peer = pair_ms(te_call(hp(x), hp(w), hp(y), cfg), torch_bias_gelu, args.iters)
    row(results, f"{fin}->{fout} fprop", "bias_gelu", 2.0 * t * fout * fin, te_ms, peer)
    del y, aux
    dy = torch.randn((t, fout), device="cuda", dtype=torch.bfloat16)
    main_grad = torch.zeros((fout, fin), device="cuda", dtype=torch.float32)
    cfg = C.GemmConfig(trans_a=True, beta=1.0, workspace=desc(ws, int(C.DType.UINT8)))
    te_ms, peer = pair_ms(
        te_call(hp(dy), hp(x), hp(main_grad), cfg),
        lambda: main_grad.add_(torch.matmul(dy.t(), x)),
        args.iters,
    )
    row(results, f"{fin}->{fout} wgrad", "accumulate", 2.0 * t * fout * fin, te_ms, peer)

    if args.json:
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "iters": args.iters}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
