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
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_coverage import Pair, collect
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


def run_case(case: Case, tmp: Path) -> Pair | None:
    """The case's prediction and what its A B A B runs measured; None where A is already the best split."""
    first = _train(case, case.split, tmp / "a0")
    done = subprocess.run(
        [sys.executable, "-m", "ppscope", "rebalance", str(tmp / "a0"), "--json"], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"rebalance: {done.stderr.strip()[-400:]}")
    got = json.loads(done.stdout)
    proposed = got["proposed_split"]
    if proposed == [int(n) for n in case.split.split(",")]:
        return None
    b1 = _train(case, ",".join(map(str, proposed)), tmp / "b1")
    a2 = _train(case, case.split, tmp / "a2")
    b2 = _train(case, ",".join(map(str, proposed)), tmp / "b2")
    iv = got["predicted_interval"]
    return Pair(
        what=f"{case.schedule} (median of 2 ABAB pairs of step periods; slowest stage alone "
        f"×{got['slowest_stage_speedup']:.3f})",
        before=[int(n) for n in case.split.split(",")],
        after=proposed,
        predicted=got["predicted_speedup"],
        interval=(iv[0], iv[1]) if iv is not None else None,
        measured=statistics.median([first / b1, a2 / b2]),
        advice=got["advice"],
    )


def main() -> list[Figure]:
    return collect(CASES, run_case, lambda case: f"{case.schedule}, {case.split}")
