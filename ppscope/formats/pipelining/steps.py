"""Where one training step ends and the next begins when a rank's actions are inferred from its operators,
and which pipeline engine wrote such a trace.

A user who wraps `profile()` round a few steps and never calls `prof.step()` gets no `ProfilerStep#N` range.
Synchronous pipeline training flushes at every step, so a step ends after its last backward with the work
that closes it: the optimizer's step (`Optimizer.step#SGD.step`), a collective (DeepSpeed broadcasts the loss
to every stage, data-parallel replicas all-reduce their gradients). A mark counts where it falls in a pause
between a backward and the next forward of the rank; with no mark at all, the pause where the first stage
has the fewest forwards in flight is taken (`pause_boundaries`): every other stage's step ends before the
first stage's last backward and the next begins after its first forward. This module knows nothing of
stages or spans; `rank` numbers the micro-batches and `job` applies the pauses across ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppscope.trace.actions import ActionType
from ppscope.trace.schedules import Engine

__all__ = ["Engine", "StepsFrom", "engine_of", "mark_boundaries", "pause_boundaries", "step_marks"]

_PROFILER_STEP = "ProfilerStep#"
_OPTIMIZER_STEP = "Optimizer.step#"
_COLLECTIVES = (
    "gloo:all_reduce",
    "gloo:broadcast",
    "nccl:all_reduce",
    "nccl:broadcast",
    "c10d::allreduce_",
    "c10d::broadcast_",
)
_BROADCASTS = ("gloo:broadcast", "nccl:broadcast", "c10d::broadcast_")
_SENDS = ("c10d::send", "gloo:send", "nccl:send")
_RECEIVES = ("c10d::recv_", "c10d::recv_any_source_", "gloo:recv", "nccl:recv")


class StepsFrom(StrEnum):
    """What told a rank's steps apart, in the order they are tried."""

    PROFILER_STEP = "ProfilerStep#N ranges"
    OPTIMIZER = "the optimizer's step (Optimizer.step#...) after each step's last backward"
    COLLECTIVE = "a collective after each step's last backward (a loss broadcast, a gradient all-reduce)"
    PAUSE = "the pause after each step's last backward on the first stage (no step marks in the trace)"
    NONE = "nothing: the trace is one step"


def step_marks(ann: pd.DataFrame, ops: pd.DataFrame) -> tuple[StepsFrom, npt.NDArray[np.int64]]:
    """(what marks the rank's steps, the marks' times in ns): the starts of `ProfilerStep#N` after the first;
    else the ends of the optimizer's steps; else the ends of collectives (ranges or operators)."""
    names = ann["name"].astype(str)
    steps = ann[names.str.startswith(_PROFILER_STEP).to_numpy(bool)]
    if len(steps):
        return StepsFrom.PROFILER_STEP, np.sort(steps["start_ns"].to_numpy(np.int64))[1:]
    optim = ann[names.str.startswith(_OPTIMIZER_STEP).to_numpy(bool)]
    if len(optim):
        return StepsFrom.OPTIMIZER, np.sort(optim["end_ns"].to_numpy(np.int64))
    coll = [
        f.loc[f["name"].astype(str).str.startswith(_COLLECTIVES).to_numpy(bool), "end_ns"].to_numpy(np.int64)
        for f in (ann, ops)
    ]
    ends = np.sort(np.concatenate(coll))
    return (StepsFrom.COLLECTIVE, ends) if len(ends) else (StepsFrom.NONE, ends)


def _pauses(frame: pd.DataFrame) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The rank's pauses between a backward and the next forward, in time order: (the backward's end, the
    forward's start, forwards in flight then)."""
    a = frame.sort_values("start_ns", kind="stable")
    kind = a["type"].to_numpy(object)
    fwd, bwd = kind == ActionType.FORWARD, kind == ActionType.FULL_BACKWARD
    inflight = np.cumsum(fwd) - np.cumsum(bwd)
    at = np.flatnonzero(bwd[:-1] & fwd[1:])
    return a["end_ns"].to_numpy(np.int64)[at], a["start_ns"].to_numpy(np.int64)[at + 1], inflight[at]


def mark_boundaries(frame: pd.DataFrame, marks: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where the rank's steps begin after its first: the start of the forward after each pause (backward to
    forward) that holds a mark. Marks elsewhere (a collective before the first forward, or inside a step)
    split nothing."""
    ends, starts, _ = _pauses(frame)
    if not len(marks) or not len(starts):
        return np.zeros(0, np.int64)
    i = np.searchsorted(marks, ends, side="left")
    held = (i < len(marks)) & (marks[np.minimum(i, len(marks) - 1)] <= starts)
    return starts[held]


def pause_boundaries(frames: Mapping[int, pd.DataFrame]) -> npt.NDArray[np.int64]:
    """Where the job's steps begin after the first, told from the pauses alone: on each rank the pauses
    with the fewest forwards in flight are where its pipeline may have emptied; the first stage's (the rank
    with the fewest such pauses) are the step ends, since every stage's step lies inside the first stage's."""
    best: npt.NDArray[np.int64] | None = None
    for frame in frames.values():
        _, starts, inflight = _pauses(frame)
        if not len(starts):
            continue
        here = starts[inflight == inflight.min()]
        if best is None or len(here) < len(best):
            best = here
    return best if best is not None else np.zeros(0, np.int64)


def engine_of(ranged: bool, ann: Mapping[int, pd.DataFrame], ops: Mapping[int, pd.DataFrame]) -> Engine:
    """The engine of a job whose ranks' ranges (`ann`) and main thread's operators (`ops`) are given: torch's
    when some rank has action ranges (`ranged`) or posts a receive while a send is in flight (its batched
    P2P), DeepSpeed's when every rank's sends and receives block one at a time and each broadcasts (the
    loss, every step), else unknown."""
    if ranged:
        return Engine.TORCH
    batched, broadcasts = False, True
    for r, a in ann.items():
        both = pd.concat([a[["name", "start_ns", "end_ns"]], ops[r][["name", "start_ns", "end_ns"]]])
        names = both["name"].astype(str)
        batched |= _overlap(both[names.isin(_SENDS).to_numpy(bool)], both[names.isin(_RECEIVES).to_numpy(bool)])
        broadcasts &= bool(names.str.startswith(_BROADCASTS).any())
    if batched:
        return Engine.TORCH
    return Engine.DEEPSPEED if broadcasts and ann else Engine.UNKNOWN


def _overlap(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Some interval of `a` and some of `b` overlap in time."""
    if a.empty or b.empty:
        return False
    order = np.argsort(b["start_ns"].to_numpy(np.int64), kind="stable")
    b_start = b["start_ns"].to_numpy(np.int64)[order]
    b_reach = np.maximum.accumulate(b["end_ns"].to_numpy(np.int64)[order])
    a_start, a_end = a["start_ns"].to_numpy(np.int64), a["end_ns"].to_numpy(np.int64)
    k = np.searchsorted(b_start, a_end, side="left") - 1  # the last b starting before each a ends
    ok = k >= 0
    return bool((b_reach[np.maximum(k, 0)][ok] > a_start[ok]).any())
