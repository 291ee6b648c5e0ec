"""Many pipelines: a job of data-parallel replicas, each analysed as its own pipeline, compared stage by stage.

Ranks that share a stage are one stage to `analyze` (tensor parallelism inside it). Data-parallel replicas are
not: each is a pipeline of its own, with its own bubble. `analyze_replicas` splits the trace by replica (the
`Placement` of `ppscope.analysis.placement`), runs the ordinary `analyze` on each replica's pipeline, and puts
beside each other, per stage, the replicas' times: median, slowest, the straggler rank and how much slower it is
than the median. The job's bottleneck is the slowest (stage, replica) of all, named with its rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ppscope.analysis.analyzer import AnalysisConfig, analyze
from ppscope.analysis.bubbles import ROLE_COMPUTE, span_roles
from ppscope.analysis.facts import busiest_rank
from ppscope.analysis.placement import Placement
from ppscope.analysis.result import AnalysisResult, StageResult, json_ns
from ppscope.trace.model import Trace, counters_frame, requests_frame
from ppscope.trace.notices import Notice, NoticeCode, rank_list

__all__ = [
    "OneReplica",
    "ReplicaAnalysis",
    "ReplicaSummary",
    "StageSpread",
    "analyze_replicas",
    "crossing_pair",
    "rank_list",
    "replicas_of",
]


@dataclass(kw_only=True)
class StageSpread:
    """One stage across the replicas that recorded it. t is the time per micro-batch (basis `time_per_mb`),
    or the busy time when some replica's stage has no `forward` spans (basis `busy`)."""

    stage: int
    replicas: int
    """Replicas whose pipeline has this stage."""
    basis: str
    median_ns: float
    """The median of t over the replicas (the mean of the middle two for an even count)."""
    slowest_ns: float
    straggler_replica: int
    """The replica with the largest t (the first of equal ones)."""
    straggler_rank: int
    """Its rank; of several (tensor parallel), the one busiest in the window."""
    slowdown: float | None
    """slowest ÷ median: how many times the straggler's t is the median's; None when the median is 0."""
    median_replica: int
    """The replica whose t is the lower middle one: the stage's typical lane."""
    bubble_median: float
    bubble_worst: float
    bubble_worst_replica: int


@dataclass(kw_only=True)
class ReplicaSummary:
    replica: int
    ranks: list[int]
    missing: list[int]
    """Ranks of this replica that recorded no spans (missing or damaged file)."""
    bubble_ratio: float | None
    slowest_stage: int | None


@dataclass(kw_only=True)
class ReplicaAnalysis:
    """A job of data-parallel pipelines, each analysed on its own, compared per stage."""

    placement: str
    """Where the ranks' (stage, replica) came from."""
    stages: list[StageSpread]
    replicas: list[ReplicaSummary]
    results: dict[int, AnalysisResult] = field(repr=False)
    """Each replica's own analysis (idle gaps dropped unless asked for)."""
    basis: str
    bubble_ratio: float | None
    """Σ bubble ÷ Σ (P × window) over every replica: the share of the job's stage time spent idle."""
    bubble_median: float | None
    bubble_worst: float | None
    bubble_worst_replica: int | None
    bottleneck: tuple[int, int, int] | None
    """(stage, replica, rank) with the largest t of the job."""
    bottleneck_ns: float | None
    bottleneck_slowdown: float | None
    """The bottleneck's t ÷ its stage's median."""
    missing_ranks: list[int]
    incomplete_replicas: list[int]
    shown_replica: int
    world_size: int = 0
    """The job's ranks: those placed and those with no (stage, replica)."""
    """The replica whose pipeline the report details: the bottleneck's, else the first."""
    warnings: list[Notice] = field(default_factory=list)
    """The job's: its own, those of the checks on the placement, and each replica's (said once when every
    replica says it, else with the replicas that do)."""
    replica_warnings: dict[int, list[Notice]] = field(default_factory=dict)
    """Each replica's warnings that `warnings` does not already say as they are: those not every replica says."""

    def to_json(self) -> dict[str, Any]:
        stages = [
            {_STAGE_KEYS.get(k, k): json_ns(v) if k.endswith("_ns") else v for k, v in dataclasses.asdict(s).items()}
            for s in self.stages
        ]
        return {
            "placement": self.placement,
            "count": len(self.replicas),
            "stages_per_replica": len(self.stages),
            "basis": self.basis,
            "bubble_ratio": self.bubble_ratio,
            "bubble_ratio_median": self.bubble_median,
            "bubble_ratio_worst": self.bubble_worst,
            "bubble_ratio_worst_replica": self.bubble_worst_replica,
            "bottleneck": None
            if self.bottleneck is None
            else dict(zip(("stage", "replica", "rank"), self.bottleneck, strict=True)),
            "bottleneck_ns": json_ns(self.bottleneck_ns),
            "bottleneck_vs_median": self.bottleneck_slowdown,
            "stages": stages,
            "replicas": [dataclasses.asdict(r) for r in self.replicas],
            "missing_ranks": self.missing_ranks,
            "incomplete_replicas": self.incomplete_replicas,
            "shown_replica": self.shown_replica,
            "warnings": [w.to_json() for w in self.warnings],
        }


