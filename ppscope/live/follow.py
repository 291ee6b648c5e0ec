"""Following a run as it is written: poll the run store, re-analyse the last W seconds, update the metrics.

`RunFollower.update()` reads what arrived since the last call (`RunTail`), moves the *horizon* (the instant up
to which every rank has reported: the earliest of the ranks' latest compute ends while the run is going, the
end of everything once it has ended) and, when it moved, analyses the window [horizon - W, horizon) with the
analyzer's explicit window (docs/ARCHITECTURE.md, "Live metrics"). The window gauges come from that analysis;
the counters add up the slice between the previous horizon and this one, so each instant is counted once.

Memory stays bounded by the window: spans that end before it are dropped, except each rank's first compute
span, which tells the analyzer where the stage's fill ended. This module knows no clock of its own beyond the
loop's pauses, and no Prometheus: it hands out `Snapshot`s.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from ppscope.analysis.analyzer import AnalysisConfig, analyze
from ppscope.analysis.bubbles import ROLE_COMPUTE, span_roles
from ppscope.errors import ErrorCode, InvalidConfigError, PPScopeError, RunNotFoundError
from ppscope.live.metrics import (
    Snapshot,
    Totals,
    Values,
    new_latencies,
    run_gauges,
    slice_ns,
    tokens_between,
    window_gauges,
)
from ppscope.trace.model import RunMeta, SpanKind, Trace, empty_spans, requests_frame, spans_frame
from ppscope.trace.store import RunTail

__all__ = ["RunFollower", "follow"]


class RunFollower:
    """The live metrics of one run directory; `update()` reads what is new and returns the metrics now."""

    def __init__(self, run_dir: str | os.PathLike[str], *, window_s: float) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE, f"the window must be a positive number of seconds, got {window_s}"
            )
        self.run_dir = Path(run_dir)
        self.window_ns = max(1, round(window_s * 1e9))
        self._reset()

    def _reset(self) -> None:
        self._tail = RunTail(self.run_dir)
        self._identity: tuple[object, ...] | None = None
        self.meta = RunMeta()
        self.totals = Totals()
        self._spans = empty_spans()
        """Spans that end at or after `_cutoff`, the start of the last window."""
        self._requests = requests_frame()
        self._first_compute = empty_spans()
        """Each rank's first compute span, kept when the window has left it behind."""
        self._cutoff = np.iinfo(np.int64).min
        self._last_compute: dict[int, int] = {}
        self._origin: int | None = None
        self._end: int | None = None
        self._from_spans = False
        self.horizon: int | None = None
        """The end of the last window analysed, on the run's common clock; None before the first."""
        self._gauges: dict[str, Values] = {}

    @property
    def finished(self) -> bool:
        """The run has ended (finished, failed or interrupted) and everything it wrote has been read."""
        return self.meta.status != "running" and self._identity is not None

    def update(self) -> Snapshot:
        """Read what arrived, analyse the window if the horizon moved, and return every metric's value. A read
        that fails (a rank file half created) is counted and retried at the next call; a run directory that
        disappeared raises RunNotFoundError."""
        try:
            delta = self._tail.poll()
        except RunNotFoundError:
            raise
        except (PPScopeError, OSError):
            self.totals.add("ppscope_read_errors_total", (), 1)
            return self.snapshot()
        if self._origin is not None and _identity(delta.meta) != self._identity:
            self._reset()  # clock offsets changed after rows were read, or another run took the path: start over
            delta = self._tail.poll()
        self._identity = _identity(delta.meta)
        self.meta = delta.meta
        self._take(delta)
        horizon = self._horizon_now()
        if horizon is not None and (self.horizon is None or horizon > self.horizon):
            self._advance(horizon)
        self.totals.add("ppscope_updates_total", (), 1)
        return self.snapshot()

    def snapshot(self) -> Snapshot:
        values = {**self._gauges, **(run_gauges(self.meta) if self._identity else {}), **self.totals.values()}
        return Snapshot(values=values, histograms=self.totals.histograms())

    def _take(self, delta: Trace) -> None:
        spans = delta.spans
        if len(spans):
            rank, start, end = (spans[c].to_numpy(np.int64) for c in ("rank", "start_ns", "end_ns"))
            compute = span_roles(spans["kind"]) == ROLE_COMPUTE
            for r, last in pd.Series(end[compute]).groupby(rank[compute]).max().items():
                self._last_compute[int(r)] = max(self._last_compute.get(int(r), int(last)), int(last))
            firsts = spans[compute].sort_values("start_ns", kind="stable").drop_duplicates("rank")
            known = set(self._first_compute["rank"].tolist())
            firsts = firsts[~firsts["rank"].isin(known)]
            if len(firsts):
                self._first_compute = pd.concat([self._first_compute, firsts], ignore_index=True)
            sample = (spans["kind"] == SpanKind.SAMPLE).to_numpy() & (spans["tokens"].to_numpy() > 0)
            self._from_spans = self._from_spans or bool(sample.any())
            self._note_times(int(start.min()), int(end.max()))
            kept = spans[end >= self._cutoff]
            self._spans = pd.concat([self._spans, kept], ignore_index=True) if len(self._spans) else kept
        requests = delta.requests
        if len(requests):
            arrival, finish = requests["arrival_ns"].to_numpy(), requests["finish_ns"].to_numpy()
            known_arrival = arrival[arrival >= 0]
            self._note_times(int(known_arrival.min()) if len(known_arrival) else None, int(finish.max()))
            self._requests = pd.concat([self._requests, requests], ignore_index=True)

    def _note_times(self, first: int | None, last: int) -> None:
        if first is not None:
            self._origin = first if self._origin is None else min(self._origin, first)
        self._end = last if self._end is None else max(self._end, last)

    def _horizon_now(self) -> int | None:
        """Up to when every rank has reported: once the run has ended, the end of everything; while it goes
        on, the earliest of the ranks' latest compute ends (a rank's spans before its last compute are all
        written, so nothing there can still change)."""
        if self.meta.status != "running" or (not self._last_compute and not len(self._spans)):
            return self._end
        return min(self._last_compute.values()) if self._last_compute else None

    def _advance(self, horizon: int) -> None:
        origin = self._origin if self._origin is not None else horizon
        lo = max(horizon - self.window_ns, origin)
        since = lo if self.horizon is None else max(self.horizon, lo)
        trace = self._window_trace(lo)
        seconds = (horizon - lo) / 1e9
        tokens_per_s = tokens_between(trace, lo, horizon, from_spans=self._from_spans) / seconds if seconds else None
        self.totals.add("ppscope_tokens_total", (), tokens_between(trace, since, horizon, from_spans=self._from_spans))
        if len(trace.spans) and horizon > lo:
            first = int(trace.spans["start_ns"].min())
            config = AnalysisConfig(window_ms=((lo - first) / 1e6, (horizon - first) / 1e6))
            result = analyze(trace, config)
            self._gauges = window_gauges(result, tokens_per_s)
            self.totals.add_slice(*slice_ns(result.gaps, [s.stage for s in result.stages], since, horizon))
            self.totals.observe_latencies(new_latencies(self._spans, since, horizon))
        elif tokens_per_s is not None:
            self._gauges = {"ppscope_window_seconds": {(): seconds}, "ppscope_tokens_per_second": {(): tokens_per_s}}
        self.horizon = horizon
        self._cutoff = lo
        self._spans = self._spans[self._spans["end_ns"].to_numpy() >= lo].reset_index(drop=True)
        finish = self._requests["finish_ns"].to_numpy()
        self._requests = self._requests[(finish < 0) | (finish >= lo)].reset_index(drop=True)

    def _window_trace(self, lo: int) -> Trace:
        """The spans kept, with the first compute of each rank the window left behind (so the analyzer knows the
        stage's fill ended there) and, when no kept span reaches back to `lo`, a mark at `lo` (the analyzer's
        window cannot start before the trace's first span)."""
        old = self._first_compute[self._first_compute["end_ns"].to_numpy() < self._cutoff]
        parts = [p for p in (self._spans, old) if len(p)]
        spans = pd.concat(parts, ignore_index=True) if len(parts) > 1 else (parts[0] if parts else self._spans)
        if len(spans) and int(spans["start_ns"].min()) > lo:
            row = {
                "rank": int(spans["rank"].iloc[0]),
                "stage": -1,
                "lane": "host",
                "kind": str(SpanKind.MARK),
                "name": "window",
                "mb": -1,
                "step": -1,
                "chunk": 0,
                "phase": "",
                "start_ns": lo,
                "end_ns": lo,
                "nbytes": 0,
                "tokens": 0,
                "peer": -1,
            }
            mark = spans_frame(pd.DataFrame([row]))
            spans = pd.concat([mark, spans], ignore_index=True)
        return Trace(spans=spans, requests=self._requests, meta=self.meta).sorted()


def _identity(meta: RunMeta) -> tuple[object, ...]:
    """What makes rows already read still valid: the same run, with the same clock offsets."""
    offsets = tuple(sorted((info.rank, info.clock.offset_ns) for info in meta.ranks))
    return (meta.run_id, meta.created_unix_ns, offsets)


def follow(
    follower: RunFollower,
    publish: Callable[[Snapshot], None],
    *,
    interval_s: float,
    stop: threading.Event,
) -> Snapshot:
    """Update every `interval_s` and publish each snapshot, until the run has ended (after one last update
    with everything it wrote) or `stop` is set. Returns the last snapshot."""
    while True:
        began = time.monotonic()
        snapshot = follower.update()
        publish(snapshot)
        if follower.finished or stop.is_set():
            return snapshot
        stop.wait(max(0.0, interval_s - (time.monotonic() - began)))
