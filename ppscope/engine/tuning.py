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
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ppscope.analysis import AnalysisResult, analyze
from ppscope.analysis.result import json_ns
from ppscope.balance.advise.advice import (
    Advice,
    Interval,
    Part,
    Simulated,
    advise,
    paired_throughput_ratio,
    speedup_interval,
)
from ppscope.balance.advise.cores import SharedCores, run_usage, shared_cores
from ppscope.balance.advise.problem import BalanceProblem
from ppscope.balance.advise.rebalance import SERVING_LINES, JobKind, Rebalance, rebalance
from ppscope.balance.costs import LayerCosts, StageCosts
from ppscope.balance.measured.fit import fit_layer_costs, r_squared_text
from ppscope.balance.measured.insitu import insitu_costs
from ppscope.engine.machine_load import LoadSampler, busy_cores
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.simulate.advice import replay_both, replay_interval
from ppscope.simulate.calibrate import hop_latency_us
from ppscope.trace.model import Phase, SpanKind, Trace
from ppscope.trace.notices import Notice, NoticeCode
from ppscope.trace.schedules import Schedule
from ppscope.trace.store import load_run

if TYPE_CHECKING:
    from ppscope.engine.config import EngineConfig

__all__ = ["COST_SOURCES", "MIN_PAIRS", "RunSummary", "TuneResult", "tune"]

