"""What a whole trace says beyond each stage's own spans, found in one pass over a frame or merged from its
ranks' digests (`ppscope.analysis.sharded`): which rank is which stage (`StageLayout`), where the spans lie
(`Extents`), the facts the warnings and theory need (`Facts`), and the span arrays the bubbles take
(`stage_times`). The analyzer and the rank-by-rank analysis share these, so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppscope.analysis.bubbles import ROLE_COMPUTE, StageTimes, TextCodes, dependency_waits
from ppscope.analysis.intervals import Intervals, clip, running_max, union_length
from ppscope.trace.actions import BACKWARDS, PASSES, ActionType
from ppscope.trace.model import Phase, RunMeta, SpanKind
from ppscope.trace.notices import Notice, NoticeCode

__all__ = [
    "Extents",
    "Facts",
    "StageLayout",
    "busiest_rank",
    "compute_overlaps",
    "estimated_clocks",
    "stage_times",
    "uncertainties",
]


@dataclass(frozen=True)
class StageLayout:
    """Which ranks form which physical stage: `stages` holds (stage, ranks) in stage order."""

    rank_stage: dict[int, int]
    stages: list[tuple[int, list[int]]]

    @classmethod
    def of(cls, rank_stage: dict[int, int]) -> StageLayout:
        ids = sorted(set(rank_stage.values()))
        return cls(rank_stage, [(s, sorted(r for r, st in rank_stage.items() if st == s)) for s in ids])

    @property
    def p(self) -> int:
        return len(self.stages)

    def group_of(self, rank: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The index in `stages` of each rank's stage."""
        ranks = np.array(sorted(self.rank_stage), np.int64)
        index = {s: i for i, (s, _) in enumerate(self.stages)}
        group_of_rank = np.array([index[self.rank_stage[int(r)]] for r in ranks], np.int64)
        return group_of_rank[np.searchsorted(ranks, rank)]


def stage_times(
    spans: pd.DataFrame,
    role: npt.NDArray[np.int8],
    layout: StageLayout,
    *,
    ring_bound: bool,
    cpu_ranks: frozenset[int] = frozenset(),
) -> StageTimes:
    """The span arrays the bubbles need; `ring_bound`: fewer micro-batches in flight than stages; `cpu_ranks`:
    the ranks whose device is a CPU (`cpu_ranks`)."""
    phase, kind = TextCodes.of(spans["phase"]), TextCodes.of(spans["kind"])
    decode, prefill = phase.among([Phase.DECODE]), phase.among([Phase.PREFILL])
    dependency = dependency_waits(role, spans["stage"].to_numpy(np.int64), prefill, decode, ring_bound=ring_bound)
    # a training backward: phase `backward`, a `backward` span, or a pipelining action's type (B, I, W; also on
    # the waits inside those actions)
    backward = phase.among([Phase.BACKWARD, *BACKWARDS]) | kind.among([SpanKind.BACKWARD])
    # a micro-batch's pass: a `forward` span, or where a trace has none (a profile of torch.distributed.pipelining,
    # DeepSpeed), a forward action's range
    forward = kind.among([SpanKind.FORWARD])
    if not forward.any():
        forward = kind.among([SpanKind.RANGE]) & phase.among([ActionType.FORWARD])
    return StageTimes(
        group=layout.group_of(spans["rank"].to_numpy(np.int64)),
        role=role,
        dependency=dependency,
        step=spans["step"].to_numpy(np.int64),
        backward=backward,
        start_ns=spans["start_ns"].to_numpy(np.int64),
        end_ns=spans["end_ns"].to_numpy(np.int64),
        forward=forward,
        chunk=spans["chunk"].to_numpy(np.int64),
        action=kind.among([SpanKind.RANGE]) & phase.among(list(PASSES)),
        on_cpu=np.isin(spans["rank"].to_numpy(np.int64), np.fromiter(cpu_ranks, np.int64, len(cpu_ranks))),
    )


def cpu_ranks(meta: RunMeta) -> frozenset[int]:
    """The ranks whose device is a CPU (`RankInfo.device` `cpu`): there the rank's thread is the device, and its
    time inside one of its own compute actions is its work (`bubbles`)."""
    return frozenset(i.rank for i in meta.ranks if i.device.startswith("cpu"))


_NONE = np.iinfo(np.int64)


@dataclass(frozen=True)
class Extents:
    """Where the trace's spans lie: the first and last span, and per stage its first and last compute (the
    int64 limits where a stage has none). Enough to choose any window."""

    first_ns: int
    last_ns: int
    first_compute: npt.NDArray[np.int64]
    last_compute: npt.NDArray[np.int64]

    @classmethod
    def of(cls, t: StageTimes, p: int) -> Extents:
        compute = t.role == ROLE_COMPUTE
        first = np.full(p, _NONE.max, np.int64)
        last = np.full(p, _NONE.min, np.int64)
        np.minimum.at(first, t.group[compute], t.start_ns[compute])
        np.maximum.at(last, t.group[compute], t.end_ns[compute])
        return cls(int(t.start_ns.min()), int(t.end_ns.max()), first, last)

    @property
    def computing(self) -> npt.NDArray[np.bool_]:
        """Which stages have any compute."""
        return self.last_compute > _NONE.min

    @classmethod
    def merged(cls, parts: list[Extents]) -> Extents:
        return cls(
            min(e.first_ns for e in parts),
            max(e.last_ns for e in parts),
            np.minimum.reduce([e.first_compute for e in parts]),
            np.maximum.reduce([e.last_compute for e in parts]),
        )


