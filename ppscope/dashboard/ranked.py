"""A job of many data-parallel pipelines, shown without loading it: every page of the dashboard, a rank at a time.

Note (when): a run directory is shown this way when it holds more than `RANKS_IN_MEMORY` rank files (or the
number given to `ppscope dashboard --ranks-in-memory`) and its ranks form more than one replica. Below the limit
the dashboard loads the whole run as it always has, so every page works on it unchanged; the limit counts files
because it is known from a directory listing, before anything is read, and a rank file's spans are what fills
memory (the engine's ~100 k spans a rank make ~10 MB as a frame: 256 ranks are ~2.5 GB, what a workstation still
holds, and what loads in well under a minute).

Note (a run still being written): it is not tailed whole. `refresh()` forgets what was read once a rank file
has changed (its size and time, and its write-ahead log's), and the page reads the files again, each alone, as
for a finished run; but never sooner than `READ_SHARE` times the last read's own time after it, so that the
two passes over every file that the rank-by-rank analysis takes use at most about 1/`READ_SHARE` of the time,
however large the run. New rows are not read alone: a stage's figures need its ranks' spans from the window's
start, which moves as the run goes on.

What it holds: the replicas' comparison and each replica's figures (`run_replicas`, which reads one rank file at
a time and keeps a digest of each), the spans of the ranks the stage view draws (each stage's median replica
and its straggler: 2 × P ranks at most), the spans of the one rank last picked for its own lanes, what the
other pages reduce each rank to (the rebalancer's timed parts, the counters' summaries) and the counters of
the one rank last picked. The Compare page shows a large run, as A or as B, from the same replicas' comparison and
stage-view lanes: a run looked at on its own pages is not read again to be compared. This module knows no
Streamlit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pandas as pd

from ppscope.analysis.placement import placement_from
from ppscope.analysis.replica_report import lane_ranks, stage_lanes
from ppscope.analysis.sharded_replicas import RunReplicas, run_replicas
from ppscope.dashboard.charts import usage_rows
from ppscope.errors import CorruptFileError, PPScopeError
from ppscope.trace.counterfile import read_rank_counters
from ppscope.trace.model import RunMeta
from ppscope.trace.store import META_FILE, read_rank_spans, read_requests, run_files

if TYPE_CHECKING:
    from ppscope.balance.measured.timings import RunTimings

__all__ = ["RANKS_IN_MEMORY", "READ_SHARE", "RankedRun"]

T = TypeVar("T")

RANKS_IN_MEMORY = 256
"""A run of replicas with more rank files than this is shown a rank at a time."""
READ_SHARE = 10
"""A run being written is read again no sooner than this many times the last read's time after it."""


@dataclass(frozen=True)
class _Read:
    """A few ranks' spans, and which ranks they are."""

    ranks: tuple[int, ...]
    spans: pd.DataFrame


