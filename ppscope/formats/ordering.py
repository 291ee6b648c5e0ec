"""Order imported ranks into pipeline stages from the direction of their point-to-point traffic.

In a pipeline the first micro-batch flows forward: stage 0 sends before it ever receives, and each later
stage receives for the first time after its predecessor did. When exactly one rank sends first and every
other rank receives, ranks are ordered by the time of their first receive. Otherwise (symmetric
send/recv pairs, collectives only, no traffic) the order is not inferable and a fallback key is used.
This module knows nothing about file formats: it sees (rank, send|recv, time) triples.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["StageOrder", "order_stages"]


@dataclass(frozen=True)
class StageOrder:
    stage_of: dict[int, int]
    """rank -> pipeline stage"""
    inferred: bool
    """True when the order came from point-to-point traffic, False when from the fallback key."""
    explanation: str
    code: NoticeCode
    """Which case: `one_rank`, `stages_by_traffic` or `stages_by_fallback`."""

    @property
    def notice(self) -> Notice:
        """The explanation, as a warning to show."""
        return Notice(self.code, self.explanation)


def order_stages(
    ranks: Iterable[int],
    p2p: Iterable[tuple[int, str, int]],
    fallback_key: Mapping[int, int],
    fallback_name: str,
) -> StageOrder:
    """Stages for `ranks` from `(rank, "send"|"recv", time_ns)` events, else by `fallback_key`."""
    ranks = sorted(set(ranks))
    first: dict[tuple[int, str], int] = {}
    for rank, op, t in p2p:
        key = (rank, op)
        if key not in first or t < first[key]:
            first[key] = t
    fallback = sorted(ranks, key=lambda r: (fallback_key.get(r, r), r))
    if len(ranks) <= 1:
        return StageOrder({r: i for i, r in enumerate(fallback)}, False, "one rank: stage 0", NoticeCode.ONE_RANK)
    reason = _why_not(ranks, first)
    if reason:
        return StageOrder(
            {r: i for i, r in enumerate(fallback)},
            False,
            f"stages ordered by {fallback_name}: the direction of point-to-point traffic could not be inferred "
            f"({reason})",
            NoticeCode.STAGES_BY_FALLBACK,
        )
    source = next(r for r in ranks if _is_source(r, first))
    rest = sorted((r for r in ranks if r != source), key=lambda r: (first[(r, "recv")], r))
    order = [source, *rest]
    return StageOrder(
        {r: i for i, r in enumerate(order)},
        True,
        "stages ordered by the direction of point-to-point traffic (the rank that sends first is stage 0, "
        "then ranks by their first receive)",
        NoticeCode.STAGES_BY_TRAFFIC,
    )


def _is_source(rank: int, first: Mapping[tuple[int, str], int]) -> bool:
    send, recv = first.get((rank, "send")), first.get((rank, "recv"))
    return send is not None and (recv is None or send < recv)


def _why_not(ranks: list[int], first: Mapping[tuple[int, str], int]) -> str:
    if not first:
        return "no send/recv events"
    sources = [r for r in ranks if _is_source(r, first)]
    if len(sources) != 1:
        return f"{len(sources)} ranks send before they receive; a pipeline has exactly one"
    silent = [r for r in ranks if r != sources[0] and (r, "recv") not in first]
    if silent:
        return f"rank(s) {', '.join(map(str, silent))} never receive"
    return ""
