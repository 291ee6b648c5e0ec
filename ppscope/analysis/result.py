"""Typed results of the analyzer and their stable JSON form.

These dataclasses only hold numbers the analyzer computed; they know nothing about how they are printed
or drawn. `to_json()` gives the documented, stable key set of `ppscope analyze --json`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10
    from ppscope.trace.model import StrEnum

from ppscope.trace.notices import Notice

__all__ = [
    "CAUSES",
    "AnalysisResult",
    "Cause",
    "HopStats",
    "LatencyStats",
    "RequestLatency",
    "StageResult",
    "Theory",
    "TheoryGap",
    "TrainingReplay",
    "WhatIf",
    "WhatIfCase",
    "WhatIfStraggler",
    "WindowInfo",
    "json_ns",
]


class Cause(StrEnum):
    """Why a stage is idle at one instant (docs/ARCHITECTURE.md, "Idle causes")."""

    FILL = "fill"  # before the stage's first compute (of each step, and its warm-up, when steps flush)
    DRAIN = "drain"  # after the stage's last compute (of each step, and its cool-down, when steps flush)
    UPSTREAM = "upstream"  # waiting in recv for a slower predecessor
    DEPENDENCY = "dependency"  # waiting for a micro-batch's own token to come round the ring
    DOWNSTREAM = "downstream"  # blocked in send until the successor takes the data
    COMM = "comm"  # the transfer between stages itself (recv transfer, NCCL kernel, peer copy, collective)
    MEMCPY = "memcpy"  # a copy between host and device (or a memset) on the stage's own device
    DP_SYNC = "dp_sync"  # training: a data-parallel collective (gradient reduce, parameter gather, loss broadcast)
    OPTIMIZER = "optimizer"  # training: the optimizer step, gradient clipping, zeroing
    HOST = "host"  # no span covers it: scheduling or Python overhead
    UNKNOWN = "unknown"  # no span covers it and the source records no waits to tell host from waiting
    NO_REQUESTS = "no_requests"  # serve: no request in the system (all done, the next not yet arrived)


CAUSES: tuple[str, ...] = tuple(str(c) for c in Cause)
"""Every cause, in report order; each stage's `causes` has all of them as keys."""


@dataclass(kw_only=True)
class WindowInfo:
    """The analysed window on the trace's common clock."""

    start_ns: int
    end_ns: int
    mode: str
    """`full` (first to last span), `steady` (found automatically) or `explicit` (given by the user)."""
    how: str
    """One sentence saying how the window was chosen."""

    @property
    def length_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(kw_only=True)
class StageResult:
    """Busy time, bubble and its causes for one physical stage (one device, or the ranks sharing a stage)."""

    stage: int
    ranks: list[int]
    busy_ns: int
    bubble_ns: int
    bubble_ratio: float
    """bubble_ns / window length."""
    causes: dict[str, int]
    """Cause -> ns; values add up to bubble_ns exactly."""
    units: float
    """Micro-batch passes in the window: `forward` spans / model chunks on the stage, a forward cut by the
    window counting for its part inside; 0 when the stage has no `forward` spans (imports)."""
    time_per_mb_ns: float | None
    """busy_ns / units: the stage's time per micro-batch; None when units is 0."""


@dataclass(kw_only=True)
class Theory:
    """The bubble ratio a textbook schedule predicts for this run's shape."""

    formula: str
    """Human-readable formula with its name, e.g. `GPipe (P-1)/(M+P-1)`."""
    bubble_ratio: float | None
    """Predicted share of wall time idle; None when the schedule is unknown."""
    params: dict[str, int] = field(default_factory=dict)
    """The values plugged in: P, M, V, m."""
    note: str = ""
    causes: tuple[str, ...] = ()
    """The causes the formula counts: `fill` and `drain` for flushed schedules, `dependency` for continuous
    decode; empty when there is no formula."""


@dataclass(kw_only=True)
class TheoryGap:
    """Measured bubble ratio minus the formula's, split into parts that add up to it (shares of P × window)."""

    ratio: float
    parts: dict[str, float]
    """Signed shares: first the formula's causes together (e.g. `fill+drain`: their measured share minus the
    formula), then every other cause with a measured share, in report order."""


