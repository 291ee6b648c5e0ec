"""The live metrics of a pipeline as plain values: what `ppscope watch` serves, computed without a server.

`SPECS` names every metric (docs/ARCHITECTURE.md, "Live metrics"): gauges describe the sliding window the
watcher analysed last (`window_gauges` maps its `AnalysisResult` onto them); counters and histograms add up
the slices of time the window moved on by (`Totals`), so they only grow and Prometheus' `rate()` works on
them. A `Snapshot` holds one set of values. This module knows no clock, no files and no Prometheus client:
values go in and out as numbers keyed by their label values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ppscope.analysis.bubbles import ROLE_SEND, ROLE_WAIT, span_roles
from ppscope.analysis.pipeline import message_latencies
from ppscope.analysis.result import CAUSES, AnalysisResult
from ppscope.trace.model import RunMeta, SpanKind, Trace

__all__ = [
    "HOP_LATENCY_BUCKETS_S",
    "SPECS",
    "STATUSES",
    "HistogramValue",
    "Labels",
    "MetricSpec",
    "SliceNs",
    "Snapshot",
    "Totals",
    "Values",
    "new_latencies",
    "run_gauges",
    "slice_ns",
    "tokens_between",
    "window_gauges",
]

Labels = tuple[str, ...]
"""Label values, in the order of the metric's `MetricSpec.labels`."""
Values = dict[Labels, float]

STATUSES = ("running", "finished", "failed", "interrupted")
HOP_LATENCY_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
"""Upper bounds of the hop-latency buckets, in seconds: 10 µs (NVLink) to 1 s (a stalled peer)."""


@dataclass(frozen=True)
class MetricSpec:
    name: str
    """As exposed: counters end in `_total`, a histogram's series add `_bucket`, `_sum` and `_count`."""
    kind: str
    """`gauge`, `counter` or `histogram`."""
    labels: tuple[str, ...]
    help: str


def _g(name: str, labels: tuple[str, ...], text: str) -> MetricSpec:
    return MetricSpec(name, "gauge", labels, text)


def _c(name: str, labels: tuple[str, ...], text: str) -> MetricSpec:
    return MetricSpec(name, "counter", labels, text)


_W = " over the sliding window"
SPECS: tuple[MetricSpec, ...] = (
    _g("ppscope_window_seconds", (), "Length of the sliding window the window gauges describe (shorter at the start)"),
    _g("ppscope_bubble_ratio", (), f"Share of the stages' wall time spent idle{_W}: sum(bubble) / (P x window)"),
    _g("ppscope_stage_bubble_ratio", ("stage",), f"Share of the window the stage was idle{_W}"),
    _g("ppscope_stage_busy_ratio", ("stage",), f"Share of the window the stage computed{_W}"),
    _g("ppscope_stage_window_idle_seconds", ("stage", "cause"), f"Seconds the stage was idle, by cause,{_W}"),
    _g("ppscope_stage_time_per_microbatch_seconds", ("stage",), f"Busy time per micro-batch pass of the stage{_W}"),
    _g("ppscope_tokens_per_second", (), f"Output tokens per second{_W}"),
    _g("ppscope_bottleneck_stage", (), f"The stage with the longest time per micro-batch{_W}"),
    _g("ppscope_stage_bottleneck", ("stage",), f"1 for the bottleneck stage{_W}, 0 for the others"),
    _g("ppscope_balance_speedup", (), f"Throughput factor a perfect balance of the same work would give{_W}"),
    _g("ppscope_imbalance", (), f"1 - mean/max of the stages' time per micro-batch{_W}"),
    _c("ppscope_stage_busy_seconds_total", ("stage",), "Seconds the stage computed, since start"),
    _c("ppscope_stage_idle_seconds_total", ("stage", "cause"), "Seconds the stage was idle, by cause, since start"),
    _c("ppscope_tokens_total", (), "Output tokens generated, since start"),
    MetricSpec(
        "ppscope_hop_latency_seconds",
        "histogram",
        ("src", "dst"),
        "Time from a rank posting a message to the next rank, already waiting, waking up with it, per link of ranks "
        "(only messages a receiver waited for are seen, so links count differently)",
    ),
    _g("ppscope_run_info", ("run_id", "source", "schedule"), "The run being watched (always 1)"),
    _g("ppscope_run_status", ("status",), "1 for the run's status as meta.json says it, 0 for the others"),
    _c("ppscope_updates_total", (), "Analyses of the window the watcher made"),
    _c("ppscope_read_errors_total", (), "Reads of the run directory that failed and were retried"),
)


