"""Where each rank sits in a job of data-parallel pipelines: its (stage, replica).

A job with PP × DP ranks runs DP replicas of one pipeline, each replica a whole pipeline of its own with P
stages, and each (stage, replica) one rank or several (tensor parallel inside the stage). The placement comes
from the run metadata (`RankInfo.replica` with `RankInfo.stage`; importers fill them, e.g. from Kineto's
`distributedInfo` process groups), or from the user: `--stage-of-rank` with `--tp` (`parse_stage_of_rank`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.model import RankInfo, RunMeta, Trace

__all__ = ["Placement", "StageRule", "apply_placement", "parse_stage_of_rank", "placement_from", "placement_of"]

_RULE = re.compile(r"^rank\s*(?://\s*(\d+))?\s*(?:%\s*(\d+))?$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?:(\d+)$")
_MAX_RANK = 1 << 24


@dataclass(frozen=True)
class StageRule:
    """`--stage-of-rank`: stage = (rank // div) % mod (mod 0: none), or an explicit table."""

    text: str
    div: int = 1
    mod: int = 0
    table: tuple[tuple[int, int], ...] = ()
    """(rank, stage) pairs of the range form."""

    def stage(self, rank: int) -> int | None:
        if self.table:
            return dict(self.table).get(rank)
        s = rank // self.div
        return s % self.mod if self.mod else s


def parse_stage_of_rank(text: str) -> StageRule:
    """`0-7:0,8-15:1`, `rank//8`, `rank%4` or `rank//2%4` as a rule; a one-line InvalidConfigError otherwise."""
    spec = text.strip().replace(" ", "")
    form = "give ranges like 0-7:0,8-15:1 or a rule rank//N, rank%N or rank//N%M"
    if spec.startswith("rank"):
        m = _RULE.match(spec)
        if not m or (m.group(1) is None and m.group(2) is None):
            raise InvalidConfigError(ErrorCode.BAD_PLACEMENT, f"--stage-of-rank {text!r} is not a rule: {form}")
        div, mod = int(m.group(1) or 1), int(m.group(2) or 0)
        if div < 1 or (m.group(2) is not None and mod < 1):
            raise InvalidConfigError(
                ErrorCode.BAD_PLACEMENT, f"--stage-of-rank {text!r} divides by 0: N and M must be >= 1"
            )
        return StageRule(text=text, div=div, mod=mod)
    table: dict[int, int] = {}
    for part in filter(None, spec.split(",")):
        m = _RANGE.match(part)
        if not m:
            raise InvalidConfigError(
                ErrorCode.BAD_PLACEMENT, f"--stage-of-rank {text!r}: {part!r} is not RANKS:STAGE; {form}"
            )
        lo, hi, stage = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3))
        if hi < lo or hi >= _MAX_RANK:
            raise InvalidConfigError(
                ErrorCode.BAD_PLACEMENT, f"--stage-of-rank {text!r}: range {part!r} needs first <= last < {_MAX_RANK}"
            )
        for r in range(lo, hi + 1):
            if table.setdefault(r, stage) != stage:
                raise InvalidConfigError(
                    ErrorCode.BAD_PLACEMENT,
                    f"--stage-of-rank {text!r}: rank {r} is given two stages ({table[r]}, {stage})",
                )
    if not table:
        raise InvalidConfigError(ErrorCode.BAD_PLACEMENT, f"--stage-of-rank is empty: {form}")
    return StageRule(text=text, table=tuple(sorted(table.items())))


@dataclass(frozen=True)
class Placement:
    """Each rank's (stage, replica), the ranks the job had, and where the placement came from."""

    place: dict[int, tuple[int, int]]
    source: str
    """`metadata` (RankInfo.replica), `--stage-of-rank ...`, or what an importer wrote."""
    unplaced: tuple[int, ...] = ()
    """Ranks of the job with no (stage, replica): named as missing when they recorded nothing."""

    @property
    def replicas(self) -> list[int]:
        return sorted({rep for _, rep in self.place.values()})

    @property
    def stages(self) -> list[int]:
        return sorted({s for s, _ in self.place.values()})

    def ranks_of(self, replica: int) -> list[int]:
        return sorted(r for r, (_, rep) in self.place.items() if rep == replica)


