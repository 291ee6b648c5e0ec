"""Read PyTorch profiler (Kineto) traces, one JSON or JSON.gz file per rank, as one Trace.

Events are streamed out of `traceEvents` a chunk of text at a time (`kineto_json.py`), so a large file is
never held as one list of dicts; a job's large files are read by worker processes, one file each. GPU events
(pid = device, tid = stream) go on `stream N` lanes of their file's rank; kernels whose name starts with
`nccl` are communication; `ProfilerStep#N` annotations become steps, and GPU work inherits the step of the
CPU launch that issued it (matched on the correlation id). `ts` is taken as relative to
`baseTimeNanoseconds` when the file has one, else as absolute microseconds. CPU operator events (`cpu_op`,
`cuda_runtime`, `python_function`) are read for correlation only, not kept as spans.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, UnsupportedInputError
from ppscope.formats.kineto_groups import group_placement
from ppscope.formats.kineto_jobs import CLOCK_NOTE, JobFacts, one_job, refuse_empty
from ppscope.formats.kineto_json import NS_LIMIT, UNSET, Args, Event, group_key, iter_event_batches, ns_column
from ppscope.formats.kineto_json import iter_trace_events as iter_trace_events
from ppscope.formats.kineto_pipeline import RankFile, cpu_compute, read_pipeline
from ppscope.formats.kineto_pp import RankEvents, top_level
from ppscope.formats.ordering import order_stages
from ppscope.pool import ordered, processes
from ppscope.trace.model import SPAN_COLUMNS, ClockInfo, RankInfo, RunMeta, SpanKind, Trace, spans_frame

__all__ = ["iter_trace_events", "load_kineto"]

_USED = frozenset(("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "user_annotation", "cpu_op"))
"""The categories of complete events the importer reads; the others are skipped before their times are."""

_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_RANK_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_GPU_KINDS = {"kernel": str(SpanKind.KERNEL), "gpu_memcpy": str(SpanKind.MEMCPY), "gpu_memset": str(SpanKind.MEMSET)}
_P2P = {
    **{"nccl:send": "send", "nccl:recv": "recv", "ncclSend": "send", "ncclRecv": "recv"},
    **{"gloo:send": "send", "gloo:recv": "recv"},
}


@dataclass
class _File:
    """One rank file read: its top-level keys, the spans ppscope keeps as they are, the pipeline's events."""

    top: dict[str, Any]
    spans: pd.DataFrame
    """Spans without rank, stage, mb, chunk, phase, tokens or peer (GPU work, ranges, steps)."""
    events: RankEvents
    p2p: list[tuple[str, int]]
    gpu: bool
    """The file holds GPU activity: kernels are the compute, not the CPU operators."""


