"""te's fused activation kernels against the copy ceiling and against torch.compile.

The MLP's middle at 16384 tokens, FFN 8192, BF16: GELU on x [16384, 8192], SwiGLU on
x [16384, 16384] (activation half first) giving [16384, 8192]; the backward gets grad [16384, 8192].
Timed as benchmarks/quantize.py times (median of CUDA-graph replays of 10 calls, and the same calls
launched from Python). TB/s over the bytes that must move, per output element of the forward / per
grad element of the backward:

  gelu_bf16            x 2 + y 2                                     4 B
  gelu_delayed         x 2 + y 1 (FP8 row-wise, amax of the result)  3 B
  gelu_delayed_ct      x 2 + y 1 + y^T 1                             4 B
  gelu_current_ct      counted 4 B (TE's way); 6 B actually move (x read twice)
  gelu_block1d_ct      x 2 + y 1 + y^T 1 (+ scales)                  4 B
  swiglu_bf16          x 4 + y 2                                     6 B
  swiglu_delayed_ct    x 4 + y 1 + y^T 1                             6 B
  dgelu_dbias_bf16     grad 2 + x 2 + dx 2 (+ dbias)                 6 B
  dgelu_dbias_delayed_ct  grad 2 + x 2 + dx 1 + dx^T 1               6 B
  dgelu_delayed_ct     the same without the bias gradient (what dbias costs)  6 B
  dswiglu_bf16         grad 2 + x 4 + dx 4                           10 B
  dbias_quantize_ct    grad 2 + q 1 + q^T 1 (te_dbias_quantize)      4 B

Peers (plain torch through torch.compile): the BF16 forward of GELU and SwiGLU and GELU's
backward with the bias gradient. Correctness is the tests' job (tests/gpu/test_activation.py);
here te's BF16 results are only compared with torch's eager formula (max error in bf16 ulps) so a
broken build does not print fast numbers (normwise relative error). Writes everything to --json.
"""

from __future__ import annotations

import argparse
import json
import sys

import te_core._C as C
import torch
from quantize import REPS, desc, stream, time_ms

E4M3_MAX = 448.0
# The ops of the table above, the names --ops takes (checked before anything is allocated).
OPS = (
    "gelu_bf16", "gelu_delayed", "gelu_delayed_ct", "gelu_current_ct", "gelu_block1d_ct",
    "swiglu_bf16", "swiglu_delayed_ct", "dgelu_dbias_bf16", "dgelu_dbias_delayed_ct",
    "dgelu_delayed_ct", "dswiglu_bf16", "dbias_quantize_ct",
)  # fmt: skip


def gelu(x):
    return x * (0.5 + 0.5 * torch.tanh(x * (0.79788456 + 0.03567741 * x * x)))


def dgelu(x):
    t = torch.tanh(0.79788456 * x * (1.0 + 0.044715 * x * x))
    return 0.5 * x * ((1.0 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1.0 + t)


def peer_gelu(x):
    return gelu(x.float()).to(torch.bfloat16)


def peer_swiglu(x):
    a, b = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(a) * b).to(torch.bfloat16)


