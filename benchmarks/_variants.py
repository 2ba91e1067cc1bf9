"""One table of rows against the ``"torch"`` row, for the module benchmarks (mlp.py,
transformer_layer.py): each row timed synced and back to back in interleaved rounds
(_rounds.py), printed as it is known, and returned as dicts for --json (write_json)."""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
from collections.abc import Callable

from _rounds import cuda_event_ms, interleaved, ratio


def time_variants(
    variants: list[tuple[str, Callable[[], Callable[[], object]]]],
    info: dict,
    flops: float,
    args,
    label: str,
) -> list[dict]:
    """``variants``: (name, build) pairs, build() making the row's step (a failing build is
    reported as the row's error); ``info``: fields every row's dict gets; ``flops`` per step, for
    TFLOP/s; ``args``: rounds, iters, warmup, warmup_ms; ``label`` starts each printed line."""
    steps, rows = {}, {}
    for name, build in variants:
        rows[name] = {**info, "variant": name}
        try:
            steps[name] = build()
        except Exception as e:  # noqa: BLE001 - report and go on to the next variant
            rows[name]["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    per, failed = interleaved(steps, cuda_event_ms, args.rounds, args.iters, args.warmup, args.warmup_ms)
    back_to_back = functools.partial(cuda_event_ms, steps=5)
    per_b2b, failed_b2b = interleaved(steps, back_to_back, args.rounds, 1, args.warmup, args.warmup_ms)
    for name, e in {**failed_b2b, **failed}.items():
        rows[name]["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    for name, row in rows.items():
        if "error" in row or not per.get(name):
            print(f"{label} {name:14s} failed: {row.get('error', 'no round completed')}", flush=True)
            continue
        ms = statistics.median(per[name])
        row.update(ms=ms, ms_rounds=per[name], tflops=flops / ms / 1e9)
        speedup = ratio(per, "torch", name)
        if speedup is not None:
            row["speedup_vs_torch"] = speedup
        shown = f"{speedup:7.2f}x" if speedup is not None else "     n/a"
        ms_b2b, speedup_b2b = statistics.median(per_b2b[name]), ratio(per_b2b, "torch", name)
        row.update(ms_back_to_back=ms_b2b, ms_back_to_back_rounds=per_b2b[name])
        if speedup_b2b is not None:
            row["speedup_back_to_back"] = speedup_b2b
        shown_b2b = f"{speedup_b2b:7.2f}x" if speedup_b2b is not None else "     n/a"
        print(
            f"{label} {name:14s} {ms:9.3f} {flops / ms / 1e9:8.1f} {shown} {ms_b2b:9.3f} {shown_b2b}",
            flush=True,
        )
    return list(rows.values())


def commit() -> str | None:
    """The checkout's HEAD, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def write_json(path: str, args, results: list[dict], **meta) -> None:
    """{"meta": the GPU, torch, commit, the timing arguments and ``meta``; "results": the rows}."""
    import torch  # here: the table above needs no torch of its own

    head = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "commit": commit(),
        "iters": args.iters,
        "warmup": args.warmup,
        "warmup_ms": args.warmup_ms,
        "rounds": args.rounds,
        **meta,
    }
    with open(path, "w") as fh:
        json.dump({"meta": head, "results": results}, fh, indent=1)
