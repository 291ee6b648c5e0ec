"""One side of the HTA comparison, in a process of its own so that its peak memory is its own.

`python -m benchmarks.hta_child hta|ppscope FOLDER ROUNDS` loads the Kineto traces in FOLDER and analyses them
ROUNDS times: HTA's `TraceAnalysis` with its temporal and idle-time breakdowns, or ppscope's `open_trace` and
`analyze`. It prints one JSON line: the best time of a round (modules already imported), the peak resident
memory of this process and of its largest worker process (both tools parse files in worker processes; the
workers' peaks are sampled every 50 ms while they run), and each rank's compute share of its window as the
tool computes it.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _hwm_mb(pid: int | str = "self") -> float:
    """The peak resident memory of a process since it started its program (VmHWM), 0 once it is gone.

    Not `ru_maxrss`: Linux carries the parent's peak over a fork and exec into the child's, so a child of a
    big process would report the parent's size."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e6
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


class _Workers(threading.Thread):
    """Samples the peak memory of this process's children every 50 ms while the work runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.done = 0.0, threading.Event()

    def run(self) -> None:
        me = str(os.getpid())
        while not self.done.wait(0.05):
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                try:
                    parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
                except (OSError, IndexError):
                    continue
                if parent == me:
                    self.peak = max(self.peak, _hwm_mb(pid))


def _hta(folder: Path) -> dict[str, float]:
    from hta.trace_analysis import TraceAnalysis

    with contextlib.redirect_stdout(io.StringIO()):
        analysis = TraceAnalysis(trace_dir=str(folder))
        temporal = analysis.get_temporal_breakdown(visualize=False)
        analysis.get_idle_time_breakdown(visualize=False)
    return {str(int(r)): float(p) for r, p in zip(temporal["rank"], temporal["compute_time_pctg"], strict=True)}


def _ppscope(folder: Path) -> dict[str, float]:
    from ppscope.analysis import analyze
    from ppscope.formats.sources import open_trace

    result = analyze(open_trace(folder))
    return {str(r): 100 * (1 - s.bubble_ratio) for s in result.stages for r in s.ranks}


def main(argv: list[str]) -> int:
    tool, folder, rounds = argv[0], Path(argv[1]), int(argv[2])
    logging.disable(logging.INFO)  # HTA logs every file it parses
    run = _hta if tool == "hta" else _ppscope
    if tool == "hta":
        import hta.trace_analysis  # noqa: F401 - imported before the clock starts, as ppscope's modules are
    else:
        import ppscope.analysis
        import ppscope.formats.sources  # noqa: F401
    best, shares = float("inf"), {}
    workers = _Workers()
    workers.start()
    for _ in range(rounds):
        t0 = time.perf_counter()
        shares = run(folder)
        best = min(best, time.perf_counter() - t0)
    workers.done.set()
    workers.join()
    out: dict[str, Any] = {
        "seconds": best,
        "rss_mb": _hwm_mb(),
        "worker_rss_mb": workers.peak,
        "compute_pct": shares,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
