"""te demo: quantize one activation-like tensor with every FP8 scheme te implements and show, per
scheme, the error against the input and the time per call. Runs on a GPU when there is one,
otherwise on the CPU reference backend (same numbers, bit for bit).

    nox -s demo            # or: python examples/quantize_demo.py [--rows 4096 --cols 4096]
"""

from __future__ import annotations

import argparse
import time

import te_torch as te
import torch


def relative_error(x: torch.Tensor, y: torch.Tensor) -> float:
    return ((x.float() - y.float()).norm() / x.float().norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=2048)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    # Activation-like: mostly small values and a few outlier tokens (rows) 10^4 times larger, which
    # push the quiet tokens into FP8's subnormal range under one per-tensor scale.
    x = torch.randn(args.rows, args.cols, device=device) * 0.5
    outliers = torch.zeros(args.rows, dtype=torch.bool, device=device)
    outliers[:: max(1, args.rows // 16)] = True
    x[outliers] *= 1e4
    x = x.to(torch.bfloat16)

    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    schemes = {
        "delayed E4M3 (scale from amax)": te.Float8Quantizer(
            torch.tensor([448.0 / x.abs().max().float().item()], device=device),
            torch.zeros(1, device=device),
            e4m3,
        ),
        "current E4M3": te.Float8CurrentScalingQuantizer(e4m3, device),
        "current E5M2": te.Float8CurrentScalingQuantizer(e5m2, device),
        "current E4M3, pow2 scales": te.Float8CurrentScalingQuantizer(e4m3, device, force_pow_2_scales=True),
        "block 1x128 E4M3": te.Float8BlockQuantizer(e4m3, block_scaling_dim=1),
        "block 128x128 E4M3": te.Float8BlockQuantizer(e4m3, block_scaling_dim=2),
    }
    print(f"te demo on {device}: {args.rows}x{args.cols} bf16 input with outlier channels\n")
    print(f"{'scheme':32} {'rel. error':>10} {'quiet rows':>10} {'ms/call':>9}")
    for name, quantizer in schemes.items():
        q = quantizer(x)
        back = q.dequantize(dtype=torch.float32)
        err = relative_error(x, back)
        quiet_err = relative_error(x[~outliers], back[~outliers])
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            quantizer(x)
        if device == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 100
        print(f"{name:32} {err:10.4f} {quiet_err:10.4f} {ms:9.3f}")
    print("\nrel. error: normwise over the tensor; quiet rows: over the rows without outliers.")
    print("1x128 blocks give each row its own scales, so outlier tokens cannot crush the others;")
    print("E5M2 trades mantissa for range (te uses it for gradients under Format.HYBRID).")


if __name__ == "__main__":
    main()
