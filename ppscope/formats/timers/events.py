"""A Chrome trace's events read as columns: the timed operations (`ph: "X"`) and the names of processes and
threads (`ph: "M"`), streamed in batches by the Kineto reader's decoder.

Each batch is one msgspec decode into structs of the few fields read (the name, process, thread, times and
the `args` a timer writes); the columns grow a list per field, turned into numpy arrays once. This module
knows the Chrome trace's shape, not what the names mean (`names.py`).
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pandas as pd

from ppscope.formats.kineto.decode import group_key, iter_chrome_batches
from ppscope.formats.kineto.times import NS_LIMIT

__all__ = ["TimerColumns", "read_columns"]


class _Args(msgspec.Struct, gc=False):
    """The `args` a timer writes (each None where the event has none); `name` is a metadata event's."""

    step: Any = None
    mb_id: Any = None
    model_chunk: Any = None
    pp_rank: Any = None
    tp_rank: Any = None
    dp_rank: Any = None
    name: Any = None


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


_DECODE = msgspec.json.Decoder(list[_Event])
_FIELDS = attrgetter("name", "pid", "tid", "ts", "dur", "args")
_NO_ARGS = _Args()


def _one(item: Any) -> _Event | None:
    """A plain decoded item as an event; None for one that is no event (not an object, odd `args`)."""
    if not isinstance(item, dict):
        return None
    if not isinstance(item.get("args", {}), dict):
        item = {**item, "args": None}
    try:
        return msgspec.convert(item, _Event)
    except msgspec.ValidationError:
        return None


def _events(text: bytes) -> list[_Event]:
    """A batch's events: msgspec's typed decode, else the plain decoder's an item at a time (a
    JSONDecodeError where the text is cut inside an item)."""
    try:
        return _DECODE.decode(text)
    except msgspec.DecodeError:
        pass
    try:
        items = json.loads(text.decode("utf-8"))
    except UnicodeDecodeError as exc:  # the stream reads on a value at a time, and names the damage
        raise json.JSONDecodeError(f"not UTF-8 ({exc.reason})", "", 0) from None
    return [e for e in map(_one, items) if e is not None]


@dataclass
class TimerColumns:
    """The timed events of one file as columns, and the names the metadata gives processes and threads."""

    name: list[Any] = field(default_factory=list)
    pid: list[Any] = field(default_factory=list)
    tid: list[Any] = field(default_factory=list)
    ts: list[Any] = field(default_factory=list)
    dur: list[Any] = field(default_factory=list)
    args: list[_Args] = field(default_factory=list)
    thread_names: dict[tuple[Any, Any], str] = field(default_factory=dict)
    """(pid, tid) -> name, each as a value that groups (`group_key`)."""
    process_names: dict[Any, str] = field(default_factory=dict)
    top: dict[str, Any] = field(default_factory=dict)
    """An object's keys other than `traceEvents`."""

    def add(self, batch: list[_Event]) -> None:
        timed = [e for e in batch if e.ph == "X"]
        if timed:
            name, pid, tid, ts, dur, args = zip(*map(_FIELDS, timed), strict=True)
            self.name += name
            self.pid += pid
            self.tid += tid
            self.ts += ts
            self.dur += dur
            self.args += args
        if len(timed) < len(batch):
            for e in batch:
                if e.ph == "M" and e.args is not None and isinstance(e.args.name, str):
                    if e.name == "thread_name":
                        self.thread_names[(group_key(e.pid), group_key(e.tid))] = e.args.name
                    elif e.name == "process_name":
                        self.process_names[group_key(e.pid)] = e.args.name

    def lanes(self) -> tuple[list[tuple[Any, Any]], npt.NDArray[np.int64], list[int]]:
        """The distinct (pid, tid) lanes, as values that group, in order of first event; each event's lane, and
        each lane's first event."""
        pid, pids = _factorized(self.pid)
        tid, tids = _factorized(self.tid)
        first, code = np.unique(pid * len(tids) + tid, return_index=True, return_inverse=True)[1:]
        order = np.argsort(first)  # lanes in the order their first events came
        rank = np.empty(len(order), np.int64)
        rank[order] = np.arange(len(order))
        lanes = [(pids[int(k) // len(tids)], tids[int(k) % len(tids)]) for k in (pid * len(tids) + tid)[first[order]]]
        return lanes, rank[code.reshape(-1)], first[order].tolist()

    def times_ns(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """Start and end in ns (µs floats rounded to the ns), and which events have both as numbers."""
        ts, dur = _floats(self.ts), _floats(self.dur)
        ok = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0) & (np.abs(ts) < _US_LIMIT) & (dur < _US_LIMIT)
        ts, dur = np.where(ok, ts, 0.0), np.where(ok, dur, 0.0)
        start = np.rint(ts * 1000).astype(np.int64)
        return start, start + np.rint(dur * 1000).astype(np.int64), ok

    def ints(self, *keys: str) -> list[npt.NDArray[np.int64]]:
        """Integer `args` fields of every event, one array per key, -1 where an event has none (or not an
        integer). Timers write every field (-1 for none): then one conversion of C makes all of them."""
        n = len(self.args)
        try:
            values = chain.from_iterable(map(attrgetter(*keys), self.args)) if len(keys) > 1 else None
            rows = np.fromiter(values or map(attrgetter(*keys), self.args), np.int64, n * len(keys))
            return [rows[i :: len(keys)] for i in range(len(keys))]
        except (AttributeError, TypeError, ValueError, OverflowError):  # a field missing, null, text, huge
            pass
        return [self._ints(key) for key in keys]

    def _ints(self, key: str) -> npt.NDArray[np.int64]:
        values = [None if a is None else getattr(a, key) for a in self.args]
        return np.array([v if type(v) is int and -(1 << 62) < v < 1 << 62 else -1 for v in values], np.int64)


_US_LIMIT = NS_LIMIT / 2000
"""µs beyond which a time is damage: a start plus a duration in ns still fit int64."""


def _factorized(values: list[Any]) -> tuple[npt.NDArray[np.int64], list[Any]]:
    """Codes of `values` into their distinct values (as `group_key` makes them)."""
    try:
        codes, uniques = pd.factorize(np.array([*values, None], dtype=object)[:-1], use_na_sentinel=False)
    except TypeError:  # a list or an object where a number belongs
        keys = np.array([*map(group_key, values), None], dtype=object)[:-1]
        codes, uniques = pd.factorize(keys, use_na_sentinel=False)
    return codes.astype(np.int64), [group_key(u) for u in uniques]


def _floats(values: list[Any]) -> npt.NDArray[np.float64]:
    """Numbers as floats, NaN for anything else (text, null, a list)."""
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        ok = (int, float)
        return np.array([float(v) if type(v) in ok else np.nan for v in values], dtype=np.float64)


def read_columns(path: Path) -> TimerColumns:
    """The file's events as columns (an object's other keys in `top`)."""
    cols = TimerColumns()
    paused = gc.isenabled()
    gc.disable()  # the events make no cycles; the growing lists would be walked again and again (as Kineto's)
    try:
        for batch in iter_chrome_batches(path, cols.top, _events, _one):
            cols.add(batch)
    finally:
        if paused:
            gc.enable()
    return cols
