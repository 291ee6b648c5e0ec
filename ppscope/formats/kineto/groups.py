"""Stages and data-parallel replicas of a Kineto job, from the process groups torch records in each file.

torch's profiler writes `distributedInfo` into every trace: `rank`, `world_size`, and `pg_config`, one entry per
process group the rank belongs to, with `pg_desc` (DeviceMesh names its groups `mesh_<dim>`: `mesh_pp`,
`mesh_dp`, `mesh_tp`, ...) and `ranks` (in the group's order). A pipeline group (`pp` in its description) is
one replica's pipeline: a rank's stage is its place in it. Pipelines joined by a tensor- or context-parallel
group (`tp`, `cp`) are one replica, whose stages span several ranks; everything else (`dp`, `dp_shard`,
`dp_replicate`, the default group) tells replicas apart and is not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["GroupPlacement", "group_placement"]

_PP = re.compile(r"(?:^|[^a-z])(?:pp|pipe|pipeline)(?:$|[^a-z])", re.IGNORECASE)
_INNER = re.compile(r"(?:^|[^a-z])(?:tp|cp|tensor|context)(?:$|[^a-z])", re.IGNORECASE)


@dataclass(frozen=True)
class GroupPlacement:
    place: dict[int, tuple[int, int]]
    """Every rank a pipeline group names (files present or not): (stage, replica)."""
    world_size: int
    explanation: str


def _groups(tops: dict[int, dict[str, Any]]) -> tuple[set[tuple[int, ...]], set[tuple[int, ...]], int]:
    pp, inner, world = set(), set(), 0
    for top in tops.values():
        info = top.get("distributedInfo")
        if not isinstance(info, dict):
            continue
        size = info.get("world_size")
        world = max(world, size if isinstance(size, int) and not isinstance(size, bool) else 0)
        for pg in info.get("pg_config") or []:
            if not isinstance(pg, dict):
                continue
            ranks, desc = pg.get("ranks"), str(pg.get("pg_desc", ""))
            if not isinstance(ranks, list) or not ranks:
                continue
            if not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < 1 << 24 for r in ranks):
                continue
            if _PP.search(desc):
                pp.add(tuple(ranks))
            elif _INNER.search(desc):
                inner.add(tuple(ranks))
    return pp, inner, world


def group_placement(tops: dict[int, dict[str, Any]]) -> tuple[GroupPlacement | None, list[Notice]]:
    """Each rank's (stage, replica) from the files' pipeline groups; None when no file has one, or (said so)
    when they do not tell."""
    pp, inner, world = _groups(tops)
    if not pp:
        return None, []
    stage: dict[int, int] = {}
    for group in sorted(pp):
        for i, r in enumerate(group):
            if stage.setdefault(r, i) != i:
                text = f"rank {r} sits at two places of pipeline groups: took stages from the traffic instead"
                return None, [Notice(NoticeCode.GROUPS_CONFLICT, text)]
    parent = {r: r for r in stage}

    def root(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    joined = [g for g in sorted(inner) if all(r in stage for r in g) and len({stage[r] for r in g}) == 1]
    for group in [*sorted(pp), *joined]:
        for r in group[1:]:
            parent[root(r)] = root(group[0])
    roots = sorted({root(r) for r in stage}, key=lambda x: min(r for r in stage if root(r) == x))
    replica_of_root = {x: i for i, x in enumerate(roots)}
    place = {r: (s, replica_of_root[root(r)]) for r, s in stage.items()}
    tp = f", joined by {len(joined)} tensor/context-parallel group(s)" if joined else ""
    explanation = (
        f"Kineto distributedInfo: {len(pp)} pipeline process group(s){tp} make {len(roots)} replica(s); a rank's "
        "stage is its place in its pipeline group"
    )
    return GroupPlacement(place=place, world_size=max(world, max(stage) + 1), explanation=explanation), []
