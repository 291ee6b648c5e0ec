"""Stages that share processor cores: the bound their total work puts on a split's gain.

The slowest-stage prediction assumes every stage runs on a processor of its own, as on GPUs. CPU ranks share
the machine's cores with each other and with whatever else runs there; with P passes in flight every stage
does one pass per beat, so a beat needs the sum of the stages' times in CPU time, and with C cores for them it
lasts at least that sum ÷ C, whatever the split. With N cores and B cores' worth of other work, the P stages
have C = N − B when there are cores enough for all (P + B ≤ N), else their fair share of the machine,
N × P ÷ (P + B), as the scheduler gives every busy thread an equal part. A pipeline with fewer cores than busy
stages is bound by its total work, which moving layers does not change (docs/ARCHITECTURE.md, "Notes behind design
choices"). This module only computes; the cores busy beside a run are measured by its caller
(`ppscope.cli.tuning`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppscope.balance.advice import Interval

__all__ = ["MIN_FREE_CORES", "SharedCores", "beat_ms", "pipeline_cores", "shared_cores"]

MIN_FREE_CORES = 0.25
"""The least share of the machine counted as free for the pipeline: a machine measured fully busy still runs it."""


def pipeline_cores(cores: int, busy_beside: float, stages: int) -> float:
    """The cores `stages` busy CPU stages get on a machine of `cores` cores with `busy_beside` cores' worth of
    other work: what is left when there is enough for all, else their fair share (at least MIN_FREE_CORES)."""
    other = max(busy_beside, 0.0)
    if stages + other <= cores:
        return cores - other
    return max(cores * stages / (stages + other), MIN_FREE_CORES)


def beat_ms(stage_ms: Sequence[float], free_cores: float) -> float:
    """How long one beat of the pipeline (one pass on every stage) takes at least: its slowest stage, or all
    its stages' work spread over the free cores, whichever is longer."""
    return max(max(stage_ms), sum(stage_ms) / max(free_cores, MIN_FREE_CORES))


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
    speedup: float
    """Beat now ÷ beat with the advised split, with the stages sharing the free cores."""
    interval: Interval | None
    """The slowest-stage interval carried through the same bound (None without one)."""

    @property
    def binds(self) -> bool:
        """The shared cores take something off the slowest-stage prediction."""
        return self.speedup < self.slowest_stage_speedup - 1e-9

    def text(self) -> str:
        return (
            f"{self.cores} core(s) with {self.busy_beside:.1f} busy beside the run: {self.free:.2f} for the "
            f"stages, whose total work then bounds the gain (×{self.speedup:.3f} instead of the slowest stage's "
            f"×{self.slowest_stage_speedup:.3f})"
        )


def shared_cores(
    current_ms: Sequence[float],
    proposed_ms: Sequence[float],
    *,
    cores: int,
    busy_beside: float,
    interval: Interval | None = None,
) -> SharedCores:
    """The speedup of `proposed_ms` over `current_ms` (stage times per pass) when the stages share `cores` cores
    with `busy_beside` cores' worth of other work; `interval` (of the slowest-stage speedup) is carried through
    the same bound: the advised split's slowest stage at each end, the rest as measured. Both splits have as
    many stages (`len(current_ms)`)."""
    free = pipeline_cores(cores, busy_beside, len(current_ms))
    now = beat_ms(current_ms, free)
    slowest = max(current_ms) / max(proposed_ms)
    total = sum(proposed_ms) / free

    def bounded(speedup: float) -> float:  # the advised split's slowest stage as the speedup puts it
        return now / max(max(current_ms) / speedup, total)

    carried = None
    if interval is not None:
        carried = Interval(
            low=bounded(interval.low), high=bounded(interval.high), level=interval.level,
            how=f"{interval.how}, through the bound of {free:.1f} free core(s)",
        )  # fmt: skip
    return SharedCores(
        cores=cores, busy_beside=busy_beside, free=free, slowest_stage_speedup=slowest, speedup=bounded(slowest),
        interval=carried,
    )  # fmt: skip
