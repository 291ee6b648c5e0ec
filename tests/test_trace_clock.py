"""Clock offsets: the NTP-style estimate, and a real two-rank run with one rank's clock skewed on purpose."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppscope.trace.clock import causality_violations, estimate_offset, offsets_at, with_drift
from ppscope.trace.model import ClockInfo, Metric, RankInfo, RunMeta, SpanKind, Trace
from ppscope.trace.notices import NoticeCode


def test_estimate_keeps_the_fastest_round_trip() -> None:
    # true offset 1000: rank clock = reference + 1000; one slow exchange, one fast
    samples = [(10_000, 9_500, 12_000), (20_000, 19_040, 20_100)]
    info = estimate_offset(samples)
    assert info.method == "ping-pong"
    assert info.uncertainty_ns == 50
    assert abs(info.offset_ns - 1000) <= info.uncertainty_ns
    assert info.offset_ns == (20_000 + 20_100) // 2 - 19_040
    assert info.at_ns == 20_050  # measured then, on the rank's clock
    with pytest.raises(ValueError, match="at least one"):
        estimate_offset([])


def test_a_drift_beyond_the_uncertainties_is_kept_and_interpolated() -> None:
    start = ClockInfo(offset_ns=1_000_000, uncertainty_ns=20_000, method="ping-pong", at_ns=10**9)
    # 10 s later on the rank's clock the offset grew by 500 µs: 50 ppm
    end = ClockInfo(offset_ns=1_500_000, uncertainty_ns=30_000, method="ping-pong", at_ns=11 * 10**9)
    clock = with_drift(start, end)
    assert clock.drift_ppm == pytest.approx(50.0)
    assert (clock.offset_ns, clock.at_ns, clock.uncertainty_ns) == (1_000_000, 10**9, 30_000)
    at = offsets_at(clock, np.array([10**9, 6 * 10**9, 11 * 10**9, 0], np.int64))
    assert at.tolist() == [1_000_000, 1_250_000, 1_500_000, 950_000]  # before the first measurement too
    assert offsets_at(start, np.array([5, 7], np.int64)).tolist() == [1_000_000, 1_000_000]
    # a change within the two uncertainties is noise: no drift
    noise = ClockInfo(offset_ns=1_040_000, uncertainty_ns=30_000, method="ping-pong", at_ns=11 * 10**9)
    assert with_drift(start, noise) == start


def test_a_run_with_a_drifting_rank_is_read_back_on_the_common_clock(tmp_path: Path) -> None:
    from ppscope.trace.store import RankWriter, create_run, load_run

    run = tmp_path / "run"
    drifting = ClockInfo(offset_ns=2_000, method="ping-pong", at_ns=1_000_000, drift_ppm=1_000.0)
    create_run(run, RunMeta(world_size=2, ranks=[RankInfo(rank=0), RankInfo(rank=1, clock=drifting)]))
    for rank in (0, 1):
        w = RankWriter(run, rank)
        # rank 1: a span from 1 ms to 3 ms of its clock; 1000 ppm moves the end's offset by 2 µs more
        w.write(
            [(rank, rank, "compute", "forward", "forward", 0, 0, 0, "", 1_000_000, 3_000_000, 0, 0, -1)],
            [(3_000_000, rank, -1, "cpu_util_pct", 1.0)],
        )
        w.close()
    trace = load_run(run)
    one = trace.spans[trace.spans["rank"] == 1].iloc[0]
    assert (one["start_ns"], one["end_ns"]) == (1_000_000 - 2_000, 3_000_000 - 4_000)
    counters = trace.counters.set_index("rank")["ts_ns"]
    assert (counters[0], counters[1]) == (3_000_000, 3_000_000 - 4_000)


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
def test_injected_skew_and_drift_are_recovered_and_undone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1's clock is 3 s ahead and runs 2% fast: measured at the start and the end of the run, undone on
    reading. Rank 2 reads rank 0's clock on rank 0's host: offset 0, not measured."""
    from ppscope.engine.config import EngineConfig, ModelConfig, OutputConfig, PipelineConfig, WorkloadConfig
    from ppscope.engine.launch import run
    from ppscope.engine.testing import DRIFT_ENV, SKEW_ENV
    from ppscope.trace.store import load_run

    skew_ns, ppm = 3_000_000_000, 20_000
    monkeypatch.setenv(SKEW_ENV, f"1={skew_ns}")
    monkeypatch.setenv(DRIFT_ENV, f"1={ppm}")
    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=3, schedule="gpipe"),
        model=ModelConfig(name="synthetic", layers=3, layer_cost_ms=(10.0,)),
        workload=WorkloadConfig(requests=4, prompt_len=4, max_new_tokens=12),
        output=OutputConfig(progress=False, out=tmp_path / "run"),
    )
    trace = load_run(run(cfg))
    clocks = [r.clock for r in trace.meta.ranks]
    assert [c.method for c in clocks] == ["none", "ping-pong", "same-host"]
    assert clocks[0].offset_ns == clocks[2].offset_ns == 0 and clocks[2].drift_ppm == 0
    clock = clocks[1]
    assert abs(clock.offset_ns - skew_ns) < 50_000_000  # the skew, and what 2% added since the rank started
    assert clock.drift_ppm == pytest.approx(ppm / (1 + ppm * 1e-6), rel=0.1)  # ns of offset per ns of its clock
    spans = trace.spans
    r0, r1 = spans[spans["rank"] == 0], spans[spans["rank"] == 1]
    # back on the common clock, rank 1 works inside rank 0's window (give or take a message), not 3 s later
    slack_ns = 1_000_000_000  # a busy machine can stall a rank for a while; the skew is 3 s
    assert r0["start_ns"].min() - slack_ns <= r1["start_ns"].min()
    assert r1["end_ns"].max() <= r0["end_ns"].max() + slack_ns
    uncertainty = {r.rank: r.clock.uncertainty_ns for r in trace.meta.ranks}
    assert causality_violations(spans, uncertainty_ns=uncertainty).empty  # the drift too is undone

    def shortest_forward_ms(rank: pd.DataFrame) -> float:
        fwd = rank[rank["kind"] == SpanKind.FORWARD]
        return float(((fwd["end_ns"] - fwd["start_ns"]) / 1e6).min())

    # not 2% long any more: against rank 0's passes of the same cost. A loaded machine only ever lengthens a
    # 10 ms sleep (by 1% and more, unevenly between ranks), so the shortest of each rank's ~50 passes is the
    # one nearest its true length; undone, rank 1's would be 0.2 ms longer, so the bound sits half way.
    r1_ms, r0_ms = shortest_forward_ms(r1), shortest_forward_ms(r0)
    assert r1_ms < r0_ms * 1.01, (r1_ms, r0_ms)
    # no GPU here: each rank's CPU use, on the host device, labelled as such
    cpu = trace.counters[trace.counters["metric"] == Metric.CPU_UTIL_PCT]
    assert set(cpu["rank"]) == {0, 1, 2} and set(cpu["device"]) == {-1}
    assert pd.Series(cpu["value"]).between(0, 400).all()


