"""A run of 5 million spans: write it to the run store, load it, analyse it, draw its Gantt.

Each step runs in a fresh process so its peak memory (ru_maxrss) is its own; the reference is the time and
memory of building the same spans as a DataFrame in memory, measured in the same run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.record import Figure

SPANS = int(os.environ.get("PPSCOPE_LOAD_SPANS", 5_000_000))  # a smaller run for a quick check
RANKS = 8

_STEP = r"""
import json, resource, sys, time
from pathlib import Path
from benchmarks.bench_analysis import synthetic_spans
step, run_dir, spans, ranks = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
extra = {}
if step == "build":
    frame = synthetic_spans(spans, ranks)
elif step == "write":
    from ppscope.trace.store import RankWriter, create_run
    from ppscope.trace.model import RunMeta
    frame = synthetic_spans(spans, ranks)
    t0 = time.perf_counter()
    create_run(run_dir, RunMeta(world_size=ranks, pp_size=ranks, schedule="gpipe"))
    for r, part in frame.groupby("rank"):
        w = RankWriter(run_dir, int(r))
        rows = list(part.itertuples(index=False, name=None))
        for i in range(0, len(rows), 100_000):
            w.write(rows[i : i + 100_000])
        w.close()
elif step == "tail":
    from ppscope.trace.store import RunTail
    tail = RunTail(run_dir)
    first = tail.poll()
    t1 = time.perf_counter()
    again_s, again = [], 0
    for _ in range(5):
        t2 = time.perf_counter()
        again += len(tail.poll().spans)
        again_s.append(time.perf_counter() - t2)
    extra = {"again_s": min(again_s), "spans": len(first.spans), "again_spans": again}
else:
    from ppscope.trace.store import load_run
    trace = load_run(run_dir)
    t1 = time.perf_counter()
    if step == "analyze":
        from ppscope.analysis import analyze
        t1 = time.perf_counter()
        res = analyze(trace)
    elif step == "gantt":
        from ppscope.analysis import analyze
        from ppscope.analysis.gantt import gantt_figure
        res = analyze(trace)
        t1 = time.perf_counter()
        view = gantt_figure(trace.spans, gaps=res.gaps, stage_ranks={s.stage: s.ranks for s in res.stages})
        view.figure.to_json()
    t0 = t1 if step != "load" else t0
s = (t1 if step == "tail" else time.perf_counter()) - t0
print(json.dumps({"s": s, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra}))
"""


def _step(step: str, run_dir: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _STEP, step, str(run_dir), str(SPANS), str(RANKS)],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=Path(__file__).resolve().parents[1],
    )
    if out.returncode != 0:
        raise RuntimeError(f"step {step} failed: {out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        ref = _step("build", run_dir)
        got = {step: _step(step, run_dir) for step in ("write", "load", "analyze", "gantt", "tail")}
    build = f"building the {SPANS:,} spans over {RANKS} ranks as a DataFrame"
    what = {
        "write": "write them to the run store (8 rank files, 100k-row batches)",
        "load": "load_run of the whole run",
        "analyze": "analyze() after load_run (analyze alone)",
        "gantt": "Gantt figure, aggregated, gaps shaded, serialised (the figure alone)",
    }
    tail = got.pop("tail")
    figures = []
    for step, r in got.items():
        figures += [
            Figure(f"{what[step]}: time", r["s"], "s", build, ref["s"]),
            Figure(f"{what[step]}: process peak", r["peak_mb"], "MB", build, ref["peak_mb"]),
        ]
    poll = f"live refresh (dashboard): first RunTail.poll(), {tail['spans']:,.0f} spans"
    return [
        *figures,
        Figure(f"{poll}: time", tail["s"], "s", build, ref["s"]),
        Figure(f"{poll}: time", tail["s"], "s", what["load"], got["load"]["s"]),
        Figure(f"{poll}: process peak", tail["peak_mb"], "MB", build, ref["peak_mb"]),
        Figure(
            f"live refresh (dashboard): the next polls, nothing new ({tail['again_spans']:.0f} spans; best of 5)",
            tail["again_s"] * 1e3,
            "ms",
            what["load"],
            got["load"]["s"] * 1e3,
        ),
    ]


if __name__ == "__main__":
    for figure in main():
        print(figure)