@dataclass(kw_only=True)
class TrainingReplay:
    """A training run replayed: its own action order, run again as discrete events with its measured
    per-action costs and hop latency (`ppscope.simulate.training`). The analyzer does not compute it (the
    simulator sits above it); a caller that has one sets `AnalysisResult.replay`."""

    bubble_ratio: float | None
    """Σ idle ÷ (ranks × window) of the replayed steps, each over its own window from its first compute to its
    last (median over the steps); None when nothing could be replayed (`note` says why)."""
    measured_step_ratio: float | None = None
    """The same ratio measured on the run over the same steps' windows (median over the steps)."""
    steps: list[int] = field(default_factory=list)
    """The steps replayed (complete ones: every stage runs every micro-batch's forward and backward)."""
    costs_ns: dict[int, dict[str, float]] = field(default_factory=dict)
    """Stage -> action type (F, B, I, W) -> the median busy time of that action, in ns."""
    host_ns: dict[int, dict[str, float]] = field(default_factory=dict)
    """Stage -> action type -> the median host time of the rank before that action, in ns (0 on GPU ranks)."""
    hop_ns: int = 0
    """The hop latency added to a dependency between ranks on a link not in `link_ns`: the run's median."""
    link_ns: dict[tuple[int, int], int] = field(default_factory=dict)
    """(sending rank, receiving rank) -> the hop latency added to that link's dependencies: its own median."""
    hop_measured: bool = False
    """Whether `hop_ns` was measured (median post-to-wake latency of the run's messages) or taken as 0."""
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "bubble_ratio": self.bubble_ratio,
            "measured_step_bubble_ratio": self.measured_step_ratio,
            "steps": list(self.steps),
            "costs_ns": {str(s): {a: json_ns(ns) for a, ns in c.items()} for s, c in self.costs_ns.items()},
            "host_ns": {str(s): {a: json_ns(ns) for a, ns in c.items()} for s, c in self.host_ns.items()},
            "hop_latency_ns": self.hop_ns,
            "link_latency_ns": {f"{a}->{b}": ns for (a, b), ns in sorted(self.link_ns.items())},
            "hop_measured": self.hop_measured,
            "note": self.note,
        }


@dataclass(kw_only=True)
class WhatIfCase:
    """One what-if: the job's step replayed with changed costs."""

    step_ns: float
    """The job's replayed step (the slowest replica's), median over the replayed steps."""
    speedup: float
    """The replay of the measured costs ÷ this one: above 1 is faster."""

    def to_json(self) -> dict[str, float]:
        return {"step_ms": self.step_ns / 1e6, "speedup": self.speedup}


@dataclass(kw_only=True)
class WhatIfStraggler:
    """The slowest (stage, replica) of a job of several replicas."""

    stage: int
    replica: int
    ranks: list[int]
    """Its ranks (several: tensor parallel)."""
    time_per_mb_ns: float
    """Its forward + backward cost per micro-batch (F + B, or F + I + W, of every stage it runs)."""
    vs_median: float | None
    """time_per_mb_ns ÷ the median of the other replicas of its stage; None when that median is 0."""

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "replica": self.replica,
            "ranks": list(self.ranks),
            "time_per_mb_ns": json_ns(self.time_per_mb_ns),
            "vs_median": self.vs_median,
        }


@dataclass(kw_only=True)
class WhatIf:
    """A training job's step replayed with changed costs (`ppscope.simulate.whatif`): how much would an ideal
    layer split, or replacing the straggler, buy? Like the replay, the analyzer does not compute it; a caller
    that has one sets `AnalysisResult.what_if`."""

    replicas: int
    """The replicas replayed."""
    left_out: list[int] = field(default_factory=list)
    """Replicas with no complete step (a rank's file missing, say): not replayed, so the job's step is the slowest
    of the others'."""
    steps: list[int]
    """The steps replayed: complete in every replica replayed."""
    replay_step_ns: float
    """The job's step replayed with the measured costs (the slowest replica's), median over the steps."""
    measured_step_ns: float | None
    """The job's step as measured, from its first compute to its last on any rank, median over the same steps."""
    balanced: WhatIfCase | None
    """Every replica's forward and backward work per micro-batch spread evenly over its stages."""
    no_straggler: WhatIfCase | None
    """The straggler's costs set to the median of the other replicas of its stage; None with one replica."""
    straggler: WhatIfStraggler | None
    reasons: dict[str, Notice] = field(default_factory=dict)
    """Case (`balanced`, `no_straggler`) -> why it is None."""

    def to_json(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "left_out_replicas": list(self.left_out),
            "steps": list(self.steps),
            "replay_step_ms": self.replay_step_ns / 1e6,
            "measured_step_ms": None if self.measured_step_ns is None else self.measured_step_ns / 1e6,
            "balanced": None if self.balanced is None else self.balanced.to_json(),
            "no_straggler": None if self.no_straggler is None else self.no_straggler.to_json(),
            "straggler": None if self.straggler is None else self.straggler.to_json(),
            "reasons": {case: n.to_json() for case, n in self.reasons.items()},
        }


