"""`ppscope export RUN` writes nsys SQLite, NVTXT and Chrome JSON a rank file at a time, with the same content as
the export of the whole run loaded: every row of every nsys table (but the export's own time), every NVTXT byte,
every Chrome event in the same order, its arrows pairing what `match_flows` pairs on the whole trace."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from error_helpers import cli_error, raises_code

from ppscope.cli.main import main
from ppscope.errors import CorruptFileError, ErrorCode
from ppscope.formats import export_run, export_trace
from ppscope.formats.chrome.ranks import ExportPlan, TraceRanks
from ppscope.formats.chrome.writer import match_flows
from ppscope.formats.sources import open_trace
from ppscope.simulate.simulator import write_run
from ppscope.trace.notices import NoticeCode
from ppscope.trace.store import load_run, rank_file, read_meta, write_meta

sys.path.insert(0, str(Path(__file__).parent))
from replica_helpers import replica_job
from test_analysis_causes_per_step import _training
from test_analysis_sharded import RUNS, _sim
from test_formats_pipelining import _write, gpipe_cpu


def _rows(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every table's rows in insertion order, the export's own clock time left out."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        out = {t: db.execute(f'SELECT * FROM "{t}" ORDER BY rowid').fetchall() for t in tables}
    finally:
        db.close()
    out["META_DATA_EXPORT"] = [r for r in out["META_DATA_EXPORT"] if r[0] != "EXPORT_TIME_UTC"]
    return out


def _runs(tmp: Path) -> dict[str, Path]:
    imported = open_trace(_write(tmp / "k", gpipe_cpu()))
    runs = {name: _sim(tmp / name, **kw) for name, kw in RUNS.items()}
    training = _training(4, 6, "1f1b", steps=2)
    training.meta.status = "finished"  # a job that closed its recorder: read rank by rank
    runs["training"] = write_run(training, tmp / "training")
    runs["imported"] = write_run(dataclasses.replace(imported, warnings=[]), tmp / "imported")
    runs["replicas"] = write_run(replica_job(3, 2), tmp / "replicas")
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _runs(tmp_path_factory.mktemp("runs"))


@pytest.mark.parametrize("name", ["gpipe", "interleaved", "serve", "one-stage", "training", "imported", "replicas"])
def test_nsys_and_nvtxt_written_rank_by_rank_equal_the_whole_run(
    name: str, runs: dict[str, Path], tmp_path: Path
) -> None:
    run, whole = runs[name], load_run(runs[name])
    export_trace(whole, "nsys-sqlite", tmp_path / "whole.sqlite")
    export_run(run, "nsys-sqlite", tmp_path / "ranks.sqlite")
    assert _rows(tmp_path / "ranks.sqlite") == _rows(tmp_path / "whole.sqlite")
    export_trace(whole, "nvtxt", tmp_path / "whole")
    export_run(run, "nvtxt", tmp_path / "ranks")
    names = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "ranks").iterdir()) and names
    for n in names:
        assert (tmp_path / "ranks" / n).read_bytes() == (tmp_path / "whole" / n).read_bytes()


def _doc(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    doc: dict[str, Any] = json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)
    return doc


@pytest.mark.parametrize("name", ["gpipe", "interleaved", "serve", "one-stage", "training", "imported", "replicas"])
def test_chrome_written_rank_by_rank_equals_the_whole_run(name: str, runs: dict[str, Path], tmp_path: Path) -> None:
    run, whole = runs[name], load_run(runs[name])
    for out in ("trace.json", "trace.json.gz"):
        export_trace(whole, "chrome", tmp_path / f"whole-{out}")
        export_run(run, "chrome", tmp_path / f"ranks-{out}")
        got, want = _doc(tmp_path / f"ranks-{out}"), _doc(tmp_path / f"whole-{out}")
        assert got == want and len(got["traceEvents"]) > len(whole.spans)


def _arrows(events: list[dict[str, Any]]) -> list[tuple[tuple[int, int, float], tuple[int, int, float]]]:
    """Each arrow's (pid, tid, µs) at its start and at its end, whatever its id."""
    ends: dict[int, dict[str, tuple[int, int, float]]] = {}
    for e in events:
        if e["ph"] in ("s", "f"):
            assert e["id"] not in ends or e["ph"] not in ends[e["id"]], "an arrow id used twice"
            ends.setdefault(e["id"], {})[e["ph"]] = (e["pid"], e["tid"], e["ts"])
    assert sorted(ends) == list(range(1, len(ends) + 1))
    return sorted((end["s"], end["f"]) for end in ends.values())


