"""Read an `nsys export --type sqlite` file as a Trace: one rank per process that ran GPU work.

Tables and columns are discovered (`sqlite_master`, `pragma table_info`), so optional tables and columns
that differ between nsys releases are tolerated. GPU work (kernels, NCCL kernels, memcpy, memset) goes on
`stream N` lanes; NVTX ranges of the `ppscope` domain (`s2 forward mb5`) come back as the spans they
describe, kernels launched inside them inherit their stage and micro-batch through the RUNTIME<->KERNEL
join on (pid, correlationId), and the range moves from CPU time to the GPU extent of those kernels (the
CPU side of asynchronous work is not when the stage was busy). Files written by ppscope's own exporter
carry the run's metadata and come back exactly. Reading the tables is `tables`' job; this module
decides ranks, stages and kinds. It never writes to the input.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, ErrorCode, PPScopeError, UnsupportedInputError
from ppscope.formats.nsys.gpu import GPU_KINDS, TABLE_BITS, GpuWork, gpu_work
from ppscope.formats.nsys.tables import (
    KERNEL,
    NVTX,
    NVTX_MARK,
    NVTX_RANGE_TYPES,
    PPSCOPE_DOMAIN,
    RUNTIME,
    NsysDb,
    nvtx_rows,
    parse_ppscope_message,
    pid_of,
    ppscope_fields,
    read_strings,
    runtime_rows,
    with_defaults,
)
from ppscope.formats.ordering import order_stages
from ppscope.formats.spancolumns import SpanColumns, build_spans
from ppscope.trace.model import ClockInfo, RankInfo, RunMeta, SpanKind, Trace, spans_frame
from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["NVTX_RANGE_TYPES", "PPSCOPE_DOMAIN", "load_nsys", "parse_ppscope_message", "pid_of"]

# Point-to-point evidence for stage order: NCCL's own NVTX ranges, PyTorch's, and our span kinds.
_P2P_NAMES = {
    "ncclSend": "send",
    "ncclRecv": "recv",
    "nccl:send": "send",
    "nccl:recv": "recv",
    "send": "send",
    "recv": "recv",
    "recv_wait": "recv",
}


def load_nsys(path: str | Path) -> Trace:
    """The nsys export at `path` as a Trace. Raises a one-line error naming what is missing."""
    p = Path(path)
    db = NsysDb(p)
    try:
        return _load(db)
    finally:
        db.db.close()


def _load(db: NsysDb) -> Trace:
    if not (db.has("StringIds") and (db.has(KERNEL) or db.has(NVTX) or db.has("META_DATA_EXPORT"))):
        hint = " (it looks like a ppscope rank file: give its run directory)" if db.has("spans") else ""
        raise UnsupportedInputError(
            ErrorCode.NOT_A_TRACE,
            f"{db.path} is an SQLite file but not an nsys export: it has no StringIds / {KERNEL} / {NVTX} tables{hint}",
        )
    info = dict(db.query("SELECT name, value FROM META_DATA_EXPORT")) if db.has("META_DATA_EXPORT") else {}
    strings = read_strings(db)
    nvtx = nvtx_rows(db, strings)
    own_export = "PPSCOPE_RUN_META" in info
    ppscope_rows = nvtx[nvtx["ppscope"]] if len(nvtx) else nvtx
    if db.count(KERNEL) == 0 and not len(ppscope_rows):
        raise UnsupportedInputError(
            ErrorCode.NO_KERNELS,
            f"{db.path} is an nsys export without GPU kernels ({KERNEL} is missing or empty) and without "
            "ppscope NVTX ranges: record with `nsys profile --trace=cuda,nvtx` and export again",
        )
    if own_export:
        return _own_export(db, info, ppscope_rows)
    return _assemble(db, info, nvtx, gpu_work(db, strings))


def _own_export(db: NsysDb, info: dict[str, str], rows: pd.DataFrame) -> Trace:
    """A file ppscope wrote: spans are the ppscope NVTX ranges; kernel rows are their shadows."""
    try:
        meta = RunMeta.from_json(info["PPSCOPE_RUN_META"], where=f"{db.path} (PPSCOPE_RUN_META)")
        rank_of_pid = {int(k): int(v) for k, v in json.loads(info.get("PPSCOPE_RANK_PIDS", "{}")).items()}
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        raise CorruptFileError(
            ErrorCode.DAMAGED_FILE, f"{db.path}: damaged ppscope metadata rows in META_DATA_EXPORT ({exc})"
        ) from None
    spans = ppscope_fields(rows)
    if len(spans):
        spans["rank"] = spans["pid"].map(rank_of_pid).fillna(-1).astype(np.int64)
        spans = with_defaults(spans)
    return Trace(spans=spans_frame(spans if len(spans) else None), meta=meta).sorted()


def _assemble(db: NsysDb, info: dict[str, str], nvtx: pd.DataFrame, gpu: GpuWork) -> Trace:
    warnings: list[Notice] = []
    rows = gpu.rows
    own = ppscope_fields(nvtx[nvtx["ppscope"]]) if len(nvtx) else pd.DataFrame()
    if len(own):
        own = with_defaults(own)
    pids = sorted(set(np.unique(rows["pid"].to_numpy()).tolist()) | (set(own["pid"].tolist()) if len(own) else set()))
    device_of = _devices(rows, pids)
    by_device = sorted(pids, key=lambda pid: (device_of[pid], pid))
    rank_of = {pid: i for i, pid in enumerate(by_device)}
    other = nvtx[~nvtx["ppscope"] & nvtx["pid"].isin(pids)] if len(nvtx) else nvtx
    dropped = len(nvtx) - len(other) - (int(nvtx["ppscope"].sum()) if len(nvtx) else 0)
    if dropped:
        text = f"{dropped} NVTX row(s) of processes without GPU work were left out"
        warnings.append(Notice(NoticeCode.NVTX_DROPPED, text))
    stage_of_rank, order_note = _stages(rank_of, own, other, device_of)
    warnings.append(order_note)
    parts = []
    extent = None
    if len(rows):
        kernels, extent, said = _gpu_spans(db, gpu, own, rank_of, stage_of_rank)
        warnings += said
        parts.append(kernels)
    after = 3 << TABLE_BITS  # NVTX rows come after the GPU tables' rows, ppscope's first
    if len(own):
        own = own.copy()
        own["rank"] = own["pid"].map(rank_of)
        if extent is not None and len(extent):
            # A ppscope range in a capture is CPU time; the GPU work it launched is when the stage was busy.
            own.loc[extent.index, "start_ns"] = extent["gpu_start"].to_numpy()
            own.loc[extent.index, "end_ns"] = extent["gpu_end"].to_numpy()
            text = f"{len(extent)} ppscope range(s) moved from CPU to GPU time: the extent of the kernels they launched"
            warnings.append(Notice(NoticeCode.RANGES_ON_GPU_TIME, text))
        parts.append(SpanColumns.of_frame(with_defaults(own), after + np.arange(len(own))))
    if len(other):
        ranges = _range_spans(other, rank_of, stage_of_rank)
        parts.append(SpanColumns.of_frame(ranges, after + len(own) + np.arange(len(other))))
    del rows
    gpu.rows = gpu.rows.iloc[:0]  # let go of the GPU rows: the span columns hold what they need of them
    spans, reversed_ = build_spans(parts)
    if reversed_:
        warnings.append(
            Notice(NoticeCode.SPANS_REVERSED, f"{reversed_} row(s) end before they start and were left out")
        )
    meta = _meta(db, info, pids, rank_of, stage_of_rank, device_of, order_note.text)
    return Trace(spans=spans, meta=meta, warnings=warnings)


def _devices(gpu: pd.DataFrame, pids: list[int]) -> dict[int, int]:
    """Each process's main device (most rows); processes with ppscope spans only keep -1 + pid order."""
    out = {pid: -1 for pid in pids}
    if len(gpu):
        counts = gpu.groupby(["pid", "dev"]).size().reset_index(name="n").sort_values(["pid", "n"])
        for row in counts.itertuples():
            out[int(row.pid)] = int(row.dev)
    return out


