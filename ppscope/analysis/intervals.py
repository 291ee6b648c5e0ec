"""Vectorised interval arithmetic on integer nanoseconds: clipping, unions and the elementary-segment sweep.

Everything here works on numpy int64 arrays of starts and ends and never loops over intervals in Python.
It knows nothing about spans, stages or causes: callers pass plain arrays and level codes.

Note (the sweep): all interval ends are collected into one sorted array of boundaries; consecutive
boundaries form elementary segments that no interval starts or ends inside. Coverage of each segment by a
set of intervals is a prefix sum of +1 at each start's boundary index and -1 at each end's. Because every
segment is whole, per-segment labels add up to the window length exactly, in integer ns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Intervals", "Segments", "clip", "coverage", "label_segments", "merge_runs", "union_length"]

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Intervals:
    """Half-open intervals [start_ns, end_ns) as two int64 arrays of equal length."""

    start_ns: I64
    end_ns: I64

    @classmethod
    def empty(cls) -> Intervals:
        return cls(np.empty(0, np.int64), np.empty(0, np.int64))

    def __len__(self) -> int:
        return int(self.start_ns.shape[0])


def clip(iv: Intervals, lo_ns: int, hi_ns: int) -> Intervals:
    """The parts of `iv` inside [lo_ns, hi_ns); empty pieces are dropped."""
    s = np.maximum(iv.start_ns, np.int64(lo_ns))
    e = np.minimum(iv.end_ns, np.int64(hi_ns))
    keep = e > s
    return Intervals(s[keep], e[keep])


def union_length(iv: Intervals) -> int:
    """Total length of the union of `iv` (overlaps counted once)."""
    if len(iv) == 0:
        return 0
    order = np.argsort(iv.start_ns, kind="stable")
    s = iv.start_ns[order]
    e = np.maximum.accumulate(iv.end_ns[order])
    # A new run starts where the start lies past every end seen before it.
    prev_end = np.concatenate(([s[0]], e[:-1]))
    new_run = s > prev_end
    new_run[0] = True
    run_id = np.cumsum(new_run) - 1
    run_start = s[new_run]
    run_end = np.zeros(run_start.shape[0], np.int64)
    np.maximum.at(run_end, run_id, e)
    return int((run_end - run_start).sum())


@dataclass(frozen=True)
class Segments:
    """Elementary segments of a window: [bounds[i], bounds[i+1]) for i < len(bounds) - 1."""

    bounds: I64

    @property
    def start_ns(self) -> I64:
        return self.bounds[:-1]

    @property
    def end_ns(self) -> I64:
        return self.bounds[1:]

    @property
    def length_ns(self) -> I64:
        return np.diff(self.bounds)

    @classmethod
    def of(cls, lo_ns: int, hi_ns: int, *ivs: Intervals, extra: I64 | None = None) -> Segments:
        """Segments of [lo_ns, hi_ns) cut at every end of the (already clipped) intervals and `extra` points."""
        parts = [np.array([lo_ns, hi_ns], np.int64)]
        parts += [iv.start_ns for iv in ivs] + [iv.end_ns for iv in ivs]
        if extra is not None:
            parts.append(np.clip(extra.astype(np.int64), lo_ns, hi_ns))
        return cls(np.unique(np.concatenate(parts)))


def coverage(seg: Segments, iv: Intervals) -> npt.NDArray[np.bool_]:
    """For each segment, whether any interval of `iv` covers it (every end of `iv` must be a boundary)."""
    n = seg.bounds.shape[0]
    if len(iv) == 0 or n < 2:
        return np.zeros(max(n - 1, 0), np.bool_)
    i0 = np.searchsorted(seg.bounds, iv.start_ns)
    i1 = np.searchsorted(seg.bounds, iv.end_ns)
    delta = np.bincount(i0, minlength=n) - np.bincount(i1, minlength=n)
    return np.cumsum(delta)[:-1] > 0


def label_segments(seg: Segments, levels: list[tuple[int, Intervals]], default: int) -> npt.NDArray[np.int16]:
    """One label per segment: the first level (highest precedence first) that covers it, else `default`."""
    labels = np.full(max(seg.bounds.shape[0] - 1, 0), default, np.int16)
    for code, iv in reversed(levels):
        labels[coverage(seg, iv)] = code
    return labels


def merge_runs(seg: Segments, labels: npt.NDArray[np.int16]) -> tuple[I64, I64, npt.NDArray[np.int16]]:
    """Adjacent segments with the same label merged: (start_ns, end_ns, label) arrays."""
    if labels.shape[0] == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), labels
    change = np.empty(labels.shape[0], np.bool_)
    change[0] = True
    change[1:] = labels[1:] != labels[:-1]
    first = np.flatnonzero(change)
    last = np.concatenate((first[1:], [labels.shape[0]])) - 1
    return seg.start_ns[first], seg.end_ns[last], labels[first]