@dataclass(frozen=True)
class Facts:
    """What the whole trace says beyond each stage's own spans: found in one pass, or merged from its ranks'."""

    extents: Extents
    any_compute: bool
    has_waits: bool
    backward_compute: bool
    collectives: list[str]
    overlaps: tuple[int, list[tuple[int, str]]]
    inflight: int | None
    compute_mbs: int
    """Distinct micro-batch ids of compute spans."""

    def warnings(self, p: int) -> list[Notice]:
        """What these facts warn of, for a pipeline of `p` stages."""
        out = []
        if not self.any_compute:
            text = "no compute spans (forward/backward/embed/head/sample/kernel): every stage counts as idle"
            out.append(Notice(NoticeCode.NO_COMPUTE, text))
        if self.collectives:
            text = (
                f"this trace has collectives ({', '.join(self.collectives)}) but no point-to-point traffic: it does "
                "not look like a pipeline (data, tensor or expert parallelism?); each rank is analysed as a stage, "
                "and collective time is reported as communication (`comm`)"
            )
            out.append(Notice(NoticeCode.COLLECTIVES_ONLY, text))
        if not self.has_waits and self.any_compute:
            text = (
                "this trace has no recv/send spans: idle time between computes is reported as `unknown` "
                "(waiting on another stage cannot be told from host overhead)"
            )
            out.append(Notice(NoticeCode.NO_P2P, text))
        if p == 1:
            out.append(
                Notice(
                    NoticeCode.ONE_STAGE, "one stage only: there is no pipeline; the bubble is that stage's idle time"
                )
            )
        n, lanes = self.overlaps
        if n:
            where = ", ".join(f"rank {r} lane {la}" for r, la in lanes[:3])
            text = (
                f"{n} compute span(s) overlap an earlier one on the same lane ({where}); busy time counts "
                "overlapping compute once"
            )
            out.append(Notice(NoticeCode.COMPUTE_OVERLAP, text))
        return out


_MEASURED_CLOCKS = ("ping-pong", "import")
"""Clock methods whose offsets were estimated, and so can be off: a violation of causality tells."""


def estimated_clocks(meta: RunMeta) -> bool:
    """Whether some rank's clock offset was estimated, and so can be off (a violation of causality tells)."""
    return any(r.clock.method in _MEASURED_CLOCKS for r in meta.ranks)


def uncertainties(meta: RunMeta) -> dict[int, int]:
    return {r.rank: r.clock.uncertainty_ns for r in meta.ranks}


def compute_overlaps(spans: pd.DataFrame, is_compute: npt.NDArray[np.bool_]) -> tuple[int, list[tuple[int, str]]]:
    """Compute spans that overlap an earlier one on one (rank, lane), and the first three such lanes in
    (rank, lane) order: they are counted once (union)."""
    if is_compute.sum() < 2:
        return 0, []
    lane, uniques = pd.factorize(spans["lane"], sort=True)  # codes in the lanes' text order
    lanes = [str(x) for x in uniques]
    lane = lane[is_compute]
    if (lane < 0).any():  # a lane without a name: sorted last, as sort_values puts it
        lanes.append(str(spans["lane"][is_compute][lane < 0].iloc[0]))
        lane = np.where(lane < 0, len(lanes) - 1, lane)
    rank, start, end = (spans[c].to_numpy(np.int64)[is_compute] for c in ("rank", "start_ns", "end_ns"))
    order = np.lexsort((end, start, lane, rank))
    rank, lane, start, end = rank[order], lane[order], start[order], end[order]
    first = np.r_[True, (rank[1:] != rank[:-1]) | (lane[1:] != lane[:-1])]
    reach = running_max(end, np.flatnonzero(first))  # the latest end so far on the span's (rank, lane)
    overlap = np.r_[False, ~first[1:] & (start[1:] < reach[:-1])]
    n = int(overlap.sum())
    seen: list[tuple[int, str]] = []
    for r, c in zip(rank[overlap].tolist(), lane[overlap].tolist(), strict=True):
        if len(seen) == 3:
            break
        if (r, lanes[c]) not in seen:
            seen.append((r, lanes[c]))
    return n, seen


def busiest_rank(
    rank: npt.NDArray[np.int64],
    start_ns: npt.NDArray[np.int64],
    end_ns: npt.NDArray[np.int64],
    compute: npt.NDArray[np.bool_],
    ranks: list[int],
    lo: int,
    hi: int,
) -> int:
    """Of a stage's `ranks` (tensor parallel), the one with the most compute in [lo, hi); the lowest on a tie."""
    busy = {
        r: union_length(clip(Intervals(start_ns[m], end_ns[m]), lo, hi)) for r in ranks for m in [compute & (rank == r)]
    }
    return max(ranks, key=lambda r: (busy[r], -r))