def _stages(
    rank_of: dict[int, int], own: pd.DataFrame, other: pd.DataFrame, device_of: dict[int, int]
) -> tuple[dict[int, int], Notice]:
    """Each rank's stage, and how it was found."""
    if len(own) and (own["stage"] >= 0).any():
        stage = own[own["stage"] >= 0].groupby("pid")["stage"].min()
        known = {rank_of[int(pid)]: int(s) for pid, s in stage.items()}
        if len(known) == len(rank_of):
            return known, Notice(
                NoticeCode.STAGES_FROM_NVTX, "stages taken from the ppscope NVTX ranges (`sN ...` messages)"
            )
    p2p = []
    for frame in (own, other):
        if not len(frame):
            continue
        col = "kind" if "kind" in frame.columns else "name"
        ops = frame[col].map(_P2P_NAMES)
        hits = frame[ops.notna().to_numpy()]
        times = hits["start"] if "start" in hits else hits["start_ns"]
        for pid, op, t in zip(hits["pid"].tolist(), ops.dropna().tolist(), times.tolist(), strict=True):
            p2p.append((rank_of[int(pid)], op, int(t)))
    order = order_stages(rank_of.values(), p2p, {rank_of[p]: d for p, d in device_of.items()}, "device id")
    return order.stage_of, order.notice


