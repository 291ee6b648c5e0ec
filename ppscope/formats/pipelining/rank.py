"""The actions of torch.distributed.pipelining in one rank's Kineto trace: which stage, micro-batch and step
each stretch of the rank's time belongs to, and where the rank waited for its input.

Actions come from the schedule's own profiler ranges (`PP:2F0`, `Forward 3`, see `actions`); a schedule that
writes none (Schedule1F1B) has them inferred from the operators: a run of top-level CPU operators between two
communication operators is a backward when it is the autograd engine's (`autograd::engine::...`), a forward
when it records autograd history (a `fwdbwd` flow starts in it), and other work otherwise (the optimizer,
gradient scaling); micro-batches are numbered in order within each step, the steps told apart by
`ProfilerStep#N`, else by the optimizer's step or a collective after each step's last backward (`steps`).

Inference needs point-to-point traffic on the rank (a training trace without any is no pipeline).
An F, B or I action whose input comes from another rank starts by waiting for it: from the action's start
to when its receive completed (the end of the `gloo:recv` range posted for it), never past its first operator.
That wait becomes a `recv_wait` span (idle, cause `upstream`); the rest of the action's time between its
operators is host time. Steps are counted per action: the k-th `2F0` of a rank is step k.
This module reads events already on the common clock; `ppscope.formats.kineto.reader` reads the files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppscope.analysis.intervals import running_max
from ppscope.formats.pipelining.actions import is_action_range, parse_action
from ppscope.formats.pipelining.steps import StepsFrom, mark_boundaries, step_marks
from ppscope.trace.actions import PASSES, Action, ActionType

__all__ = [
    "Links",
    "RankActions",
    "RankEvents",
    "find_actions",
    "is_comm",
    "may_hold_actions",
    "restep",
    "top_level",
]

_COMM_PREFIXES = ("c10d::", "c10d_functional::", "_c10d_functional::", "gloo:", "nccl:", "record_param_comms")
_AUTOGRAD = "autograd::engine::"
_P2P_OPS = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")
_P2P_RANGES = ("gloo:send", "gloo:recv", "nccl:send", "nccl:recv")
_WAITING = (ActionType.FORWARD, ActionType.FULL_BACKWARD, ActionType.BACKWARD_INPUT)
"""The passes that take their input from another stage: activations (F) or gradients (B, I)."""
Links = Mapping[tuple[int, ActionType | None], int]
"""(stage, the direction of its data: `ActionType.direction`) -> the rank at the other end of that traffic."""


class _Run(IntEnum):
    """What a run of top-level operators is, when the actions are inferred from them."""

    COMM = 0
    """Communication: no action's work."""
    OTHER = 1
    """A forward where it records autograd history, else other work (the optimizer, gradient scaling)."""
    AUTOGRAD = 2
    """The autograd engine's: a backward."""


@dataclass
class RankEvents:
    """What one rank's file holds that the pipeline reading needs, times on the common clock (ns)."""

    name: str
    """The file's name, for messages."""
    ranges: Mapping[str, Any]
    """Profiler ranges (`user_annotation`) as columns: name (text), start_ns, end_ns, tid."""
    operators: Mapping[str, Any]
    """CPU operators (`cpu_op`) as columns: name (text), start_ns, end_ns (int64 arrays), tid."""
    flow_starts: npt.NDArray[np.int64]
    """Times where an autograd forward-to-backward flow starts (a forward operator recording history)."""

    @cached_property
    def annotations(self) -> pd.DataFrame:
        """The ranges as a frame, made when first asked for: most traces hold no pipeline and never need it."""
        return pd.DataFrame(dict(self.ranges))

    @cached_property
    def ops(self) -> pd.DataFrame:
        """The operators as a frame (names and thread ids as Python objects), made when first asked for."""
        o = self.operators
        return pd.DataFrame(
            {
                "name": pd.Series(o["name"], dtype=object),
                "start_ns": o["start_ns"],
                "end_ns": o["end_ns"],
                "tid": pd.Series(o["tid"], dtype=object),
            },
            copy=False,
        )


@dataclass
class RankActions:
    """The actions one rank ran, in time order: one row each (`stage` -1 where the trace does not say)."""

    frame: pd.DataFrame
    """stage, type, mb, step, start_ns, end_ns, name, wait_from (where a wait for input may begin), ranged."""
    main_tid: object
    inferred: bool
    """True when the actions were inferred from operators (no ranges in the trace)."""
    unknown: list[str] = field(default_factory=list)
    """`PP:` ranges this ppscope cannot read."""
    steps_from: StepsFrom | None = None
    """What told the inferred actions' steps apart; None for actions from ranges (counted per action)."""


