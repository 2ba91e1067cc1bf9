"""A mixture-of-experts layer's expert GEMMs, forward + backward: te.GroupedLinear against torch.

8 experts, hidden 4096 -> 14336 (Mixtral's FC1 width, no bias), 16384 tokens routed top-2, so
32768 rows split unevenly over the experts (a seeded draw, each count a multiple of 128 so every
row below runs without padding). BF16 params and activations, input requires grad (fprop, dgrad
and wgrad all run). Rows, measured in the same run:
  torch BF16, one F.linear per expert     the baseline every ratio divides (torch.split, the
                                          per-expert products, torch.cat: what a plain PyTorch
                                          MoE layer runs)
  torch._grouped_mm BF16                  torch's grouped GEMM (where this torch has it)
  te.GroupedLinear BF16 (no autocast)
  te.GroupedLinear under te.autocast with DelayedScaling, Float8CurrentScaling, Float8BlockScaling
Timed as benchmarks/linear.py times its rows (_rounds.py: interleaved rounds, shuffled after the
first, each row warmed up for --warmup-ms; synced = one step between two CUDA events, back to
back = 10). --json PATH writes every figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys

import te_torch as te
import torch
import torch.nn.functional as F
from _rounds import cuda_event_ms, interleaved, ratio

EXPERTS, HIDDEN, FFN, TOKENS, TOP_K, ALIGN = 8, 4096, 14336, 16384, 2, 128


def expert_splits(rows: int, experts: int, align: int) -> list[int]:
    """A seeded, uneven split of ``rows`` over ``experts``, each a multiple of ``align``."""
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(experts, generator=g) + 0.5
    units = rows // align
    counts = (weights / weights.sum() * units).floor().long()
    counts[0] += units - int(counts.sum())
    return [int(c) * align for c in counts]


def step_of(forward, params, x, dy):
    """One training step: forward, backward(dy), then the gradients dropped as an optimizer
    loop's zero_grad(set_to_none=True) does."""

    def step():
        forward(x).backward(dy)
        for p in params:
            p.grad = None
        x.grad = None

    return step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--warmup-ms", type=float, default=100.0, help="per row and round, after --warmup")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/grouped_linear.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    rows = TOKENS * TOP_K
    splits = expert_splits(rows, EXPERTS, ALIGN)
    mine = te.GroupedLinear(EXPERTS, HIDDEN, FFN, bias=False, params_dtype=torch.bfloat16, device="cuda")
    weights = [getattr(mine, f"weight{i}") for i in range(EXPERTS)]
    ref = [torch.nn.Parameter(w.detach().clone()) for w in weights]
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(rows, FFN, device="cuda", dtype=torch.bfloat16)

    def torch_loop(inp):
        return torch.cat([F.linear(c, w) for c, w in zip(torch.split(inp, splits), ref, strict=True)])

    stacked = torch.nn.Parameter(torch.stack([w.detach() for w in ref]))  # [experts, FFN, HIDDEN]
    offs = torch.tensor(splits, device="cuda").cumsum(0).to(torch.int32)

    def torch_grouped(inp):
        return torch._grouped_mm(inp, stacked.transpose(1, 2), offs=offs)

    def te_step(r):
        def fwd(inp):
            with te.autocast(enabled=r is not None, recipe=r):
                return mine(inp, splits)

        return step_of(fwd, weights, x, dy)

    steps = {"torch BF16, F.linear per expert": step_of(torch_loop, ref, x, dy)}
    if hasattr(torch, "_grouped_mm"):
        steps["torch._grouped_mm BF16"] = step_of(torch_grouped, [stacked], x, dy)
    steps["te.GroupedLinear BF16"] = te_step(None)
    steps["te DelayedScaling"] = te_step(te.recipe.DelayedScaling())
    steps["te Float8CurrentScaling"] = te_step(te.recipe.Float8CurrentScaling())
    steps["te Float8BlockScaling"] = te_step(te.recipe.Float8BlockScaling())
    gflop = 3 * 2 * rows * HIDDEN * FFN / 1e9
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{EXPERTS} experts {HIDDEN} -> {FFN}, {rows} rows (top-{TOP_K} of {TOKENS} tokens) split {splits}")
    print("fwd+bwd: synced (one step per pair of events), back to back (10 steps)")
    per, failed = interleaved(steps, cuda_event_ms, a.rounds, a.iters, a.warmup, a.warmup_ms)
    per_b2b, failed_b2b = interleaved(
        steps, functools.partial(cuda_event_ms, steps=10), a.rounds, 1, a.warmup, a.warmup_ms
    )
    base = next(iter(steps))
    results = []
    for name in steps:
        row = {"name": name}
        results.append(row)
        if name in failed or name in failed_b2b or not per[name] or not per_b2b[name]:
            e = failed.get(name) or failed_b2b.get(name)
            row["error"] = f"{type(e).__name__}: {str(e)[:500]}" if e else "no round completed"
            print(f"  {name:34s} FAILED: {row['error'][:200]}")
            continue
        ms, ms_b2b = statistics.median(per[name]), statistics.median(per_b2b[name])
        row.update(ms=ms, ms_rounds=per[name], speedup=ratio(per, base, name))
        row.update(ms_back_to_back=ms_b2b, ms_back_to_back_rounds=per_b2b[name])
        row.update(speedup_back_to_back=ratio(per_b2b, base, name), tflops=gflop / ms)
        print(
            f"  {name:34s} {ms:8.3f} ms {row['speedup']:5.2f}x {gflop / ms:7.1f} TFLOP/s   "
            f"back to back {ms_b2b:8.3f} ms {row['speedup_back_to_back']:5.2f}x"
        )
    if a.json:
        with open(a.json, "w") as f:
            meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "splits": splits}
            meta.update(rounds=a.rounds, iters=a.iters, warmup=a.warmup, warmup_ms=a.warmup_ms)
            json.dump({"meta": meta, "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
