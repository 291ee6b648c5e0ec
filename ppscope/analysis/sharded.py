"""`analyze_run(run_dir)`: the analysis of a run directory read a few ranks at a time, in worker processes.

Note (why two passes): almost all of the analysis is one stage's own business (its busy time, the cause of
each of its idle instants); only a handful of facts need every rank: the window, which rank is which stage,
each step's end on any stage (where fill turns into drain), the micro-batches in flight, and the pairing of a
send with its receive across two ranks. So:
  1. each rank file is read alone and reduced to a `RankDigest` (its extent, its steps' ends, its micro-batch
     ids, which peers it talks to, ...), a few hundred bytes whatever its size;
  2. the digests are merged into the whole trace's `Facts`, `Waves` and window, exactly as `analyze` finds
     them from one frame;
  3. each stage's ranks are read again and analysed with those, returning its `StageResult` and its gaps;
     the same task pairs the links into its ranks (`links`: hop figures, causality), reading of each sender's
     file only its sends to them, and returns a few hundred bytes a link, never the spans.
Peak memory is then one stage's spans (and its senders' sends to it) per worker, never the job's; what comes
back grows with the stages and links, not the spans. Every figure equals `analyze(load_run(...))` to the
nanosecond: the same functions run on the same spans, only fewer at a time (tests check it).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from ppscope.analysis.analyzer import (
    NO_SPANS,
    ZERO_LENGTH,
    AnalysisConfig,
    assemble,
    choose_window,
    empty_result,
    meta_notes,
    no_requests,
    run_latency,
    window_tokens,
)
from ppscope.analysis.bubbles import (
    ROLE_COMPUTE,
    ROLE_RECV,
    ROLE_SEND,
    ROLE_WAIT,
    compute_spans,
    span_roles,
    stage_bubbles,
)
from ppscope.analysis.facts import (
    Extents,
    Facts,
    StageLayout,
    busiest_rank,
    compute_overlaps,
    cpu_ranks,
    estimated_clocks,
    stage_times,
    uncertainties,
)
from ppscope.analysis.links import LinkPlan, Violations, causality_warnings, link_figures, plan_links
from ppscope.analysis.pipeline import collective_labels, comm_names, measured_inflight, stage_of_ranks
from ppscope.analysis.result import AnalysisResult, HopStats, StageResult, WindowInfo
from ppscope.analysis.steps import Waves
from ppscope.analysis.theory import flushes
from ppscope.errors import CorruptFileError, ErrorCode, InvalidConfigError
from ppscope.failures import RankError
from ppscope.pool import ordered, processes
from ppscope.trace.model import Phase, RunMeta, spans_frame
from ppscope.trace.notices import Notice
from ppscope.trace.rankfile import read_sends
from ppscope.trace.store import damaged_note, failures_said, read_rank_spans, read_requests, run_files

__all__ = ["RankDigest", "analyze_run"]

_P2P = (ROLE_SEND, ROLE_RECV, ROLE_WAIT)
_NO_WAVES = Waves(pd.Series(dtype=np.int64), pd.Series(dtype=np.int64))
_P2P_COLUMNS = ["rank", "peer", "kind", "mb", "step", "start_ns", "end_ns", "nbytes"]
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class RankDigest:
    """What one rank file contributes to the facts only the whole trace has (pass 1)."""

    rank: int
    spans: int
    error: RankError | None
    warnings: list[Notice]
    damaged: CorruptFileError | None
    """Why the rank file cannot be read (then it is left out, as `load_run` leaves it out); None when fine."""
    stage: int
    """The rank's lowest non-negative span stage, -1 when none has one."""
    extents: Extents
    """Its first and last span, and its first and last compute (one entry: the rank alone)."""
    waves: Waves
    """Its compute's end per step (steps as recorded; the run's flush decides later how to use them)."""
    any_compute: bool
    has_p2p: bool
    backward_compute: bool
    comm_names: set[str]
    overlaps: tuple[int, list[tuple[int, str]]]
    decode_mbs: np.ndarray
    """Its decode passes' micro-batch ids, sorted and distinct, as `id_runs` packs them."""
    compute_mbs: np.ndarray
    """Its compute spans' micro-batch ids, as `id_runs` packs them."""
    peers: set[int]
    sends_to: set[int]
    """The ranks it sends to: whose stage tasks read its sends."""


