"""Interleaved timing rounds for the benchmarks whose rows run for milliseconds.

The H200's clocks follow its power and temperature: the same GEMM kernel measured 1.467 ms in
one benchmark and 1.572 ms a minute later in another (2026-11-30, NOTES.md). Rows timed one
after another in blocks then see different clocks, and the later rows (te's, after torch's
baseline) pay for the heat of the earlier ones. So each round times every row in turn (a short
warm-up, then the median of a few steps), and a row's ratio to the baseline is the median of
its per-round ratios: both sides of every ratio ran seconds apart, under the same conditions.

A row's time depends on what ran just before it: with a fixed order (through the
thirty-seventh session) te.Linear BF16, which runs torch's own F.linear, read 0.90-0.96x of the
torch row right before it at 4096 -> 4096 in every run, and turning the order by one each round
(the thirty-eighth) moved every row's place but kept every row's predecessor, and the H200 still
read 0.93x. So after the first round each round takes the rows in a seeded shuffle (the same in
every run), and each row warms up for at least ``warmup_ms`` of timed-and-discarded calls as well
as ``warmup`` steps, long enough for the clocks to follow the row's own load rather than the
previous row's (a 4096 -> 4096 step is ~2 ms; 3 steps were not).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable


def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """The rows' order in each round: ``names`` first, then seeded shuffles (the same every run)."""
    rng = random.Random(0)
    orders = [list(names)]
    for _ in range(1, rounds):
        order = list(names)
        rng.shuffle(order)
        orders.append(order)
    return orders


def interleaved(
    steps: dict[str, Callable[[], object]],
    time_one: Callable[[Callable[[], object]], float],
    rounds: int,
    iters: int,
    warmup: int,
    warmup_ms: float = 0.0,
) -> tuple[dict[str, list[float]], dict[str, Exception]]:
    """Per row, the median ms of each round (``time_one(step)`` times one step, in ms), the rows
    taken in round_orders' order; before its timed calls a row runs ``warmup`` untimed steps and
    then timed calls, discarded, until they add up to ``warmup_ms``. A row that raises is dropped
    from later rounds and reported with its exception."""
    if rounds < 1 or iters < 1 or warmup < 0 or warmup_ms < 0:
        raise ValueError(
            f"interleaved: rounds and iters >= 1, warmup and warmup_ms >= 0; got {rounds}, {iters}, "
            f"{warmup}, {warmup_ms}"
        )
    per: dict[str, list[float]] = {name: [] for name in steps}
    failed: dict[str, Exception] = {}
    for order in round_orders(list(steps), rounds):
        for name in order:
            if name in failed:
                continue
            step = steps[name]
            try:
                for _ in range(warmup):
                    step()
                spent = 0.0
                while spent < warmup_ms:
                    ms = time_one(step)
                    if not ms > 0:  # a timer reading nothing could never end the warm-up
                        break
                    spent += ms
                per[name].append(statistics.median(time_one(step) for _ in range(iters)))
            except Exception as e:  # noqa: BLE001 - a failing row is reported, the others still run
                failed[name] = e
    return per, failed


def ratio(per: dict[str, list[float]], base: str, name: str) -> float | None:
    """Median over rounds of base's ms / name's ms (rounds where both ran)."""
    # A row that failed in a later round has fewer entries: its first rounds still pair up.
    pairs = list(zip(per.get(base, []), per.get(name, []), strict=False))
    return statistics.median(b / t for b, t in pairs) if pairs else None


def cuda_event_ms(fn: Callable[[], object], steps: int = 1) -> float:
    """``steps`` calls of fn back to back between two CUDA events on torch's current stream,
    waited for once, in ms per call (host overhead included, as a user sees it). One step: its
    latency, the host's time to its first kernel included; several (functools.partial): a
    training loop's throughput, where the host enqueues a step while the GPU still runs the
    previous one (host time still counts wherever it exceeds the GPU's)."""
    import torch  # here: jax_dense.py uses this module without torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(steps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / steps
