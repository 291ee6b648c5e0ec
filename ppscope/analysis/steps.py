"""Where a stage's fill and drain lie: the idle time the schedule itself puts there, step by step.

Note (the positions): without a flush between steps, a stage fills once, before its first compute, and drains
once, after its last. When every step ends in a flush (gpipe and interleaved inference, every training
schedule), each step fills and drains the pipeline again, and on each stage:
  - between its last compute of step t and its first of step t+1, the time up to the instant the step's last
    compute ends on any stage (the pipeline has emptied) is the drain of step t, the rest the fill of step t+1;
  - in a training step, the time before its first backward (B or I) is fill, the warm-up: the backward wave has
    not reached it; the time after its last forward is drain, the cool-down: the forward wave has left it.
    Where the last forward comes before the first backward (GPipe's order), the gap between them is split at
    the instant the last forward ends on any stage: drain of the forward wave, then fill of the backward one.
Between the warm-up and the cool-down (1F1B's steady state) idle time keeps the cause of the span that covers it.
On balanced stages with free transfers this makes fill + drain the textbook bubble and leaves nothing else.
This module knows compute spans, steps and times; `bubbles` decides what the rest of the idle time is.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppscope.analysis.intervals import Intervals, clip

__all__ = ["ComputeSpans", "Waves", "fill_drain"]

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class ComputeSpans:
    """The compute spans of a trace, one entry per span."""

    group: I64
    """Index of the span's physical stage."""
    step: I64
    backward: npt.NDArray[np.bool_]
    """A training backward pass (B, I or W); False for forwards and for inference."""
    start_ns: I64
    end_ns: I64


@dataclass(frozen=True)
class Waves:
    """When each step's compute ends on any stage (`wave_end`), and its forwards (`fwd_end`): Series indexed
    by step (all step 0 without a flush). The only part of fill and drain that needs every stage at once."""

    wave_end: pd.Series
    fwd_end: pd.Series

    @classmethod
    def of(cls, c: ComputeSpans, *, flush: bool) -> Waves:
        step = c.step if flush else np.zeros_like(c.step)
        fwd = ~c.backward
        return cls(_max_by_step(step, c.end_ns), _max_by_step(step[fwd], c.end_ns[fwd]))

    @classmethod
    def merged(cls, parts: list[Waves]) -> Waves:
        """The waves of a whole trace from those of its parts (each rank's, say)."""

        def top(series: list[pd.Series]) -> pd.Series:
            kept = [s for s in series if len(s)]
            return pd.concat(kept).groupby(level=0).max() if kept else pd.Series(dtype=np.int64)

        return cls(top([p.wave_end for p in parts]), top([p.fwd_end for p in parts]))


def _max_by_step(step: I64, end: I64) -> pd.Series:
    """The latest end of each step, indexed by step in order (a groupby's max, in numpy: a few calls)."""
    order = np.argsort(step, kind="stable")
    keys = step[order]
    at = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, np.int64)
    top = np.maximum.reduceat(end[order], at) if len(at) else np.zeros(0, np.int64)
    return pd.Series(top.astype(np.int64), index=pd.Index(keys[at].astype(np.int64), name="step"), name="end")


@dataclass(frozen=True)
class _PerStep:
    """One entry per (stage, step) in that order: the first start and last end of its compute, and its first
    backward start and last forward end (exact ns; `train` says where a step has both)."""

    group: I64
    step: I64
    first: I64
    last: I64
    first_bwd: I64
    last_fwd: I64
    train: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, c: ComputeSpans, *, flush: bool) -> _PerStep:
        step = c.step if flush else np.zeros_like(c.step)
        order = np.lexsort((step, c.group))
        g, s = c.group[order], step[order]
        at = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (s[1:] != s[:-1])])
        start, end, bwd = c.start_ns[order], c.end_ns[order], c.backward[order]
        first, last = np.minimum.reduceat(start, at), np.maximum.reduceat(end, at)
        has_bwd, has_fwd = (np.add.reduceat(k.astype(np.int64), at) > 0 for k in (bwd, ~bwd))
        first_bwd, last_fwd = _reduce(np.minimum, start, bwd, at), _reduce(np.maximum, end, ~bwd, at)
        return cls(g[at], s[at], first, last, first_bwd, last_fwd, has_bwd & has_fwd)


def _reduce(op: np.ufunc, values: I64, keep: npt.NDArray[np.bool_], at: I64) -> I64:
    """`op` (minimum or maximum) over the kept values of each run starting at `at`, in integers: epoch times
    (2^60 ns) have no float64 that holds them to the ns. A run with none gets the sentinel (its step is no
    training step, and `train` leaves it out)."""
    sentinel = np.iinfo(np.int64).max if op is np.minimum else np.iinfo(np.int64).min
    out: I64 = op.reduceat(np.where(keep, values, sentinel).astype(np.int64), at)
    return out


