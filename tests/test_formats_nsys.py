"""nsys SQLite import (real exports + hand-made files) and export (round trip, nsys-tui compatibility)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_formats_helpers import MFU, MOCK, fingerprint, make_run, need, tiny_nsys

from ppscope.formats.nsys.reader import load_nsys, pid_of
from ppscope.formats.nsys.schema import TABLES
from ppscope.formats.nsys.writer import export_nsys, global_tid
from ppscope.formats.sources import open_trace
from ppscope.trace.notices import NoticeCode
from ppscope.trace.store import load_run


def _sql_idle_fraction(path: Path) -> dict[int, float]:
    """Per device: 1 - |union of kernel intervals| / (last end - first start), computed in SQL alone."""
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    rows = db.execute(
        """
        WITH k AS (
            SELECT deviceId AS dev, start AS s, "end" AS e,
                   max("end") OVER (PARTITION BY deviceId ORDER BY start, "end"
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
            FROM CUPTI_ACTIVITY_KIND_KERNEL)
        SELECT dev, sum(max(0, e - max(s, coalesce(reach, s)))), min(s), max(e) FROM k GROUP BY dev
        """
    ).fetchall()
    db.close()
    return {int(dev): 1 - busy / (hi - lo) for dev, busy, lo, hi in rows}


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    prev = np.concatenate([[s[0]], reach[:-1]])
    return int(np.maximum(0, e - np.maximum(s, prev)).sum())


def test_real_two_gpu_export_imports_with_streams_nccl_and_device_order() -> None:
    trace = load_nsys(need(MFU))
    spans = trace.spans
    assert trace.ranks == [0, 1] and trace.stages == [0, 1]
    assert {r.device for r in trace.meta.ranks} == {"cuda:0", "cuda:1"}  # no TARGET_INFO_GPU: still opens
    assert NoticeCode.STAGES_BY_FALLBACK in {w.code for w in trace.warnings}  # symmetric send/recv: not inferable
    gpu = spans[spans["kind"].isin(["kernel", "nccl", "memcpy", "memset"])]
    assert set(gpu.loc[gpu["rank"] == 0, "lane"]) == {"stream 7"}
    assert set(gpu.loc[gpu["rank"] == 1, "lane"]) == {"stream 15"}
    db = sqlite3.connect(f"file:{MFU}?mode=ro&immutable=1", uri=True)
    n_kernels, n_nccl = db.execute(
        "SELECT count(*), sum(s.value LIKE 'nccl%') "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName"
    ).fetchone()
    n_ranges = db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60, 70, 71)").fetchone()[0]
    db.close()
    assert (spans["kind"] == "nccl").sum() == n_nccl > 0
    assert spans["kind"].isin(["kernel", "nccl"]).sum() == n_kernels
    assert (spans["kind"] == "range").sum() == n_ranges
    assert {"ncclSend", "ncclRecv"} <= set(spans.loc[spans["kind"] == "range", "name"])  # names via textId


def test_idle_fraction_equals_union_of_kernel_intervals_in_sql() -> None:
    path = need(MFU)
    trace = load_nsys(path)
    expected = _sql_idle_fraction(path)
    device = {r.rank: int(r.device.split(":")[1]) for r in trace.meta.ranks}
    for rank in trace.ranks:
        k = trace.spans[(trace.spans["rank"] == rank) & trace.spans["kind"].isin(["kernel", "nccl"])]
        s, e = k["start_ns"].to_numpy(), k["end_ns"].to_numpy()
        idle = 1 - _union_ns(s, e) / (e.max() - s.min())
        assert idle == pytest.approx(expected[device[rank]], abs=1e-12)
        assert 0 < idle < 1


def test_complete_single_gpu_export_reads_gpu_name() -> None:
    trace = load_nsys(need(MOCK))
    assert trace.ranks == [0]
    assert trace.meta.ranks[0].device == "NVIDIA GeForce RTX 3080"
    assert (trace.spans["kind"] == "kernel").sum() == 2
    assert trace.meta.versions["EXPORT_SCHEMA_VERSION"] == "3.24.14"


def test_p2p_direction_orders_stages_and_odd_files_are_tolerated(tmp_path: Path) -> None:
    path = tiny_nsys(tmp_path / "t.sqlite", extra_column=True, negative=True)
    trace = load_nsys(path)
    by_pid = {r.pid: r for r in trace.meta.ranks}
    assert by_pid[200].stage == 0 and by_pid[100].stage == 1  # pid 200 (device 1) sends first
    assert NoticeCode.STAGES_BY_TRAFFIC in {w.code for w in trace.warnings}
    assert trace.spans["start_ns"].min() == -50_000
    assert set(trace.spans["lane"]) == {"stream 7", "stream 9", "host"}


def test_round_trip_gives_back_the_same_spans_and_metadata(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    before = fingerprint(run)
    original = load_run(run)
    out = export_nsys(original, tmp_path / "run.sqlite")
    assert fingerprint(run) == before
    back = open_trace(out)  # detected by content
    pd.testing.assert_frame_equal(back.spans, original.spans)
    assert back.meta == original.meta


def test_export_has_the_nsys_tables_and_filled_not_null_columns(tmp_path: Path) -> None:
    trace = load_run(make_run(tmp_path / "run"))
    out = export_nsys(trace, tmp_path / "run.sqlite")
    db = sqlite3.connect(out)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert set(TABLES) <= tables and "ENUM_NSYS_EVENT_TYPE" in tables
    for table, cols in TABLES.items():
        for col, _, not_null in cols:
            if not_null:
                assert db.execute(f'SELECT count(*) FROM {table} WHERE "{col}" IS NULL').fetchone()[0] == 0
    meta = dict(db.execute("SELECT name, value FROM META_DATA_EXPORT"))
    assert meta["EXPORT_SCHEMA_VERSION"] == "3.25.0" and "CPU run" in meta["PPSCOPE_DEVICE_MAPPING"]
    assert db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 75 AND text = 'ppscope'").fetchone()[0] == 3
    shadows = trace.spans["kind"].isin(["forward", "send", "recv_wait"]).sum()
    assert db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] == shadows
    # every kernel has its launch on the same process, matched on (pid, correlationId), inside its NVTX range
    joined = db.execute(
        """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
           ON r.correlationId = k.correlationId AND (r.globalTid >> 24) & 16777215 = (k.globalPid >> 24) & 16777215
           JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND n.start <= r.start AND n."end" >= r."end"
           AND n.start = k.start AND n."end" = k."end" """
    ).fetchone()[0]
    assert joined == shadows
    # stage = device for a CPU run
    devs = dict(db.execute("SELECT DISTINCT (globalPid >> 24) & 16777215, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL"))
    assert devs == {4000: 0, 4001: 1, 4002: 2}
    gtid = db.execute("SELECT globalTid FROM NVTX_EVENTS LIMIT 1").fetchone()[0]
    assert gtid >> 48 == 1 and pid_of(gtid) in (4000, 4001, 4002)
    db.close()
    assert global_tid(4000, 4000) == (1 << 48) | (4000 << 24) | 4000


def test_nsys_tui_lists_our_stages_ranges_with_their_kernels(tmp_path: Path) -> None:
    nsys_tui = pytest.importorskip("nsys_tui.profile")
    tree = pytest.importorskip("nsys_tui.tree")
    trace = load_run(make_run(tmp_path / "run"))
    out = export_nsys(trace, tmp_path / "run.sqlite")
    prof = nsys_tui.open(str(out))
    try:
        assert prof.meta.devices == [0, 1, 2]
        window = (int(trace.spans["start_ns"].min()), int(trace.spans["end_ns"].max()))
        for stage in range(3):
            roots = tree.build_nvtx_tree(prof, stage, window)
            assert roots, f"nsys-tui shows no NVTX range for stage {stage}"
            for node in roots:
                assert node["name"].startswith(f"s{stage} ")
                kernels = [c for c in node["children"] if c["type"] == "kernel"]
                assert len(kernels) == 1 and kernels[0]["name"].startswith("ppscope_")
    finally:
        prof.close()
    # and its command line, non-interactively: one section per stage's device, our kernels listed
    cli = subprocess.run(
        [sys.executable, "-m", "nsys_tui", "summary", str(out)], capture_output=True, text=True, timeout=60
    )
    assert cli.returncode == 0, cli.stderr
    assert all(f"GPU {d}" in cli.stdout for d in range(3)) and "ppscope_forward" in cli.stdout


def test_kernels_launched_in_ppscope_ranges_take_their_stage_and_microbatch(tmp_path: Path) -> None:
    """A capture of our engine by nsys: ppscope NVTX ranges on the CPU, kernels on the GPU."""
    path = tmp_path / "capture.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT, globalTid INTEGER,
            textId INTEGER, domainId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER,
            correlationId INTEGER, nameId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER,
            correlationId INTEGER, globalPid INTEGER, shortName INTEGER);
        INSERT INTO StringIds VALUES (1, 'gemm'), (2, 'cudaLaunchKernel');
        """
    )
    g = global_tid(77, 77)
    db.executemany(
        "INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(0, None, 75, "ppscope", g, None, 5), (100, 200, 59, "s1 forward mb3", g, None, 5)],
    )
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (150, 160, ?, 9, 2)", (g,))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (250, 260, ?, 10, 2)", (g,))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (300, 400, 0, 7, 9, ?, 1)", (global_tid(77, 0),))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (500, 600, 0, 7, 10, ?, 1)", (global_tid(77, 0),))
    db.commit()
    db.close()
    spans = load_nsys(path).spans
    fwd = spans[spans["kind"] == "forward"].iloc[0]
    assert (fwd["stage"], fwd["mb"]) == (1, 3)
    assert (fwd["start_ns"], fwd["end_ns"]) == (300, 400)  # moved from CPU time (100-200) to its kernel's
    kernels = spans[spans["kind"] == "kernel"].sort_values("start_ns")
    assert kernels["mb"].tolist() == [3, -1]  # the second launch is outside the range
    assert kernels["lane"].tolist() == ["stream 7", "stream 7"]


