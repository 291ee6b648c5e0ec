"""The tuning loop's measurement: pairs of runs in ABBA order until the interval decides, or the time runs out;
one verdict in what it prints and returns."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from ppscope.balance.advise.advice import Advice, Interval
from ppscope.balance.advise.problem import BalanceProblem
from ppscope.balance.advise.rebalance import rebalance
from ppscope.balance.costs import LayerCosts
from ppscope.cli.tuning_report import print_tune
from ppscope.engine import tuning
from ppscope.engine.tuning import MIN_PAIRS, RunSummary, TuneResult


def _summary(split: tuple[int, ...], tok_s: float = 100.0) -> RunSummary:
    return RunSummary(
        run_dir=Path("runs") / ",".join(map(str, split)),
        split=split,
        throughput_tokens_per_s=tok_s,
        bubble_ratio=0.1,
        bottleneck_stage=0,
        time_per_mb_ns=(1_000_000,) * len(split),
    )


def _measure(monkeypatch: pytest.MonkeyPatch, half_widths: list[float], **kw: object) -> tuple[tuning.Measured, list]:
    """`_measure` with runs that only note their split, and an interval of the given half-width after each
    pair."""
    given, advised = (4, 4), (5, 3)
    traces: dict[tuple[int, ...], list] = {given: ["run 1"], advised: []}
    ran: list[tuple[int, tuple[int, ...]]] = []

    def run_split(n: int, split: tuple[int, ...]) -> RunSummary:
        ran.append((n, split))
        traces[split].append(f"run {n}")
        return _summary(split)

    def ratio(pairs: list) -> tuple[tuple[float, ...], Interval]:
        half = half_widths[min(len(pairs), len(half_widths)) - 1]
        return (1.1,) * len(pairs), Interval(low=1.1 - half, high=1.1 + half)

    monkeypatch.setattr(tuning, "paired_throughput_ratio", ratio)
    settings: dict = {"repeats": 5, "gain": 0.1, "decide_within_s": 1e6, "step": lambda _m: None, **kw}
    return tuning._measure(run_split, traces, given, advised, **settings), ran


def test_pairs_go_on_until_the_interval_is_under_half_the_predicted_gain(monkeypatch: pytest.MonkeyPatch) -> None:
    got, ran = _measure(monkeypatch, [0.2, 0.08, 0.04, 0.01])
    # after 2 pairs ±0.08 is over half the gain (0.05); after 3, ±0.04 decides
    assert got.decided is True and len(got.pairs) == 3 and "decided after 3 pairs" in got.verdict
    assert [s for _n, s in ran] == [(5, 3), (5, 3), (4, 4), (4, 4), (5, 3)]  # ABBA: 1-2, 3-4 advised first, 5-6
    assert [n for n, _s in ran] == [2, 3, 4, 5, 6]


def test_one_pair_never_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    got, _ran = _measure(monkeypatch, [0.001])
    assert got.decided and len(got.pairs) == MIN_PAIRS


def test_a_measurement_that_cannot_decide_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    got, ran = _measure(monkeypatch, [0.2], repeats=3)
    assert got.decided is False and len(ran) == 5 and got.verdict.startswith("could not decide: after 3 pairs")
    timed_out, ran = _measure(monkeypatch, [0.2], decide_within_s=0.0)
    assert timed_out.decided is False and len(ran) == 1  # no time for a second pair


def test_a_fixed_number_of_pairs_runs_them_all(monkeypatch: pytest.MonkeyPatch) -> None:
    got, ran = _measure(monkeypatch, [0.001], repeats=3, decide_within_s=None)
    assert got.decided is None and got.verdict == "" and len(ran) == 5


def _result(change: bool, after: RunSummary | None) -> TuneResult:
    costs = LayerCosts(layer_ms=(0.5,) * 8, embed_ms=0.0, head_ms=1.0, sample_ms=0.0)
    advice = rebalance(BalanceProblem(costs=costs, stages=2), current=(4, 4))
    return TuneResult(
        before=_summary((4, 4), 272.5),
        after=after,
        advice=advice,
        costs=costs,
        cost_source="insitu",
        decision=Advice(change=change, reason="the reason"),
        emulated="emulated llama3-8b on h100-sxm (roofline), ×27 slower",
    )


def _printed(result: TuneResult) -> str:
    console = Console(width=80, record=True)
    print_tune(result, console)
    return console.export_text()


def test_keep_runs_nothing_more_and_prints_no_lines_to_paste() -> None:
    kept = _result(change=False, after=None)
    data = kept.to_dict()
    assert data["after"] is None and data["vllm_env"] is None and data["measured_speedup"] is None
    text = _printed(kept)
    assert "advice: KEEP 4,4" in text and "CHANGE" not in text and "VLLM_PP_LAYER_PARTITION" not in text
    assert "advised (not run)" in text and "run 2" not in text and "measured speedup" not in text


def test_change_prints_the_runs_and_the_lines_to_paste_on_80_columns() -> None:
    changed = _result(change=True, after=_summary((5, 3), 312.8))
    text = _printed(changed)
    assert "advice: CHANGE to 5,3" in text and "VLLM_PP_LAYER_PARTITION=5,3" in text and "KEEP" not in text
    assert text.startswith("engine: emulated llama3-8b on h100-sxm (roofline), ×27 slower")
    table = text[text.index("Run 1 and the advised split") : text.index("predicted speedup")]
    assert max(len(line) for line in table.splitlines()) <= 80 and "run 2 (advised)" in table
    lines = changed.to_dict()
    assert lines["vllm_env"] == "VLLM_PP_LAYER_PARTITION=5,3" and lines["ppscope_run"] == "ppscope run --split 5,3"
    assert "megatron_args" not in lines and "torchtitan_toml" not in lines  # a serving job: no Megatron, no torchtitan
    assert "Megatron" not in text and "module_fqns_per_model_part" not in text
