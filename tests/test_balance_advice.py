"""The interval on a predicted speedup, and the rule that keeps a split when its gain is noise."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from ppscope.balance.advise.advice import (
    GIVEN_COSTS,
    Interval,
    advise,
    paired_throughput_ratio,
    speedup_interval,
    stage_block_times,
)
from ppscope.balance.advise.problem import BalanceProblem
from ppscope.balance.advise.rebalance import rebalance
from ppscope.balance.costs import LayerCosts
from ppscope.trace.model import RunMeta, SpanKind, Trace
from ppscope.trace.notices import NoticeCode


def _run(passes: int, stage_ms: tuple[float, float], head_ms: float, jitter: float, seed: int = 0) -> Trace:
    """Two stages of 2 layers each, stage 1 also runs the LM head; every pass's times vary by `jitter` (share)."""
    rng = np.random.default_rng(seed)
    rows, t = [], 0
    for p in range(passes):
        for stage, ms in enumerate(stage_ms):
            dur = int(ms * 1e6 * max(0.2, 1 + jitter * rng.standard_normal()))
            rows.append(
                {
                    "rank": stage,
                    "stage": stage,
                    "kind": SpanKind.FORWARD,
                    "mb": p,
                    "step": 0,
                    "start_ns": t,
                    "end_ns": t + dur,
                }
            )
            t += dur
        dur = int(head_ms * 1e6 * max(0.2, 1 + jitter * rng.standard_normal()))
        rows.append(
            {"rank": 1, "stage": 1, "kind": SpanKind.HEAD, "mb": p, "step": 0, "start_ns": t, "end_ns": t + dur}
        )
        t += dur
    return Trace.from_records(rows, meta=RunMeta(world_size=2, pp_size=2, split=[2, 2]))


def _problem() -> BalanceProblem:
    return BalanceProblem(costs=LayerCosts(layer_ms=(1.0,) * 4, head_ms=2.0), stages=2)


def test_the_interval_holds_the_prediction_and_narrows_with_a_steadier_run() -> None:
    problem = _problem()
    advice = rebalance(problem, [2, 2])
    assert advice.proposed.split == (3, 1) and advice.predicted_speedup == pytest.approx(4 / 3)
    noisy = speedup_interval([_run(200, (2.0, 2.0), 2.0, 0.3)], problem, [2, 2], [3, 1])
    steady = speedup_interval([_run(200, (2.0, 2.0), 2.0, 0.02)], problem, [2, 2], [3, 1])
    assert noisy is not None and steady is not None
    assert 4 / 3 in noisy and 4 / 3 in steady
    assert steady.high - steady.low < noisy.high - noisy.low
    assert noisy.low < 4 / 3 - 0.005 and "block bootstrap: 10 time blocks of 1 run(s)" in noisy.how
    exact = speedup_interval([_run(200, (2.0, 2.0), 2.0, 0.0)], problem, [2, 2], [3, 1])
    assert exact is not None and exact.low == pytest.approx(exact.high)


def test_a_floor_taken_in_every_resample_varies_with_the_stage_times() -> None:
    """A floor under the advised split's beat (here its stages' total ÷ 1.5 cores) binds at both ends of the
    slowest-stage interval: carried through afterwards it is one point; taken in each resample it keeps the
    run's variability, and without variability it is the point again."""
    problem = _problem()

    def floor(now: Sequence[float], new: Sequence[float]) -> float:
        return max(now) / max(max(new), sum(new) / 1.5)

    noisy = speedup_interval([_run(200, (2.0, 2.0), 2.0, 0.3)], problem, [2, 2], [3, 1], bound=floor)
    assert noisy is not None and noisy.low < 4 / (6 / 1.5) - 0.01 and noisy.high > 4 / (6 / 1.5) + 0.01
    assert noisy.high < 4 / 3  # never the slowest stage's gain: the floor holds in every resample
    exact = speedup_interval([_run(200, (2.0, 2.0), 2.0, 0.0)], problem, [2, 2], [3, 1], bound=floor)
    assert exact is not None and exact.low == pytest.approx(exact.high) == pytest.approx(1.0)


def test_a_run_too_short_to_vary_gives_no_interval() -> None:
    assert speedup_interval([_run(8, (2.0, 2.0), 2.0, 0.3)], _problem(), [2, 2], [3, 1]) is None
    assert stage_block_times(_run(8, (2.0, 2.0), 2.0, 0.3), 10) is None