@dataclass(frozen=True)
class HistogramValue:
    """One histogram series: observations per bucket (not cumulative; the last is above every bound)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ending with (+inf, count): Prometheus' buckets."""
        totals = np.cumsum(self.counts).tolist()
        return [(b, int(n)) for b, n in zip((*self.bounds, float("inf")), totals, strict=True)]


@dataclass(frozen=True)
class Snapshot:
    """Every metric's values at one update. A metric or label set without a value is left out: unknown."""

    values: dict[str, Values] = field(default_factory=dict)
    """Gauges and counters, by name."""
    histograms: dict[str, dict[Labels, HistogramValue]] = field(default_factory=dict)

    def value(self, name: str, *labels: str) -> float | None:
        return self.values.get(name, {}).get(tuple(labels))


def window_gauges(result: AnalysisResult, tokens_per_s: float | None) -> dict[str, Values]:
    """The window gauges of an analysis of the window (`tokens_per_s` measured over the same window)."""
    out: dict[str, Values] = {}
    if result.window is None or result.window.length_ns <= 0 or not result.stages:
        return out
    length = result.window.length_ns
    out["ppscope_window_seconds"] = {(): length / 1e9}
    if result.bubble_ratio is not None:
        out["ppscope_bubble_ratio"] = {(): result.bubble_ratio}
    stages = [(str(s.stage), s) for s in result.stages]
    out["ppscope_stage_bubble_ratio"] = {(k,): s.bubble_ratio for k, s in stages}
    out["ppscope_stage_busy_ratio"] = {(k,): s.busy_ns / length for k, s in stages}
    out["ppscope_stage_window_idle_seconds"] = {(k, c): s.causes[c] / 1e9 for k, s in stages for c in CAUSES}
    per_mb: Values = {(k,): s.time_per_mb_ns / 1e9 for k, s in stages if s.time_per_mb_ns is not None}
    if per_mb:
        out["ppscope_stage_time_per_microbatch_seconds"] = per_mb
    if tokens_per_s is not None:
        out["ppscope_tokens_per_second"] = {(): tokens_per_s}
    if result.bottleneck_stage is not None:
        out["ppscope_bottleneck_stage"] = {(): float(result.bottleneck_stage)}
        out["ppscope_stage_bottleneck"] = {(k,): float(s.stage == result.bottleneck_stage) for k, s in stages}
    if result.balance_speedup is not None:
        out["ppscope_balance_speedup"] = {(): result.balance_speedup}
    if result.imbalance is not None:
        out["ppscope_imbalance"] = {(): result.imbalance}
    return out


def run_gauges(meta: RunMeta) -> dict[str, Values]:
    """What the run is and its status (the status as a 0/1 per possible value, Prometheus' enum pattern)."""
    return {
        "ppscope_run_info": {(meta.run_id, meta.source, meta.schedule): 1.0},
        "ppscope_run_status": {(s,): float(meta.status == s) for s in STATUSES},
    }


SliceNs = tuple[dict[int, int], dict[tuple[int, str], int]]
"""Busy ns per stage, idle ns per (stage, cause)."""


def slice_ns(gaps: pd.DataFrame, stages: list[int], lo: int, hi: int) -> SliceNs:
    """Busy ns per stage and idle ns per (stage, cause) within [lo, hi), from an analysis' idle intervals
    (`AnalysisResult.gaps`: stage, start_ns, end_ns, cause) over a window that holds [lo, hi): what is not idle
    is busy."""
    idle = np.zeros((len(stages), len(CAUSES)), np.int64)
    if hi > lo and len(gaps):
        start = np.maximum(gaps["start_ns"].to_numpy(np.int64), lo)
        end = np.minimum(gaps["end_ns"].to_numpy(np.int64), hi)
        row = np.searchsorted(np.asarray(stages), gaps["stage"].to_numpy())
        cause = pd.Categorical(gaps["cause"], categories=list(CAUSES)).codes
        inside = end > start
        np.add.at(idle, (row[inside], cause[inside]), (end - start)[inside])
    span = max(hi - lo, 0)
    busy = {s: span - int(idle[i].sum()) for i, s in enumerate(stages)}
    return busy, {(s, c): int(idle[i, j]) for i, s in enumerate(stages) for j, c in enumerate(CAUSES)}


