"""Does `ppscope rebalance` of a training job predict what the job then measures? Real torch.distributed.pipelining
jobs under torchrun (2 ranks, gloo, CPU, one thread each; `examples/pipelining_train.py` with the recording hook).

Each case runs the job with a split off balance (A), asks `ppscope rebalance RUN --json` for the advice (the step
replayed in its own action order with each stage scaled by proposed ÷ current time, its interval widened by the
replay's error on the run), then runs the proposed split (B) and A again and B again: A B A B, so that a machine
getting slower or faster favours neither. The measured speedup is the median of the two pairs' ratios of median
step time (A ÷ B), the first step of every run left out (warm-up). The reference of each figure is the
prediction made from the first run of A in the same case. CPU compute on a shared 2-core machine: one run of a
split differs from the next by several percent, which the prediction (of one run's variability) does not hold.
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.record import Figure
from benchmarks.torchrun import ROOT, torchrun

SHAPE = ["--microbatches", "4", "--steps", "8", "--layers", "8", "--dim", "256", "--seq", "64"]


@dataclass(frozen=True)
class Case:
    schedule: str
    split: str
    """Layers per (virtual) stage, off balance."""


CASES = [
    Case("1f1b", "6,2"),
    Case("1f1b", "2,6"),
    Case("gpipe", "6,2"),
    Case("gpipe", "3,5"),
    Case("interleaved-1f1b", "3,1,1,3"),
    Case("interleaved-1f1b", "1,3,3,1"),
]


def _train(case: Case, split: str, out: Path) -> float:
    """Run the job with `split`; its step period in ms: the median time between one step's end and the next's
    on rank 0 (the first period left out: warm-up), what a training job's throughput is. (The extent of a step
    over both ranks is not: a rank that finishes early starts the next step while the other still runs this
    one.)"""
    example = ROOT / "examples" / "pipelining_train.py"
    done = torchrun(example, "--schedule", case.schedule, *SHAPE, "--split", split, "--ppscope", str(out))
    if done.returncode != 0:
        raise RuntimeError(f"{case.schedule} {split}: {done.stderr.strip()[-400:]}")
    from ppscope.formats.sources import open_trace

    spans = open_trace(out).spans
    ends = sorted(spans[(spans["kind"] == "step") & (spans["rank"] == 0)]["end_ns"].tolist())
    return float(statistics.median([b - a for a, b in itertools.pairwise(ends)][1:])) / 1e6


def run_case(case: Case, tmp: Path) -> Figure:
    first = _train(case, case.split, tmp / "a0")
    done = subprocess.run(
        [sys.executable, "-m", "ppscope", "rebalance", str(tmp / "a0"), "--json"], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"rebalance: {done.stderr.strip()[-400:]}")
    got = json.loads(done.stdout)
    proposed = ",".join(map(str, got["proposed_split"]))
    name = f"{case.schedule}, {case.split} → {proposed} ({got['advice']})"
    if proposed == case.split:
        return Figure(f"{name}: already the best split, nothing to measure", None)
    b1 = _train(case, proposed, tmp / "b1")
    a2 = _train(case, case.split, tmp / "a2")
    b2 = _train(case, proposed, tmp / "b2")
    measured = statistics.median([first / b1, a2 / b2])
    iv = got["predicted_interval"]
    inside = iv is not None and iv[0] <= measured <= iv[1]
    within = f"×{iv[0]:.3f}–×{iv[1]:.3f}" if iv is not None else "no interval"
    return Figure(
        f"{name}: measured speedup (median of 2 ABAB pairs of step periods; slowest stage alone "
        f"×{got['slowest_stage_speedup']:.3f}), ratio = measured gain ÷ predicted gain",
        measured,
        "x",
        f"predicted (the step replayed), 95% interval {within}",
        got["predicted_speedup"],
        ratio=(measured - 1) / (got["predicted_speedup"] - 1) if abs(got["predicted_speedup"] - 1) > 1e-9 else None,
        target="inside the interval",
        met=inside,
    )


def main() -> list[Figure]:
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(CASES):
            try:
                figure = run_case(case, Path(tmp) / f"case-{i}")
            except RuntimeError as exc:
                figure = Figure(f"{case.schedule}, {case.split}: failed", str(exc))
            print(figure, file=sys.stderr)
            figures.append(figure)
    measured = [f for f in figures if f.met is not None]
    inside = sum(bool(f.met) for f in measured)
    return [
        Figure(
            "training cases whose measured speedup lies inside the predicted 95% interval",
            inside,
            reference_name="cases measured",
            reference_value=len(measured),
        ),
        *figures,
    ]
