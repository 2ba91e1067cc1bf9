"""The demo's table and its comparison with Transformer Engine's figures (GPU.md).

Gaps are relative to the BF16 run of the same preset: held-out loss gap in percent
(100 * (loss - bf16) / bf16) and speed as BF16's step time over the recipe's. With several seeds
(rows from _seeds.combine) the gap is the mean of the per-seed gaps, each against BF16's run of
the same seed: same init and batches, so the pairing cancels much of what the seed alone moves."""

from __future__ import annotations

import math


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _baseline(results: list[dict]) -> dict | None:
    return next((r for r in results if r["recipe"] == "bf16" and "error" not in r), None)


def _runs(r: dict) -> list[dict]:
    """``r``'s per-seed results; a row without ``per_seed`` is one run."""
    return r.get("per_seed") or [r]


def seed_gaps(r: dict, base: dict | None) -> list[float | None]:
    """Per seed of ``r``: its held-out loss above ``base``'s of the same seed, in percent (None
    where either is missing)."""
    base_held = {} if base is None else {b.get("seed"): b.get("held_out_loss") for b in _runs(base)}
    gaps = []
    for run in _runs(r):
        held, ref = run.get("held_out_loss"), base_held.get(run.get("seed"))
        gaps.append(100.0 * (held - ref) / ref if _finite(held) and _finite(ref) else None)
    return gaps


def gap_pct(r: dict, base: dict | None) -> float | None:
    """Mean over seeds of ``r``'s held-out gap to ``base`` in percent (None when a seed's is missing)."""
    gaps = seed_gaps(r, base)
    return None if None in gaps else sum(gaps) / len(gaps)


def speedup(r: dict, base: dict | None) -> float | None:
    """BF16's step time over ``r``'s (None when either is missing)."""
    if base is None or not (_finite(r.get("ms_per_step")) and _finite(base.get("ms_per_step"))):
        return None
    return base["ms_per_step"] / r["ms_per_step"]


def _fmt(v, spec: str, missing: str = "-") -> str:
    return format(v, spec) if _finite(v) else missing


def _pct(g: float | None) -> str:
    return "-" if g is None else f"{g:+.2f}%"


def _held_out(r: dict) -> str:
    """The held-out mean, with several seeds ± half their range."""
    spread = r.get("held_out_spread")
    if len(_runs(r)) > 1 and spread is not None and _finite(r["held_out_loss"]):
        return f"{r['held_out_loss']:.4f}±{(spread[1] - spread[0]) / 2:.4f}"
    return _fmt(r["held_out_loss"], ".4f")


def _troubles(r: dict) -> str:
    """Which of ``r``'s seeds failed or diverged (named by seed when there are several)."""
    runs = _runs(r)
    notes = []
    for run in runs:
        seed = f"seed {run['seed']}: " if len(runs) > 1 else ""
        if "error" in run:
            notes.append(f"{seed}failed: {run['error']}")
        elif run.get("diverged_at") is not None:
            notes.append(f"{seed}loss not finite at step {run['diverged_at']}")
    return f"  ({'; '.join(notes)})" if notes else ""


