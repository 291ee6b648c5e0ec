"""The closed tuning loop: run, measure costs, rebalance, re-run with the advised split, compare.

`tune` is the promise of ppscope checked by measurement: the rebalancer's split is provably the best for
the costs it was given, and the second run says how much of the predicted gain was real. Costs come from the
layers timed inside the first run (its `layer` spans, default), from an isolated per-layer profile on the
device, or are fitted from the first run's stage spans. The engine is
imported only when the loop runs, so this module stays importable without torch.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ppscope.analysis import AnalysisResult, analyze
from ppscope.balance.advise.advice import Advice, Interval, advise, paired_throughput_ratio, speedup_interval
from ppscope.balance.advise.cores import SharedCores, run_usage, shared_cores
from ppscope.balance.advise.problem import BalanceProblem
from ppscope.balance.advise.rebalance import Rebalance, engine_lines, rebalance
from ppscope.balance.costs import LayerCosts
from ppscope.balance.measured.fit import fit_layer_costs, r_squared_text
from ppscope.balance.measured.insitu import insitu_costs
from ppscope.engine.machine_load import LoadSampler, busy_cores
from ppscope.errors import ErrorCode, InvalidConfigError, PPScopeError
from ppscope.simulate.calibrate import Replay, hop_latency_us
from ppscope.trace.model import Phase, Trace
from ppscope.trace.notices import Notice, NoticeCode
from ppscope.trace.schedules import Schedule
from ppscope.trace.store import load_run

if TYPE_CHECKING:
    from ppscope.engine.config import EngineConfig

__all__ = ["COST_SOURCES", "RunSummary", "Simulated", "TuneResult", "tune"]

COST_SOURCES = ("insitu", "profile", "fit")
"""insitu: run 1's `layer` spans (the default); profile: each layer timed alone on the device; fit: run 1's stage
spans."""


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """What one run of the loop measured."""

    run_dir: Path
    split: tuple[int, ...]
    throughput_tokens_per_s: float | None
    bubble_ratio: float | None
    bottleneck_stage: int | None
    stage_busy_ms_per_mb: tuple[float, ...]
    """Per-stage busy time per micro-batch pass (the analyzer's time_per_mb), ms: per pass, not a total."""

    @classmethod
    def of(cls, run_dir: Path, result: AnalysisResult, split: tuple[int, ...]) -> RunSummary:
        return cls(
            run_dir=run_dir,
            split=split,
            throughput_tokens_per_s=result.throughput_tokens_per_s,
            bubble_ratio=result.bubble_ratio,
            bottleneck_stage=result.bottleneck_stage,
            stage_busy_ms_per_mb=tuple((s.time_per_mb_ns or 0) / 1e6 for s in result.stages),
        )


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    before: RunSummary
    after: RunSummary | None
    """None when the split was already the best one: nothing to re-run."""
    advice: Rebalance
    costs: LayerCosts
    cost_source: str
    """`insitu` (run 1's layers timed inside it), `profile` (timed layer by layer on the device, alone) or
    `fit` (from run 1's stage spans)."""
    notes: list[str] = field(default_factory=list)
    reruns: tuple[RunSummary, ...] = ()
    """Further runs of the two splits (`repeats` > 1), pair by pair in ABBA order after runs 1 and 2."""
    simulated: Simulated | None = None
    """The two splits through the simulator, calibrated on run 1 (None when it could not be)."""
    predicted_interval: Interval | None = None
    """95% interval of the predicted speedup from run 1's own variability (None: too short a run)."""
    measured_pairs: tuple[float, ...] = ()
    """Throughput of the advised split ÷ the given one, pair by pair, over the runs' sampled tokens (empty: runs
    too short to tell, and `pair_speedups` falls back to the analyzer's throughputs)."""
    measured_interval: Interval | None = None
    """95% interval of the median of `measured_pairs` (`paired_throughput_ratio`)."""
    """95% interval of the measured speedup from the runs' own variability (None: too short runs)."""
    decision: Advice | None = None
    """Keep the given split or change it, and why (`ppscope.balance.advise.advice.advise`)."""
    cores: SharedCores | None = None
    """CPU ranks: the cores they shared with other work, and the bound that puts on the gain (None on GPUs, for
    the synthetic model, whose layers sleep, or where the machine's busy cores cannot be read)."""

    @property
    def predicted_speedup(self) -> float:
        """The slowest stage's ratio, or, where CPU stages share too few free cores, the bound of their total
        work (`cores`)."""
        if self.cores is not None and self.cores.binds:
            return self.cores.speedup
        return self.advice.predicted_speedup

    @property
    def pair_speedups(self) -> list[float]:
        """Throughput of the advised split ÷ the given one, pair by pair (runs 1-2, 3-4, ...)."""
        if self.after is None:
            return []
        if self.measured_pairs:
            return list(self.measured_pairs)
        runs = [self.before, self.after, *self.reruns]
        ratios = []
        for a, b in zip(runs[::2], runs[1::2], strict=False):
            before, after = (a, b) if a.split == self.before.split else (b, a)
            if before.throughput_tokens_per_s and after.throughput_tokens_per_s:
                ratios.append(after.throughput_tokens_per_s / before.throughput_tokens_per_s)
        return ratios

    @property
    def measured_speedup(self) -> float | None:
        """The median pair's ratio: each pair ran close in time, so it shares the machine's mood."""
        if self.after is None:
            return 1.0
        ratios = self.pair_speedups
        return statistics.median(ratios) if ratios else None

    @property
    def realised(self) -> float | None:
        """Share of the predicted gain that the measurement shows: (measured − 1) / (predicted − 1)."""
        return _share(self.measured_speedup, self.predicted_speedup)

    @property
    def realised_simulated(self) -> float | None:
        """The same against the simulated gain."""
        return _share(self.measured_speedup, self.simulated.speedup) if self.simulated else None

    def to_dict(self) -> dict[str, Any]:
        def run(s: RunSummary | None) -> dict[str, Any] | None:
            return None if s is None else {**dataclasses.asdict(s), "run_dir": str(s.run_dir)}

        return {
            "before": run(self.before),
            "after": run(self.after),
            "cost_source": self.cost_source,
            "layer_costs_ms": list(self.costs.layer_ms),
            "embed_cost_ms": self.costs.embed_ms,
            "head_cost_ms": self.costs.head_ms,
            "sample_cost_ms": self.costs.sample_ms,
            "reruns": [run(r) for r in self.reruns],
            "predicted_speedup": self.predicted_speedup,
            "slowest_stage_speedup": self.advice.predicted_speedup,
            "cores": dataclasses.asdict(self.cores) if self.cores else None,
            "measured_speedup": self.measured_speedup,
            "pair_speedups": self.pair_speedups,
            "realised_share_of_predicted_gain": self.realised,
            "simulated": dataclasses.asdict(self.simulated) if self.simulated else None,
            "realised_share_of_simulated_gain": self.realised_simulated,
            "predicted_interval": _pair(self.predicted_interval),
            "measured_interval": _pair(self.measured_interval),
            "advice": self.decision.word if self.decision else None,
            "advice_reason": self.decision.reason if self.decision else None,
            "rebalance": self.advice.to_dict(),
            "lines": engine_lines(self.advice.proposed.split, sum(self.advice.current.split)),
            "notes": self.notes,
        }


@dataclass(frozen=True, kw_only=True)
class Simulated:
    """Both splits through the simulator with run 1's schedule, sizes, hop latency and host gaps: unlike the
    slowest-stage ratio, this sees the hops a micro-batch waits for once the stages are balanced."""

    speedup: float
    """Simulated time of the given split ÷ that of the advised one."""
    hop_latency_us: float
    overhead_ms: float


def _bound_interval(
    trace: Trace,
    problem: BalanceProblem,
    split: tuple[int, ...],
    proposed: tuple[int, ...],
    cores: SharedCores,
    sharing: Callable[..., SharedCores],
) -> Interval | None:
    """The interval of the bounded speedup: the bound taken in every resample of run 1's stage times, so a floor
    made of them (their sum, the loop's round trip) varies as they do, rather than the slowest-stage interval
    carried through one bound, which collapses to a point where the floor binds at both ends. It holds the
    point prediction (`cores.speedup`) as `paired_throughput_ratio`'s interval holds its median."""
    found = speedup_interval([trace], problem, split, proposed, bound=lambda now, new: sharing(now, new).speedup)
    if found is None:
        return cores.interval
    return dataclasses.replace(
        found,
        low=min(found.low, cores.speedup),
        high=max(found.high, cores.speedup),
        how=f"{found.how}, the shared-cores bound in each",
    )


def _pair(interval: Interval | None) -> list[float] | None:
    return None if interval is None else [interval.low, interval.high]


def _share(measured: float | None, predicted: float) -> float | None:
    """(measured − 1) ÷ (predicted − 1); None without a measurement or a predicted gain (under 1e-6: a bound
    that leaves none, up to rounding)."""
    if measured is None or predicted - 1.0 < 1e-6:
        return None
    return (measured - 1.0) / (predicted - 1.0)


def _simulate_both(trace: Trace, costs: LayerCosts, given: tuple[int, ...], advised: tuple[int, ...]) -> Simulated:
    """Simulate both splits calibrated on run 1: its pipeline and host gaps (`Replay`), the costs the advice
    was made with, and the hop latency of its messages (`hop_latency_us`) plus any payload transfer."""
    replay = Replay.of(trace, costs=costs)
    before, after = replay.predict(given), replay.predict(advised)
    cfg = replay.config
    return Simulated(
        speedup=before.predicted_ms / after.predicted_ms,
        hop_latency_us=cfg.comm.latency_us,
        overhead_ms=cfg.overhead_ms,
    )


Step = Callable[[str], None]


def _costs(cfg: EngineConfig, run_dir: Path, source: str, phase: str, step: Step) -> tuple[LayerCosts, list[str]]:
    if source == "insitu":
        got = insitu_costs([load_run(run_dir)], phase=phase)
        return got.costs, [
            f"costs: timed layer by layer inside run 1 ({got.phase} passes, the median of {min(got.passes)}-"
            f"{max(got.passes)} sampled passes per layer, one pass in {cfg.output.layer_spans} of each stage)"
        ]
    if source == "profile":
        from ppscope.engine.profiler import profile_layers, write_profile

        step(f"profiling every layer, the embedding and the head on the device ({phase} pass)")
        profile = profile_layers(cfg)
        write_profile(profile, run_dir)
        return profile.phase(phase).costs(), [f"costs: {phase} pass timed layer by layer ({profile.how})"]
    fit = fit_layer_costs([load_run(run_dir)], phase=phase)
    note = f"costs: fitted from the run's {fit.phase} spans, {r_squared_text(fit.r_squared)}"
    return fit.costs, [note, *fit.notes]


def _with(cfg: EngineConfig, out: Path, split: tuple[int, ...] | None = None) -> EngineConfig:
    """`cfg` writing to `out`, with `split` if given."""
    pipeline = cfg.pipeline if split is None else dataclasses.replace(cfg.pipeline, split=split)
    return dataclasses.replace(cfg, pipeline=pipeline, output=dataclasses.replace(cfg.output, out=out))


def tune(
    cfg: EngineConfig,
    *,
    out_dir: str | Path,
    cost_source: str = "insitu",
    phase: str = Phase.DECODE,
    on_step: Step | None = None,
    repeats: int = 1,
) -> TuneResult:
    """Run `cfg` as given, rebalance on measured costs, run again with the advised split, compare. With
    `repeats` > 1, each split runs that many times, pair by pair in ABBA order (given, advised; advised,
    given; ...), so that a machine getting slower or faster favours neither split."""
    from ppscope.engine.launch import run

    if cost_source not in COST_SOURCES:
        raise InvalidConfigError(
            ErrorCode.UNKNOWN_CHOICE, f"unknown cost source {cost_source!r}; valid: {', '.join(COST_SOURCES)}"
        )
    if repeats < 1:
        raise InvalidConfigError(ErrorCode.BAD_VALUE, f"--repeats must be at least 1, not {repeats}")
    if cost_source == "insitu" and not (cfg.output.record and cfg.output.layer_spans):
        raise InvalidConfigError(
            ErrorCode.CONFLICTING_OPTIONS,
            "--costs insitu needs run 1's layer spans: record (drop --no-record) with --layer-spans K > 0, or give "
            "--costs profile",
        )
    pipe = cfg.pipeline
    if pipe.chunks != 1:
        raise InvalidConfigError(
            ErrorCode.UNSUPPORTED_SCHEDULE,
            "tune balances one chunk per rank: use --schedule gpipe or serve, not interleaved",
        )
    step = on_step or (lambda _msg: None)
    out = Path(out_dir)
    step(f"run 1: {cfg.model.name} on {pipe.stages} stages, {pipe.schedule} schedule, split as given")
    beside = [busy_cores()]
    with LoadSampler() as load:
        before_dir = run(_with(cfg, out / "1-before"))
    beside.append(busy_cores())
    before_trace = load_run(before_dir)
    split = tuple(before_trace.meta.split)
    before = RunSummary.of(before_dir, analyze(before_trace), split)
    costs, notes = _costs(cfg, before_dir, cost_source, phase, step)
    problem = BalanceProblem(costs=costs, stages=pipe.stages)
    advice = rebalance(problem, current=split)
    proposed = tuple(advice.proposed.split)
    interval = speedup_interval([before_trace], problem, split, proposed) if proposed != split else None
    cores = None
    known = [b for b in beside if b is not None]
    on_cpus = all(r.device.startswith("cpu") for r in before_trace.meta.ranks)
    if known and on_cpus and not cfg.model.synthetic and proposed != split:  # synthetic layers sleep: no CPU
        usage = run_usage(before_trace, load.busy_between)  # what the stage times miss, measured in run 1
        serve = before_trace.meta.schedule == Schedule.SERVE and pipe.stages > 1  # micro-batches go round a loop
        hop_us = (hop_latency_us(before_trace.spans) or 0.0) if serve else 0.0
        sharing = functools.partial(
            shared_cores,
            cores=os.cpu_count() or 1,
            busy_beside=max(statistics.mean(known), usage.beside),
            extra_ms=usage.extra_ms(advice.current.stage_ms),
            loop_ms=pipe.stages * hop_us / 1e3,
            inflight=max(before_trace.meta.microbatches, 1) if serve else 0,
        )
        cores = sharing(advice.current.stage_ms, advice.proposed.stage_ms, interval=interval)
        if cores.binds:
            notes.append(f"the stages share {cores.text()}")
            interval = _bound_interval(before_trace, problem, split, proposed, cores, sharing)
    predicted = cores.speedup if cores is not None and cores.binds else advice.predicted_speedup
    decision = advise(split, proposed, predicted, interval, _RUN_1_TOO_SHORT)
    if cores is not None and cores.binds:
        decision = dataclasses.replace(decision, reason=f"{decision.reason}; the stages share {cores.text()}")
    if proposed == split:
        notes.append("the split is already the best one for these costs: no second run")
        return TuneResult(
            before=before,
            after=None,
            advice=advice,
            costs=costs,
            cost_source=cost_source,
            notes=notes,
            decision=decision,
            cores=cores,
        )
    try:
        simulated: Simulated | None = _simulate_both(before_trace, costs, split, proposed)
    except PPScopeError as exc:  # a run the simulator cannot replay: the slowest-stage prediction remains
        simulated = None
        notes.append(f"no simulated prediction: {exc}")
    sim = f", simulated ×{simulated.speedup:.3f}" if simulated else ""
    step(f"run 2: advised split {','.join(map(str, proposed))} (predicted ×{predicted:.3f}{sim})")

    traces: dict[tuple[int, ...], list[Trace]] = {split: [before_trace], proposed: []}

    def run_split(n: int, split_now: tuple[int, ...]) -> RunSummary:
        name = "before" if split_now == split else "after"
        run_dir = run(_with(cfg, out / f"{n}-{name}", split_now))
        trace = load_run(run_dir)
        traces[split_now].append(trace)
        return RunSummary.of(run_dir, analyze(trace), split_now)

    after = run_split(2, proposed)
    reruns = []
    for pair in range(1, repeats):
        order = (proposed, split) if pair % 2 else (split, proposed)
        names = " then ".join(",".join(map(str, s)) for s in order)
        step(f"runs {2 * pair + 1} and {2 * pair + 2} of {2 * repeats}: {names}")
        reruns += [run_split(2 * pair + 1 + i, s) for i, s in enumerate(order)]
    pairs, measured = paired_throughput_ratio(list(zip(traces[split], traces[proposed], strict=True)))
    return TuneResult(
        before=before,
        after=after,
        advice=advice,
        costs=costs,
        cost_source=cost_source,
        notes=notes,
        reruns=tuple(reruns),
        simulated=simulated,
        predicted_interval=interval,
        measured_pairs=pairs,
        measured_interval=measured,
        decision=decision,
        cores=cores,
    )


_RUN_1_TOO_SHORT = Notice(NoticeCode.TOO_SHORT, "run 1 is too short to tell how it varies")
