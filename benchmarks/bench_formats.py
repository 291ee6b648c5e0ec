"""nsys import speed on a generated 1-million-row export (targets: <= 5 s, <= 2x), as a ratio to a bare SELECT
of the same rows measured in the same run (median of 3 alternating rounds), and its peak memory against the
imported frame; plus export speed of the imported trace to nsys SQLite and Chrome, and the Kineto import.
"""

from __future__ import annotations

import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.bench_analysis import peak_mb as traced_peak_mb
from benchmarks.record import Figure

ROWS = 1_000_000
PROCESSES = 4
TARGET_S = 5.0
TARGET_RATIO = 2.0
ROUNDS = 3


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter_ns()
    out = fn()
    return (time.perf_counter_ns() - t0) / 1e9, out


def generate(path: Path, rows: int = ROWS, processes: int = PROCESSES, seed: int = 0) -> None:
    """An nsys-shaped file: `rows` kernels (5% NCCL) over `processes` processes/GPUs, one launch per kernel
    in RUNTIME, one NVTX range per 20 kernels, 200 distinct kernel names."""
    from ppscope.formats.nsys.schema import create_tables_sql
    from ppscope.formats.nsys.writer import global_tid

    rng = np.random.default_rng(seed)
    db = sqlite3.connect(path)
    db.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;" + create_tables_sql())
    names = [f"kernel_{i}" for i in range(190)] + [f"ncclDevKernel_SendRecv_{i}" for i in range(10)]
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(names)))
    per = rows // processes
    for p in range(processes):
        pid = 1000 + p
        starts = np.cumsum(rng.integers(2_000, 6_000, per)).astype(np.int64)
        ends = starts + rng.integers(500, 1_900, per)
        name = np.where(rng.random(per) < 0.05, rng.integers(190, 200, per), rng.integers(0, 190, per))
        corr = np.arange(1, per + 1)
        gpid, gtid = global_tid(pid, 0), global_tid(pid, pid)
        zeros = [0] * 12
        db.executemany(
            'INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, "end", deviceId, contextId, streamId, correlationId, '
            "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
            "staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId, "
            "tensorSizeMinusOneElements) VALUES (?, ?, ?, 1, 7, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '')",
            (
                (s, e, p, c, gpid, n, n, *zeros)
                for s, e, c, n in zip(starts.tolist(), ends.tolist(), corr.tolist(), name.tolist(), strict=True)
            ),
        )
        db.executemany(
            'INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, "end", eventClass, globalTid, correlationId, nameId, '
            "returnValue) VALUES (?, ?, 0, ?, ?, 0, 0)",
            ((s - 1_500, s - 1_000, gtid, c) for s, c in zip(starts.tolist(), corr.tolist(), strict=True)),
        )
        db.executemany(
            'INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid, domainId) VALUES (?, ?, 59, ?, ?, 0)',
            ((int(starts[i]) - 2_000, int(ends[i + 19]), f"layer {i // 20}", gtid) for i in range(0, per - 20, 20)),
        )
    db.commit()
    db.close()


def _bare_select(path: Path) -> int:
    """The reference: fetch the rows and columns the importer reads, and nothing else."""
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    kernels = db.execute(
        'SELECT start, "end", deviceId, streamId, globalPid, correlationId, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL'
    ).fetchall()
    nvtx = db.execute(
        'SELECT start, "end", eventType, globalTid, domainId, text, textId, jsonText, category FROM NVTX_EVENTS'
    ).fetchall()
    db.close()
    return len(kernels) + len(nvtx)


KINETO_EVENTS = 300_000


def generate_kineto(path: Path, events: int = KINETO_EVENTS, seed: int = 0) -> None:
    """A gzipped Kineto trace: a third kernels, a third launches, a third CPU ops, 10 ProfilerSteps."""
    import gzip
    import json

    rng = np.random.default_rng(seed)
    n = events // 3
    ts = np.cumsum(rng.integers(5, 50, n)).tolist()
    out = []
    for i, t in enumerate(ts):
        out.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": t,
                "dur": 3,
                "args": {"correlation": i},
            }
        )
        out.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"k{i % 50}",
                "pid": 0,
                "tid": 7,
                "ts": t + 4,
                "dur": 4.5,
                "args": {"correlation": i, "stream": 7},
            }
        )
        out.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 2})
    step = ts[-1] // 10 + 1
    out += [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"ProfilerStep#{k}",
            "pid": 1,
            "tid": 1,
            "ts": k * step,
            "dur": step - 1,
        }
        for k in range(10)
    ]
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": out}
    path.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))