def test_gloo_between_gpus_exports_as_a_gpu_run(tmp_path: Path) -> None:
    """`--backend gloo --device cuda`: gloo carried the activations, the ranks computed on GPUs."""
    trace = load_run(make_run(tmp_path / "run"))
    trace.meta.backend = "gloo"
    for info in trace.meta.ranks:
        info.device = "NVIDIA H200"
    db = sqlite3.connect(export_nsys(trace, tmp_path / "gpus.sqlite"))
    mapping = dict(db.execute("SELECT name, value FROM META_DATA_EXPORT"))["PPSCOPE_DEVICE_MAPPING"]
    assert "CPU run" not in mapping and "GPU" in mapping, mapping


def test_exported_tables_have_the_columns_of_real_nsys_exports(tmp_path: Path) -> None:
    """Same column names, types and NOT NULL flags as Nsight's own exports (3.25 first, else 3.24)."""
    refs = [sqlite3.connect(f"file:{need(p)}?mode=ro&immutable=1", uri=True) for p in (MFU, MOCK)]
    out = export_nsys(load_run(make_run(tmp_path / "run")), tmp_path / "run.sqlite")
    ours = sqlite3.connect(out)
    checked = 0
    for (table,) in ours.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        mine = [(r[1], r[2], r[3]) for r in ours.execute(f"PRAGMA table_info('{table}')")]
        for ref in refs:
            theirs = [(r[1], r[2], r[3]) for r in ref.execute(f"PRAGMA table_info('{table}')")]
            if theirs:
                assert mine == theirs, table
                checked += 1
                break
    assert checked == len(TABLES) + 5  # every declared table and every ENUM table exists in a real export
    for db in (*refs, ours):
        db.close()


