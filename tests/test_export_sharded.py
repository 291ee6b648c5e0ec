"""`ppscope export RUN` writes nsys SQLite and NVTXT a rank file at a time, with the same content as the export
of the whole run loaded: every row of every nsys table (but the export's own time), every NVTXT byte."""

from __future__ import annotations

import dataclasses
import sqlite3
import sys
from pathlib import Path

import pytest

from ppscope.cli.main import main
from ppscope.errors import CorruptFileError
from ppscope.formats import export_run, export_trace
from ppscope.formats.sources import open_trace
from ppscope.simulate.simulator import write_run
from ppscope.trace.store import load_run, rank_file

sys.path.insert(0, str(Path(__file__).parent))
from replica_helpers import replica_job
from test_analysis_sharded import RUNS, _sim
from test_causes_per_step import _training
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
    runs["training"] = write_run(_training(4, 6, "1f1b", steps=2), tmp / "training")
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


def test_a_damaged_rank_is_left_out_as_load_run_leaves_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(replica_job(3, 2), tmp_path / "run")
    rank_file(run, 4).write_bytes(b"not a database at all" * 100)
    whole = load_run(run)
    export_trace(whole, "nsys-sqlite", tmp_path / "whole.sqlite")
    assert main(["export", str(run), "--format", "nsys-sqlite", "--out", str(tmp_path / "ranks.sqlite")]) == 0
    assert "rank 4's file is damaged" in capsys.readouterr().err
    assert _rows(tmp_path / "ranks.sqlite") == _rows(tmp_path / "whole.sqlite")
    for r in range(6):  # nothing left to read: the error, as load_run raises it, and nothing written
        rank_file(run, r).write_bytes(b"")
    for fmt, out in (("nsys-sqlite", tmp_path / "none.sqlite"), ("nvtxt", tmp_path / "none")):
        with pytest.raises(CorruptFileError):
            export_run(run, fmt, out)
        assert not out.exists()


def test_chrome_from_a_run_is_the_whole_run_s(runs: dict[str, Path], tmp_path: Path) -> None:
    export_trace(load_run(runs["serve"]), "chrome", tmp_path / "whole.json")
    export_run(runs["serve"], "chrome", tmp_path / "run.json")
    assert (tmp_path / "run.json").read_bytes() == (tmp_path / "whole.json").read_bytes()
