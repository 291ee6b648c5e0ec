"""Do the predicted intervals hold the truth? `ppscope tune` on many pipelines, each a measured before/after pair.

Each case runs `ppscope tune --repeats 1`: run 1 with the split as given, the advice from what run 1 measured
(the schedule's replay of both splits, its 95% interval widened by the replay's error on run 1), then run 2
with the advised split. Where the advice is to keep a split that is not the best the cost model finds, the
proposed split is run anyway, for comparison (not advised: the pair still tests the prediction). A case whose
split is already the best gives no pair. The measured speedup is run 2's throughput ÷ run 1's, the two run
back to back (the reference is run 1, measured in the same case).

The cases cover what `tune` supports: emulated GPU stages (`--emulate`: each part waits the time the cost model
gives a real model on a real GPU, scaled; emulated, not measured on that GPU) and the synthetic model (each
layer waits a given time), the `serve` and `gpipe` schedules, decode and prefill costs, 2 to 4 stages, splits as
vLLM gives them and splits off balance.

Targets (issue "advice a user can bet on"): the measured speedup inside the predicted 95% interval in at least
90% of the pairs; a median interval half-width of at most 0.03, so that coverage is not bought by width; the
median |measured gain ÷ predicted gain − 1| is reported (gain = speedup − 1).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.record import Figure

C = TypeVar("C")
"""A benchmark's case."""

COVERAGE = 0.90
HALF_WIDTH = 0.03

_EMULATED = ["--model", "tiny", "--requests", "8", "--max-new-tokens", "40"]
_SYNTHETIC = ["--model", "synthetic", "--layers", "8", "--layer-cost-ms", "5", "--requests", "8"]


@dataclass(frozen=True)
class Case:
    """One pipeline to tune: emulated GPU stages of `model` on `gpu`, or the synthetic model (8 layers of 5 ms
    and an LM head of `head_ms`) when `model` is empty."""

    stages: int
    schedule: str = "serve"
    model: str = ""
    gpu: str = ""
    head_ms: float = 0.0
    split: str = ""
    """As given (empty: vLLM's default)."""
    phase: str = "decode"

    @property
    def what(self) -> str:
        part = f"emulated {self.model} on {self.gpu}" if self.model else f"synthetic, {self.head_ms:g} ms head"
        split = f", split {self.split}" if self.split else ""
        return f"{part}, {self.stages} stages, {self.schedule}, {self.phase}{split}"

    @property
    def engine(self) -> list[str]:
        """The engine's options (those of `ppscope run`)."""
        out = ["--stages", str(self.stages), "--schedule", self.schedule]
        if self.model:
            out += ["--emulate", self.model, "--gpu", self.gpu, *_EMULATED]
        else:
            out += ["--head-cost-ms", f"{self.head_ms:g}", *_SYNTHETIC, "--max-new-tokens", "24"]
        if self.phase == "prefill":  # one prefill pass a request: time the layers in every pass, not every 8th
            out += ["--layer-spans", "1"]
        return out + (["--split", self.split] if self.split else [])


CASES = [
    Case(4, model="llama3-8b", gpu="h100-sxm"),
    Case(4, "gpipe", model="llama3-8b", gpu="h100-sxm"),
    Case(4, model="llama3-8b", gpu="h100-sxm", phase="prefill"),
    Case(2, model="llama3-8b", gpu="h100-sxm"),
    Case(3, model="llama3-8b", gpu="h100-sxm"),
    Case(4, model="llama3-8b", gpu="h100-sxm", split="6,10,8,8"),
    Case(4, "gpipe", model="llama3-8b", gpu="h100-sxm", split="10,8,8,6"),
    Case(4, model="llama3-8b", gpu="a100-80gb"),
    Case(4, model="llama3-8b", gpu="l40s"),
    Case(4, "gpipe", model="llama3-8b", gpu="mi300x"),
    Case(2, "gpipe", model="llama3-8b", gpu="h20"),
    Case(4, model="llama3-70b", gpu="h100-sxm"),
    Case(4, "gpipe", model="llama3-70b", gpu="h200"),
    Case(3, model="llama3-70b", gpu="a100-80gb", phase="prefill"),
    Case(4, head_ms=15),
    Case(4, "gpipe", head_ms=15),
    Case(2, head_ms=10),
    Case(2, "gpipe", head_ms=10),
    Case(2, head_ms=5, split="6,2"),
    Case(2, "gpipe", head_ms=5, split="2,6"),
    Case(3, head_ms=10),
    Case(3, "gpipe", head_ms=10),
    Case(4, head_ms=15, phase="prefill"),
    Case(4, "gpipe", head_ms=20, split="1,2,2,3"),
]