@pytest.mark.parametrize("name", ["gpipe", "serve", "imported", "replicas"])
def test_chrome_arrows_pair_what_the_whole_trace_pairs(name: str, runs: dict[str, Path], tmp_path: Path) -> None:
    """The arrows, paired link by link, are those `match_flows` finds on all the spans at once."""
    whole = load_run(runs[name])
    events = _doc(export_run(runs[name], "chrome", tmp_path / "t.json"))["traceEvents"]
    spans = whole.spans
    t0 = min(int(spans["start_ns"].min()), int(whole.counters["ts_ns"].min()) if len(whole.counters) else 1 << 62)
    slices = {(e["pid"], e["ts"], e["dur"], e["cat"]): e["tid"] for e in events if e["ph"] == "X"}

    def end(i: int, at: int) -> tuple[int, int, float]:
        s = spans.loc[i]
        key = (int(s["rank"]), round((int(s["start_ns"]) - t0) / 1000, 3))
        tid = slices[(*key, round((int(s["end_ns"]) - int(s["start_ns"])) / 1000, 3), str(s["kind"]))]
        return key[0], tid, round((at - t0) / 1000, 3)

    want = sorted(
        (
            end(si, int(spans.loc[si, "start_ns"])),
            end(ri, max(int(spans.loc[ri, "start_ns"]), int(spans.loc[ri, "end_ns"]) - 1)),
        )
        for si, ri in match_flows(spans)
    )
    assert _arrows(events) == want and want


def test_chrome_refuses_a_run_that_changed_between_its_reads(runs: dict[str, Path]) -> None:
    source = TraceRanks(load_run(runs["gpipe"]))
    plan = ExportPlan.of(source)
    (src, dst), (first, n) = next(iter(plan.links.items()))
    plan.links[src, dst] = (first, n + 1)
    with raises_code(CorruptFileError, ErrorCode.RUN_CHANGED):
        plan.arrows(src, dst, source.sends(src, dst), source.receives(dst, src))


def test_a_run_still_being_written_is_exported_from_one_snapshot(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two reads of a growing run's files need not agree: such a run is loaded once, whole, and exported."""
    from ppscope.formats.chrome import writer as chrome

    run = tmp_path / "live"
    shutil.copytree(runs["gpipe"], run)
    meta = read_meta(run)
    meta.status = "running"
    write_meta(run, meta)

    def rank_by_rank(*args: object, **kwargs: object) -> Path:
        raise AssertionError("a running run was read rank by rank")

    monkeypatch.setattr(chrome, "export_chrome_run", rank_by_rank)
    export_run(run, "chrome", tmp_path / "live.json")
    export_trace(load_run(runs["gpipe"]), "chrome", tmp_path / "whole.json")
    assert _doc(tmp_path / "live.json") == _doc(tmp_path / "whole.json")


@pytest.mark.parametrize("fmt", ["nsys-sqlite", "chrome", "nvtxt"])
def test_spans_a_damaged_file_loses_are_named_as_the_whole_load_names_them(
    fmt: str, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["gpipe"], run)
    db = sqlite3.connect(rank_file(run, 1))
    db.execute("UPDATE spans SET end_ns = start_ns - 5 WHERE id IN (1, 2)")
    db.commit()
    db.close()
    (note,) = [n for n in load_run(run).warnings if n.code == NoticeCode.SPANS_REVERSED]
    assert "rank-00001.sqlite" in note.text  # the file
    export_run(run, fmt, tmp_path / "out")
    assert capsys.readouterr().err.count(f"ppscope export: note: {note.text}") == 1  # load_run's note, once


@pytest.mark.parametrize("fmt", ["nsys-sqlite", "chrome"])
def test_a_damaged_rank_is_left_out_as_load_run_leaves_it(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(replica_job(3, 2), tmp_path / "run")
    rank_file(run, 4).write_bytes(b"not a database at all" * 100)
    whole, name = load_run(run), "out.sqlite" if fmt == "nsys-sqlite" else "out.json"
    export_trace(whole, fmt, tmp_path / f"whole-{name}")
    assert main(["export", str(run), "--format", fmt, "--out", str(tmp_path / f"ranks-{name}")]) == 0
    (damaged,) = [n for n in whole.warnings if n.code == NoticeCode.DAMAGED_FILE]
    assert "rank 4" in damaged.text and f"note: {damaged.text}" in capsys.readouterr().err  # as load_run says it
    if fmt == "chrome":
        assert _doc(tmp_path / f"ranks-{name}") == _doc(tmp_path / f"whole-{name}")
    else:
        assert _rows(tmp_path / f"ranks-{name}") == _rows(tmp_path / f"whole-{name}")
    for r in range(6):  # nothing left to read: the error, as load_run raises it, and nothing written
        rank_file(run, r).write_bytes(b"")
    with pytest.raises(CorruptFileError) as raised:
        load_run(run)
    for out in (tmp_path / "none.sqlite", tmp_path / "none", tmp_path / "none.json"):
        f = {".sqlite": "nsys-sqlite", ".json": "chrome", "": "nvtxt"}[out.suffix]
        with pytest.raises(CorruptFileError):
            export_run(run, f, out)
        assert not out.exists()
        failed = cli_error(capsys, ["export", str(run), "--format", f, "--out", str(out)])
        assert failed.exit_code == 1 and failed.code == raised.value.code and failed.err.count("\n") == 1
