"""te demo: a small byte-level GPT built from te modules (LayerNormLinear for QKV, torch's
scaled_dot_product_attention, Linear, LayerNormMLP), trained on this machine's Python standard
library sources with BF16 and with each FP8 recipe (DelayedScaling, Float8CurrentScaling,
Float8BlockScaling). Prints a table (losses, step time, tokens/s, peak memory per recipe) and
writes the loss curves side by side as a PNG, with the curves and the table as JSON.

With a GPU it runs GPU.md's convergence task (12 layers, hidden 768, 500 steps; comparable with
Transformer Engine's figures there) and then a larger model where FP8's speed shows. Without one,
a tiny model on te's CPU reference backend (emulated FP8, about a minute or two).

The convergence task trains every recipe with 3 seeds (--seeds overrides a preset's count): at
this size one seed's FP8-vs-BF16 gap is noise of 0.5-3%, as large as the gaps compared. The table
then shows mean held-out losses ± half their range over the seeds, and each gap is the mean of
the per-seed gaps to BF16's run with the same seed (same init and batches). The PNG draws the
first seed's curves.

    nox -s demo            # or: python examples/gpt/demo.py [--preset cpu-small] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

# OpenMP threads that spin while waiting fight every other process on a shared CPU (measured on a
# loaded 2-core machine: 2.5x slower steps); this model's small CPU ops gain nothing from spinning.
# Set before torch loads its OpenMP runtime; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import te_torch as te  # noqa: E402
import torch  # noqa: E402
from _data import load_corpus  # noqa: E402
from _plot import write_loss_png  # noqa: E402
from _presets import PRESETS, RECIPES, TE_REFERENCE, Preset  # noqa: E402
from _report import checks_against_te, table  # noqa: E402
from _seeds import combine  # noqa: E402
from _train import train  # noqa: E402


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA when torch sees a GPU), cpu or cuda")
    parser.add_argument(
        "--preset",
        action="append",
        choices=sorted(PRESETS),
        help="what to train; repeat for several (default: gpu-convergence then gpu-large on a GPU, "
        "cpu-small on the CPU)",
    )
    parser.add_argument("--steps", type=int, help="training steps, overriding the presets'")
    parser.add_argument(
        "--seeds",
        type=int,
        help="seeds per recipe (the preset's seed and the next ones), overriding the presets' ("
        + ", ".join(f"{n}: {p.seeds}" for n, p in PRESETS.items())
        + ")",
    )
    parser.add_argument(
        "--recipes", default=",".join(RECIPES), help=f"comma-separated subset of {','.join(RECIPES)}"
    )
    parser.add_argument("--out", default="demo_out", help="folder for the PNGs and JSONs (created)")
    args = parser.parse_args(argv)
    args.recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    unknown = [r for r in args.recipes if r not in RECIPES]
    if unknown or not args.recipes:
        parser.error(f"--recipes: expected names from {','.join(RECIPES)}, got {unknown or 'none'}")
    if args.steps is not None and args.steps < 2:
        parser.error(f"--steps: expected an int >= 2, got {args.steps}")
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds: expected an int >= 1, got {args.seeds}")
    return args


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise SystemExit(f"--device: expected auto, cpu or cuda, got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA GPU here")
    return torch.device(name)


def _where(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()} (te's reference backend: FP8 emulated)"


def _describe(p: Preset) -> str:
    m = p.model
    return (
        f"{m.layers} layers, hidden {m.hidden}, {m.heads} heads, FFN {m.ffn}, seq {m.seq}, "
        f"batch {p.batch}, {p.steps} steps"
        + (f", seeds {', '.join(map(str, p.seed_list))}" if p.seeds > 1 else "")
    )


_AVAILABLE = {
    "delayed": te.is_fp8_available,
    "current": te.is_fp8_available,
    "block": te.is_fp8_block_scaling_available,
}


def _unavailable(recipe_name: str) -> str | None:
    """Why the recipe cannot run here (None when it can)."""
    check = _AVAILABLE.get(recipe_name)
    if check is None:
        return None
    ok, reason = check(return_reason=True)
    return None if ok else reason


def run_preset(p: Preset, recipes: list[str], corpus, device: torch.device, out: Path) -> tuple[dict, bool]:
    """Trains ``p`` under each recipe with each of its seeds, prints the table, writes
    gpt_<preset>.json and .png into ``out``; returns (the JSON's content, whether every run went
    without an error)."""
    print(f"\n== {p.name}: {_describe(p)}", flush=True)
    results, ok = [], True
    for name in recipes:
        why = _unavailable(name)
        if why is not None:
            print(f"{name}: skipped, not available here: {why}", flush=True)
            results.append({"recipe": name, "error": f"not available here: {why}", "skipped": True})
            continue
        runs, start = [], time.perf_counter()
        for seed in p.seed_list:
            try:
                r = train(p.with_seed(seed), name, corpus, device)
            except Exception as e:  # one run failing must not cost the others' results
                traceback.print_exc()
                r, ok = {"recipe": name, "error": f"{type(e).__name__}: {e}"}, False
            runs.append({**r, "seed": seed})
        results.append({**combine(runs, p.tokens_per_step), "wall_s": time.perf_counter() - start})
    reference = TE_REFERENCE if p.name == TE_REFERENCE["preset"] else None
    print(table(results, reference), flush=True)
    if device.type == "cpu":
        print(
            "CPU: FP8 runs on te's reference backend (emulated) and torch's bf16 matmuls are slow on "
            "CPUs without bf16 instructions, so these times say nothing about GPU speed.",
            flush=True,
        )
    report = {
        "preset": p.name,
        "config": {**p.__dict__, "model": p.model.__dict__},
        "device": _where(device),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "te_torch": te.__version__,
        },
        "corpus": corpus.describe(),
        "results": results,
    }
    if reference is not None:
        report["te_reference"] = reference
        report["checks"] = checks_against_te(results, reference)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"gpt_{p.name}.json").write_text(json.dumps(report, indent=1, default=str))
    title = f"te GPT demo: {p.name} ({device.type})"
    if p.seeds > 1:
        title += f"; curves: seed {p.seed}, held-out: mean of {p.seeds} seeds"
    drawn = write_loss_png(out / f"gpt_{p.name}.png", title, results)
    print(f"wrote {out / f'gpt_{p.name}.png'} ({drawn}) and {out / f'gpt_{p.name}.json'}", flush=True)
    return report, ok


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    device = _device(args.device)
    names = args.preset or (["gpu-convergence", "gpu-large"] if device.type == "cuda" else ["cpu-small"])
    presets = [PRESETS[n] if args.steps is None else PRESETS[n].with_steps(args.steps) for n in names]
    if args.seeds is not None:
        presets = [replace(p, seeds=args.seeds) for p in presets]
    if device.type == "cpu" and any(n.startswith("gpu") for n in names) and args.steps is None:
        print("note: a gpu-* preset on the CPU backend takes hours; pass --steps to shorten it", flush=True)
    corpus = load_corpus()
    print(f"te {te.__version__}, torch {torch.__version__}, on {_where(device)}")
    print(f"data: {corpus.describe()}", flush=True)
    ok = True
    for p in presets:
        ok &= run_preset(p, args.recipes, corpus, device, Path(args.out))[1]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
