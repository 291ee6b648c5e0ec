"""Print a `TuneResult` for people: the two runs side by side, predicted vs measured gain, paste-ready lines."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ppscope.balance.advise.advice import Interval
from ppscope.engine.tuning import TuneResult

__all__ = ["NOISE", "print_tune"]

NOISE = 0.02
"""Throughput of two runs of the same split differs by a few percent (docs/ARCHITECTURE.md, "Notes behind design
choices"); a predicted gain below this is not one that a single pair of runs can show."""


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def _within(interval: Interval | None) -> str:
    return "" if interval is None else f"; {interval.level:.0%} interval {interval.text()}"


def print_tune(result: TuneResult, console: Console | None = None) -> None:
    out = console or Console()
    advice = result.advice
    table = Table(title="Before and after rebalancing", title_justify="left")
    table.add_column("")
    table.add_column("run 1 (as given)", justify="right")
    table.add_column("run 2 (advised)", justify="right")
    before, after = result.before, result.after
    rows: list[tuple[str, str, str]] = [
        ("split", ",".join(map(str, before.split)), ",".join(map(str, after.split)) if after else "(same)"),
        (
            "predicted slowest stage",
            f"{advice.current.max_ms:.3f} ms (stage {advice.current.bottleneck})",
            f"{advice.proposed.max_ms:.3f} ms (stage {advice.proposed.bottleneck})",
        ),
        (
            "measured bottleneck stage",
            _fmt(before.bottleneck_stage, "d"),
            _fmt(after.bottleneck_stage if after else None, "d"),
        ),
        (
            "measured bubble ratio",
            _fmt(before.bubble_ratio and 100 * before.bubble_ratio, ".1f", "%"),
            _fmt(after.bubble_ratio and 100 * after.bubble_ratio if after else None, ".1f", "%"),
        ),
        (
            "measured throughput",
            _fmt(before.throughput_tokens_per_s, ".1f", " tok/s"),
            _fmt(after.throughput_tokens_per_s if after else None, ".1f", " tok/s"),
        ),
        ("run directory", str(before.run_dir), str(after.run_dir) if after else ""),
    ]
    for row in rows:
        table.add_row(*row)
    out.print(table)
    for note in result.notes:
        out.print(f"note: {note}")
    measured, sim = result.measured_speedup, result.simulated
    basis = "shared cores" if result.cores is not None and result.cores.binds else "slowest stage"
    out.print(
        f"predicted speedup ×{result.predicted_speedup:.3f} ({basis}{_within(result.predicted_interval)})"
        + (f"   simulated ×{sim.speedup:.3f}" if sim else "")
        + f"   measured ×{_fmt(measured, '.3f')}"
        + (f" ({_within(result.measured_interval).removeprefix('; ')})" if result.measured_interval else ""),
        soft_wrap=True,
    )
    if result.decision is not None:
        word = "change to the advised split" if result.decision.change else "KEEP the given split"
        out.print(f"advice: {word}: {result.decision.reason}", soft_wrap=True)
    if result.after is None:
        pass
    elif max(result.predicted_speedup, sim.speedup if sim else 0.0) < 1.0 + NOISE:
        out.print(
            f"measured gain ÷ predicted gain: – (a predicted gain under {NOISE:.0%} is within run-to-run noise: so "
            "is the measured change)"
        )
    elif measured is not None:
        against = f"{_fmt(result.realised, '.2f')} against the slowest stage"
        if sim:
            against += f", {_fmt(result.realised_simulated, '.2f')} against the simulation"
        out.print(
            f"measured gain ÷ predicted gain (gain = speedup − 1; 1.00: the advice delivered what it promised): "
            f"{against}"
        )
    if sim:
        out.print(
            "simulated: both splits through the simulator with run 1's schedule and in-flight micro-batches, "
            f"its hop latency ({sim.hop_latency_us:.0f} µs) and host gaps ({sim.overhead_ms:.3f} ms per pass): "
            "the slowest stage alone misses the hops a micro-batch waits for once the stages are balanced"
        )
    pairs = result.pair_speedups
    if len(pairs) > 1:
        runs = ", ".join(str(r.run_dir.name) for r in result.reruns)
        out.print(
            f"measured: the median of {len(pairs)} pairs of runs in ABBA order, pair by pair "
            f"{' '.join(f'×{p:.3f}' for p in pairs)} (runs 1 and 2 above; also {runs})"
        )
    stage_ms = ", ".join(f"{t:.3f}" for t in advice.proposed.stage_ms)
    out.print(f"advised split, predicted stage times (ms): {stage_ms}")
    from ppscope.balance.advise.rebalance import engine_lines

    for line in engine_lines(advice.proposed.split, sum(advice.current.split)).values():
        out.print(f"  {line}", highlight=False, soft_wrap=True)
