"""One side of the HTA comparison, in a process of its own so that its peak memory is its own.

`python -m benchmarks.hta_child hta|ppscope FOLDER ROUNDS` loads the Kineto traces in FOLDER and analyses them
ROUNDS times: HTA's `TraceAnalysis` with its temporal and idle-time breakdowns, or ppscope's `open_trace` and
`analyze`. It prints one JSON line: the best time of a round (modules already imported), the peak resident
memory of this process, and each rank's compute share of its window as the tool computes it.

The peak of the worker processes (both tools parse files in workers) is sampled by the process that started
this one (`run_side`), every 50 ms while it runs: a sampling thread in here would take the interpreter's lock
from the work it measures (each read of /proc hands the lock over), and slowed ppscope's rounds by a third.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
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


def _descendants(root: int) -> list[str]:
    """The processes below `root` (its workers, and theirs)."""
    parents: dict[str, str] = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            parents[pid] = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
    below, found = {str(root)}, True
    while found:
        more = {pid for pid, parent in parents.items() if parent in below and pid not in below}
        below |= more
        found = bool(more)
    return sorted(below - {str(root)})


def run_side(tool: str, folder: Path, rounds: int, timeout_s: float) -> dict[str, Any]:
    """This module run on `folder` in a process of its own, its workers' peak memory sampled from here."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "benchmarks.hta_child", tool, str(folder), str(rounds)]
    peak, began = 0.0, time.monotonic()
    with subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        while child.poll() is None:
            if time.monotonic() - began > timeout_s:
                child.kill()
                raise subprocess.TimeoutExpired(command, timeout_s)
            peak = max([peak, *(_hwm_mb(pid) for pid in _descendants(child.pid))])
            time.sleep(0.05)
        out, err = child.communicate()
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, command, out, err)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["worker_rss_mb"] = peak
    return result


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
    out: dict[str, Any] = {"seconds": best, "rss_mb": _hwm_mb(), "compute_pct": shares}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
