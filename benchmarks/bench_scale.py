"""A job of many ranks analysed a rank at a time (`ppscope analyze --workers N`): time and peak memory against
a bare SQLite SELECT of the same rows, measured in the same run; and `ppscope rebalance RUN` read a rank at a
time against the same costs from the whole run loaded (`load_run`), with the same JSON; and `ppscope export RUN
--format nsys-sqlite` and `--format chrome` written a rank at a time against the export of the whole run loaded;
and the dashboard's data step on a job of data-parallel pipelines (its stage view and one rank's lanes, read a rank
at a time) against the same view from the whole run loaded, as the dashboard loads a small run, and the same for
the data of its Rebalance, GPU usage and Requests pages.

The job: RANKS ranks of SPANS spans each (256 × 100 k = 25.6 M spans by default), written by the run store's
writer, one pipeline stage per rank. Each step runs in a fresh process so its peak memory is its own (with
workers, the largest of the parent and its workers; the driver's own beside it), and its CPU time (the
process and its workers: on a shared machine, less swayed by other jobs than the time). The whole-trace
`analyze(load_run(...))` runs only where the job fits comfortably in memory (≤ 5 M spans). The same job at a
tenth of the ranks shows how time scales, and says what the driver receives from its tasks: each result
pickled (as a worker process or a Ray task sends it back), in a run of its own so that the pickling is not
timed. Set PPSCOPE_SCALE_RANKS and PPSCOPE_SCALE_SPANS for a smaller check. The dashboard's job is its own:
DASH_REPLICAS pipelines of DASH_STAGES stages, DASH_SPANS spans a rank (PPSCOPE_SCALE_DASH="R,P,S" to change).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.record import Figure

RANKS = int(os.environ.get("PPSCOPE_SCALE_RANKS", 256))
SPANS = int(os.environ.get("PPSCOPE_SCALE_SPANS", 100_000))
WHOLE_LIMIT = 5_000_000
DASH_REPLICAS, DASH_STAGES, DASH_SPANS = map(int, os.environ.get("PPSCOPE_SCALE_DASH", "16,8,20000").split(","))
GPU_SAMPLES, REQUESTS = 2_000, 5_000

_STEP = r"""
import json, resource, sqlite3, sys, time
from pathlib import Path
step, run_dir, ranks, spans = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
extra = {}
if step.startswith("write"):
    from benchmarks.bench_scale import write_job
    write_job(run_dir, ranks, spans, replicas=int(step.split(":")[1]) if ":" in step else 1)
elif step.startswith("dash"):
    from benchmarks.bench_scale import dashboard_step
    extra = dashboard_step(run_dir, whole=step == "dash-whole")
elif step.startswith("pages"):
    from benchmarks.bench_scale import pages_step
    extra = pages_step(run_dir, whole=step == "pages-whole")
elif step == "select":
    rows = 0
    for f in sorted(run_dir.glob("rank-*.sqlite")):
        db = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        rows += len(db.execute("SELECT * FROM spans").fetchall())
        db.close()
    extra = {"rows": rows}
elif step == "whole":
    from ppscope.analysis import analyze
    from ppscope.trace.store import load_run
    res = analyze(load_run(run_dir))
    extra = {"bubble": res.bubble_ratio}
elif step.startswith("rebalance"):
    import contextlib, hashlib, io
    from ppscope.balance.measured import timings
    from ppscope.cli.main import main
    from ppscope.trace.store import load_run
    if step == "rebalance-whole":  # as before: the whole run in memory, then its timings
        timings.run_timings = lambda path, workers=1: timings.RunTimings.of(load_run(path))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["rebalance", str(run_dir), "--json", "--workers", step.split(":")[1] if ":" in step else "1"])
    extra = {"json": hashlib.sha256(out.getvalue().encode()).hexdigest()[:16]}
