"""One side of the HTA comparison, in a process of its own so that its peak memory is its own.

`python -m benchmarks.hta_child hta|ppscope FOLDER ROUNDS` loads the Kineto traces in FOLDER and analyses them
ROUNDS times: HTA's `TraceAnalysis` with its temporal and idle-time breakdowns, or ppscope's `open_trace` and
`analyze`. It prints one JSON line: the best time of a round (modules already imported), the peak resident
memory of this process and of its largest worker process (both tools parse files in worker processes), and
each rank's compute share of its window as the tool computes it.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import resource
import sys
import time
from pathlib import Path
from typing import Any


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
    for _ in range(rounds):
        t0 = time.perf_counter()
        shares = run(folder)
        best = min(best, time.perf_counter() - t0)
    kib = 1024  # ru_maxrss is in KiB on Linux
    out: dict[str, Any] = {
        "seconds": best,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib / 1e6,
        "worker_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib / 1e6,
        "compute_pct": shares,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
