"""How busy the machine's cores are, from the kernel's CPU times in `/proc/stat`: before and after a run (the
work beside it) and while it runs, sampled on the host's monotonic clock, the clock a run's spans and counters
use on one host (`time.perf_counter_ns`), so the machine's load over a window of the run can be set beside the
ranks' own CPU usage in that window. Linux only; elsewhere every reading is None and nothing is bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["STAT", "LoadSampler", "busy_cores"]

STAT = "/proc/stat"
Reading = tuple[int, int]
"""(busy, total) CPU ticks of all cores since boot."""


def _read(stat: str) -> Reading | None:
    try:
        with open(stat, encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def _cpus(stat: str) -> int:
    """The CPUs `/proc/stat` counts (its `cpuN` lines), whose times its first line adds up."""
    with open(stat, encoding="ascii") as f:
        return max(sum(1 for line in f if line.startswith("cpu") and line[3:4].isdigit()), 1)


def _cores(first: Reading | None, last: Reading | None, cpus: int) -> float | None:
    if first is None or last is None or last[1] <= first[1]:
        return None
    return (last[0] - first[0]) / (last[1] - first[1]) * cpus


def busy_cores(seconds: float = 0.5, stat: str = STAT) -> float | None:
    """Cores' worth of work the machine does over the next `seconds`, None where there is no such file.
    Measured around run 1, when none of the run's processes are up, it is the work beside the pipeline."""
    first = _read(stat)
    time.sleep(seconds)
    last = _read(stat)
    return _cores(first, last, _cpus(stat)) if first is not None else None


class LoadSampler:
    """Reads the machine's CPU times every `interval_s` in a thread of its own while in its `with` block;
    `busy_between(t0, t1)` is then the cores' worth of work over that span of the monotonic clock (ns)."""

    def __init__(self, interval_s: float = 0.25, stat: str = STAT, clock: Callable[[], int] = time.perf_counter_ns):
        self.interval_s, self.stat, self.clock = interval_s, stat, clock
        self.samples: list[tuple[int, Reading]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        reading = _read(self.stat)
        if reading is not None:
            self.samples.append((self.clock(), reading))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> LoadSampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="ppscope-load", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def busy_between(self, start_ns: int, end_ns: int) -> float | None:
        """Cores busy from the last sample at or before `start_ns` to the first at or after `end_ns` (the
        samples that cover the span); None when the samples do not cover it."""
        before = [s for s in self.samples if s[0] <= start_ns]
        after = [s for s in self.samples if s[0] >= end_ns]
        if not before or not after:
            return None
        return _cores(before[-1][1], after[0][1], _cpus(self.stat))
