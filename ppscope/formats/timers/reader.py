"""Read a Chrome trace of pipeline operations timed by the training job itself (Megatron-style timers) as a
Trace: one span per timed operation, on the rank of the (stage, replica, TP rank) its lane names.

The file is a bare JSON array of events or an object with `traceEvents`, gzip or not, streamed in batches
(`events.py`). What each name means is `names.py`'s; which rank a lane is, `layout.py`'s. A Chrome trace
without a forward or backward compute event is refused in one line: it is no trace of pipeline operations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppscope.errors import UnsupportedInputError
from ppscope.formats.timers.events import TimerColumns, read_columns
from ppscope.formats.timers.layout import Layout, lane_layout
from ppscope.formats.timers.names import PIPELINE_NAMES, TimerOp, op_of
from ppscope.trace.model import ClockInfo, RankInfo, RunMeta, SpanKind, Trace, spans_frame
from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["load_timers"]


def load_timers(path: Path) -> Trace:
    """The timer trace at `path` as one Trace of every rank it names."""
    cols = read_columns(path)
    names, name_code = _codes(cols.name)
    ops = [op_of(n) for n in names]
    if not PIPELINE_NAMES.intersection(names):
        raise UnsupportedInputError(_not_a_pipeline(path, cols, names))
    lanes, lane_code, first = cols.lanes()
    layout = lane_layout(cols, lanes, first)
    warnings = list(layout.notices)
    start, end, ok = cols.times_ns()
    rank = layout.rank_of_lane[lane_code]
    keep = ok & (rank >= 0)
    if not ok.all():
        text = f"left out {int((~ok).sum())} timed event(s) without a numeric ts and dur ≥ 0"
        warnings.append(Notice(NoticeCode.TIMER_EVENTS_LEFT_OUT, text))
    idx = np.flatnonzero(keep)
    op_code = name_code[idx]
    columns, stages, chunks = _columns(cols, layout, ops, names, op_code, idx, rank[idx])
    columns.update(start_ns=start[idx], end_ns=end[idx])
    meta = _meta(path, layout, columns, stages, chunks)
    return Trace(spans=spans_frame(columns), meta=meta, warnings=warnings).sorted()


def _codes(values: list[Any]) -> tuple[list[str], npt.NDArray[np.intp]]:
    """Event names as codes into their distinct values (as text)."""
    codes, uniques = pd.factorize(np.array(values, dtype=object), sort=False)
    return [str(u) for u in uniques], codes


def _columns(
    cols: TimerColumns,
    layout: Layout,
    ops: list[TimerOp],
    names: list[str],
    op_code: npt.NDArray[np.intp],
    idx: npt.NDArray[np.int64],
    rank: npt.NDArray[np.int64],
) -> tuple[dict[str, Any], int, int]:
    """The span columns but times, and the physical stages P and model chunks V."""
    place = np.array([layout.place[r] for r in range(max(layout.place) + 1)] if layout.place else [], np.int64)
    pp, replica, tp = (place[rank, i] if len(place) else np.zeros(len(rank), np.int64) for i in range(3))
    step, mb, chunk = (column[idx] for column in cols.ints("step", "mb_id", "model_chunk"))
    compute = np.array([o.kind in (SpanKind.FORWARD, SpanKind.BACKWARD) for o in ops], bool)[op_code]
    stages = int(pp.max()) + 1 if len(pp) else 0
    chunks = int(chunk[compute].max()) + 1 if compute.any() and chunk[compute].max() >= 0 else 1
    interleaved = chunks > 1
    virtual = np.where(interleaved & (chunk >= 0), np.maximum(chunk, 0) * stages + pp, pp)
    direction = np.array([o.peer for o in ops], np.int64)[op_code]
    peer_pp = pp + direction
    if interleaved:  # a virtual stage's neighbour may sit on the other end of the ring
        peer_pp %= max(stages, 1)
    peer = _peers(layout, peer_pp, replica, tp, direction != 0)
    table = {
        f: np.array([getattr(o, f) if f != "kind" else str(o.kind) for o in ops], dtype=object)
        for f in ("kind", "lane", "phase")
    }
    columns: dict[str, Any] = {
        "rank": rank,
        "stage": np.where(pp >= 0, virtual, -1),
        "lane": table["lane"][op_code],
        "kind": table["kind"][op_code],
        "name": np.array(names, dtype=object)[op_code],
        "mb": mb,
        "step": step,
        "chunk": np.maximum(chunk, 0),
        "phase": table["phase"][op_code],
        "nbytes": np.zeros(len(idx), np.int64),
        "tokens": np.zeros(len(idx), np.int64),
        "peer": peer,
    }
    return columns, stages, chunks


def _peers(
    layout: Layout,
    stage: npt.NDArray[np.int64],
    replica: npt.NDArray[np.int64],
    tp: npt.NDArray[np.int64],
    talks: npt.NDArray[np.bool_],
) -> npt.NDArray[np.int64]:
    """The rank of each (stage, replica, TP rank) where the event talks to a neighbour; -1 elsewhere and past
    the pipeline's ends."""
    place = np.array(list(layout.place.values()), np.int64).reshape(-1, 3)
    if not len(place) or (place < 0).any():  # stages unknown: so are the neighbours
        return np.full(len(stage), -1, np.int64)
    table = np.full(tuple(place.max(axis=0) + 1), -1, np.int64)  # (stage, replica, TP rank) -> rank
    table[place[:, 0], place[:, 1], place[:, 2]] = list(layout.place)
    inside = talks & (stage >= 0) & (stage < table.shape[0]) & (replica >= 0)
    return np.where(inside, table[np.clip(stage, 0, table.shape[0] - 1), replica, tp], -1)


