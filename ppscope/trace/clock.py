"""Clock offsets between ranks: NTP-style estimation from ping-pong exchanges, and the check that the
common clock keeps causality.

A rank sends a ping at t1 (its clock), the reference rank stamps t0 (reference clock) when it answers, and
the answer arrives at t2 (rank's clock). Whatever the path delays, the reference stamp happened between
t1 and t2 in true time, so offset = (t1 + t2) / 2 - t0 is right within +/- (t2 - t1) / 2; the exchange
with the smallest round trip gives the tightest bound. This module knows nothing about transports.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ppscope.trace.model import ClockInfo, SpanKind

__all__ = ["causality_violations", "estimate_offset"]


def estimate_offset(samples: Sequence[tuple[int, int, int]]) -> ClockInfo:
    """ClockInfo from (t1, t0, t2) exchanges: t1/t2 on this rank's clock, t0 on the reference clock."""
    if not samples:
        raise ValueError("estimate_offset needs at least one (t1, t0, t2) exchange")
    t1, t0, t2 = min(samples, key=lambda s: s[2] - s[0])
    if t2 < t1:
        raise ValueError(f"a ping-pong exchange ends before it starts (t1={t1}, t2={t2}): the clock is not monotonic")
    return ClockInfo(offset_ns=(t1 + t2) // 2 - t0, uncertainty_ns=(t2 - t1 + 1) // 2, method="ping-pong")


_KEYS = ["src", "dst", "mb", "step"]


def causality_violations(spans: pd.DataFrame, slack_ns: int = 0) -> pd.DataFrame:
    """Receives (`recv` or `recv_wait`) that end before their matching send started, on the common clock.

    A receive on rank d from peer s matches the send on rank s to peer d with the same micro-batch and step,
    in order when several share them. Empty when the clocks are consistent (within `slack_ns`).
    """
    cols = ["src", "dst", "mb", "step", "kind", "send_start_ns", "recv_end_ns"]
    send = spans[spans["kind"] == str(SpanKind.SEND)]
    rows = []
    for kind in (SpanKind.RECV, SpanKind.RECV_WAIT):
        recv = spans[spans["kind"] == str(kind)]
        if recv.empty or send.empty:
            continue
        left = send.rename(columns={"rank": "src", "peer": "dst"})[["src", "dst", "mb", "step", "start_ns"]]
        right = recv.rename(columns={"peer": "src", "rank": "dst"})[["src", "dst", "mb", "step", "end_ns"]]
        left = left.sort_values("start_ns")
        left["n"] = left.groupby(_KEYS).cumcount()
        right = right.sort_values("end_ns")
        right["n"] = right.groupby(_KEYS).cumcount()
        both = left.merge(right, on=[*_KEYS, "n"])
        bad = both[both["end_ns"] + slack_ns < both["start_ns"]]
        for r in bad.itertuples():
            rows.append((int(r.src), int(r.dst), int(r.mb), int(r.step), str(kind), int(r.start_ns), int(r.end_ns)))
    return pd.DataFrame(rows, columns=cols)
