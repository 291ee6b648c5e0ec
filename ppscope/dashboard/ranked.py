"""A finished job of many data-parallel pipelines, shown without loading it: its stage view a rank at a time.

Note (when): a run directory is shown this way when it holds more than `RANKS_IN_MEMORY` rank files (or the
number given to `ppscope dashboard --ranks-in-memory`), its ranks form more than one replica, and it has
finished. Below the limit the dashboard loads the whole run as it always has, so every page works on it
unchanged; the limit counts files because it is known from a directory listing, before anything is read, and
a rank file's spans are what fills memory (the engine's ~100 k spans a rank make ~10 MB as a frame: 256 ranks
are ~2.5 GB, what a workstation still holds, and what loads in well under a minute). A run still being written
is tailed whole, as before: its figures change every second, and the two passes over every file that the
rank-by-rank analysis takes would be re-read at each refresh.

What it holds: the replicas' comparison and each replica's figures (`run_replicas`, which reads one rank file at
a time and keeps a digest of each), the spans of the ranks the stage view draws (each stage's median replica
and its straggler: 2 × P ranks at most), and the spans of the one rank last picked for its own lanes. This
module knows no Streamlit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pandas as pd

from ppscope.analysis.placement import placement_from
from ppscope.analysis.replica_report import lane_ranks, stage_lanes
from ppscope.analysis.sharded_replicas import RunReplicas, run_replicas
from ppscope.dashboard.charts import usage_rows
from ppscope.errors import CorruptFileError, PPScopeError
from ppscope.trace.counterfile import read_rank_counters
from ppscope.trace.model import RunMeta
from ppscope.trace.store import read_rank_spans, read_requests, run_files

if TYPE_CHECKING:
    from ppscope.balance.timings import RunTimings

__all__ = ["RANKS_IN_MEMORY", "RankedRun"]

T = TypeVar("T")

RANKS_IN_MEMORY = 256
"""A finished run of replicas with more rank files than this is shown a rank at a time."""


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

    @classmethod
    def open(cls, path: Path, limit: int = RANKS_IN_MEMORY) -> RankedRun | None:
        """The run at `path` to show a rank at a time, or None when it is to be loaded whole (at most `limit`
        rank files, still running, one pipeline, or unreadable: the whole load then says why)."""
        try:
            meta, files, _ = run_files(path)
            if len(files) <= limit or meta.status == "running":
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
                self._run = run_replicas(self.path)
            return self._run

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
        """fn(), computed once for this run (a finished run does not change; a new one is a new RankedRun).
        Not under the lock: two sessions asking at once may both compute it, and either answer is kept."""
        if name not in self._memo:
            self._memo[name] = fn()
        return self._memo[name]

    def timings(self) -> RunTimings:
        """What the rebalancer reads of the run (`run_timings`: each rank file alone, reduced to its timed
        parts, the parts merged), as `ppscope rebalance RUN` reads it."""
        from ppscope.balance.timings import run_timings

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
