"""What the engine measures on GPUs, checked in one go on a machine with two or more (`benchmarks.gpu_check`
runs it there; on CPUs, over gloo, the GPU's run is the device-timed path on a stand-in stream the host runs,
PPSCOPE_TEST_DEVICE_TIMED, which is how this check itself is tested):

1. causes: the same gpipe run of the synthetic model on CPUs (gloo) and on the GPUs gives the same breakdown
   of idle time into causes (the host's wait for a header is a wait on GPUs too, not host time);
2. overlap: in serve with every stage busy, the gap between the end of a forward and the start of the next on
   each rank (a message received while the rank still computes the one before leaves no gap for its
   transfer);
3. offsets: ranks on rank 0's host read its clock (`same-host`, 0), and a ping-pong between them
   (PPSCOPE_TEST_PING_PONG) finds 0 within its uncertainty;
4. causality: no receive ends before its send starts on the common clock, in any of these runs;
5. NVML: each rank's counters come from the GPU NVML finds by the rank's device UUID, and the SM clock the
   synthetic model's sleep was calibrated at.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ppscope.trace.model import SpanKind, Trace

__all__ = ["NOISE", "gpu_path_checks"]

NOISE = 0.05
"""A cause's share of the window may differ this much between two runs of the same pipeline."""


def gpu_path_checks(tmp: Path, backend: str, stages: int, *, stage_ms: float = 10.0) -> list[str]:
    """One line per finding. `backend`: nccl on GPUs (gloo on CPUs, with the device-timed stand-in)."""
    from ppscope.engine.testing import DEVICE_TIMED_ENV, PING_PONG_ENV

    device_env = {DEVICE_TIMED_ENV: "1"} if backend == "gloo" else {}
    synthetic = {
        "model": "synthetic",
        "layers": stages,
        "layer_cost_ms": str(stage_ms),
        "stages": stages,
        "prompt_len": 4,
    }
    gpipe = {**synthetic, "schedule": "gpipe", "microbatches": stages, "requests": stages, "max_new_tokens": 6}
    serve = {**synthetic, "schedule": "serve", "max_inflight": stages, "requests": stages, "max_new_tokens": 30}
    on_cpu = _run(tmp / "causes-cpu", {}, backend="gloo", **gpipe)
    on_device = _run(tmp / "causes-device", device_env, backend=backend, **gpipe)
    busy = _run(tmp / "overlap", device_env, backend=backend, **serve)
    pinged = _run(tmp / "ping-pong", {**device_env, PING_PONG_ENV: "1"}, backend=backend, **serve)
    return [
        f"GPU path, {stages} ranks over {backend}:",
        _causes(on_cpu, on_device, backend),
        _overlap(busy, stage_ms),
        _offsets(busy, pinged),
        _causality({"gpipe, CPU": on_cpu, "gpipe, device": on_device, "serve": busy, "ping-pong": pinged}),
        _nvml(busy),
    ]


def _run(out: Path, env: dict[str, str], **kw: Any) -> Trace:
    from ppscope.engine.config import EngineConfig
    from ppscope.engine.launch import run
    from ppscope.trace.store import load_run

    with _environ(env):  # the ranks start with this process's environment
        return load_run(run(EngineConfig.from_json({"progress": False, "out": str(out), "timeout_s": 120, **kw})))


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _shares(trace: Trace) -> dict[str, float]:
    from ppscope.analysis import AnalysisConfig, analyze

    res = analyze(trace, AnalysisConfig(active=True))
    total = res.pp_size * (res.window.length_ns if res.window is not None else 0) or 1
    return {cause: sum(s.causes[cause] for s in res.stages) / total for cause in res.stages[0].causes}


def _causes(on_cpu: Trace, on_device: Trace, backend: str) -> str:
    cpu, dev = _shares(on_cpu), _shares(on_device)
    shown = [c for c in cpu if cpu[c] >= 0.005 or dev[c] >= 0.005]
    worst = max(abs(cpu[c] - dev[c]) for c in cpu)
    pairs = ", ".join(f"{c} {cpu[c]:.3f}/{dev[c]:.3f}" for c in shown)
    verdict = "same" if worst <= NOISE else "DIFFER"
    return (
        f"  idle causes, gpipe, share of the window on gloo (CPU)/{backend}: {pairs}; worst difference "
        f"{worst:.3f}: {verdict} (noise {NOISE})"
    )


def _overlap(trace: Trace, stage_ms: float) -> str:
    """Median and 90th percentile of the gaps between consecutive forwards, per rank, in µs."""
    spans = trace.spans
    fwd = spans[spans["kind"] == SpanKind.FORWARD].sort_values("start_ns")
    parts = []
    for rank, own in fwd.groupby("rank"):
        gaps = sorted(((own["start_ns"].to_numpy()[1:] - own["end_ns"].to_numpy()[:-1]) / 1e3).tolist())
        if gaps:
            p90 = gaps[min(len(gaps) - 1, int(0.9 * len(gaps)))]
            parts.append(f"rank {rank} {statistics.median(gaps):.0f}/{p90:.0f}")
    payload = spans[spans["kind"] == SpanKind.SEND]["nbytes"]
    size = f"{int(payload.median())} B payloads" if len(payload) else "no payloads"
    return (
        f"  overlap, serve with every stage busy ({stage_ms:g} ms a stage, {size}): gap between a forward's end "
        f"and the next forward's start, median/p90 µs: {', '.join(parts)}"
    )


def _offsets(busy: Trace, pinged: Trace) -> str:
    said = ", ".join(f"rank {r.rank} {r.clock.method} {r.clock.offset_ns / 1e3:+.1f}" for r in busy.meta.ranks[1:])
    measured = [r.clock for r in pinged.meta.ranks[1:] if r.clock.method == "ping-pong"]
    within = all(abs(c.offset_ns) <= c.uncertainty_ns for c in measured)
    found = ", ".join(f"{c.offset_ns / 1e3:+.1f} ± {c.uncertainty_ns / 1e3:.1f}" for c in measured)
    return (
        f"  clock offsets on one host (µs): {said}; measured by ping-pong: {found or 'none'}, "
        f"{'all within their uncertainty' if within and measured else 'NOT all within their uncertainty'}"
    )


def _causality(runs: dict[str, Trace]) -> str:
    from ppscope.trace.clock import causality_violations

    counts = []
    for name, trace in runs.items():
        slack = {r.rank: r.clock.uncertainty_ns for r in trace.meta.ranks}
        counts.append(f"{name} {len(causality_violations(trace.spans, uncertainty_ns=slack))}")
    return "  receives that end before their send starts (beyond the offsets' uncertainty): " + ", ".join(counts)


def _nvml(trace: Trace) -> str:
    uuids = _device_uuids(len(trace.meta.ranks))
    parts = []
    for r in trace.meta.ranks:
        expected = uuids.get(r.rank)
        match = "" if expected is None else (" (its device)" if r.counters.endswith(expected) else " (NOT its device)")
        clock = f", sleep calibrated at {r.sm_clock_mhz:.0f} MHz" if r.sm_clock_mhz else ""
        parts.append(f"rank {r.rank} {r.counters or 'not said'}{match}{clock}")
    return "  counters: " + "; ".join(parts)


def _device_uuids(ranks: int) -> dict[int, str]:
    """The UUID of the GPU each local rank takes (rank r: GPU r % count), as CUDA gives it; none on CPUs."""
    import torch

    if not torch.cuda.is_available():
        return {}
    count = torch.cuda.device_count()
    return {r: str(torch.cuda.get_device_properties(r % count).uuid) for r in range(ranks)}
