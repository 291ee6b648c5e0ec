"""Run the benchmarks of the project and write their tables into benchmarks/RESULTS.md.

Each `benchmarks/bench_*.py` module exposes `main() -> list[Figure]` (`benchmarks/record.py`): figures that
are ratios to a reference measured in the same run (these machines are shared and noisy; absolute values are
context). `python -m benchmarks` runs all of them; `python -m benchmarks recorder analysis` runs the named
ones and replaces only their tables, keeping the others as they are, each with its own dates and loads. A
benchmark that fails keeps its previous table, and the command exits 1.
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

from benchmarks.record import Figure, table

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"

HEADER = [
    "# Benchmark results",
    "",
    "One table per benchmark, of its current figures. `make bench` (`python -m benchmarks`) runs every benchmark "
    "and rewrites them all; `python -m benchmarks analysis formats` runs the named ones and replaces only their "
    "tables. Every figure is a ratio to a reference measured in the same run: the machines are shared and noisy, "
    "so the ratio is what carries from one run to the next, and the absolute values are context. The ratio is "
    "the value ÷ the reference unless the figure names another; each row gives when it was measured and the "
    "machine's 1-minute load average then (`os.getloadavg()`; – where it was not recorded). Earlier figures are "
    "in the history of this file.",
    "",
]


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


def sections(text: str) -> dict[str, str]:
    """The tables of a RESULTS.md by benchmark name: each `## name` heading and what follows it, as it is."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("## "):
            name = line[3:].split()[0]
            out[name] = ""
        if name is not None:
            out[name] += line + "\n"
    return out


def section(name: str, figures: list[Figure], seconds: float) -> str:
    """One benchmark's table under its heading, with the machine and how long the benchmark took."""
    lines = [f"## {name}", "", f"Machine: {_machine()}; the benchmark took {seconds:.0f} s.", "", *table(figures)]
    return "\n".join(lines) + "\n\n"


def results(old: str, new: dict[str, str]) -> str:
    """RESULTS.md with the `new` sections in place of theirs, the others kept; sections in name order."""
    merged = {**sections(old), **new}
    return (
        "\n".join(HEADER) + "\n" + "".join(merged[n].rstrip("\n") + "\n\n" for n in sorted(merged)).rstrip("\n") + "\n"
    )


def _run(name: str) -> tuple[list[Figure] | None, float]:
    t0 = time.perf_counter()
    print(f"== {name}", flush=True)
    try:
        figures = importlib.import_module(f"benchmarks.bench_{name}").main()
        if not all(isinstance(f, Figure) for f in figures):
            raise TypeError(f"bench_{name}.main() must return a list of benchmarks.record.Figure")
    except Exception:  # a failing benchmark is reported, the others still run
        print("   FAILED:", *traceback.format_exc().splitlines(), sep="\n   ", flush=True)
        return None, time.perf_counter() - t0
    for figure in figures:
        print(f"   {figure}", flush=True)
    return figures, time.perf_counter() - t0


def main(argv: list[str]) -> int:
    names = sorted(
        m.name.removeprefix("bench_") for m in pkgutil.iter_modules([str(HERE)]) if m.name.startswith("bench_")
    )
    if argv:
        wanted = [a.removeprefix("bench_") for a in argv]
        unknown = [a for a in wanted if a not in names]
        if unknown:
            print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(names)}", file=sys.stderr)
            return 2
        names = [n for n in names if n in wanted]
    new, failed = {}, 0
    for name in names:
        figures, seconds = _run(name)
        if figures is None:
            failed += 1
        else:
            new[name] = section(name, figures, seconds)
    old = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    RESULTS.write_text(results(old, new), encoding="utf-8")
    print(f"wrote {RESULTS} ({', '.join(new) or 'no table'} replaced)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
