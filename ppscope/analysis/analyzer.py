"""`analyze(trace)`: the one entry point of the analyzer — a Trace in, an AnalysisResult out.

It picks the window, maps ranks to physical stages, and assembles bubbles, balance, theory, traffic,
latency and throughput. It prints nothing and draws nothing; user mistakes raise ppscope errors, and what
the trace cannot tell (no micro-batch ids, no wait spans, missing ranks) becomes a warning in the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ppscope.analysis.bubbles import (
    ROLE_COMPUTE,
    ROLE_RECV,
    ROLE_SEND,
    ROLE_WAIT,
    span_roles,
    stage_bubbles,
)
from ppscope.analysis.facts import (
    Extents,
    Facts,
    StageLayout,
    compute_overlaps,
    cpu_ranks,
    estimated_clocks,
    stage_times,
    uncertainties,
)
from ppscope.analysis.intervals import Intervals, clip
from ppscope.analysis.latency import request_latency
from ppscope.analysis.links import Violations, causality_warnings
from ppscope.analysis.pipeline import (
    collectives_without_p2p,
    count_distinct,
    hop_stats,
    measured_inflight,
    stage_imbalance,
    stage_of_ranks,
)
from ppscope.analysis.result import (
    AnalysisResult,
    HopStats,
    RequestLatency,
    StageResult,
    Theory,
    TheoryGap,
    WindowInfo,
)
from ppscope.analysis.theory import flushes, gap_parts, theory_for
from ppscope.analysis.window import active_window, full_window, resolve_window, steady_window
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.clock import causality_violations
from ppscope.trace.model import Phase, RunMeta, SpanKind, Trace
from ppscope.trace.notices import Notice, NoticeCode, missing_ranks
from ppscope.trace.schedules import Schedule

__all__ = ["AnalysisConfig", "analyze"]

_STATUS_NOTES = {
    "running": (
        NoticeCode.RUN_RUNNING,
        "the run is still being recorded: this is a snapshot of what was flushed so far",
    ),
    "failed": (NoticeCode.RUN_FAILED, "the run failed: the analysis covers what was recorded before the failure"),
    "interrupted": (
        NoticeCode.RUN_INTERRUPTED,
        "the run was interrupted: the analysis covers what was recorded before the interruption",
    ),
}
_LIVE_SOURCES = {
    "ppscope": _STATUS_NOTES["running"][1],
    "pipelining": "the run is still being recorded, or its job ended without closing the recorder "
    "(`record_pipeline` as a context manager closes it): this is what was flushed so far",
}
"""Sources that write a run directory as they go, and what their `running` status means."""


@dataclass(kw_only=True)
class AnalysisConfig:
    """What to analyse."""

    steady: bool = False
    """Analyse only the steady state (found automatically, see `ppscope.analysis.window`)."""
    active: bool = False
    """Analyse from the first compute of any stage to the last: start-up and shut-down left out."""
    window_ms: tuple[float, float] | None = None
    """Explicit window (start_ms, end_ms), in ms from the trace's first span."""

    def __post_init__(self) -> None:
        if self.steady + self.active + (self.window_ms is not None) > 1:
            raise InvalidConfigError(
                ErrorCode.CONFLICTING_OPTIONS, "give at most one of --steady, --active and --window start_ms:end_ms"
            )
        if self.window_ms is not None and not (0 <= self.window_ms[0] < self.window_ms[1]):
            raise InvalidConfigError(ErrorCode.BAD_WINDOW, f"window {self.window_ms} needs 0 <= start_ms < end_ms")


