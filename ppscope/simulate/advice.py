"""The schedule replay as the headline of split advice.

The slowest stage's ratio (the closed form) says how much faster the pipeline's pace gets; a run also fills and
drains, and waits for hops, so on few micro-batches the closed form promises more than the run can gain (a
2-stage GPipe step of 2 micro-batches at 10 + 6 ms per pass takes 26 ms, at 8 + 8 ms 24 ms: ×1.08, where the
slowest stage says ×1.25). Wherever the run's schedule can be replayed, both splits go through the simulator
calibrated on the run (`Replay`: its schedule, sizes, hop latency and host gaps) with the costs the advice was
made with, a training job's step in its own action order (`ppscope.simulate.whatif`), and that ratio is the
headline, the closed form printed beside it. Its interval is the run's own
variability (the closed form's interval, carried to the replay's point by the ratio of the two) widened by the
replay's error on the run itself (the run replayed with its own split against its measured time), so that it
holds the model's error as well as the costs' spread. `ppscope tune`, `ppscope demo` and `ppscope rebalance RUN`
share it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ppscope.balance.advise.advice import Interval, Simulated, advise
from ppscope.balance.costs import LayerCosts
from ppscope.balance.report import RebalanceReport
from ppscope.errors import PPScopeError
from ppscope.simulate.calibrate import Prediction, Replay
from ppscope.trace.model import Trace

__all__ = ["replay_both", "replay_interval", "replay_splits", "replay_training_both", "with_replay"]


def replay_splits(
    trace: Trace, costs: LayerCosts, current: Sequence[int], proposed: Sequence[int]
) -> tuple[Prediction, Prediction]:
    """Both splits through the simulator calibrated on the run (`Replay`) with `costs`: the run as it is, timed
    against itself, and the proposed split. Raises PPScopeError where the simulator cannot replay the run."""
    replay = Replay.of(trace, costs=costs)
    return replay.predict(tuple(current)), replay.predict(tuple(proposed))


def replay_both(
    trace: Trace,
    costs: LayerCosts,
    current: Sequence[int],
    proposed: Sequence[int],
    *,
    replayed: tuple[Prediction, Prediction] | None = None,
) -> tuple[Simulated | None, str]:
    """Both splits replayed on the run's schedule with `costs` (`replayed`: `replay_splits`' answer, where the
    caller has it already), or None and why not (the same split, or a run the simulator cannot replay)."""
    if tuple(current) == tuple(proposed):
        return None, "the proposed split is the current one"
    try:
        before, after = replayed or replay_splits(trace, costs, current, proposed)
    except PPScopeError as exc:
        return None, str(exc)
    cfg = before.config
    return (
        Simulated(
            speedup=before.predicted_ms / after.predicted_ms,
            hop_latency_ns=round(cfg.comm.latency_us * 1e3),
            overhead_ms=cfg.overhead_ms,
            error=abs(before.throughput_error),
        ),
        "",
    )


def replay_training_both(
    trace: Trace, current_ms: Sequence[float], proposed_ms: Sequence[float]
) -> tuple[Simulated | None, str]:
    """A training job's step replayed in its own action order (`ppscope.simulate.whatif.replay_job`) with its
    measured costs, and with each stage's actions scaled by its proposed ÷ current time (the split moves layers,
    and with them the forward and the backward of each); or None and why not."""
    from ppscope.simulate.whatif import read_job, replay_job

    try:
        job, why = read_job(trace)
        if job is None:
            return None, why.text if why is not None else "no training step to replay"
        scale = {s: new / now for s, (now, new) in enumerate(zip(current_ms, proposed_ms, strict=True)) if now > 0}
        moved = {rep: {(s, t): v * scale.get(s, 1.0) for (s, t), v in c.items()} for rep, c in job.costs.items()}
        before, after = replay_job(job, job.costs), replay_job(job, moved)
    except PPScopeError as exc:
        return None, str(exc)
    measured = job.measured_step_ns
    return (
        Simulated(
            speedup=before / after,
            hop_latency_ns=int(job.hop_ns),
            overhead_ms=0.0,
            error=abs(measured / before - 1.0) if measured and before else 0.0,
        ),
        "",
    )


def replay_interval(interval: Interval | None, closed: float, sim: Simulated) -> Interval | None:
    """The interval of the replay's speedup: the closed form's (the run's variability), carried to the replay's
    point by the ratio of the two, widened by the replay's own error on the run (÷ and × 1 + error)."""
    if interval is None or closed <= 0:
        return None
    scale, widen = sim.speedup / closed, 1.0 + sim.error  # by a factor both ways: never below 0
    return Interval(
        low=interval.low * scale / widen,
        high=interval.high * scale * widen,
        level=interval.level,
        how=f"{interval.how}, carried to the schedule replay and widened by its error on the run (±{sim.error:.1%})",
    )


def with_replay(
    report: RebalanceReport, trace: Trace, *, replayed: tuple[Prediction, Prediction] | None = None
) -> RebalanceReport:
    """`report` (of `rebalance_runs`, `trace` its last run) led by the schedule replay: its speedup the headline,
    its interval widened by its error, the keep-or-change rule applied to it. Unchanged, with the reason in
    `simulated_note`, where the objective is memory or the run cannot be replayed. `replayed`: the report's two
    splits through `replay_splits` already (the dashboard draws them too)."""
    if report.split.objective == "memory":
        return dataclasses.replace(report, simulated_note="the objective is memory, not speed")
    now, new = report.split.current, report.split.proposed
    if report.training is not None and now.split != new.split:
        sim, why = replay_training_both(trace, now.stage_ms, new.stage_ms)
    else:
        sim, why = replay_both(trace, report.costs, now.split, new.split, replayed=replayed)
    if sim is None:
        return dataclasses.replace(report, simulated_note=why)
    interval = replay_interval(report.interval, report.split.predicted_speedup, sim)
    no_interval = report.decision.no_interval
    decision = advise(report.split.current.split, report.split.proposed.split, sim.speedup, interval, no_interval)
    return dataclasses.replace(report, simulated=sim, interval=interval, decision=decision, simulated_note="")
