"""`analyze` of a Megatron-style pipeline timer trace (target: under 2x a plain `json.load` of the same file):
read + analysis in one process, of a generated array trace of 32 data-parallel replicas × 2 stages (about
110,000 events), against `json.load` of the same .json.gz measured side by side (median of 5 alternating
rounds, after one analysis of a small trace that imports ppscope's modules, as `json`'s are before the clock
starts).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from benchmarks.record import Figure

REPLICAS, STAGES, MICROBATCHES, STEPS = 32, 2, 32, 16
TARGET_RATIO = 2.0
ROUNDS = 5
ROOT = Path(__file__).resolve().parents[1]


def _generator() -> ModuleType:
    """`scripts/megatron_timers.py`, the writer of the test fixtures."""
    spec = importlib.util.spec_from_file_location("megatron_timers", ROOT / "scripts" / "megatron_timers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["megatron_timers"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter_ns()
    out = fn()
    return (time.perf_counter_ns() - t0) / 1e9, out


def _json_load(path: Path) -> int:
    with gzip.open(path, "rb") as f:
        return len(json.load(f))


def _analyze(path: Path) -> tuple[int, int]:
    """What `ppscope analyze` computes for the file: the trace read, placed and each replica analysed; the
    bottleneck's stage and the spans read."""
    from ppscope.analysis.placement import apply_placement, placement_of
    from ppscope.analysis.replicas import analyze_replicas
    from ppscope.formats.sources import open_trace

    trace = open_trace(path)
    placement = placement_of(trace)
    assert placement is not None
    ra = analyze_replicas(apply_placement(trace, placement), placement)
    assert ra.bottleneck is not None
    return ra.bottleneck[0], len(trace.spans)


def _rounds(path: Path) -> tuple[dict[str, list[float]], int, tuple[int, int]]:
    """ROUNDS pairs of (json.load, analyze), alternating so that both see the same load on the machine: their
    wall times (`ref`, `run`) and CPU times of this process (`ref_cpu`, `run_cpu`: what a loaded machine's
    other work does not add to)."""
    times: dict[str, list[float]] = {k: [] for k in ("ref", "run", "ref_cpu", "run_cpu")}
    events, found = 0, (-1, 0)
    for _ in range(ROUNDS):
        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
        events = _json_load(path)
        t1, c1 = time.perf_counter_ns(), time.process_time_ns()
        found = _analyze(path)
        t2, c2 = time.perf_counter_ns(), time.process_time_ns()
        for key, ns in (("ref", t1 - t0), ("run", t2 - t1), ("ref_cpu", c1 - c0), ("run_cpu", c2 - c1)):
            times[key].append(ns / 1e9)
    return times, events, found


def main() -> list[Figure]:
    gen = _generator()
    slow = {(STAGES - 1, r): 345.0 for r in range(REPLICAS)}
    job = gen.Job(replicas=REPLICAS, stages=STAGES, microbatches=MICROBATCHES, steps=STEPS, mb_ms=slow)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "timeline.json.gz"
        gen_s, _ = _timed(lambda: gen.write_trace(path, job))
        small = gen.write_trace(Path(tmp) / "small.json.gz", gen.Job(replicas=2, stages=STAGES, microbatches=4))
        _analyze(small)  # ppscope's modules imported before the clock starts, as json's are
        times, events, (bottleneck, spans) = _rounds(path)
        size_mb = path.stat().st_size / 1e6
    refs, runs = times["ref"], times["run"]
    ratios = [r / f for r, f in zip(runs, refs, strict=True)]
    ratio = statistics.median(ratios)
    cpu_ratios = [r / f for r, f in zip(times["run_cpu"], times["ref_cpu"], strict=True)]
    what = f"{REPLICAS} replicas × {STAGES} stages, {events:,} events, {size_mb:.1f} MB gzip"
    return [
        Figure(f"generating the timer trace ({what})", gen_s, "s"),
        Figure(
            f"ppscope analyze (read + per-replica analysis, one process) of the timer trace, {what}, {spans:,} spans "
            f"(median of {ROUNDS} alternating rounds; ratio: the median of theirs, "
            f"{', '.join(f'{r:.2f}' for r in ratios)})",
            statistics.median(runs),
            "s",
            "json.load of the same .json.gz",
            statistics.median(refs),
            ratio=ratio,
            target=f"<= {TARGET_RATIO:.0f}x",
            met=ratio <= TARGET_RATIO,
        ),
        Figure(
            f"the same in CPU time of the process, both threads (median of {ROUNDS} rounds; ratio: the median of "
            f"theirs, {', '.join(f'{r:.2f}' for r in cpu_ratios)})",
            statistics.median(times["run_cpu"]),
            "s",
            "json.load's CPU time",
            statistics.median(times["ref_cpu"]),
            ratio=statistics.median(cpu_ratios),
            target=f"<= {TARGET_RATIO:.0f}x",
            met=statistics.median(cpu_ratios) <= TARGET_RATIO,
        ),
        Figure(
            "bottleneck stage analyze finds",
            f"stage {bottleneck}",
            target=f"stage {STAGES - 1}",
            met=bottleneck == STAGES - 1,
        ),
    ]


if __name__ == "__main__":
    for figure in main():
        print(figure)
