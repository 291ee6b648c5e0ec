"""The pipeline over several devices, checked in one go: what a machine with two or more GPUs can tell that
one GPU cannot (`benchmarks.gpu_check` runs it there; on CPUs it runs over gloo, which is how it is tested).

1. tokens: every schedule (gpipe, interleaved, serve with all requests at once and with Poisson arrivals)
   over P ranks gives the tokens of one rank running the whole model on the same kind of device;
2. efficiency: the synthetic model at a known cost per stage, gpipe with 8 micro-batches and serve with P in
   flight, measured throughput ÷ the schedule's ideal (the figures the engine benchmark gives on CPUs);
3. spans: device-timed forward spans ÷ the configured cost on each rank, the analyzer's warnings (a receive
   that ends before its send starts would be one) and each rank's clock offset and its uncertainty.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from ppscope.trace.model import COMPUTE_KINDS, SpanKind

__all__ = ["ring_checks"]

SCHEDULES: dict[str, dict[str, Any]] = {
    "gpipe": {"schedule": "gpipe"},
    "interleaved": {"schedule": "interleaved", "chunks": 2},
    "serve": {"schedule": "serve"},
    "serve, Poisson arrivals": {"schedule": "serve", "rate": 40.0},
}


def ring_checks(tmp: Path, backend: str, stages: int, *, stage_ms: float = 5.0, tokens: int = 6) -> list[str]:
    """One line per finding. `backend`: nccl on GPUs (gloo on CPUs); `tokens`: new tokens per request."""
    lines = [f"ring of {stages} ranks over {backend}:"]
    for name, options in SCHEDULES.items():
        lines.append(
            f"  tokens, {name}: {_same_tokens(tmp / name.replace(', ', '-'), backend, stages, tokens, options)}"
        )
    lines += _efficiency(tmp, backend, stages, stage_ms)
    return lines


def _run(out: Path, **kw: Any) -> Path:
    from ppscope.engine.config import EngineConfig
    from ppscope.engine.launch import run

    return run(EngineConfig.from_json({"progress": False, "out": str(out), "timeout_s": 120, **kw}))  # the flat form


def _outputs(run_dir: Path) -> list[list[int]]:
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    return [r["output_ids"] for r in sorted(rows, key=lambda r: r["id"])]


def _same_tokens(tmp: Path, backend: str, stages: int, tokens: int, options: dict[str, Any]) -> str:
    """Whether P ranks give the tokens of one rank running the same schedule with the same micro-batches (on
    the same kind of device: a GPU's kernels round differently from a CPU's, and by batch shape), and where
    they first differ if not."""
    batching = {"max_inflight": stages} if options["schedule"] == "serve" else {"microbatches": stages}
    common = {"requests": 2 * stages, "prompt_len": 6, "max_new_tokens": tokens, "seed": 1, **batching, **options}
    whole = _outputs(_run(tmp / "one", stages=1, **common))
    split = _outputs(_run(tmp / "ring", stages=stages, backend=backend, **common))
    if split == whole:
        return f"equal to one rank's ({len(whole)} requests, {sum(map(len, whole))} tokens)"
    for i, (a, b) in enumerate(zip(split, whole, strict=False)):
        if a != b:
            j = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return f"DIFFER from one rank's: request {i} first at token {j} ({a} against {b})"
    return f"DIFFER from one rank's: {len(split)} requests against {len(whole)}"


def _efficiency(tmp: Path, backend: str, stages: int, stage_ms: float) -> list[str]:
    from benchmarks.ring_reference import steady_ratio
    from ppscope.analysis import analyze
    from ppscope.trace.store import load_run

    synthetic = {
        "model": "synthetic",
        "layers": stages,
        "layer_cost_ms": str(stage_ms),
        "stages": stages,
        "backend": backend,
        "prompt_len": 4,
    }
    m, steps = 8, 6
    gpipe = load_run(
        _run(tmp / "eff-gpipe", schedule="gpipe", microbatches=m, requests=m, max_new_tokens=steps, **synthetic)
    )
    comp = gpipe.spans[gpipe.spans["kind"].isin([str(k) for k in COMPUTE_KINDS])]
    window_s = (comp["end_ns"].max() - comp["start_ns"].min()) / 1e9
    ideal = m / ((m + stages - 1) * stage_ms / 1e3)
    passes = 40 * stages
    serve = load_run(
        _run(
            tmp / "eff-serve",
            schedule="serve",
            max_inflight=stages,
            requests=stages,
            max_new_tokens=passes // stages,
            **synthetic,
        )
    )
    s = serve.spans
    first = s[(s["kind"] == SpanKind.FORWARD) & (s["rank"] == 0)]["start_ns"]
    lines = [
        f"  efficiency, synthetic {stage_ms:g} ms per stage: gpipe M={m} measured/ideal = "
        f"{m * steps / window_s / ideal:.3f}; serve {stages} in flight, steady = {steady_ratio(first, stage_ms):.3f}"
    ]
    fwd = s[s["kind"] == SpanKind.FORWARD]
    took = ((fwd["end_ns"] - fwd["start_ns"]) / 1e6 / stage_ms).groupby(fwd["rank"]).median()
    lines.append("  forward spans ÷ configured cost, median per rank: " + ", ".join(f"{v:.3f}" for v in took))
    for name, trace in (("gpipe", gpipe), ("serve", serve)):
        warnings = analyze(trace).warnings
        said = "; ".join(map(str, warnings[:3])) + (f" (and {len(warnings) - 3} more)" if len(warnings) > 3 else "")
        lines.append(f"  analyzer warnings, {name}: {said or 'none'}")
    clocks = [r.clock for r in serve.meta.ranks]
    lines.append(
        "  clock offsets to rank 0 (± uncertainty, µs): "
        + ", ".join(f"{c.offset_ns / 1e3:+.1f} ± {c.uncertainty_ns / 1e3:.1f}" for c in clocks)
        + f"; median uncertainty {statistics.median(c.uncertainty_ns for c in clocks) / 1e3:.1f} µs"
    )
    return lines