def test_real_import_survives_our_export_exactly(tmp_path: Path) -> None:
    """Third-party nsys -> Trace -> our nsys -> Trace: the same spans, to the ns."""
    first = load_nsys(need(MFU))
    back = load_nsys(export_nsys(first, tmp_path / "again.sqlite"))
    pd.testing.assert_frame_equal(back.spans, first.spans)
    assert back.meta == first.meta


def test_cpu_capture_of_our_engine_has_no_kernels_but_opens(tmp_path: Path) -> None:
    """nsys on a CPU (gloo) run records NVTX only: the ppscope ranges are the trace."""
    path = tmp_path / "cpu.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT, globalTid INTEGER,
            textId INTEGER, domainId INTEGER);
        INSERT INTO StringIds VALUES (1, 's1 forward mb0'), (2, 's0 send mb0');
        """
    )
    for pid in (10, 11):
        db.execute("INSERT INTO NVTX_EVENTS VALUES (0, NULL, 75, 'ppscope', ?, NULL, 3)", (global_tid(pid, pid),))
    db.execute("INSERT INTO NVTX_EVENTS VALUES (100, 200, 59, NULL, ?, 2, 3)", (global_tid(10, 10),))
    db.execute("INSERT INTO NVTX_EVENTS VALUES (300, 400, 59, NULL, ?, 1, 3)", (global_tid(11, 11),))
    db.commit()
    db.close()
    trace = load_nsys(path)
    got = trace.spans[["rank", "stage", "kind", "mb", "lane", "start_ns", "end_ns"]].values.tolist()
    assert got == [[0, 0, "send", 0, "send", 100, 200], [1, 1, "forward", 0, "compute", 300, 400]]
    assert NoticeCode.STAGES_FROM_NVTX in {w.code for w in trace.warnings}


def _three_device_export(path: Path) -> Path:
    """Two processes on three devices (pid 100 uses two), kernels, copies and memsets, with spans that tie
    to the nanosecond across devices and across tables, rows of a device spread over the tables' order."""
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER,
            correlationId INTEGER, globalPid INTEGER, shortName INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER,
            correlationId INTEGER, globalPid INTEGER, bytes INTEGER, copyKind INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER,
            correlationId INTEGER, globalPid INTEGER, bytes INTEGER);
        INSERT INTO StringIds VALUES (1, 'gemm'), (2, 'ncclDevKernel_SendRecv'), (9000, 'softmax');
        """
    )
    rng = np.random.default_rng(3)
    placement = [(100, 0), (200, 1), (100, 2)]  # (pid, device), device 2 a second GPU of pid 100
    for i in range(300):
        pid, dev = placement[int(rng.integers(0, 3))]
        start = int(rng.integers(0, 40)) * 10  # few distinct starts: many full ties
        end = start + int(rng.integers(0, 3)) * 5
        name = [1, 2, 9000, 77, None][int(rng.integers(0, 5))]  # 77: an id StringIds lacks; None: no name
        gpid = global_tid(pid, 0)
        table = int(rng.integers(0, 3))
        if table == 0:
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, 7, ?, ?, ?)", (start, end, dev, i, gpid, name)
            )
        elif table == 1:
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, 9, ?, ?, 64, ?)",
                (start, end, dev, i, gpid, [1, 8, 3][i % 3]),
            )
        else:
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?, ?, 9, ?, ?, 32)", (start, end, dev, i, gpid)
            )
    db.commit()
    db.close()
    return path


def _expected_gpu_spans(path: Path) -> pd.DataFrame:
    """The spans of `_three_device_export` made the plain way: every table's rows at once, in table order."""
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    names = dict(db.execute("SELECT id, value FROM StringIds").fetchall())
    copies = {1: "Memcpy HtoD", 8: "Memcpy DtoD"}
    rows = []
    for table, extra in (("KERNEL", "shortName"), ("MEMCPY", "copyKind"), ("MEMSET", "0")):
        for start, end, dev, stream, gpid, what in db.execute(
            f"SELECT start, end, deviceId, streamId, globalPid, {extra} FROM CUPTI_ACTIVITY_KIND_{table}"
        ):
            name = {"KERNEL": names.get(what, ""), "MEMCPY": copies.get(what, "Memcpy"), "MEMSET": "Memset"}[table]
            kind = "nccl" if name.startswith("nccl") else table.lower()
            rank = {100: 0, 200: 1}[pid_of(gpid)]  # pid 100's first device has the most rows
            lane = (f"gpu {dev} " if rank == 0 else "") + f"stream {stream}"
            rows.append((rank, lane, kind, name, start, end))
    db.close()
    spans = pd.DataFrame(rows, columns=["rank", "lane", "kind", "name", "start_ns", "end_ns"])
    return spans.sort_values(["start_ns", "rank", "end_ns"], kind="stable").reset_index(drop=True)


