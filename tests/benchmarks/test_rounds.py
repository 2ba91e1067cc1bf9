"""benchmarks/_rounds.py: interleaved rounds give each row the median of its per-round medians,
ratios are medians of per-round ratios, the rows' order changes from round to round (and with it
each row's predecessor), warm-up runs for a time as well as a step count, a failing row is
reported and left out of later rounds, and bad counts are refused with a message naming them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _rounds import interleaved, ratio, round_orders  # noqa: E402


def scripted(times: dict[str, list[float]]):
    """Steps whose timed calls return the scripted ms in turn (warm-up calls are not timed)."""
    order = []

    def step_of(name):
        return lambda: order.append(name)

    feed = {name: iter(ts) for name, ts in times.items()}

    def time_one(step):
        step()
        return next(feed[order[-1]])

    return {name: step_of(name) for name in times}, time_one, order


def test_rows_alternate_and_ratios_are_per_round():
    steps, time_one, order = scripted({"base": [2, 3, 2, 8, 8, 8], "fast": [1, 1, 1, 2, 2, 2]})
    per, failed = interleaved(steps, time_one, rounds=2, iters=3, warmup=0)
    assert failed == {} and per == {"base": [2, 8], "fast": [1, 2]}
    second = round_orders(["base", "fast"], 2)[1]
    assert order == ["base"] * 3 + ["fast"] * 3 + [second[0]] * 3 + [second[1]] * 3
    assert ratio(per, "base", "fast") == 3.0  # median of 2 / 1 and 8 / 2
    assert ratio(per, "base", "missing") is None


def test_rows_follow_different_rows_from_round_to_round():
    """te.Linear BF16 (torch's own F.linear) read 0.90-0.96x of the torch row it always followed,
    and turning the order by one each round kept that predecessor: the rounds after the first
    are seeded shuffles, the same in every run, in which each row follows several others."""
    names = [f"row{i}" for i in range(9)]
    orders = round_orders(names, 7)
    assert orders[0] == names and orders == round_orders(names, 7)
    assert all(sorted(o) == sorted(names) for o in orders)
    for name in names[1:]:
        before = {o[o.index(name) - 1] for o in orders if o.index(name) > 0}
        assert len(before) >= 3, (name, before)
    order = []
    steps = {name: (lambda name=name: order.append(name)) for name in names}
    interleaved(steps, lambda s: (s(), 1.0)[1], rounds=7, iters=1, warmup=0)
    assert order == [n for o in orders for n in o]


def test_warm_up_runs_for_its_time_as_well_as_its_steps():
    calls = []
    timed = iter([30.0, 30.0, 30.0, 30.0, 5.0, 7.0, 6.0])

    def time_one(step):
        step()
        return next(timed)

    per, _ = interleaved(
        {"a": lambda: calls.append(1)}, time_one, rounds=1, iters=3, warmup=2, warmup_ms=100.0
    )
    assert len(calls) == 2 + 4 + 3  # 2 untimed steps, 4 timed ones to pass 100 ms, then 3 measured
    assert per["a"] == [6.0]


def test_a_timer_reading_zero_ends_the_warm_up():
    per, _ = interleaved({"a": lambda: None}, lambda s: 0.0, rounds=1, iters=2, warmup=0, warmup_ms=50.0)
    assert per["a"] == [0.0]


def test_a_failing_row_is_reported_and_skipped():
    calls = {"bad": 0}

    def bad():
        calls["bad"] += 1
        raise RuntimeError("boom")

    per, failed = interleaved({"ok": lambda: None, "bad": bad}, lambda s: (s(), 1.0)[1], 3, 2, 1)
    assert per["ok"] == [1.0, 1.0, 1.0] and per["bad"] == []
    assert isinstance(failed["bad"], RuntimeError) and calls["bad"] == 1


@pytest.mark.parametrize(
    "rounds, iters, warmup, warmup_ms", [(0, 1, 0, 0), (1, 0, 0, 0), (1, 1, -1, 0), (1, 1, 0, -1)]
)
def test_bad_counts_are_refused(rounds, iters, warmup, warmup_ms):
    with pytest.raises(ValueError, match="rounds and iters >= 1, warmup and warmup_ms >= 0"):
        interleaved({}, lambda s: 0.0, rounds, iters, warmup, warmup_ms)
