"""Clock offsets: the NTP-style estimate, and a real two-rank run with one rank's clock skewed on purpose."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from ppscope.trace.clock import causality_violations, estimate_offset
from ppscope.trace.model import Metric, SpanKind, Trace


def test_estimate_keeps_the_fastest_round_trip() -> None:
    # true offset 1000: rank clock = reference + 1000; one slow exchange, one fast
    samples = [(10_000, 9_500, 12_000), (20_000, 19_040, 20_100)]
    info = estimate_offset(samples)
    assert info.method == "ping-pong"
    assert info.uncertainty_ns == 50
    assert abs(info.offset_ns - 1000) <= info.uncertainty_ns
    assert info.offset_ns == (20_000 + 20_100) // 2 - 19_040
    with pytest.raises(ValueError, match="at least one"):
        estimate_offset([])


def test_causality_violations_match_sends_to_receives_in_order() -> None:
    rows = [
        {"rank": 0, "kind": SpanKind.SEND, "peer": 1, "mb": 0, "step": 0, "start_ns": 100, "end_ns": 110},
        {"rank": 0, "kind": SpanKind.SEND, "peer": 1, "mb": 1, "step": 0, "start_ns": 200, "end_ns": 210},
        {"rank": 1, "kind": SpanKind.RECV_WAIT, "peer": 0, "mb": 0, "step": 0, "start_ns": 90, "end_ns": 120},
        {"rank": 1, "kind": SpanKind.RECV, "peer": 0, "mb": 1, "step": 0, "start_ns": 150, "end_ns": 190},  # too early
        {"rank": 0, "kind": SpanKind.RECV, "peer": 1, "mb": 1, "step": 0, "start_ns": 0, "end_ns": 10},  # no send
    ]
    bad = causality_violations(Trace.from_records(rows).spans)
    assert bad[["src", "dst", "mb", "kind"]].values.tolist() == [[0, 1, 1, "recv"]]
    assert causality_violations(Trace.from_records(rows).spans, slack_ns=20).empty


@pytest.mark.slow
def test_injected_skew_is_recovered_and_undone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ppscope.engine.config import EngineConfig
    from ppscope.engine.launch import run
    from ppscope.engine.worker import SKEW_ENV
    from ppscope.trace.store import load_run

    skew_ns = 3_000_000_000
    monkeypatch.setenv(SKEW_ENV, f"1={skew_ns}")
    cfg = EngineConfig(
        stages=2, schedule="gpipe", model="synthetic", layers=2, layer_cost_ms="10", requests=4, prompt_len=4,
        max_new_tokens=8, progress=False, out=str(tmp_path / "run"),
    )  # fmt: skip
    trace = load_run(run(cfg))
    clock = trace.meta.ranks[1].clock
    assert clock.method == "ping-pong"
    assert abs(clock.offset_ns - skew_ns) <= clock.uncertainty_ns
    assert trace.meta.ranks[0].clock.offset_ns == 0
    spans = trace.spans
    r0, r1 = spans[spans["rank"] == 0], spans[spans["rank"] == 1]
    # back on the common clock, rank 1 works inside rank 0's window (give or take a message), not 3 s later
    slack_ns = 1_000_000_000  # a busy machine can stall a rank for a while; the skew is 3 s
    assert r0["start_ns"].min() - slack_ns <= r1["start_ns"].min()
    assert r1["end_ns"].max() <= r0["end_ns"].max() + slack_ns
    assert causality_violations(spans, slack_ns=clock.uncertainty_ns).empty
    raw = spans.copy()  # on the rank's own clock, rank 0 would get tokens 3 s before rank 1 sent them
    raw.loc[raw["rank"] == 1, ["start_ns", "end_ns"]] += clock.offset_ns
    assert not causality_violations(raw).empty
    # no GPU here: each rank's CPU use, on the host device, labelled as such
    cpu = trace.counters[trace.counters["metric"] == Metric.CPU_UTIL_PCT]
    assert set(cpu["rank"]) == {0, 1} and set(cpu["device"]) == {-1}
    assert pd.Series(cpu["value"]).between(0, 400).all()