elif step.startswith("export"):
    import hashlib, sqlite3
    from ppscope.formats import export_run, export_trace
    from ppscope.trace.store import load_run
    chrome = step.startswith("export-chrome")
    fmt, out = ("chrome", "json") if chrome else ("nsys-sqlite", "sqlite")
    out = run_dir.parent / f"{step}.{out}"
    if step.endswith("-whole"):
        export_trace(load_run(run_dir), fmt, out)
    else:
        export_run(run_dir, fmt, out)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the check below reads it back
    digest = hashlib.sha256()
    if chrome:
        with open(out, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    else:
        db = sqlite3.connect(out)
        for row in db.execute("SELECT * FROM NVTX_EVENTS ORDER BY rowid"):
            digest.update(repr(row).encode())
        db.close()
    out.unlink()
    extra = {"json": digest.hexdigest()[:16], "peak_mb": peak_mb}
elif step == "bytes":
    import pickle
    import ppscope.analysis.sharded as sharded
    real, got = sharded.ordered, {"digest_bytes": 0, "stage_bytes": 0, "stage_tasks": 0, "largest_stage": 0}
    def counting(pool, fn, jobs, width):
        for out in real(pool, fn, jobs, width):
            n = len(pickle.dumps(out))
            kind = "stage" if fn is sharded._stage else "digest"
            got[f"{kind}_bytes"] += n
            if kind == "stage":
                got["stage_tasks"] += 1
                got["largest_stage"] = max(got["largest_stage"], n)
            yield out
    sharded.ordered = counting
    res = sharded.analyze_run(run_dir, workers=1, gaps=False)
    extra = {"bubble": res.bubble_ratio, **got}
elif step == "ray":
    from ppscope.analysis.sharded import analyze_run
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    t0 = time.perf_counter()  # the instance's start is not the analysis
    res = analyze_run(run_dir, ray="local", gaps=False)
    extra = {"bubble": res.bubble_ratio}
else:
    from ppscope.analysis.sharded import analyze_run
    res = analyze_run(run_dir, workers=int(step), gaps=False)  # as the command: nothing to draw
    extra = {"bubble": res.bubble_ratio}
s = time.perf_counter() - t0
peak = max(resource.getrusage(r).ru_maxrss for r in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024
driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
cpu = sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
print(json.dumps({"s": s, "cpu_s": cpu, "peak_mb": peak, "driver_mb": driver, **extra}))  # an export's peak wins
"""


def write_job(run_dir: Path, ranks: int, spans: int, replicas: int = 1) -> None:
    """`ranks` ranks in `replicas` pipelines (rank = replica × stages + stage, each rank's replica in the
    metadata when there are several), `spans` spans each (a recv_wait, a recv, a forward and a send per
    micro-batch, one rank slower), written rank by rank with the run store's writer; two layers a stage."""
    import numpy as np

    from ppscope.trace.model import RankInfo, RunMeta
    from ppscope.trace.store import RankWriter, create_run, write_meta

    p = ranks // replicas
    infos = [RankInfo(rank=r, stage=r % p, replica=r // p) for r in range(ranks)] if replicas > 1 else []
    meta = RunMeta(world_size=ranks, pp_size=p, schedule="gpipe", microbatches=spans // 4, split=[2] * p, ranks=infos)
    create_run(run_dir, meta)
    per = spans // 4
    for r in range(ranks):
        rng = np.random.default_rng(r)
        mb = np.arange(per)
        stage = r % p
        slot = (mb + stage) * 13_000 + rng.integers(0, 500, per)
        wait_end = slot + 1_000
        fwd_start = wait_end + 400
        fwd_end = fwd_start + 10_000 + 2_000 * (r == ranks // 2) + rng.integers(0, 300, per)
        rows = []
        for kind, lane, start, end, peer in (
            ("recv_wait", "recv", slot, wait_end, r - 1 if stage > 0 else -1),
            ("recv", "recv", wait_end, fwd_start, r - 1 if stage > 0 else -1),
            ("forward", "compute", fwd_start, fwd_end, -1),
            ("send", "send", fwd_end, fwd_end + 200, r + 1 if stage + 1 < p else -1),
        ):
            nbytes = 0 if kind == "forward" else 4096
            rows += [
                (r, stage, lane, kind, kind, int(m), -1, 0, "", int(a), int(b), nbytes, 0, peer)
                for m, a, b in zip(mb, start, end, strict=True)
            ]
        rows.sort(key=lambda row: row[9])
        w = RankWriter(run_dir, r)
        for i in range(0, len(rows), 100_000):
            w.write(rows[i : i + 100_000])
        w.close()
    if replicas > 1:  # the dashboard shows a finished run a rank at a time
        _usage_and_requests(run_dir, ranks, per * 13_000)
        write_meta(run_dir, dataclasses.replace(meta, status="finished"))


def _usage_and_requests(run_dir: Path, ranks: int, length_ns: int) -> None:
    """What the dashboard's GPU usage and Requests pages read: GPU_SAMPLES samples of utilisation and memory per
    rank over the run (appended to each rank file, as the engine's sampler writes them beside the spans), and
    REQUESTS requests in requests.jsonl."""
    import sqlite3

    from ppscope.trace.model import Metric
    from ppscope.trace.store import REQUESTS_FILE, rank_file

    for r in range(ranks):
        rows = [
            (t * length_ns // GPU_SAMPLES, r, r % 8, str(metric), value)
            for t in range(GPU_SAMPLES)
            for metric, value in (
                (Metric.GPU_UTIL_PCT, float(50 + (r * 7 + t) % 50)),
                (Metric.GPU_MEM_USED_BYTES, float(2**30 + r * 2**20 + t)),
            )
        ]
        db = sqlite3.connect(rank_file(run_dir, r))
        with db:
            db.executemany("INSERT INTO counters (ts_ns, rank, device, metric, value) VALUES (?, ?, ?, ?, ?)", rows)
        db.close()
    with open(run_dir / REQUESTS_FILE, "w") as f:
        for i in range(REQUESTS):
            arrival = i * length_ns // REQUESTS
            f.write(
                json.dumps(
                    {
                        "id": i,
                        "prompt_len": 16,
                        "output_len": 8 + i % 9,
                        "arrival_ns": arrival,
                        "first_token_ns": arrival + 5_000_000 + i % 997 * 1_000,
                        "finish_ns": arrival + 20_000_000 + i % 991 * 3_000,
                    }
                )
                + "\n"
            )


def dashboard_step(run_dir: Path, *, whole: bool) -> dict[str, float | str]:
    """The dashboard's data for the timeline of a job of replicas: its stage view, then one rank's lanes (the
    straggler's), read a rank at a time (`RankedRun`) or from the whole run loaded (`LiveTrace`, as a run within
    --ranks-in-memory is). Returns the lanes' span counts and a hash of them, to check both paths agree."""
    import hashlib

    import pandas as pd

    from ppscope.analysis.replica_report import stage_lanes
    from ppscope.dashboard import views  # both paths: the app imports it (and Streamlit) either way

    if whole:
        from ppscope.dashboard.data import LiveTrace

        live = LiveTrace(run_dir, is_run=True)
        spans = live.refresh().spans
        ra, placement = views.replicas(live)
        assert ra is not None and placement is not None
        lanes = stage_lanes(spans, ra, placement)
        straggler = max(ra.stages, key=lambda s: s.slowdown or 0).straggler_rank
        mine = spans[spans["rank"].to_numpy() == straggler].reset_index(drop=True)
    else:
        from ppscope.dashboard.ranked import RankedRun

        big = RankedRun.open(run_dir, limit=0)
        assert big is not None
        ra = big.replicas().analysis
        assert ra is not None
        lanes = big.stage_spans()
        straggler = max(ra.stages, key=lambda s: s.slowdown or 0).straggler_rank
        mine = big.rank_spans(straggler)
    digest = hashlib.sha256(pd.util.hash_pandas_object(lanes.reset_index(drop=True)).to_numpy().tobytes())
    digest.update(pd.util.hash_pandas_object(mine).to_numpy().tobytes())
    return {"lanes": len(lanes), "rank": len(mine), "json": digest.hexdigest()[:16]}


def pages_step(run_dir: Path, *, whole: bool) -> dict[str, Any]:
    """The data of the dashboard's Rebalance, GPU usage and Requests pages of a job of replicas (the advice, the
    usage per stage and per replica and the straggler's counters, the request latency), read a rank at a time
    (`RankedRun`) or from the whole run loaded (`LiveTrace`). The replicas' analysis, which the Timeline makes
    first on either path, is left out. Returns a hash of the figures, to check both paths agree."""
    import hashlib

    import pandas as pd

    from ppscope.analysis.analyzer import run_latency
    from ppscope.dashboard.advice import advice_for
    from ppscope.dashboard.charts import usage_rows, usage_tables

    if whole:
        from ppscope.analysis.placement import placement_of
        from ppscope.dashboard.data import LiveTrace

        trace = LiveTrace(run_dir, is_run=True).refresh()
        placement = placement_of(trace)
        got, problem = advice_for(trace, None)
        rows = usage_rows(trace.counters)
        counters = trace.counters[trace.counters["rank"].to_numpy() == DASH_STAGES // 2].reset_index(drop=True)
        latency = run_latency(trace.requests, trace.meta)
    else:
        from ppscope.analysis.placement import placement_from
        from ppscope.dashboard.ranked import RankedRun

        big = RankedRun.open(run_dir, limit=0)
        assert big is not None
        placement = placement_from(big.meta, big.files)
        got, problem = advice_for(big.timings(), None)
        rows, _ = big.usage()
        counters = big.rank_counters(DASH_STAGES // 2)
        latency = run_latency(big.requests(), big.meta)
    assert placement is not None and latency is not None
    advice = problem if got is None else got.to_json()
    digest = hashlib.sha256(repr((advice, usage_tables(rows, placement.place), latency.ttft, latency.tpot)).encode())
    digest.update(pd.util.hash_pandas_object(counters).to_numpy().tobytes())
    return {"samples": len(counters), "requests": latency.requests, "json": digest.hexdigest()[:16]}


def _dashboard() -> list[Figure]:
    ranks = DASH_REPLICAS * DASH_STAGES
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        write = _step(f"write:{DASH_REPLICAS}", run_dir, ranks, DASH_SPANS)
        ranked, whole = _step("dash", run_dir, ranks, DASH_SPANS), _step("dash-whole", run_dir, ranks, DASH_SPANS)
        pages, pages_whole = (_step(s, run_dir, ranks, DASH_SPANS) for s in ("pages", "pages-whole"))
    job = (
        f"dashboard, {DASH_REPLICAS} pipelines x {DASH_STAGES} stages ({ranks * DASH_SPANS:,} spans, written in "
        f"{write['s']:.0f} s)"
    )
    view = f"{job}: the stage view and one rank's lanes, a rank at a time"
    data = (
        f"{job}: the Rebalance, GPU usage and Requests pages' data ({GPU_SAMPLES:,} x 2 GPU samples a rank, "
        f"{REQUESTS:,} requests), a rank at a time"
    )
    loaded = "the same from the whole run loaded"
    return [
        Figure(f"{view}: time", ranked["s"], "s", loaded, whole["s"]),
        Figure(f"{view}: peak", ranked["peak_mb"], "MB", loaded, whole["peak_mb"]),
        _same(
            f"{view}: the same lanes both ways ({ranked['lanes']:,.0f} + {ranked['rank']:,.0f} spans)",
            ranked["json"] == whole["json"],
        ),
        Figure(f"{data}: time", pages["s"], "s", loaded, pages_whole["s"]),
        Figure(f"{data}: peak", pages["peak_mb"], "MB", loaded, pages_whole["peak_mb"]),
        _same(f"{data}: the same figures both ways", pages["json"] == pages_whole["json"]),
    ]


def _same(what: str, same: bool) -> Figure:
    return Figure(what, "yes" if same else "no", target="yes", met=same)


def _step(step: str, run_dir: Path, ranks: int, spans: int = SPANS) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _STEP, step, str(run_dir), str(ranks), str(spans)],
        capture_output=True,
        text=True,
        timeout=7200,
        cwd=Path(__file__).resolve().parents[1],
    )
    if out.returncode != 0:
        raise RuntimeError(f"step {step} failed: {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _has_ray() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def _job(ranks: int, *, sizes: bool = False) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        got = {"write": _step("write", run_dir, ranks), "select": _step("select", run_dir, ranks)}
        whole = (
            ("whole", "rebalance-whole", "export-whole", "export-chrome-whole") if ranks * SPANS <= WHOLE_LIMIT else ()
        )
        steps = ("1", "2", "rebalance", "rebalance:2", "export", "export-chrome", *whole)
        steps += ("ray",) if _has_ray() else ()
        steps += ("bytes",) if sizes else ()
        for step in steps:
            got[step] = _step(step, run_dir, ranks)
    return got


def _path_figures(big: dict[str, Any], select: str) -> list[Figure]:
    """Time and peak memory of every path through the big job, against a bare SELECT of its spans."""
    ref = big["select"]
    figures = []
    for step, what in (("1", "analyze --workers 1"), ("2", "analyze --workers 2"), ("whole", "analyze (whole)")):
        if step in big:
            r = big[step]
            figures += [
                Figure(f"{what}: time", r["s"], "s", select, ref["s"]),
                Figure(f"{what}: CPU time, the process and its workers", r["cpu_s"], "s", select, ref["cpu_s"]),
                Figure(
                    f"{what}: peak (the driver's own {r['driver_mb']:,.0f} MB)",
                    r["peak_mb"],
                    "MB",
                    select,
                    ref["peak_mb"],
                ),
            ]
    if "ray" in big:
        r = big["ray"]
        ray = "analyze --ray local (2 CPUs, the instance's start left out)"
        figures += [
            Figure(f"{ray}: time", r["s"], "s", select, ref["s"]),
            Figure(f"{ray}: time", r["s"], "s", "analyze --workers 2", big["2"]["s"]),
            Figure(
                f"{ray}: the driver's peak (Ray's workers are not its children)",
                r["peak_mb"],
                "MB",
                select,
                ref["peak_mb"],
            ),
        ]
    for step, what in (
        ("rebalance", "rebalance (rank by rank)"),
        ("rebalance:2", "rebalance --workers 2"),
        ("rebalance-whole", "rebalance (the whole run loaded)"),
        ("export", "export nsys-sqlite (rank by rank)"),
        ("export-whole", "export nsys-sqlite (the whole run loaded)"),
        ("export-chrome", "export chrome, a .json (rank by rank)"),
        ("export-chrome-whole", "export chrome, a .json (the whole run loaded)"),
    ):
        if step in big:
            r = big[step]
            figures += [
                Figure(f"{what}: time", r["s"], "s", select, ref["s"]),
                Figure(f"{what}: peak", r["peak_mb"], "MB", select, ref["peak_mb"]),
            ]
    return figures


def _agreement(big: dict[str, Any]) -> list[Figure]:
    """Whether every path gives the same answer: rebalance's JSON, export's rows and bytes, the bubble ratio."""
    jsons = {big[s]["json"] for s in ("rebalance", "rebalance:2", "rebalance-whole") if s in big}
    rows = {big[s]["json"] for s in ("export", "export-whole") if s in big}
    chrome = {big[s]["json"] for s in ("export-chrome", "export-chrome-whole") if s in big}
    same = {big[s]["bubble"] for s in ("1", "2", "whole", "ray") if s in big}
    return [
        _same("rebalance --json the same on every path", len(jsons) == 1),
        _same("export's NVTX rows the same on both paths", len(rows) == 1),
        _same("export's Chrome JSON the same bytes on both paths", len(chrome) == 1),
        _same(f"bubble ratio the same on every path ({', '.join(map(str, same))})", len(same) == 1),
    ]


def main() -> list[Figure]:
    small_ranks = max(2, RANKS // 10)
    big, small = _job(RANKS), _job(small_ranks, sizes=True)
    select = (
        f"a bare SELECT of every span row of the {RANKS} rank files ({RANKS * SPANS:,} spans, written in "
        f"{big['write']['s']:.0f} s)"
    )
    b = small["bytes"]
    sent = f"what the driver receives, pickled, from the {small_ranks}-rank job's tasks ({small_ranks * SPANS:,} spans)"
    figures = [
        *_path_figures(big, select),
        *_agreement(big),
        Figure(
            f"{sent}: digests ({b['digest_bytes'] / small_ranks / 1e3:,.2f} kB a rank)", b["digest_bytes"] / 1e3, "kB"
        ),
        Figure(
            f"{sent}: from its {b['stage_tasks']:.0f} stage tasks (the largest {b['largest_stage'] / 1e3:,.1f} kB)",
            b["stage_bytes"] / 1e3,
            "kB",
        ),
    ]
    for workers in ("2", "1"):
        figures.append(
            Figure(
                f"analyze --workers {workers}: time at {RANKS} ranks ({RANKS / small_ranks:.1f}x the spans)",
                big[workers]["s"],
                "s",
                f"the same at {small_ranks} ranks",
                small[workers]["s"],
            )
        )
    return figures + _dashboard()


if __name__ == "__main__":
    for figure in main():
        print(figure)
