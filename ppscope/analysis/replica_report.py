"""Presenting a ReplicaAnalysis: a few lines and one row per stage, readable whatever the number of replicas,
and the dashboard's lanes: one per stage, with the straggler beside it.

It computes nothing: the figures come from `ppscope.analysis.replicas`.
"""

from __future__ import annotations

import pandas as pd

from ppscope.analysis.bubbles import ROLE_COMPUTE, span_roles
from ppscope.analysis.placement import Placement
from ppscope.analysis.replicas import ReplicaAnalysis, rank_list
from ppscope.trace.notices import missing_ranks

__all__ = ["lane_ranks", "replica_json", "replica_lines", "stage_lanes"]

_BASIS = {"time_per_mb": "time per micro-batch", "busy": "busy time"}


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.3f} ms"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _vs(slowdown: float | None) -> str:
    return "-" if slowdown is None else f"+{100 * (slowdown - 1):.1f}%"


def _stands_out(slowdown: float | None) -> bool:
    """A straggler is named when it is slower than the median at all (equal replicas have none)."""
    return slowdown is not None and slowdown > 1.0


def replica_lines(ra: ReplicaAnalysis) -> list[str]:
    """The job's summary and its per-stage table, as text lines."""
    n, p = len(ra.replicas), len(ra.stages)
    what = _BASIS.get(ra.basis, ra.basis)
    lines = [f"{n} data-parallel pipelines × {p} stages; (stage, replica) from {ra.placement}"]
    if ra.missing_ranks:
        lines.append(
            f"missing: {missing_ranks(ra.missing_ranks, ra.world_size)}; "
            f"incomplete replica(s): {rank_list(ra.incomplete_replicas) or 'none known'}"
        )
    if ra.bottleneck is not None:
        stage, replica, rank = ra.bottleneck
        lines.append(
            f"bottleneck: stage {stage}, replica {replica}, rank {rank}: {what} {_ms(ra.bottleneck_ns)}, "
            f"{_vs(ra.bottleneck_slowdown)} over the stage's median"
        )
    if ra.bubble_ratio is not None:
        lines.append(
            f"bubble ratio {_pct(ra.bubble_ratio)} over all replicas (Σ bubble / Σ (P × window)); per replica: "
            f"median {_pct(ra.bubble_median)}, worst {_pct(ra.bubble_worst)} (replica {ra.bubble_worst_replica})"
        )
    header = (
        "stage",
        "replicas",
        f"median {what}",
        "slowest",
        "straggler",
        "vs median",
        "bubble median",
        "bubble worst",
    )
    rows = [
        (
            str(s.stage),
            str(s.replicas),
            _ms(s.median_ns),
            _ms(s.slowest_ns),
            f"replica {s.straggler_replica} rank {s.straggler_rank}" if _stands_out(s.slowdown) else "none",
            _vs(s.slowdown) if _stands_out(s.slowdown) else "-",
            _pct(s.bubble_median),
            f"{_pct(s.bubble_worst)} (replica {s.bubble_worst_replica})",
        )
        for s in ra.stages
    ]
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    lines.append("")
    for row in (header, *rows):
        lines.append(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    return lines


def replica_json(ra: ReplicaAnalysis) -> dict[str, object]:
    """`ppscope analyze --json` of a job of replicas: the detailed replica's keys, as for one pipeline, and
    `replicas` (ReplicaAnalysis.to_json)."""
    out: dict[str, object] = dict(ra.results[ra.shown_replica].to_json()) if ra.shown_replica in ra.results else {}
    out["replicas"] = ra.to_json()
    return out


def stage_lanes(spans: pd.DataFrame, ra: ReplicaAnalysis, placement: Placement) -> pd.DataFrame:
    """The compute spans of one lane per stage, its median replica's (first) rank, and under it the stage's
    straggler, whose lane says so and by how much: 2 × P lanes at most, whatever the number of replicas.
    `spans` needs only the ranks of `lane_ranks` (a large run reads those alone)."""
    compute = spans[span_roles(spans["kind"], spans["name"]) == ROLE_COMPUTE]
    rank = compute["rank"].to_numpy()
    parts = [compute[rank == r].assign(lane=lane) for r, lane in lane_ranks(ra, placement)]
    return pd.concat(parts, ignore_index=True) if parts else compute.iloc[0:0]


def lane_ranks(ra: ReplicaAnalysis, placement: Placement) -> list[tuple[int, str]]:
    """The ranks `stage_lanes` draws, in order, each with its lane's label."""
    out = []
    for s in ra.stages:
        typical = min(r for r in placement.ranks_of(s.median_replica) if placement.place[r][0] == s.stage)
        out.append((typical, f"stage {s.stage}: median, replica {s.median_replica}"))
        if _stands_out(s.slowdown) and s.straggler_rank != typical:
            lane = f"stage {s.stage}: ▲ straggler, replica {s.straggler_replica} {_vs(s.slowdown)}"
            out.append((s.straggler_rank, lane))
    return out
