"""te's LayerNorm / RMSNorm kernels against the copy ceiling, torch's norms and torch.compile.

Input 16384 x 8192 BF16 (256 MiB, several times the H200's L2), gamma/beta BF16. Rows:

  fwd bf16          y BF16, mu/rsigma fp32
  fwd fp8_delayed   y E4M3, per-tensor scale given, amax of y max-accumulated (one pass)
  fwd fp8_current   y E4M3, per-tensor current scaling: stats + amax pass, then the quantizing
                    pass (reads x twice: "actual" counts both reads)
  fwd block1d       y E4M3 in 1x128 blocks, row-wise copy only (one pass)
  bwd               dz, x BF16 -> dx BF16, dgamma (and dbeta for LayerNorm) BF16

TB/s over the bytes that must move: x (and dz) read once, gamma/beta, mu/rsigma, and every output
written; "x copy" is that rate over torch's device-to-device copy measured in the same run. te is
timed as CUDA-graph replays of 10 back-to-back calls (kernel time, as benchmarks/quantize.py
does) and eagerly (the same 10 calls launched from Python). Peers: torch eager (nn.LayerNorm /
nn.RMSNorm's functional form, plus a separate cast to float8 for the FP8 rows; the backward
through autograd) and torch.compile of the same computation (the FP8 cast fused by inductor; the
backward as the explicit formula). te's outputs are checked first: BF16 y against torch in fp32,
FP8 bytes against torch's cast of te's own fp32 y (0 mismatches expected).
--json PATH writes every figure.
"""

from __future__ import annotations

import argparse
import json
import sys

import te_core._C as C
import torch
import torch.nn.functional as F
from quantize import REPS, time_ms

CUDA = int(C.DeviceType.CUDA)
BF16, F32, E4M3 = int(C.DType.BFLOAT16), int(C.DType.FLOAT32), int(C.DType.FLOAT8_E4M3)
E4M3_MAX = 448.0
EPS = 1e-5
# Transformer Engine 2.20.2 on the same H200 (GPU.md): BF16 forward, TB/s.
TE_REF = {("layernorm", "fwd bf16"): 3.34, ("rmsnorm", "fwd bf16"): 3.73}


def desc(t: torch.Tensor, dtype: int) -> C.Tensor:
    return C.Tensor(t.data_ptr(), dtype, tuple(t.shape), CUDA, t.device.index or 0)


def stream() -> int:
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())


def to_fp8(v: torch.Tensor) -> torch.Tensor:
    return v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


class Norm:
    """te and torch calls for one norm kind over fixed buffers (descriptors built once)."""

    def __init__(self, rms: bool, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor):
        self.rms, self.x, self.gamma, self.beta = rms, x, gamma, None if rms else beta
        m, h = x.shape
        dev = x.device
        self.mu = torch.empty(m, device=dev)
        self.rs = torch.empty(m, device=dev)
        self.xd, self.gd = desc(x, BF16), desc(gamma, BF16)
        self.bd = None if rms else desc(beta, BF16)
        self.mud, self.rsd = desc(self.mu, F32), desc(self.rs, F32)
        self.cfg = C.NormConfig(eps=EPS)

    def te_fwd(self, out: C.QuantizedTensor, qcfg=None):
        if self.rms:
            return lambda: C.rmsnorm_fwd(self.xd, self.gd, out, self.rsd, self.cfg, qcfg, stream())
        return lambda: C.layernorm_fwd(
            self.xd, self.gd, self.bd, out, self.mud, self.rsd, self.cfg, qcfg, stream()
        )

    def torch_y(self, x):
        """torch's norm of x (gamma/beta cast to x's dtype: a no-op for the timed BF16 calls)."""
        h, g = x.shape[-1], self.gamma.to(x.dtype)
        if self.rms:
            return F.rms_norm(x, (h,), g, EPS)
        return F.layer_norm(x, (h,), g, self.beta.to(x.dtype), EPS)


