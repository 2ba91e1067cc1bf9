"""One Linear layer's forward + backward, 16384 tokens, BF16 params: te against torch and torchao.

Shapes 4096 -> 4096 and 4096 -> 16384 (bias on, input requires grad, so fprop, dgrad and wgrad all
run). Rows, measured in the same run:
  torch nn.Linear BF16                      the baseline every ratio divides
  te.Linear BF16 (no autocast)
  te.Linear under te.autocast with DelayedScaling, Float8CurrentScaling, Float8BlockScaling
  te.Linear DelayedScaling / Float8CurrentScaling through te.make_graphed_callables (CUDA graphs
    of the forward and the backward; the input and the output gradient are copied into the
    graph's static buffers each step, as in a training loop)
  torchao float8 tensorwise and rowwise, with torch.compile (where torchao imports)
End to end as a user sees it, CUDA events around the Python calls (host overhead included), two
ways: "synced", one step between the events and waited for (TE's figures in GPU.md were taken
so: every step also pays the host's time to its first kernel), and "back to back", 10 steps
between the events (a training loop's throughput: the host enqueues a step while the GPU runs
the previous one). Rows are timed in --rounds interleaved rounds (benchmarks/_rounds.py: the
H200 runs these at its power cap, so its clocks drift with its recent load; a row's ratio is the
median of its per-round ratios to torch's row of the same round; rows in a seeded shuffle after
the first round); each round runs --warmup steps of a row and timed steps, discarded, for at least
--warmup-ms, then the median of --iters synced steps (one back-to-back group). ms is the median over
rounds. --json PATH writes every figure; --rows NAME times only the te rows whose name contains
NAME, beside torch's (e.g. --rows Block for an A/B of one recipe).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import sys

import te_torch as te
import torch
from _rounds import cuda_event_ms, interleaved, ratio

SHAPES = [(4096, 4096), (4096, 16384)]
# Rows --rows can pick (torch's baseline always runs; torchao's only when --rows is not given).
TE_ROWS = (
    "te.Linear BF16",
    "te DelayedScaling",
    "te Float8CurrentScaling",
    "te Float8BlockScaling",
    "te DelayedScaling + CUDA graphs",
    "te Float8CurrentScaling + CUDA graphs",
)


def fwd_bwd(module, x, dy, recipe=None):
    """One training step of `module`: forward (under te.autocast when a recipe is given),
    backward(dy), then the gradients dropped (set_to_none) as an optimizer loop does, so no row
    pays for accumulating into .grad."""

    def step():
        if recipe is None:  # the peers' rows run no te code at all
            y = module(x)
        else:
            with te.autocast(recipe=recipe):
                y = module(x)
        y.backward(dy)
        module.zero_grad(set_to_none=True)
        x.grad = None

    return step


def graphed_step(module, x, dy, recipe):
    """fwd_bwd through te.make_graphed_callables: a copy of ``module`` captured with a sample
    input of its own, so each step copies ``x`` (and ``dy``) into the graphs' static buffers."""
    m = copy.deepcopy(module)
    g = te.make_graphed_callables(m, (torch.empty_like(x).requires_grad_(),), enabled=True, recipe=recipe)

    def step():
        g(x).backward(dy)
        m.zero_grad(set_to_none=True)
        x.grad = None

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
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--warmup-ms", type=float, default=100.0, help="per row and round, after --warmup")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--tokens", type=int, default=16384, help="e.g. 16383: te pads odd counts (_token_pad)")
    p.add_argument("--json", default=None)
    p.add_argument("--rows", default=None, help="only rows whose name contains this (torch's always runs)")
    a = p.parse_args()
    if a.rows is not None and not any(a.rows in name for name in TE_ROWS):
        p.error(f"--rows: {a.rows!r} is in no row's name; rows: {', '.join(TE_ROWS)}")
    tokens = a.tokens
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
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {tokens} tokens, BF16 params")
    for k, n in SHAPES:
        x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
        ref = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
        mine = te.Linear(k, n, params_dtype=torch.bfloat16, device="cuda")
        with torch.no_grad():
            mine.weight.copy_(ref.weight)
            mine.bias.copy_(ref.bias)

        def wanted(name: str) -> bool:
            return a.rows is None or a.rows in name

        steps = {"torch nn.Linear BF16": fwd_bwd(ref, x, dy)}
        if wanted("te.Linear BF16"):
            steps["te.Linear BF16"] = fwd_bwd(mine, x, dy)
        steps.update({name: fwd_bwd(mine, x, dy, r) for name, r in recipes.items() if wanted(name)})
        for name in ("te DelayedScaling", "te Float8CurrentScaling"):
            if wanted(f"{name} + CUDA graphs"):
                steps[f"{name} + CUDA graphs"] = graphed_step(mine, x, dy, recipes[name])
        if a.rows is None:
            steps.update({name: fwd_bwd(m, x, dy) for name, m in torchao_modules(ref).items()})
        print(f"\nLinear {k} -> {n}, fwd+bwd: synced (one step per pair of events), back to back")
        per, failed = interleaved(steps, cuda_event_ms, a.rounds, a.iters, a.warmup, a.warmup_ms)
        back_to_back = functools.partial(cuda_event_ms, steps=10)
        per_b2b, failed_b2b = interleaved(steps, back_to_back, a.rounds, 1, a.warmup, a.warmup_ms)
        base = next(iter(steps))
        for name in steps:
            row = {"shape": [tokens, k, n], "name": name}
            results.append(row)
            if name in failed or name in failed_b2b or not per[name] or not per_b2b[name]:
                e = failed.get(name) or failed_b2b.get(name)
                row["error"] = f"{type(e).__name__}: {str(e)[:500]}" if e else "no round completed"
                print(f"  {name:34s} FAILED: {row['error'][:200]}")
                continue
            ms, speedup = statistics.median(per[name]), ratio(per, base, name)
            ms_b2b, speedup_b2b = statistics.median(per_b2b[name]), ratio(per_b2b, base, name)
            row.update(ms=ms, ms_rounds=per[name], speedup=speedup)
            row.update(ms_back_to_back=ms_b2b, ms_back_to_back_rounds=per_b2b[name])
            row.update(speedup_back_to_back=speedup_b2b)
            b2b = f"back to back {ms_b2b:8.3f} ms {speedup_b2b:5.2f}x"
            print(f"  {name:34s} {ms:8.3f} ms {speedup:5.2f}x   {b2b}")
        del steps
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
            meta.update(rounds=a.rounds, iters=a.iters, warmup=a.warmup, warmup_ms=a.warmup_ms)
            json.dump({"meta": meta, "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