def analyze(trace: Trace, config: AnalysisConfig | None = None) -> AnalysisResult:
    """Bubbles, causes, bottleneck, theory vs measured, traffic and latency of `trace`."""
    config = config or AnalysisConfig()
    spans, meta = trace.spans, trace.meta
    latency = run_latency(trace.requests, meta)
    warnings = [*trace.warnings, *meta_notes(meta)]
    if len(spans) == 0:
        if not meta.unrecorded:  # the store has said why there are none
            warnings.append(NO_SPANS)
        return empty_result(trace.meta, warnings, latency)

    rank_stage, said = stage_of_ranks(spans, meta)
    warnings += said
    layout = StageLayout.of(rank_stage)
    role = span_roles(spans["kind"], spans["name"])
    is_compute = role == ROLE_COMPUTE
    mb = spans["mb"].to_numpy(np.int64)
    inflight, _ = measured_inflight(mb.astype(np.int32), is_compute & (spans["phase"] == Phase.DECODE).to_numpy(), meta)
    bound = inflight is not None and inflight < layout.p
    times = stage_times(spans, role, layout, ring_bound=bound, cpu_ranks=cpu_ranks(meta))
    facts = Facts(
        extents=Extents.of(times, layout.p),
        any_compute=bool(is_compute.any()),
        has_waits=bool(np.isin(role, [ROLE_RECV, ROLE_WAIT, ROLE_SEND]).any()),
        backward_compute=bool((times.backward & is_compute).any()),
        collectives=collectives_without_p2p(spans, role),
        overlaps=compute_overlaps(spans, is_compute),
        inflight=inflight,
        compute_mbs=count_distinct(mb[is_compute & (mb >= 0)]),
    )
    window, said = choose_window(config, facts.extents)
    warnings += said
    if window.length_ns <= 0:
        warnings.append(ZERO_LENGTH)
        return empty_result(trace.meta, warnings, latency, window=window)
    warnings += facts.warnings(layout.p) + _causality(spans, meta)

    flush = flushes(meta.schedule) or facts.backward_compute  # synchronous training flushes
    results, gaps = stage_bubbles(
        times,
        layout.stages,
        window,
        flush=flush,
        has_waits=facts.has_waits,
        no_requests=no_requests(trace.requests, meta, window),
    )
    start, end = times.start_ns, times.end_ns
    in_window = (end > window.start_ns) & (start < window.end_ns)
    hops = hop_stats(spans[in_window], role[in_window]) if not in_window.all() else hop_stats(spans, role)
    tokens = window_tokens(spans, window)
    return assemble(meta, window, layout, facts, results, gaps, hops, tokens, latency, warnings)


NO_SPANS = Notice(NoticeCode.NO_SPANS, "the trace holds no spans: nothing to analyse (did the run record anything?)")
ZERO_LENGTH = Notice(
    NoticeCode.ZERO_LENGTH, "the trace lasts 0 ns (only instantaneous spans): no ratio can be computed"
)


def run_latency(requests: pd.DataFrame | None, meta: RunMeta) -> RequestLatency | None:
    """TTFT, TPOT and tokens/s of the run's requests."""
    asked = meta.config.get("requests") if meta.source == "ppscope" else None
    return request_latency(requests, asked if isinstance(asked, int) and not isinstance(asked, bool) else 0)


def meta_notes(meta: RunMeta) -> list[Notice]:
    """What the run's metadata alone says the analysis should warn of."""
    notes = []
    if meta.status == "running" and meta.source in _LIVE_SOURCES:
        notes.append(Notice(NoticeCode.RUN_RUNNING, _LIVE_SOURCES[meta.source]))
    elif meta.status in _STATUS_NOTES and meta.status != "running":
        code, text = _STATUS_NOTES[meta.status]
        notes.append(Notice(code, text + (f" ({meta.error})" if meta.error else "")))
    notes += [
        Notice(NoticeCode.CPU_COUNTERS, f"rank {r.rank} recorded CPU counters, not its GPU's: {r.counters[4:].strip()}")
        for r in meta.ranks
        if r.counters.startswith("cpu:")
    ]
    return notes