def peer_dgelu_dbias(grad, x):
    dx = grad.float() * dgelu(x.float())
    return dx.to(torch.bfloat16), dx.sum(dim=0)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Normwise relative error ||got - want|| / ||want|| (NUMERICS.md: <= 1e-2 for BF16 results)."""
    g, w = got.float(), want.float()
    return float(torch.linalg.vector_norm(g - w) / torch.linalg.vector_norm(w))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    ap.add_argument("--ops", default=None, help="comma-separated op names to time (default: all)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    wanted = None if args.ops is None else args.ops.split(",")
    unknown = sorted(set(wanted or ()) - set(OPS))
    if unknown:
        ap.error(f"--ops: unknown op(s) {unknown}; known: {sorted(OPS)}")

    torch.manual_seed(0)
    dev = torch.device("cuda")
    M, N = args.tokens, args.ffn
    E = M * N
    BF16, F32, E4M3 = C.DType.BFLOAT16, C.DType.FLOAT32, C.DType.FLOAT8_E4M3
    PT, B1 = C.ScalingMode.PER_TENSOR, C.ScalingMode.BLOCK_1D
    x = torch.randn(M, N, device=dev, dtype=torch.bfloat16) * 3
    xg = torch.randn(M, 2 * N, device=dev, dtype=torch.bfloat16) * 3
    grad = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    dxg = torch.empty(M, 2 * N, device=dev, dtype=torch.bfloat16)
    dbias = torch.empty(N, device=dev, dtype=torch.float32)
    x_d, xg_d, grad_d, y_d = desc(x, BF16), desc(xg, BF16), desc(grad, BF16), desc(y, BF16)
    dxg_d, dbias_d = desc(dxg, BF16), desc(dbias, F32)

    hp_y, hp_dxg = C.QuantizedTensor(PT, rowwise_data=y_d), C.QuantizedTensor(PT, rowwise_data=dxg_d)

    def f32(shape, v=0.0):
        return torch.full(shape, v, device=dev, dtype=torch.float32)

    q_row = torch.empty(M, N, device=dev, dtype=torch.uint8)
    q_col = torch.empty(N, M, device=dev, dtype=torch.uint8)
    sinv_r, sinv_c, amax, scale = f32((1,)), f32((1,)), f32((1,)), f32((1,), 32.0)
    row = dict(rowwise_data=desc(q_row, E4M3), rowwise_scale_inv=desc(sinv_r, F32))
    per_tensor = dict(amax=desc(amax, F32), scale=desc(scale, F32))
    col = dict(columnwise_data=desc(q_col, E4M3), columnwise_scale_inv=desc(sinv_c, F32))
    q_delayed = C.QuantizedTensor(PT, **row, **per_tensor)
    q_ct = C.QuantizedTensor(PT, **row, **per_tensor, **col)
    b1_sr = f32(C.quantized_shape(B1, C.Part.ROWWISE_SCALE_INV, (M, N)))
    b1_sc = f32(C.quantized_shape(B1, C.Part.COLUMNWISE_SCALE_INV, (M, N)))
    q_b1 = C.QuantizedTensor(
        B1,
        rowwise_data=desc(q_row, E4M3),
        rowwise_scale_inv=desc(b1_sr, F32),
        columnwise_data=desc(q_col, E4M3),
        columnwise_scale_inv=desc(b1_sc, F32),
    )
    delayed, current = C.QuantConfig(compute_scale=False), C.QuantConfig(compute_scale=True)
    block = C.QuantConfig(force_pow2_scales=True)
    GELU, SWIGLU = int(C.Activation.GELU), int(C.Activation.SWIGLU)
    scales_1d = 4.0 * (b1_sr.numel() + b1_sc.numel())

    ops = {
        "gelu_bf16": (lambda: C.activation_fwd(x_d, hp_y, GELU, None, stream()), 4.0 * E),
        "gelu_delayed": (lambda: C.activation_fwd(x_d, q_delayed, GELU, delayed, stream()), 3.0 * E),
        "gelu_delayed_ct": (lambda: C.activation_fwd(x_d, q_ct, GELU, delayed, stream()), 4.0 * E),
        "gelu_current_ct": (lambda: C.activation_fwd(x_d, q_ct, GELU, current, stream()), 4.0 * E),
        "gelu_block1d_ct": (
            lambda: C.activation_fwd(x_d, q_b1, GELU, block, stream()),
            4.0 * E + scales_1d,
        ),
        "swiglu_bf16": (lambda: C.activation_fwd(xg_d, hp_y, SWIGLU, None, stream()), 6.0 * E),
        "swiglu_delayed_ct": (lambda: C.activation_fwd(xg_d, q_ct, SWIGLU, delayed, stream()), 6.0 * E),
        "dgelu_dbias_bf16": (
            lambda: C.activation_bwd(grad_d, x_d, hp_y, dbias_d, GELU, None, stream()),
            6.0 * E,
        ),
        "dgelu_dbias_delayed_ct": (
            lambda: C.activation_bwd(grad_d, x_d, q_ct, dbias_d, GELU, delayed, stream()),
            6.0 * E,
        ),
        "dgelu_delayed_ct": (
            lambda: C.activation_bwd(grad_d, x_d, q_ct, None, GELU, delayed, stream()),
            6.0 * E,
        ),
        "dswiglu_bf16": (
            lambda: C.activation_bwd(grad_d, xg_d, hp_dxg, None, SWIGLU, None, stream()),
            10.0 * E,
        ),
        "dbias_quantize_ct": (lambda: C.dbias_quantize(grad_d, q_ct, dbias_d, delayed, stream()), 4.0 * E),
    }
    timed = ops if wanted is None else {k: v for k, v in ops.items() if k in wanted}
    actual_bytes = {"gelu_current_ct": 6.0 * E}
    peers = {
        "gelu_bf16": lambda: peer_gelu(x),
        "swiglu_bf16": lambda: peer_swiglu(xg),
        "dgelu_dbias_bf16": lambda: peer_dgelu_dbias(grad, x),
    }

    # ---- a sanity check of the BF16 results against torch's eager formula
    off = {}
    with torch.no_grad():
        ops["gelu_bf16"][0]()
        off["gelu_bf16"] = rel_err(y, peer_gelu(x))
        ops["swiglu_bf16"][0]()
        off["swiglu_bf16"] = rel_err(y, peer_swiglu(xg))
        ops["dgelu_dbias_bf16"][0]()
        want_dx, want_db = peer_dgelu_dbias(grad, x)
        off["dgelu_dbias_bf16"] = rel_err(y, want_dx)
        db_err = float(((dbias - want_db).abs() / want_db.abs().clamp(min=1.0)).max())
        torch.cuda.synchronize()

    copy_src = torch.empty(M, 2 * N, device=dev, dtype=torch.bfloat16)
    copy_dst = torch.empty_like(copy_src)
    # An elementwise kernel, not copy_: captured in a CUDA graph, a 512 MB copy_ becomes a memcpy
    # node that ran at 2.75 TB/s on the H200 against 4.25 TB/s for this kernel (eager copy_: 4.17;
    # at 256 MB both 4.23).
    copy_ms = time_ms(lambda: torch.mul(copy_src, 1, out=copy_dst), args.iters, args.warmup, graph=True)
    copy_tbs = 4.0 * copy_src.numel() / copy_ms / 1e9
    results = []
    for name, (fn, counted) in timed.items():
        te_ms = time_ms(fn, args.iters, args.warmup, graph=True)
        eager_ms = time_ms(fn, args.iters, args.warmup, graph=False)
        r = {
            "op": name,
            "te_ms": te_ms,
            "te_tbs": counted / te_ms / 1e9,
            "eager_tbs": counted / eager_ms / 1e9,
            "bytes_counted": counted,
            "rel_err_vs_torch": off.get(name),
        }
        r["frac_copy"] = r["te_tbs"] / copy_tbs
        if name in actual_bytes:
            r["te_tbs_actual"] = actual_bytes[name] / te_ms / 1e9
        if name in peers and not args.no_compile:
            compiled = torch.compile(peers[name], fullgraph=True)
            tc_ms = time_ms(compiled, args.iters, max(args.warmup, 3), graph=True)
            r.update(compile_tbs=counted / tc_ms / 1e9, te_over_compile=tc_ms / te_ms)
        results.append(r)

    print(
        f"device: {torch.cuda.get_device_name()}  tokens {M} ffn {N} bf16  copy {copy_tbs:.2f} TB/s "
        f"(CUDA-graph replays of {REPS} calls; 'eager': launched from Python)  dbias max rel err "
        f"vs torch {db_err:.2e}"
    )
    hdr = (
        f"{'op':<24}{'te ms':>9}{'te TB/s':>9}{'x copy':>8}{'eager TB/s':>12}{'compile TB/s':>14}"
        f"{'te/compile':>12}{'rel err':>10}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        ctb = f"{r['compile_tbs']:.2f}" if "compile_tbs" in r else "-"
        rat = f"{r['te_over_compile']:.2f}x" if "te_over_compile" in r else "-"
        err = "-" if r["rel_err_vs_torch"] is None else f"{r['rel_err_vs_torch']:.1e}"
        extra = f"   (actual {r['te_tbs_actual']:.2f} TB/s)" if "te_tbs_actual" in r else ""
        print(
            f"{r['op']:<24}{r['te_ms']:>9.3f}{r['te_tbs']:>9.2f}{r['frac_copy']:>8.2f}"
            f"{r['eager_tbs']:>12.2f}{ctb:>14}{rat:>12}{err:>10}{extra}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "tokens": M,
                    "ffn": N,
                    "timing": f"CUDA graph of {REPS} calls",
                    "copy_tbs": copy_tbs,
                    "dbias_max_rel_err_vs_torch": db_err,
                    "results": results,
                },
                f,
                indent=2,
            )
    return 1 if any(v > 1e-2 for v in off.values()) or db_err > 1e-3 else 0


if __name__ == "__main__":
    sys.exit(main())