def test_ranks_on_rank_0s_host_are_not_measured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ppscope.engine import clock_sync

    assert clock_sync.ranks_to_measure(["a", "a", "b", ""]) == [2, 3]
    assert clock_sync.ranks_to_measure(["", "", "a"]) == [1, 2]  # rank 0's clock is not the host's: all
    boot = tmp_path / "boot_id"
    boot.write_text("5f1c\n")
    monkeypatch.setattr(clock_sync, "BOOT_ID", boot)
    monkeypatch.setattr(clock_sync, "TIME_NAMESPACE", str(tmp_path / "none"))
    assert clock_sync.host_clock_key() == "5f1c "
    monkeypatch.setattr(clock_sync, "BOOT_ID", tmp_path / "missing")
    assert clock_sync.host_clock_key() == ""


def _ring(offset_1_ns: int, uncertainty_ns: int) -> Trace:
    """Rank 0 sends each micro-batch to rank 1 at 100 µs, which receives it 10 µs later (true time)."""
    rows = []
    for mb in range(3):
        t = 1_000_000 * mb
        rows += [
            {
                "rank": 0,
                "stage": 0,
                "kind": SpanKind.FORWARD,
                "mb": mb,
                "step": 0,
                "start_ns": t,
                "end_ns": t + 100_000,
            },
            {
                "rank": 0,
                "stage": 0,
                "kind": SpanKind.SEND,
                "peer": 1,
                "mb": mb,
                "step": 0,
                "start_ns": t + 100_000,
                "end_ns": t + 105_000,
            },
            {
                "rank": 1,
                "stage": 1,
                "kind": SpanKind.RECV_WAIT,
                "peer": 0,
                "mb": mb,
                "step": 0,
                "start_ns": t + offset_1_ns,
                "end_ns": t + 110_000 + offset_1_ns,
            },
            {
                "rank": 1,
                "stage": 1,
                "kind": SpanKind.FORWARD,
                "mb": mb,
                "step": 0,
                "start_ns": t + 110_000 + offset_1_ns,
                "end_ns": t + 210_000 + offset_1_ns,
            },
        ]
    trace = Trace.from_records(rows)
    trace.meta.ranks = [
        RankInfo(rank=0),
        RankInfo(rank=1, clock=ClockInfo(uncertainty_ns=uncertainty_ns, method="ping-pong")),
    ]
    return trace


