"""A torch.distributed.pipelining job across its ranks' Kineto files: stages on ranks, the schedule's name,
and each rank's spans in ppscope's vocabulary.

Per rank (`rank` finds the actions): the action ranges become `range` spans labelled with stage,
micro-batch, step, chunk and the action type as phase; on a CPU trace the top-level operators that are not
communication are the compute (`kernel` spans, labelled with the action they ran in; one outside every action
is the training loop's own work, a `host` span, as a recording hook sees it), each input wait a
`recv_wait` span and each send a `send` span with its peer; on a GPU trace the kernels are the compute as
before, labelled with the action that launched them, and a communication kernel launched by a RECV action
is that action's `recv_wait`. Across ranks: which rank holds which stage (from the ranges; for single-stage
schedules, from the direction of traffic or rank order, said in a warning), the placement (loop or V),
the schedule named from one step's action order, micro-batches M and stages per rank V.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from ppscope.formats.ordering import order_stages
from ppscope.formats.pipelining.actions import name_schedule, placement_name
from ppscope.formats.pipelining.rank import (
    Links,
    RankActions,
    RankEvents,
    find_actions,
    is_comm,
    label_ops,
    may_hold_actions,
    order_of_step,
    restep,
    send_rows,
    stages_in,
    top_level,
    waits,
)
from ppscope.formats.pipelining.steps import StepsFrom, engine_of, pause_boundaries
from ppscope.formats.spancolumns import spans_frame_of
from ppscope.trace.actions import PASSES, ActionType
from ppscope.trace.model import SpanKind
from ppscope.trace.notices import Notice, NoticeCode
from ppscope.trace.schedules import Engine

__all__ = ["PipelineRank", "PipelineRead", "cpu_compute", "read_pipeline"]

_LABELS = ["stage", "mb", "step", "chunk", "phase", "peer"]
_RECEIVES = ("c10d::recv_", "c10d::recv_any_source_", "gloo:recv", "nccl:recv")
_WAITING = (ActionType.FORWARD, ActionType.FULL_BACKWARD, ActionType.BACKWARD_INPUT)
_SEND_RANGES = ("gloo:send", "nccl:send")


@dataclass
class PipelineRank:
    """What `read_pipeline` takes of one rank's file."""

    events: RankEvents
    columns: dict[str, Any]
    """The spans read as they are, as columns (`Columns.spans`): GPU work, ranges and steps (with `launch_ns`)."""
    gpu: bool

    @cached_property
    def spans(self) -> pd.DataFrame:
        """The spans as a frame, made when first asked for: only for a trace that holds a pipeline."""
        return spans_frame_of(self.columns)


@dataclass
class PipelineRead:
    spans: dict[int, pd.DataFrame]
    """Per rank, every span with the schema's columns but `rank` and `tokens`."""
    stage_of: dict[int, int]
    """Each rank's physical stage (its position in the pipeline)."""
    schedule: str
    microbatches: int
    chunks: int
    config: dict[str, Any] = field(default_factory=dict)
    warnings: list[Notice] = field(default_factory=list)
    engine: Engine = Engine.TORCH
    """The engine whose actions the files show."""


def cpu_compute(ops: pd.DataFrame, main: object) -> pd.DataFrame:
    """The top-level operators that are not communication, as `kernel` spans (lane `compute` on the main
    thread, `cpu TID` on others), unlabelled."""
    keep = ops[~is_comm(ops["name"])]
    lane = np.where(keep["tid"].to_numpy() == main, "compute", "cpu " + keep["tid"].astype(str).to_numpy())
    return pd.DataFrame(
        {
            "kind": str(SpanKind.KERNEL),
            "name": keep["name"].to_numpy(),
            "start_ns": keep["start_ns"].to_numpy(),
            "end_ns": keep["end_ns"].to_numpy(),
            "lane": lane,
            "nbytes": 0,
            "tid": keep["tid"].to_numpy(),
        }
    )