@dataclass(kw_only=True)
class HopStats:
    """Traffic from one rank to another, from send/recv spans."""

    src_rank: int
    dst_rank: int
    messages: int
    nbytes: int | None
    """Bytes of the hop's messages whose size the trace records; None when none does (unknown, not 0)."""
    send_ns: int
    """Total time blocked in send on src."""
    recv_ns: int | None
    """Total transfer time (kind `recv`) on dst; None when the hop has no `recv` span (the transfer was not
    timed apart from the wait: a payload inside its header, as on gloo)."""
    wait_ns: int
    """Total time waiting (kind `recv_wait`) on dst for this hop."""
    bandwidth_gb_per_s: float | None
    """nbytes / timed transfer time (`recv`), in GB/s (1e9 bytes/s); None when the transfer was not timed."""
    latency_ns: int | None = None
    """Median time from the sender posting a message to the receiver, already waiting, waking up with it (see
    `pipeline.message_latencies`); None when no message could be paired."""
    unmeasured: dict[str, str] = field(default_factory=dict)
    """Field name -> why it is None (not measured, which is not 0)."""


@dataclass(kw_only=True)
class LatencyStats:
    """Summary of one latency measure over requests, in ms."""

    n: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float


@dataclass(kw_only=True)
class RequestLatency:
    """Per-request latency from requests.jsonl."""

    requests: int
    """The run's requests: those logged, or as many as the engine was given when it logged fewer (stopped)."""
    finished: int
    output_tokens: int
    ttft: LatencyStats | None
    tpot: LatencyStats | None
    e2e: LatencyStats | None
    tokens_per_s: float | None
    """Output tokens of finished requests / (last finish - first arrival)."""
    table: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    """One row per request: id, ttft_ns, tpot_ns, e2e_ns (-1 when unknown)."""