def replica_trace(trace: Trace, placement: Placement, replica: int, rows: np.ndarray | None = None) -> Trace:
    """One replica's pipeline as a Trace of its own: its ranks' spans and counters, its ranks' metadata.

    `rows`: the positions of its spans in `trace.spans`, in order, when the caller has them (`_rows_by_replica`).
    `world_size` is 0 in it: the other replicas' ranks are not missing from this pipeline; the ranks missing
    from it are named by `analyze_replicas`, which knows which ranks the replica had.
    """
    ranks = np.array(placement.ranks_of(replica), np.int64)
    if rows is None:
        rows = np.flatnonzero(np.isin(trace.spans["rank"].to_numpy(), ranks))
    spans = trace.spans.take(rows).reset_index(drop=True)
    counters = trace.counters[np.isin(trace.counters["rank"].to_numpy(), ranks)].reset_index(drop=True)
    infos = []
    for r in ranks.tolist():
        info = trace.meta.rank_info(r)
        stage, rep = placement.place[r]
        infos.append(dataclasses.replace(info, stage=stage, replica=rep) if info else None)
    meta = dataclasses.replace(
        trace.meta,
        run_id=f"{trace.meta.run_id} replica {replica}",
        world_size=0,
        pp_size=len(placement.stages),
        ranks=[i for i in infos if i is not None] or _placed_infos(placement, ranks.tolist()),
    )
    return Trace(spans=spans, counters=counters_frame(counters), meta=meta, requests=requests_frame(), warnings=[])


def _rows_by_replica(trace: Trace, placement: Placement) -> dict[int, np.ndarray]:
    """Each replica's span positions, in trace order: one stable sort of the spans by replica, not a pass over
    every span per replica."""
    rank = trace.spans["rank"].to_numpy().astype(np.int64)
    keys = np.array(sorted(placement.place), np.int64)
    if not len(keys) or not len(rank):
        return {}
    reps = np.array([placement.place[int(r)][1] for r in keys], np.int64)
    pos = np.minimum(np.searchsorted(keys, rank), len(keys) - 1)
    rep = np.where(keys[pos] == rank, reps[pos], -1)
    order = np.argsort(rep, kind="stable")
    sorted_rep = rep[order]
    out = {}
    for r in placement.replicas:
        lo, hi = np.searchsorted(sorted_rep, r, "left"), np.searchsorted(sorted_rep, r, "right")
        out[r] = order[lo:hi]
    return out


def _placed_infos(placement: Placement, ranks: list[int]) -> list[Any]:
    from ppscope.trace.model import RankInfo

    return [RankInfo(rank=r, stage=placement.place[r][0], replica=placement.place[r][1]) for r in ranks]


def analyze_replicas(
    trace: Trace, placement: Placement, config: AnalysisConfig | None = None, *, keep_gaps: bool = False
) -> ReplicaAnalysis:
    """Each replica's pipeline analysed with `analyze`, and per stage the spread across replicas."""
    rows = _rows_by_replica(trace, placement)

    def one(rep: int) -> tuple[AnalysisResult, dict[int, int]]:
        sub = replica_trace(trace, placement, rep, rows.get(rep, np.empty(0, np.int64)))
        res = analyze(sub, config)
        busiest = {s.stage: _busiest_rank(sub, s, res) if len(s.ranks) > 1 else s.ranks[0] for s in res.stages}
        return res, busiest

    return replicas_of(
        placement,
        set(trace.ranks),
        list(trace.warnings),
        _crossing_messages(trace, placement),
        one,
        keep_gaps=keep_gaps,
    )


OneReplica = Callable[[int], tuple[AnalysisResult, dict[int, int]]]
"""A replica's analysis, and each of its stages' busiest rank (the straggler of a tensor-parallel stage)."""


