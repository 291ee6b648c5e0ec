"""Stages that share processor cores: the bound their total work puts on a split's gain.

The slowest-stage prediction assumes every stage runs on a processor of its own, as on GPUs. CPU ranks share
the machine's cores with each other and with whatever else runs there; with P passes in flight every stage
does one pass per beat, so a beat needs the sum of the stages' times in CPU time, and with C cores for them it
lasts at least that sum ÷ C, whatever the split. With N cores and B cores' worth of other work, the P stages
have C = N − B when there are cores enough for all (P + B ≤ N), else their fair share of the machine,
N × P ÷ (P + B), as the scheduler gives every busy thread an equal part. A pipeline with fewer cores than busy
stages is bound by its total work, which moving layers does not change (docs/ARCHITECTURE.md, "Notes behind design
choices"). Two things the stage times miss are measured in the run itself (`RunUsage`): the CPU the ranks
spend outside their spans (Python between passes, their threads), taken from their usage counters, and the
work beside the stages while they run (the launcher, the kernel, other jobs), the machine's busy cores
meanwhile less the ranks' own. This module only computes; the machine's load is measured by its caller
(`ppscope.engine.tuning`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ppscope.balance.advise.advice import Interval
from ppscope.trace.model import Metric, SpanKind, Trace

__all__ = ["MIN_FREE_CORES", "RunUsage", "SharedCores", "beat_ms", "pipeline_cores", "run_usage", "shared_cores"]

MIN_FREE_CORES = 0.25
"""The least share of the machine counted as free for the pipeline: a machine measured fully busy still runs it."""


def pipeline_cores(cores: int, busy_beside: float, stages: int) -> float:
    """The cores `stages` busy CPU stages get on a machine of `cores` cores with `busy_beside` cores' worth of
    other work: what is left when there is enough for all, else their fair share (at least MIN_FREE_CORES)."""
    other = max(busy_beside, 0.0)
    if stages + other <= cores:
        return cores - other
    return max(cores * stages / (stages + other), MIN_FREE_CORES)


def beat_ms(
    stage_ms: Sequence[float], free_cores: float, extra_ms: float = 0.0, *, loop_ms: float = 0.0, inflight: int = 0
) -> float:
    """How long one beat of the pipeline (one pass on every stage) takes at least: its slowest stage; all its
    stages' work (and `extra_ms` of CPU a beat outside them) spread over the free cores; and, with `inflight`
    micro-batches going round (a serve loop), a micro-batch's round trip, every stage, that work and `loop_ms`
    of hops, shared by the micro-batches in flight: whichever is longest."""
    return max(max(stage_ms), _floor_ms(stage_ms, free_cores, extra_ms, loop_ms, inflight))


def _floor_ms(stage_ms: Sequence[float], free_cores: float, extra_ms: float, loop_ms: float, inflight: int) -> float:
    """The part of `beat_ms` that no split changes: the total work over the free cores, and the round trip
    shared by the micro-batches in flight."""
    work = sum(stage_ms) + extra_ms
    floor = work / max(free_cores, MIN_FREE_CORES)
    return max(floor, (work + loop_ms) / inflight) if inflight > 0 else floor


@dataclass(frozen=True, kw_only=True)
class RunUsage:
    """The CPU a run's ranks used over its steady part, and the machine meanwhile (cores' worth)."""

    ranks: dict[int, float] = field(default_factory=dict)
    """Each stage's rank: its process's cores' worth (its `cpu_util_pct` counters ÷ 100)."""
    machine: float | None = None
    """The whole machine's busy cores over the same window (None: not measured)."""

    @property
    def beside(self) -> float:
        """Work beside the stages while they ran: the machine's busy cores less the ranks' own."""
        return max(self.machine - sum(self.ranks.values()), 0.0) if self.machine is not None else 0.0

    def extra_ms(self, stage_ms: Sequence[float]) -> float:
        """CPU a beat takes beyond the modelled stage times. A rank busy `u` cores over a beat of B ms spends
        u·B of it, at least its modelled time m, so the ranks together spend at least Σu ÷ u · m a beat: read
        off the slowest stage (the largest m, the smallest relative error), less the stages' modelled sum."""
        slowest = max(range(len(stage_ms)), key=lambda s: stage_ms[s])
        mine = self.ranks.get(slowest, 0.0)
        if mine <= 0 or len(self.ranks) != len(stage_ms):
            return 0.0
        return max(sum(self.ranks.values()) / mine * stage_ms[slowest] - sum(stage_ms), 0.0)


