"""One Kineto rank file's events as columns: what `ppscope.formats.kineto.reader` keeps of each batch of decoded
events (`decode.iter_event_batches`), and the file's spans made from them once.

Each field of a batch's events is taken by one comprehension (and times turned into ns by `ns_column`), not
by Python per event and field; a file's spans are columns made with a few numpy calls whatever the number of
events, and become a frame only where a step needs one (the job's frame is made from every file's columns at
once). Values that pandas converts as a column (None among ints, say) still go through pandas, so lanes and
counts are what a frame of the events gives.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ppscope.formats.kineto.decode import UNSET, Event, group_key
from ppscope.formats.kineto.times import ns_column
from ppscope.trace.model import SpanKind

__all__ = ["P2P", "Columns"]

_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_GPU_KINDS = {"kernel": str(SpanKind.KERNEL), "gpu_memcpy": str(SpanKind.MEMCPY), "gpu_memset": str(SpanKind.MEMSET)}
P2P = {
    **{"nccl:send": "send", "nccl:recv": "recv", "ncclSend": "send", "ncclRecv": "recv"},
    **{"gloo:send": "send", "gloo:recv": "recv"},
}


class Columns:
    """One file's events gathered a batch at a time, as the columns the importer keeps: a Python list or an
    int64 array per field and batch, made by one comprehension each rather than Python per event and field."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: dict[str, str] = {}  # a name repeated by 100 k operators is held, and sent from a worker, once
        self.memo: dict[str, int] = {}  # durations in ns by their text
        self.ops: tuple[list[str], list[np.ndarray], list[np.ndarray], list[Any]] = ([], [], [], [])
        self.gpu: dict[str, list[Any]] = {k: [] for k in ("kind", "name", "dev", "stream", "corr")}
        self.gpu_times: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
        self.gpu_bytes: list[np.ndarray] = []
        self.host: list[tuple[Any, ...]] = []
        self.launches: tuple[list[Any], list[np.ndarray]] = ([], [])
        self.flows: list[np.ndarray] = []

    def add(self, batch: list[Event]) -> None:
        """One batch's events, sorted into their categories in one pass and each category's fields taken by
        comprehensions of their own; other events are left."""
        ops: list[Event] = []
        runtime: list[Event] = []
        gpu: list[Event] = []
        ranges: list[Event] = []
        flows: list[Any] = []
        into = {"cpu_op": ops, "cuda_runtime": runtime, **dict.fromkeys(_GPU_CATS, gpu), "user_annotation": ranges}
        for e in batch:
            cat = e.cat
            if type(cat) is not str:  # no category one is read from (a list, say, which no dict key can be)
                continue
            if e.ph == "X":
                kept = into.get(cat)
                if kept is not None:
                    kept.append(e)
            elif e.ph == "s" and cat == "fwdbwd":
                flows.append(e.ts)
        if flows:
            self.flows.append(ns_column(flows, self.path, "flow: ts", lambda: [None] * len(flows)))
        self._ops(ops)
        self._launches(runtime)
        self._gpu(gpu)
        if ranges:
            names = self._names(ranges)
            start, end = self._times(ranges, names)
            tids = [group_key(e.tid) for e in ranges]
            self.host += zip(names, start.tolist(), end.tolist(), tids, strict=True)

    def _names(self, events: list[Event]) -> list[str]:
        """The events' names, one object per distinct name; a name of another type than text as its text."""
        names = [e.name for e in events]
        if set(map(type, names)) <= {str}:
            return list(map(self.seen.setdefault, names, names))
        return [self.seen.setdefault(n, n) if type(n) is str else str(n) for n in names]

    def _times(self, events: list[Event], names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        start = ns_column([e.ts for e in events], self.path, "ts", lambda: names)
        return start, start + ns_column([e.dur for e in events], self.path, "dur", lambda: names, self.memo)

    def _ops(self, ops: list[Event]) -> None:
        if not ops:
            return
        names = self._names(ops)
        start, end = self._times(ops, names)
        self.ops[0].extend(names)
        self.ops[1].append(start)
        self.ops[2].append(end)
        self.ops[3].extend(_keys([e.tid for e in ops]))

    def _launches(self, runtime: list[Event]) -> None:
        """Only when each launch was: its GPU work takes the step it falls in."""
        if runtime:
            start = ns_column([e.ts for e in runtime], self.path, "ts", lambda: self._names(runtime))
            self.launches[0].extend(e.args.correlation if e.args is not None else None for e in runtime)
            self.launches[1].append(start)

    def _gpu(self, work: list[Event]) -> None:
        if not work:
            return
        names = self._names(work)
        start, end = self._times(work, names)
        g = self.gpu
        g["kind"] += [_GPU_KINDS[e.cat] for e in work]
        g["name"] += names
        g["dev"] += _keys([e.pid for e in work])
        g["stream"] += _keys([e.tid for e in work])
        g["corr"] += [-1 if e.args is None or e.args.correlation is UNSET else e.args.correlation for e in work]
        self.gpu_bytes.append(_nbytes([e.args.bytes if e.args is not None else 0 for e in work]))
        self.gpu_times[0].append(start)
        self.gpu_times[1].append(end)

    def spans(self, shift: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(spans, ranges) as columns, times moved by `shift` ns: GPU work and ranges as spans (kind, name,
        lane as lists of text; start_ns, end_ns, nbytes, step, launch_ns as int64 arrays), a column at a time
        whatever the number of events; the ranges also as (name, start_ns, end_ns, tid)."""
        return _spans(self, shift)

    def operators(self, shift: int) -> dict[str, Any]:
        """The CPU operators as columns (name, start_ns, end_ns, tid), times moved by `shift` ns."""
        names, starts, ends, tids = self.ops
        return {"name": names, "start_ns": _joined(starts) + shift, "end_ns": _joined(ends) + shift, "tid": tids}

    def p2p(self) -> list[tuple[str, int]]:
        """("send" or "recv", start_ns) of each point-to-point operator and range: which way the rank's traffic
        goes, and when."""
        names, starts = self.ops[0], _joined(self.ops[1])
        ops = [(P2P[n], int(starts[i])) for i, n in enumerate(names) if n in P2P]
        return ops + [(P2P[h[0]], h[1]) for h in self.host if h[0] in P2P]

    def launch_times(self) -> np.ndarray:
        """When each GPU event was launched: its CPU launch's start (the same correlation id, the last launch
        with it), else its own start."""
        corr, start = self.gpu["corr"], _joined(self.gpu_times[0])
        keys, when = self.launches[0], _joined(self.launches[1])
        if not keys:
            return start
        if set(map(type, corr)) <= {int} and set(map(type, keys)) <= {int}:
            try:
                return _lookup(np.array(corr, np.int64), start, np.array(keys, np.int64), when)
            except OverflowError:  # an id beyond int64: below
                pass
        launches = {c: int(t) for c, t in zip(keys, when, strict=True) if isinstance(c, int)}
        return np.array(
            [launches.get(c, s) if isinstance(c, int) else s for c, s in zip(corr, start.tolist(), strict=True)],
            dtype=np.int64,
        )


def _lookup(corr: np.ndarray, start: np.ndarray, keys: np.ndarray, when: np.ndarray) -> np.ndarray:
    """`launch_times` for integer ids: the last launch of each id found by a binary search."""
    last = len(keys) - 1 - np.unique(keys[::-1], return_index=True)[1]  # the last launch of each distinct id
    order = last[np.argsort(keys[last], kind="stable")]
    ids, at = keys[order], when[order]
    i = np.clip(np.searchsorted(ids, corr), 0, len(ids) - 1)
    return np.where(ids[i] == corr, at[i], start)


def _nbytes(values: list[Any]) -> np.ndarray:
    """The bytes each copy or set moved: an int in int64's range, else 0."""
    if set(map(type, values)) <= {int}:
        try:
            return np.array(values, np.int64)
        except OverflowError:  # beyond int64: a value at a time
            pass
    return np.array([n if isinstance(n, int) and -_INT64 <= n < _INT64 else 0 for n in values], np.int64)


_INT64 = 1 << 63


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _keys(values: list[Any]) -> list[Any]:
    """`group_key` of each pid or tid; a column of plain values as it is."""
    return values if set(map(type, values)) <= {int, str, float, type(None)} else list(map(group_key, values))


def _spans(cols: Columns, shift: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """`Columns.spans`."""
    g = cols.gpu
    names, starts, ends, tids = (list(c) for c in zip(*cols.host, strict=True)) if cols.host else ([], [], [], [])
    h_start, h_end = np.array(starts, np.int64), np.array(ends, np.int64)
    steps = [_STEP_RE.match(name) for name in names]
    is_step = np.array([m is not None for m in steps], bool)
    step = np.array([_step_number(m.group(1)) if m else -1 for m in steps], np.int64)
    threads = _distinct([t for t, s in zip(tids, is_step, strict=True) if not s])
    host_lane = ["host" if s or threads <= 1 else t for s, t in zip(is_step, _prefixed("host ", tids), strict=True)]
    # GPU work takes the step of the CPU launch that issued it, else of its own start time.
    order = np.argsort(h_start[is_step], kind="quicksort")  # as pandas sorted them
    when = cols.launch_times()
    g_start, g_end = _joined(cols.gpu_times[0]), _joined(cols.gpu_times[1])
    nccl = [k == _KERNEL and n.startswith(("nccl", "void nccl")) for k, n in zip(g["kind"], g["name"], strict=True)]
    out = {
        "kind": [str(SpanKind.NCCL) if c else k for k, c in zip(g["kind"], nccl, strict=True)]
        + [str(SpanKind.STEP) if s else str(SpanKind.RANGE) for s in is_step],
        "name": g["name"] + names,
        "start_ns": np.concatenate([g_start, h_start]) + shift,
        "end_ns": np.concatenate([g_end, h_end]) + shift,
        "nbytes": np.concatenate([_joined(cols.gpu_bytes), np.zeros(len(names), np.int64)]),
        "lane": _gpu_lanes(g["dev"], g["stream"]) + host_lane,
        "step": np.concatenate([_step_at(when, *(a[is_step][order] for a in (h_start, h_end, step))), step]),
        "launch_ns": np.concatenate([when, h_start]) + shift,
    }
    return out, {"name": names, "start_ns": h_start + shift, "end_ns": h_end + shift, "tid": tids}


_KERNEL = str(SpanKind.KERNEL)


def _gpu_lanes(dev: list[Any], stream: list[Any]) -> list[str]:
    """`stream N`, or `gpu D stream N` when the file holds more than one device."""
    if _as_is(dev) and _as_is(stream):
        lanes = _prefixed("stream ", stream)
        return (
            lanes if len(set(dev)) <= 1 else [d + " " + x for d, x in zip(_prefixed("gpu ", dev), lanes, strict=True)]
        )
    devices, lane = pd.Series(dev), "stream " + pd.Series(stream).astype(str)  # None or NaN among them: NaN lanes
    return list(("gpu " + devices.astype(str) + " " + lane) if devices.nunique() > 1 else lane)


def _as_is(values: list[Any]) -> bool:
    """Values that pandas keeps as they are in a column (no None to turn ints into floats)."""
    kinds = set(map(type, values))
    return kinds <= {int} or kinds <= {str}


def _distinct(values: list[Any]) -> int:
    """How many distinct values, as pandas' `nunique` counts them (None and NaN not counted)."""
    return len(set(values)) if _as_is(values) else int(pd.Series(values).nunique())


def _prefixed(prefix: str, values: list[Any]) -> list[str]:
    """`prefix` and each value as the text pandas gives it in a column (`astype(str)`); each distinct value's
    made once."""
    if not _as_is(values):
        return list(prefix + pd.Series(values).astype(str))
    text: dict[Any, str] = {}
    return [text[v] if v in text else text.setdefault(v, prefix + str(v)) for v in values]


def _step_number(digits: str) -> int:
    """The N of `ProfilerStep#N` (any digits the pattern takes; -1 where they are no number pandas reads)."""
    if digits.isascii() and len(digits) < 19:
        return int(digits)
    return int(pd.to_numeric(pd.Series([digits]), errors="coerce").fillna(-1).astype(np.int64).iloc[0])


def _step_at(times: np.ndarray, starts: np.ndarray, ends: np.ndarray, numbers: np.ndarray) -> np.ndarray:
    """The number of the step (given in start order) each time falls in, -1 for none."""
    out = np.full(len(times), -1, dtype=np.int64)
    if not len(starts) or not len(times):
        return out
    i = np.searchsorted(starts, times, side="right") - 1
    ok = (i >= 0) & (times <= ends[np.clip(i, 0, None)])
    out[ok] = numbers[i[ok]]
    return out
