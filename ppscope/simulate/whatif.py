"""What-ifs of a training job: its step replayed in its own action order with changed costs.

The measured costs are those of the replay (`ppscope.simulate.training`): each action type's median busy time
over the complete steps, here per replica and stage; a (stage, replica)'s tensor-parallel ranks count together,
an action costing what the slowest of them took (they wait for each other). The ranks' host time before each
action (CPU ranks) is replayed as measured whatever the costs. Each replica's step is replayed on its
own, and the job's step is the slowest replica's (synchronous data parallelism: every replica waits for the
gradients of all). Two changes are replayed against the replay of the measured costs:

- `balanced`: in every replica, each action type's cost the mean over the replica's stages: what an ideal layer
  split would reach, the work conserved;
- `no_straggler`: the slowest (stage, replica)'s costs set to the median of the other replicas of its stage.

It reads a generic Trace (spans with rank, stage, mb, step, phase) and a `Placement` of ranks into (stage,
replica); it knows no trace format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ppscope.analysis.pipeline import stage_of_ranks
from ppscope.analysis.placement import Placement, placement_of
from ppscope.analysis.result import WhatIf, WhatIfCase, WhatIfStraggler
from ppscope.errors import InvalidConfigError
from ppscope.simulate.training import (
    MAX_STEPS,
    is_complete_step,
    measured_hops,
    replay_order,
    step_windows,
    training_actions,
)
from ppscope.trace.actions import PASSES, Action
from ppscope.trace.model import RunMeta, Trace
from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["Costs", "JobSteps", "balanced_costs", "read_job", "replay_job", "straggler_costs", "what_if"]

Costs = dict[tuple[int, str], float]
"""(stage, action type F/B/I/W) -> ns: one replica's cost of each action."""

Unit = tuple[int, int]
"""(stage, replica): one stage of one pipeline, its tensor-parallel ranks together."""


@dataclass(frozen=True)
class JobSteps:
    """A training job's complete steps, ready to replay with any costs."""

    orders: dict[int, dict[int, dict[int, list[Action]]]]
    """Replica -> step -> lead rank (the lowest of a (stage, replica)'s ranks) -> its actions in order."""
    costs: dict[int, Costs]
    """Replica -> the measured costs: each (stage, type)'s median over the steps of its slowest rank's busy time."""
    host: dict[int, Costs]
    """Replica -> the rank's host time before each (stage, type), median over the steps (0 on GPU ranks:
    `ppscope.simulate.training.training_actions`); it stays as measured whatever the costs."""
    units: dict[Unit, list[int]]
    """(stage, replica) -> its ranks."""
    runs: dict[Unit, list[int]]
    """(stage, replica) -> the (virtual) stages whose actions it runs: one, or V of an interleaved schedule."""
    steps: list[int]
    """The steps replayed: complete in every replica not left out (at most `MAX_STEPS`, evenly spaced)."""
    left_out: list[int]
    """Replicas with no complete step (a rank's file missing, say): not replayed."""
    hop_ns: int
    """What a dependency between ranks adds where its link has no messages of its own: the run's median."""
    links: dict[tuple[int, int], int]
    """(sending rank, receiving rank) -> that link's median hop latency (`measured_hops`)."""
    measured_step_ns: float | None
    """The job's own step, from its first compute to its last on any rank, median over `steps`."""


def _places(trace: Trace, placement: Placement | None) -> dict[int, Unit]:
    """Each rank's (stage, replica): the placement's, else one replica of the ranks' physical stages."""
    placement = placement or placement_of(trace)
    if placement is not None:
        return dict(placement.place)
    stages, _ = stage_of_ranks(trace.spans, trace.meta)
    return {r: (s, 0) for r, s in stages.items()}


def _complete_steps(acts: pd.DataFrame, trace: Trace) -> tuple[list[int], list[int]]:
    """The steps to replay, and the replicas left out. A step is complete in a replica when each stage runs every
    micro-batch's forward and backward; a replica with no complete step (a rank's file missing) is left out, and
    the steps replayed are those complete in every other one."""
    stages = int(acts["stage"].max()) + 1
    m = trace.meta.microbatches
    mbs = list(range(m)) if m > 0 else sorted(int(x) for x in acts["mb"].unique())
    have: dict[tuple[int, int], set[tuple[int, str, int]]] = {}
    columns = (acts[c].tolist() for c in ("step", "replica", "stage", "phase", "mb"))
    for k, rep, stage, phase, mb in zip(*columns, strict=True):
        have.setdefault((k, rep), set()).add((stage, phase, mb))
    complete: dict[int, set[int]] = {int(rep): set() for rep in acts["replica"].unique()}
    for (k, rep), passes in have.items():
        if is_complete_step(passes, stages, mbs):
            complete[rep].add(k)
    kept = [done for done in complete.values() if done]
    steps = sorted(set.intersection(*kept)) if kept else []
    if len(steps) > MAX_STEPS:
        steps = [steps[int(i)] for i in np.linspace(0, len(steps) - 1, MAX_STEPS).round()]
    return steps, sorted(rep for rep, done in complete.items() if not done)