def fwd_rows(n: Norm, args, results):
    x = n.x
    m, h = x.shape
    N = m * h
    dev = x.device
    stats = 4 * m * (1 if n.rms else 2)
    weights = 2 * h * (1 if n.rms else 2)
    y = torch.empty_like(x)
    y32 = torch.empty(m, h, device=dev)
    q = torch.empty(m, h, device=dev, dtype=torch.uint8)
    sinv = torch.empty(1, device=dev)
    amax = torch.zeros(1, device=dev)
    scale = torch.empty(1, device=dev)
    bsinv = torch.empty(
        C.quantized_shape(int(C.ScalingMode.BLOCK_1D), int(C.Part.ROWWISE_SCALE_INV), [m, h]), device=dev
    )
    PT, B1 = int(C.ScalingMode.PER_TENSOR), int(C.ScalingMode.BLOCK_1D)
    hp_bf16 = C.QuantizedTensor(PT, rowwise_data=desc(y, BF16))
    hp_f32 = C.QuantizedTensor(PT, rowwise_data=desc(y32, F32))
    fp8 = C.QuantizedTensor(
        PT,
        rowwise_data=desc(q, E4M3),
        rowwise_scale_inv=desc(sinv, F32),
        amax=desc(amax, F32),
        scale=desc(scale, F32),
    )
    blk = C.QuantizedTensor(B1, rowwise_data=desc(q, E4M3), rowwise_scale_inv=desc(bsinv, F32))
    delayed, current = C.QuantConfig(compute_scale=False), C.QuantConfig(compute_scale=True)
    pow2 = C.QuantConfig(force_pow2_scales=True)

    # ---- correctness first
    n.te_fwd(hp_f32)()
    n.te_fwd(hp_bf16)()
    ref = n.torch_y(x.float())
    err = float(((y.float() - ref).abs() / (ref.abs() + 1e-2)).max())
    scale.fill_(E4M3_MAX / float(y32.abs().max()) / 2)
    checks = {"fwd bf16": f"max rel err vs torch fp32 {err:.1e}"}
    n.te_fwd(fp8, delayed)()
    checks["fwd fp8_delayed"] = int((q != to_fp8(y32 * scale).view(torch.uint8)).sum())
    n.te_fwd(fp8, current)()
    # A true division: Python-number / tensor is reciprocal() * number in torch, which differs
    # from the correctly rounded fp8_max / amax (NUMERICS.md) by an ulp for about 1 amax in 4.
    amax_y = y32.abs().max()
    s_cur = torch.full_like(amax_y, E4M3_MAX) / amax_y
    checks["fwd fp8_current"] = int((q != to_fp8(y32 * s_cur).view(torch.uint8)).sum()) + int(
        amax.item() != y32.abs().max().item()
    )
    n.te_fwd(blk, pow2)()
    yb = y32.reshape(m, h // 128, 128)
    amax_b = yb.abs().amax(-1, keepdim=True)
    sb = torch.full_like(amax_b, E4M3_MAX) / amax_b
    sb = (sb.view(torch.int32) & -8388608).view(torch.float32)  # round down to a power of two
    checks["fwd block1d"] = int((q != to_fp8(yb * sb).reshape(m, h).view(torch.uint8)).sum())
    torch.cuda.synchronize()

    # ---- peers: torch's norm (+ a separate cast), and torch.compile of the same
    def peer_bf16(x):
        return n.torch_y(x)

    def peer_delayed(x):
        yy = n.torch_y(x)
        return to_fp8(yy.float() * scale), torch.maximum(amax, yy.abs().amax().float()), 1.0 / scale

    def peer_current(x):
        yy = n.torch_y(x)
        a = yy.abs().amax().float()
        s = E4M3_MAX / a
        return to_fp8(yy.float() * s), a, 1.0 / s

    def peer_block(x):
        yy = n.torch_y(x).float().reshape(m, h // 128, 128)
        s = E4M3_MAX / yy.abs().amax(-1, keepdim=True)
        s = (s.view(torch.int32) & -8388608).view(torch.float32)
        return to_fp8(yy * s).reshape(m, h), 1.0 / s

    rows = [
        ("fwd bf16", n.te_fwd(hp_bf16), 2 * N + 2 * N, peer_bf16, 0),
        ("fwd fp8_delayed", n.te_fwd(fp8, delayed), 2 * N + N, peer_delayed, 0),
        ("fwd fp8_current", n.te_fwd(fp8, current), 2 * N + N, peer_current, 2 * N),
        ("fwd block1d", n.te_fwd(blk, pow2), 2 * N + N + 4 * bsinv.numel(), peer_block, 0),
    ]
    for name, te_fn, data_bytes, peer, reread in rows:
        counted = data_bytes + weights + stats
        measure(results, n, name, te_fn, counted, counted + reread, lambda p=peer: p(x), checks[name], args)


def bwd_row(n: Norm, args, results):
    x = n.x
    m, h = x.shape
    N = m * h
    dz = torch.randn_like(x)
    dx = torch.empty_like(x)
    dg = torch.empty_like(n.gamma)
    db = torch.empty_like(n.gamma)
    n.te_fwd(C.QuantizedTensor(int(C.ScalingMode.PER_TENSOR), rowwise_data=desc(dx, BF16)))()  # mu, rsigma
    dzd, dxd, dgd, dbd = desc(dz, BF16), desc(dx, BF16), desc(dg, BF16), desc(db, BF16)
    cfg = C.NormConfig()
    if n.rms:

        def te_fn():
            C.rmsnorm_bwd(dzd, n.xd, n.rsd, n.gd, dxd, dgd, cfg, stream())
    else:

        def te_fn():
            C.layernorm_bwd(dzd, n.xd, n.mud, n.rsd, n.gd, dxd, dgd, dbd, cfg, stream())

    # Check: against autograd of torch's norm in fp32.
    te_fn()
    xr = x.float().requires_grad_(True)
    gr = n.gamma.float().requires_grad_(True)
    br = None if n.rms else n.beta.float().requires_grad_(True)
    yr = F.rms_norm(xr, (h,), gr, EPS) if n.rms else F.layer_norm(xr, (h,), gr, br, EPS)
    grads = torch.autograd.grad(yr, [xr, gr] + ([] if n.rms else [br]), dz.float())
    err = float(((dx.float() - grads[0]).abs()).max() / grads[0].abs().max())
    err = max(err, float((dg.float() - grads[1]).abs().max() / grads[1].abs().max()))
    del xr, gr, br, yr, grads

    # Peers: autograd through torch's norm (backward only), and the explicit formula compiled.
    xa = x.detach().requires_grad_(True)
    ga = n.gamma.detach().requires_grad_(True)
    ba = None if n.rms else n.beta.detach().requires_grad_(True)
    ya = F.rms_norm(xa, (h,), ga, EPS) if n.rms else F.layer_norm(xa, (h,), ga, ba, EPS)
    inputs = [xa, ga] + ([] if n.rms else [ba])

    def peer_eager():
        return torch.autograd.grad(ya, inputs, dz, retain_graph=True)

    mu, rs = n.mu, n.rs

    def peer_formula():
        xf, dyf = x.float(), dz.float()
        xhat = (xf if n.rms else xf - mu[:, None]) * rs[:, None]
        dxhat = dyf * n.gamma.float()
        proj = (dxhat * xhat).mean(-1, keepdim=True)
        center = 0.0 if n.rms else dxhat.mean(-1, keepdim=True)
        dxv = (rs[:, None] * (dxhat - center - xhat * proj)).to(x.dtype)
        dgv = (dyf * xhat).sum(0).to(x.dtype)
        return (dxv, dgv) if n.rms else (dxv, dgv, dyf.sum(0).to(x.dtype))

    weights = 2 * h * (2 if n.rms else 3)  # gamma read; dgamma (and dbeta) written
    counted = 3 * 2 * N + 4 * m * (1 if n.rms else 2) + weights
    measure(
        results,
        n,
        "bwd",
        te_fn,
        counted,
        counted,
        peer_formula,
        f"max rel err vs autograd fp32 {err:.1e}",
        args,
        peer_eager,
    )


def measure(results, n, name, te_fn, counted, actual, peer, check, args, peer_eager=None):
    kind = "rmsnorm" if n.rms else "layernorm"
    te_ms = time_ms(te_fn, args.iters, args.warmup, graph=True)
    eager_ms = time_ms(te_fn, args.iters, args.warmup, graph=False)
    torch_ms = time_ms(peer_eager or peer, args.iters, args.warmup, graph=False)
    r = {
        "norm": kind,
        "op": name,
        "te_ms": te_ms,
        "te_tbs": counted / te_ms / 1e9,
        "eager_ms": eager_ms,
        "eager_tbs": counted / eager_ms / 1e9,
        "bytes_counted": counted,
        "frac_copy": counted / te_ms / 1e9 / args.copy_tbs,
        "torch_ms": torch_ms,
        "te_over_torch": torch_ms / te_ms,
        "check": check,
        "te2_20_ref_tbs": TE_REF.get((kind, name)),
    }
    if actual != counted:
        r["te_tbs_actual"] = actual / te_ms / 1e9
    if not args.no_compile:
        compiled = torch.compile(peer, fullgraph=True, dynamic=False)
        c_ms = time_ms(compiled, args.iters, max(args.warmup, 3), graph=True)
        r.update(compile_ms=c_ms, te_over_compile=c_ms / te_ms)
    results.append(r)
    comp = f"{r['compile_ms']:.3f}" if "compile_ms" in r else "-"
    ratio = f"{r['te_over_compile']:.2f}x" if "te_over_compile" in r else "-"
    extra = f"  (actual {r['te_tbs_actual']:.2f} TB/s)" if "te_tbs_actual" in r else ""
    print(
        f"{kind:<10}{name:<17}{te_ms:>8.3f}{r['te_tbs']:>8.2f}{r['frac_copy']:>7.2f}{r['eager_tbs']:>8.2f}"
        f"{torch_ms:>9.3f}{r['te_over_torch']:>7.2f}x{comp:>9}{ratio:>8}   {check}{extra}",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if not torch.cuda.is_available() or not C.BUILT_WITH_CUDA or C.cuda_device_count() == 0:
        print("benchmarks/norm.py: needs a CUDA GPU and a CUDA build of te-core", file=sys.stderr)
        return 1
    if args.hidden % 128:
        print("benchmarks/norm.py: --hidden must be a multiple of 128 (the 1x128 block row)", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    m, h = args.rows, args.hidden
    x = (torch.randn(m, h, device="cuda") * 2 + 0.5).to(torch.bfloat16)
    gamma = (torch.randn(h, device="cuda") * 0.3 + 1).to(torch.bfloat16)
    beta = (torch.randn(h, device="cuda") * 0.1).to(torch.bfloat16)
    dst = torch.empty_like(x)
    copy_ms = time_ms(lambda: dst.copy_(x), args.iters, args.warmup, graph=True)
    args.copy_tbs = 2 * 2 * m * h / copy_ms / 1e9
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {m}x{h} bf16; copy {copy_ms:.3f} ms = "
        f"{args.copy_tbs:.2f} TB/s (CUDA-graph replays of {REPS} calls)"
    )
    print(
        f"{'norm':<10}{'op':<17}{'te ms':>8}{'TB/s':>8}{'xcopy':>7}{'eager':>8}{'torch ms':>9}{'te/tor':>8}"
        f"{'comp ms':>9}{'te/comp':>8}   check"
    )
    results = []
    for rms in [False, True]:
        n = Norm(rms, x, gamma, beta)
        fwd_rows(n, args, results)
        bwd_row(n, args, results)
        torch.cuda.empty_cache()
    if args.json:
        meta = {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "rows": m,
            "hidden": h,
            "timing": f"CUDA graph of {REPS} calls",
            "copy_ms": copy_ms,
            "copy_tbs": args.copy_tbs,
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    bad = [r for r in results if isinstance(r["check"], int) and r["check"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
