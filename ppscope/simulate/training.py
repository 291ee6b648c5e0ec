"""A training pipeline's own action order replayed with its measured per-action costs.

A torch.distributed.pipelining run (recorded by `ppscope.integrations.pipelining`, or imported from Kineto
traces) labels every compute action with its rank, stage, micro-batch, step and type (F, B, I, W). This module
takes each rank's order of actions in a step, the measured cost of each action type per stage (the median busy
time of that action over the steps), the rank's host time before it (median, on CPU ranks: `training_actions`)
and each link's hop latency (the median post-to-wake latency of its messages,
`ppscope.analysis.pipeline.message_latencies`; the run's median where a link has none), and replays the step
as discrete events with the true dependencies:

- F of stage s on micro-batch m after F of s-1 on m;
- B or I of s on m after its own F, and after B or I of s+1 on m (the gradient's flow);
- W of s on m after I of s on m;
- a dependency between stages on different ranks arrives its link's hop latency after it ends;
- each rank runs its actions in its recorded order, one at a time, each after its host time.

Nothing else is replayed: the optimizer, transfers beyond the hop latency, host time on a GPU rank. The figure
is Σ idle ÷ (ranks × window) over each step's own window, from its first compute to its last (host time is
idle, as to the analyzer), next to the same ratio measured on the run over the same steps (`step_windows`).
It knows nothing about torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppscope.analysis.facts import cpu_ranks
from ppscope.analysis.intervals import Intervals, covered_within
from ppscope.analysis.pipeline import message_latencies
from ppscope.analysis.result import TrainingReplay
from ppscope.balance.measured.training import is_training
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.actions import PASSES, Action, ActionType
from ppscope.trace.model import COMPUTE_KINDS, RankInfo, RunMeta, SpanKind, Trace, spans_frame
from ppscope.trace.notices import missing_ranks

__all__ = [
    "MAX_STEPS",
    "ReplayedStep",
    "is_complete_step",
    "is_training",
    "measured_hops",
    "replay_order",
    "replay_training",
    "step_windows",
    "training_actions",
]

MAX_STEPS = 64
"""The most steps replayed and measured (evenly spaced over the complete ones); costs take every complete step."""
_KEY = ["rank", "stage", "mb", "step", "phase"]


@dataclass(frozen=True)
class Timed:
    """A replayed action on its rank: [start, end), and [wait_from, start) spent waiting for `peer`'s data."""

    rank: int
    action: Action
    start_ns: int
    end_ns: int
    wait_from_ns: int
    peer: int


@dataclass(frozen=True)
class ReplayedStep:
    """One step replayed: every action's times, and per rank its busy time within the step's window."""

    actions: list[Timed]
    busy_ns: dict[int, int]
    start_ns: int
    end_ns: int

    @property
    def window_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def idle_ns(self) -> dict[int, int]:
        return {r: self.window_ns - b for r, b in self.busy_ns.items()}

    @property
    def bubble_ratio(self) -> float:
        """Σ idle ÷ (ranks × window): ppscope's bubble ratio, each rank one physical stage."""
        return sum(self.idle_ns.values()) / (len(self.busy_ns) * self.window_ns)


def _dependencies(a: Action, present: set[Action], last_stage: int) -> list[Action]:
    if a.type is ActionType.FORWARD:
        return [Action(a.stage - 1, ActionType.FORWARD, a.mb)] if a.stage > 0 else []
    if a.type is ActionType.BACKWARD_WEIGHT:
        own = Action(a.stage, ActionType.BACKWARD_INPUT, a.mb)
        return [own if own in present else Action(a.stage, ActionType.FULL_BACKWARD, a.mb)]
    deps = [Action(a.stage, ActionType.FORWARD, a.mb)]
    if a.stage < last_stage:
        full = Action(a.stage + 1, ActionType.FULL_BACKWARD, a.mb)
        deps.append(full if full in present else Action(a.stage + 1, ActionType.BACKWARD_INPUT, a.mb))
    return deps


