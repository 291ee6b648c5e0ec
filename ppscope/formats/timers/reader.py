"""Read a Chrome trace of pipeline operations timed by the training job itself (Megatron-style timers) as a
Trace: one span per timed operation, on the rank of the (stage, replica, TP rank) its lane names.

The file is a bare JSON array of events or an object with `traceEvents`, gzip or not, streamed in batches
(`events.py`). What each name means is `names.py`'s; which rank a lane is, `layout.py`'s. A Chrome trace
without a forward or backward compute event is refused in one line: it is no trace of pipeline operations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppscope.errors import ErrorCode, UnsupportedInputError
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
        raise UnsupportedInputError(ErrorCode.NOT_A_TRACE, _not_a_pipeline(path, cols, names))
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
    idx = idx[np.lexsort((end[idx], rank[idx], start[idx]))]  # the canonical order, before any frame is made
    op_code = name_code[idx]
    columns, stages, chunks = _columns(cols, layout, ops, names, op_code, idx, rank[idx])
    columns.update(start_ns=start[idx], end_ns=end[idx])
    forward, backward = (np.array([o.kind is k for o in ops], bool)[op_code] for k in _PASSES)
    meta = _meta(path, layout, columns, stages, chunks, (forward, backward))
    return Trace(spans=spans_frame(columns), meta=meta, warnings=warnings).sorted()


_PASSES = (SpanKind.FORWARD, SpanKind.BACKWARD)


def _codes(values: list[Any]) -> tuple[list[str], npt.NDArray[np.intp]]:
    """Event names as codes into their distinct values (as text)."""
    try:
        codes, uniques = pd.factorize(np.array([*values, None], dtype=object)[:-1], sort=False)
    except TypeError:  # a list or an object where a name belongs: named by its text
        text = [v if type(v) is str else json.dumps(v) for v in values]
        codes, uniques = pd.factorize(np.array(text, dtype=object), sort=False)
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
    place = np.full((max(layout.place, default=-1) + 1, 3), -1, np.int64)  # rank -> (stage, replica, TP rank)
    for r, where in layout.place.items():
        place[r] = where
    pp, replica, tp = (place[rank, i] for i in range(3))
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


def _meta(
    path: Path,
    layout: Layout,
    columns: dict[str, Any],
    stages: int,
    chunks: int,
    passes: tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]],
) -> RunMeta:
    replica = (lambda rep: rep) if layout.replicas > 1 else (lambda rep: -1)  # one pipeline: no replica
    clock = ClockInfo(method="import")
    forward, backward = passes
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


def _groups(*keys: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """The rows in order of `keys` (the first most significant), and where each group of equal keys starts."""
    order = np.lexsort(keys[::-1])
    if not len(order):
        return order, np.zeros(0, np.intp)
    new = np.zeros(len(order), bool)
    new[0] = True
    for k in keys:
        new[1:] |= k[order][1:] != k[order][:-1]
    return order, np.flatnonzero(new)


def _microbatches(columns: dict[str, Any], forward: npt.NDArray[np.bool_]) -> int:
    """M: the most micro-batches a step's forwards run on one rank and model chunk."""
    rows = forward & (columns["mb"] >= 0)
    rank, step, chunk, mb = (np.asarray(columns[k], np.int64)[rows] for k in ("rank", "step", "chunk", "mb"))
    if not len(mb):
        return 0
    order, starts = _groups(rank, step, chunk, mb)  # one group per distinct micro-batch of a (rank, step, chunk)
    _, per_pass = _groups(rank[order][starts], step[order][starts], chunk[order][starts])
    return int(np.diff(np.r_[per_pass, len(starts)]).max())


def _schedule(
    columns: dict[str, Any], forward: npt.NDArray[np.bool_], backward: npt.NDArray[np.bool_], chunks: int
) -> str:
    """`interleaved-1f1b` with several model chunks; else `1f1b` where some rank starts a backward before its
    step's last forward, `gpipe` where every rank runs all its forwards first."""
    if chunks > 1:
        return "interleaved-1f1b"
    if not backward.any():
        return ""
    rows = forward | backward
    rank, step, start = (np.asarray(columns[k], np.int64)[rows] for k in ("rank", "step", "start_ns"))
    is_b = backward[rows]
    # each (rank, step)'s passes by start, the groups numbered from 1: 1F1B when a forward follows a backward
    order = np.lexsort((start, step, rank))
    group = np.cumsum(_new_pair(rank[order], step[order]))
    b_seen = np.maximum.accumulate(np.where(is_b[order], group, 0))  # the last group a backward was seen in
    return "1f1b" if bool(((b_seen == group) & ~is_b[order]).any()) else "gpipe"


def _new_pair(rank: npt.NDArray[np.int64], step: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Where a (rank, step) begins, in rows sorted by it."""
    return np.r_[True, (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])]


def _not_a_pipeline(path: Path, cols: TimerColumns, names: list[str]) -> str:
    """One line: what the Chrome trace holds, and that it is neither Kineto's nor one of pipeline operations."""
    form = "an object with traceEvents" if cols.top or not names else "a JSON array"
    held = f"{len(cols.name)} timed events ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
    return (
        f"{path} is a Chrome trace ({form}, {held if names else 'no timed events'}) but neither a Kineto trace "
        f"nor one of pipeline operations: no events named {' or '.join(sorted(PIPELINE_NAMES))}; give a PyTorch "
        "profiler trace, a Megatron-style timer trace, a run directory or an nsys export"
    )