def read_pipeline(
    files: Mapping[int, PipelineRank],
    p2p: Sequence[tuple[int, str, int]],
    placed: Mapping[int, tuple[int, int]] | None = None,
) -> PipelineRead | None:
    """The pipeline the files show, or None when none of them holds a pipelining action. `placed`: each
    rank's (stage, replica) where the process groups say it (data-parallel replicas): the stage of actions
    that name none, and a rank's peers are those of its own replica."""
    if not any(may_hold_actions(f.events) for f in files.values()):
        return None  # told before the top-level operators are sorted out: most traces are no pipeline
    tops = {r: top_level(f.events.ops) for r, f in files.items()}
    acts = {r: find_actions(f.events, tops[r]) for r, f in files.items()}
    if all(a is None for a in acts.values()):
        return None
    found = {r: a for r, a in acts.items() if a is not None}
    warnings = _unknown(files, found)
    steps_from = _unmarked_steps(found)
    engine = engine_of(
        any(not a.inferred for a in found.values()),
        {r: files[r].events.annotations for r in found},
        {r: tops[r][tops[r]["tid"] == a.main_tid] for r, a in found.items()},
    )
    grouped = {r: placed[r][0] for r in files} if placed and all(r in placed for r in files) else None
    physical, held, how = _stages(files, found, p2p, grouped)
    warnings += how
    placement = placement_name(held)
    order = {r: order_of_step(found[r].frame) if r in found else [] for r in held}
    schedule, why = name_schedule(order, placement)
    compute = pd.concat([a.frame for a in found.values()], ignore_index=True)
    compute = compute[compute["type"].isin(PASSES)]
    m = int(compute["mb"].max()) + 1 if len(compute) else 0
    v = max((len(h) for h in held.values()), default=1)
    text = f"schedule {schedule or 'not named'} ({why}); placement {placement}, P={len(held)}, V={v}, M={m}"
    warnings.append(
        Notice(NoticeCode.SCHEDULE_FOUND, text + (", named from one step's action order" if schedule else ""))
    )
    replica = {r: placed[r][1] if grouped and placed else 0 for r in held}
    rank_of: dict[int, dict[int, int]] = {}  # each replica's stage -> rank: a rank's peers are its replica's
    for r, hs in held.items():
        rank_of.setdefault(replica[r], {}).update((s, r) for s in hs)
    spans: dict[int, pd.DataFrame] = {}
    assumed_any, inferred_any = False, False
    for r, f in files.items():
        mine = found.get(r)
        peers = rank_of.get(replica.get(r, 0), {})
        spans[r], assumed = _rank_spans(f, tops[r], mine, held.get(r, [physical[r]]), peers)
        assumed_any |= assumed
        inferred_any |= mine is not None and mine.inferred
    warnings += _guessed(inferred_any, assumed_any, engine, steps_from)
    config = {
        "engine": str(engine),
        "placement": placement,
        "stages_of_rank": {str(r): list(h) for r, h in held.items()},
        "schedule_from": why,
        **({"steps_from": str(steps_from)} if steps_from is not None else {}),
    }
    return PipelineRead(spans, physical, schedule.value if schedule else "", m, v, config, warnings, engine)


def _unknown(files: Mapping[int, PipelineRank], found: Mapping[int, RankActions]) -> list[Notice]:
    """A warning per file with `PP:` ranges this ppscope cannot read."""
    said = []
    for r, a in found.items():
        if a.unknown:
            shown = ", ".join(a.unknown[:3]) + (f" and {len(a.unknown) - 3} more" if len(a.unknown) > 3 else "")
            text = f"{files[r].events.name}: unknown pipelining action(s) {shown}, read as plain ranges"
            said.append(Notice(NoticeCode.UNKNOWN_ACTIONS, text))
    return said


def _unmarked_steps(found: Mapping[int, RankActions]) -> StepsFrom | None:
    """What told the inferred actions' steps apart (None: no rank's actions were inferred). Where no rank
    has a step mark, the steps are cut at the first stage's pauses (`pause_boundaries`), on every rank."""
    inferred = {r: a for r, a in found.items() if a.inferred}
    if not inferred:
        return None
    told = [a.steps_from for a in inferred.values() if a.steps_from not in (None, StepsFrom.NONE)]
    if told:  # the first in the order they are tried, where ranks differ
        return min((t for t in told if t is not None), key=list(StepsFrom).index)
    bounds = pause_boundaries({r: a.frame for r, a in inferred.items()})
    if not len(bounds):
        return StepsFrom.NONE
    for a in inferred.values():
        a.frame, a.steps_from = restep(a.frame, bounds), StepsFrom.PAUSE
    return StepsFrom.PAUSE