def _checked(
    order: Mapping[int, Sequence[Action]],
    cost_ns: Mapping[tuple[int, str], int],
    hop_ns: int,
    host: Mapping[tuple[int, str], int],
    links: Mapping[tuple[int, int], int],
) -> tuple[dict[int, int], dict[Action, list[Action]]]:
    """`replay_order`'s inputs checked: each stage's rank and each action's dependencies, or InvalidConfigError
    in one line naming what cannot run."""
    for what, ns in [("the hop latency", hop_ns), *((f"link {a}->{b}", v) for (a, b), v in links.items())]:
        if ns < 0:
            raise InvalidConfigError(ErrorCode.BAD_VALUE, f"{what} must be >= 0 ns, got {ns}")
    rank_of: dict[int, int] = {}
    present: set[Action] = set()
    for r, acts in order.items():
        for a in acts:
            if a.type not in PASSES or a.stage < 0 or a.mb < 0:
                raise InvalidConfigError(
                    ErrorCode.BAD_SCHEDULE, f"rank {r}: {a} is no compute action (F, B, I or W of a stage on a mb)"
                )
            if rank_of.setdefault(a.stage, r) != r:
                raise InvalidConfigError(
                    ErrorCode.BAD_SCHEDULE, f"stage {a.stage} runs on ranks {rank_of[a.stage]} and {r}: one rank each"
                )
            if a in present:
                raise InvalidConfigError(ErrorCode.BAD_SCHEDULE, f"rank {r} runs {a} twice in one step")
            present.add(a)
            if (a.stage, a.type) not in cost_ns or cost_ns[(a.stage, a.type)] < 0:
                raise InvalidConfigError(
                    ErrorCode.MISSING_OPTION, f"no cost (>= 0 ns) for action type {a.type} of stage {a.stage}"
                )
            if host.get((a.stage, a.type), 0) < 0:
                raise InvalidConfigError(
                    ErrorCode.BAD_VALUE, f"host time before {a.type} of stage {a.stage} must be >= 0 ns"
                )
    if not present:
        raise InvalidConfigError(ErrorCode.NO_COMPUTE, "the step has no compute actions to replay")
    last = max(rank_of)
    deps = {a: _dependencies(a, present, last) for a in present}
    for a, ds in deps.items():
        for d in ds:
            if d not in present:
                raise InvalidConfigError(
                    ErrorCode.BAD_SCHEDULE,
                    f"{a} needs {d}, which no rank runs in this step (a step cut short, or a rank missing)",
                )
    return rank_of, deps


def replay_order(
    order: Mapping[int, Sequence[Action]],
    cost_ns: Mapping[tuple[int, str], int],
    hop_ns: int = 0,
    host_ns: Mapping[tuple[int, str], int] | None = None,
    link_ns: Mapping[tuple[int, int], int] | None = None,
) -> ReplayedStep:
    """Replay one step: `order` is each rank's compute actions in the order it runs them, `cost_ns` the time
    of each (stage, type), `hop_ns` what a dependency between ranks adds (`link_ns[(from, to)]` instead where
    the link from rank `from` to rank `to` is given), `host_ns` the rank's own time before each (stage, type)
    (its host work: idle to the ratio, but the rank's), none where not given. Raises InvalidConfigError, in one
    line, when the order cannot run (an action whose input is in no rank's order, a stage on two ranks, two
    ranks waiting for each other)."""
    host, links = host_ns or {}, link_ns or {}
    rank_of, deps = _checked(order, cost_ns, hop_ns, host, links)
    end: dict[Action, int] = {}
    free = dict.fromkeys(order, 0)
    pos = dict.fromkeys(order, 0)
    timed: list[Timed] = []
    progress = True
    while progress:
        progress = False
        for r, acts in order.items():
            while pos[r] < len(acts) and all(d in end for d in deps[acts[pos[r]]]):
                a = acts[pos[r]]
                ready = free[r] + int(host.get((a.stage, a.type), 0))
                start, peer = ready, -1
                for d in deps[a]:
                    other = rank_of[d.stage]
                    arrives = end[d] + (links.get((other, r), hop_ns) if other != r else 0)
                    if arrives > start:
                        start, peer = arrives, other
                end[a] = start + int(cost_ns[(a.stage, a.type)])
                timed.append(Timed(r, a, start, end[a], ready, peer))
                free[r] = end[a]
                pos[r] += 1
                progress = True
    stuck = {r: acts[pos[r]] for r, acts in order.items() if pos[r] < len(acts)}
    if stuck:
        waits = ", ".join(
            f"rank {r} at {a} (needs {' and '.join(str(d) for d in deps[a] if d not in end)})"
            for r, a in sorted(stuck.items())
        )
        raise InvalidConfigError(ErrorCode.SCHEDULE_DEADLOCK, f"the ranks' orders cannot run together: {waits}")
    busy = {r: sum(t.end_ns - t.start_ns for t in timed if t.rank == r) for r in order}
    start_ns = min(t.start_ns for t in timed)
    end_ns = max(t.end_ns for t in timed)
    if end_ns <= start_ns:
        raise InvalidConfigError(
            ErrorCode.NO_COMPUTE, "every action of the step costs 0 ns: there is no window to take a ratio over"
        )
    return ReplayedStep(timed, busy, start_ns, end_ns)


