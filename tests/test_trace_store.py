"""The run store: writing, loading, tailing, clock offsets, and every kind of bad run directory."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import sys
import time
import types
from pathlib import Path

import pytest
from error_helpers import raises_code

from ppscope.errors import CorruptFileError, ErrorCode, RunExistsError, RunNotFoundError, SchemaVersionError
from ppscope.trace.model import ClockInfo, RankInfo, RunMeta
from ppscope.trace.notices import missing_ranks
from ppscope.trace.recorder import Recorder
from ppscope.trace.store import (
    META_FILE,
    REQUESTS_FILE,
    RankWriter,
    RunTail,
    create_run,
    load_run,
    rank_file,
    read_meta,
    read_since,
    write_meta,
)


def _span(rank: int, start: int, end: int, mb: int = 0, kind: str = "forward") -> tuple[object, ...]:
    return (rank, rank, "compute", kind, kind, mb, -1, 0, "prefill", start, end, 0, 1, -1)


def _snapshot(path: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() + str(p.stat().st_mtime_ns) for p in sorted(path.iterdir())
    }


def test_write_and_load_with_clock_offsets(tmp_path: Path) -> None:
    run = tmp_path / "run"
    meta = RunMeta(world_size=2, ranks=[RankInfo(rank=1, clock=ClockInfo(offset_ns=1_000))])
    create_run(run, meta)
    for rank in (0, 1):
        w = RankWriter(run, rank)
        w.write([_span(rank, 5_000 + rank, 6_000 + rank, mb=m) for m in range(3)], [(5_500, rank, -1, "cpu", 50.0)])
        w.close()
    trace = load_run(run)
    assert len(trace.spans) == 6 and not trace.warnings
    r1 = trace.spans[trace.spans["rank"] == 1]
    assert r1["start_ns"].tolist() == [4_001] * 3 and r1["end_ns"].tolist() == [5_001] * 3
    assert trace.counters.set_index("rank").loc[1, "ts_ns"] == 4_500
    assert trace.spans["start_ns"].is_monotonic_increasing


def test_a_large_batch_is_written_whole_and_in_order(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=1))
    w = RankWriter(run, 0)
    for n in (300, 1, 257):
        base = w.spans_written
        w.write(
            [_span(0, 10 * (base + i), 10 * (base + i) + 5, mb=base + i) for i in range(n)],
            [(10 * (base + i), 0, -1, "cpu", float(i)) for i in range(n // 2)],
        )
    w.close()
    trace = load_run(run)
    assert trace.spans["mb"].tolist() == list(range(558))
    assert trace.spans["end_ns"].tolist() == [10 * i + 5 for i in range(558)]
    assert len(trace.counters) == 150 + 0 + 128


def test_loading_never_writes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=1))
    w = RankWriter(run, 0)
    w.write([_span(0, 1, 2)])
    w.close()
    before = _snapshot(run)
    load_run(run)
    read_since(run)
    assert _snapshot(run) == before


def test_never_overwrites(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta())
    with raises_code(RunExistsError, ErrorCode.RUN_EXISTS):
        create_run(run, RunMeta())
    RankWriter(run, 0).close()
    with raises_code(RunExistsError, ErrorCode.RUN_EXISTS) as err:
        RankWriter(run, 0)
    assert "rank-00000" in str(err.value)


def test_a_new_run_is_named_and_dated_unless_its_meta_says(tmp_path: Path) -> None:
    before = time.time_ns()
    named = read_meta(create_run(tmp_path / "r1", RunMeta()))
    assert named.run_id == "r1" and before <= named.created_unix_ns <= time.time_ns()
    kept = read_meta(create_run(tmp_path / "r2", RunMeta(run_id="imported", created_unix_ns=123)))
    assert (kept.run_id, kept.created_unix_ns) == ("imported", 123)


def test_tail_sees_spans_while_writer_is_live(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=1))
    rec = Recorder(RankWriter(run, 0), rank=0, stage=0, flush_interval_s=0.02)
    tail = RunTail(run)
    seen = []
    for batch in range(3):
        for mb in range(4):
            with rec.span("forward", mb=mb, step=batch):
                pass
        rec.flush()
        delta = tail.poll()
        seen.append(len(delta.spans))
        assert set(delta.spans["step"]) == {batch}
    rec.close()
    assert seen == [4, 4, 4]
    assert len(tail.poll().spans) == 0
    assert len(load_run(run).spans) == 12


def test_tail_picks_up_requests_line_by_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=0))
    tail = RunTail(run)
    line = {"id": 1, "prompt_len": 4, "output_len": 2, "arrival_ns": 0, "first_token_ns": 5, "finish_ns": 9}
    with open(run / REQUESTS_FILE, "w") as f:
        f.write(json.dumps(line) + "\n" + '{"id": 2, "prompt')  # second line half-written
    assert tail.poll().requests["id"].tolist() == [1]
    with open(run / REQUESTS_FILE, "a") as f:
        f.write('_len": 3}\n')
    got = tail.poll().requests
    assert got["id"].tolist() == [2] and got["finish_ns"].tolist() == [-1]


def _record_in_process(run: str, rank: int, n: int) -> None:
    rec = Recorder(RankWriter(run, rank), rank=rank, stage=rank, flush_interval_s=0.01)
    for i in range(n):
        with rec.span("forward", mb=i, step=i // 10, phase="decode", tokens=i % 7):
            pass
        if i % 50 == 0:
            time.sleep(0.001)
    rec.counter("cpu_util_pct", 12.5)
    rec.close()


def test_two_processes_record_concurrently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Children must not re-run whatever `__main__` is now (Streamlit's AppTest swaps in a script of its own).
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=2))
    n = 2_000
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_record_in_process, args=(str(run), r, n)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)  # generous: spawning and importing pandas is slow on a loaded 2-core machine
        assert p.exitcode == 0, f"{p.name} exited with {p.exitcode}"
    trace = load_run(run)
    assert len(trace.spans) == 2 * n and len(trace.counters) == 2
    for rank in (0, 1):
        mine = trace.spans[trace.spans["rank"] == rank]
        assert mine["mb"].tolist() == list(range(n))  # every span, in time order
        assert mine["tokens"].tolist() == [i % 7 for i in range(n)]
        assert (mine["stage"] == rank).all() and (mine["phase"] == "decode").all()
    assert trace.spans["start_ns"].is_monotonic_increasing


# ---------------------------------------------------------------- bad run directories


def test_missing_directory(tmp_path: Path) -> None:
    with raises_code(RunNotFoundError, ErrorCode.RUN_NOT_FOUND):
        load_run(tmp_path / "nope")


def test_empty_directory(tmp_path: Path) -> None:
    with raises_code(RunNotFoundError, ErrorCode.RUN_EMPTY):
        load_run(tmp_path)


def test_directory_without_meta(tmp_path: Path) -> None:
    (tmp_path / "rank-00000.sqlite").write_bytes(b"")
    with raises_code(RunNotFoundError, ErrorCode.NOT_A_RUN):
        load_run(tmp_path)


def test_missing_rank_file_loads_the_rest_and_warns(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=3))
    for rank in (0, 2):
        w = RankWriter(run, rank)
        w.write([_span(rank, 10, 20)])
        w.close()
    trace = load_run(run)
    assert trace.ranks == [0, 2]
    (missing,) = trace.warnings
    assert missing == missing_ranks([1], 3)  # in the words every command uses


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty-tables"])
def test_damaged_rank_file_is_named(tmp_path: Path, damage: str) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=1))
    w = RankWriter(run, 0)
    w.write([_span(0, i, i + 1) for i in range(5_000)])
    w.close()
    path = rank_file(run, 0)
    if damage == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif damage == "garbage":
        path.write_bytes(b"this is not a database at all" * 100)
    else:
        import sqlite3

        path.unlink()
        sqlite3.connect(path).execute("CREATE TABLE other (x)").connection.commit()
    with pytest.raises(CorruptFileError) as err:
        load_run(run)
    assert "rank-00000.sqlite" in str(err.value)  # which file to look at


def test_rank_file_from_newer_schema(tmp_path: Path) -> None:
    import sqlite3

    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=1))
    RankWriter(run, 0).close()
    db = sqlite3.connect(rank_file(run, 0))
    db.execute("UPDATE info SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with raises_code(SchemaVersionError, ErrorCode.SCHEMA_TOO_NEW):
        load_run(run)


@pytest.mark.parametrize("value", ["'two'", "'" + "[" * 100_000 + "'", "x'00ff'"])
def test_rank_file_schema_version_that_is_no_number_is_named(tmp_path: Path, value: str) -> None:
    import sqlite3

    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=1))
    RankWriter(run, 0).close()
    with sqlite3.connect(rank_file(run, 0)) as db:
        db.execute(f"UPDATE info SET value = {value} WHERE key = 'schema_version'")
    with raises_code(CorruptFileError, ErrorCode.DAMAGED_FILE):
        load_run(run)


def test_meta_from_newer_schema(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta())
    (run / META_FILE).write_text(json.dumps({"schema_version": 999}))
    with raises_code(SchemaVersionError, ErrorCode.SCHEMA_TOO_NEW):
        load_run(run)


def test_write_meta_is_atomic_replacement(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta(status="running"))
    write_meta(run, RunMeta(status="finished"))
    assert load_run(run).meta.status == "finished"
    assert sorted(os.listdir(run)) == [META_FILE]  # no temp files left behind


def test_not_a_directory(tmp_path: Path) -> None:
    f = tmp_path / "file.txt"
    f.write_text("x")
    with raises_code(RunNotFoundError, ErrorCode.NOT_A_RUN):
        load_run(f)


def test_run_directory_that_cannot_be_made_is_one_line_naming_it(tmp_path: Path) -> None:
    """A file where a parent directory should be fails for root too; the message names the path and the fix."""
    from ppscope.errors import InvalidConfigError

    (tmp_path / "afile.txt").write_text("x")
    target = tmp_path / "afile.txt" / "sub"
    with raises_code(InvalidConfigError, ErrorCode.OUTPUT_NOT_WRITABLE) as e:
        create_run(target, RunMeta())
    assert str(target) in str(e.value) and "--out" in str(e.value)  # the path, and the option that fixes it
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert (tmp_path / "afile.txt").read_text() == "x"


def test_run_directory_in_an_unwritable_parent_is_one_line(tmp_path: Path) -> None:
    from ppscope.errors import InvalidConfigError

    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        if os.access(parent, os.W_OK):
            pytest.skip("permissions do not stop this user (root)")
        with raises_code(InvalidConfigError, ErrorCode.OUTPUT_NOT_WRITABLE) as err:
            create_run(parent / "runs" / "r1", RunMeta())
        assert str(parent / "runs") in str(err.value)  # the folder it could not create
    finally:
        parent.chmod(0o755)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_meta_json_follows_the_umask_like_every_other_run_file(tmp_path: Path, umask: int) -> None:
    """Another account (a dashboard, a shared file system) reads a run as far as the umask lets it."""
    old = os.umask(umask)
    try:
        run = create_run(tmp_path / "run", RunMeta(world_size=1))
        RankWriter(run, 0).close()
        write_meta(run, RunMeta(world_size=1, status="finished"))
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in run.iterdir()}
    assert modes == {META_FILE: 0o666 & ~umask, rank_file(run, 0).name: 0o666 & ~umask}


def test_of_two_runs_created_at_once_in_one_directory_one_is_refused(tmp_path: Path) -> None:
    import threading

    run = tmp_path / "run"
    barrier, outcomes = threading.Barrier(2), []

    def create(name: str) -> None:
        barrier.wait()
        try:
            create_run(run, RunMeta(run_id=name))
            outcomes.append(name)
        except RunExistsError:
            outcomes.append("refused")

    for _ in range(30):  # both used to pass the emptiness check and both "create" it, the later meta winning
        threads = [threading.Thread(target=create, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if o != "refused"]
        assert len(winners) == 1 and read_meta(run).run_id == winners[0], outcomes
        assert sorted(p.name for p in run.iterdir()) == [META_FILE]
        outcomes.clear()
        (run / META_FILE).unlink()
        run.rmdir()


def test_reading_a_finished_run_leaves_every_file_as_it_was(tmp_path: Path) -> None:
    """A closed rank file is opened immutable: no -shm or -wal appears, no byte or timestamp changes."""
    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=1))
    w = RankWriter(run, 0)
    w.write([_span(0, 5_000, 6_000, mb=m) for m in range(3)])
    w.close()
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.iterdir()}
    assert len(load_run(run).spans) == 3
    assert len(RunTail(run).poll().spans) == 3
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.iterdir()}
    assert after == before


def test_a_run_being_written_is_read_through_its_log(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=1))
    w = RankWriter(run, 0)
    w.write([_span(0, 5_000, 6_000, mb=m) for m in range(3)])  # in the write-ahead log, not yet in the file
    try:
        assert (run / "rank-00000.sqlite-wal").stat().st_size > 0
        assert len(load_run(run).spans) == 3
    finally:
        w.close()
