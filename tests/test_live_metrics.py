"""Live metrics without a server: the mapping of a known analysis onto metric values, and a run followed as it
is written, whose counters must add up to the analysis of the whole run."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from error_helpers import raises_code

from ppscope.analysis import CAUSES, AnalysisConfig, analyze
from ppscope.analysis.pipeline import message_latencies
from ppscope.balance.costs import LayerCosts
from ppscope.errors import ErrorCode, InvalidConfigError, RunNotFoundError
from ppscope.live.follow import RunFollower
from ppscope.live.metrics import (
    HOP_LATENCY_BUCKETS_S,
    SPECS,
    Totals,
    new_latencies,
    run_gauges,
    slice_ns,
    tokens_between,
    window_gauges,
)
from ppscope.simulate.simulator import CommModel, SimConfig, simulate, write_run
from ppscope.trace.model import SPAN_COLUMNS, RankInfo, RunMeta, Trace, spans_frame
from ppscope.trace.store import REQUESTS_FILE, RankWriter, create_run, read_meta, write_meta

MS = 1_000_000


def _row(rank: int, kind: str, start_ms: float, end_ms: float, *, mb: int = 0, peer: int = -1, tokens: int = 0):
    lane = {"send": "send", "recv_wait": "recv"}.get(kind, "compute")
    return (rank, rank, lane, kind, kind, mb, 0, 0, "decode", round(start_ms * MS), round(end_ms * MS), 0, tokens, peer)


# Two stages, 40 ms. Stage 0 computes mb 0 and 1 (10 ms each) and sends each to stage 1; stage 1 waits 12 ms for
# mb 0 (posted at 10 ms), then computes both (13 ms forward + 1 ms sample each) back to back.
KNOWN = [
    _row(0, "forward", 0, 10),
    _row(0, "send", 10, 11, peer=1),
    _row(0, "forward", 11, 21, mb=1),
    _row(0, "send", 21, 22, mb=1, peer=1),
    _row(1, "recv_wait", 0, 12, peer=0),
    _row(1, "forward", 12, 25),
    _row(1, "sample", 25, 26, tokens=1),
    _row(1, "forward", 26, 39, mb=1),
    _row(1, "sample", 39, 40, mb=1, tokens=1),
]


def _known_trace(status: str = "finished") -> Trace:
    spans = spans_frame(pd.DataFrame(KNOWN, columns=list(SPAN_COLUMNS)))
    meta = RunMeta(
        run_id="known",
        source="ppscope",
        status=status,
        world_size=2,
        pp_size=2,
        schedule="gpipe",
        ranks=[RankInfo(rank=r, stage=r) for r in (0, 1)],
    )
    return Trace(spans=spans, meta=meta).sorted()


def test_every_metric_name_follows_prometheus_conventions() -> None:
    names = [s.name for s in SPECS]
    assert len(set(names)) == len(names)
    for spec in SPECS:
        assert spec.name.startswith("ppscope_") and spec.help
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert not (spec.kind == "gauge" and spec.name.endswith(("_total", "_count", "_sum", "_bucket")))
    # a gauge and a counter never share a family name (the counter's family drops `_total`)
    families = [s.name.removesuffix("_total") for s in SPECS]
    assert len(set(families)) == len(families)


def test_the_window_gauges_of_a_known_trace() -> None:
    result = analyze(_known_trace())
    g = window_gauges(result, tokens_per_s=50.0)
    assert g["ppscope_window_seconds"] == {(): 0.040}
    assert g["ppscope_bubble_ratio"] == {(): pytest.approx(0.4)}  # (20 + 12) / (2 x 40)
    assert g["ppscope_stage_bubble_ratio"] == {("0",): 0.5, ("1",): 0.3}
    assert g["ppscope_stage_busy_ratio"] == {("0",): 0.5, ("1",): 0.7}
    idle = g["ppscope_stage_window_idle_seconds"]
    assert set(idle) == {(s, c) for s in ("0", "1") for c in CAUSES}
    assert idle[("0", "downstream")] == pytest.approx(0.001) and idle[("0", "drain")] == pytest.approx(0.019)
    assert idle[("1", "fill")] == pytest.approx(0.012)
    assert sum(idle.values()) == pytest.approx(0.032)
    assert g["ppscope_stage_time_per_microbatch_seconds"] == {("0",): 0.010, ("1",): 0.014}
    assert g["ppscope_tokens_per_second"] == {(): 50.0}
    assert g["ppscope_bottleneck_stage"] == {(): 1.0}
    assert g["ppscope_stage_bottleneck"] == {("0",): 0.0, ("1",): 1.0}
    assert g["ppscope_balance_speedup"] == {(): pytest.approx(14 / 12)}
    assert g["ppscope_imbalance"] == {(): pytest.approx(1 - 12 / 14)}


def test_unknown_values_are_left_out_not_zero() -> None:
    result = analyze(_known_trace())
    result = dataclasses.replace(result, bottleneck_stage=None, balance_speedup=None, imbalance=None)
    g = window_gauges(result, tokens_per_s=None)
    for name in (
        "ppscope_bottleneck_stage",
        "ppscope_stage_bottleneck",
        "ppscope_balance_speedup",
        "ppscope_imbalance",
        "ppscope_tokens_per_second",
    ):
        assert name not in g
    assert window_gauges(analyze(Trace()), tokens_per_s=None) == {}


def test_the_run_gauges_name_the_run_and_its_status() -> None:
    g = run_gauges(_known_trace(status="running").meta)
    assert g["ppscope_run_info"] == {("known", "ppscope", "gpipe"): 1.0}
    assert g["ppscope_run_status"] == {("running",): 1.0, ("finished",): 0.0, ("failed",): 0.0, ("interrupted",): 0.0}


def test_a_slice_splits_into_busy_and_idle_by_cause() -> None:
    result = analyze(_known_trace())
    busy, idle = slice_ns(result.gaps, [0, 1], 5 * MS, 15 * MS)
    assert busy == {0: 9 * MS, 1: 3 * MS}  # stage 0 sends for 1 ms; stage 1 waits until 12 ms
    assert idle[(0, "downstream")] == 1 * MS and idle[(1, "fill")] == 7 * MS
    assert sum(idle.values()) == 8 * MS and len(idle) == 2 * len(CAUSES)
    # slices that tile the window add up to the window's causes, exactly
    parts = [slice_ns(result.gaps, [0, 1], a * MS, b * MS) for a, b in ((0, 7), (7, 21), (21, 40))]
    for stage in result.stages:
        assert sum(p[0][stage.stage] for p in parts) == stage.busy_ns
        for cause in CAUSES:
            assert sum(p[1][(stage.stage, cause)] for p in parts) == stage.causes[cause]


def test_tokens_and_hop_latencies_of_a_slice() -> None:
    trace = _known_trace()
    assert tokens_between(trace, 0, 40 * MS, from_spans=True) == 2
    assert tokens_between(trace, 26 * MS, 40 * MS, from_spans=True) == 1  # (lo, hi]: the sample ending at 26 is out
    lat = new_latencies(trace.spans, 0, 40 * MS)
    assert lat.to_dict("records") == [{"src": 0, "dst": 1, "latency_ns": 2 * MS}]  # posted at 10, woke at 12
    assert new_latencies(trace.spans, 12 * MS, 40 * MS).empty  # each message counted in one slice only
    requests = pd.DataFrame(
        {
            "id": [0, 1],
            "prompt_len": [4, 4],
            "output_len": [3, 5],
            "arrival_ns": [0, 0],
            "first_token_ns": [MS, MS],
            "finish_ns": [10 * MS, 30 * MS],
        }
    )
    with_requests = dataclasses.replace(trace, requests=requests)
    assert tokens_between(with_requests, 10 * MS, 40 * MS, from_spans=False) == 5


def test_totals_add_up_and_bucket_latencies_as_prometheus_does() -> None:
    totals = Totals()
    totals.add_slice({0: 3 * MS}, {(0, "host"): MS})
    totals.add_slice({0: 2 * MS}, {(0, "host"): 0})
    assert totals.values()["ppscope_stage_busy_seconds_total"] == {("0",): pytest.approx(0.005)}
    lat = pd.DataFrame({"src": [0, 0, 0, 1], "dst": [1, 1, 1, 0], "latency_ns": [50_000, 60_000, 5 * 10**9, 10]})
    totals.observe_latencies(lat)
    hist = totals.histograms()["ppscope_hop_latency_seconds"]
    link = hist[("0", "1")]
    assert link.count == 3 and link.sum == pytest.approx(5.00011)
    cumulative = dict(link.cumulative())
    assert cumulative[5e-5] == 1  # a bound holds the values equal to it (`le`)
    assert cumulative[1e-4] == 2 and cumulative[HOP_LATENCY_BUCKETS_S[-1]] == 2 and cumulative[float("inf")] == 3
    assert hist[("1", "0")].count == 1


def _write_progressively(trace: Trace, run: Path, cuts_ms: list[float], follower_window_s: float) -> RunFollower:
    """Write `trace` into a new run directory in pieces (every span and request that has ended by each cut), updating a
    follower after each, then mark the run finished and update once more."""
    meta = dataclasses.replace(trace.meta, status="running", run_id="live")
    create_run(run, meta)
    writers = {r: RankWriter(run, r) for r in range(meta.world_size)}
    follower = RunFollower(run, window_s=follower_window_s)
    spans, done, prev = trace.spans, np.zeros(len(trace.spans), bool), -np.inf
    for cut in [*cuts_ms, np.inf]:
        now = (spans["end_ns"].to_numpy() <= cut * MS) & ~done
        for rank, w in writers.items():
            part = spans[now & (spans["rank"].to_numpy() == rank)]
            w.write(
                spans=[tuple(v.item() if hasattr(v, "item") else v for v in r) for r in part.itertuples(index=False)]
            )
        done |= now
        finish = trace.requests["finish_ns"].to_numpy()
        with open(run / REQUESTS_FILE, "a") as f:
            for rec in trace.requests[(finish <= cut * MS) & (finish > prev * MS)].to_dict("records"):
                f.write(json.dumps({k: int(v) for k, v in rec.items()}) + "\n")
        prev = cut
        follower.update()
        assert not follower.finished
    for w in writers.values():
        w.close()
    write_meta(run, dataclasses.replace(read_meta(run), status="finished"))
    follower.update()
    assert follower.finished
    return follower


def _gpipe(steps: int = 6) -> Trace:
    costs = LayerCosts(layer_ms=(1.0, 2.0, 1.0, 1.0, 3.0, 1.0), head_ms=1.0, sample_ms=0.2)
    cfg = SimConfig(
        schedule="gpipe",
        stages=3,
        microbatches=4,
        steps=steps,
        costs=costs,
        comm=CommModel(latency_us=100),
        overhead_ms=0.3,
    )
    return simulate(cfg)


@pytest.mark.parametrize("inflight", [4, None], ids=["inflight-given", "inflight-measured"])
def test_a_followed_run_counts_each_instant_once(tmp_path: Path, inflight: int | None) -> None:
    """Counters over many small slices add up to the analysis of the whole run, cause by cause, to the ns. When
    the run does not say how many micro-batches are in flight, the analyzer counts those it sees: early slices,
    which see fewer, call `dependency` some waits the whole run calls `upstream`."""
    trace = _gpipe()
    if inflight is not None:
        trace = dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, config={"max_inflight": inflight}))
    end_ms = trace.spans["end_ns"].max() / MS
    follower = _write_progressively(trace, tmp_path / "run", list(np.linspace(3, end_ms - 1, 17)), 1e3)
    whole = analyze(trace)
    snap = follower.snapshot()
    waits = ("upstream", "dependency")
    for stage in whole.stages:
        key = str(stage.stage)
        assert snap.value("ppscope_stage_busy_seconds_total", key) == pytest.approx(stage.busy_ns / 1e9, abs=1e-9)
        idle = {c: snap.value("ppscope_stage_idle_seconds_total", key, c) for c in CAUSES}
        for cause in CAUSES if inflight else [c for c in CAUSES if c not in waits]:
            assert idle[cause] == pytest.approx(stage.causes[cause] / 1e9, abs=1e-9), (key, cause)
        both = sum(stage.causes[c] for c in waits) / 1e9
        assert sum(idle[c] or 0.0 for c in waits) == pytest.approx(both, abs=1e-9)
    assert snap.value("ppscope_tokens_total") == trace.requests["output_len"].sum()  # sample spans carry no tokens
    messages = sum(h.count for h in snap.histograms["ppscope_hop_latency_seconds"].values())
    assert messages == len(message_latencies(trace.spans))
    assert snap.value("ppscope_run_status", "finished") == 1.0


def test_the_window_slides_and_matches_the_analyzer_on_it(tmp_path: Path) -> None:
    trace = _gpipe(steps=12)
    end = int(trace.spans["end_ns"].max())
    follower = _write_progressively(trace, tmp_path / "run", [10, 25, 40, 60], follower_window_s=0.02)
    assert follower.horizon == end
    first = int(trace.spans["start_ns"].min())
    expect = analyze(trace, AnalysisConfig(window_ms=((end - 20 * MS - first) / MS, (end - first) / MS)))
    snap = follower.snapshot()
    assert snap.value("ppscope_window_seconds") == pytest.approx(0.02)
    for stage in expect.stages:
        assert snap.value("ppscope_stage_bubble_ratio", str(stage.stage)) == pytest.approx(stage.bubble_ratio)
        for cause in CAUSES:
            got = snap.value("ppscope_stage_window_idle_seconds", str(stage.stage), cause)
            assert got == pytest.approx(stage.causes[cause] / 1e9, abs=1e-9)
    assert snap.value("ppscope_bottleneck_stage") == expect.bottleneck_stage
    # only the window is kept (plus each rank's first compute)
    assert int(follower._spans["end_ns"].min()) >= end - 20 * MS


def test_while_running_the_window_ends_where_every_rank_has_reported(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, dataclasses.replace(_known_trace().meta, status="running"))
    follower = RunFollower(run, window_s=10)
    follower.update()
    assert follower.horizon is None and not follower.finished
    writers = {r: RankWriter(run, r) for r in (0, 1)}
    for r, w in writers.items():
        w.write(spans=[s for s in KNOWN if s[0] == r and s[10] <= 26 * MS])
    follower.update()
    assert follower.horizon == 21 * MS  # stage 0's last compute; stage 1 has reported to 26 ms
    assert follower.snapshot().value("ppscope_window_seconds") == pytest.approx(0.021)
    for w in writers.values():
        w.close()


def test_bad_window_and_a_vanished_run_are_named(tmp_path: Path) -> None:
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        RunFollower(tmp_path, window_s=0)
    run = write_run(_known_trace(), tmp_path / "run")
    follower = RunFollower(run, window_s=1)
    follower.update()
    for p in run.iterdir():
        p.unlink()
    run.rmdir()
    with pytest.raises(RunNotFoundError):
        follower.update()


GRAFANA = Path(__file__).resolve().parents[1] / "examples" / "grafana-dashboard.json"


def grafana_queries() -> list[str]:
    """Every PromQL expression of the shipped Grafana dashboard (panels and variables)."""
    board = json.loads(GRAFANA.read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_the_grafana_dashboard_asks_only_for_metrics_that_are_served() -> None:
    board = json.loads(GRAFANA.read_text(encoding="utf-8"))
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids)
    assert all(p["datasource"]["uid"] == "${datasource}" for p in board["panels"])
    served = {s.name for s in SPECS}
    served |= {f"{s.name}_{suffix}" for s in SPECS if s.kind == "histogram" for suffix in ("bucket", "sum", "count")}
    asked = {name for expr in grafana_queries() for name in re.findall(r"\bppscope_\w+", expr)}
    assert asked - served == set()
    for name in (
        "ppscope_stage_busy_ratio",
        "ppscope_stage_bubble_ratio",
        "ppscope_stage_idle_seconds_total",
        "ppscope_hop_latency_seconds_bucket",
        "ppscope_tokens_per_second",
        "ppscope_bottleneck_stage",
        "ppscope_balance_speedup",
    ):
        assert name in asked, f"the dashboard shows no {name}"
