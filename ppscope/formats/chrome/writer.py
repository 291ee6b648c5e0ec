"""Write a Trace as Chrome trace-event JSON for Perfetto and chrome://tracing.

One process per rank named `rank r / stage s` (sorted by stage), one thread per lane. Slices on one
thread must nest, so a lane whose spans overlap without nesting is split into `lane`, `lane #2`, ...
Each send gets a flow arrow to its matching receive (`ph` s/f, same id, cat and name, `bp: "e"`), and
counters become counter tracks (`ph` C). Times are µs relative to the first span with ns precision.
The file is gzipped when its name ends in `.gz`. This module does not read Chrome traces.

The file is written a rank at a time, from a trace in memory or a run directory alike (`ranks`):
the processes first, then each rank's threads, slices, arrows (the starts of those it sends, the ends of
those it receives) and counters, the JSON text streamed to the file. Thread ids, times and arrow ids are
those a first pass over the ranks settles (`ExportPlan`), so the two sources give the same bytes.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ppscope.formats.chrome.ranks import (
    RECV_KINDS,
    ExportPlan,
    RankSource,
    RunRanks,
    TraceRanks,
    match_flows,
    with_levels,
)
from ppscope.trace.model import SpanKind, Trace
from ppscope.trace.outputs import atomic_file
from ppscope.trace.store import damaged_note

__all__ = ["export_chrome", "export_chrome_run", "match_flows"]

_LANE_ORDER = {"compute": 0, "recv": 1, "send": 2, "host": 3}
_BATCH = 20_000
"""Events turned into JSON text at a time: the text of one batch is what the writer holds."""


def export_chrome(trace: Trace, out: str | Path, *, force: bool = False) -> Path:
    """Write `trace` to `out` (gzip when it ends in `.gz`). Refuses an existing file unless `force`."""
    source = TraceRanks(trace)
    return _write(source, ExportPlan.of(source), Path(out), force)


def export_chrome_run(run_dir: str | Path, out: str | Path, *, force: bool = False) -> Path:
    """`export_chrome(load_run(run_dir))`, the same bytes, reading one rank file at a time: twice (`ExportPlan`, then
    the events), and each link's sends and receives alone twice more (filtered queries: to count its arrows,
    then to pair them again at its other end). Memory holds one rank's spans and counters and one link's far
    side. A damaged rank file is left out and named on stderr, as `load_run` does."""
    source = RunRanks(run_dir)
    plan = ExportPlan.of(source)
    if source.damaged and len(source.damaged) == len(source.files):
        raise next(iter(source.damaged.values()))
    for note in source.notes + [damaged_note(r, why) for r, why in sorted(source.damaged.items())]:
        print(f"ppscope export: note: {note}", file=sys.stderr)
    return _write(source, plan, Path(out), force)


def _write(source: RankSource, plan: ExportPlan, out: Path, force: bool) -> Path:
    """The document `{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}`, its events written
    as they are made, through a temporary file renamed into place once whole."""
    gz = out.name.endswith(".gz")
    with atomic_file(out, force=force) as tmp, gzip.open(tmp, "wb", compresslevel=6) if gz else open(tmp, "wb") as f:
        f.write(b'{"traceEvents":[')
        written = _write_events(f.write, _processes(plan), first=True)
        for rank, spans, counters in source.each():
            written = _write_events(f.write, _rank_events(source, plan, rank, spans, counters), first=not written)
        f.write(b'],"displayTimeUnit":"ns","otherData":' + _json(_other(plan)) + b"}")
    return out


def _write_events(write: Callable[[bytes], object], events: Iterable[dict[str, Any]], *, first: bool) -> bool:
    """Write `events` as JSON list items (after a comma unless `first`), a batch at a time; whether any was."""
    batch: list[dict[str, Any]] = []
    any_written = not first
    for event in events:
        batch.append(event)
        if len(batch) == _BATCH:
            write((b"," if any_written else b"") + _json(batch)[1:-1])
            batch, any_written = [], True
    if batch:
        write((b"," if any_written else b"") + _json(batch)[1:-1])
        any_written = True
    return any_written


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _other(plan: ExportPlan) -> dict[str, Any]:
    meta = plan.meta
    return {"ppscope_run_id": meta.run_id, "source": meta.source, "schedule": meta.schedule, "split": meta.split}


def _us(ns: np.ndarray | int, t0: int) -> Any:
    return np.round((np.asarray(ns, dtype=np.int64) - t0) / 1000.0, 3)


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def _processes(plan: ExportPlan) -> Iterator[dict[str, Any]]:
    """A name and a place for every rank's process: by stage, ranks of no known stage last."""
    for rank, stage in sorted(plan.stages.items()):
        label = f"rank {rank} / stage {stage}" if stage >= 0 else f"rank {rank}"
        yield _meta("process_name", rank, 0, {"name": label})
        yield _meta("process_sort_index", rank, 0, {"sort_index": stage if stage >= 0 else 10_000 + rank})


