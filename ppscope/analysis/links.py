"""Hop figures and causality checks link by link, inside the task that analyses a link's receiving stage.

Note (why in the stage task): a link's figures (messages, bytes, send/transfer/wait time, median latency, the
receives that end before their send) need its sender's `send` spans and its receiver's `recv` and
`recv_wait` spans, nothing else. Sent back to one process for pairing, the point-to-point spans of a large
job (three in four of a pipeline's spans) would all cross the network to it. Instead the task that reads a
stage also reads, of each sender's file, only its sends to the stage's ranks (one filtered query), and returns
a few hundred bytes a link: its `HopStats` and its `Violations`. Each link is whole in one task, its
receiver's (its sender's when the receiver recorded nothing in this analysis), so a median over its messages
needs no merging, and every figure is the one `hop_stats` and `causality_violations` find on the whole trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ppscope.analysis.bubbles import span_roles
from ppscope.analysis.pipeline import hop_stats
from ppscope.analysis.result import HopStats, WindowInfo
from ppscope.trace.clock import causality_violations
from ppscope.trace.model import SpanKind
from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["LinkPlan", "Violations", "causality_warnings", "link_figures", "plan_links"]

_RECEIVES = {str(SpanKind.RECV): 0, str(SpanKind.RECV_WAIT): 1}
"""The receive kinds in the order `causality_violations` lists them."""


@dataclass(frozen=True)
class Violations:
    """What the causality warning says of `causality_violations`' rows, in a few numbers: how many, between
    which ranks, and the worst. Those of parts of a trace (its links) merge into those of the whole."""

    count: int = 0
    pairs: frozenset[tuple[int, int]] = frozenset()
    worst: tuple[int, ...] | None = None
    """(-(µs early, in ns), receive kind, src, dst, micro-batch, step) of the worst receive: the least such
    tuple, so that of equally early ones it is the first `causality_violations` lists (it lists by receive
    kind, then link, micro-batch and step), whichever part it came from."""

    @classmethod
    def of(cls, bad: pd.DataFrame) -> Violations:
        if bad.empty:
            return cls()
        early = (bad["send_start_ns"] - bad["recv_end_ns"]).to_numpy(np.int64)
        src, dst = bad["src"].to_numpy(np.int64), bad["dst"].to_numpy(np.int64)
        kind = bad["kind"].map(_RECEIVES).to_numpy(np.int64)
        keys = (-early, kind, src, dst, bad["mb"].to_numpy(np.int64), bad["step"].to_numpy(np.int64))
        first = int(np.lexsort(keys[::-1])[0])
        pairs = frozenset(zip(src.tolist(), dst.tolist(), strict=True))
        return cls(len(bad), pairs, tuple(int(k[first]) for k in keys))

    def merged(self, other: Violations) -> Violations:
        worst = [w for w in (self.worst, other.worst) if w is not None]
        return Violations(self.count + other.count, self.pairs | other.pairs, min(worst) if worst else None)


def causality_warnings(found: Violations) -> list[Notice]:
    """The warning for the receives `causality_violations` found; none when there are none."""
    if not found.count or found.worst is None:
        return []
    early, _, _, _, mb, step = found.worst
    pairs = ", ".join(f"{s}→{d}" for s, d in sorted(found.pairs))
    text = (
        f"{found.count} receive(s) end before their send starts on the common clock (rank pairs {pairs}; worst "
        f"{-early / 1e3:,.1f} µs early, micro-batch {mb} step {step}), beyond the clock offsets' uncertainty: the "
        "offsets are off, so waits and hop latencies between these ranks are not to be trusted"
    )
    return [Notice(NoticeCode.CLOCK_SKEW, text)]


@dataclass(frozen=True)
class LinkPlan:
    """What one stage's task pairs: the links into its ranks, and those out of them to a rank that recorded
    nothing in this analysis (no spans, a damaged file, another replica's rank: their only side is here)."""

    senders: dict[int, list[int]]
    """Each rank of another stage that sends to this stage's ranks, with those ranks: its sends to them are
    read from its file."""
    lone: list[int]
    """The receivers of this stage's sends that recorded nothing in this analysis."""


def plan_links(stages: list[tuple[int, list[int]]], sends_to: dict[int, set[int]]) -> list[LinkPlan]:
    """Each stage's `LinkPlan`, from what each rank that recorded spans sends to (`sends_to`, every such rank:
    its digest). One pass over the links, whatever the number of stages."""
    stage_of = {r: i for i, (_, ranks) in enumerate(stages) for r in ranks}
    senders: list[dict[int, list[int]]] = [{} for _ in stages]
    lone: list[set[int]] = [set() for _ in stages]
    for s in sorted(sends_to):
        for d in sorted(sends_to[s]):
            if d not in stage_of:
                lone[stage_of[s]].add(d)
            elif stage_of[d] != stage_of[s]:
                senders[stage_of[d]].setdefault(s, []).append(d)
    return [LinkPlan(senders[i], sorted(lone[i])) for i in range(len(stages))]


def link_figures(
    p2p: pd.DataFrame, receivers: list[int], window: WindowInfo, uncertainty: dict[int, int] | None
) -> tuple[list[HopStats], Violations]:
    """The hop figures (spans in the window) and, with `uncertainty` (estimated clocks), the causality violations
    (every span) of the links into `receivers`, from point-to-point spans on the common clock that hold all of
    theirs (columns rank, peer, kind, mb, step, start_ns, end_ns, nbytes; rows of other links are left out).
    Sorted first as the whole trace is, so each link sees its spans in the same order."""
    frame = p2p.sort_values(["start_ns", "rank", "end_ns"], kind="stable")
    send = (frame["kind"] == str(SpanKind.SEND)).to_numpy()
    dst = np.where(send, frame["peer"].to_numpy(np.int64), frame["rank"].to_numpy(np.int64))
    frame = frame[np.isin(dst, receivers)]
    role = span_roles(frame["kind"])
    start, end = frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy()
    inside = (end > window.start_ns) & (start < window.end_ns)
    hops = hop_stats(frame[inside], role[inside])
    if uncertainty is None:
        return hops, Violations()
    return hops, Violations.of(causality_violations(frame, uncertainty_ns=uncertainty))