def _meta(path: Path, layout: Layout, columns: dict[str, Any], stages: int, chunks: int) -> RunMeta:
    replica = (lambda rep: rep) if layout.replicas > 1 else (lambda rep: -1)  # one pipeline: no replica
    clock = ClockInfo(method="import")
    forward, backward = (columns["kind"] == str(k) for k in (SpanKind.FORWARD, SpanKind.BACKWARD))
    ranks = [
        RankInfo(rank=r, stage=s, replica=replica(rep), device="cuda", clock=clock)
        for r, (s, rep, _) in sorted(layout.place.items())
    ]
    return RunMeta(
        run_id=path.name.split(".")[0],
        source="timers",
        status="finished",
        world_size=len(layout.place),
        pp_size=stages,
        schedule=_schedule(columns, forward, backward, chunks),
        microbatches=_microbatches(columns, forward),
        chunks=chunks,
        ranks=ranks,
        config={
            "files": [str(path)],
            "stage_order": layout.explanation,
            **({"replica_placement": layout.explanation} if layout.replicas > 1 else {}),
        },
    )


def _microbatches(columns: dict[str, Any], forward: npt.NDArray[np.bool_]) -> int:
    """M: the most micro-batches a step's forwards run on one rank and model chunk."""
    keys = ("rank", "step", "chunk", "mb")
    rows = np.stack([np.asarray(columns[k], np.int64)[forward] for k in keys], axis=1)
    rows = np.unique(rows[rows[:, 3] >= 0], axis=0)
    return int(np.unique(rows[:, :3], axis=0, return_counts=True)[1].max()) if len(rows) else 0


def _schedule(
    columns: dict[str, Any], forward: npt.NDArray[np.bool_], backward: npt.NDArray[np.bool_], chunks: int
) -> str:
    """`interleaved-1f1b` with several model chunks; else `1f1b` where some rank starts a backward before its
    step's last forward, `gpipe` where every rank runs all its forwards first."""
    if chunks > 1:
        return "interleaved-1f1b"
    if not backward.any():
        return ""
    passes = pd.DataFrame({c: np.asarray(columns[c], np.int64) for c in ("rank", "step", "start_ns")})
    last_f = passes[forward].groupby(["rank", "step"])["start_ns"].max()
    first_b = passes[backward].groupby(["rank", "step"])["start_ns"].min()
    both = pd.concat([last_f.rename("f"), first_b.rename("b")], axis=1).dropna()
    return "1f1b" if bool((both["b"] < both["f"]).any()) else "gpipe"


def _not_a_pipeline(path: Path, cols: TimerColumns, names: list[str]) -> str:
    """One line: what the Chrome trace holds, and that it is neither Kineto's nor one of pipeline operations."""
    form = "an object with traceEvents" if cols.top or not names else "a JSON array"
    held = f"{len(cols.name)} timed events ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
    return (
        f"{path} is a Chrome trace ({form}, {held if names else 'no timed events'}) but neither a Kineto trace "
        f"nor one of pipeline operations: no events named {' or '.join(sorted(PIPELINE_NAMES))}; give a PyTorch "
        "profiler trace, a Megatron-style timer trace, a run directory or an nsys export"
    )