def training_actions(trace: Trace) -> pd.DataFrame:
    """One row per compute action of a pipelining run: rank, stage, mb, step, phase (the type), start_ns and
    end_ns (its extent: its marks and its compute spans; the start gives its order on the rank), busy_ns and
    host_ns. The actions are the hook's `forward` / `backward` spans (the loss, a `head` span of phase F, joins
    its forward), or where there are none the Kineto import's action ranges, whose compute is the `kernel` spans
    labelled with them.

    busy_ns is the union of the action's compute spans, except on a rank whose device is a CPU (`cpu_ranks`):
    there the thread is the device, and the action's whole extent but the waits and sends inside it is its work,
    as the analyzer counts it. host_ns, on a CPU rank, is the rest of the rank's time from the end of its
    previous action in the step (this one's start for the step's first) to this one's end that is no wait for a
    receive: its sends, the schedule's Python, the loss. It is 0 on other ranks, whose device queue runs ahead
    of the host: time between kernels there is not taken as the host's."""
    s = trace.spans
    labelled = s["phase"].isin(PASSES).to_numpy() & (s["mb"].to_numpy() >= 0) & (s["stage"].to_numpy() >= 0)
    kind = s["kind"].to_numpy(object)
    marks = labelled & np.isin(kind, [str(SpanKind.FORWARD), str(SpanKind.BACKWARD)])
    if not marks.any():
        marks = labelled & (kind == str(SpanKind.RANGE))
    cols = [*_KEY, "start_ns", "end_ns", "busy_ns", "host_ns"]
    if not marks.any():
        return pd.DataFrame({c: pd.Series(dtype=np.int64 if c != "phase" else object) for c in cols})
    compute = s.loc[labelled & np.isin(kind, list(COMPUTE_KINDS)), [*_KEY, "start_ns", "end_ns"]]
    out = s.loc[marks].groupby(_KEY, as_index=False).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    # an action without compute spans keeps its marks' extent and is busy 0 (integer fills: ns stay exact)
    mine, keys = _compute_busy(compute), pd.MultiIndex.from_frame(out[_KEY])
    first = mine["first_ns"].reindex(keys, fill_value=np.iinfo(np.int64).max).to_numpy(np.int64)
    last = mine["last_ns"].reindex(keys, fill_value=np.iinfo(np.int64).min).to_numpy(np.int64)
    out["start_ns"] = np.minimum(out["start_ns"].to_numpy(np.int64), first)
    out["end_ns"] = np.maximum(out["end_ns"].to_numpy(np.int64), last)
    out["busy_ns"] = mine["busy_ns"].reindex(keys, fill_value=0).to_numpy(np.int64)
    out["host_ns"] = np.zeros(len(out), np.int64)
    out = out[cols].sort_values(["rank", "step", "start_ns"], kind="stable").reset_index(drop=True)
    cpu = cpu_ranks(trace.meta)
    if cpu:
        idle = s.loc[
            np.isin(kind, [str(SpanKind.RECV_WAIT), str(SpanKind.SEND)]), ["rank", "kind", "start_ns", "end_ns"]
        ]
        idle_of = idle.groupby("rank").indices
        empty = idle.iloc[:0]
        for r, rows in out.groupby("rank").indices.items():
            if int(r) in cpu:
                _on_cpu(out, idle.iloc[idle_of[r]] if r in idle_of else empty, rows)
    return out