@dataclass(kw_only=True)
class AnalysisResult:
    """Everything `ppscope analyze` reports about one trace."""

    source: str
    emulated: str = ""
    """How the engine emulated GPU stages (`emulated llama3-8b on h100-sxm (roofline), ×15 slower`); "" when its
    times are the compute's own."""
    schedule: str
    window: WindowInfo | None
    stages: list[StageResult]
    bubble_ratio: float | None
    """Σ bubble / (P × window): share of the P stages' wall time spent idle."""
    imbalance: float | None
    """1 - mean(t_s) / max(t_s) over stages."""
    imbalance_basis: str
    """`time_per_mb` or `busy` (when spans carry no micro-batch ids)."""
    bottleneck_stage: int | None
    balance_speedup: float | None
    """max(t_s) / mean(t_s): the throughput factor perfect balance would give."""
    theory: Theory
    theory_gap: TheoryGap | None = None
    """The gap to the formula in parts; None without a formula or with stages missing."""
    throughput_tokens_per_s: float | None
    throughput_basis: str
    latency: RequestLatency | None
    hops: list[HopStats]
    inflight: int | None
    """Micro-batches in flight during decode (config max_inflight, or measured)."""
    warnings: list[Notice] = field(default_factory=list)
    gaps: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    """Idle intervals: stage, start_ns, end_ns, cause (adjacent same-cause pieces merged)."""
    engine: str | None = None
    """The pipeline engine recognised in the trace (`torch.pipelining`, `DeepSpeed`, `unknown` for a pipeline
    whose engine could not be told); None where the source says none (ppscope's runs, imports without
    pipelining actions)."""
    missing: Notice | None = None
    """What the trace lacks to describe the whole pipeline (`missing_ranks`: ranks without spans, or
    `missing_stages`: stages without spans), and so why the bubble ratio, imbalance, bottleneck, balance speedup
    and gap to theory are not given; None if nothing."""
    unknown_stages: list[int] = field(default_factory=list)
    """Stages of the run that recorded nothing: counted in P, their figures unknown (not in `stages`)."""
    replay: TrainingReplay | None = None
    """A training run's replay, when the caller made one (`ppscope analyze` does for training runs)."""
    what_if: WhatIf | None = None
    """The job's what-ifs (every replica's, where this result is one replica's), when the caller made them."""
    what_if_reason: Notice | None = None
    """Why `what_if` is None where the caller tried (an inference trace, no complete step)."""

    @property
    def pp_size(self) -> int:
        """P: the stages analysed and those of the run that recorded nothing."""
        return len(self.stages) + len(self.unknown_stages)

    def stage(self, stage: int) -> StageResult:
        for s in self.stages:
            if s.stage == stage:
                return s
        raise KeyError(f"no stage {stage}; stages: {[s.stage for s in self.stages]}")

    def to_json(self) -> dict[str, Any]:
        """The stable JSON object of `ppscope analyze --json` (documented in the README)."""
        w = self.window
        return {
            "source": self.source,
            "emulated": self.emulated or None,
            "schedule": self.schedule,
            "engine": self.engine,
            "pp_size": self.pp_size,
            "window_ns": w.length_ns if w else 0,
            "window": {"start_ns": w.start_ns, "end_ns": w.end_ns, "mode": w.mode, "how": w.how} if w else None,
            "bubble_ratio": self.bubble_ratio,
            "bubble_ratio_denominator": "sum(bubble_ns) / (pp_size * window_ns)",
            "imbalance": self.imbalance,
            "imbalance_basis": self.imbalance_basis,
            "bottleneck_stage": self.bottleneck_stage,
            "balance_speedup": self.balance_speedup,
            "theory": {
                "formula": self.theory.formula,
                "bubble_ratio": self.theory.bubble_ratio,
                "params": dict(self.theory.params),
                "note": self.theory.note,
                "causes": list(self.theory.causes),
            },
            "theory_gap": None
            if self.theory_gap is None
            else {"ratio": self.theory_gap.ratio, "parts": dict(self.theory_gap.parts)},
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "throughput_basis": self.throughput_basis,
            "inflight": self.inflight,
            "stages": self._stages_json(),
            "hops": [{**vars(h), "unmeasured": dict(h.unmeasured)} for h in self.hops],
            "latency": _latency_json(self.latency),
            "missing": None if self.missing is None else self.missing.to_json(),
            "replay": None if self.replay is None else self.replay.to_json(),
            "what_if": None if self.what_if is None else self.what_if.to_json(),
            "what_if_reason": None if self.what_if_reason is None else self.what_if_reason.to_json(),
            "warnings": [w.to_json() for w in self.warnings],
        }

    def _stages_json(self) -> list[dict[str, Any]]:
        """Every stage of P in order: an unknown one with its figures null, not left out."""
        known = {
            s.stage: {
                "stage": s.stage,
                "ranks": list(s.ranks),
                "busy_ns": s.busy_ns,
                "bubble_ns": s.bubble_ns,
                "bubble_ratio": s.bubble_ratio,
                "units": s.units,
                "time_per_mb_ns": json_ns(s.time_per_mb_ns),
                "causes": dict(s.causes),
            }
            for s in self.stages
        }
        unknown = dict.fromkeys(("ranks", "busy_ns", "bubble_ns", "bubble_ratio", "units", "time_per_mb_ns", "causes"))
        known.update({stage: {"stage": stage, **unknown} for stage in self.unknown_stages})
        return [known[stage] for stage in sorted(known)]


def json_ns(ns: float | None) -> int | None:
    """A time in ns as `--json` gives it: whole ns (docs/GLOSSARY.md), where medians and busy ÷ passes are
    floats."""
    return None if ns is None else round(ns)


def _latency_json(lat: RequestLatency | None) -> dict[str, Any] | None:
    if lat is None:
        return None

    def stats(s: LatencyStats | None) -> dict[str, Any] | None:
        return None if s is None else vars(s).copy()

    return {
        "requests": lat.requests,
        "finished": lat.finished,
        "output_tokens": lat.output_tokens,
        "throughput_tokens_per_s": lat.tokens_per_s,
        "ttft_ms": stats(lat.ttft),
        "tpot_ms": stats(lat.tpot),
        "e2e_ms": stats(lat.e2e),
    }