def _job_ranks(meta: RunMeta, recorded: Iterable[int]) -> list[int]:
    """Every rank the job had: 0..world_size-1, those the metadata names and those that recorded spans."""
    seen = set(range(meta.world_size)) | {i.rank for i in meta.ranks}
    return sorted(seen | set(recorded))


def _from_rule(ranks: Iterable[int], rule: StageRule, tp: int) -> tuple[dict[int, tuple[int, int]], list[int]]:
    by_stage: dict[int, list[int]] = {}
    unplaced = []
    for r in sorted(ranks):
        s = rule.stage(r)
        if s is None:
            unplaced.append(r)
        else:
            by_stage.setdefault(s, []).append(r)
    place = {}
    for s, members in by_stage.items():
        if len(members) % tp:
            raise InvalidConfigError(
                ErrorCode.BAD_PLACEMENT,
                f"--stage-of-rank {rule.text!r} gives stage {s} {len(members)} rank(s), not a multiple of --tp {tp}: "
                "check the rule and --tp",
            )
        place.update({r: (s, i // tp) for i, r in enumerate(members)})
    return place, unplaced


def placement_of(trace: Trace, rule: StageRule | None = None, tp: int = 1) -> Placement | None:
    """`placement_from` the trace's metadata and the ranks that recorded spans in it."""
    return placement_from(trace.meta, trace.ranks, rule, tp)


def placement_from(
    meta: RunMeta, recorded: Iterable[int], rule: StageRule | None = None, tp: int = 1
) -> Placement | None:
    """The (stage, replica) of every rank of `trace`; None when it is one pipeline (no replica is said).

    With `rule` (the user's `--stage-of-rank`), every rank of the job is placed by it: within a stage, ranks
    in order, `tp` at a time, form replica 0, 1, ...; else from `RankInfo.replica` and `RankInfo.stage` in the
    metadata, when some rank has a replica.
    """
    if tp < 1:
        raise InvalidConfigError(ErrorCode.BAD_VALUE, f"--tp must be >= 1, got {tp}")
    if rule is not None:
        place, unplaced = _from_rule(_job_ranks(meta, recorded), rule, tp)
        if not place:
            raise InvalidConfigError(
                ErrorCode.BAD_PLACEMENT, f"--stage-of-rank {rule.text!r} names none of the trace's ranks"
            )
        source = f"--stage-of-rank {rule.text}" + (f" --tp {tp}" if tp > 1 else "")
        return Placement(place=place, source=source, unplaced=tuple(unplaced))
    infos = [i for i in meta.ranks if i.replica >= 0]
    if not infos:
        return None
    bad = [i.rank for i in infos if i.stage < 0]
    if bad:
        raise InvalidConfigError(
            ErrorCode.BAD_PLACEMENT,
            f"the metadata gives rank {bad[0]} a replica but no stage: give every rank its stage, or --stage-of-rank",
        )
    place = {i.rank: (i.stage, i.replica) for i in infos}
    rest = tuple(r for r in _job_ranks(meta, recorded) if r not in place)
    source = str(meta.config.get("replica_placement", "")) or "metadata (RankInfo.stage and .replica)"
    return Placement(place=place, source=source, unplaced=rest)


def apply_placement(trace: Trace, placement: Placement) -> Trace:
    """`trace` with every placed rank's stage and replica in its metadata (the analyzer reads the stage there)."""
    infos = {i.rank: i for i in trace.meta.ranks}
    ranks = []
    for r in sorted(set(infos) | set(placement.place)):
        info = infos.get(r, RankInfo(rank=r))
        if r in placement.place:
            stage, replica = placement.place[r]
            info = dataclasses.replace(info, stage=stage, replica=replica)
        ranks.append(info)
    meta: RunMeta = dataclasses.replace(trace.meta, ranks=ranks, pp_size=len(placement.stages))
    return dataclasses.replace(trace, meta=meta)
