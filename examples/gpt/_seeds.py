"""One recipe's runs over several seeds combined into its row of the demo's table.

One seed's held-out loss moves by about as much as the FP8-vs-BF16 gaps being compared (see
_presets), so the row reports the mean over seeds and their spread. A seed that diverged or failed
makes the means NaN rather than leaving it out, which would quietly compare means over different
seeds; ``per_seed`` says which seed it was.
"""

from __future__ import annotations

import math
import statistics


def _entry(r: dict) -> dict:
    """What ``per_seed`` keeps of one seed's run."""
    if "error" in r:
        return {"seed": r["seed"], "error": r["error"]}
    keys = ("seed", "held_out_loss", "final_loss", "ms_per_step", "diverged_at")
    return {k: r[k] for k in keys}


def combine(runs: list[dict], tokens_per_step: int) -> dict:
    """The row of one recipe from ``runs``, its results one per seed in seed order (train's dicts
    with "seed" added; a failed run is {"recipe", "seed", "error"}).

    The row is the first seed's full result (its loss curve is the one the PNG draws; when that
    seed failed, the first seed's that did not) with ``held_out_loss`` and ``final_loss`` the
    means over seeds and ``held_out_spread`` [min, max] (NaN and None when a seed failed or
    diverged), ``ms_per_step`` the median over the seeds that timed any steps
    (``tokens_per_s`` from it), ``peak_mib`` the max and ``per_seed`` a list of {seed,
    held_out_loss, final_loss, ms_per_step, diverged_at}, or {seed, error} for a failed seed.
    When every seed failed: the first failure, its error naming each seed's, with ``per_seed``.
    With one seed the row keeps that seed's values (a diverged seed's losses: NaN), plus
    ``per_seed`` and ``held_out_spread``."""
    if not runs:
        raise ValueError("combine: runs: expected at least one seed's result, got none")
    per_seed = [_entry(r) for r in runs]
    ran = [r for r in runs if "error" not in r]
    if not ran:
        errors = [f"seed {r['seed']}: {r['error']}" for r in runs] if len(runs) > 1 else [runs[0]["error"]]
        return {**runs[0], "error": "; ".join(errors), "per_seed": per_seed}
    held = [r["held_out_loss"] for r in ran]
    sound = len(ran) == len(runs) and all(r["diverged_at"] is None for r in ran)
    timed = [r["ms_per_step"] for r in ran if math.isfinite(r["ms_per_step"])]
    ms = statistics.median(timed) if timed else math.nan
    return {
        **ran[0],
        "held_out_loss": statistics.fmean(held) if sound else math.nan,
        "held_out_spread": [min(held), max(held)] if sound and all(map(math.isfinite, held)) else None,
        "final_loss": statistics.fmean(r["final_loss"] for r in ran) if sound else math.nan,
        "ms_per_step": ms,
        "tokens_per_s": tokens_per_step / ms * 1e3,
        "peak_mib": max(r["peak_mib"] for r in ran),
        "per_seed": per_seed,
    }
