"""Shared builders for the interop tests: a small pipeline run written through the run store, a
hand-made nsys file, and where the real third-party traces live. No tests here."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest

from ppscope.trace.model import SPAN_COLUMNS, Metric, RankInfo, RunMeta
from ppscope.trace.store import RankWriter, create_run

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MFU = DATA / "nsys" / "mfu_2gpu_after.sqlite"
MOCK = DATA / "nsys" / "mock.sqlite"
KINETO = DATA / "kineto" / "trace_filter"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"real third-party trace {path} is absent (a checkout without ../shared/data)")
    return path


def fingerprint(path: Path) -> tuple[str, int]:
    """Content hash and mtime of a file, or of every file under a directory."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    mtime = 0
    for f in files:
        h.update(f.read_bytes())
        mtime = max(mtime, os.stat(f).st_mtime_ns)
    return h.hexdigest(), mtime


def pipeline_rows(stages: int = 3, mbs: int = 4, t0: int = 1_000_000) -> dict[int, list[tuple[object, ...]]]:
    """Per rank, GPipe-like forward passes with recv_wait / send around them and a step span on top."""
    rows: dict[int, list[tuple[object, ...]]] = {r: [] for r in range(stages)}
    fwd, hop = 9_000, 1_000

    def span(rank: int, kind: str, lane: str, mb: int, start: int, end: int, **kw: object) -> None:
        row = dict.fromkeys(SPAN_COLUMNS)
        row.update(rank=rank, stage=rank, lane=lane, kind=kind, name=kw.get("name", f"s{rank} {kind} mb{mb}"), mb=mb)
        row.update(step=0, chunk=0, phase="prefill", start_ns=start, end_ns=end, nbytes=kw.get("nbytes", 0))
        row.update(tokens=kw.get("tokens", 0), peer=kw.get("peer", -1))
        rows[rank].append(tuple(row.values()))

    for r in range(stages):
        span(r, "step", "host", -1, t0, t0 + (mbs + stages) * (fwd + hop) + 5_000, name="step 0")
    for mb in range(mbs):
        for s in range(stages):
            start = t0 + (mb + s) * (fwd + hop) + 1_000
            if s > 0:
                span(s, "recv_wait", "recv", mb, start - hop - 300, start, peer=s - 1, nbytes=8192)
            span(s, "forward", "compute", mb, start, start + fwd - (s == 1) * 3_000 * 0, tokens=16)
            if s < stages - 1:
                span(s, "send", "send", mb, start + fwd, start + fwd + hop - 1, peer=s + 1, nbytes=8192)
    span(0, "mark", "host", -1, t0 + 5, t0 + 5, name="warmup done")
    return rows


def make_run(run_dir: Path, stages: int = 3, mbs: int = 4) -> Path:
    meta = RunMeta(
        run_id="interop",
        world_size=stages,
        pp_size=stages,
        schedule="gpipe",
        microbatches=mbs,
        backend="gloo",
        split=[2] * stages,
        ranks=[RankInfo(rank=r, stage=r, device="cpu", pid=4000 + r) for r in range(stages)],
        status="finished",
        created_unix_ns=1_700_000_000_000_000_000,
    )
    create_run(run_dir, meta)
    for rank, rows in pipeline_rows(stages, mbs).items():
        w = RankWriter(run_dir, rank)
        counters = [(1_000_000 + i * 10_000, rank, -1, str(Metric.CPU_UTIL_PCT), 50.0 + i) for i in range(5)]
        w.write(rows, counters)
        w.close()
    return run_dir


def tiny_nsys(path: Path, *, kernels: bool = True, extra_column: bool = False, negative: bool = False) -> Path:
    """A minimal nsys-shaped file: StringIds, two processes on devices 0 and 1, NCCL NVTX ranges."""
    db = sqlite3.connect(path)
    extra = ", futureColumn TEXT" if extra_column else ""
    db.executescript(
        """
        CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
            text TEXT, globalTid INTEGER, textId INTEGER, domainId INTEGER);
        CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
        INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.25.0');
        INSERT INTO StringIds VALUES (1, 'gemm_kernel'), (2, 'ncclDevKernel_SendRecv'), (3, 'ncclSend'),
            (4, 'ncclRecv');
        """
        + (
            f"""CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
            demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL{extra});"""
            if kernels
            else ""
        )
    )
    base = -50_000 if negative else 10_000
    gpid = {100: (1 << 48) | (100 << 24), 200: (1 << 48) | (200 << 24)}
    # Device 1's process (pid 200) sends first and device 0's process receives: stage 0 is pid 200.
    nvtx = [
        (base + 100, base + 200, 59, None, gpid[200] | 200, 3, 1),
        (base + 150, base + 260, 59, None, gpid[100] | 100, 4, 1),
        (base + 5_000, base + 5_100, 59, "later op", gpid[100] | 100, None, 0),
    ]
    db.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, ?, ?)", nvtx)
    if kernels:
        rows = []
        for pid, dev in ((100, 0), (200, 1)):
            for i in range(3):
                s = base + 1_000 * i
                rows.append((s, s + 400, dev, 7, i + 1, gpid[pid], 1, 1))
            rows.append((base + 300, base + 900, dev, 9, 10, gpid[pid], 2, 2))
        cols = 8 + (1 if extra_column else 0)
        db.executemany(
            f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ({', '.join('?' * cols)})",
            [r + (("x",) if extra_column else ()) for r in rows],
        )
    db.commit()
    db.close()
    return path
