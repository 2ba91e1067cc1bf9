"""Time of one small Linear forward+backward (default 16x1024 -> 1024, where host overhead
dominates): te.Linear under each FP8 recipe against torch.nn.Linear, and te's high-precision GEMM
against F.linear. On a GPU (default when there is one) each step ends with a synchronize, so the figure is
host overhead plus a short kernel time for both; on the CPU it is te's reference backend.
Median microseconds over ``--iters`` steps; prints, asserts nothing; ``--json`` writes the rows.

    PYTHONPATH=packages/te-core/src:packages/te-torch/src python benchmarks/linear_host_time.py
"""

import argparse
import cProfile
import json
import pstats
import statistics
import time

import te_torch as te
import torch
import torch.nn.functional as F


def median_us(fn, iters: int, sync) -> float:
    for _ in range(5):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--profile",
        default=None,
        choices=["delayed", "current", "block"],
        help="also print cProfile's top entries for te's step under this recipe",
    )
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    x = torch.randn(a.m, a.k, requires_grad=True, device=dev, dtype=dtype)
    dy = torch.randn(a.m, a.n, device=dev, dtype=dtype)
    ref = torch.nn.Linear(a.k, a.n, device=dev, dtype=dtype)
    m = te.Linear(a.k, a.n, device=dev, params_dtype=dtype)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def torch_step():
        ref(x).backward(dy)

    def te_fp8(recipe):
        def step():
            with te.autocast(recipe=recipe):
                y = m(x)
            y.backward(dy)

        return step

    def te_hp_step():
        m(x).backward(dy)

    w = m.weight.detach()
    xd = x.detach()
    recipes = {
        "delayed": te.recipe.DelayedScaling(),
        "current": te.recipe.Float8CurrentScaling(),
        "block": te.recipe.Float8BlockScaling(),
    }
    rows = [
        ("torch nn.Linear fwd+bwd", median_us(torch_step, a.iters, sync)),
        *(
            (f"te.Linear fp8 {name} scaling fwd+bwd", median_us(te_fp8(r), a.iters, sync))
            for name, r in recipes.items()
        ),
        ("te.Linear outside autocast fwd+bwd", median_us(te_hp_step, a.iters, sync)),
        ("F.linear fp32 (forward GEMM only)", median_us(lambda: F.linear(xd, w), a.iters, sync)),
        (
            "te.functional.gemm fp32 (forward GEMM only)",
            median_us(lambda: te.functional.gemm(xd, w), a.iters, sync),
        ),
    ]
    print(
        f"{a.device}, {torch.get_num_threads()} CPU threads, {a.dtype} {a.m}x{a.k} -> {a.n}, "
        f"median of {a.iters}"
    )
    for name, us in rows:
        print(f"  {name:45s} {us:10.1f} us   ({us / rows[0][1]:.2f}x torch fwd+bwd)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {"device": a.device, "dtype": a.dtype, "shape": [a.m, a.k, a.n], "rows": dict(rows)},
                f,
                indent=2,
            )
    if a.profile:
        step = te_fp8(recipes[a.profile])
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.iters):
            step()
            sync()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