def assemble(
    meta: RunMeta,
    window: WindowInfo,
    layout: StageLayout,
    facts: Facts,
    results: list[StageResult],
    gaps: pd.DataFrame,
    hops: list[HopStats],
    tokens: int,
    latency: RequestLatency | None,
    warnings: list[Notice],
) -> AnalysisResult:
    """The result from the stages' bubbles and the whole trace's facts, with `warnings` and what it adds."""
    missing = _missing(meta, layout)
    unknown = _unknown_stages(meta.pp_size, layout)
    p = layout.p + len(unknown)  # P: the run's stages, the ones that recorded nothing among them
    imbalance, basis, bottleneck, gain = stage_imbalance(results)
    if missing:  # the stages that are there cannot say which is slowest, nor what balance would gain
        imbalance, basis, bottleneck, gain = None, "incomplete", None, None
        warnings = [w for w in warnings if w != missing]  # named once, as the result's `missing`
    if basis == "busy":
        text = "no `forward` spans on some stage: imbalance compares busy time per stage"
        warnings = [*warnings, Notice(NoticeCode.BUSY_IMBALANCE, text)]
    theory = _theory(meta.schedule, p, meta.microbatches, meta.chunks, facts.inflight, facts.compute_mbs, window)
    throughput, basis_tp = _throughput(latency, tokens, window)
    return AnalysisResult(
        source=meta.source,
        emulated=str(meta.model.get("emulated", "")),
        schedule=meta.schedule,
        engine=meta.pipeline_engine,
        window=window,
        stages=results,
        bubble_ratio=None if missing else sum(s.bubble_ns for s in results) / (p * window.length_ns),
        imbalance=imbalance,
        imbalance_basis=basis,
        bottleneck_stage=bottleneck,
        balance_speedup=gain,
        theory=theory,
        theory_gap=None if missing else _theory_gap(results, theory, window),
        throughput_tokens_per_s=throughput,
        throughput_basis=basis_tp,
        latency=latency,
        hops=hops,
        inflight=facts.inflight,
        warnings=warnings,
        gaps=gaps,
        missing=missing,
        unknown_stages=unknown,
    )


def choose_window(config: AnalysisConfig, e: Extents) -> tuple[WindowInfo, list[Notice]]:
    """The window `config` asks for over extents `e`, and what was said of it (asked for, not found)."""
    full = full_window(np.array([e.first_ns]), np.array([e.last_ns]))
    if config.window_ms is not None:
        return resolve_window(full, config.window_ms)
    have = e.computing
    if config.active and have.any():
        return active_window(e.first_compute[have], e.last_compute[have]), []
    said = []
    if config.active:
        said.append(Notice(NoticeCode.NO_ACTIVE_WINDOW, "no compute spans: the active window is the whole run"))
    if not config.steady:
        return full, said
    steady = steady_window(e.first_compute.tolist(), e.last_compute.tolist()) if have.all() else None
    if steady is None:
        text = (
            "no steady state: the pipeline never has every stage working at once (too few micro-batches, "
            "or a stage without compute); analysed the whole run instead"
        )
        return full, [*said, Notice(NoticeCode.NO_STEADY_STATE, text)]
    return steady, said


def _missing(meta: RunMeta, layout: StageLayout) -> Notice | None:
    """What the trace lacks to describe the whole pipeline; None when nothing is missing."""
    missing = meta.ranks_missing(layout.rank_stage)
    if missing:
        return missing_ranks(missing, meta.world_size)
    if meta.pp_size > layout.p:
        text = f"the run has {meta.pp_size} stages but only {layout.p} recorded spans"
        return Notice(NoticeCode.MISSING_STAGES, text)
    return None


def _unknown_stages(pp: int, layout: StageLayout) -> list[int]:
    """The run's stages that recorded nothing, by number: the lowest numbers the recorded stages leave free,
    as many as the run has stages (`meta.pp_size`) beyond those."""
    recorded = {s for s, _ in layout.stages}
    free = (s for s in range(pp + len(recorded)) if s not in recorded)
    return [next(free) for _ in range(max(0, pp - len(recorded)))]


def _causality(spans: pd.DataFrame, meta: RunMeta) -> list[Notice]:
    """A warning when a receive ends before its send began on the common clock, beyond the offsets'
    uncertainty: the ranks' clock offsets are then wrong, and so is every wait measured across them."""
    if not estimated_clocks(meta):
        return []  # every rank reads one clock (one host, a simulation): there is no offset to get wrong
    return causality_warnings(Violations.of(causality_violations(spans, uncertainty_ns=uncertainties(meta))))