def replicas_of(
    placement: Placement,
    recorded: set[int],
    warnings: list[Notice],
    crossing: tuple[int, int] | None,
    one: OneReplica,
    *,
    keep_gaps: bool = False,
) -> ReplicaAnalysis:
    """The replicas analysed by `one` and compared stage by stage. `recorded`: the ranks with spans;
    `warnings`: the job's own; `crossing`: a (rank, peer) pair whose message crosses replicas, if any."""
    results: dict[int, AnalysisResult] = {}
    summaries: list[ReplicaSummary] = []
    busiest: dict[tuple[int, int], int] = {}
    for rep in placement.replicas:
        ranks = placement.ranks_of(rep)
        missing = [r for r in ranks if r not in recorded]
        res = None
        if len(missing) < len(ranks):
            res, busy = one(rep)
            busiest.update({(stage, rep): rank for stage, rank in busy.items()})
            if not keep_gaps:
                res.gaps = res.gaps.iloc[0:0].copy()  # a view would keep every row
            results[rep] = res
        summaries.append(
            ReplicaSummary(
                replica=rep,
                ranks=ranks,
                missing=missing,
                bubble_ratio=None if res is None else res.bubble_ratio,
                slowest_stage=None if res is None else _slowest_stage(res.stages),
            )
        )
    missing_ranks = sorted(r for r in placement.place if r not in recorded)
    missing_ranks += [r for r in placement.unplaced if r not in recorded]
    incomplete = [s.replica for s in summaries if s.missing]
    ra = _aggregate(placement, results, summaries, busiest, sorted(missing_ranks), incomplete)
    said, own = _job_warnings(placement, recorded, crossing, results)
    return dataclasses.replace(ra, warnings=[*warnings, *said], replica_warnings=own)


def _job_warnings(
    placement: Placement, recorded: set[int], crossing: tuple[int, int] | None, results: dict[int, AnalysisResult]
) -> tuple[list[Notice], dict[int, list[Notice]]]:
    """What the checks on the placement say, and the replicas' warnings: once for the job where every replica
    says one, else with the replicas that say it; and per replica, those it says that not every replica does."""
    said = []
    stray = sorted(recorded - set(placement.place))
    if stray:
        text = (
            f"rank(s) {rank_list(stray)} recorded spans but have no (stage, replica) from {placement.source}: left out"
        )
        said.append(Notice(NoticeCode.UNPLACED_SPANS, text))
    if crossing:
        text = (
            "ranks of different replicas exchange point-to-point messages (between rank "
            f"{crossing[0]} and rank {crossing[1]}): a pipeline's stages talk to each other only, so the "
            f"placement from {placement.source} may be wrong"
        )
        said.append(Notice(NoticeCode.CROSSING_REPLICAS, text))
    seen: dict[Notice, list[int]] = {}
    for rep, res in results.items():
        for w in res.warnings:
            seen.setdefault(w, []).append(rep)
    n = len(placement.replicas)
    for w, reps in seen.items():
        said.append(w if len(reps) == n else dataclasses.replace(w, text=f"{w.text} (replica(s) {rank_list(reps)})"))
    unplaced_missing = [r for r in placement.unplaced if r not in recorded]
    if unplaced_missing:
        text = (
            f"rank(s) {rank_list(unplaced_missing)} of the job recorded nothing and have no (stage, replica): "
            "which replicas they belong to is unknown"
        )
        said.append(Notice(NoticeCode.UNPLACED_MISSING, text))
    own = {rep: [w for w in res.warnings if len(seen[w]) < n] for rep, res in results.items()}
    return said, own


def _aggregate(
    placement: Placement,
    results: dict[int, AnalysisResult],
    summaries: list[ReplicaSummary],
    busiest: dict[tuple[int, int], int],
    missing_ranks: list[int],
    incomplete: list[int],
) -> ReplicaAnalysis:
    per_stage: dict[int, list[tuple[int, StageResult]]] = {}
    for rep, res in results.items():
        for s in res.stages:
            per_stage.setdefault(s.stage, []).append((rep, s))
    every = [s for entries in per_stage.values() for _, s in entries]
    basis = "time_per_mb" if every and all(s.time_per_mb_ns is not None for s in every) else "busy"
    spreads = [_spread(stage, entries, busiest, basis) for stage, entries in sorted(per_stage.items())]
    bottleneck, bottleneck_ns, slowdown = None, None, None
    if spreads:
        worst = max(spreads, key=lambda sp: sp.slowest_ns)
        if worst.slowest_ns > 0:
            bottleneck = (worst.stage, worst.straggler_replica, worst.straggler_rank)
            bottleneck_ns, slowdown = worst.slowest_ns, worst.slowdown
    ratios = {rep: res.bubble_ratio for rep, res in results.items() if res.bubble_ratio is not None}
    stage_time = sum(len(res.stages) * res.window.length_ns for res in results.values() if res.window is not None)
    bubble = sum(s.bubble_ns for res in results.values() for s in res.stages)
    worst_rep = max(ratios, key=lambda r: ratios[r]) if ratios else None
    shown = bottleneck[1] if bottleneck else (min(results) if results else placement.replicas[0])
    return ReplicaAnalysis(
        placement=placement.source,
        stages=spreads,
        replicas=summaries,
        results=results,
        basis=basis,
        bubble_ratio=bubble / stage_time if stage_time > 0 else None,
        bubble_median=float(np.median(list(ratios.values()))) if ratios else None,
        bubble_worst=ratios[worst_rep] if worst_rep is not None else None,
        bubble_worst_replica=worst_rep,
        bottleneck=bottleneck,
        bottleneck_ns=bottleneck_ns,
        bottleneck_slowdown=slowdown,
        missing_ranks=missing_ranks,
        incomplete_replicas=incomplete,
        shown_replica=shown,
        world_size=len(placement.place) + len(placement.unplaced),
    )