@dataclass(frozen=True)
class _StagePart:
    """One stage's share of the result (pass 2), with the figures of the links it paired."""

    result: StageResult
    gaps: pd.DataFrame
    tokens: int
    hops: list[HopStats]
    violations: Violations
    busiest: int
    """Of the stage's ranks, the one with the most compute in the window (the lowest on a tie)."""


def analyze_run(
    run_dir: str | Path,
    config: AnalysisConfig | None = None,
    *,
    workers: int = 1,
    ray: str | None = None,
    gaps: bool = True,
) -> AnalysisResult:
    """`analyze(load_run(run_dir), config)`, reading one rank (pass 1) or one stage (pass 2) at a time, in
    `workers` processes (1: in this one), or as tasks of the Ray cluster at `ray` (`local`: start one here; at
    least as many tasks in flight as it has CPUs). `gaps=False` leaves the idle intervals out of the result (an
    empty frame): they are as many as the spans, and only a drawing needs them."""
    meta, files, warnings = run_files(run_dir)
    requests = read_requests(run_dir)
    with Sharded.open(files, meta, config, workers=workers, ray=ray) as job:
        digests, wholes = job.digests(lambda rank: 0)
        warnings += job.said(digests)
        result, _ = job.analyze(digests, wholes.get(0, EMPTY_WHOLE), meta, requests, warnings, gaps=gaps)
    return result