def _gpu_spans(
    db: NsysDb,
    gpu: GpuWork,
    own: pd.DataFrame,
    rank_of: dict[int, int],
    stage_of_rank: dict[int, int],
) -> tuple[SpanColumns, pd.DataFrame | None, list[Notice]]:
    """The GPU rows as span columns: rank and stage from the process, a lane per (process, device, stream);
    with ppscope ranges, the stage, micro-batch, step, chunk and phase of the range that launched each."""
    df = gpu.rows
    n = len(df)
    pid = df["pid"].to_numpy()
    keys = np.array(sorted(rank_of), dtype=np.int64)
    at = np.searchsorted(keys, pid)  # every pid of a GPU row has a rank
    rank = np.array([rank_of[int(p)] for p in keys], dtype=np.int64)
    stage = np.array([stage_of_rank[r] for r in rank.tolist()], dtype=np.int64)
    # Lane names are made once per distinct (pid, device, stream), then spread by code.
    combos, codes = _factorize_rows(pid, df["dev"].to_numpy(), df["stream"].to_numpy())
    devices_per_pid: dict[int, set[int]] = {}
    for p, dev, _ in combos:
        devices_per_pid.setdefault(p, set()).add(dev)
    lanes = [(f"gpu {dev} " if len(devices_per_pid[p]) > 1 else "") + f"stream {stream}" for p, dev, stream in combos]
    small = np.int32  # the schema's type of these columns
    numbers = {
        "rank": rank[at].astype(small),
        "stage": stage[at].astype(small),
        "mb": np.full(n, -1, dtype=small),
        "step": np.full(n, -1, dtype=small),
        "chunk": np.zeros(n, dtype=small),
        "start_ns": df["start"].to_numpy(),
        "end_ns": df["end"].to_numpy(),
        "nbytes": df["nbytes"].to_numpy(),
        "tokens": np.zeros(n, dtype=small),
        "peer": np.full(n, -1, dtype=small),
    }
    phase = (np.zeros(n, dtype=np.int32), [""])
    extent = None
    said: list[Notice] = []
    if len(own):
        hit, extent, said = _attribute(df, runtime_rows(db), own)
        idx = hit["index"].to_numpy(dtype=np.int64)
        for c in ("stage", "mb", "step", "chunk"):
            numbers[c][idx] = hit[c].to_numpy()
        found, values = pd.factorize(hit["phase"].astype(str).to_numpy(dtype=object))
        phase[0][idx] = found + 1
        phase = (phase[0], ["", *(str(v) for v in values)])
    text = {
        "lane": (np.asarray(codes, dtype=np.int32), lanes),
        "kind": (df["kid"].to_numpy().astype(np.int32), GPU_KINDS),
        "name": (df["nid"].to_numpy().astype(np.int32), gpu.names),
        "phase": phase,
    }
    return SpanColumns(numbers, text, df["pos"].to_numpy()), extent, said


def _factorize_rows(
    pid: np.ndarray, dev: np.ndarray, stream: np.ndarray
) -> tuple[list[tuple[int, int, int]], np.ndarray]:
    """Distinct (pid, device, stream) rows and, per input row, the index of its distinct row.

    The three fit one uint64 (pid: 24 bits, device: 16, stream: 24), so a hash factorize does it in O(n)."""
    key = (
        (pid.astype(np.uint64) & np.uint64(0xFFFFFF)) << np.uint64(40)
        | (dev.astype(np.uint64) & np.uint64(0xFFFF)) << np.uint64(24)
        | (stream.astype(np.uint64) & np.uint64(0xFFFFFF))
    )
    codes, uniques = pd.factorize(key)
    first = np.zeros(len(uniques), dtype=np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)  # the first row of each distinct key
    combos = [(int(pid[i]), int(dev[i]), int(stream[i])) for i in first.tolist()]
    return combos, np.asarray(codes)