def _read_file(path: Path) -> _File:
    """One rank file, times on the common clock (the file's base time added).

    The collector is paused meanwhile: the events decoded make no cycles, and what is kept (the columns'
    lists of names and ids) would otherwise be walked again and again by full collections as it grows (a
    quarter of the time of a 500 k-event file)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _read_events(path)
    finally:
        if paused:
            gc.enable()


def _read_events(path: Path) -> _File:
    top: dict[str, Any] = {}
    cols = _Columns(path)
    for batch in iter_event_batches(path, top):
        cols.add(batch)
    shift = _shift(path, top.get("baseTimeNanoseconds"))
    spans, annotations = _spans(cols, shift)
    ops = cols.ops_frame()
    op_frame = ops.assign(start_ns=ops["start_ns"] + shift, end_ns=ops["end_ns"] + shift)
    flows = np.concatenate(cols.flows) if cols.flows else np.zeros(0, np.int64)
    events = RankEvents(path.name, annotations, op_frame, flows + shift)
    return _File(top, spans, events, [(op, t + shift) for op, t in cols.p2p()], bool(cols.gpu["kind"]))


class _Columns:
    """One file's events gathered a batch at a time, as the columns the importer keeps: a Python list or an
    int64 array per field and batch, made by one comprehension each rather than Python per event and field."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: dict[str, str] = {}  # a name repeated by 100 k operators is held, and sent from a worker, once
        self.memo: dict[str, int] = {}  # durations in ns by their text
        self.ops: tuple[list[str], list[np.ndarray], list[np.ndarray], list[Any]] = ([], [], [], [])
        self.gpu: dict[str, list[Any]] = {k: [] for k in ("kind", "name", "dev", "stream", "corr", "nbytes")}
        self.gpu_times: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
        self.host: list[tuple[Any, ...]] = []
        self.launches: tuple[list[Any], list[np.ndarray]] = ([], [])
        self.flows: list[np.ndarray] = []

    def add(self, batch: list[Event]) -> None:
        """One batch's events, each category's taken by a comprehension of its own; other events are left."""
        x = [e for e in batch if e.ph == "X"]
        if len(x) < len(batch):
            ts = [e.ts for e in batch if e.ph == "s" and e.cat == "fwdbwd"]
            self.flows.append(ns_column(ts, self.path, "flow: ts", lambda: [None] * len(ts)))
        self._ops([e for e in x if e.cat == "cpu_op"])
        self._launches([e for e in x if e.cat == "cuda_runtime"])
        self._gpu([e for e in x if e.cat in _GPU_CATS])
        ranges = [e for e in x if e.cat == "user_annotation"]
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
        g["nbytes"] += [_nbytes(e.args) for e in work]
        self.gpu_times[0].append(start)
        self.gpu_times[1].append(end)

    def ops_frame(self) -> pd.DataFrame:
        names, starts, ends, tids = self.ops
        return pd.DataFrame(
            {"name": pd.Series(names, dtype=object), "start_ns": _joined(starts), "end_ns": _joined(ends),
             "tid": pd.Series(tids, dtype=object)}
        )  # fmt: skip

    def p2p(self) -> list[tuple[str, int]]:
        """("send" or "recv", start_ns) of each point-to-point operator and range: which way the rank's traffic
        goes, and when."""
        names, starts = self.ops[0], _joined(self.ops[1])
        ops = [(_P2P[n], int(starts[i])) for i, n in enumerate(names) if n in _P2P]
        return ops + [(_P2P[h[0]], h[1]) for h in self.host if h[0] in _P2P]

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


def _nbytes(args: Args | None) -> int:
    """The bytes a copy or set moved: an int in int64's range, else 0."""
    n = args.bytes if args is not None else 0
    return n if isinstance(n, int) and -_INT64 <= n < _INT64 else 0


_INT64 = 1 << 63


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _keys(values: list[Any]) -> list[Any]:
    """`group_key` of each pid or tid; a column of plain values as it is."""
    return values if set(map(type, values)) <= {int, str, float, type(None)} else list(map(group_key, values))


_PARALLEL_BYTES = 64 << 20
"""Below this much JSON in all, starting worker processes costs more than reading the files here."""


def _workers(paths: list[Path]) -> int:
    """Processes to read `paths` with: one per file up to the CPUs, when they are large enough to be worth it."""
    if len(paths) < 2 or sum(p.stat().st_size for p in paths) < _PARALLEL_BYTES:
        return 1
    return min(len(paths), os.cpu_count() or 1)


def _read_or_say(path: Path, alone: bool) -> tuple[_File | None, str | None]:
    """`_read_file`, in a worker: (the file, None); (None, None) for a JSON file that is no trace; (None, why)
    for a damaged one. A file given alone raises instead: there is nothing else to read."""
    try:
        return _read_file(path), None
    except UnsupportedInputError:
        if alone:
            raise
        return None, None
    except CorruptFileError as exc:
        if alone:
            raise
        return None, str(exc)


def _shift(path: Path, base: Any) -> int:
    """The file's base time in ns (0 without one): `ts` is relative to it."""
    try:
        shift = int(base) if isinstance(base, (int, str)) and str(base).lstrip("-").isdecimal() else 0
    except ValueError:  # more digits than Python converts
        shift = NS_LIMIT
    if not -NS_LIMIT < shift < NS_LIMIT:
        raise CorruptFileError(f"{path}: baseTimeNanoseconds {base!r} is out of range; the trace is damaged")
    return shift