class Sharded:
    """A run directory's ranks analysed in passes over a pool (this process, worker processes or Ray)."""

    def __init__(self, pool: Any, width: int, files: dict[int, Path], meta: RunMeta, config: AnalysisConfig) -> None:
        self.pool, self.width, self.files, self.meta, self.config = pool, width, files, meta, config

    @classmethod
    @contextlib.contextmanager
    def open(
        cls, files: dict[int, Path], meta: RunMeta, config: AnalysisConfig | None, *, workers: int, ray: str | None
    ) -> Iterator[Sharded]:
        if workers < 1:
            raise InvalidConfigError(ErrorCode.BAD_VALUE, f"--workers must be >= 1, got {workers}")
        with _pool(workers, ray) as pool:
            yield cls(pool, max(workers, getattr(pool, "slots", 1)), files, meta, config or AnalysisConfig())

    def digests(self, group_of: Callable[[int], int]) -> tuple[list[RankDigest], dict[int, _Whole]]:
        """Pass 1 over every rank file, its growing parts folded per group (`group_of(rank)`: a replica)."""
        jobs = [(*self._reading([r], self.meta), r) for r in sorted(self.files)]
        digests, wholes = _fold(ordered(self.pool, _digest, jobs, self.width), group_of)
        damaged = {d.rank: d.damaged for d in digests if d.damaged}
        if damaged and len(damaged) == len(digests):  # nothing else to read: as `load_run`, say the last
            raise damaged[max(damaged)]
        return digests, wholes

    def _reading(self, ranks: list[int], meta: RunMeta) -> tuple[dict[int, Path], RunMeta]:
        """What a task reading `ranks` is sent: their files, and the metadata with their own ranks' clocks only
        (a job's whole metadata, sent with each of its thousands of tasks, would outweigh the results)."""
        mine = set(ranks)
        files = {r: self.files[r] for r in ranks if r in self.files}
        return files, dataclasses.replace(meta, ranks=[i for i in meta.ranks if i.rank in mine])

    def said(self, digests: list[RankDigest]) -> list[Notice]:
        """What the rank files say of themselves: failures their ranks recorded, damaged spans and files."""
        out = failures_said({d.rank: d.error for d in digests if d.error is not None}, self.meta.error)
        for d in digests:
            out += d.warnings
        return out + [damaged_note(d.rank, d.damaged) for d in digests if d.damaged]

    def analyze(
        self,
        digests: list[RankDigest],
        whole: _Whole,
        meta: RunMeta,
        requests: pd.DataFrame | None,
        warnings: list[Notice],
        *,
        gaps: bool,
    ) -> tuple[AnalysisResult, dict[int, int]]:
        """Passes 2 and 3 for the pipeline of these ranks, with `meta` its metadata and `warnings` the job's;
        and each stage's busiest rank (its only one, or of tensor-parallel ranks the one with the most compute
        in the window)."""
        latency = run_latency(requests, meta)
        warnings = [*warnings, *meta_notes(meta)]
        digests = [d for d in digests if d.spans]
        if not digests:
            return empty_result(meta, warnings if meta.unrecorded else [*warnings, NO_SPANS], latency), {}
        tiny = pd.DataFrame({"rank": [d.rank for d in digests], "stage": [d.stage for d in digests]})
        rank_stage, said = stage_of_ranks(tiny, meta)
        layout = StageLayout.of(rank_stage)
        facts = _facts(digests, whole, layout, meta)
        window, chosen = choose_window(self.config, facts.extents)
        warnings += said + chosen
        if window.length_ns <= 0:
            return empty_result(meta, [*warnings, ZERO_LENGTH], latency, window=window), {}
        warnings += facts.warnings(layout.p)
        parts = self._stages(digests, whole, layout, facts, meta, requests, window, gaps)
        found = Violations()
        for part in parts:
            found = found.merged(part.violations)
        warnings += causality_warnings(found)
        results = [p.result for p in parts]
        idle = pd.concat([p.gaps for p in parts], ignore_index=True)
        tokens = sum(p.tokens for p in parts)
        hops = sorted((h for p in parts for h in p.hops), key=lambda h: (h.src_rank, h.dst_rank))
        result = assemble(meta, window, layout, facts, results, idle, hops, tokens, latency, warnings)
        return result, {p.result.stage: p.busiest for p in parts}

    def _stages(
        self,
        digests: list[RankDigest],
        whole: _Whole,
        layout: StageLayout,
        facts: Facts,
        meta: RunMeta,
        requests: pd.DataFrame | None,
        window: WindowInfo,
        gaps: bool,
    ) -> list[_StagePart]:
        """Pass 2: each stage's part, a task per stage, with the whole trace's facts."""
        flush = flushes(meta.schedule) or facts.backward_compute
        waves = _run_waves(whole.waves, flush=flush)
        ring_bound = facts.inflight is not None and facts.inflight < layout.p
        quiet = no_requests(requests, meta, window)
        plans = plan_links(layout.stages, {d.rank: d.sends_to for d in digests})
        shared = (window, flush, facts.has_waits, quiet, waves, ring_bound, gaps)
        jobs = [
            (*self._reading([*ranks, *plan.senders], meta), ranks, stage, *shared, plan, estimated_clocks(meta))
            for (stage, ranks), plan in zip(layout.stages, plans, strict=True)
        ]
        return list(ordered(self.pool, _stage, jobs, self.width))