def is_comm(names: pd.Series) -> npt.NDArray[np.bool_]:
    """Communication operators and ranges, which are neither compute nor an action's own work."""
    return names.str.startswith(_COMM_PREFIXES).to_numpy(bool)


def top_level(ops: pd.DataFrame) -> pd.DataFrame:
    """The operators no earlier operator of the same thread contains, in time order."""
    if ops.empty:
        return ops
    try:
        tid = pd.factorize(ops["tid"], sort=True)[0]  # codes in the threads' order
    except TypeError:  # ids that do not sort together
        tid = np.full(len(ops), -1)
    if (tid < 0).any():  # a thread without an id, or odd ids: pandas' own sort and groupby decide
        return _top_level_pandas(ops)
    start, end = ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    order = np.lexsort((-end, start, tid))  # by thread, start, the longest first
    first = np.r_[True, tid[order][1:] != tid[order][:-1]]
    reach = running_max(end[order], np.flatnonzero(first))
    before = np.where(first, np.iinfo(np.int64).min, np.roll(reach, 1))
    kept = order[start[order] >= before]
    return ops.iloc[kept[np.argsort(start[kept], kind="stable")]].reset_index(drop=True)


def _top_level_pandas(ops: pd.DataFrame) -> pd.DataFrame:
    o = ops.sort_values(["tid", "start_ns", "end_ns"], ascending=[True, True, False], kind="stable")
    reach = o.groupby("tid", sort=False)["end_ns"].cummax().to_numpy(np.int64)
    tid = o["tid"].to_numpy()
    first = np.ones(len(o), bool)
    first[1:] = tid[1:] != tid[:-1]
    before = np.where(first, np.iinfo(np.int64).min, np.roll(reach, 1))  # integers: ns do not fit a float
    keep = o["start_ns"].to_numpy(np.int64) >= before
    return o[keep].sort_values("start_ns", kind="stable").reset_index(drop=True)


def may_hold_actions(ev: RankEvents) -> bool:
    """False where `find_actions` surely finds nothing, told without the top-level operators: no pipelining
    range (read or not) and no point-to-point operator or range at all."""
    names = set(ev.ranges["name"])
    if any(is_action_range(n) for n in names):
        return True
    return not set(_P2P_RANGES).isdisjoint(names) or not set(_P2P_OPS).isdisjoint(ev.operators["name"])


def find_actions(ev: RankEvents, ops: pd.DataFrame) -> RankActions | None:
    """The rank's actions from its ranges, else inferred from `ops` (its top-level operators); None when the
    rank shows no pipeline at all."""
    ann = ev.annotations
    parsed = {n: parse_action(n) for n in ann["name"].unique()}
    unknown = sorted(n for n, a in parsed.items() if a is None and is_action_range(n))
    known = ann[ann["name"].map(lambda n: parsed[n] is not None).to_numpy(bool)]
    if len(known):
        main = known["tid"].mode().iloc[0]
        return RankActions(_from_ranges(known, parsed, ops[ops["tid"] == main]), main, False, unknown)
    p2p = ops["name"].isin(_P2P_OPS).any() or ann["name"].isin(_P2P_RANGES).any()
    if ops.empty or not p2p or not ops["name"].str.startswith(_AUTOGRAD).any():  # no pipeline: no P2P, or no training
        return RankActions(_empty(), None, False, unknown) if unknown else None
    main = ops["tid"].mode().iloc[0]
    frame, how = _inferred(ev, ops[ops["tid"] == main])
    return RankActions(frame, main, True, unknown, how)


def _empty() -> pd.DataFrame:
    cols = ["stage", "type", "mb", "step", "start_ns", "end_ns", "name", "wait_from", "ranged"]
    return pd.DataFrame({c: pd.Series([], dtype=object) for c in cols})


