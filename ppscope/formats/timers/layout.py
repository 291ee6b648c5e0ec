"""Which rank of the job each lane of a timer trace is: its pipeline stage, data-parallel replica and
tensor-parallel rank, from the lane's name, its process's name or its events' `args`, and a global rank
number for each (stage, replica, TP rank), laid out as Megatron lays ranks out (TP innermost, PP outermost).

It knows lane names and `args`, not the operations the events time (`names.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ppscope.formats.timers.events import TimerColumns
from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["Layout", "lane_layout"]

_RANK_OF = {
    "pp": re.compile(r"\bPP[ _-]?rank[ _:=-]*(\d+)", re.IGNORECASE),
    "tp": re.compile(r"\bTP[ _-]?rank[ _:=-]*(\d+)", re.IGNORECASE),
    "dp": re.compile(r"\bDP[ _-]?rank[ _:=-]*(\d+)", re.IGNORECASE),
}


@dataclass
class Layout:
    """Each lane's global rank (-1: left out), and each rank's (stage, replica, TP rank)."""

    rank_of_lane: npt.NDArray[np.int64]
    place: dict[int, tuple[int, int, int]]
    """rank -> (stage, replica, TP rank); stage -1 where no lane said it."""
    replicas: int
    explanation: str
    notices: list[Notice] = field(default_factory=list)


def _said(text: str, what: str) -> int | None:
    m = _RANK_OF[what].search(text)
    return int(m.group(1)) if m else None


def _arg(args: Any, what: str) -> int | None:
    value = getattr(args, f"{what}_rank", None)
    return value if type(value) is int and value >= 0 else None


def lane_layout(cols: TimerColumns, lanes: list[tuple[Any, Any]], first: list[int]) -> Layout:
    """The layout of `lanes` ((pid, tid) each), `first` the index of each lane's first event."""
    found: dict[str, list[int | None]] = {w: [] for w in _RANK_OF}
    sources: dict[str, set[str]] = {w: set() for w in _RANK_OF}
    for lane, i in zip(lanes, first, strict=True):
        names = (
            ("lane names", cols.thread_names.get(lane, "")),
            ("process names", cols.process_names.get(lane[0], "")),
        )
        for what in _RANK_OF:
            value, source = next(((v, s) for s, t in names if (v := _said(t, what)) is not None), (None, ""))
            if value is None and (value := _arg(cols.args[i], what)) is not None:
                source = "args"
            found[what].append(value)
            if source:
                sources[what].add(source)
    pids = sorted({lane[0] for lane in lanes}, key=str)
    notes: list[Notice] = []
    if all(v is None for v in found["dp"]):  # one process per data-parallel rank
        found["dp"] = [pids.index(lane[0]) for lane in lanes]
        sources["dp"] = {_PER_PID}
    if all(v is None for v in found["pp"]):  # nothing says the stage: each process one rank, stage unknown
        return _by_process(lanes, pids)
    explanation = _explained(sources)
    notes.append(Notice(NoticeCode.TIMER_PLACEMENT, explanation))
    keep = [pp is not None and dp is not None for pp, dp in zip(found["pp"], found["dp"], strict=True)]
    if not all(keep):
        text = f"left out the events of {keep.count(False)} lane(s) that name no PP rank: {_lanes(lanes, keep, cols)}"
        notes.append(Notice(NoticeCode.TIMER_LANES_LEFT_OUT, text))
    return _numbered(found, keep, explanation, notes)


_PER_PID = "one replica per process (pid)"


def _explained(sources: dict[str, set[str]]) -> str:
    """Where the ranks came from, in words: `PP and TP ranks in the lane names, one replica per process (pid)`."""
    by_source: dict[str, list[str]] = {}
    for what, said in sources.items():
        for source in sorted(said):
            by_source.setdefault(source, []).append(what.upper())
    parts = [
        s if s == _PER_PID else f"{' and '.join(w)} rank{'s' if len(w) > 1 else ''} in the {s}"
        for s, w in by_source.items()
    ]
    return ", ".join(parts + ([] if sources["tp"] else ["TP rank 0 (none named)"]))


def _lanes(lanes: list[tuple[Any, Any]], keep: list[bool], cols: TimerColumns) -> str:
    out = [
        repr(cols.thread_names.get(lane, f"pid {lane[0]} tid {lane[1]}"))
        for lane, k in zip(lanes, keep, strict=True)
        if not k
    ]
    return ", ".join(out[:4]) + (f" and {len(out) - 4} more" if len(out) > 4 else "")


def _numbered(found: dict[str, list[int | None]], keep: list[bool], explanation: str, notes: list[Notice]) -> Layout:
    """Global ranks as Megatron numbers them: rank = (stage × D + replica) × T + TP rank, replicas numbered
    densely in the order of their DP ranks."""
    tps = [t or 0 for t in found["tp"]]
    replicas = sorted({d for d, k in zip(found["dp"], keep, strict=True) if k and d is not None})
    index = {d: i for i, d in enumerate(replicas)}
    width = max((t for t, k in zip(tps, keep, strict=True) if k), default=0) + 1
    ranks = np.full(len(keep), -1, np.int64)
    place: dict[int, tuple[int, int, int]] = {}
    for i, k in enumerate(keep):
        if k:
            pp, dp = found["pp"][i], found["dp"][i]
            assert pp is not None and dp is not None  # what `keep` says
            rep, tp = index[dp], tps[i]
            ranks[i] = (pp * len(replicas) + rep) * width + tp
            place[int(ranks[i])] = (pp, rep, tp)
    return Layout(ranks, place, len(replicas), explanation, notes)


def _by_process(lanes: list[tuple[Any, Any]], pids: list[Any]) -> Layout:
    ranks = np.array([pids.index(lane[0]) for lane in lanes], np.int64)
    text = (
        "no lane, process or event names a PP rank: each process is one rank of unknown stage; "
        "give --stage-of-rank (e.g. rank//N) to place them"
    )
    notes = [Notice(NoticeCode.TIMER_PLACEMENT, text)]
    return Layout(ranks, {r: (-1, -1, 0) for r in range(len(pids))}, 1, "one rank per process, stages unknown", notes)