def _digest(files: dict[int, Path], meta: RunMeta, rank: int) -> RankDigest:
    """Pass 1: one rank file reduced to what the whole trace needs of it."""
    damaged: CorruptFileError | None = None
    try:
        spans, errors, warnings = read_rank_spans(files, [rank], meta)
    except CorruptFileError as exc:
        spans, errors, warnings, damaged = spans_frame(), {}, [], exc
    error = errors.get(rank)
    if spans.empty:
        none = np.empty(0, np.int64)
        empty = Extents(0, 0, none, none)
        return RankDigest(
            rank,
            0,
            error,
            warnings,
            damaged,
            -1,
            empty,
            _NO_WAVES,
            False,
            False,
            False,
            set(),
            (0, []),
            none,
            none,
            set(),
            set(),
        )
    role = span_roles(spans["kind"], spans["name"])
    times = stage_times(spans, role, StageLayout.of({rank: 0}), ring_bound=False)
    compute = role == ROLE_COMPUTE
    stage = spans["stage"].to_numpy(np.int64)
    mb = spans["mb"].to_numpy(np.int64)
    decode = compute & (spans["phase"] == Phase.DECODE).to_numpy() & (mb >= 0)
    p2p = np.isin(role, _P2P)
    peer = spans["peer"].to_numpy(np.int64)
    return RankDigest(
        rank=rank,
        spans=len(spans),
        error=error,
        warnings=warnings,
        damaged=None,
        stage=int(stage[stage >= 0].min()) if (stage >= 0).any() else -1,
        extents=Extents.of(times, 1),
        waves=Waves.of(compute_spans(times), flush=True),
        any_compute=bool(compute.any()),
        has_p2p=bool(p2p.any()),
        backward_compute=bool((times.backward & compute).any()),
        comm_names=comm_names(spans, role),
        overlaps=compute_overlaps(spans, compute),
        decode_mbs=id_runs(np.unique(mb[decode])),
        compute_mbs=id_runs(np.unique(mb[compute & (mb >= 0)])),
        peers={int(q) for q in np.unique(peer[p2p & (peer >= 0)])},
        sends_to={int(q) for q in np.unique(peer[(role == ROLE_SEND) & (peer >= 0)])},
    )


def id_runs(ids: np.ndarray) -> np.ndarray:
    """Sorted distinct ids packed for the trip back to the driver: as (first, last) rows of their runs of
    consecutive ids where that is smaller (a rank's micro-batches mostly count up: 12,500 ids, 100 kB, become
    a few rows), else as they are. `run_ids` unpacks either."""
    ids = ids.astype(np.int64, copy=False)
    if len(ids) < 2:
        return ids
    breaks = np.flatnonzero(np.diff(ids) != 1)
    if 2 * (len(breaks) + 1) >= len(ids):
        return ids
    return np.stack([ids[np.r_[0, breaks + 1]], ids[np.r_[breaks, len(ids) - 1]]], axis=1)


