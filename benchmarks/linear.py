"""One Linear layer's forward + backward, 16384 tokens, BF16 params: te against torch and torchao.

Shapes 4096 -> 4096 and 4096 -> 16384 (bias on, input requires grad, so fprop, dgrad and wgrad all
run). Rows, measured in the same run:
  torch nn.Linear BF16                      the baseline every ratio divides
  te.Linear BF16 (no autocast)
  te.Linear under te.autocast with DelayedScaling, Float8CurrentScaling, Float8BlockScaling
  torchao float8 tensorwise and rowwise, with torch.compile (where torchao imports)
End to end as a user sees it: CUDA events around the Python calls (host overhead included), after
warm-up, each row in its own block of --iters steps (median), the torch baseline timed first
and last (averaged). --json PATH writes every figure.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys

import te_torch as te
import torch

TOKENS = 16384
SHAPES = [(4096, 4096), (4096, 16384)]


def sequential_ms(steps: dict, iters: int, warmup: int = 10) -> dict:
    """Median ms of each step (a failing step: its exception), each row timed in its own block of
    consecutive steps (timing rows in turn let one row's cache and allocator state slow the next:
    te's delayed-scaling step measured 1.54 ms alone and 1.84 ms interleaved with torchao's
    compiled graphs on the H200). The first row (the torch baseline) is timed again last and the
    two medians averaged, so drift over the run shows and is shared."""
    out = {}
    names = list(steps) + [next(iter(steps))]
    for name in names:
        step = steps[name]
        try:
            for _ in range(warmup):
                step()
            torch.cuda.synchronize()
            times = []
            for _ in range(iters):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                step()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
        except Exception as e:  # noqa: BLE001 - a failing row is reported, the others still run
            out[name] = e
            continue
        ms = statistics.median(times)
        out[name] = (out[name] + ms) / 2 if name in out else ms
    return out


def fwd_bwd(module, x, dy, recipe=None):
    if recipe is None:

        def step():
            module(x).backward(dy)

    else:

        def step():
            with te.autocast(recipe=recipe):
                y = module(x)
            y.backward(dy)

    return step


def torchao_modules(ref: torch.nn.Module) -> dict:
    """torchao float8 (tensorwise, rowwise) conversions of `ref`, compiled; {} with a note when
    torchao is not importable here."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except Exception as e:  # noqa: BLE001 - any import failure means: no torchao rows
        print(f"torchao not available ({type(e).__name__}: {e}); its rows are skipped", file=sys.stderr)
        return {}
    out = {}
    for name in ("tensorwise", "rowwise"):
        m = torch.nn.Sequential(copy.deepcopy(ref))
        convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name(name))
        out[f"torchao float8 {name} + compile"] = torch.compile(m)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/linear.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    recipes = {
        "te DelayedScaling": te.recipe.DelayedScaling(),
        "te Float8CurrentScaling": te.recipe.Float8CurrentScaling(),
        "te Float8BlockScaling": te.recipe.Float8BlockScaling(),
    }
    results = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {TOKENS} tokens, BF16 params")
    for k, n in SHAPES:
        x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(TOKENS, n, device="cuda", dtype=torch.bfloat16)
        ref = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
        mine = te.Linear(k, n, params_dtype=torch.bfloat16, device="cuda")
        with torch.no_grad():
            mine.weight.copy_(ref.weight)
            mine.bias.copy_(ref.bias)
        steps = {"torch nn.Linear BF16": fwd_bwd(ref, x, dy), "te.Linear BF16": fwd_bwd(mine, x, dy)}
        steps.update({name: fwd_bwd(mine, x, dy, r) for name, r in recipes.items()})
        steps.update({name: fwd_bwd(m, x, dy) for name, m in torchao_modules(ref).items()})
        print(f"\nLinear {k} -> {n}, fwd+bwd")
        base = None
        for name, ms in sequential_ms(steps, a.iters).items():
            if isinstance(ms, Exception):
                print(f"  {name:34s} FAILED: {type(ms).__name__}: {str(ms)[:200]}")
                results.append({"shape": [TOKENS, k, n], "name": name, "error": str(ms)[:500]})
                continue
            base = ms if base is None else base
            print(f"  {name:34s} {ms:8.3f} ms   {base / ms:5.2f}x torch BF16")
            results.append({"shape": [TOKENS, k, n], "name": name, "ms": ms, "speedup": base / ms})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