def _from_ranges(known: pd.DataFrame, parsed: Mapping[str, Action | None], ops: pd.DataFrame) -> pd.DataFrame:
    rows: list[tuple[object, ...]] = []
    o_start, o_end = ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    o_bwd = ops["name"].str.startswith(_AUTOGRAD).to_numpy(bool)
    for name, start, end in zip(known["name"], known["start_ns"], known["end_ns"], strict=True):
        a = parsed[name]
        assert a is not None
        if not a.parts:
            rows.append((a.stage, a.type.value, a.mb, int(start), int(end), name, int(start)))
            continue
        # The parts of an OVERLAP_F_B run one after the other: a part's operators end where they turn from
        # forward to autograd (or back), and the next part (its wait for input first) begins where they end.
        i, j = np.searchsorted(o_start, [start, end])
        begin = int(start)
        for k, part in enumerate(a.parts):
            inside = np.arange(i, j)
            found = inside[o_start[inside] >= begin]
            if k == len(a.parts) - 1:
                rows.append((part.stage, part.type.value, part.mb, begin, int(end), name, begin))
                break
            turn = found[o_bwd[found] != (part.type is not ActionType.FORWARD)]
            mine = found[o_start[found] < (o_start[turn[0]] if len(turn) else end)]
            stop = int(o_end[mine].max()) if len(mine) else begin
            rows.append((part.stage, part.type.value, part.mb, begin, stop, name, begin))
            begin = stop
    frame = pd.DataFrame(rows, columns=["stage", "type", "mb", "start_ns", "end_ns", "name", "wait_from"])
    frame = frame.sort_values("start_ns", kind="stable").reset_index(drop=True)
    frame["step"] = frame.groupby(["stage", "type", "mb"], sort=False).cumcount()
    frame["ranged"] = True
    return frame


def _inferred(ev: RankEvents, ops: pd.DataFrame) -> tuple[pd.DataFrame, StepsFrom]:
    """Forward and backward runs of top-level operators (see the module's docstring), and what told their
    steps apart. A forward run is cut to its first and last operator that records history: gradient
    scaling, the optimizer and zero_grad run between a step's last backward and the next step's first
    forward with no communication between them."""
    comm = is_comm(ops["name"])
    bwd = ops["name"].str.startswith(_AUTOGRAD).to_numpy(bool)
    start, end = ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    flows = np.sort(ev.flow_starts)
    records = np.searchsorted(flows, end, side="right") > np.searchsorted(flows, start, side="left")
    cls = np.where(comm, _Run.COMM, np.where(bwd, _Run.AUTOGRAD, _Run.OTHER))
    run = np.concatenate(([0], np.cumsum(cls[1:] != cls[:-1]))) if len(cls) else np.zeros(0, np.int64)
    work_end = np.maximum.accumulate(np.where(comm, np.iinfo(np.int64).min, end)) if len(end) else end
    rows: list[tuple[object, ...]] = []
    cuts = np.flatnonzero(np.diff(run)) + 1
    for idx in np.split(np.arange(len(run)), cuts):
        if not len(idx) or cls[idx[0]] == _Run.COMM:
            continue
        mine = idx if cls[idx[0]] == _Run.AUTOGRAD else idx[records[idx]]
        if not len(mine):
            continue
        kind = (ActionType.FULL_BACKWARD if cls[idx[0]] == _Run.AUTOGRAD else ActionType.FORWARD).value
        k0 = int(mine[0])
        s, e = int(start[k0]), int(end[mine].max())
        wait_from = max(int(work_end[k0 - 1]), int(start[0])) if k0 > 0 else s
        rows.append((-1, kind, s, e, wait_from))
    frame = pd.DataFrame(rows, columns=["stage", "type", "start_ns", "end_ns", "wait_from"])
    how, marks = step_marks(ev.annotations, ops)
    bounds = marks if how is StepsFrom.PROFILER_STEP else mark_boundaries(frame, marks)
    if how is not StepsFrom.PROFILER_STEP and not len(bounds):
        how = StepsFrom.NONE
    return restep(frame, bounds), how


def restep(frame: pd.DataFrame, bounds: npt.NDArray[np.int64]) -> pd.DataFrame:
    """Inferred actions (stage, type, start_ns, end_ns, wait_from, ...) in steps that begin at `bounds` (the
    first at the trace's start), micro-batches numbered within each step, the metadata inference's runs
    dropped (`_drop_warmup`)."""
    frame = frame.sort_values("start_ns", kind="stable").reset_index(drop=True)
    frame["step"] = np.searchsorted(np.sort(bounds), frame["start_ns"].to_numpy(np.int64), side="right")
    frame["mb"] = frame.groupby(["step", "type"]).cumcount()
    frame["name"] = frame["type"] + frame["mb"].astype(str) + " (inferred)"
    cols = ["stage", "type", "mb", "step", "start_ns", "end_ns", "name", "wait_from"]
    out = _drop_warmup(frame[cols])
    out["ranged"] = False
    return out