def run_ids(packed: np.ndarray) -> np.ndarray:
    """The ids `id_runs` packed."""
    if packed.ndim == 1:
        return packed
    lengths = packed[:, 1] - packed[:, 0] + 1
    offsets = np.repeat(packed[:, 0] - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
    out: np.ndarray = offsets + np.arange(int(lengths.sum()), dtype=np.int64)
    return out


@dataclass(frozen=True)
class _Whole:
    """The parts of the digests that grow with a run's steps and micro-batches, folded as they arrive."""

    waves: Waves
    decode_mbs: np.ndarray
    compute_mbs: np.ndarray


EMPTY_WHOLE = _Whole(_NO_WAVES, np.empty(0, np.int64), np.empty(0, np.int64))


def _fold(digests: Iterator[RankDigest], group_of: Callable[[int], int]) -> tuple[list[RankDigest], dict[int, _Whole]]:
    """The digests, each let go of its steps and micro-batch ids once they are folded into its group's."""
    kept: list[RankDigest] = []
    none = np.empty(0, np.int64)
    wholes: dict[int, _Whole] = {}
    for d in digests:
        g = group_of(d.rank)
        whole = wholes.get(g, EMPTY_WHOLE)
        wholes[g] = _Whole(
            Waves.merged([whole.waves, d.waves]),
            np.union1d(whole.decode_mbs, run_ids(d.decode_mbs)),
            np.union1d(whole.compute_mbs, run_ids(d.compute_mbs)),
        )
        kept.append(dataclasses.replace(d, waves=_NO_WAVES, decode_mbs=none, compute_mbs=none))
    return kept, wholes


def _facts(digests: list[RankDigest], whole: _Whole, layout: StageLayout, meta: RunMeta) -> Facts:
    """The whole trace's facts from its ranks' digests, as `analyze` finds them in one frame."""
    index = {s: i for i, (s, _) in enumerate(layout.stages)}
    p = layout.p
    first = np.full(p, np.iinfo(np.int64).max, np.int64)
    last = np.full(p, np.iinfo(np.int64).min, np.int64)
    for d in digests:
        g = index[layout.rank_stage[d.rank]]
        first[g] = min(first[g], d.extents.first_compute[0])
        last[g] = max(last[g], d.extents.last_compute[0])
    extents = Extents(min(d.extents.first_ns for d in digests), max(d.extents.last_ns for d in digests), first, last)
    decode = whole.decode_mbs
    inflight, _ = measured_inflight(decode.astype(np.int32), np.ones(decode.shape[0], np.bool_), meta)
    has_p2p = any(d.has_p2p for d in digests)
    n = sum(d.overlaps[0] for d in digests)
    return Facts(
        extents=extents,
        any_compute=any(d.any_compute for d in digests),
        has_waits=has_p2p,
        backward_compute=any(d.backward_compute for d in digests),
        collectives=[] if has_p2p else collective_labels(set().union(*(d.comm_names for d in digests))),
        overlaps=(n, [lane for d in digests for lane in d.overlaps[1]][:3]),
        inflight=inflight,
        compute_mbs=int(whole.compute_mbs.shape[0]),
    )


def _run_waves(waves: Waves, *, flush: bool) -> Waves:
    """The whole trace's waves; without a flush every step is one (step 0), as `fill_drain` sees them."""
    if flush:
        return waves

    def one(s: pd.Series) -> pd.Series:
        return pd.Series([s.max()], index=[0]) if len(s) else s

    return Waves(one(waves.wave_end), one(waves.fwd_end))


def _stage(
    files: dict[int, Path],
    meta: RunMeta,
    ranks: list[int],
    stage: int,
    window: WindowInfo,
    flush: bool,
    has_waits: bool,
    quiet: Any,
    waves: Waves,
    ring_bound: bool,
    keep_gaps: bool,
    links: LinkPlan,
    check: bool,
) -> _StagePart:
    """Pass 2: one stage's bubbles and causes with the whole trace's facts, and the figures of its links (those
    into its ranks, with its senders' sends read from their files; `check`: their causality too)."""
    spans, _, _ = read_rank_spans(files, ranks, meta)
    role = span_roles(spans["kind"], spans["name"])
    layout = StageLayout.of(dict.fromkeys(ranks, stage))
    times = stage_times(spans, role, layout, ring_bound=ring_bound, cpu_ranks=cpu_ranks(meta))
    results, gaps = stage_bubbles(
        times, [(stage, ranks)], window, flush=flush, has_waits=has_waits, no_requests=quiet, waves=waves
    )
    p2p = np.isin(role, _P2P) & (spans["peer"].to_numpy() >= 0)
    busiest = ranks[0]
    if len(ranks) > 1:  # tensor parallel: the rank with the most compute is the stage's straggler
        rank, compute = spans["rank"].to_numpy(np.int64), times.role == ROLE_COMPUTE
        busiest = busiest_rank(rank, times.start_ns, times.end_ns, compute, ranks, window.start_ns, window.end_ns)
    kept = gaps if keep_gaps else gaps.iloc[:0].copy()  # as many as the spans: sent back only to be drawn
    sent = [read_sends(files[s], to, meta) for s, to in sorted(links.senders.items())]
    p2p_spans = pd.concat([spans.loc[p2p, _P2P_COLUMNS], *sent], ignore_index=True)
    hops, bad = link_figures(p2p_spans, [*ranks, *links.lone], window, uncertainties(meta) if check else None)
    return _StagePart(results[0], kept, window_tokens(spans, window), hops, bad, busiest)


def _pool(workers: int, ray: str | None) -> Any:
    """Ray tasks, worker processes, or this process for one worker."""
    if ray is not None:
        from ppscope.analysis.cluster import RayPool

        return RayPool(ray)
    return processes(workers)