def _compute_busy(compute: pd.DataFrame) -> pd.DataFrame:
    """Each action's busy_ns, the union of its compute spans in integer ns, and their first start and last end
    (first_ns, last_ns), indexed by `_KEY`."""
    compute = compute.sort_values([*_KEY, "start_ns"], kind="stable")
    # each span adds what it covers past the spans of its action before it
    group = compute.groupby(_KEY, sort=False).ngroup().to_numpy()
    reach = compute.groupby(_KEY, sort=False)["end_ns"].cummax().to_numpy(np.int64)
    first = np.concatenate(([True], group[1:] != group[:-1]))
    before = np.where(first, np.iinfo(np.int64).min, np.concatenate(([0], reach[:-1])))
    lo = np.maximum(compute["start_ns"].to_numpy(np.int64), before)
    own = np.maximum(compute["end_ns"].to_numpy(np.int64) - lo, 0)
    return (
        compute.assign(busy_ns=own)
        .groupby(_KEY)
        .agg(busy_ns=("busy_ns", "sum"), first_ns=("start_ns", "min"), last_ns=("end_ns", "max"))
    )


def _on_cpu(out: pd.DataFrame, spans: pd.DataFrame, rows: npt.NDArray[np.intp]) -> None:
    """Set busy_ns and host_ns (`training_actions`) of one CPU rank's actions, `rows` of `out` in the rank's
    order within each step; `spans` are the rank's receive waits and sends."""
    kind = spans["kind"].to_numpy(object)
    start, end = spans["start_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64)
    wait = kind == str(SpanKind.RECV_WAIT)
    either = wait | (kind == str(SpanKind.SEND))
    waits, idle = Intervals(start[wait], end[wait]), Intervals(start[either], end[either])
    a0 = out["start_ns"].to_numpy(np.int64)[rows]
    a1 = out["end_ns"].to_numpy(np.int64)[rows]
    step = out["step"].to_numpy(np.int64)[rows]
    busy = (a1 - a0) - covered_within(idle, a0, a1)
    same = np.concatenate(([False], step[1:] == step[:-1]))
    after = np.where(same, np.minimum(np.concatenate(([0], a1[:-1])), a0), a0)  # the previous action's end
    host = (a1 - after) - busy - covered_within(waits, after, a1)
    out.loc[rows, "busy_ns"] = busy
    out.loc[rows, "host_ns"] = np.maximum(host, 0)


def is_complete_step(have: set[tuple[int, str, int]], stages: int, mbs: Sequence[int]) -> bool:
    """Every stage runs every micro-batch's forward and backward (B, or I and W) in the step whose actions are
    `have`, as (stage, type, micro-batch)."""
    for s in range(stages):
        for m in mbs:
            if (s, ActionType.FORWARD, m) not in have:
                return False
            split = {(s, ActionType.BACKWARD_INPUT, m), (s, ActionType.BACKWARD_WEIGHT, m)}
            if (s, ActionType.FULL_BACKWARD, m) not in have and not split <= have:
                return False
    return True


def step_windows(trace: Trace) -> pd.DataFrame:
    """Each step's window, from its first compute to its last on any rank: columns lo_ns and hi_ns, indexed by
    step (the steps with compute of a micro-batch's pass)."""
    s = trace.spans
    own = s[s["kind"].isin(list(COMPUTE_KINDS)) & s["phase"].isin(PASSES) & (s["mb"] >= 0)]
    return own.groupby("step").agg(lo_ns=("start_ns", "min"), hi_ns=("end_ns", "max"))


def _measured(windows: pd.DataFrame, acts: pd.DataFrame) -> float | None:
    """The run's own bubble ratio over one step's window (`step_windows`, as the replay's) from the step's
    `training_actions`: the window less the actions' busy time, per rank."""
    step = int(acts["step"].iloc[0])
    if step not in windows.index:
        return None
    lo, hi = int(windows.at[step, "lo_ns"]), int(windows.at[step, "hi_ns"])
    if hi <= lo:
        return None
    busy = acts.groupby("rank")["busy_ns"].sum()
    return max(0.0, float(((hi - lo) - busy).sum() / (len(busy) * (hi - lo))))


def measured_hops(trace: Trace) -> tuple[int | None, dict[tuple[int, int], int]]:
    """The median hop latency of the run's messages (`message_latencies`; None when none pairs), and per link
    (sending rank, receiving rank) the median of its own messages, for the links where some pair: a run's two
    directions can differ severalfold (a gradient and an activation of different sizes, a transport that stalls
    one way)."""
    lat = message_latencies(trace.spans)
    if not len(lat):
        return None, {}
    median = lat.groupby(["src", "dst"])["latency_ns"].median()
    links = {(int(a), int(b)): round(float(v)) for (a, b), v in median.items()}
    return int(np.median(lat["latency_ns"].to_numpy())), links


def _steps_text(steps: Sequence[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) < 6 else f"{steps[0]}-{steps[-1]} ({len(steps)} steps)"


def _per_stage(median: pd.Series) -> dict[int, dict[str, float]]:
    """(stage, type) -> ns as stage -> type -> ns, as `TrainingReplay` holds them."""
    out: dict[int, dict[str, float]] = {}
    for (s, t), v in median.items():
        out.setdefault(int(s), {})[str(t)] = float(v)
    return out


def _flat(per_stage: Mapping[int, Mapping[str, float]]) -> dict[tuple[int, str], int]:
    """stage -> type -> ns as (stage, type) -> whole ns, as `replay_order` takes them."""
    return {(s, t): round(v) for s, c in per_stage.items() for t, v in c.items()}


def replay_training(trace: Trace, *, hop_ns: int | None = None) -> tuple[TrainingReplay, Trace | None]:
    """Replay every complete step of a pipelining run in its own order with its measured per-action costs (the
    median over those steps of each stage's F, B, I, W) and hop latency (`hop_ns`, default: measured, else 0).
    Returns the figures, and the replayed steps as a Trace (one after another, each starting when the previous
    one has ended on every rank); what cannot be replayed is a note, and no Trace."""
    missing = trace.meta.ranks_missing(trace.spans["rank"].unique())
    if missing:  # a step without a stage cannot be replayed: say which rank, not that the steps look cut
        why = f"{missing_ranks(missing, trace.meta.world_size)}: a replay needs every stage's costs"
        return TrainingReplay(bubble_ratio=None, note=why), None
    acts = training_actions(trace)
    if acts.empty:
        why = "no training actions in the trace (forward/backward spans, or Kineto action ranges, with a micro-batch)"
        return TrainingReplay(bubble_ratio=None, note=why), None
    stages = int(acts["stage"].max()) + 1
    m = trace.meta.microbatches
    mbs = list(range(m)) if m > 0 else sorted(int(x) for x in acts["mb"].unique())
    by_step = {int(k): g for k, g in acts.groupby("step", sort=True)}
    passes = {k: set(zip(g["stage"], g["phase"], g["mb"], strict=True)) for k, g in by_step.items()}
    complete = [k for k in by_step if is_complete_step(passes[k], stages, mbs)]
    cut = [k for k in by_step if k not in complete]
    notes = (
        [
            f"step(s) {_steps_text(cut)} left out: some stage lacks a micro-batch's forward or backward "
            "(a step cut by the trace's start or end)"
        ]
        if cut and complete
        else []
    )
    if not complete:
        why = (
            f"no complete step to replay: in step(s) {_steps_text(cut)} some stage lacks a micro-batch's "
            f"forward or backward ({stages} stages, micro-batches {mbs[0]}-{mbs[-1]})"
        )
        return TrainingReplay(bubble_ratio=None, note=why), None
    used = acts[acts["step"].isin(complete)]
    median = used.groupby(["stage", "phase"])[["busy_ns", "host_ns"]].median()
    costs_ns, host_ns = _per_stage(median["busy_ns"]), _per_stage(median["host_ns"])
    cost, host = _flat(costs_ns), _flat(host_ns)
    measured_hop, links = measured_hops(trace) if hop_ns is None else (hop_ns, {})
    hop = measured_hop if measured_hop is not None else 0
    if hop_ns is None and measured_hop is None:
        notes.append("hop latency taken as 0: the trace pairs no send with a receive that waited for it")
    replayed = complete
    if len(complete) > MAX_STEPS:
        replayed = [complete[int(i)] for i in np.linspace(0, len(complete) - 1, MAX_STEPS).round()]
        notes.append(f"{MAX_STEPS} of the {len(complete)} complete steps replayed, evenly spaced")
    ratios, measured, parts = [], [], []
    windows = step_windows(trace)
    offset = 0
    for k in replayed:
        order = {
            int(r): [Action(int(a.stage), ActionType(a.phase), int(a.mb)) for a in rows.itertuples()]
            for r, rows in by_step[k].groupby("rank", sort=True)
        }
        try:
            step = replay_order(order, cost, hop, host, links)
        except InvalidConfigError as exc:
            why = f"step {k} cannot be replayed: {exc}"
            failed = TrainingReplay(
                bubble_ratio=None, steps=replayed, costs_ns=costs_ns, host_ns=host_ns, hop_ns=hop, note=why
            )
            return failed, None
        ratios.append(step.bubble_ratio)
        got = _measured(windows, by_step[k])
        if got is not None:
            measured.append(got)
        parts.append((k, step, offset - step.start_ns))
        offset += step.window_ns
    replay = TrainingReplay(
        bubble_ratio=float(np.median(ratios)),
        measured_step_ratio=float(np.median(measured)) if measured else None,
        steps=replayed,
        costs_ns=costs_ns,
        host_ns=host_ns,
        hop_ns=hop,
        link_ns=links,
        hop_measured=hop_ns is None and measured_hop is not None,
        note="; ".join(notes),
    )
    return replay, _as_trace(trace, parts, replay)


def _as_trace(trace: Trace, parts: list[tuple[int, ReplayedStep, int]], replay: TrainingReplay) -> Trace:
    """The replayed steps as a run of the simulator: a compute span per action, a `recv_wait` (with the peer)
    where it waited for another rank."""
    chunk: dict[tuple[int, int], int] = {}
    for _, step, _ in parts:
        for t in step.actions:
            chunk.setdefault((t.rank, t.action.stage), 0)
    for r in {r for r, _ in chunk}:
        for i, s in enumerate(sorted(st for rr, st in chunk if rr == r)):
            chunk[(r, s)] = i
    rows = []
    for k, step, shift in parts:
        for t in step.actions:
            a = t.action
            kind = SpanKind.FORWARD if a.type is ActionType.FORWARD else SpanKind.BACKWARD
            common = {
                "rank": t.rank,
                "stage": a.stage,
                "mb": a.mb,
                "step": k,
                "chunk": chunk[(t.rank, a.stage)],
                "phase": str(a.type),
                "tokens": 0,
                "nbytes": 0,
            }
            rows.append(
                {
                    **common,
                    "lane": "compute",
                    "kind": str(kind),
                    "name": str(a),
                    "peer": -1,
                    "start_ns": t.start_ns + shift,
                    "end_ns": t.end_ns + shift,
                }
            )
            if t.peer >= 0 and t.start_ns > t.wait_from_ns:
                rows.append(
                    {
                        **common,
                        "lane": "recv",
                        "kind": str(SpanKind.RECV_WAIT),
                        "peer": t.peer,
                        "name": str(
                            Action(a.stage, ActionType.recv(a.type.direction or ActionType.FULL_BACKWARD), a.mb)
                        ),
                        "start_ns": t.wait_from_ns + shift,
                        "end_ns": t.start_ns + shift,
                    }
                )
    spans = spans_frame(pd.DataFrame(rows)).sort_values(["start_ns", "rank", "end_ns"], kind="stable")
    src = trace.meta
    ranks = sorted({t.rank for _, step, _ in parts for t in step.actions})
    position = {r: min(s for rr, s in chunk if rr == r) for r in ranks}
    meta = RunMeta(
        source="simulator",
        status="finished",
        world_size=max(ranks) + 1,
        pp_size=len(ranks),
        schedule=src.schedule,
        microbatches=src.microbatches,
        chunks=src.chunks,
        backend="simulated",
        ranks=[RankInfo(rank=r, stage=position[r], device="simulated") for r in ranks],
        config={
            "replay_of": src.run_id or src.source,
            "steps": list(replay.steps),
            "hop_latency_ns": replay.hop_ns,
            "costs_ns": {str(s): c for s, c in replay.costs_ns.items()},
            "host_ns": {str(s): c for s, c in replay.host_ns.items()},
        },
    )
    return Trace(spans=spans.reset_index(drop=True), meta=meta)