def _measured_step(trace: Trace, steps: list[int]) -> float | None:
    """The job's step from its first compute to its last on any rank (`step_windows`), median over `steps`."""
    windows = step_windows(trace)
    windows = windows[windows.index.isin(steps)]
    if windows.empty:
        return None
    return float(np.median((windows["hi_ns"] - windows["lo_ns"]).to_numpy()))


def read_job(
    trace: Trace, placement: Placement | None = None, *, hop_ns: int | None = None
) -> tuple[JobSteps | None, Notice | None]:
    """The job's complete training steps, their orders and measured costs per replica; or None and why not.
    `placement`: each rank's (stage, replica) (default: the trace's metadata, else one replica); `hop_ns`: what a
    dependency between ranks adds (default: measured, else 0)."""
    acts = training_actions(trace)
    place = _places(trace, placement)
    acts = acts[acts["rank"].isin(list(place))]
    if acts.empty:
        return None, NO_TRAINING_STEP
    acts = acts.assign(
        replica=acts["rank"].map(lambda r: place[r][1]), unit_stage=acts["rank"].map(lambda r: place[r][0])
    )
    steps, left_out = _complete_steps(acts, trace)
    if not steps:
        why = "no step in which every stage of every replica runs every micro-batch's forward and backward"
        return None, Notice(NoticeCode.NO_COMPLETE_STEP, f"no training step to replay with changed costs: {why}")
    units: dict[Unit, list[int]] = {}
    for r, unit in sorted(place.items()):
        units.setdefault(unit, []).append(r)
    acts = acts[acts["step"].isin(steps) & ~acts["replica"].isin(left_out)]
    key = ["replica", "unit_stage", "step", "stage", "mb", "phase"]
    merged = acts.groupby(key, as_index=False).agg(
        start_ns=("start_ns", "min"), busy_ns=("busy_ns", "max"), host_ns=("host_ns", "max")
    )
    median = merged.groupby(["replica", "stage", "phase"])[["busy_ns", "host_ns"]].median()
    costs: dict[int, Costs] = {}
    host: dict[int, Costs] = {}
    for (rep, s, t), busy, before in median.itertuples(name=None):
        costs.setdefault(int(rep), {})[(int(s), str(t))] = float(busy)
        host.setdefault(int(rep), {})[(int(s), str(t))] = float(before)
    runs = {
        (int(u), int(rep)): sorted(int(s) for s in g["stage"].unique())
        for (u, rep), g in merged.groupby(["unit_stage", "replica"])
    }
    measured_hop, links = measured_hops(trace) if hop_ns is None else (hop_ns, {})
    job = JobSteps(
        orders=_orders(merged, units),
        costs=costs,
        host=host,
        units={u: units[u] for u in runs},
        runs=runs,
        steps=steps,
        left_out=left_out,
        hop_ns=measured_hop or 0,
        links=links,
        measured_step_ns=_measured_step(trace, steps),
    )
    return job, None


def _orders(merged: pd.DataFrame, units: dict[Unit, list[int]]) -> dict[int, dict[int, dict[int, list[Action]]]]:
    """Replica -> step -> lead rank -> its actions, in the order they started; equal orders are one object (most
    steps run the same order: `replay_job` replays it once)."""
    merged = merged.sort_values(["replica", "step", "unit_stage", "start_ns"], kind="stable")
    types = {str(t): t for t in PASSES}
    rows: dict[tuple[int, int], dict[int, list[Action]]] = {}
    columns = (merged[c].tolist() for c in ("replica", "step", "unit_stage", "stage", "phase", "mb"))
    for rep, k, u, stage, phase, mb in zip(*columns, strict=True):
        lead = units[(u, rep)][0]
        rows.setdefault((rep, k), {}).setdefault(lead, []).append(Action(stage, types[phase], mb))
    out: dict[int, dict[int, dict[int, list[Action]]]] = {}
    shared: dict[tuple[int, tuple[tuple[int, tuple[Action, ...]], ...]], dict[int, list[Action]]] = {}
    for (rep, k), order in rows.items():
        key = (rep, tuple((r, tuple(acts)) for r, acts in sorted(order.items())))
        out.setdefault(rep, {})[k] = shared.setdefault(key, order)
    return out


def replay_job(job: JobSteps, costs: Mapping[int, Mapping[tuple[int, str], float]]) -> float:
    """The job's step replayed with `costs` (replica -> (stage, type) -> ns) in each replica's own order: the
    slowest replica's step, median over the job's steps, in ns. Raises InvalidConfigError when an order
    cannot run or a cost is missing."""
    replayed: dict[int, int] = {}  # id of an order (`_orders` shares equal ones) -> its step
    per_step = []
    for k in job.steps:
        worst = 0
        for rep, by_step in job.orders.items():
            order = by_step[k]
            if id(order) not in replayed:
                cost_ns = {sk: round(v) for sk, v in costs[rep].items()}
                host_ns = {sk: round(v) for sk, v in job.host.get(rep, {}).items()}
                replayed[id(order)] = replay_order(order, cost_ns, job.hop_ns, host_ns, job.links).window_ns
            worst = max(worst, replayed[id(order)])
        per_step.append(worst)
    return float(np.median(per_step))


