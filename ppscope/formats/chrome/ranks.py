"""What the Chrome export reads, a rank at a time: each rank's spans and counters, and the two sides of a link.

Note (why a first pass and why links): the Chrome file numbers its threads over every rank's lanes in order,
times its events from the first span or counter of any rank, and gives each flow arrow (a send to its
receive) an id that is unique in the file. A first pass over the ranks (`ExportPlan.of`) keeps of each rank a few
numbers (its first time, first stage, thread count, peers), then pairs each link (sender, receiver) alone:
`match_flows` on the link's sends and receives, which pairs them as it pairs them in the whole trace (its
keys hold the link, and the link's spans keep their order). The link's arrows are numbered after those of
the links before it, so the second pass, writing a rank, pairs its links again and numbers each arrow as
the first pass did. Of a run directory, a link's far side is read as the analysis reads it
(`rankfile.read_p2p`: only that rank's sends to, or receives from, this one); memory holds one rank's spans
and one link's far side, and of the whole job a few numbers a rank and one a link.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, ErrorCode
from ppscope.formats.nesting import stack_levels
from ppscope.trace.model import RunMeta, SpanKind, Trace
from ppscope.trace.rankfile import read_p2p, start_order
from ppscope.trace.store import each_rank, run_files

__all__ = [
    "RECV_KINDS",
    "ExportPlan",
    "RankSource",
    "RunRanks",
    "TraceRanks",
    "link_pairs",
    "match_flows",
    "with_levels",
]

RECV_KINDS = (str(SpanKind.RECV), str(SpanKind.RECV_WAIT))
_SEND = str(SpanKind.SEND)
_LINK_COLS = ["rank", "peer", "mb", "step", "chunk", "start_ns"]


class RankSource(Protocol):
    """Where the export reads: each rank's spans and counters in rank order (spans sorted as `load_run`
    sorts them), and one side of a link (columns of `_LINK_COLS` at least, sorted as the whole trace)."""

    meta: RunMeta

    def each(self) -> Iterator[tuple[int, pd.DataFrame, pd.DataFrame]]: ...

    def sends(self, src: int, dst: int) -> pd.DataFrame: ...

    def receives(self, dst: int, src: int) -> pd.DataFrame: ...


class TraceRanks:
    """A trace in memory, read a rank at a time (its rows' order kept within each rank)."""

    def __init__(self, trace: Trace) -> None:
        self.meta, self.spans, self.counters = trace.meta, trace.spans, trace.counters
        self._spans = self.spans.groupby("rank", sort=False).indices
        self._counters = self.counters.groupby("rank", sort=False).indices
        p2p = self.spans[self.spans["peer"] >= 0]
        send = (p2p["kind"] == _SEND).to_numpy()
        pos = np.flatnonzero(self.spans["peer"].to_numpy() >= 0)
        self._sends = p2p[send].groupby(["rank", "peer"]).indices, pos[send]
        recv = p2p["kind"].isin(RECV_KINDS).to_numpy()
        self._receives = p2p[recv].groupby(["rank", "peer"]).indices, pos[recv]

    def each(self) -> Iterator[tuple[int, pd.DataFrame, pd.DataFrame]]:
        for rank in sorted({int(r) for r in (*self._spans, *self._counters)}):
            spans = self.spans.iloc[self._spans.get(rank, [])].reset_index(drop=True)
            yield rank, spans, self.counters.iloc[self._counters.get(rank, [])].reset_index(drop=True)

    def sends(self, src: int, dst: int) -> pd.DataFrame:
        groups, pos = self._sends
        return self.spans.iloc[pos[groups.get((src, dst), [])]].reset_index(drop=True)

    def receives(self, dst: int, src: int) -> pd.DataFrame:
        groups, pos = self._receives
        return self.spans.iloc[pos[groups.get((dst, src), [])]].reset_index(drop=True)


class RunRanks:
    """A run directory, read a rank file at a time; a damaged file is left out (`damaged`, found by the first
    pass), as `load_run` leaves it out."""

    def __init__(self, run_dir: str | Path) -> None:
        self.meta, self.files, self.notes = run_files(run_dir)
        self.damaged: dict[int, CorruptFileError] = {}

    def each(self) -> Iterator[tuple[int, pd.DataFrame, pd.DataFrame]]:
        files = {r: f for r, f in self.files.items() if r not in self.damaged}
        yield from each_rank(files, self.meta, self.damaged, self.notes)

    def sends(self, src: int, dst: int) -> pd.DataFrame:
        return _in_trace_order(read_p2p(self.files[src], [_SEND], [dst], self.meta))

    def receives(self, dst: int, src: int) -> pd.DataFrame:
        return _in_trace_order(read_p2p(self.files[dst], RECV_KINDS, [src], self.meta))


def _in_trace_order(rows: pd.DataFrame) -> pd.DataFrame:
    """One rank's rows, in the file's order, as `load_run` sorts them (start, end, then the file's order)."""
    order = start_order(rows["start_ns"].to_numpy(), rows["rank"].to_numpy(), rows["end_ns"].to_numpy())
    return rows.iloc[order].reset_index(drop=True)


def match_flows(spans: pd.DataFrame) -> list[tuple[int, int]]:
    """(send index, recv index) pairs: the n-th send from a to b for (mb, step, chunk) meets the n-th
    receive on b from a for the same key, in the order of the sends' starts. Spans without a peer are not
    matched."""
    sends = spans[(spans["kind"] == SpanKind.SEND) & (spans["peer"] >= 0)]
    recvs = spans[spans["kind"].isin(RECV_KINDS) & (spans["peer"] >= 0)]
    if not len(sends) or not len(recvs):
        return []
    # A receive may be split into waiting + moving; the arrow goes to the first of them.
    recvs = recvs.sort_values(["start_ns"], kind="stable")
    keys = ["src", "dst", "mb", "step", "chunk"]
    s = sends.assign(src=sends["rank"], dst=sends["peer"]).sort_values("start_ns", kind="stable")
    r = recvs.assign(src=recvs["peer"], dst=recvs["rank"])
    s = s.assign(_n=s.groupby(keys).cumcount()).reset_index()
    r = r.assign(_n=r.groupby(keys).cumcount()).reset_index()
    pairs = s.merge(r, on=[*keys, "_n"], suffixes=("_s", "_r"))
    return list(zip(pairs["index_s"].tolist(), pairs["index_r"].tolist(), strict=True))


def link_pairs(sends: pd.DataFrame, receives: pd.DataFrame) -> list[tuple[int, int]]:
    """The arrows of one link: (row of `sends`, row of `receives`), paired by `match_flows`, in its order. The
    rows are one link's, sorted as the whole trace sorts them; only their `_LINK_COLS` are read."""
    both = pd.concat(
        [sends[_LINK_COLS].assign(kind=_SEND), receives[_LINK_COLS].assign(kind=RECV_KINDS[0])], ignore_index=True
    )
    return [(s, r - len(sends)) for s, r in match_flows(both)]


def with_levels(spans: pd.DataFrame) -> pd.DataFrame:
    """Spans with `lvl`: the sub-thread of their lane on which they nest."""
    levels = np.zeros(len(spans), dtype=np.int64)
    for _, rows in spans.groupby(["rank", "lane"], sort=False).indices.items():
        levels[rows] = stack_levels(spans["start_ns"].to_numpy()[rows], spans["end_ns"].to_numpy()[rows])
    return spans.reset_index(drop=True).assign(lvl=levels)


def _peers(spans: pd.DataFrame, kinds: tuple[str, ...]) -> list[int]:
    peer = spans["peer"].to_numpy()
    return sorted({int(p) for p in peer[spans["kind"].isin(kinds).to_numpy() & (peer >= 0)]})


@dataclass
class ExportPlan:
    """What the file needs of every rank before a rank is written: the time its events start from, each
    process's stage, each rank's first thread id, its peers, and each link's first arrow id."""

    meta: RunMeta
    t0: int = 0
    stages: dict[int, int] = field(default_factory=dict)
    """Each process's stage (-1: unknown), by rank: the metadata's, else the least of its spans'."""
    first_tid: dict[int, int] = field(default_factory=dict)
    sends_to: dict[int, list[int]] = field(default_factory=dict)
    recv_from: dict[int, list[int]] = field(default_factory=dict)
    links: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    """(sender, receiver): (the id of its first arrow less one, how many arrows)."""

    @classmethod
    def of(cls, source: RankSource) -> ExportPlan:
        plan = cls(source.meta, stages={info.rank: info.stage for info in source.meta.ranks})
        firsts, tids = [], 0
        for rank, spans, counters in source.each():
            if not len(spans) and not len(counters):
                continue
            firsts += [int(f[c].min()) for f, c in ((spans, "start_ns"), (counters, "ts_ns")) if len(f)]
            plan.first_tid[rank] = tids
            if len(spans):
                tids += len(with_levels(spans)[["lane", "lvl"]].drop_duplicates())
                staged = spans["stage"].to_numpy()
                if plan.stages.get(rank, -1) < 0:
                    plan.stages[rank] = int(staged[staged >= 0].min()) if (staged >= 0).any() else -1
                plan.sends_to[rank], plan.recv_from[rank] = _peers(spans, (_SEND,)), _peers(spans, RECV_KINDS)
            plan.stages.setdefault(rank, -1)
        plan.t0 = min(firsts) if firsts else 0
        plan._number_links(source)
        return plan

    def _number_links(self, source: RankSource) -> None:
        """Pair each link (a sender with a receiver that has receives from it) to count its arrows."""
        first = 0
        for src in sorted(self.sends_to):
            for dst in self.sends_to[src]:
                if src in self.recv_from.get(dst, []):
                    n = len(link_pairs(source.sends(src, dst), source.receives(dst, src)))
                    self.links[src, dst] = (first, n)
                    first += n

    def arrows(self, src: int, dst: int, sends: pd.DataFrame, receives: pd.DataFrame) -> list[tuple[int, int, int]]:
        """(arrow id, row of `sends`, row of `receives`) of the link, as the first pass numbered them."""
        first, n = self.links[src, dst]
        pairs = link_pairs(sends, receives)
        if len(pairs) != n:
            raise CorruptFileError(
                ErrorCode.RUN_CHANGED,
                f"the sends from rank {src} to rank {dst} paired {len(pairs)} arrows, {n} on the first read: "
                "the run changed while it was exported; export it once it has finished",
            )
        return [(first + i + 1, s, r) for i, (s, r) in enumerate(pairs)]