def table(results: list[dict], reference: dict | None = None) -> str:
    """One row per recipe; with ``reference`` (TE_REFERENCE) TE's gap and step time beside ours.
    With several seeds, losses are means over them and the held-out one carries ± half its range."""
    base = _baseline(results)
    rows = [r for r in results if "error" not in r]
    held_w = max([9] + [len(_held_out(r)) for r in rows])
    head = f"{'recipe':8} {'train loss':>10} {'held-out':>{held_w}} {'vs bf16':>8} {'ms/step':>9} "
    head += f"{'tokens/s':>10} {'speedup':>8} {'peak MiB':>9}"
    if reference is not None:
        head += f" {'TE gap':>8} {'TE ms':>6}"
    lines = [head, "-" * len(head)]
    for r in results:
        name = r["recipe"]
        if "error" in r:
            lines.append(f"{name:8} {'skipped' if r.get('skipped') else 'failed'}: {r['error']}")
            continue
        g, s = gap_pct(r, base), speedup(r, base)
        row = (
            f"{name:8} {_fmt(r['final_loss'], '.4f'):>10} {_held_out(r):>{held_w}} "
            f"{_pct(g) if r is not base else '-':>8} {_fmt(r['ms_per_step'], '.1f'):>9} "
            f"{_fmt(r['tokens_per_s'], ',.0f'):>10} {_fmt(s, '.2f') + 'x' if s is not None else '-':>8} "
            f"{_fmt(r['peak_mib'], ',.0f'):>9}"
        )
        if reference is not None and name in reference["recipes"]:
            te_gap, te_ms = reference["recipes"][name]
            row += f" {te_gap:+7.2f}% {te_ms:6.0f}"
        lines.append(row + _troubles(r))
    kinds = {r["memory_kind"] for r in results if "memory_kind" in r}
    lines.append(
        "train loss: mean of the last tenth of the steps; held-out: the last 2% of the corpus; "
        "peak: " + ", ".join(sorted(kinds))
    )
    seeds = max(([run.get("seed") for run in _runs(r)] for r in rows), key=len, default=[])
    if len(seeds) > 1:
        lines.append(
            f"seeds {', '.join(map(str, seeds))} per recipe: losses are means over the seeds, held-out "
            "± half its range; ms/step: median; peak: max"
        )
        lines.append("vs bf16: the mean of the per-seed gaps, each to bf16's run with the same seed")
    if reference is not None:
        lines.append(f"TE: {reference['source']} (BF16 held-out {reference['bf16_held_out']})")
        for name, c in checks_against_te(results, reference)["recipes"].items():
            line = (
                f"  {name}: gap {_pct(c['gap_pct'])} vs TE's {c['te_gap_pct']:+.2f}% -> "
                f"{'within' if c['gap_at_most_te'] else 'WORSE than'} TE's; "
                f"{_fmt(c['speedup'], '.2f')}x BF16's speed (TE: {c['te_speedup']:.2f}x)"
            )
            if len(c["gap_pct_per_seed"]) > 1:
                line += "; gap per seed: " + ", ".join(
                    f"{_pct(g)} ({seed})" for seed, g in zip(c["seeds"], c["gap_pct_per_seed"], strict=True)
                )
            lines.append(line)
    return "\n".join(lines)


def checks_against_te(results: list[dict], reference: dict) -> dict:
    """Per FP8 recipe: our held-out gap vs BF16 (the mean of the per-seed gaps, which are listed
    too) against TE's, and whether it beats BF16's step time (TE's FP8 did not at this size); plus
    our BF16 held-out loss and step time vs TE's."""
    base = _baseline(results)
    te_bf16_ms = reference["recipes"]["bf16"][1]
    out = {
        "bf16_held_out": None if base is None else base.get("held_out_loss"),
        "te_bf16_held_out": reference["bf16_held_out"],
        "bf16_ms_per_step": None if base is None else base.get("ms_per_step"),
        "te_bf16_ms_per_step": te_bf16_ms,
        "recipes": {},
    }
    for r in results:
        name = r["recipe"]
        if name == "bf16" or name not in reference["recipes"] or "error" in r:
            continue
        te_gap, te_ms = reference["recipes"][name]
        g, s = gap_pct(r, base), speedup(r, base)
        out["recipes"][name] = {
            "gap_pct": g,
            "gap_pct_per_seed": seed_gaps(r, base),
            "seeds": [run.get("seed") for run in _runs(r)],
            "te_gap_pct": te_gap,
            "gap_at_most_te": g is not None and g <= te_gap,
            "speedup": s,
            "te_speedup": te_bf16_ms / te_ms,
            "faster_than_bf16": s is not None and s > 1.0,
        }
    return out