class RankedRun:
    """One large run directory shown by the dashboard. Thread-safe: every session of the server may share it."""

    def __init__(self, path: Path, meta: RunMeta, files: dict[int, Path]) -> None:
        self.path, self.meta, self.files = path, meta, files
        self._lock = threading.Lock()
        self._run: RunReplicas | None = None
        self._lanes: _Read | None = None
        self._rank: _Read | None = None
        self._counters: tuple[int, pd.DataFrame] | None = None
        self._memo: dict[str, Any] = {}
        self._gates: dict[str, threading.Lock] = {}  # one per memo name: a slow read runs once, the rest wait
        self._generation = 0  # counts the refreshes: what was read before one is not kept after it
        self._stamp = _stamp(path, files)
        self._read_at, self._read_s = time.monotonic(), 0.0

    @classmethod
    def open(cls, path: Path, limit: int = RANKS_IN_MEMORY) -> RankedRun | None:
        """The run at `path` to show a rank at a time, or None when it is to be loaded whole (at most `limit`
        rank files, one pipeline, or unreadable: the whole load then says why)."""
        try:
            meta, files, _ = run_files(path)
            if len(files) <= limit:
                return None
            placement = placement_from(meta, files)
        except PPScopeError:
            return None
        if placement is None or len(placement.replicas) < 2:
            return None
        return cls(path, meta, files)

    def replicas(self) -> RunReplicas:
        """The replicas compared, read a rank at a time, once (raises the PPScopeError of an unreadable run)."""
        with self._lock:
            if self._run is None:
                began = time.monotonic()
                self._run = run_replicas(self.path)
                self._read_at = time.monotonic()
                self._read_s = self._read_at - began
            return self._run

    @property
    def read_s(self) -> float:
        """How long the last read of every rank file (`replicas()`) took."""
        return self._read_s

    @property
    def live(self) -> bool:
        """Whether the run was still being written when it was opened (the page then calls `refresh`)."""
        return self.meta.status == "running"

    def refresh(self, now: float | None = None) -> bool:
        """For a run being written: forget everything read when a rank file or the metadata (the run ended) has
        changed since, and the last read is `READ_SHARE` times its own time old; True when forgotten (the page
        then reads the files again, or opens the run anew once its metadata changed)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if not self.live or now - self._read_at < READ_SHARE * self._read_s:
                return False
            stamp = _stamp(self.path, self.files)
            if stamp == self._stamp:
                return False
            self._stamp, self._run, self._lanes, self._rank, self._counters = stamp, None, None, None, None
            self._memo = {}
            self._generation += 1
            return True

    @property
    def ranks(self) -> list[int]:
        """The ranks that recorded spans (what a whole load would list), once `replicas()` has run."""
        ra = self.replicas().analysis
        missing = set(ra.missing_ranks) if ra is not None else set()
        return [r for r in sorted(self.files) if r not in missing]

    def stage_spans(self) -> pd.DataFrame:
        """The stage view's lanes (`stage_lanes`), from the spans of the ranks it draws alone."""
        run = self.replicas()
        if run.analysis is None or run.placement is None:
            return pd.DataFrame()
        ranks = tuple(sorted({r for r, _ in lane_ranks(run.analysis, run.placement)}))
        with self._lock:
            if self._lanes is None or self._lanes.ranks != ranks:
                spans, _, _ = read_rank_spans(self.files, ranks, self.meta)
                self._lanes = _Read(ranks, stage_lanes(spans, run.analysis, run.placement))
            return self._lanes.spans

    def rank_spans(self, rank: int) -> pd.DataFrame:
        """Every span of one rank, read when it is picked (the last one picked is kept, none before it)."""
        with self._lock:
            if self._rank is None or self._rank.ranks != (rank,):
                self._rank = None  # let the previous rank's spans go before reading the next one's
                spans, _, _ = read_rank_spans(self.files, [rank], self.meta)
                self._rank = _Read((rank,), spans)
            return self._rank.spans

    def memo(self, name: str, fn: Callable[[], T]) -> T:
        """fn(), computed once for this run until a `refresh` lets it go. Two sessions asking at once compute it
        once (a run of 1,000 rank files read twice would take twice the time and memory): the second waits on
        the name's own gate, not on the run's lock, so other pages are not held up. A value whose read began
        before a refresh is returned to its caller but not kept."""
        with self._lock:
            if name in self._memo:
                return cast(T, self._memo[name])
            gate = self._gates.setdefault(name, threading.Lock())
        with gate:
            with self._lock:
                if name in self._memo:
                    return cast(T, self._memo[name])
                generation = self._generation
            value = fn()
            with self._lock:
                if generation == self._generation:
                    self._memo[name] = value
            return value

    def timings(self) -> RunTimings:
        """What the rebalancer reads of the run (`run_timings`: each rank file alone, reduced to its timed
        parts, the parts merged), as `ppscope rebalance RUN` reads it."""
        from ppscope.balance.measured.timings import run_timings

        return self.memo("timings", lambda: run_timings(self.path))

    def usage(self) -> tuple[pd.DataFrame, list[str]]:
        """Each rank's counters summed up (`usage_rows`), read a rank file at a time and without the spans, and
        which rank files could not be read (left out, as a whole load leaves them out)."""
        return self.memo("usage", self._usage)

    def _usage(self) -> tuple[pd.DataFrame, list[str]]:
        parts, damaged = [], []
        for rank in sorted(self.files):
            try:
                parts.append(usage_rows(read_rank_counters(self.files[rank], self.meta)))
            except CorruptFileError as exc:
                damaged.append(f"rank {rank}: {exc}")
        rows = [p for p in parts if len(p)]
        return (pd.concat(rows, ignore_index=True) if rows else usage_rows(pd.DataFrame())), damaged

    def rank_counters(self, rank: int) -> pd.DataFrame:
        """One rank's counters, read when it is picked (the last one picked is kept)."""
        with self._lock:
            if self._counters is None or self._counters[0] != rank:
                self._counters = (rank, read_rank_counters(self.files[rank], self.meta))
            return self._counters[1]

    def requests(self) -> pd.DataFrame:
        """The run's request log (`requests.jsonl`, written by the launcher beside the rank files): no rank file
        is read for it."""
        return self.memo("requests", lambda: read_requests(self.path))


def _stamp(run: Path, files: dict[int, Path]) -> tuple[tuple[int, int], ...]:
    """The size and time of the run's metadata (rewritten when the run ends), of each rank file and of its
    write-ahead log (where a writer's rows wait until SQLite moves them into the file): what changes when a rank
    writes."""
    out = []
    logs = (p for f in sorted(files.values()) for p in (f, f.with_name(f.name + "-wal")))
    for path in (run / META_FILE, *logs):
        try:
            st = path.stat()
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((-1, -1))
    return tuple(out)