def _theory(schedule: str, p: int, m_meta: int, v: int, inflight: int | None, mbs: int, w: WindowInfo) -> Theory:
    m = m_meta if m_meta > 0 else mbs
    theory = theory_for(schedule, p=p, m=m, v=max(v, 1), inflight=inflight)
    if w.mode != "full" and flushes(schedule) and theory.bubble_ratio is not None:
        left_out = "the formula counts fill and drain over the whole run; this window leaves part of them out"
        theory.note = f"{theory.note}; {left_out}" if theory.note else left_out
    return theory


def _theory_gap(stages: list[StageResult], theory: Theory, w: WindowInfo) -> TheoryGap | None:
    """Measured minus predicted bubble ratio, in parts that add up to it (`theory.gap_parts`)."""
    if theory.bubble_ratio is None or not stages:
        return None
    total = len(stages) * w.length_ns
    shares = {c: sum(s.causes[c] for s in stages) / total for c in stages[0].causes}
    return gap_parts(shares, theory)


def no_requests(requests: pd.DataFrame | None, meta: RunMeta, window: WindowInfo) -> Intervals | None:
    """Every request of a finished serve run is in its requests table: between them the pipeline had nothing
    to do."""
    return _no_requests(requests, window) if (meta.schedule, meta.status) == (Schedule.SERVE, "finished") else None


def _no_requests(requests: pd.DataFrame | None, window: WindowInfo) -> Intervals | None:
    """When no request was in the system within `window`: the gaps between the union of the requests'
    [arrival, finish) (one not finished stays in to the end). None when arrivals are unknown."""
    if requests is None or len(requests) == 0:
        return None
    arrival = requests["arrival_ns"].to_numpy(np.int64)
    if (arrival < 0).any():
        return None
    finish = requests["finish_ns"].to_numpy(np.int64)
    finish = np.where(finish >= arrival, finish, np.int64(window.end_ns))
    order = np.argsort(arrival, kind="stable")
    start, end = arrival[order], np.maximum.accumulate(finish[order])
    # a gap opens where a request arrives after every earlier one has finished
    gap = np.flatnonzero(start[1:] > end[:-1])
    gaps_start = np.concatenate(([window.start_ns], end[gap]))
    gaps_end = np.concatenate(([start[0]], start[gap + 1]))
    tail_start = np.array([end[-1]], np.int64)
    tail_end = np.array([window.end_ns], np.int64)
    return clip(
        Intervals(np.concatenate((gaps_start, tail_start)), np.concatenate((gaps_end, tail_end))),
        window.start_ns,
        window.end_ns,
    )


def window_tokens(spans: pd.DataFrame, w: WindowInfo) -> int:
    """Tokens of the `sample` spans that end in the window."""
    end = spans["end_ns"].to_numpy()
    sample = (spans["kind"] == SpanKind.SAMPLE).to_numpy() & (end > w.start_ns) & (end <= w.end_ns)
    return int(spans["tokens"].to_numpy()[sample].sum())


def _throughput(latency: RequestLatency | None, tokens: int, w: WindowInfo) -> tuple[float | None, str]:
    if latency is not None and latency.tokens_per_s is not None:
        return latency.tokens_per_s, "requests.jsonl: output tokens / (last finish - first arrival)"
    if tokens <= 0:
        return None, "unknown: no requests and no `sample` spans with tokens"
    return tokens / (w.length_ns / 1e9), "tokens of `sample` spans ending in the window / window"


def empty_result(
    meta: RunMeta, warnings: list[Notice], lat: RequestLatency | None, window: WindowInfo | None = None
) -> AnalysisResult:
    return AnalysisResult(
        source=meta.source,
        emulated=str(meta.model.get("emulated", "")),
        schedule=meta.schedule,
        engine=meta.pipeline_engine,
        window=window,
        stages=[],
        bubble_ratio=None,
        imbalance=None,
        imbalance_basis="none",
        bottleneck_stage=None,
        balance_speedup=None,
        theory=Theory(formula="none (no stages)", bubble_ratio=None),
        throughput_tokens_per_s=lat.tokens_per_s if lat else None,
        throughput_basis="requests.jsonl" if lat and lat.tokens_per_s else "unknown",
        latency=lat,
        hops=[],
        inflight=None,
        warnings=warnings,
    )
