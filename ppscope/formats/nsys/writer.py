"""Write a Trace as an `nsys export --type sqlite` file that Nsight-based readers open.

Every span becomes an NVTX range of the `ppscope` domain (push/pop, eventType 59, message like
`s2 forward mb5`, payload = micro-batch, the remaining fields as JSON in `jsonText`) on one thread per
lane. Because readers attach NVTX ranges to GPUs through kernel launches, every compute and
communication span also gets a CUDA runtime launch row on its thread and a kernel row with the same
times on its rank's device and the lane's stream. Correlation ids are unique in the whole file, so they
are unique per process as the format requires and readers that join on correlationId alone still work.
The importer recognises these files and reads the NVTX ranges back, not the shadow kernels.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ppscope import __version__
from ppscope.errors import CorruptFileError
from ppscope.formats.nesting import nests
from ppscope.formats.nsys.schema import ENUM_ROWS, EXPORT_SCHEMA_VERSION, TABLES, create_tables_sql
from ppscope.formats.nsys.tables import PPSCOPE_DOMAIN
from ppscope.trace.model import COMM_KINDS, COMPUTE_KINDS, RunMeta, SpanKind, Trace, lane_of
from ppscope.trace.outputs import atomic_file
from ppscope.trace.recorder import KIND_COLORS
from ppscope.trace.store import damaged_note, each_rank, read_rank_spans, run_files

__all__ = ["STREAM_OF_LANE", "export_nsys", "export_nsys_run", "global_tid", "ppscope_message"]

STREAM_OF_LANE = {"compute": 7, "send": 13, "recv": 14, "host": 15}
"""CUDA stream id written for each of our lanes (other lanes get 20, 21, ...)."""
_VM_ID = 1
_DOMAIN_ID = 1
_LAUNCH = "cudaLaunchKernel_v7000"
_KIND_INDEX = {str(k): i + 1 for i, k in enumerate(SpanKind)}
_SHADOW_KINDS = COMPUTE_KINDS | COMM_KINDS
_NO_SPANS = Trace().spans


def global_tid(pid: int, tid: int, *, hw_id: int = 0, vm_id: int = _VM_ID) -> int:
    """nsys GlobalId of a thread: (hwId<<56)|(vmId<<48)|(pid<<24)|tid."""
    return (hw_id << 56) | (vm_id << 48) | ((pid & 0xFFFFFF) << 24) | (tid & 0xFFFFFF)


def ppscope_message(stage: int, kind: str, mb: int, chunk: int) -> str:
    """The NVTX message the recorder writes for a span: `s2 forward mb5` (+ ` c1` for chunk 1)."""
    return f"s{stage} {kind}" + (f" mb{mb}" if mb >= 0 else "") + (f" c{chunk}" if chunk else "")


@dataclass(frozen=True)
class _Ranks:
    """What the file needs of every rank before any is written: which ranks have spans, each one's first
    stage, the first start and the last end; and how to read one rank's spans (in the trace's order)."""

    ranks: list[int]
    first_stage: dict[int, int]
    t0: int
    t1: int
    spans_of: Callable[[int], pd.DataFrame]

    @classmethod
    def of(cls, spans: pd.DataFrame, spans_of: Callable[[int], pd.DataFrame]) -> _Ranks:
        first = spans[spans["stage"] >= 0].groupby("rank")["stage"].min()
        t0 = int(spans["start_ns"].min()) if len(spans) else 0
        t1 = int(spans["end_ns"].max()) if len(spans) else 0
        ranks = sorted(int(r) for r in spans["rank"].unique())
        return cls(ranks, {int(r): int(s) for r, s in first.items()}, t0, t1, spans_of)


def export_nsys(trace: Trace, out: str | Path, *, force: bool = False) -> Path:
    """Write `trace` to `out` as nsys SQLite. Refuses an existing file unless `force`."""
    spans = trace.spans
    return _export(trace.meta, _Ranks.of(spans, lambda rank: spans[spans["rank"] == rank]), out, force)


def export_nsys_run(run_dir: str | Path, out: str | Path, *, force: bool = False) -> Path:
    """`export_nsys(load_run(run_dir))`, the same tables row for row, reading one rank file at a time: once
    for what the file needs of every rank (`_Ranks`), once to write its rows. Memory holds one rank's spans
    and rows. A damaged rank file is left out and named on stderr, as `load_run` does."""
    meta, files, notes = run_files(run_dir)
    parts: list[tuple[int, int, int, int]] = []
    damaged: dict[int, CorruptFileError] = {}
    for rank, spans, _ in each_rank(files, meta, damaged, notes):
        if len(spans):
            stages = spans.loc[spans["stage"] >= 0, "stage"]
            first = int(stages.min()) if len(stages) else -1
            parts.append((rank, first, int(spans["start_ns"].min()), int(spans["end_ns"].max())))
    if damaged and not parts:
        raise next(iter(damaged.values()))
    for note in notes + [damaged_note(r, why) for r, why in sorted(damaged.items())]:
        print(f"ppscope export: note: {note}", file=sys.stderr)
    ends = pd.DataFrame(parts, columns=["rank", "stage", "start_ns", "end_ns"], dtype="int64")
    ranks = _Ranks.of(ends, lambda rank: read_rank_spans(files, [rank], meta)[0])
    return _export(meta, ranks, out, force)


def _export(meta: RunMeta, ranks: _Ranks, out: str | Path, force: bool) -> Path:
    with atomic_file(out, force=force) as tmp:
        db = sqlite3.connect(tmp, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=OFF")
            db.execute("PRAGMA synchronous=OFF")
            db.executescript(create_tables_sql())
            db.execute("BEGIN")
            _Writer(db, meta, ranks).write()
            db.execute("COMMIT")
        finally:
            db.close()
    return Path(out)


def _insert(db: sqlite3.Connection, table: str, rows: list[tuple[Any, ...]] | Iterator[tuple[Any, ...]]) -> None:
    """Rows fill the table's leading columns in declaration order; the rest stay NULL."""
    rows = list(rows)
    if not rows:
        return
    cols = [c for c, _, _ in TABLES[table]] if table in TABLES else ["id", "name", "label"]
    cols = cols[: len(rows[0])]
    names = ", ".join(f'"{c}"' for c in cols)
    db.executemany(f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(cols))})", rows)