def fill_drain(
    c: ComputeSpans, groups: int, lo: int, hi: int, *, flush: bool, waves: Waves | None = None
) -> list[tuple[Intervals, Intervals]]:
    """(fill, drain) intervals of each stage 0..groups-1, clipped to the window [lo, hi).

    `flush`: every step ends in a flush, so fill and drain are placed per step (module note); else once per
    stage. Stages without compute get none (all their idle time keeps its span's cause). `waves`: those of the
    whole trace when `c` holds only some of its stages; else they are found from `c`."""
    empty = (Intervals.empty(), Intervals.empty())
    out = [empty] * groups
    if c.start_ns.shape[0] == 0:
        return out
    per = _PerStep.of(c, flush=flush)
    waves = waves or Waves.of(c, flush=flush)
    bounds = [*np.flatnonzero(np.r_[True, per.group[1:] != per.group[:-1]]).tolist(), len(per.group)]
    for a, b in itertools.pairwise(bounds):
        g, steps = per.group[a], per.step[a:b]
        fwd, known = _by_step(waves.fwd_end, steps)  # a step without forwards has none (no NaN: exact ns)
        wave_end, every = _by_step(waves.wave_end, steps)
        if not every.all():
            raise KeyError(f"steps {steps[~every][:3].tolist()} have no wave end")
        fill, drain = _positions(
            per.first[a:b],
            per.last[a:b],
            wave_end,
            per.first_bwd[a:b],
            per.last_fwd[a:b],
            per.train[a:b],
            (fwd, known),
            lo,
            hi,
        )
        out[int(g)] = (clip(fill, lo, hi), clip(drain, lo, hi))
    return out


def _by_step(ends: pd.Series, steps: I64) -> tuple[I64, npt.NDArray[np.bool_]]:
    """The value of each of `steps` in a Series indexed by step in order (0 for one it lacks), and which it
    holds: a binary search, where pandas' `loc` and `reindex` cost a fraction of a millisecond each."""
    index, values = ends.index.to_numpy(np.int64), ends.to_numpy(np.int64)
    if not len(index):
        return np.zeros(len(steps), np.int64), np.zeros(len(steps), bool)
    at = np.minimum(np.searchsorted(index, steps), len(index) - 1)
    found = index[at] == steps
    return np.where(found, values[at], 0), found


def _positions(
    first: I64,
    last: I64,
    wave_end: I64,
    first_bwd: I64,
    last_fwd: I64,
    train: npt.NDArray[np.bool_],
    fwd_end: tuple[I64, npt.NDArray[np.bool_]],
    lo: int,
    hi: int,
) -> tuple[Intervals, Intervals]:
    """One stage's fill and drain from its steps in order: first/last compute, the pipeline's end of each step,
    and for training steps (`train`) the first backward, last forward and the pipeline's end of the forwards
    (with where it is known)."""
    # before the first step and after the last one
    fill_s, fill_e = [np.array([min(lo, int(first[0]))])], [first[:1]]
    drain_s, drain_e = [last[-1:]], [np.array([max(hi, int(last[-1]))])]
    # between steps: drain until the pipeline has emptied, then fill
    cut = np.clip(wave_end[:-1], last[:-1], np.maximum(first[1:], last[:-1]))
    drain_s.append(last[:-1])
    drain_e.append(cut)
    fill_s.append(cut)
    fill_e.append(first[1:])
    # inside training steps: warm-up before the first backward, cool-down after the last forward
    if train.any():
        fb, lf = first_bwd[train], last_fwd[train]
        wave = np.where(fwd_end[1][train], fwd_end[0][train], lf)
        steady = lf > fb
        # warm-up until the first backward, cool-down from the last forward; in GPipe's order they overlap on
        # [lf, fb), which is cut at the forward wave's end: its drain, then the backward wave's fill
        fill_s.append(first[train])
        fill_e.append(np.where(steady, fb, lf))
        drain_s.append(np.where(steady, lf, fb))
        drain_e.append(last[train])
        split = np.clip(wave, lf, np.maximum(lf, fb))
        gpipe = ~steady
        drain_s.append(lf[gpipe])
        drain_e.append(split[gpipe])
        fill_s.append(split[gpipe])
        fill_e.append(fb[gpipe])
    fill = Intervals(np.concatenate(fill_s).astype(np.int64), np.concatenate(fill_e).astype(np.int64))
    drain = Intervals(np.concatenate(drain_s).astype(np.int64), np.concatenate(drain_e).astype(np.int64))
    return fill, drain