COST_SOURCES = ("insitu", "profile", "fit")
"""insitu: run 1's `layer` spans (the default); profile: each layer timed alone on the device; fit: run 1's stage
spans."""
MIN_PAIRS = 3
"""A measurement that decides runs at least three pairs: one pair cannot show how pairs differ, and the median
of three outvotes one pair that other work on the machine skewed (a demo beside a busy loop measured 0.58 of the
predicted gain as the mean of two pairs, 0.99 in the next demo)."""


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """What one run of the loop measured."""

    run_dir: Path
    split: tuple[int, ...]
    throughput_tokens_per_s: float | None
    bubble_ratio: float | None
    bottleneck_stage: int | None
    time_per_mb_ns: tuple[int | None, ...]
    """Each stage's time per micro-batch pass, as `analyze` gives it (None where it has none): per pass."""

    @classmethod
    def of(cls, run_dir: Path, result: AnalysisResult, split: tuple[int, ...]) -> RunSummary:
        return cls(
            run_dir=run_dir,
            split=split,
            throughput_tokens_per_s=result.throughput_tokens_per_s,
            bubble_ratio=result.bubble_ratio,
            bottleneck_stage=result.bottleneck_stage,
            time_per_mb_ns=tuple(json_ns(s.time_per_mb_ns) for s in result.stages),
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
    notes: list[Notice] = field(default_factory=list)
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
    """95% interval of the median of `measured_pairs` (`paired_throughput_ratio`; None: too short runs)."""
    decision: Advice | None = None
    """Keep the given split or change it, and why (`ppscope.balance.advise.advice.advise`)."""
    cores: SharedCores | None = None
    """CPU ranks: the cores they shared with other work, and the bound that puts on the gain (None on GPUs, for
    the synthetic model, whose layers sleep, or where the machine's busy cores cannot be read)."""
    measurement: str = ""
    """Whether the pairs of runs decided, in words ("" when a fixed number of pairs ran, or none)."""
    decided: bool | None = None
    """The measured interval came under half the predicted gain (None: not asked to decide, or no run 2)."""
    busy_cores_beside: float | None = None
    """Cores' worth of other work on the machine around run 1 (None where /proc/stat cannot be read)."""
    emulated: str = ""
    """How the engine emulated GPU stages, in words ("" when it computed)."""

    @property
    def predicted_speedup(self) -> float:
        """The headline: where CPU stages share too few free cores, the bound of their total work (`cores`); else
        the schedule replay of run 1 (`simulated`), which sees fill, drain and hops; else the slowest stage's
        ratio (`advice.predicted_speedup`, the closed form, always beside it)."""
        if self.cores is not None and self.cores.binds:
            return self.cores.speedup
        if self.simulated is not None:
            return self.simulated.speedup
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
        """The median pair's ratio: each pair ran close in time, so it shares the machine's mood. None without
        a second run: nothing was measured against run 1."""
        if self.after is None:
            return None
        ratios = self.pair_speedups
        return statistics.median(ratios) if ratios else None

    @property
    def lines(self) -> dict[str, str]:
        """What to paste to run the advised split in each serving engine (the runs are ppscope's engine serving
        requests: vLLM's, SGLang's and its own lines, `JobKind.SERVING`); none unless the advice is to change."""
        if self.decision is None or not self.decision.change:
            return {}
        return dataclasses.replace(self.advice, job=JobKind.SERVING).lines

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
            if s is None:
                return None
            lists = {"split": list(s.split), "time_per_mb_ns": list(s.time_per_mb_ns)}
            return {**dataclasses.asdict(s), "run_dir": str(s.run_dir), **lists}

        return {
            "before": run(self.before),
            "after": run(self.after),
            "cost_source": self.cost_source,
            "costs": self.costs.to_json(),
            "reruns": [run(r) for r in self.reruns],
            "predicted_speedup": self.predicted_speedup,
            "slowest_stage_speedup": self.advice.predicted_speedup,
            "cores": self.cores.to_json() if self.cores else None,
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
            **dict.fromkeys(SERVING_LINES),
            **self.lines,
            "measurement": self.measurement or None,
            "decided": self.decided,
            "busy_cores_beside": self.busy_cores_beside,
            "emulated": self.emulated or None,
            "notes": [n.to_json() for n in self.notes],
        }


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


Step = Callable[[str], None]


def _costs(
    cfg: EngineConfig, run_dir: Path, source: str, phase: str, step: Step
) -> tuple[LayerCosts, list[Notice], tuple[float, ...]]:
    """The layer costs, what they rest on in words, and (insitu) what each stage's pass spends outside its
    layers (ms; empty where the source does not say)."""
    if source == "insitu":
        got = insitu_costs([load_run(run_dir)], phase=phase)
        passes = f"{min(got.passes)}" if min(got.passes) == max(got.passes) else f"{min(got.passes)}-{max(got.passes)}"
        text = (
            f"costs: each layer timed inside run 1, the median of {passes} {got.phase} passes (every "
            f"{cfg.output.layer_spans}th pass of each stage)"
        )
        return got.costs, [Notice(NoticeCode.COSTS_FROM, text)], got.rest_ms
    if source == "profile":
        from ppscope.engine.profiler import profile_layers, write_profile

        step(f"profiling every layer, the embedding and the head on the device ({phase} pass)")
        profile = profile_layers(cfg)
        write_profile(profile, run_dir)
        text = f"costs: {phase} pass timed layer by layer ({profile.how})"
        return profile.phase(phase).costs(), [Notice(NoticeCode.COSTS_FROM, text)], ()
    fit = fit_layer_costs([load_run(run_dir)], phase=phase)
    note = Notice(
        NoticeCode.COSTS_FROM, f"costs: fitted from the run's {fit.phase} spans, {r_squared_text(fit.r_squared)}"
    )
    return fit.costs, [note, *fit.notes], ()


def _with(cfg: EngineConfig, out: Path, split: tuple[int, ...] | None = None) -> EngineConfig:
    """`cfg` writing to `out`, with `split` if given."""
    pipeline = cfg.pipeline if split is None else dataclasses.replace(cfg.pipeline, split=split)
    return dataclasses.replace(cfg, pipeline=pipeline, output=dataclasses.replace(cfg.output, out=out))


@dataclass(frozen=True, kw_only=True)
class Measured:
    """The pairs of runs of both splits and what they decided."""

    runs: tuple[RunSummary, ...]
    """Runs 2, 3, ... in the order they ran (run 1 is `TuneResult.before`)."""
    pairs: tuple[float, ...]
    interval: Interval | None
    verdict: str
    """Whether the measurement decided, in words ("" where it was not asked to decide)."""
    decided: bool | None
    """True: the interval's half-width came under half the predicted gain; False: the time ran out first;
    None: a fixed number of pairs was asked for."""


def _half_width(interval: Interval | None) -> float:
    return math.inf if interval is None else (interval.high - interval.low) / 2


def _measure(
    run_split: Callable[[int, tuple[int, ...]], RunSummary],
    traces: dict[tuple[int, ...], list[Trace]],
    given: tuple[int, ...],
    advised: tuple[int, ...],
    *,
    repeats: int,
    gain: float,
    decide_within_s: float | None,
    step: Step,
) -> Measured:
    """Run the advised split (run 2), then both splits pair by pair in ABBA order: `repeats` pairs in all, or,
    with `decide_within_s`, at least `MIN_PAIRS` and then until the measured interval's half-width is under half
    the predicted `gain` (the measurement can tell the gain from no gain) or the seconds run out."""
    started = time.monotonic()
    runs = [run_split(2, advised)]
    pair = 1

    def measured() -> tuple[tuple[float, ...], Interval | None]:
        return paired_throughput_ratio(list(zip(traces[given], traces[advised], strict=True)))

    while True:
        pairs, interval = measured()
        spent = time.monotonic() - started
        if decide_within_s is None:
            if pair >= repeats:
                return Measured(runs=tuple(runs), pairs=pairs, interval=interval, verdict="", decided=None)
        elif pair >= MIN_PAIRS and _half_width(interval) < gain / 2:
            verdict = (
                f"decided after {pair} pairs of runs: the measured speedup is known within "
                f"±{_half_width(interval):.3f}, under half the predicted gain ({gain / 2:.3f})"
            )
            return Measured(runs=tuple(runs), pairs=pairs, interval=interval, verdict=verdict, decided=True)
        elif pair >= repeats or spent + spent / pair > decide_within_s:
            verdict = (
                f"could not decide: after {pair} pairs of runs ({spent:.0f} s) the measured speedup is known only "
                f"within ±{_half_width(interval):.3f}, not under half the predicted gain ({gain / 2:.3f}); the runs "
                "of one split differ too much on this machine now"
            )
            return Measured(runs=tuple(runs), pairs=pairs, interval=interval, verdict=verdict, decided=False)
        order = (advised, given) if pair % 2 else (given, advised)
        names = " then ".join(",".join(map(str, s)) for s in order)
        step(f"runs {2 * pair + 1} and {2 * pair + 2}: {names}")
        runs += [run_split(2 * pair + 1 + i, s) for i, s in enumerate(order)]
        pair += 1


def _pass_gap_ms(trace: Trace, stage: int | None) -> float:
    """The median time `stage` spends between the end of one pass's parts and the start of the next, less the
    time it waited for its input there (ms): the receive, the send and the Python a pass costs besides its parts,
    the same for every stage whatever it holds. Waiting is left out: it is the other stages' time, or the loop's."""
    if stage is None:
        return 0.0
    spans = trace.spans
    mine = spans[spans["stage"] == stage]
    compute = mine[mine["kind"].isin([str(p.kind) for p in Part])].sort_values("start_ns")
    kind = compute["kind"].to_numpy(str)
    start, end = compute["start_ns"].to_numpy(np.int64), compute["end_ns"].to_numpy(np.int64)
    embed, forward = kind == str(SpanKind.EMBED), kind == str(SpanKind.FORWARD)
    # a pass begins with its embedding, or with its forward where no embedding came just before
    begins = embed[1:] | (forward[1:] & ~embed[:-1])
    gap_start, gap_end = end[:-1][begins], start[1:][begins]
    if not len(gap_start):
        return 0.0
    waits = mine[mine["kind"] == str(SpanKind.RECV_WAIT)]
    wait_start, wait_end = waits["start_ns"].to_numpy(np.int64), waits["end_ns"].to_numpy(np.int64)
    gap = np.searchsorted(gap_start, wait_start, side="right") - 1  # the gap each wait starts in
    inside = gap >= 0
    gap, wait_start, wait_end = gap[inside], wait_start[inside], wait_end[inside]
    overlap = np.minimum(wait_end, gap_end[gap]) - np.maximum(wait_start, gap_start[gap])
    waited = np.zeros(len(gap_start))
    np.add.at(waited, gap, np.maximum(overlap, 0))
    pure = (gap_end - gap_start) - waited
    pure = pure[pure >= 0]
    return float(np.median(pure)) / 1e6 if len(pure) else 0.0


def tune(
    cfg: EngineConfig,
    *,
    out_dir: str | Path,
    cost_source: str = "insitu",
    phase: str = Phase.DECODE,
    on_step: Step | None = None,
    repeats: int = 1,
    decide_within_s: float | None = None,
) -> TuneResult:
    """Run `cfg` as given, rebalance on costs measured in that run, and where the advice is to change, run
    the advised split and compare. With `repeats` > 1, each split runs that many times, pair by pair in ABBA
    order (given, advised; advised, given; ...), so that a machine getting slower or faster favours neither
    split; with `decide_within_s`, pairs go on (up to `repeats`) until the measurement decides or the time is
    spent (`_measure`)."""
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
    what = cfg.emulate.text() if cfg.emulate.on else cfg.model.name
    step(f"run 1: {what} on {pipe.stages} stages, {pipe.schedule} schedule, split as given")
    beside = [busy_cores()]
    with LoadSampler() as load:
        before_dir = run(_with(cfg, out / "1-before"))
    beside.append(busy_cores())
    before_trace = load_run(before_dir)
    split = tuple(before_trace.meta.split)
    first = analyze(before_trace)
    before = RunSummary.of(before_dir, first, split)
    costs, notes, rest_ms = _costs(cfg, before_dir, cost_source, phase, step)
    known = [b for b in beside if b is not None]
    on_cpus = all(r.device.startswith("cpu") for r in before_trace.meta.ranks)
    # CPU stages that compute: the time outside their spans is the shared-cores bound's (`RunUsage`), not twice
    gap_ms = 0.0 if on_cpus and not cfg.model.synthetic else _pass_gap_ms(before_trace, first.bottleneck_stage)
    overhead = [r + gap_ms for r in rest_ms] if rest_ms else gap_ms
    problem = BalanceProblem(costs=costs, stages=pipe.stages, stage_costs=StageCosts(overhead_ms=overhead))
    if gap_ms > 0:
        text = (
            f"each step of a stage also spends {gap_ms:.2f} ms outside its layers (receiving, sending, Python): "
            "the prediction counts it on every stage, since no split moves it"
        )
        notes.append(Notice(NoticeCode.STAGE_OVERHEAD, text))
    advice = rebalance(problem, current=split)
    proposed = tuple(advice.proposed.split)
    interval = speedup_interval([before_trace], problem, split, proposed) if proposed != split else None
    cores = None
    if known and on_cpus and not cfg.model.synthetic and proposed != split:  # synthetic layers sleep: no CPU
        cores, interval, note = _shared(before_trace, problem, advice, load, known, interval)
        notes += note
    simulated, why = replay_both(before_trace, costs, split, proposed)
    if simulated is None and proposed != split:
        notes.append(Notice(NoticeCode.NO_SIMULATION, f"no simulated prediction: {why}"))
    if cores is not None and cores.binds:
        predicted = cores.speedup
    elif simulated is not None:  # the schedule's replay is the headline; the slowest stage is printed beside it
        predicted, interval = simulated.speedup, replay_interval(interval, advice.predicted_speedup, simulated)
    else:
        predicted = advice.predicted_speedup
    decision = advise(split, proposed, predicted, interval, _RUN_1_TOO_SHORT)
    if cores is not None and cores.binds:
        decision = dataclasses.replace(decision, reason=f"{decision.reason}. {cores.text()}")
    common: dict[str, Any] = dict(
        before=before,
        advice=advice,
        costs=costs,
        cost_source=cost_source,
        notes=notes,
        decision=decision,
        cores=cores,
        predicted_interval=interval,
        simulated=simulated,
        busy_cores_beside=statistics.mean(known) if known else None,
        emulated=cfg.emulate.text(),
    )
    if proposed == split or not decision.change:
        notes.append(
            Notice(NoticeCode.ALREADY_BEST, "the split is already the best one for these costs: no second run")
            if proposed == split
            else Notice(
                NoticeCode.KEPT_NOT_RUN, "the advice is to keep the given split, so the advised split is not run"
            )
        )
        return TuneResult(after=None, **common)
    closed = f", the slowest stage ×{advice.predicted_speedup:.3f}" if simulated else ""
    step(f"run 2: advised split {','.join(map(str, proposed))} (predicted ×{predicted:.3f}{closed})")

    traces: dict[tuple[int, ...], list[Trace]] = {split: [before_trace], proposed: []}

    def run_split(n: int, split_now: tuple[int, ...]) -> RunSummary:
        name = "before" if split_now == split else "after"
        run_dir = run(_with(cfg, out / f"{n}-{name}", split_now))
        trace = load_run(run_dir)
        traces[split_now].append(trace)
        return RunSummary.of(run_dir, analyze(trace), split_now)

    got = _measure(
        run_split,
        traces,
        split,
        proposed,
        repeats=repeats,
        gain=predicted - 1.0,
        decide_within_s=decide_within_s,
        step=step,
    )
    return TuneResult(
        after=got.runs[0],
        reruns=got.runs[1:],
        measured_pairs=got.pairs,
        measured_interval=got.interval,
        measurement=got.verdict,
        decided=got.decided,
        **common,
    )


def _shared(
    trace: Trace,
    problem: BalanceProblem,
    advice: Rebalance,
    load: LoadSampler,
    known: list[float],
    interval: Interval | None,
) -> tuple[SharedCores, Interval | None, list[Notice]]:
    """CPU stages: the cores they shared with each other and other work, the bound that puts on the gain, and
    the interval of the bounded speedup (`ppscope.balance.advise.cores`)."""
    split, proposed = tuple(advice.current.split), tuple(advice.proposed.split)
    stages = len(split)
    usage = run_usage(trace, load.busy_between)  # what the stage times miss, measured in run 1
    serve = trace.meta.schedule == Schedule.SERVE and stages > 1  # micro-batches go round a loop
    hop_us = (hop_latency_us(trace.spans) or 0.0) if serve else 0.0
    sharing = functools.partial(
        shared_cores,
        cores=os.cpu_count() or 1,
        busy_beside=max(statistics.mean(known), usage.beside),
        extra_ms=usage.extra_ms(advice.current.stage_ms),
        loop_ms=stages * hop_us / 1e3,
        inflight=max(trace.meta.microbatches, 1) if serve else 0,
    )
    cores = sharing(advice.current.stage_ms, advice.proposed.stage_ms, interval=interval)
    if not cores.binds:
        return cores, interval, []
    said = [Notice(NoticeCode.SHARED_CORES, cores.text())]
    return cores, _bound_interval(trace, problem, split, proposed, cores, sharing), said


_RUN_1_TOO_SHORT = Notice(NoticeCode.TOO_SHORT, "run 1 is too short to tell how it varies")
