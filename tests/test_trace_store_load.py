"""The columnar, chunked read of big runs: it gives exactly what a row-by-row read gives, in the schema's
dtypes, whatever the chunking, the ties in start times, the gaps in row ids or the odd cell."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from error_helpers import raises_code

import ppscope.trace.rankfile as rankfile
import ppscope.trace.store as store
from ppscope.errors import CorruptFileError, ErrorCode
from ppscope.trace.model import ClockInfo, RankInfo, RunMeta, spans_frame
from ppscope.trace.notices import NoticeCode
from ppscope.trace.store import RankWriter, RunTail, create_run, load_run, rank_file, read_meta, read_since

LANES = ["compute", "send", "stream 7", "é→ü"]
NAMES = ["a", "b,c", "", "名前", "x" * 40, "forward"]


def _write_run(run: Path, n: int, ranks: int = 3, seed: int = 0) -> None:
    rng = random.Random(seed)
    meta = RunMeta(world_size=ranks, ranks=[RankInfo(rank=r, clock=ClockInfo(offset_ns=r * 777)) for r in range(ranks)])
    create_run(run, meta)
    for r in range(ranks):
        w = RankWriter(run, r)
        rows = []
        for _ in range(n):
            start = rng.randrange(0, n // 4)  # many spans share a start: the tie-breaking is tested too
            rows.append(
                (
                    r,
                    rng.choice([r, -1]),
                    rng.choice(LANES),
                    rng.choice(["forward", "send", "mark"]),
                    rng.choice(NAMES),
                    rng.randrange(-1, 5),
                    rng.randrange(-1, 3),
                    0,
                    rng.choice(["", "prefill", "decode"]),
                    start,
                    start + rng.randrange(0, 3),
                    rng.choice([0, 2**62, -5]),
                    rng.randrange(0, 9),
                    rng.randrange(-1, 4),
                )
            )
        for i in range(0, n, 97):
            w.write(rows[i : i + 97], [(i, r, -1, "cpu_util_pct", 1.5)])
        w.close()


def _row_by_row(run: Path, monkeypatch: pytest.MonkeyPatch) -> pd.DataFrame:
    with monkeypatch.context() as m:
        m.setattr(rankfile, "_read_chunks", lambda *a: False)
        return load_run(run).spans


@pytest.fixture()
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(rankfile, "_CHUNK_ROWS", 100)  # many chunks per file
    _write_run(tmp_path / "run", 1_000)
    return tmp_path / "run"


def test_chunked_read_equals_row_by_row_read(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = load_run(run)
    assert len(trace.spans) == 3_000 and not trace.warnings
    pd.testing.assert_frame_equal(trace.spans, _row_by_row(run, monkeypatch))
    assert trace.spans.dtypes.to_dict() == spans_frame().dtypes.to_dict()
    assert trace.spans["start_ns"].is_monotonic_increasing
    assert set(trace.spans["name"]) == set(NAMES) and set(trace.spans["lane"]) == set(LANES)
    assert len(trace.counters) == 3 * 11 and trace.counters["ts_ns"].is_monotonic_increasing


def test_stable_order_of_spans_that_share_their_start(run: Path) -> None:
    spans = load_run(run).spans
    keys = ["start_ns", "rank", "end_ns"]
    pd.testing.assert_frame_equal(spans, spans.sort_values(keys, kind="stable").reset_index(drop=True))


def test_gaps_in_row_ids_and_a_separator_inside_a_name(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = sqlite3.connect(rank_file(run, 0))
    db.execute("DELETE FROM spans WHERE id % 7 = 0 OR id BETWEEN 200 AND 650")
    db.commit()
    db.close()
    db = sqlite3.connect(rank_file(run, 2))
    db.execute("UPDATE spans SET name = 'a\x1fb' WHERE id = 10")  # the chunk separator: read row by row
    db.commit()
    db.close()
    spans = load_run(run).spans
    assert (spans["rank"] == 0).sum() == 1_000 - 451 - len(
        [i for i in range(1, 1001) if i % 7 == 0 and not 200 <= i <= 650]
    )
    assert (spans["name"] == "a\x1fb").sum() == 1
    pd.testing.assert_frame_equal(spans, _row_by_row(run, monkeypatch))


def test_incremental_reads_add_up_to_the_whole_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rankfile, "_CHUNK_ROWS", 64)
    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=2))
    writers = [RankWriter(run, r) for r in (0, 1)]
    tail = RunTail(run)
    parts = []
    for batch in range(5):
        for r, w in enumerate(writers):
            w.write([(r, r, "compute", "forward", "f", batch, i, 0, "", i, i + 5, 0, 1, -1) for i in range(150)])
        parts.append(tail.poll().spans)
    parts.append(tail.poll().spans)
    for w in writers:
        w.close()
    assert [len(p) for p in parts] == [300] * 5 + [0]
    whole = load_run(run).spans
    assert sorted(pd.concat(parts)["step"].tolist()) == sorted(whole["step"].tolist())
    trace, cursor = read_since(run, tail.cursor)
    assert len(trace.spans) == 0 and cursor == tail.cursor


@pytest.mark.parametrize(("column", "value"), [("mb", "'abc'"), ("peer", "x'01'"), ("start_ns", "NULL")])
def test_a_cell_of_the_wrong_type_names_the_file(run: Path, column: str, value: str) -> None:
    db = sqlite3.connect(rank_file(run, 1))
    if value == "NULL":  # NOT NULL forbids it: only a file with another schema holds one
        db.execute("ALTER TABLE spans RENAME COLUMN start_ns TO old_start")
        db.execute("ALTER TABLE spans ADD COLUMN start_ns INTEGER")
        db.execute("UPDATE spans SET start_ns = old_start WHERE id != 77")
    else:
        db.execute(f"UPDATE spans SET {column} = {value} WHERE id = 77")
    db.commit()
    db.close()
    trace = load_run(run)  # the damaged file is named and left out; the others load
    assert trace.ranks == [r for r in range(read_meta(run).world_size) if r != 1]
    (damaged,) = [n.text for n in trace.warnings if n.code == NoticeCode.DAMAGED_FILE]
    assert "rank 1" in damaged and "rank-00001.sqlite" in damaged  # names the rank and its file
    for rank in trace.ranks:  # with only one file left, its damage is the error
        rank_file(run, rank).unlink()
    with raises_code(CorruptFileError, ErrorCode.DAMAGED_FILE) as err:
        load_run(run)
    assert "rank-00001.sqlite" in str(err.value)  # the file that is damaged


@pytest.mark.parametrize(("column", "value"), [("start_ns", "2.5"), ("tokens", "3.0"), ("rank", str(2**40))])
def test_a_number_cell_that_pandas_converts_is_read_as_before(
    run: Path, monkeypatch: pytest.MonkeyPatch, column: str, value: str
) -> None:
    db = sqlite3.connect(rank_file(run, 1))
    db.execute(f"UPDATE spans SET {column} = {value} WHERE id = 77")
    db.commit()
    db.close()
    pd.testing.assert_frame_equal(load_run(run).spans, _row_by_row(run, monkeypatch))


def test_text_that_looks_like_a_number_stays_text(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = sqlite3.connect(rank_file(run, 1))
    db.execute("UPDATE spans SET lane = 7, kind = 2.5 WHERE id = 77")
    db.commit()
    db.close()
    spans = load_run(run).spans
    assert ((spans["lane"] == "7") & (spans["kind"] == "2.5")).sum() == 1
    pd.testing.assert_frame_equal(spans, _row_by_row(run, monkeypatch))


def test_rank_info_is_read_without_writing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=2))
    w = RankWriter(run, 0)
    w.set_info("spans_written", 3)
    w.close()
    RankWriter(run, 1).close()
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    v = store.SCHEMA_VERSION
    assert store.read_rank_info(run) == {0: {"schema_version": v, "spans_written": 3}, 1: {"schema_version": v}}
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before
    db = sqlite3.connect(rank_file(run, 0))
    db.execute("UPDATE info SET value = 'not json' WHERE key = 'spans_written'")
    db.commit()
    db.close()
    with raises_code(CorruptFileError, ErrorCode.DAMAGED_FILE) as err:
        store.read_rank_info(run)
    assert "rank-00000.sqlite" in str(err.value)


def test_times_that_would_wrap_on_the_common_clock_are_left_out(tmp_path: Path) -> None:
    run = tmp_path / "run"
    low = -(2**63)
    meta = RunMeta(world_size=2, ranks=[RankInfo(rank=1, clock=ClockInfo(offset_ns=3_845))])
    create_run(run, meta)
    for rank in (0, 1):
        w = RankWriter(run, rank)
        rows = [(rank, rank, "send", "send", "send", 0, 0, 0, "", low + 10, 100, 0, 0, 1)]  # damaged
        rows.append((rank, rank, "send", "send", "send", 1, 0, 0, "", 5, 100, 0, 0, 1))
        w.write(rows, [(low + 10, rank, -1, "cpu_util_pct", 1.0), (7, rank, -1, "cpu_util_pct", 1.0)])
        w.close()
    trace = load_run(run)
    spans = trace.spans
    assert sorted(zip(spans["rank"], spans["mb"], strict=True)) == [(0, 0), (0, 1), (1, 1)]  # rank 0: no offset
    assert (spans["end_ns"] >= spans["start_ns"]).all() and spans["start_ns"].is_monotonic_increasing
    assert trace.counters["ts_ns"].tolist() == [low + 10, 7 - 3_845, 7]
    said = {n.code: n.text for n in trace.warnings}
    assert (
        said[NoticeCode.SPANS_OUT_OF_RANGE].startswith("1 ")
        and "rank-00001.sqlite" in said[NoticeCode.SPANS_OUT_OF_RANGE]
    )
    assert said[NoticeCode.COUNTERS_OUT_OF_RANGE].startswith("1 ")  # counted


def test_one_ranks_counters_read_alone_are_its_rows_of_the_whole_load(tmp_path: Path) -> None:
    from ppscope.trace.counterfile import read_rank_counters

    run = tmp_path / "run"
    meta = RunMeta(world_size=3, ranks=[RankInfo(rank=r, clock=ClockInfo(offset_ns=r * 777)) for r in range(3)])
    create_run(run, meta)
    for r in range(3):
        w = RankWriter(run, r)
        w.write([], [(t * 1_000 - r * 500, r, t % 2, "gpu_util_pct", float(t * r)) for t in (5, 1, 3, 1, 9)])
        w.close()
    whole = load_run(run).counters
    meta = read_meta(run)
    for r in range(3):
        alone = read_rank_counters(rank_file(run, r), meta)
        expected = whole[whole["rank"] == r].reset_index(drop=True)
        pd.testing.assert_frame_equal(alone, expected)
        assert alone["ts_ns"].is_monotonic_increasing and len(alone) == 5
    rank_file(run, 1).write_bytes(b"not a database at all, just text")
    with raises_code(CorruptFileError, ErrorCode.NOT_SQLITE) as err:
        read_rank_counters(rank_file(run, 1), meta)
    assert "rank-00001.sqlite" in str(err.value)