_WRITES_NONE = {
    Engine.TORCH: "no action ranges on some rank (Schedule1F1B writes none)",
    Engine.DEEPSPEED: "no action ranges (DeepSpeed's pipeline engine writes none)",
    Engine.UNKNOWN: "no action ranges on some rank, and no engine recognised",
}


def _guessed(inferred: bool, assumed: bool, engine: Engine, steps_from: StepsFrom | None) -> list[Notice]:
    """What reading the actions had to guess: actions inferred from operators, their steps, waits assumed."""
    said = []
    if inferred:
        within = "within each ProfilerStep" if steps_from is StepsFrom.PROFILER_STEP else "within each step"
        text = (
            f"{_WRITES_NONE[engine]}: its actions were inferred from the operators, backward = the autograd "
            "engine's, forward = the other operators that record autograd history; micro-batches numbered in "
            f"order {within}"
        )
        said.append(Notice(NoticeCode.INFERRED_ACTIONS, text))
    if inferred and steps_from is not StepsFrom.PROFILER_STEP:
        text = f"no ProfilerStep#N ranges: the steps were told apart by {steps_from}"
        said.append(Notice(NoticeCode.UNMARKED_STEPS, text))
    if assumed:
        text = (
            "some input waits had no matching gloo:recv range: the time before the action's first operator "
            "was taken as its wait"
        )
        said.append(Notice(NoticeCode.ASSUMED_WAITS, text))
    return said


def _stages(
    files: Mapping[int, PipelineRank],
    found: Mapping[int, RankActions],
    p2p: Sequence[tuple[int, str, int]],
    grouped: Mapping[int, int] | None = None,
) -> tuple[dict[int, int], dict[int, list[int]], list[Notice]]:
    """(physical stage of each rank, the stages each rank holds, what was assumed). Actions that name no
    stage take it from `grouped` (the process groups) where every rank has one, else from the traffic."""
    held = {r: list(stages_in(a.frame)) for r, a in found.items()}
    if all(held.get(r) for r in files):  # data-parallel replicas' ranks hold the same stages: one place each
        firsts = sorted({min(held[r]) for r in files})
        return {r: firsts.index(min(held[r])) for r in files}, held, []
    if grouped is not None and all(r in grouped for r in files):
        stage_of, how = {r: grouped[r] for r in files}, "each rank's place in its pipeline process group"
    else:
        order = order_stages(files, p2p, {r: r for r in files}, "rank")
        stage_of, how = order.stage_of, order.explanation
    note = "the trace names no stage for single-stage actions (Forward i / Backward i, or inferred ones): " + how
    for r, a in found.items():
        if not held.get(r):
            a.frame["stage"] = stage_of[r]
            held[r] = [stage_of[r]]
    return stage_of, {r: held[r] for r in found}, [Notice(NoticeCode.STAGELESS_ACTIONS, note)]