def tokens_between(trace: Trace, lo: int, hi: int, *, from_spans: bool) -> int:
    """Output tokens produced in (lo, hi]: those of `sample` spans ending then (`from_spans`), else the output
    tokens of the requests that finished then (a run whose sample spans carry no token counts)."""
    if from_spans:
        spans = trace.spans
        end = spans["end_ns"].to_numpy()
        pick = (spans["kind"] == SpanKind.SAMPLE).to_numpy() & (end > lo) & (end <= hi)
        return int(spans["tokens"].to_numpy()[pick].sum())
    req = trace.requests
    finish = req["finish_ns"].to_numpy()
    return int(req["output_len"].to_numpy()[(finish > lo) & (finish <= hi)].sum())


def new_latencies(spans: pd.DataFrame, lo: int, hi: int) -> pd.DataFrame:
    """Hop latencies (src, dst, latency_ns; `pipeline.message_latencies`) of the messages whose receiver woke
    up with them in (lo, hi]: each message once, however the slices are cut."""
    role = span_roles(spans["kind"])
    end = spans["end_ns"].to_numpy()
    keep = (role == ROLE_SEND) | ((role == ROLE_WAIT) & (end > lo) & (end <= hi))
    return message_latencies(spans[keep], role[keep])


class Totals:
    """The counters and histograms: what the slices of time the window moved on by add up to."""

    def __init__(self, bounds_s: tuple[float, ...] = HOP_LATENCY_BUCKETS_S) -> None:
        self.bounds_s = bounds_s
        # a counter without labels exists from the start, at 0: "no read error yet" is a value, not a gap
        self._counters: dict[str, Values] = {
            s.name: {} if s.labels else {(): 0.0} for s in SPECS if s.kind == "counter"
        }
        self._counts: dict[Labels, np.ndarray] = {}
        self._sums: dict[Labels, float] = {}

    def add(self, name: str, labels: Labels, amount: float) -> None:
        series = self._counters[name]
        series[labels] = series.get(labels, 0.0) + amount

    def add_slice(self, busy_ns: Mapping[int, int], idle_ns: Mapping[tuple[int, str], int]) -> None:
        for stage, ns in busy_ns.items():
            self.add("ppscope_stage_busy_seconds_total", (str(stage),), ns / 1e9)
        for (stage, cause), ns in idle_ns.items():
            self.add("ppscope_stage_idle_seconds_total", (str(stage), cause), ns / 1e9)

    def observe_latencies(self, latencies: pd.DataFrame) -> None:
        """Add one observation per row of (src, dst, latency_ns) to its link's histogram."""
        if latencies.empty:
            return
        seconds = latencies["latency_ns"].to_numpy(np.int64) / 1e9
        bucket = np.searchsorted(np.asarray(self.bounds_s), seconds, side="left")  # le: value <= bound
        frame = pd.DataFrame(
            {"src": latencies["src"].to_numpy(), "dst": latencies["dst"].to_numpy(), "bucket": bucket, "s": seconds}
        )
        for (src, dst), part in frame.groupby(["src", "dst"], sort=True):
            key = (str(src), str(dst))
            counts = self._counts.setdefault(key, np.zeros(len(self.bounds_s) + 1, np.int64))
            counts += np.bincount(part["bucket"].to_numpy(), minlength=counts.shape[0])
            self._sums[key] = self._sums.get(key, 0.0) + float(part["s"].sum())

    def values(self) -> dict[str, Values]:
        return {name: dict(series) for name, series in self._counters.items() if series}

    def histograms(self) -> dict[str, dict[Labels, HistogramValue]]:
        hist = {
            key: HistogramValue(bounds=self.bounds_s, counts=tuple(int(n) for n in counts), sum=self._sums[key])
            for key, counts in sorted(self._counts.items())
        }
        return {"ppscope_hop_latency_seconds": hist} if hist else {}
