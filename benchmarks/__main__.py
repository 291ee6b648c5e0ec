"""Run every benchmark of the project and write benchmarks/RESULTS.md.

Each `benchmarks/bench_*.py` module exposes `main() -> list[str]`: result lines whose figures are ratios to
a reference measured in the same run (these machines are shared and noisy; absolute times are context).
`python -m benchmarks [name ...]` runs all of them, or the named ones (e.g. `recorder analysis`).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB memory"
    except (OSError, ValueError, IndexError):
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}, Python {platform.python_version()}, {platform.system()}"


def main(argv: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules([str(HERE)]) if m.name.startswith("bench_"))
    if argv:
        names = [n for n in names if n.removeprefix("bench_") in argv or n in argv]
    sections, failed = [], 0
    for name in names:
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            lines = importlib.import_module(f"benchmarks.{name}").main()
        except Exception:  # a failing benchmark is reported, the others still run
            failed += 1
            lines = ["FAILED:", *traceback.format_exc().splitlines()]
        for line in lines:
            print(f"   {line}", flush=True)
        sections.append((name, time.perf_counter() - t0, lines))
    out = [
        "# Benchmark results",
        "",
        f"Machine: {_machine()}  ",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `make bench`. Every figure is a ratio to, "
        "or sits next to, a reference measured in the same run.",
        "",
    ]
    for name, secs, lines in sections:
        out += [f"## {name.removeprefix('bench_')} ({secs:.0f} s)", "", *[f"- {line}" for line in lines], ""]
    if not argv:
        (HERE / "RESULTS.md").write_text("\n".join(out))
        print(f"wrote {HERE / 'RESULTS.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