def _rank_spans(
    f: PipelineRank, ops: pd.DataFrame, acts: RankActions | None, local: list[int], rank_of: Mapping[int, int]
) -> tuple[pd.DataFrame, bool]:
    """One rank's spans, and whether some wait was assumed."""
    chunk_of = {s: i for i, s in enumerate(sorted(local))}
    first = min(local)
    base = f.spans.assign(stage=first, mb=-1, chunk=0, phase="", peer=-1)
    frame = acts.frame if acts is not None else pd.DataFrame()
    if acts is None or frame.empty:
        if f.gpu:
            return base, False
        cpu = cpu_compute(ops, ops["tid"].mode().iloc[0] if len(ops) else None)
        return pd.concat(
            [base, cpu.drop(columns="tid").assign(stage=first, mb=-1, step=-1, chunk=0, phase="", peer=-1)],
            ignore_index=True,
        ), False
    frame = frame.assign(chunk=frame["stage"].map(chunk_of).fillna(0).astype(np.int64))
    named = set(frame.loc[frame["ranged"], "name"])
    base = base[~(base["kind"].eq(str(SpanKind.RANGE)) & base["name"].isin(named))]
    ranges = pd.DataFrame(
        {
            "kind": str(SpanKind.RANGE),
            "name": frame["name"],
            "start_ns": frame["start_ns"],
            "end_ns": frame["end_ns"],
            "lane": "host",
            "nbytes": 0,
            "stage": frame["stage"],
            "mb": frame["mb"],
            "step": frame["step"],
            "chunk": frame["chunk"],
            "phase": frame["type"],
            "peer": -1,
        }
    )
    remote = _neighbours(local, rank_of, into=True)
    remote_to = _neighbours(local, rank_of, into=False)
    main_ops = ops[ops["tid"] == acts.main_tid]
    parts = [base, ranges]
    assumed = False
    if f.gpu:
        posts = main_ops[main_ops["name"].isin(_RECEIVES)]
        parts = [_inferred_gpu_waits(_label_gpu(base, frame, remote), frame, posts, remote), ranges]
    else:
        cpu = cpu_compute(ops, acts.main_tid)
        parts.append(_labelled(cpu, frame, first))
        ann = f.events.annotations
        recvs = ann[ann["name"] == "gloo:recv"]
        held = pd.concat(
            [
                main_ops.loc[main_ops["name"].isin(_RECEIVES), ["start_ns", "end_ns"]],
                ann.loc[(ann["name"].isin(_RECEIVES) & (ann["tid"] == acts.main_tid)), ["start_ns", "end_ns"]],
            ]
        )
        rows, assumed = waits(frame, main_ops[~is_comm(main_ops["name"])], recvs, remote, held)
        parts.append(_rows(rows, SpanKind.RECV_WAIT, chunk_of))
        backend = ann[ann["name"].isin(_SEND_RANGES) & (ann["tid"] == acts.main_tid)]
        parts.append(_rows(send_rows(frame, main_ops, remote_to, backend), SpanKind.SEND, chunk_of))
    return pd.concat([p for p in parts if len(p)], ignore_index=True), assumed


def _neighbours(local: list[int], rank_of: Mapping[int, int], *, into: bool) -> Links:
    """(stage, direction) -> the rank at the other end of that stage's traffic in that direction (FORWARD:
    activations, FULL_BACKWARD: gradients), when it is another rank: the sender of its input (`into`) or the
    receiver of its output."""
    out: dict[tuple[int, ActionType | None], int] = {}
    for s in local:
        me = rank_of.get(s)
        forward, backward = (s - 1, s + 1) if into else (s + 1, s - 1)
        for direction, other in ((ActionType.FORWARD, forward), (ActionType.FULL_BACKWARD, backward)):
            peer = rank_of.get(other)
            if peer is not None and peer != me:
                out[(s, direction)] = peer
    return out


def _labelled(cpu: pd.DataFrame, acts: pd.DataFrame, first: int) -> pd.DataFrame:
    row = label_ops(cpu, acts)
    hit = row >= 0
    take = acts.reindex(np.where(hit, row, acts.index[0]))
    out = cpu.drop(columns="tid").reset_index(drop=True)
    for c, default in (("stage", first), ("mb", -1), ("step", -1), ("chunk", 0)):
        out[c] = np.where(hit, take[c].to_numpy(np.int64), default)
    out["phase"] = np.where(hit, take["type"].to_numpy(object), "")
    out["peer"] = -1
    # an operator outside every compute action (F, B, I, W) is not the pipeline's compute: the training loop's
    # own work (making a batch, logging the loss) or a communication action's bookkeeping (a send's buffer, a
    # gradient reduction's): host, as a recording hook, which times only the passes, sees it
    passes = np.isin(out["phase"].to_numpy(object), [str(t) for t in ActionType if t.is_compute])
    out["kind"] = np.where(hit & passes, str(SpanKind.KERNEL), str(SpanKind.HOST))
    return out