def _drop_warmup(frame: pd.DataFrame) -> pd.DataFrame:
    """Without the runs of the first step's metadata inference: torch runs a stage's forward (and on the last
    stage its backward) once before the first step's actions, to learn shapes. A step with more runs of a
    kind than the later steps have loses its earliest ones, and its micro-batches are numbered again."""
    if frame.empty:
        return frame
    n = frame.groupby(["step", "type"]).size()
    later = n[n.index.get_level_values("step") > n.index.get_level_values("step").min()]
    usual = (
        later.groupby(level="type").agg(lambda c: int(c.mode().iloc[0]))
        if len(later)
        else n.groupby(level="type").min()
    )
    extra = n - usual.reindex(n.index.get_level_values("type")).to_numpy()
    drop = (
        frame.groupby(["step", "type"]).cumcount()
        < extra.reindex(pd.MultiIndex.from_frame(frame[["step", "type"]])).to_numpy()
    )
    out = frame[~drop].copy()
    out["mb"] = out.groupby(["step", "type"]).cumcount()
    out["name"] = out["type"] + out["mb"].astype(str) + " (inferred)"
    return out.reset_index(drop=True)


def label_ops(ops: pd.DataFrame, acts: pd.DataFrame) -> npt.NDArray[np.int64]:
    """The row of `acts` (its index) containing each operator's start, -1 for none (actions of one thread
    do not overlap)."""
    if acts.empty:
        return np.full(len(ops), -1, np.int64)
    a = acts.sort_values("start_ns", kind="stable")
    starts, ends = a["start_ns"].to_numpy(np.int64), a["end_ns"].to_numpy(np.int64)
    t = ops["start_ns"].to_numpy(np.int64)
    i = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, None)
    inside = (t >= starts[i]) & (t < ends[i])
    return np.where(inside, a.index.to_numpy()[i], -1).astype(np.int64)


def waits(
    acts: pd.DataFrame,
    ops: pd.DataFrame,
    recvs: pd.DataFrame,
    remote: Links,
    blocking: pd.DataFrame | None = None,
) -> tuple[list[tuple[object, ...]], bool]:
    """(recv_wait rows, assumed) for the compute actions whose input comes from another rank: `remote` maps
    (stage, direction) to the rank that sends that input. A row is (stage, mb, step, phase, start, end, peer, name).
    An inferred action with no receive between its last preceding work and its first operator (other work,
    loading data, ran after its receive) waited in the receive `blocking` holds (receive operators and
    ranges, start_ns and end_ns) between the previous action's end and its first operator.
    `assumed`: some wait had no matching receive and took the whole time before the action's first operator."""
    rows: list[tuple[object, ...]] = []
    assumed = False
    r_start, r_end = _sorted_spans(recvs)
    b_start, b_end = _sorted_spans(blocking) if blocking is not None else (r_start, r_end)
    o_start = np.sort(ops["start_ns"].to_numpy(np.int64))
    posted = _posted(acts, r_start, r_end)
    prev_end = np.iinfo(np.int64).min
    for row in acts.itertuples(index=False):
        after, prev_end = prev_end, max(prev_end, int(row.end_ns))
        if row.type not in _WAITING:
            continue
        direction = ActionType(row.type).direction
        peer = remote.get((int(row.stage), direction))
        if peer is None:
            continue
        k = np.searchsorted(o_start, row.start_ns)
        first = int(o_start[k]) if k < len(o_start) and o_start[k] < row.end_ns else int(row.end_ns)
        a0 = max(int(row.wait_from), int(row.start_ns) if row.ranged else int(row.wait_from))
        done = posted.get((int(row.stage), direction, int(row.mb), int(row.step)))
        if done is None:
            lo, hi = np.searchsorted(r_start, [row.wait_from, first])
            done = int(r_end[lo:hi].max()) if hi > lo else None
        if done is None and not row.ranged:
            lo, hi = np.searchsorted(b_start, [after, first])
            held = np.arange(lo, hi)[b_end[lo:hi] <= first]
            if len(held):
                a0, done = int(b_start[held].min()), int(b_end[held].max())
        if done is None:
            assumed, done = True, first
        stop = min(max(done, a0), first)
        if stop > a0:
            rows.append((int(row.stage), int(row.mb), int(row.step), row.type, a0, stop, peer, row.name))
    return rows, assumed


def _sorted_spans(frame: pd.DataFrame) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(starts, ends) of the frame's spans, by start."""
    start, end = frame["start_ns"].to_numpy(np.int64), frame["end_ns"].to_numpy(np.int64)
    order = np.argsort(start, kind="stable")
    return start[order], end[order]


def _posted(acts: pd.DataFrame, r_start: npt.NDArray[np.int64], r_end: npt.NDArray[np.int64]) -> dict:
    """When the receive posted by each RECV_F / RECV_B action completed: (stage, its direction, mb, step) -> ns."""
    out: dict[tuple[int, ActionType | None, int, int], int] = {}
    posts = acts[acts["type"].isin([ActionType.RECV_F, ActionType.RECV_B])]
    for row in posts.itertuples(index=False):
        lo, hi = np.searchsorted(r_start, [row.start_ns, row.end_ns])
        if hi > lo:
            out[(int(row.stage), ActionType(row.type).direction, int(row.mb), int(row.step))] = int(r_end[lo:hi].max())
    return out