def _skew(trace: Trace) -> list[str]:
    """The analysis' warnings of receives that end before their send starts."""
    from ppscope.analysis import analyze

    return [n.text for n in analyze(trace).warnings if n.code == NoticeCode.CLOCK_SKEW]


def test_the_analyzer_warns_when_offsets_break_causality() -> None:
    assert not _skew(_ring(0, 0))
    # rank 1's common-clock times 50 µs early: each receive ends 40 µs before its send began
    late = _skew(_ring(-50_000, 5_000))
    assert len(late) == 1 and late[0].startswith("3 ")  # counted
    assert all(name in late[0] for name in ("0→1", "40.0 µs", "micro-batch 0 step 0")), late  # which, how much, where
    # within the offsets' stated uncertainty it is not a violation
    assert not _skew(_ring(-50_000, 45_000))
    # ranks that read one clock have no offset to get wrong: nothing to check
    one_clock = _ring(-50_000, 5_000)
    one_clock.meta.ranks[1].clock = ClockInfo(method="same-host")
    assert not _skew(one_clock)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([SpanKind.SEND, SpanKind.RECV, SpanKind.RECV_WAIT]),
            st.integers(0, 1),
            st.integers(0, 1),
            st.integers(-1, 1),
            st.integers(-1, 0),
            st.integers(0, 12),
        ),
        max_size=40,
    ),
    st.integers(0, 3),
)
def test_causality_violations_agree_with_matching_by_hand(
    rows: list[tuple[str, int, int, int, int, int]], slack: int
) -> None:
    records = [
        {"rank": r, "peer": p, "kind": k, "mb": m, "step": s, "start_ns": t, "end_ns": t + 5}
        for k, r, p, m, s, t in rows
    ]
    got = causality_violations(Trace.from_records(records).spans, slack_ns=slack) if records else None
    expected = []
    for kind in (SpanKind.RECV, SpanKind.RECV_WAIT):
        for key in sorted({(r, p, m, s) for k, r, p, m, s, _ in rows if k == SpanKind.SEND}):
            sends = sorted(t for k, r, p, m, s, t in rows if k == SpanKind.SEND and (r, p, m, s) == key)
            recvs = sorted(t + 5 for k, r, p, m, s, t in rows if k == kind and (p, r, m, s) == key)
            expected += [(*key, str(kind), a, b) for a, b in zip(sends, recvs, strict=False) if b + slack < a]
    if got is not None:
        assert sorted(map(tuple, got.values.tolist())) == sorted(expected)


def test_a_simulated_run_has_one_clock_and_no_causality_warning(tmp_path: Path) -> None:
    from ppscope.balance.costs import LayerCosts
    from ppscope.simulate.simulator import SimConfig, simulate

    trace = simulate(SimConfig(schedule="gpipe", stages=4, microbatches=8, steps=2, costs=LayerCosts.uniform(8, 1.0)))
    assert not _skew(trace)