def _attribute(
    df: pd.DataFrame, runtime: pd.DataFrame, own: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame, list[Notice]]:
    """Which ppscope range launched each kernel: it takes the range's stage, micro-batch, step, chunk and phase.

    RUNTIME and KERNEL rows meet on (pid, correlationId): correlation ids are unique per process only.
    Returns the kernels launched in a range (`index`: their row in `df`) with the range's fields, and per
    range (index of `own`) that launched GPU work, the GPU extent of that work.
    """
    none = pd.DataFrame({"gpu_start": pd.Series([], dtype=np.int64), "gpu_end": pd.Series([], dtype=np.int64)})
    nothing = pd.DataFrame({c: [] for c in ("index", "stage", "mb", "step", "chunk", "phase")})
    if not len(runtime):
        text = f"no {RUNTIME} rows: kernels could not be attributed to ppscope ranges"
        return nothing, none, [Notice(NoticeCode.NO_RUNTIME_ROWS, text)]
    launches = df[["pid", "corr", "start", "end"]].reset_index().merge(runtime, on=["pid", "corr"], how="inner")
    if not len(launches):
        return nothing, none, []
    ranges = own[own["kind"].isin(["forward", "backward", "embed", "head", "sample", "send", "recv", "recv_wait"])]
    ranges = ranges.rename(columns={"start_ns": "rstart"}).assign(ridx=ranges.index).sort_values("rstart")
    launches = launches.sort_values("rstart")
    hit = pd.merge_asof(
        launches,
        ranges[["rstart", "end_ns", "pid", "tid", "stage", "mb", "step", "chunk", "phase", "ridx"]],
        on="rstart",
        by=["pid", "tid"],
        direction="backward",
    )
    hit = hit[hit["end_ns"].notna() & (hit["end_ns"] >= hit["rstart"])]
    extent = hit.groupby("ridx").agg(gpu_start=("start", "min"), gpu_end=("end", "max"))
    extent.index = extent.index.astype(np.int64)
    return hit, extent, []


def _range_spans(other: pd.DataFrame, rank_of: dict[int, int], stage_of_rank: dict[int, int]) -> pd.DataFrame:
    df = pd.DataFrame(
        {
            "rank": other["pid"].map(rank_of).to_numpy(),
            "start_ns": other["start"].astype(np.int64).to_numpy(),
            "name": other["name"].astype(str).to_numpy(),
        }
    )
    is_mark = (other["eventType"] == NVTX_MARK).to_numpy() | other["end"].isna().to_numpy()
    ends = pd.to_numeric(other["end"], errors="coerce").fillna(0).astype(np.int64).to_numpy()
    df["end_ns"] = np.where(is_mark, df["start_ns"], ends)
    df["kind"] = np.where(is_mark, str(SpanKind.MARK), str(SpanKind.RANGE))
    df["stage"] = df["rank"].map(stage_of_rank)
    threads = other.groupby("pid")["tid"].nunique()
    several = other["pid"].map(threads).to_numpy() > 1
    df["lane"] = np.where(several, "host " + other["tid"].astype(str).to_numpy(), "host")
    return with_defaults(df)


def _meta(
    db: NsysDb,
    info: dict[str, str],
    pids: list[int],
    rank_of: dict[int, int],
    stage_of_rank: dict[int, int],
    device_of: dict[int, int],
    order_note: str,
) -> RunMeta:
    names = _gpu_names(db)
    start = (
        db.query("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
        if db.has("TARGET_INFO_SESSION_START_TIME")
        else []
    )
    ranks = [
        RankInfo(
            rank=rank_of[pid],
            stage=stage_of_rank[rank_of[pid]],
            device=names.get(device_of[pid], f"cuda:{device_of[pid]}" if device_of[pid] >= 0 else "cpu"),
            pid=pid,
            clock=ClockInfo(method="import"),
        )
        for pid in pids
    ]
    return RunMeta(
        run_id=db.path.stem,
        source="nsys",
        created_unix_ns=start[0][0] if start and isinstance(start[0][0], int) else 0,  # optional: 0 when damaged
        status="finished",
        world_size=len(pids),
        pp_size=len(set(stage_of_rank.values())) or 1,
        ranks=sorted(ranks, key=lambda r: r.rank),
        versions={k: v for k, v in info.items() if k in ("EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION")},
        config={"input": str(db.path), "stage_order": order_note},
    )


def _gpu_names(db: NsysDb) -> dict[int, str]:
    if not (db.has("TARGET_INFO_GPU") and db.has("TARGET_INFO_CUDA_DEVICE")):
        return {}
    try:
        rows = db.query(
            "SELECT c.cudaId, g.name FROM TARGET_INFO_GPU g JOIN TARGET_INFO_CUDA_DEVICE c ON g.id = c.gpuId"
        )
    except PPScopeError:
        return {}
    return {d: str(n) for d, n in rows if isinstance(d, int) and n}  # names are optional: skip damaged rows
