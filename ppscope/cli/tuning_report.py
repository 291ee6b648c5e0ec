"""Print a `TuneResult` for people: one verdict, the runs side by side, predicted vs measured gain, and the lines
to paste only where the advice is to change. Tables fit an 80-column terminal."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ppscope.balance.advise.advice import Interval
from ppscope.balance.advise.rebalance import Rebalance
from ppscope.engine.tuning import RunSummary, TuneResult

__all__ = ["NOISE", "print_tune"]

NOISE = 0.02
"""Throughput of two runs of the same split differs by a few percent (docs/ARCHITECTURE.md, "Notes behind design
choices"); a predicted gain below this is not one that a single pair of runs can show."""
POINT = 1e-4
"""An interval narrower than this is a point."""


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def _split(split: tuple[int, ...] | list[int]) -> str:
    return ",".join(map(str, split))


def _interval(interval: Interval | None, point_why: str = "") -> str:
    """` (95% interval ×a–×b)`; an interval of no width says that it is one, and why (`point_why`)."""
    if interval is None:
        return ""
    if interval.high - interval.low < POINT:
        why = point_why or "run 1's times varied too little to move it"
        return f" (the same in every resample of run 1's times: {why})"
    return f" ({interval.level:.0%} interval {interval.text()})"


def _table(result: TuneResult) -> Table:
    """Run 1 beside run 2 where the advised split ran; run 1 alone beside the advised split's prediction where
    it did not."""
    advice, before, after = result.advice, result.before, result.after
    table = Table(title="Run 1 and the advised split", title_justify="left")
    table.add_column("")
    table.add_column("run 1 (as given)", justify="right")
    table.add_column("run 2 (advised)" if after else "advised (not run)", justify="right")

    def measured(run: RunSummary | None, value: float | None, spec: str, suffix: str = "") -> str:
        return "not run" if run is None else _fmt(value, spec, suffix)

    def pct(run: RunSummary | None) -> float | None:
        return None if run is None or run.bubble_ratio is None else 100 * run.bubble_ratio

    rows = [
        ("split", _split(before.split), _split(advice.proposed.split)),
        ("predicted slowest stage", _stage_ms(advice, current=True), _stage_ms(advice, current=False)),
        (
            "measured slowest stage",
            _fmt(before.bottleneck_stage, "d"),
            measured(after, after.bottleneck_stage if after else None, "d"),
        ),
        ("measured bubble ratio", _fmt(pct(before), ".1f", "%"), measured(after, pct(after), ".1f", "%")),
        (
            "measured throughput",
            _fmt(before.throughput_tokens_per_s, ".1f", " tok/s"),
            measured(after, after.throughput_tokens_per_s if after else None, ".1f", " tok/s"),
        ),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def _stage_ms(advice: Rebalance, *, current: bool) -> str:
    plan = advice.current if current else advice.proposed
    return f"{plan.max_ms:.2f} ms (stage {plan.bottleneck})"


def _verdict(result: TuneResult) -> str:
    decision = result.decision
    if decision is None:
        return ""
    if decision.change:
        return f"advice: CHANGE to {_split(result.advice.proposed.split)}: {decision.reason}"
    return f"advice: KEEP {_split(result.before.split)}: {decision.reason}"


def _gain_lines(result: TuneResult) -> list[str]:
    """Predicted against measured, in sentences."""
    bound = result.cores is not None and result.cores.binds
    sim, measured, pairs = result.simulated, result.measured_speedup, result.pair_speedups
    if bound:
        basis = "the stages sharing cores"
    elif sim:
        basis = "both splits replayed on run 1's schedule"
    else:
        basis = "the slowest stage"
    point = "the shared cores bound both splits alike however the stage times vary" if bound else ""
    lines = [
        f"predicted speedup ×{result.predicted_speedup:.3f}{_interval(result.predicted_interval, point)}, from "
        f"{basis} with the costs measured in run 1"
    ]
    if sim and not bound:
        lines.append(
            f"the replay: run 1's hops ({sim.hop_latency_ns / 1e3:.0f} µs) and gaps between passes "
            f"({sim.overhead_ms:.3f} ms); it times run 1 itself within {sim.error:.1%}. The slowest stage alone "
            f"(closed form) says ×{result.advice.predicted_speedup:.3f}"
        )
    elif sim:
        lines.append(
            f"simulated speedup ×{sim.speedup:.3f}: both splits replayed with run 1's hops "
            f"({sim.hop_latency_ns / 1e3:.0f} µs) and gaps between passes ({sim.overhead_ms:.3f} ms)"
        )
    if result.after is None:
        return lines
    each = ", ".join(f"×{p:.3f}" for p in pairs)
    lines.append(
        f"measured speedup ×{_fmt(measured, '.3f')}{_interval(result.measured_interval)}: the median of "
        f"{len(pairs)} pair(s) of runs in ABBA order ({each})"
    )
    if result.measurement:
        lines.append(f"measurement: {result.measurement}")
    if max(result.predicted_speedup, sim.speedup if sim else 0.0) < 1.0 + NOISE:
        lines.append(f"a predicted gain under {NOISE:.0%} is within run-to-run noise, and so is the measured change")
    elif measured is not None and result.realised is not None:
        lines.append(
            f"share of the predicted gain realised: {result.realised:.2f} (measured gain {measured - 1:+.1%} ÷ "
            f"predicted gain {result.predicted_speedup - 1:+.1%}; 1.00: the advice delivered what it promised)"
        )
    return lines


def print_tune(result: TuneResult, console: Console | None = None) -> None:
    out = console or Console()
    if result.emulated:
        out.print(f"engine: {result.emulated}: times are waits the cost model set, not compute", soft_wrap=True)
    out.print(_table(result))
    for note in result.notes:
        out.print(f"note: {note}")
    for line in _gain_lines(result):
        out.print(line)
    verdict = _verdict(result)
    if verdict:
        out.print(verdict)
    lines = result.lines
    if lines:
        stage_ms = ", ".join(f"{t:.2f}" for t in result.advice.proposed.stage_ms)
        out.print(f"to run {_split(result.advice.proposed.split)} (predicted stage times {stage_ms} ms):")
        for line in lines.values():
            out.print(f"  {line}", highlight=False, soft_wrap=True)
    runs = [result.before, *([result.after] if result.after else []), *result.reruns]
    out.print(f"runs: {', '.join(str(r.run_dir) for r in runs)}", soft_wrap=True)