def _json_load(path: Path) -> int:
    import gzip
    import json

    with gzip.open(path, "rb") as f:
        return len(json.load(f)["traceEvents"])


def _nsys_rounds(path: Path) -> tuple[list[float], list[float], int, object]:
    """ROUNDS pairs of (bare SELECT, import), alternating so that both see the same load on the machine."""
    from ppscope.formats.nsys.reader import load_nsys

    refs, loads, n_rows, trace = [], [], 0, None
    for _ in range(ROUNDS):
        ref_s, n_rows = _timed(lambda: _bare_select(path))  # type: ignore[assignment]
        load_s, trace = _timed(lambda: load_nsys(path))
        refs.append(ref_s)
        loads.append(load_s)
    return refs, loads, n_rows, trace


def main() -> list[Figure]:
    from ppscope.formats.chrome.writer import export_chrome
    from ppscope.formats.nsys.reader import load_nsys
    from ppscope.formats.nsys.writer import export_nsys

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.sqlite"
        gen_s, _ = _timed(lambda: generate(path))
        refs, loads, n_rows, trace = _nsys_rounds(path)
        ratios = [load / ref for load, ref in zip(loads, refs, strict=True)]
        ratio, load_s, ref_s = statistics.median(ratios), statistics.median(loads), statistics.median(refs)
        frame_mb = trace.spans.memory_usage(deep=True).sum() / 1e6  # type: ignore[attr-defined]
        peak_mb = traced_peak_mb(lambda: load_nsys(path))
        spans = len(trace.spans)  # type: ignore[attr-defined]
        small = trace.spans.iloc[:100_000]  # type: ignore[attr-defined]
        from ppscope.trace.model import Trace

        part = Trace(spans=small.reset_index(drop=True), meta=trace.meta)  # type: ignore[attr-defined]
        exp_s, _ = _timed(lambda: export_nsys(part, Path(tmp) / "out.sqlite"))
        chrome_s, _ = _timed(lambda: export_chrome(part, Path(tmp) / "out.json.gz"))
        kin = Path(tmp) / "rank0.json.gz"
        generate_kineto(kin)
        kref_s, _ = _timed(lambda: _json_load(kin))
        from ppscope.formats.kineto.reader import load_kineto

        kin_s, ktrace = _timed(lambda: load_kineto([kin]))
    select = f"a bare SELECT of the same {n_rows:,} rows and columns"
    per_100k = f"the bare SELECT per 100,000 of its {ROWS:,} kernels"
    return [
        Figure(
            f"generating the nsys file: {ROWS:,} kernels, as many launches and {n_rows - ROWS:,} NVTX ranges",
            gen_s,
            "s",
        ),
        Figure(
            f"nsys import of {spans:,} spans, read a device at a time (median of {ROUNDS} alternating rounds; ratio: "
            f"the median of theirs, {', '.join(f'{r:.2f}' for r in ratios)})",
            load_s,
            "s",
            select,
            ref_s,
            ratio=ratio,
            target=f"<= {TARGET_S:.0f} s and <= {TARGET_RATIO:.0f}x",
            met=load_s <= TARGET_S and ratio <= TARGET_RATIO,
        ),
        Figure("peak traced memory of the nsys import", peak_mb, "MB", "the imported spans frame", frame_mb),
        Figure("export of 100,000 spans to nsys SQLite", exp_s, "s", per_100k, ref_s * 1e5 / ROWS),
        Figure("export of 100,000 spans to Chrome .json.gz", chrome_s, "s", per_100k, ref_s * 1e5 / ROWS),
        Figure(
            f"Kineto import of {KINETO_EVENTS:,} events (streamed, {len(ktrace.spans):,} spans kept)",  # type: ignore[attr-defined]
            kin_s,
            "s",
            "a plain json.load of the same .gz",
            kref_s,
        ),
    ]


if __name__ == "__main__":
    for figure in main():
        print(figure)
