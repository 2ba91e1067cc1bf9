"""benchmarks/_rounds.py: interleaved rounds give each row the median of its per-round medians,
ratios are medians of per-round ratios, a failing row is reported and left out of later rounds,
and bad counts are refused with a message naming them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _rounds import interleaved, ratio  # noqa: E402


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
    assert order == ["base"] * 3 + ["fast"] * 3 + ["fast"] * 3 + ["base"] * 3  # turned each round
    assert ratio(per, "base", "fast") == 3.0  # median of 2 / 1 and 8 / 2
    assert ratio(per, "base", "missing") is None


def test_every_row_takes_every_place_in_turn():
    """Every row takes every place (te.Linear BF16, torch's own F.linear, read 0.90-0.96x of the
    torch row before it with a fixed order): the order turns by one each round."""
    order = []
    steps = {name: (lambda name=name: order.append(name)) for name in "abc"}
    interleaved(steps, lambda s: (s(), 1.0)[1], rounds=4, iters=1, warmup=0)
    assert order == list("abc") + list("bca") + list("cab") + list("abc")


def test_a_failing_row_is_reported_and_skipped():
    calls = {"bad": 0}

    def bad():
        calls["bad"] += 1
        raise RuntimeError("boom")

    per, failed = interleaved({"ok": lambda: None, "bad": bad}, lambda s: (s(), 1.0)[1], 3, 2, 1)
    assert per["ok"] == [1.0, 1.0, 1.0] and per["bad"] == []
    assert isinstance(failed["bad"], RuntimeError) and calls["bad"] == 1


@pytest.mark.parametrize("rounds, iters, warmup", [(0, 1, 0), (1, 0, 0), (1, 1, -1)])
def test_bad_counts_are_refused(rounds, iters, warmup):
    with pytest.raises(ValueError, match="rounds and iters >= 1, warmup >= 0"):
        interleaved({}, lambda s: 0.0, rounds, iters, warmup)
