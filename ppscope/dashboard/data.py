"""Loading for the dashboard: a run is tailed incrementally, an import is read once, results are memoised.

`LiveTrace.refresh()` asks the run store only for rows written since the last call (`RunTail`), appends
them, and bumps `version` when something arrived, so a page refreshing every second never re-reads a run.
A run that is deleted or damaged while shown keeps its last good data and reports the problem in `error`.
This module knows no Streamlit and computes nothing about pipelines: callers pass the functions to memoise.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from ppscope.errors import PPScopeError, RunNotFoundError
from ppscope.formats.sources import open_trace
from ppscope.trace.model import RunMeta, Trace
from ppscope.trace.store import RunTail, read_meta

__all__ = ["LiveTrace"]

T = TypeVar("T")


class LiveTrace:
    """One trace shown by the dashboard. Thread-safe: every session of the server may share one instance."""

    def __init__(self, path: Path, *, is_run: bool) -> None:
        self.path = path
        self.is_run = is_run
        self.version = 0
        """Increases whenever new spans, counters or requests arrive (or the trace is reloaded)."""
        self.error = ""
        """Why the last refresh failed (deleted, truncated, damaged); empty when it worked."""
        self.gone = False
        """The run directory no longer exists: nothing more will arrive."""
        self._lock = threading.Lock()
        self._tail: RunTail | None = None
        self._identity: tuple[object, ...] = ()
        self._parts: dict[str, list[pd.DataFrame]] = {"spans": [], "counters": [], "requests": []}
        self._trace = Trace()
        self._loaded = False
        self._memo: dict[str, tuple[int, Any]] = {}

    @property
    def meta(self) -> RunMeta:
        return self._trace.meta

    @property
    def trace(self) -> Trace:
        """The trace as of the last `refresh()` (reads nothing)."""
        return self._trace

    @property
    def live(self) -> bool:
        """True while the run is being written: the page keeps refreshing."""
        return self.is_run and self._trace.meta.status == "running" and not self.gone

    def refresh(self) -> Trace:
        """Read what arrived since the last call and return the whole trace so far (cheap when nothing did)."""
        with self._lock:
            if self._loaded and not self.is_run:
                return self._trace
            try:
                if self.is_run:
                    self._poll()
                else:
                    self._trace = open_trace(self.path)
                    self.version += 1
                self._loaded = True
                self.error = ""
            except PPScopeError as exc:
                self.error = f"{exc} (showing what was read before)" if self._loaded else str(exc)
                self.gone = isinstance(exc, RunNotFoundError)
                self._follow_status()
            except OSError as exc:  # the directory vanished between the checks and the reads
                self.error = f"{self.path}: cannot be read ({exc.strerror or exc})"
                self.gone = not self.path.exists()
            return self._trace

    def _follow_status(self) -> None:
        """After a failed read, still learn whether the run goes on: a rank file that is being created
        reads as damaged for a moment, and the page must keep refreshing until the run says it ended."""
        if not self.is_run or self.gone:
            return
        try:
            meta = read_meta(self.path)
        except (PPScopeError, OSError):
            return
        if meta != self._trace.meta:
            self._trace = dataclasses.replace(self._trace, meta=meta)
            self.version += 1

    def memo(self, name: str, fn: Callable[[Trace], T]) -> T:
        """fn(trace), computed once per version of the trace (so each refresh recomputes only after new data)."""
        with self._lock:
            hit = self._memo.get(name)
            if hit is not None and hit[0] == self.version:
                return hit[1]
            trace, version = self._trace, self.version
        value = fn(trace)
        with self._lock:
            self._memo[name] = (version, value)
        return value

    def _poll(self) -> None:
        if self._tail is None:
            self._tail = RunTail(self.path)
        delta = self._tail.poll()
        if self._loaded and _identity(delta.meta) != self._identity:
            # Clock offsets changed after rows were read with the old ones, or the run was replaced by
            # another one at the same path (row ids restart): read everything again, once.
            self._tail = RunTail(self.path)
            self._parts = {"spans": [], "counters": [], "requests": []}
            self._trace = Trace(meta=delta.meta)
            delta = self._tail.poll()
            self.version += 1
        self._identity = _identity(delta.meta)
        grew = False
        for name in self._parts:
            frame = getattr(delta, name)
            if len(frame):
                self._parts[name].append(frame)
                grew = True
        if grew:
            self._trace = Trace(
                spans=_joined(self._parts["spans"], self._trace.spans),
                counters=_joined(self._parts["counters"], self._trace.counters),
                requests=_joined(self._parts["requests"], self._trace.requests),
                meta=delta.meta,
                warnings=list(delta.warnings),
            ).sorted()
            self.version += 1
        elif not self._loaded or delta.meta != self._trace.meta or delta.warnings != self._trace.warnings:
            self._trace = dataclasses.replace(self._trace, meta=delta.meta, warnings=list(delta.warnings))
            self.version += 1


def _identity(meta: RunMeta) -> tuple[object, ...]:
    """What makes rows already read still valid: the same run, with the same clock offsets."""
    offsets = tuple(
        sorted((info.rank, info.clock.offset_ns, info.clock.at_ns, info.clock.drift_ppm) for info in meta.ranks)
    )
    return (meta.run_id, meta.created_unix_ns, offsets)


def _joined(parts: list[pd.DataFrame], empty: pd.DataFrame) -> pd.DataFrame:
    """Concatenate the deltas read so far, collapsed to one frame so later joins stay cheap."""
    if not parts:
        return empty.iloc[0:0]
    if len(parts) > 1:
        parts[:] = [pd.concat(parts, ignore_index=True)]
    return parts[0]
