"""Clock offsets between ranks: NTP-style estimation from ping-pong exchanges, and the check that the
common clock keeps causality.

A rank sends a ping at t1 (its clock), the reference rank stamps t0 (reference clock) when it answers, and
the answer arrives at t2 (rank's clock). Whatever the path delays, the reference stamp happened between
t1 and t2 in true time, so offset = (t1 + t2) / 2 - t0 is right within +/- (t2 - t1) / 2; the exchange
with the smallest round trip gives the tightest bound. Clocks of different hosts also drift apart (parts per
million): an offset measured again at the end of a run gives the drift, and the offset of each instant is
interpolated between the two (`with_drift`, `offsets_at`). This module knows nothing about transports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ppscope.trace.model import ClockInfo, SpanKind

__all__ = ["causality_violations", "estimate_offset", "offsets_at", "with_drift"]


def estimate_offset(samples: Sequence[tuple[int, int, int]]) -> ClockInfo:
    """ClockInfo from (t1, t0, t2) exchanges: t1/t2 on this rank's clock, t0 on the reference clock."""
    if not samples:
        raise ValueError("estimate_offset needs at least one (t1, t0, t2) exchange")
    t1, t0, t2 = min(samples, key=lambda s: s[2] - s[0])
    if t2 < t1:
        raise ValueError(f"a ping-pong exchange ends before it starts (t1={t1}, t2={t2}): the clock is not monotonic")
    mid = (t1 + t2) // 2
    return ClockInfo(offset_ns=mid - t0, uncertainty_ns=(t2 - t1 + 1) // 2, method="ping-pong", at_ns=mid)


def with_drift(start: ClockInfo, end: ClockInfo) -> ClockInfo:
    """`start`, with the drift that `end` (the same rank's offset measured later) shows. A change within the
    two measurements' uncertainties is noise, not drift: then `start` as it was, since a drift made of noise
    would move every span by up to that noise. Between the two measurements the interpolated offset is good
    within the larger uncertainty."""
    elapsed = end.at_ns - start.at_ns
    moved = end.offset_ns - start.offset_ns
    if elapsed <= 0 or abs(moved) <= start.uncertainty_ns + end.uncertainty_ns:
        return start
    return dataclasses.replace(
        start, drift_ppm=moved / elapsed * 1e6, uncertainty_ns=max(start.uncertainty_ns, end.uncertainty_ns)
    )


def offsets_at(clock: ClockInfo, local_ns: np.ndarray) -> np.ndarray:
    """The offset (int64) to subtract from each of a rank's local times to put it on the common clock."""
    if not clock.drift_ppm:
        return np.full(len(local_ns), clock.offset_ns, np.int64)
    since = local_ns.astype(np.float64) - float(clock.at_ns)
    return clock.offset_ns + np.rint(since * (clock.drift_ppm * 1e-6)).astype(np.int64)


def causality_violations(
    spans: pd.DataFrame, slack_ns: int = 0, uncertainty_ns: Mapping[int, int] | None = None
) -> pd.DataFrame:
    """Receives (`recv` or `recv_wait`) that end before their matching send started, on the common clock.

    A receive on rank d from peer s matches the send on rank s to peer d with the same micro-batch and step,
    in order when several share them. Empty when the clocks are consistent within `slack_ns` plus, per pair,
    the two ranks' offset uncertainties (`uncertainty_ns` by rank).
    """
    cols = ["src", "dst", "mb", "step", "kind", "send_start_ns", "recv_end_ns"]
    kinds, kind_names = pd.factorize(spans["kind"], sort=False)
    kind = {str(k): i for i, k in enumerate(kind_names)}
    is_send = kinds == kind.get(str(SpanKind.SEND), -2)
    if not is_send.any():  # no send for a receive to come before
        return pd.DataFrame(columns=cols)
    rank, peer = spans["rank"].to_numpy(np.int64), spans["peer"].to_numpy(np.int64)
    mb_step = _pack(spans["mb"].to_numpy(np.int64), spans["step"].to_numpy(np.int64))
    sends = _numbered(_pack(rank, peer)[is_send], mb_step[is_send], spans["start_ns"].to_numpy(np.int64)[is_send])
    unc = dict(uncertainty_ns or {})
    frames = []
    for recv_kind in (SpanKind.RECV, SpanKind.RECV_WAIT):
        sel = kinds == kind.get(str(recv_kind), -2)
        if not sel.any():
            continue
        recvs = _numbered(_pack(peer, rank)[sel], mb_step[sel], spans["end_ns"].to_numpy(np.int64)[sel])
        both = _joined(sends, recvs)
        src, dst = _unpack(both["link"])
        slack = slack_ns + _looked_up(unc, src) + _looked_up(unc, dst)
        bad = (both["t_recv"] + slack < both["t_send"]).nonzero()[0]
        if len(bad):
            mb, step = _unpack(both["mb_step"][bad])
            frames.append(
                pd.DataFrame(
                    {
                        "src": src[bad],
                        "dst": dst[bad],
                        "mb": mb,
                        "step": step,
                        "kind": str(recv_kind),
                        "send_start_ns": both["t_send"][bad],
                        "recv_end_ns": both["t_recv"][bad],
                    }
                )
            )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


_BIAS = 1 << 31
"""Added to the low half so that a negative value (-1: none) packs below the high half's bits."""


def _pack(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Two int32-range columns as one int64 key in the same order, so sorting and joining compare one column."""
    return (hi << 32) | (lo + _BIAS)


def _unpack(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return packed >> 32, (packed & 0xFFFFFFFF) - _BIAS


def _joined(sends: _Messages, recvs: _Messages) -> _Messages:
    """The inner join of two `_numbered` columns on (link, mb_step, n), unique on each side: link, mb_step,
    t_send, t_recv, in key order. Both sorted together by key, a send before its receive: a match is a send
    followed by a receive of the same key (a merge of pandas costs ten times as much on small frames)."""
    cols = ("link", "mb_step", "n")
    key = {c: np.concatenate([sends[c], recvs[c]]) for c in cols}
    t = np.concatenate([sends["t"], recvs["t"]])
    side = np.concatenate([np.zeros(len(sends["t"]), np.int8), np.ones(len(recvs["t"]), np.int8)])
    order = np.lexsort((side, key["n"], key["mb_step"], key["link"]))
    first, second = order[:-1], order[1:]
    match = (side[first] == 0) & (side[second] == 1)
    for c in cols:
        match &= key[c][first] == key[c][second]
    s, r = first[match], second[match]
    return {"link": key["link"][s], "mb_step": key["mb_step"][s], "t_send": t[s], "t_recv": t[r]}


def _looked_up(table: dict[int, int], ranks: np.ndarray) -> np.ndarray:
    """`table[rank]` of each rank, 0 where it has none."""
    if not table:
        return np.zeros(len(ranks), np.int64)
    keys = np.array(sorted(table), np.int64)
    values = np.array([table[k] for k in keys.tolist()], np.int64)
    at = np.minimum(np.searchsorted(keys, ranks), len(keys) - 1)
    return np.where(keys[at] == ranks, values[at], 0)


_Messages = dict[str, np.ndarray]
"""Columns of messages by name."""


def _numbered(link: np.ndarray, mb_step: np.ndarray, t: np.ndarray) -> _Messages:
    """(link, mb_step, n, t): n numbers the messages of one link, micro-batch and step in time order, so the
    n-th send of a key pairs with its n-th receive."""
    order = np.lexsort((t, mb_step, link))
    link, mb_step = link[order], mb_step[order]
    new = np.ones(len(order), bool)
    new[1:] = (link[1:] != link[:-1]) | (mb_step[1:] != mb_step[:-1])
    first = np.flatnonzero(new)
    occurrence = np.arange(len(order)) - first[np.cumsum(new) - 1]
    return {"link": link, "mb_step": mb_step, "n": occurrence, "t": t[order]}