_NVTX_INSERT = (
    'INSERT INTO NVTX_EVENTS (start, "end", eventType, category, color, text, globalTid, domainId, int64Value, '
    "jsonText) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_RUNTIME_INSERT = (
    'INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, "end", eventClass, globalTid, correlationId, nameId, '
    "returnValue) VALUES (?, ?, 0, ?, ?, ?, 0)"
)
# Constant columns are SQL literals: a kernel row binds only what varies. gridId = correlationId.
_KERNEL_INSERT = (
    'INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, "end", deviceId, contextId, streamId, correlationId, globalPid, '
    "demangledName, shortName, launchType, cacheConfig, registersPerThread, gridX, gridY, gridZ, blockX, blockY, "
    "blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId, "
    "sharedMemoryLimitConfig, tensorSizeMinusOneElements) "
    "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, ?, 0, '')"
)


def _insert_sql(db: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
    db.executemany(sql, rows)


class _Writer:
    """Writes the tables rank by rank: only one rank's spans and rows are held at a time."""

    def __init__(self, db: sqlite3.Connection, meta: RunMeta, spans: _Ranks) -> None:
        self.db = db
        self.meta = meta
        self.source = spans
        self.strings: dict[str, int] = {}
        self.corr = 0
        ranks = sorted(set(spans.ranks) | {i.rank for i in meta.ranks})
        self.ranks = ranks
        self.pid_of = self._pids(ranks)
        self.device_of, self.device_note = self._devices(ranks)

    def string(self, value: str) -> int:
        sid = self.strings.get(value)
        if sid is None:
            sid = self.strings[value] = len(self.strings)
        return sid

    def _pids(self, ranks: list[int]) -> dict[int, int]:
        known = {i.rank: i.pid for i in self.meta.ranks if 0 < i.pid < 0xFFFFFF}
        if len(set(known.values())) == len(known) and set(known) >= set(ranks):
            return {r: known[r] for r in ranks}
        return {r: 1000 + i for i, r in enumerate(ranks)}

    def _devices(self, ranks: list[int]) -> tuple[dict[int, int], str]:
        stage = {i.rank: i.stage for i in self.meta.ranks if i.stage >= 0}
        first = self.source.first_stage
        for r in ranks:
            if r not in stage and r in first:
                stage[r] = first[r]
        on_cpu = self._on_cpu()
        if set(stage) >= set(ranks) and len({stage[r] for r in ranks}) == len(ranks):
            what = (
                "CPU run: there is no GPU, deviceId is the rank's pipeline stage"
                if on_cpu
                else ("deviceId is the rank's pipeline stage (one GPU per stage)")
            )
            return {r: stage[r] for r in ranks}, what
        what = "CPU run: there is no GPU, deviceId is the rank" if on_cpu else "deviceId is the rank (one GPU each)"
        return {r: i for i, r in enumerate(ranks)}, what

    def _on_cpu(self) -> bool:
        meta = self.meta
        devices = {i.device.lower() for i in meta.ranks}
        if devices - {"", "cpu"}:  # a GPU named: gloo may carry a GPU's activations too (`--device cuda`)
            return False
        return bool(devices) or meta.backend == "gloo"

    def write(self) -> None:
        t0, t1 = self.source.t0, self.source.t1
        launch = self.string(_LAUNCH)
        lanes = {}
        for rank in self.ranks:
            spans = self.source.spans_of(rank) if rank in self.source.ranks else _NO_SPANS
            lanes[rank] = self._lanes(spans, rank)
            self._nvtx_and_kernels(spans, rank, lanes[rank], t0, launch)
        self._processes(lanes)
        self._session(t0, t1)
        _insert(self.db, "StringIds", ((i, s) for s, i in self.strings.items()))
        for table, rows in ENUM_ROWS.items():
            _insert(self.db, table, rows)

    def _lanes(self, spans: pd.DataFrame, rank: int) -> dict[str, int]:
        """lane -> tid for one rank; the compute lane (or the first) is the main thread (tid = pid)."""
        names = sorted(set(spans["lane"]), key=lambda n: (n != "compute", n))
        pid = self.pid_of[rank]
        return {lane: (pid + i) & 0xFFFFFF for i, lane in enumerate(names or ["compute"])}

    def _stream(self, lane: str, lanes: dict[str, int]) -> int:
        if lane in STREAM_OF_LANE:
            return STREAM_OF_LANE[lane]
        others = [n for n in lanes if n not in STREAM_OF_LANE]
        return 20 + others.index(lane)

    def _nvtx_and_kernels(self, rows: pd.DataFrame, rank: int, lanes: dict[str, int], t0: int, launch: int) -> None:
        """One rank's NVTX ranges, launches and kernels, in the order the whole trace gives them."""
        nvtx: list[tuple[Any, ...]] = []
        runtime: list[tuple[Any, ...]] = []
        kernels: list[tuple[Any, ...]] = []
        corr = self.corr
        pid = self.pid_of[rank]
        nvtx.append((t0, None, 75, None, None, PPSCOPE_DOMAIN, global_tid(pid, pid), _DOMAIN_ID, None, None))
        device, gpid = self.device_of[rank], global_tid(pid, 0)
        for lane, group in rows.groupby("lane", sort=False):
            gtid = global_tid(pid, lanes[str(lane)])
            starts, ends = group["start_ns"].to_numpy(), group["end_ns"].to_numpy()
            event = 59 if nests(starts, ends) else 60
            stream = self._stream(str(lane), lanes)
            cols = {c: group[c].tolist() for c in group.columns}
            for i, (start, end, kind) in enumerate(zip(cols["start_ns"], cols["end_ns"], cols["kind"], strict=True)):
                message = ppscope_message(cols["stage"][i], kind, cols["mb"][i], cols["chunk"][i])
                mb = cols["mb"][i]
                mark = kind == SpanKind.MARK
                nvtx.append(
                    (
                        start,
                        None if mark else end,
                        34 if mark else event,
                        _KIND_INDEX.get(kind, 0),
                        KIND_COLORS.get(kind, 0xFF888888),
                        message,
                        gtid,
                        _DOMAIN_ID,
                        mb if mb >= 0 else None,
                        _extras(cols, i, message, str(lane)),
                    )
                )
                if kind in _SHADOW_KINDS:
                    corr += 1
                    # The launch sits at the start of the span, inside it, as a real launch sits inside
                    # its NVTX range; the kernel has the span's own times.
                    runtime.append((start, start + min(max(end - start, 0), 1_000), gtid, corr, launch))
                    short = self.string(f"ppscope_{kind}")
                    demangled = self.string(f"ppscope::{kind}({message})")
                    kernels.append((start, end, device, stream, corr, gpid, demangled, short, corr))
        self.corr = corr
        _insert_sql(self.db, _NVTX_INSERT, nvtx)
        _insert_sql(self.db, _RUNTIME_INSERT, runtime)
        _insert_sql(self.db, _KERNEL_INSERT, kernels)

    def _processes(self, lanes: dict[int, dict[str, int]]) -> None:
        meta = self.meta
        procs, threads, gpus, cuda = [], [], [], []
        for rank in self.ranks:
            pid = self.pid_of[rank]
            info = meta.rank_info(rank)
            stage = self.device_of[rank]
            procs.append((global_tid(pid, 0), pid, f"ppscope rank {rank}"))
            for lane, tid in lanes[rank].items():
                threads.append((self.string(f"rank {rank} {lane}"), 0, global_tid(pid, tid)))
            device = self.device_of[rank]
            name = (info.device if info and info.device else "") or f"cpu (stage {stage})"
            gpus.append((_VM_ID << 48, device, name, "", 0, 0, 0, 0, 0, 0, device, "", 0, "", device))
            cuda.append((device, device, pid, "", 0))
        _insert(self.db, "PROCESSES", procs)
        _insert(self.db, "ThreadNames", threads)
        _insert(self.db, "TARGET_INFO_GPU", gpus)
        _insert(self.db, "TARGET_INFO_CUDA_DEVICE", cuda)

    def _session(self, t0: int, t1: int) -> None:
        meta = self.meta
        epoch = meta.created_unix_ns or time.time_ns()
        utc = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch / 1e9))
        _insert(self.db, "TARGET_INFO_SESSION_START_TIME", [(epoch, utc, utc, t0)])
        _insert(self.db, "ANALYSIS_DETAILS", [(_VM_ID << 48, t1 - t0, t0, t1)])
        major, minor, micro = EXPORT_SCHEMA_VERSION.split(".")
        rows = [
            ("EXPORT_PRODUCT_NAME", "ppscope"),
            ("EXPORT_PRODUCT_VERSION", __version__),
            ("EXPORT_SCHEMA_VERSION", EXPORT_SCHEMA_VERSION),
            ("EXPORT_SCHEMA_VERSION_MAJOR", major),
            ("EXPORT_SCHEMA_VERSION_MINOR", minor),
            ("EXPORT_SCHEMA_VERSION_MICRO", micro),
            ("EXPORT_PARAM_EXPORT_TYPE", "SQLite"),
            ("EXPORT_TIME_UTC", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())),
            ("PPSCOPE_DEVICE_MAPPING", self.device_note),
            (
                "PPSCOPE_SHADOW_KERNELS",
                "each compute/communication span has a launch + kernel row with the span's times; "
                "the NVTX ranges of domain ppscope are the spans",
            ),
            ("PPSCOPE_RANK_PIDS", json.dumps({str(p): r for r, p in self.pid_of.items()})),
            ("PPSCOPE_RUN_META", meta.to_json()),
        ]
        _insert(self.db, "META_DATA_EXPORT", rows)


def _extras(cols: dict[str, list[Any]], i: int, message: str, lane: str) -> str | None:
    """What the message does not carry, as JSON (only fields that differ from their defaults)."""
    extra: dict[str, Any] = {}
    if cols["name"][i] != message:
        extra["name"] = cols["name"][i]
    if lane != lane_of(cols["kind"][i]):
        extra["lane"] = lane
    for key, default in (("step", -1), ("phase", ""), ("nbytes", 0), ("tokens", 0), ("peer", -1)):
        if cols[key][i] != default:
            extra[key] = cols[key][i]
    return json.dumps(extra, separators=(",", ":")) if extra else None