def _spans(cols: _Columns, shift: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(spans, annotations): GPU work and ranges as spans, a column at a time (a few pandas calls whatever the
    number of events); the ranges also as (name, start_ns, end_ns, tid)."""
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
        "nbytes": np.concatenate([np.array(g["nbytes"], np.int64), np.zeros(len(names), np.int64)]),
        "lane": _gpu_lanes(g["dev"], g["stream"]) + host_lane,
        "step": np.concatenate([_step_at(when, *(a[is_step][order] for a in (h_start, h_end, step))), step]),
        "launch_ns": np.concatenate([when, h_start]) + shift,
    }
    annotations = pd.DataFrame({"name": names, "start_ns": h_start + shift, "end_ns": h_end + shift, "tid": tids})
    # text as Python objects: the names are one object per distinct name (`_Columns.seen`), shared by every span
    # that has it until the job's frame is made, not a string per span
    text = {c: pd.Series(out[c], dtype=object) for c in ("kind", "name", "lane")}
    return pd.DataFrame({**out, **text}), annotations


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


def load_kineto(files: list[Path]) -> Trace:
    """The Kineto trace files (one per rank) as one Trace, ranks ordered into stages."""
    if not files:
        raise UnsupportedInputError("no Kineto trace files given")
    read: dict[int, _File] = {}
    warnings: list[str] = []
    skipped: list[str] = []
    damaged = 0
    paths = sorted(files)
    for path in paths:
        refuse_empty(path)
    with processes(_workers(paths)) as pool:
        outcomes = list(ordered(pool, _read_or_say, [(p, len(files) == 1) for p in paths], os.cpu_count() or 1))
    for i, (path, (data, said)) in enumerate(zip(paths, outcomes, strict=True)):
        if data is None:
            if said is None:
                skipped.append(path.name)  # another JSON file next to the traces (a config, a summary)
            else:  # one damaged file of a job: name it, read the others
                warnings.append(f"left out a damaged file, read the others: {said}")
                damaged += 1
            continue
        _refuse_own_export(path, data.top)
        rank = _rank_of(path, data.top, i, warnings)
        if rank in read:
            raise UnsupportedInputError(f"{path}: rank {rank} appears in two files; give one file per rank")
        read[rank] = data
    if not read:
        folder = Path(files[0]).parent
        raise UnsupportedInputError(f"{folder} holds no traces: none of its JSON files has a traceEvents list")
    if skipped:
        warnings.append(f"skipped {len(skipped)} JSON file(s) without traceEvents: {', '.join(skipped[:5])}")
    keep = one_job({r: JobFacts(d.events.name, d.top, *_extent(d)) for r, d in read.items()}, warnings)
    read = {r: read[r] for r in keep}
    if len(read) > 1:
        warnings.append(CLOCK_NOTE)
    evidence = [(rank, op, t) for rank, data in read.items() for op, t in data.p2p]
    groups = group_placement({r: d.top for r, d in read.items()}, warnings)
    if groups is not None and not set(read) <= set(groups.place):
        warnings.append("some files' ranks are in no pipeline process group: took stages from the traffic instead")
        groups = None
    placed = groups.place if groups is not None else None
    pipeline = read_pipeline({r: RankFile(d.events, d.spans, d.gpu) for r, d in read.items()}, evidence, placed)
    if pipeline is not None:
        stage_of, per_rank = pipeline.stage_of, pipeline.spans
        warnings += pipeline.warnings
        explanation = "stages from the pipelining actions"
    elif groups is not None:
        stage_of, explanation = {r: groups.place[r][0] for r in read}, groups.explanation
        per_rank = {r: _plain(d, stage_of[r]) for r, d in read.items()}
    else:
        order = order_stages(read, evidence, {r: r for r in read}, "rank")
        warnings.append(order.explanation)
        stage_of, explanation = order.stage_of, order.explanation
        per_rank = {r: _plain(d, stage_of[r]) for r, d in read.items()}
    spans = _all_spans(per_rank, stage_of)
    info: dict[str, Any] = next(
        (d.top["distributedInfo"] for d in read.values() if isinstance(d.top.get("distributedInfo"), dict)), {}
    )
    ranks = [
        RankInfo(rank=r, stage=stage_of[r], device="cuda" if read[r].gpu else "cpu", clock=ClockInfo(method="import"))
        for r in read
    ]
    if groups is not None:  # each rank's replica, and the ranks of the job whose files are not here
        place = groups.place
        ranks = [dataclasses.replace(i, replica=place[i.rank][1]) for i in ranks]
        ranks += [RankInfo(rank=r, stage=s, replica=rep) for r, (s, rep) in place.items() if r not in read]
    meta = RunMeta(
        run_id=Path(files[0]).parent.name if len(files) > 1 else Path(files[0]).name.split(".")[0],
        source="kineto",
        status="finished",
        world_size=groups.world_size if groups else len(read) + damaged,  # a damaged file's rank is missing
        pp_size=len({s for s, _ in groups.place.values()}) if groups else len(read),
        schedule=pipeline.schedule if pipeline else "",
        microbatches=pipeline.microbatches if pipeline else 0,
        chunks=pipeline.chunks if pipeline else 1,
        backend=str(info.get("backend", "")),
        ranks=sorted(ranks, key=lambda r: r.rank),
        config={
            "files": [str(f) for f in files],
            "distributedInfo": info,
            "stage_order": explanation,
            **({"replica_placement": groups.explanation} if groups else {}),
            **({"pipelining": pipeline.config} if pipeline else {}),
        },
    )
    return Trace(spans=spans, meta=meta, warnings=warnings).sorted()


def _extent(data: _File) -> tuple[int, int]:
    """The first start and last end of the file's events (0, 0 when it has none)."""
    starts = [frame["start_ns"].min() for frame in (data.spans, data.events.ops) if len(frame)]
    ends = [frame["end_ns"].max() for frame in (data.spans, data.events.ops) if len(frame)]
    return (int(min(starts)), int(max(ends))) if starts else (0, 0)


def _plain(data: _File, stage: int) -> pd.DataFrame:
    """A rank's spans when the trace shows no pipelining actions: GPU work and ranges as they are (their stage,
    micro-batch, chunk, phase and peer filled in by `_all_spans`), and on a CPU trace its top-level operators as
    the compute."""
    if data.gpu:
        return data.spans
    spans = data.spans.assign(stage=stage, **_PLAIN)
    ops = top_level(data.events.ops)
    cpu = cpu_compute(ops, ops["tid"].mode().iloc[0] if len(ops) else None).drop(columns="tid")
    return pd.concat([spans, cpu.assign(stage=stage, step=-1, **_PLAIN)], ignore_index=True)


_PLAIN: dict[str, Any] = {"mb": -1, "chunk": 0, "phase": "", "peer": -1}
"""The columns of a span that no pipelining action places: none of them known."""


def _all_spans(per_rank: dict[int, pd.DataFrame], stage_of: dict[int, int]) -> pd.DataFrame:
    """The ranks' spans as one frame of the schema, built once from each column's arrays (not a frame per rank
    and column); a column a rank's frame lacks is its rank, stage, no tokens or `_PLAIN`'s value."""
    columns: dict[str, Any] = {}
    for c, kind in SPAN_COLUMNS.items():
        kind = object if kind is str else kind
        parts = []
        for r, s in per_rank.items():
            fill = {"rank": r, "stage": stage_of[r], "tokens": 0, **_PLAIN}
            parts.append(s[c].to_numpy(dtype=kind) if c in s.columns else np.full(len(s), fill[c], dtype=kind))
        columns[c] = np.concatenate(parts) if parts else np.zeros(0, kind)
    return spans_frame(columns)


def _refuse_own_export(path: Path, top: dict[str, Any]) -> None:
    """ppscope's Chrome export is a view for Perfetto; read as a Kineto trace it would hold no spans at all."""
    other = top.get("otherData")
    if isinstance(other, dict) and "ppscope_run_id" in other:
        raise UnsupportedInputError(
            f"{path} is ppscope's Chrome/Perfetto export of run {other['ppscope_run_id']}, a view that ppscope "
            "does not read back: analyse the run directory it was exported from"
        )


def _rank_of(path: Path, top: dict[str, Any], index: int, warnings: list[str]) -> int:
    dist = top.get("distributedInfo")
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        return int(dist["rank"])
    m = _RANK_RE.search(path.name)
    if m:
        return int(m.group(1))
    warnings.append(f"{path.name}: no distributedInfo.rank and no rank in the file name; took rank {index}")
    return index