def _label_gpu(base: pd.DataFrame, acts: pd.DataFrame, remote: Links) -> pd.DataFrame:
    """GPU work takes the stage, micro-batch, step and chunk of the action that launched it; a communication
    kernel launched by a RECV action waits for that action's input (`recv_wait`, with its peer)."""
    gpu = base["kind"].isin([str(k) for k in (SpanKind.KERNEL, SpanKind.NCCL, SpanKind.MEMCPY, SpanKind.MEMSET)])
    sub = base[gpu.to_numpy()]
    row = label_ops(pd.DataFrame({"start_ns": sub["launch_ns"].to_numpy()}), acts)
    hit = row >= 0
    take = acts.reindex(np.where(hit, row, acts.index[0]))
    out = base.copy()
    idx = np.flatnonzero(gpu.to_numpy())[hit]
    for c in ("stage", "mb", "chunk"):
        out.iloc[idx, out.columns.get_loc(c)] = take[c].to_numpy(np.int64)[hit]
    out.iloc[idx, out.columns.get_loc("phase")] = take["type"].to_numpy(object)[hit]
    types = take["type"].to_numpy(object)[hit]
    stages = take["stage"].to_numpy(np.int64)[hit]
    posted = np.flatnonzero(
        (out["kind"].to_numpy(object)[idx] == str(SpanKind.NCCL))
        & np.isin(types, [ActionType.RECV_F, ActionType.RECV_B])
    )
    peers = np.array([remote.get((int(stages[k]), ActionType(types[k]).direction), -1) for k in posted], np.int64)
    wait = idx[posted[peers >= 0]]
    out.iloc[wait, out.columns.get_loc("kind")] = str(SpanKind.RECV_WAIT)
    out.iloc[wait, out.columns.get_loc("peer")] = peers[peers >= 0]
    return out


def _inferred_gpu_waits(spans: pd.DataFrame, acts: pd.DataFrame, posts: pd.DataFrame, remote: Links) -> pd.DataFrame:
    """Inferred actions post no RECV action: a communication kernel launched by a receive operator
    (`c10d::recv_`, between actions) is the wait of the next compute action that takes its input from another
    rank (`recv_wait`, with that action's labels and its peer)."""
    if posts.empty or acts.empty or acts["ranged"].any():
        return spans
    nccl = np.flatnonzero(spans["kind"].to_numpy(object) == str(SpanKind.NCCL))
    launch = spans["launch_ns"].to_numpy(np.int64)[nccl] if "launch_ns" in spans else np.zeros(0, np.int64)
    inside = label_ops(pd.DataFrame({"start_ns": launch}), posts.reset_index(drop=True)) >= 0
    waiting = acts[acts["type"].isin(_WAITING)].sort_values("start_ns")
    starts = waiting["start_ns"].to_numpy(np.int64)
    out = spans.copy()
    for i, t in zip(nccl[inside], launch[inside], strict=True):
        k = int(np.searchsorted(starts, t, side="left"))
        if k >= len(waiting):
            continue
        a = waiting.iloc[k]
        peer = remote.get((int(a["stage"]), ActionType(a["type"]).direction))
        if peer is None:
            continue
        for c, v in (("kind", str(SpanKind.RECV_WAIT)), ("peer", peer), ("phase", a["type"])):
            out.iloc[i, out.columns.get_loc(c)] = v
        for c in ("stage", "mb", "step", "chunk"):
            out.iloc[i, out.columns.get_loc(c)] = int(a[c])
    return out


def _rows(rows: list[tuple[object, ...]], kind: SpanKind, chunk_of: Mapping[int, int]) -> pd.DataFrame:
    cols = ["stage", "mb", "step", "phase", "start_ns", "end_ns", "peer", "name"]
    df = pd.DataFrame(rows, columns=cols)
    lane = "recv" if kind == SpanKind.RECV_WAIT else "send"
    return df.assign(kind=str(kind), lane=lane, nbytes=0, chunk=df["stage"].map(chunk_of).fillna(0).astype(np.int64))
