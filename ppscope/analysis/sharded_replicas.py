"""A job of many data-parallel pipelines analysed a rank at a time: `analyze_replicas` over `sharded`.

Pass 1 digests every rank file once, folding each replica's steps apart; then each replica's pipeline is
analysed from its own ranks' digests (its stages read again, one at a time), and the replicas are compared
stage by stage exactly as `ppscope.analysis.replicas` compares them. Memory holds the digests (a few hundred
bytes a rank) and one stage's spans per worker, whatever the number of replicas.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ppscope.analysis.analyzer import AnalysisConfig
from ppscope.analysis.placement import Placement, StageRule, placement_from
from ppscope.analysis.replicas import ReplicaAnalysis, crossing_pair, replicas_of
from ppscope.analysis.result import AnalysisResult
from ppscope.analysis.sharded import EMPTY_WHOLE, RankDigest, Sharded
from ppscope.trace.model import RankInfo, RunMeta
from ppscope.trace.notices import Notice
from ppscope.trace.store import run_files

__all__ = ["RunReplicas", "analyze_run_replicas", "run_replicas"]


@dataclass(frozen=True)
class RunReplicas:
    """A run directory's replicas compared (`analysis`), with what a viewer needs besides the figures and would
    otherwise load the whole run for: the placement, what the run's files say of themselves (missing, damaged,
    failures recorded: the warnings `load_run` gives), and the first start and last end of any span."""

    analysis: ReplicaAnalysis | None
    """None when the run is one pipeline."""
    placement: Placement | None
    said: list[Notice]
    first_ns: int
    last_ns: int
    """0 and 0 when no rank recorded a span."""


def analyze_run_replicas(
    run_dir: str | Path,
    rule: StageRule | None = None,
    tp: int = 1,
    config: AnalysisConfig | None = None,
    *,
    workers: int = 1,
    ray: str | None = None,
) -> ReplicaAnalysis | None:
    """The replicas of the run, each its own pipeline, compared stage by stage (`analyze_replicas`); None when
    the run is one pipeline (then `analyze_run` is the analysis). Placement from `rule` and `tp` (the user's
    `--stage-of-rank`, `--tp`), else from the metadata."""
    return run_replicas(run_dir, rule, tp, config, workers=workers, ray=ray).analysis


def run_replicas(
    run_dir: str | Path,
    rule: StageRule | None = None,
    tp: int = 1,
    config: AnalysisConfig | None = None,
    *,
    workers: int = 1,
    ray: str | None = None,
) -> RunReplicas:
    """`analyze_run_replicas`, with the placement, the files' warnings and the run's extent beside it (from the
    same digests: no more reads). A run of one pipeline is not analysed: `analysis` is None."""
    meta, files, warnings = run_files(run_dir)
    placement = placement_from(meta, files, rule, tp)
    if placement is None or len(placement.replicas) <= 1:
        return RunReplicas(None, None, warnings, 0, 0)
    replica = {r: rep for r, (_, rep) in placement.place.items()}
    with Sharded.open(files, meta, config, workers=workers, ray=ray) as job:
        digests, wholes = job.digests(lambda rank: replica.get(rank, -1))
        warnings += job.said(digests)
        said = list(warnings)
        recorded = {d.rank for d in digests if d.spans}

        def one(rep: int) -> tuple[AnalysisResult, dict[int, int]]:
            ranks = set(placement.ranks_of(rep))
            mine = [d for d in digests if d.rank in ranks]
            result, busiest = job.analyze(
                mine, wholes.get(rep, EMPTY_WHOLE), _replica_meta(meta, placement, rep), None, [], gaps=False
            )
            return result, busiest

        ra = replicas_of(placement, recorded, warnings, _crossing(digests, placement), one)
    spanned = [d.extents for d in digests if d.spans]
    first = min((e.first_ns for e in spanned), default=0)
    return RunReplicas(ra, placement, said, first, max((e.last_ns for e in spanned), default=0))


def _replica_meta(meta: RunMeta, placement: Placement, replica: int) -> RunMeta:
    """One replica's metadata, as `replicas.replica_trace` makes it: its ranks, placed; no world size (the
    other replicas' ranks are not missing from this pipeline)."""
    infos = []
    for r in placement.ranks_of(replica):
        stage, rep = placement.place[r]
        info = meta.rank_info(r) or RankInfo(rank=r)
        infos.append(dataclasses.replace(info, stage=stage, replica=rep))
    return dataclasses.replace(
        meta, run_id=f"{meta.run_id} replica {replica}", world_size=0, pp_size=len(placement.stages), ranks=infos
    )


def _crossing(digests: list[RankDigest], placement: Placement) -> tuple[int, int] | None:
    pairs = [(d.rank, q) for d in digests for q in sorted(d.peers)]
    if not pairs:
        return None
    rank, peer = (np.array(x, np.int64) for x in zip(*pairs, strict=True))
    return crossing_pair(rank, peer, placement)