def send_rows(
    acts: pd.DataFrame, ops: pd.DataFrame, remote_to: Links, backend: pd.DataFrame | None = None
) -> list[tuple[object, ...]]:
    """`send` rows (stage, mb, step, phase, start, end, peer, name): each SEND_F / SEND_B action, or where a
    schedule has none, each send operator, taken for the compute action whose range holds it (ScheduleGPipe's
    `Forward 3` posts its send inside) or else the last one before it, until the end of
    the backend's send ranges it posted (`backend`: `gloo:send` ranges that start inside it, where a
    blocking send waits for its receiver) or the rank's next operator, whichever comes first: a send that
    does not block (torch's batched P2P) holds the rank no longer than its operator. `remote_to` maps
    (stage, direction) to the rank the stage sends to in that direction."""
    rows: list[tuple[object, ...]] = []
    sends = acts[acts["type"].isin([ActionType.SEND_F, ActionType.SEND_B])]
    for row in sends.itertuples(index=False):
        peer = remote_to.get((int(row.stage), ActionType(row.type).direction))
        if peer is not None:
            rows.append(
                (
                    int(row.stage),
                    int(row.mb),
                    int(row.step),
                    row.type,
                    int(row.start_ns),
                    int(row.end_ns),
                    peer,
                    row.name,
                )
            )
    if len(sends) or acts.empty:
        return rows
    compute = acts[acts["type"].isin(_WAITING)].sort_values("start_ns")
    c_start = compute["start_ns"].to_numpy(np.int64)
    posts = ops[ops["name"] == "c10d::send"]
    ends = _held_until(posts, backend, ops) if backend is not None else posts["end_ns"].to_numpy(np.int64)
    for name, s, e in zip(posts["name"], posts["start_ns"], ends, strict=True):
        k = int(np.searchsorted(c_start, s, side="right")) - 1  # the action holding it, else the last before it
        if k < 0:
            continue
        a = compute.iloc[k]
        direction = ActionType(a["type"]).direction
        peer = remote_to.get((int(a["stage"]), direction))
        if peer is not None and direction is not None:
            send = ActionType.send(direction).value
            rows.append((int(a["stage"]), int(a["mb"]), int(a["step"]), send, int(s), int(e), peer, name))
    return rows


def _held_until(posts: pd.DataFrame, backend: pd.DataFrame, ops: pd.DataFrame) -> npt.NDArray[np.int64]:
    """Each operator's end, or later the end of the backend's ranges that start inside it, but not past the
    start of the next of `ops` (the rank's top-level operators)."""
    b_start, b_end = _sorted_spans(backend)
    o_start = np.sort(ops["start_ns"].to_numpy(np.int64))
    out = posts["end_ns"].to_numpy(np.int64).copy()
    for i, (s, e) in enumerate(zip(posts["start_ns"].to_numpy(np.int64), out.copy(), strict=True)):
        lo, hi = np.searchsorted(b_start, [s, e], side="left")
        if hi > lo:
            k = np.searchsorted(o_start, s, side="right")
            nxt = int(o_start[k]) if k < len(o_start) else np.iinfo(np.int64).max
            out[i] = max(e, min(int(b_end[lo:hi].max()), nxt))
    return out


def order_of_step(acts: pd.DataFrame, step: int = 0) -> list[Action]:
    """The compute actions of one step, in order (parts of a paired action as one)."""
    rows = acts[(acts["step"] == step) & acts["type"].isin(PASSES)].sort_values("start_ns")
    out: list[Action] = []
    last_name = None
    for row in rows.itertuples(index=False):
        part = Action(int(row.stage), ActionType(row.type), int(row.mb))
        if row.ranged and row.name == last_name and out and _paired(row.name):
            prev = out[-1]
            out[-1] = Action(-1, ActionType.OVERLAP_F_B, parts=(*(prev.parts or (prev,)), part))
        else:
            out.append(part)
        last_name = row.name
    return out


def _paired(name: str) -> bool:
    """The range names an OVERLAP_F_B, whose parts are rows of their own."""
    a = parse_action(name)
    return a is not None and a.type is ActionType.OVERLAP_F_B


def stages_in(acts: pd.DataFrame) -> Sequence[int]:
    return sorted(int(s) for s in acts.loc[acts["type"].isin(PASSES), "stage"].unique() if s >= 0)