def test_a_run_of_another_pipeline_is_left_out_whatever_its_place() -> None:
    """A run of other stages or layers says nothing about this problem's stages: the interval is the same as
    without it, first or last (the layers' factors are placed by the split of the last run that fits)."""
    problem, run = _problem(), _run(200, (2.0, 2.0), 2.0, 0.3)
    other = Trace.from_records(
        [
            {"rank": 0, "stage": 0, "kind": SpanKind.FORWARD, "mb": p, "step": 0, "start_ns": p, "end_ns": p + 1}
            for p in range(200)
        ],
        meta=RunMeta(world_size=3, pp_size=3, split=[2, 1, 1]),
    )
    alone = speedup_interval([run], problem, [2, 2], [3, 1])
    assert alone is not None
    assert speedup_interval([run, other], problem, [2, 2], [3, 1]) == alone
    assert speedup_interval([other, run], problem, [2, 2], [3, 1]) == alone
    assert speedup_interval([other], problem, [2, 2], [3, 1]) is None


def _tokens(rate_per_ms: float, samples: int = 200, jitter: float = 0.05, seed: int = 0) -> Trace:
    """One token sampled every 1/`rate_per_ms` ms, each gap varying by `jitter` (share)."""
    rng = np.random.default_rng(seed)
    gaps = (1e6 / rate_per_ms * np.maximum(0.2, 1 + jitter * rng.standard_normal(samples))).astype(np.int64)
    ends = np.cumsum(gaps)
    rows = [
        {
            "rank": 0,
            "stage": 0,
            "kind": SpanKind.SAMPLE,
            "mb": i,
            "step": i,
            "start_ns": int(e) - 1000,
            "end_ns": int(e),
            "tokens": 1,
        }
        for i, e in enumerate(ends)
    ]
    return Trace.from_records(rows, meta=RunMeta(world_size=1, pp_size=1, split=[4]))


def test_the_measured_ratio_and_its_interval_are_one_statistic() -> None:
    """Pairs that agree give a narrow interval around their median; a pair that disagrees (the machine's mood
    changed between pairs) widens it, and the median stays inside."""
    agree = [(_tokens(1.0, seed=s), _tokens(1.2, seed=s + 10)) for s in range(3)]
    ratios, interval = paired_throughput_ratio(agree)
    assert len(ratios) == 3 and all(r == pytest.approx(1.2, rel=0.02) for r in ratios)
    assert interval is not None and float(np.median(ratios)) in interval and interval.high - interval.low < 0.08
    moody = [*agree[:2], (_tokens(1.0, seed=7), _tokens(0.8, seed=8))]
    ratios, wide = paired_throughput_ratio(moody)
    assert wide is not None and float(np.median(ratios)) in wide
    assert wide.low < 0.85 and "3 pair(s) drawn with replacement" in wide.how
    assert paired_throughput_ratio([(_tokens(1.0, samples=10), _tokens(1.2))]) == ((), None)


@pytest.mark.parametrize(
    ("current", "proposed", "speedup", "interval", "change", "why"),
    [
        ([2, 2], [2, 2], 1.0, None, False, "already the best"),
        ([2, 2], [3, 1], 1.02, Interval(low=1.01, high=1.03), False, "the predicted gain +2.0% is under 3%"),
        (
            [2, 2],
            [3, 1],
            1.10,
            Interval(low=0.98, high=1.2),
            False,
            "95% interval of the speedup, ×0.980–×1.200, reaches ×1",
        ),
        (
            [2, 2],
            [3, 1],
            1.10,
            Interval(low=1.05, high=1.15),
            True,
            "predicted speedup ×1.100 (95% interval ×1.050–×1.150)",
        ),
        ([2, 2], [3, 1], 1.10, None, True, "(no interval: costs given without a run)"),
    ],
)
def test_the_keep_rule(
    current: list[int], proposed: list[int], speedup: float, interval: Interval | None, change: bool, why: str
) -> None:
    advice = advise(current, proposed, speedup, interval, GIVEN_COSTS)
    assert advice.change is change and why in advice.reason
    assert advice.word == ("change" if change else "keep")
    expected = None if interval is not None else NoticeCode.SAME_SPLIT if current == proposed else GIVEN_COSTS.code
    assert (advice.no_interval and advice.no_interval.code) == expected