def _t(s: StageResult, basis: str) -> float:
    return float(s.time_per_mb_ns) if basis == "time_per_mb" and s.time_per_mb_ns is not None else float(s.busy_ns)


def _spread(
    stage: int, entries: list[tuple[int, StageResult]], busiest: dict[tuple[int, int], int], basis: str
) -> StageSpread:
    t = np.array([_t(s, basis) for _, s in entries], np.float64)
    reps = [rep for rep, _ in entries]
    worst = int(np.argmax(t))
    order = np.argsort(t, kind="stable")
    middle = int(order[(len(t) - 1) // 2])
    median = float(np.median(t))
    bubbles = np.array([s.bubble_ratio for _, s in entries], np.float64)
    worst_bubble = int(np.argmax(bubbles))
    return StageSpread(
        stage=stage,
        replicas=len(entries),
        basis=basis,
        median_ns=median,
        slowest_ns=float(t[worst]),
        straggler_replica=reps[worst],
        straggler_rank=busiest[(stage, reps[worst])],
        slowdown=float(t[worst]) / median if median > 0 else None,
        median_replica=reps[middle],
        bubble_median=float(np.median(bubbles)),
        bubble_worst=float(bubbles[worst_bubble]),
        bubble_worst_replica=reps[worst_bubble],
    )


def _crossing_messages(trace: Trace, placement: Placement) -> tuple[int, int] | None:
    """A (rank, peer) pair of a message between two replicas, or None: pipelines talk within themselves."""
    spans = trace.spans
    peer = spans["peer"].to_numpy()
    rows = peer >= 0
    if not rows.any():
        return None
    return crossing_pair(spans["rank"].to_numpy()[rows], peer[rows], placement)


def crossing_pair(rank: np.ndarray, peer: np.ndarray, placement: Placement) -> tuple[int, int] | None:
    """The first (rank, peer) of these messages whose two ends are placed in different replicas, or None."""
    keys = np.array(sorted(placement.place), np.int64)
    reps = np.array([placement.place[int(r)][1] for r in keys], np.int64)
    pos_r, pos_p = np.searchsorted(keys, rank), np.searchsorted(keys, peer)
    pos_r, pos_p = np.minimum(pos_r, len(keys) - 1), np.minimum(pos_p, len(keys) - 1)
    known = (keys[pos_r] == rank) & (keys[pos_p] == peer)
    cross = known & (reps[pos_r] != reps[pos_p])
    if not cross.any():
        return None
    i = int(np.flatnonzero(cross)[0])
    return int(rank[i]), int(peer[i])


def _slowest_stage(stages: list[StageResult]) -> int | None:
    if not stages:
        return None
    basis = "time_per_mb" if all(s.time_per_mb_ns is not None for s in stages) else "busy"
    return max(stages, key=lambda s: _t(s, basis)).stage


def _busiest_rank(sub: Trace, stage: StageResult, res: AnalysisResult) -> int:
    """Of a stage's ranks (tensor parallel), the one with the most compute in the window."""
    spans = sub.spans
    compute = span_roles(spans["kind"], spans["name"]) == ROLE_COMPUTE
    start, end = spans["start_ns"].to_numpy(np.int64), spans["end_ns"].to_numpy(np.int64)
    lo, hi = (res.window.start_ns, res.window.end_ns) if res.window is not None else (int(start.min()), int(end.max()))
    return busiest_rank(spans["rank"].to_numpy(np.int64), start, end, compute, stage.ranks, lo, hi)


_STAGE_KEYS = {  # a stage's fields as `--json` names them: one name per quantity (docs/GLOSSARY.md)
    "slowdown": "vs_median",
    "bubble_median": "bubble_ratio_median",
    "bubble_worst": "bubble_ratio_worst",
    "bubble_worst_replica": "bubble_ratio_worst_replica",
}
