"""Host time of one small Linear forward+backward (default 16x1024 -> 1024, where host overhead
dominates): te.Linear under each FP8 recipe (eagerly, and through te.make_graphed_callables)
against torch.nn.Linear, and te's high-precision GEMM against F.linear. Two figures per row, both
medians over ``--rounds`` rounds in which every row runs ``--steps`` steps in turn (a row's ratio
to torch is the median of its per-round ratios, so a slow spell of the shared host hits both sides
alike):

  host    steps back to back, one synchronize after the last: the wall time per step (the
          GPU's work per step, tens of us, is far shorter than the host's, so it hides behind it)
  cpu     the same steps' CPU time (time.process_time, all of the process's threads): what the
          step costs the host, not counting the time a busy shared host takes the CPU away
  synced  a synchronize after every step: host time plus the GPU's tail of each step

``--zero-grad``: every row's step ends by setting its gradients to None (the parameters' and the
input's), as ``optimizer.zero_grad()`` does in a training loop; without it they accumulate from
step to step, and torch's AccumulateGrad launches an add per gradient on both sides.

``--inference``: each row's forward alone under torch.no_grad() (decoding, where a step is a few
tokens; try ``--m 15``: te pads no token count without a weight gradient), the CUDA-graph rows
left out.

On the CPU it is te's reference backend. Prints, asserts nothing; ``--json`` writes the rows.

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


def per_step_us(fn, steps: int, sync, sync_each: bool) -> tuple[float, float]:
    """(wall, process CPU) microseconds per step."""
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        fn()
        if sync_each:
            sync()
    sync()
    return (time.perf_counter() - t0) / steps * 1e6, (time.process_time() - c0) / steps * 1e6


FIGURES = ("host", "cpu", "synced")


def measure(rows, rounds: int, steps: int, sync) -> dict:
    """{name: {"host": [us per round], "cpu": [...], "synced": [...]}}; rows[0] is the baseline."""
    for _, fn in rows:  # warm-up: first-call setup, plan caches, allocator pools
        for _ in range(10):
            fn()
    out = {name: {k: [] for k in FIGURES} for name, _ in rows}
    for r in range(rounds):
        order = rows[r % len(rows) :] + rows[: r % len(rows)]
        for name, fn in order:
            host, cpu = per_step_us(fn, steps, sync, False)
            out[name]["host"].append(host)
            out[name]["cpu"].append(cpu)
            out[name]["synced"].append(per_step_us(fn, steps, sync, True)[0])
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--inference", action="store_true", help="forward only, under torch.no_grad()")
    p.add_argument("--zero-grad", action="store_true", help="gradients set to None after every step")
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

    def clear(module):
        if a.zero_grad:
            module.weight.grad = module.bias.grad = x.grad = None

    def torch_step():
        if a.inference:
            with torch.no_grad():
                return ref(x)
        ref(x).backward(dy)
        clear(ref)

    def te_fp8(recipe):
        # A module of its own per recipe: a module's scaling state is built for the recipe it
        # runs under, so rows sharing one module rebuilt it at every switch of rows (a cost a
        # training loop, which keeps its recipe, never pays; it made delayed scaling's row
        # ~125 us per step slower on the H200 host).
        mod = te.Linear(a.k, a.n, device=dev, params_dtype=dtype)
        with torch.no_grad():
            mod.weight.copy_(m.weight)
            mod.bias.copy_(m.bias)

        def step():
            with torch.set_grad_enabled(not a.inference), te.autocast(recipe=recipe):
                y = mod(x)
            if not a.inference:
                y.backward(dy)
                clear(mod)

        return step

    def te_graphed(recipe):
        # te.make_graphed_callables: one replay of the forward and of the backward graph per step
        # (on the CPU nothing is captured and this row is the eager step again)
        mod = te.Linear(a.k, a.n, device=dev, params_dtype=dtype)
        g = te.make_graphed_callables(
            mod, (x.detach().clone().requires_grad_(),), enabled=True, recipe=recipe
        )

        def step():
            g(x).backward(dy)
            clear(mod)

        return step

    def te_hp_step():
        if a.inference:
            with torch.no_grad():
                return m(x)
        m(x).backward(dy)
        clear(m)

    w = m.weight.detach()
    xd = x.detach()
    recipes = {
        "delayed": te.recipe.DelayedScaling(),
        "current": te.recipe.Float8CurrentScaling(),
        "block": te.recipe.Float8BlockScaling(),
    }
    what = "fwd (no_grad)" if a.inference else "fwd+bwd"
    rows = [
        (f"torch nn.Linear {what}", torch_step),
        *((f"te.Linear fp8 {name} scaling {what}", te_fp8(r)) for name, r in recipes.items()),
        *(
            (f"te.Linear fp8 {name} + CUDA graphs", te_graphed(recipes[name]))
            for name in (() if a.inference else ("delayed", "current"))
        ),
        (f"te.Linear outside autocast {what}", te_hp_step),
        ("F.linear (forward GEMM only)", lambda: F.linear(xd, w)),
        ("te.functional.gemm (forward GEMM only)", lambda: te.functional.gemm(xd, w)),
    ]
    res = measure(rows, a.rounds, a.steps, sync)
    base = res[rows[0][0]]
    print(
        f"{a.device}, {torch.get_num_threads()} CPU threads, {a.dtype} {a.m}x{a.k} -> {a.n}"
        f"{', inference' if a.inference else ''}{', grads set to None each step' if a.zero_grad else ''}; "
        f"medians over {a.rounds} rounds of {a.steps} steps per row"
    )
    print(f"  {'':45s}" + "".join(f" {k + ' us':>10s} {'x torch':>8s}" for k in FIGURES))
    table = {}
    for name, _ in rows:
        r = res[name]
        ratio = {k: statistics.median(v / b for v, b in zip(r[k], base[k], strict=True)) for k in FIGURES}
        med = {k: statistics.median(r[k]) for k in FIGURES}
        table[name] = {f: v for k in FIGURES for f, v in ((f"{k}_us", med[k]), (f"{k}_x_torch", ratio[k]))}
        print(f"  {name:45s}" + "".join(f" {med[k]:10.1f} {ratio[k]:7.2f}x" for k in FIGURES))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "device": a.device,
                    "dtype": a.dtype,
                    "shape": [a.m, a.k, a.n],
                    "inference": a.inference,
                    "zero_grad": a.zero_grad,
                    "rows": table,
                },
                f,
                indent=2,
            )
    if a.profile:
        step = te_fp8(recipes[a.profile])
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.rounds * a.steps):
            step()
            sync()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