def test_gpu_rows_read_a_device_at_a_time_give_the_spans_of_a_plain_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streaming by device: no read returns more than one device's rows, and the trace is the one a read of
    whole tables makes, to the order of spans that tie to the nanosecond."""
    import ppscope.formats.nsys.gpu as nsys_gpu

    path = _three_device_export(tmp_path / "three.sqlite")
    read = nsys_gpu.int_columns
    devices_read: list[set[int]] = []

    def one_device(*args: object, **kwargs: object) -> dict[str, np.ndarray] | None:
        out = read(*args, **kwargs)  # type: ignore[arg-type]
        if out is not None and len(out["dev"]):
            devices_read.append(set(out["dev"].tolist()))
        return out

    monkeypatch.setattr(nsys_gpu, "int_columns", one_device)
    trace = load_nsys(path)
    assert len(devices_read) == 9 and all(len(d) == 1 for d in devices_read)  # 3 devices x 3 tables
    got = trace.spans[["rank", "lane", "kind", "name", "start_ns", "end_ns"]].astype(object)
    pd.testing.assert_frame_equal(got, _expected_gpu_spans(path).astype(object))
    assert (trace.spans["kind"] == "nccl").any() and (trace.spans["name"] == "").any()


def _copies_only_export(path: Path) -> Path:
    """Two processes on two GPUs, each mostly copying between host and device (HtoD, DtoH) with a few kernels
    and no NCCL at all: nothing moves between the GPUs."""
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER,
            correlationId INTEGER, globalPid INTEGER, shortName INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER,
            correlationId INTEGER, globalPid INTEGER, bytes INTEGER, copyKind INTEGER);
        INSERT INTO StringIds VALUES (1, 'gemm');
        """
    )
    for dev, pid in ((0, 100), (1, 200)):
        gpid = global_tid(pid, 0)
        for i in range(20):
            t = 1_000_000 * i
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, 9, ?, ?, 1048576, ?)",
                (t, t + 800_000, dev, 2 * i, gpid, 1 + i % 2),  # HtoD and DtoH in turn
            )
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, 7, ?, ?, 1)",
                (t + 800_000, t + 900_000, dev, 2 * i + 1, gpid),
            )
    db.commit()
    db.close()
    return path


def test_host_device_copies_are_memcpy_not_traffic_between_stages(tmp_path: Path) -> None:
    from ppscope.analysis import analyze

    trace = open_trace(_copies_only_export(tmp_path / "copies.sqlite"))
    res = analyze(trace)
    window = sum(s.busy_ns + s.bubble_ns for s in res.stages)
    comm = sum(s.causes["comm"] for s in res.stages)
    memcpy = sum(s.causes["memcpy"] for s in res.stages)
    assert comm <= 0.01 * window
    assert memcpy >= 0.75 * window  # 0.8 ms of each 1 ms is a copy; the last period's tail is outside the window