def run_usage(trace: Trace, machine: Callable[[int, int], float | None] | None = None, trim: float = 0.1) -> RunUsage:
    """The ranks' CPU over the run's steady part (its forward spans' extent less `trim` of it at each end, past
    start-up and the last requests' tail) from their usage counters, and `machine(start_ns, end_ns)`, the
    machine's busy cores over that window on the same clock, where given. Empty when the run has no counters."""
    spans = trace.spans
    forward = spans[spans["kind"] == SpanKind.FORWARD]
    counters = trace.counters
    cpu = counters[counters["metric"] == str(Metric.CPU_UTIL_PCT)] if len(counters) else counters
    if forward.empty or cpu.empty:
        return RunUsage()
    first, last = int(forward["start_ns"].min()), int(forward["end_ns"].max())
    start, end = first + int((last - first) * trim), last - int((last - first) * trim)
    steady = cpu[(cpu["ts_ns"] >= start) & (cpu["ts_ns"] <= end)]
    stage_of = {info.rank: info.stage for info in trace.meta.ranks}
    ranks = {stage_of.get(int(r), int(r)): float(v.mean()) / 100 for r, v in steady.groupby("rank")["value"]}
    return RunUsage(ranks=ranks, machine=machine(start, end) if machine is not None else None)


@dataclass(frozen=True, kw_only=True)
class SharedCores:
    """The cores a CPU pipeline had and what that leaves of the slowest-stage prediction."""

    cores: int
    """The machine's cores."""
    busy_beside: float
    """Cores' worth of other work measured beside the run."""
    free: float
    """Cores the pipeline's stages get (`pipeline_cores`)."""
    slowest_stage_speedup: float
    """The prediction of a processor per stage."""
    extra_ms: float = 0.0
    """CPU a beat takes outside the modelled stage times (`RunUsage.extra_ms`)."""
    loop_ms: float = 0.0
    """A micro-batch's hops round the loop (0: not a serve loop)."""
    inflight: int = 0
    """Micro-batches going round the loop (0: not a serve loop)."""
    speedup: float
    """Beat now ÷ beat with the advised split, with the stages sharing the free cores."""
    interval: Interval | None
    """The slowest-stage interval carried through the same bound (None without one)."""

    def to_json(self) -> dict[str, object]:
        """`cores` of `ppscope tune --json` (docs/GLOSSARY.md): counts of cores named as counts of cores, the
        interval a [low, high] list as every other interval."""
        iv = self.interval
        return {
            "cores": self.cores,
            "busy_cores_beside": self.busy_beside,
            "free_cores": self.free,
            "slowest_stage_speedup": self.slowest_stage_speedup,
            "extra_ms": self.extra_ms,
            "loop_ms": self.loop_ms,
            "inflight": self.inflight,
            "speedup": self.speedup,
            "interval": None if iv is None else [iv.low, iv.high],
            "interval_how": None if iv is None else f"{iv.level:.0%} interval, {iv.how}",
        }

    @property
    def binds(self) -> bool:
        """The shared cores take something off the slowest-stage prediction."""
        return self.speedup < self.slowest_stage_speedup - 1e-9

    def text(self) -> str:
        """One sentence in the user's terms: what other work took, what the stages had, what that leaves."""
        why = (
            f"Other programs used {self.busy_beside:.1f} of this machine's {self.cores} cores during run 1, so the "
            f"stages shared {self.free:.1f} cores"
        )
        if self.extra_ms > 0.005:
            why += f" and spent {self.extra_ms:.2f} ms per step outside the timed work"
        if self.inflight:
            why += f"; each token also waits {self.loop_ms:.2f} ms for the hops between stages"
        return (
            f"{why}: here the advised split can gain at most ×{self.speedup:.3f}; with a core (or GPU) per stage it "
            f"would gain ×{self.slowest_stage_speedup:.3f}."
        )


def shared_cores(
    current_ms: Sequence[float],
    proposed_ms: Sequence[float],
    *,
    cores: int,
    busy_beside: float,
    interval: Interval | None = None,
    extra_ms: float = 0.0,
    loop_ms: float = 0.0,
    inflight: int = 0,
) -> SharedCores:
    """The speedup of `proposed_ms` over `current_ms` (stage times per pass) when the stages share `cores` cores
    with `busy_beside` cores' worth of other work; `interval` (of the slowest-stage speedup) is carried through
    the same bound: the advised split's slowest stage at each end, the rest as measured. Both splits have as
    many stages (`len(current_ms)`); `extra_ms`: CPU a beat outside the stage times, the same for both;
    `loop_ms`, `inflight`: a serve loop's hops and micro-batches in flight (`beat_ms`)."""
    free = pipeline_cores(cores, busy_beside, len(current_ms))
    now = beat_ms(current_ms, free, extra_ms, loop_ms=loop_ms, inflight=inflight)
    slowest = max(current_ms) / max(proposed_ms)
    total = _floor_ms(proposed_ms, free, extra_ms, loop_ms, inflight)  # a floor under the advised beat too

    def bounded(speedup: float) -> float:  # the advised split's slowest stage as the speedup puts it
        return now / max(max(current_ms) / speedup, total)

    carried = None
    if interval is not None:
        carried = Interval(
            low=bounded(interval.low),
            high=bounded(interval.high),
            level=interval.level,
            how=f"{interval.how}, through the bound of {free:.1f} free core(s)",
        )
    return SharedCores(
        cores=cores,
        busy_beside=busy_beside,
        free=free,
        slowest_stage_speedup=slowest,
        speedup=bounded(slowest),
        interval=carried,
        extra_ms=extra_ms,
        loop_ms=loop_ms,
        inflight=inflight,
    )
