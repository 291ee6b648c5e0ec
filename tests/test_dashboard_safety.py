"""Which paths the dashboard may open: only those given, and runs inside given folders (no escape by symlink)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from error_helpers import raises_code
from test_dashboard_runs import record_gpipe_run

from ppscope.dashboard.safety import catalog_from_args
from ppscope.errors import ErrorCode, RunNotFoundError

NSYS = Path(__file__).resolve().parents[2] / "shared" / "data" / "nsys" / "mock.sqlite"


def test_single_runs_and_folders_are_told_apart(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "one")
    folder = tmp_path / "many"
    folder.mkdir()
    record_gpipe_run(folder / "a")
    catalog = catalog_from_args([str(run), str(folder)])
    assert [e.label for e in catalog.singles] == [str(run)]
    assert catalog.folders == (folder.resolve(),)
    assert [e.label for e in catalog.entries()] == [str(run), "many/a"]
    assert all(e.is_run for e in catalog.entries())


def test_folder_is_rescanned_and_never_escaped(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    catalog = catalog_from_args([folder])
    assert catalog.entries() == []
    record_gpipe_run(folder / "new")  # written after the dashboard started: listed now
    secret = record_gpipe_run(tmp_path / "secret")
    (folder / "escape").symlink_to(secret)
    (folder / "loop").symlink_to(folder / "loop")
    (folder / "empty").mkdir()
    assert [e.label for e in catalog.entries()] == ["runs/new"]
    assert catalog.pick("runs/new").path == (folder / "new").resolve()
    for label in ("runs/escape", "runs/../secret", str(secret), "runs/empty"):
        with raises_code(RunNotFoundError, ErrorCode.TRACE_NOT_SERVED):
            catalog.pick(label)


def test_symlink_staying_inside_the_folder_is_kept(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    record_gpipe_run(folder / "real")
    (folder / "alias").symlink_to(folder / "real")
    assert sorted(e.label for e in catalog_from_args([folder]).entries()) == ["runs/alias", "runs/real"]


def test_deleted_folder_lists_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    record_gpipe_run(folder / "a")
    catalog = catalog_from_args([folder])
    shutil.rmtree(folder)
    assert catalog.entries() == []


def test_missing_paths_are_refused(tmp_path: Path) -> None:
    with raises_code(RunNotFoundError, ErrorCode.RUN_NOT_FOUND):
        catalog_from_args([tmp_path / "nope"])
    with raises_code(RunNotFoundError, ErrorCode.NO_TRACE_GIVEN):
        catalog_from_args([])


def test_imported_traces_in_a_folder_are_listed(tmp_path: Path) -> None:
    if not NSYS.is_file():
        pytest.skip(f"{NSYS} is absent (the shared real traces are not next to this checkout)")
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(NSYS, folder / "capture.bin")  # detected by content, not by name
    (folder / "notes.txt").write_text("hello")
    # A folder holding one nsys export is that trace (as `ppscope analyze FOLDER` reads it) ...
    (single,) = catalog_from_args([folder]).entries()
    assert (single.label, single.path, single.is_run) == (str(folder), folder.resolve(), False)
    # ... with two, each is listed to pick from.
    shutil.copy(NSYS, folder / "other.sqlite")
    entries = catalog_from_args([folder]).entries()
    assert sorted((e.label, e.is_run) for e in entries) == [
        ("traces/capture.bin", False),
        ("traces/other.sqlite", False),
    ]
