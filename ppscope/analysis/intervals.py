"""Vectorised interval arithmetic on integer nanoseconds: clipping, unions and the elementary-segment sweep.

Everything here works on numpy int64 arrays of starts and ends and never loops over intervals in Python.
It knows nothing about spans, stages or causes: callers pass plain arrays and level codes.

Note (the sweep): all interval ends are collected into one sorted array of boundaries; consecutive
boundaries form elementary segments that no interval starts or ends inside. Coverage of each segment by a
set of intervals is a prefix sum of +1 at each start's boundary index and -1 at each end's. Because every
segment is whole, per-segment labels add up to the window length exactly, in integer ns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = [
    "Intervals",
    "Segments",
    "clip",
    "coverage",
    "covered_within",
    "label_segments",
    "merge_runs",
    "merged",
    "union_length",
]

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


def merged(iv: Intervals) -> Intervals:
    """The union of `iv` as disjoint intervals in order (overlapping and touching ones joined)."""
    if len(iv) == 0:
        return Intervals.empty()
    order = np.argsort(iv.start_ns, kind="stable")
    s = iv.start_ns[order]
    e = np.maximum.accumulate(iv.end_ns[order])
    # A new run starts where the start lies past every end seen before it.
    prev_end = np.concatenate(([s[0]], e[:-1]))
    new_run = s > prev_end
    new_run[0] = True
    run_id = np.cumsum(new_run) - 1
    run_start = s[new_run]
    run_end = run_start.copy()  # never below its start (an end before 0 stays itself)
    np.maximum.at(run_end, run_id, e)
    return Intervals(run_start, run_end)


def union_length(iv: Intervals) -> int:
    """Total length of the union of `iv` (overlaps counted once)."""
    runs = merged(iv)
    return int((runs.end_ns - runs.start_ns).sum())


def covered_within(iv: Intervals, lo_ns: I64, hi_ns: I64) -> I64:
    """For each window [lo_ns[i], hi_ns[i]), the length of the union of `iv` inside it (0 for an empty window)."""
    runs = merged(iv)
    if not len(runs):
        return np.zeros(lo_ns.shape[0], np.int64)
    before = np.concatenate(([0], np.cumsum(runs.end_ns - runs.start_ns)))  # covered before each run starts

    def upto(x: I64) -> I64:
        """The union's length before x: the runs that start by x, the last of them cut at x."""
        i = np.searchsorted(runs.start_ns, x, side="right")
        last = np.maximum(i - 1, 0)
        inside = np.clip(x - runs.start_ns[last], 0, runs.end_ns[last] - runs.start_ns[last])
        return np.where(i > 0, before[last] + inside, 0).astype(np.int64)

    return np.maximum(upto(hi_ns) - upto(np.minimum(lo_ns, hi_ns)), 0)


@dataclass(frozen=True)
class Segments:
    """Elementary segments of a window, [bounds[i], bounds[i+1]), and where each input interval lies in them.

    `index[k]` holds, for the k-th interval set given to `of`, the boundary index of every start and end; a set
    given by name to `of` is found by `names`, so that a caller asks `covers("fill")`, not for a position.
    """

    bounds: I64
    index: tuple[tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]], ...] = ()
    names: dict[str, int] = field(default_factory=dict)

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
    def of(cls, lo_ns: int, hi_ns: int, *ivs: Intervals, **named: Intervals) -> Segments:
        """Segments of [lo_ns, hi_ns) cut at every end of `ivs` and `named`, which must already be clipped to it.
        The sets in `ivs` keep their positions (`label_segments` reads them in order); `named` ones follow."""
        every = [*ivs, *named.values()]
        parts = [np.array([lo_ns, hi_ns], np.int64)]
        for iv in every:
            parts += [iv.start_ns, iv.end_ns]
        # One sort gives both the boundaries and every end's position among them (no searchsorted).
        bounds, inverse = np.unique(np.concatenate(parts), return_inverse=True)
        index = []
        pos = 2
        for iv in every:
            n = len(iv)
            index.append((inverse[pos : pos + n], inverse[pos + n : pos + 2 * n]))
            pos += 2 * n
        return cls(bounds, tuple(index), {name: len(ivs) + k for k, name in enumerate(named)})

    def covers(self, name: str) -> npt.NDArray[np.bool_]:
        """For each segment, whether an interval of the set given to `of` as `name` covers it."""
        return coverage(self, self.names[name])


def coverage(seg: Segments, k: int) -> npt.NDArray[np.bool_]:
    """For each segment, whether any interval of the k-th set given to `Segments.of` covers it."""
    n = seg.bounds.shape[0]
    i0, i1 = seg.index[k]
    if i0.shape[0] == 0 or n < 2:
        return np.zeros(max(n - 1, 0), np.bool_)
    delta = np.bincount(i0, minlength=n) - np.bincount(i1, minlength=n)
    return np.cumsum(delta)[:-1] > 0


def label_segments(seg: Segments, codes: list[int], default: int) -> npt.NDArray[np.int16]:
    """One label per segment: the code of the first interval set (in `Segments.of` order, highest precedence
    first) that covers it, else `default`. `codes[k]` is the label of set k."""
    labels = np.full(max(seg.bounds.shape[0] - 1, 0), default, np.int16)
    for k in reversed(range(len(codes))):
        labels[coverage(seg, k)] = codes[k]
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


def running_max(values: npt.NDArray[np.int64], starts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The running maximum of `values`, started again at each index of `starts` (sorted, the first 0): where
    each run of spans has reached so far, in integers (ns do not fit a float)."""
    out = np.empty_like(values)
    for a, b in zip(starts.tolist(), [*starts[1:].tolist(), len(values)], strict=True):
        out[a:b] = np.maximum.accumulate(values[a:b])
    return out