@dataclass(frozen=True)
class Pair:
    """One case's prediction and what the pair of runs measured."""

    what: str
    before: list[int]
    after: list[int]
    predicted: float
    interval: tuple[float, float] | None
    measured: float
    advice: str

    @property
    def inside(self) -> bool:
        return self.interval is not None and self.interval[0] <= self.measured <= self.interval[1]

    @property
    def half_width(self) -> float | None:
        return None if self.interval is None else (self.interval[1] - self.interval[0]) / 2

    @property
    def gain_ratio(self) -> float | None:
        """Measured gain ÷ predicted gain; None where no gain was predicted."""
        gain = self.predicted - 1.0
        return None if abs(gain) < 1e-9 else (self.measured - 1.0) / gain


def _ppscope(*argv: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "ppscope", *argv, "--json", "--no-progress"], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"ppscope {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def run_case(case: Case, out: Path) -> Pair | None:
    """The case's pair (None where its split is already the best: nothing to compare)."""
    got = _ppscope("tune", *case.engine, "--phase", case.phase, "--repeats", "1", "--out", str(out))
    before = got["before"]
    proposed = got["rebalance"]["proposed_split"]
    if proposed == before["split"]:
        return None
    if got["after"] is not None:
        measured = got["measured_speedup"]
    else:  # advised to keep: run the proposed split anyway, to test the prediction
        other_case = dataclasses.replace(case, split=",".join(map(str, proposed)))
        other = _ppscope("run", *other_case.engine, "--out", str(out / "for-comparison"))
        measured = other["throughput_tokens_per_s"] / before["throughput_tokens_per_s"]
    iv = got["predicted_interval"]
    return Pair(
        what=case.what,
        before=before["split"],
        after=proposed,
        predicted=got["predicted_speedup"],
        interval=None if iv is None else (iv[0], iv[1]),
        measured=measured,
        advice=got["advice"],
    )


def pair_figure(p: Pair) -> Figure:
    within = f"×{p.interval[0]:.3f}–×{p.interval[1]:.3f}" if p.interval is not None else "no interval"
    split = f"{','.join(map(str, p.before))} → {','.join(map(str, p.after))}"
    return Figure(
        f"{p.what}: {split} ({p.advice}); measured speedup, ratio = measured gain ÷ predicted gain",
        p.measured,
        "x",
        f"predicted, 95% interval {within}",
        p.predicted,
        ratio=p.gain_ratio,
        target="inside the interval",
        met=p.inside,
    )


def summary(pairs: list[Pair], already_best: int) -> list[Figure]:
    """Coverage, median half-width and median |gain ratio − 1| over the pairs."""
    inside = sum(p.inside for p in pairs)
    widths = [w for p in pairs if (w := p.half_width) is not None]
    ratios = [abs(r - 1.0) for p in pairs if (r := p.gain_ratio) is not None]
    width = statistics.median(widths) if widths else None
    return [
        Figure(
            f"pairs whose measured speedup lies inside the predicted 95% interval ({already_best} case(s) already "
            "at the best split gave no pair)",
            inside,
            reference_name="pairs",
            reference_value=len(pairs),
            target=f">= {COVERAGE:.0%}",
            met=bool(pairs) and inside / len(pairs) >= COVERAGE,
        ),
        Figure(
            "median half-width of the predicted interval",
            width,
            "x",
            target=f"<= {HALF_WIDTH}",
            met=None if width is None else width <= HALF_WIDTH,
        ),
        Figure(
            "median |measured gain ÷ predicted gain − 1|",
            statistics.median(ratios) if ratios else None,
        ),
    ]


def collect(cases: Sequence[C], run: Callable[[C, Path], Pair | None], what: Callable[[C], str]) -> list[Figure]:
    """Run every case (`run` gives its Pair, or None where its split is already the best) and return the
    summary, a figure per pair and one per failed case."""
    pairs: list[Pair] = []
    already_best, failed = 0, []
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(cases):
            try:
                pair = run(case, Path(tmp) / f"case-{i}")
            except RuntimeError as exc:  # said in the table; the other cases still count
                failed.append(Figure(f"{what(case)}: failed", str(exc)[-300:]))
                continue
            print(f"{what(case)}: {pair}", file=sys.stderr)
            if pair is None:
                already_best += 1
            else:
                pairs.append(pair)
    return [*summary(pairs, already_best), *(pair_figure(p) for p in pairs), *failed]


def main() -> list[Figure]:
    return collect(CASES, run_case, lambda case: case.what)
