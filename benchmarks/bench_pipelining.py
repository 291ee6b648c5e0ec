"""What recording a torch.distributed.pipelining job costs: ppscope's hook beside the PyTorch profiler.

Two ranks under torchrun (gloo, CPU) train the example's decoder (8 micro-batches); steps with and without
recording take turns one by one within one job (`pipelining_worker.py`), first with the hook, then under the
profiler (its export left out). Cost per action = median over pairs of adjacent steps of (recorded − bare)
÷ compute actions per step and rank (F, B, I, W); the recording's share of a step is in the pairs' noise on
a busy machine, so both costs are given, never their ratio alone.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from benchmarks.record import Figure
from benchmarks.torchrun import ROOT, torchrun

SCHEDULES = ("1f1b", "interleaved-1f1b")


def _job(schedule: str, scratch: Path) -> dict[str, object]:
    done = torchrun(ROOT / "benchmarks" / "pipelining_worker.py", str(scratch), schedule)
    done.check_returncode()
    line = next(s for s in done.stdout.splitlines() if s.startswith("{"))
    return dict(json.loads(line))


def main() -> list[Figure]:
    figures = []
    for schedule in SCHEDULES:
        with tempfile.TemporaryDirectory() as tmp:
            got = _job(schedule, Path(tmp))
        actions, spans = float(got["actions"]), float(got["spans"])  # type: ignore[arg-type]
        per, bare = {}, {}
        for mode in ("hook", "profiler"):
            pairs: list[list[float]] = got[mode]  # type: ignore[assignment]
            bare[mode] = statistics.median(b for b, _ in pairs)
            per[mode] = statistics.median(r - b for b, r in pairs) * 1e3 / actions
        figures += [
            Figure(
                f"pipelining {schedule}: recording's cost per compute action, ppscope's hook ({spans / actions:.1f} "
                f"spans an action, {actions:.0f} actions a step and rank; median over adjacent steps with and "
                "without recording)",
                per["hook"],
                "µs",
                "the PyTorch profiler's, the same way in the same job",
                per["profiler"],
            ),
            Figure(f"pipelining {schedule}: median step without recording", bare["hook"], "ms"),
        ]
    return figures


if __name__ == "__main__":
    for figure in main():
        print(figure)