def _rank_events(
    source: RankSource, plan: ExportPlan, rank: int, spans: pd.DataFrame, counters: pd.DataFrame
) -> Iterator[dict[str, Any]]:
    """One rank's events: its threads, slices, the arrows it sends and receives, its counters."""
    if len(spans):
        spans = with_levels(spans)
        tids = _thread_ids(spans, plan.first_tid[rank])
        for (lane, level), tid in tids.items():
            name = lane if level == 0 else f"{lane} #{level + 1}"
            yield _meta("thread_name", rank, tid, {"name": name})
            yield _meta("thread_sort_index", rank, tid, {"sort_index": tid})
        yield from _slices(spans, plan.t0, tids)
        yield from _arrows(source, plan, rank, spans, tids)
    yield from _counters(counters, plan.t0)


def _thread_ids(spans: pd.DataFrame, first: int) -> dict[tuple[str, int], int]:
    """A thread id for each (lane, level) of one rank, numbered on from `first`: lanes in their usual order."""
    threads = spans[["lane", "lvl"]].drop_duplicates()
    threads = threads.assign(order=threads["lane"].map(lambda n: _LANE_ORDER.get(n, 4)))
    threads = threads.sort_values(["order", "lane", "lvl"])
    pairs = zip(threads["lane"].astype(str), threads["lvl"].astype(int), strict=True)
    return {(lane, level): first + i + 1 for i, (lane, level) in enumerate(pairs)}


def _slices(spans: pd.DataFrame, t0: int, tids: dict[tuple[str, int], int]) -> Iterator[dict[str, Any]]:
    ts = _us(spans["start_ns"].to_numpy(), t0)
    dur = np.round((spans["end_ns"].to_numpy() - spans["start_ns"].to_numpy()) / 1000.0, 3)
    for s, t, d in zip(spans.itertuples(index=False), ts.tolist(), dur.tolist(), strict=True):
        tid = tids[str(s.lane), int(s.lvl)]
        args = {"stage": int(s.stage), "mb": int(s.mb), "step": int(s.step), "chunk": int(s.chunk)}
        if s.phase:
            args["phase"] = s.phase
        for key in ("nbytes", "tokens"):
            if getattr(s, key):
                args[key] = int(getattr(s, key))
        if s.peer >= 0:
            args["peer"] = int(s.peer)
        if s.kind == SpanKind.MARK:
            yield {"ph": "i", "s": "t", "name": s.name, "cat": s.kind, "pid": int(s.rank), "tid": tid, "ts": t}
        else:
            yield {
                "ph": "X",
                "name": s.name,
                "cat": s.kind,
                "pid": int(s.rank),
                "tid": tid,
                "ts": t,
                "dur": d,
                "args": args,
            }


def _arrows(
    source: RankSource, plan: ExportPlan, rank: int, spans: pd.DataFrame, tids: dict[tuple[str, int], int]
) -> Iterator[dict[str, Any]]:
    """The start of each arrow this rank sends (at its send's start) and the end of each it receives (at its
    receive's last ns: when the data had arrived, still inside the slice `bp: e` binds to)."""
    kind, peer = spans["kind"], spans["peer"].to_numpy()
    for dst in plan.sends_to.get(rank, []):
        if (rank, dst) in plan.links:
            own = spans[((kind == SpanKind.SEND).to_numpy() & (peer == dst))].reset_index(drop=True)
            picked = [(i, s) for i, s, _ in plan.arrows(rank, dst, own, source.receives(dst, rank))]
            yield from _ends(own, picked, plan.t0, tids, {"ph": "s"}, own["start_ns"].to_numpy())
    for src in plan.recv_from.get(rank, []):
        if (src, rank) in plan.links:
            own = spans[(kind.isin(RECV_KINDS).to_numpy() & (peer == src))].reset_index(drop=True)
            picked = [(i, r) for i, _, r in plan.arrows(src, rank, source.sends(src, rank), own)]
            at = np.maximum(own["start_ns"].to_numpy(), own["end_ns"].to_numpy() - 1)
            yield from _ends(own, picked, plan.t0, tids, {"ph": "f", "bp": "e"}, at)


def _ends(
    own: pd.DataFrame,
    picked: list[tuple[int, int]],
    t0: int,
    tids: dict[tuple[str, int], int],
    kind: dict[str, str],
    at: np.ndarray,
) -> Iterator[dict[str, Any]]:
    """One end of each (arrow id, row of `own`) in `picked`, at `at` of its row."""
    lane, level, rank = own["lane"].astype(str).to_numpy(), own["lvl"].to_numpy(), own["rank"].to_numpy()
    ts = _us(at, t0).tolist()
    for flow_id, row in picked:
        tid = tids[str(lane[row]), int(level[row])]
        yield {"cat": "p2p", "name": "send", "id": flow_id, **kind, "pid": int(rank[row]), "tid": tid, "ts": ts[row]}


def _counters(counters: pd.DataFrame, t0: int) -> Iterator[dict[str, Any]]:
    ts = _us(counters["ts_ns"].to_numpy(), t0).tolist()
    for c, t in zip(counters.itertuples(index=False), ts, strict=True):
        name = str(c.metric) if c.device < 0 else f"{c.metric} gpu{int(c.device)}"
        yield {"ph": "C", "name": name, "pid": int(c.rank), "ts": t, "args": {str(c.metric): float(c.value)}}