def balanced_costs(costs: Mapping[int, Costs]) -> dict[int, Costs]:
    """Every replica's costs spread evenly over its stages: each (stage, type) the replica's mean of that type."""
    out: dict[int, Costs] = {}
    for rep, c in costs.items():
        by_type: dict[str, list[float]] = {}
        for (_, t), v in c.items():
            by_type.setdefault(t, []).append(v)
        out[rep] = {(s, t): float(np.mean(by_type[t])) for s, t in c}
    return out


def _per_mb(job: JobSteps, unit: Unit) -> float:
    """A (stage, replica)'s forward + backward cost per micro-batch, over every stage it runs."""
    c = job.costs[unit[1]]
    return sum(v for (s, _), v in c.items() if s in job.runs[unit])


def _straggler(job: JobSteps) -> WhatIfStraggler:
    """The slowest (stage, replica) of all (the first of equal ones), against its stage's other replicas."""
    t = {u: _per_mb(job, u) for u in sorted(job.runs)}
    unit = max(t, key=lambda u: t[u])
    others = [v for u, v in t.items() if u[0] == unit[0] and u != unit]
    median = float(np.median(others)) if others else 0.0
    return WhatIfStraggler(
        stage=unit[0],
        replica=unit[1],
        ranks=list(job.units[unit]),
        time_per_mb_ns=t[unit],
        vs_median=t[unit] / median if median > 0 else None,
    )


def straggler_costs(job: JobSteps, stage: int, replica: int) -> dict[int, Costs]:
    """The measured costs with those of (stage, replica) set, type by type, to the median of the other replicas
    of that stage."""
    out = {rep: dict(c) for rep, c in job.costs.items()}
    others = [rep for (u, rep) in job.runs if u == stage and rep != replica]
    for s, t in [k for k in job.costs[replica] if k[0] in job.runs[(stage, replica)]]:
        values = [job.costs[rep][(s, t)] for rep in others if (s, t) in job.costs[rep]]
        if values:
            out[replica][(s, t)] = float(np.median(values))
    return out


NO_TRAINING_STEP = Notice(
    NoticeCode.NO_TRAINING_STEP,
    "no training step to replay with changed costs: no forward/backward actions with a micro-batch and a step "
    "(not a training trace)",
)


def unread_reason(meta: RunMeta) -> Notice:
    """Why a run read rank by rank (`--workers`, `--ray`) has no what-if: ppscope's engine and its simulator run
    inference, so such a run has no training step, as `what_if` of the whole trace would say; a training run's
    what-ifs need every rank's actions at once."""
    if meta.source in ("ppscope", "simulator"):
        return NO_TRAINING_STEP
    return Notice(
        NoticeCode.WHOLE_TRACE_NEEDED,
        "what-ifs replay the job's whole step: not made when the run is read rank by rank (--workers, --ray)",
    )


def what_if(
    trace: Trace, placement: Placement | None = None, *, hop_ns: int | None = None
) -> tuple[WhatIf | None, Notice | None]:
    """The job's step replayed with measured costs, `balanced` ones and with no straggler (`read_job` for the
    arguments); or None and why not (`no_training_step`, `no_complete_step`, `replay_failed`)."""
    job, why = read_job(trace, placement, hop_ns=hop_ns)
    if job is None:
        return None, why
    replicas = len({rep for _, rep in job.runs})
    reasons: dict[str, Notice] = {}
    try:
        base = replay_job(job, job.costs)
        even = replay_job(job, balanced_costs(job.costs))
        balanced = WhatIfCase(step_ns=even, speedup=base / even)
        straggler, no_straggler = None, None
        if replicas > 1:
            straggler = _straggler(job)
            n = replay_job(job, straggler_costs(job, straggler.stage, straggler.replica))
            no_straggler = WhatIfCase(step_ns=n, speedup=base / n)
        else:
            text = "one replica: no other replica's stage to set the slowest stage to"
            reasons["no_straggler"] = Notice(NoticeCode.ONE_REPLICA, text)
    except InvalidConfigError as exc:
        return None, Notice(NoticeCode.REPLAY_FAILED, f"the step's own action order cannot be replayed: {exc}")
    return WhatIf(
        replicas=replicas,
        left_out=job.left_out,
        steps=job.steps,
        replay_step_ns=base,
        measured_step_ns=job.measured_step_ns,
        balanced=balanced,
        no_straggler=no_straggler,
        straggler=straggler,
        reasons=reasons,
    ), None
