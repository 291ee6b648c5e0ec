"""Clock offsets between ranks: NTP-style estimation from ping-pong exchanges, and the check that the
common clock keeps causality.

A rank sends a ping at t1 (its clock), the reference rank stamps t0 (reference clock) when it answers, and
the answer arrives at t2 (rank's clock). Whatever the path delays, the reference stamp happened between
t1 and t2 in true time, so offset = (t1 + t2) / 2 - t0 is right within +/- (t2 - t1) / 2; the exchange
with the smallest round trip gives the tightest bound. This module knows nothing about transports.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ppscope.trace import ClockInfo, SpanKind

__all__ = ["causality_violations", "estimate_offset"]


def estimate_offset(samples: Sequence[tuple[int, int, int]]) -> ClockInfo:
    """ClockInfo from (t1, t0, t2) exchanges: t1/t2 on this rank's clock, t0 on the reference clock."""
    if not samples:
        raise ValueError("estimate_offset needs at least one (t1, t0, t2) exchange")
    t1, t0, t2 = min(samples, key=lambda s: s[2] - s[0])
    if t2 < t1:
        raise ValueError(f"a ping-pong exchange ends before it starts (t1={t1}, t2={t2}): the clock is not monotonic")
    return ClockInfo(offset_ns=(t1 + t2) // 2 - t0, uncertainty_ns=(t2 - t1 + 1) // 2, method="ping-pong")


def causality_violations(spans: pd.DataFrame, slack_ns: int = 0) -> pd.DataFrame:
    """Receives that end before the matching send started (on the common clock), matched by the pair of
    ranks and the order of messages between them. Empty when the clocks are consistent."""
    send = spans[spans["kind"] == str(SpanKind.SEND)]
    recv = spans[spans["kind"] == str(SpanKind.RECV)]
    rows = []
    for (src, dst), s in send.groupby(["rank", "peer"]):
        r = recv[(recv["rank"] == dst) & (recv["peer"] == src)].sort_values("start_ns")
        s = s.sort_values("start_ns")
        n = min(len(s), len(r))
        if not n:
            continue
        bad = r["end_ns"].to_numpy()[:n] + slack_ns < s["start_ns"].to_numpy()[:n]
        for i in np.flatnonzero(bad):
            rows.append(
                {
                    "src": int(src),
                    "dst": int(dst),
                    "index": int(i),
                    "send_start_ns": int(s["start_ns"].iloc[i]),
                    "recv_end_ns": int(r["end_ns"].iloc[i]),
                }
            )
    return pd.DataFrame(rows, columns=["src", "dst", "index", "send_start_ns", "recv_end_ns"])
