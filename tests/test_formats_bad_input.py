"""Bad inputs to every importer: a one-line error naming the file and what is missing, no traceback,
no write to the input."""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from error_helpers import cli_error
from test_formats_helpers import fingerprint, tiny_nsys

from ppscope.errors import ErrorCode


def _not_sqlite(tmp: Path) -> Path:
    p = tmp / "trace.sqlite"
    p.write_bytes(b"PK\x03\x04 this is a zip, not a database" * 10)
    return p


def _other_sqlite(tmp: Path) -> Path:
    p = tmp / "notes.sqlite"
    db = sqlite3.connect(p)
    db.execute("CREATE TABLE notes (id INTEGER, body TEXT)")
    db.execute("INSERT INTO notes VALUES (1, 'hello')")
    db.commit()
    db.close()
    return p


def _no_kernels(tmp: Path) -> Path:
    return tiny_nsys(tmp / "nokernels.sqlite", kernels=False)


def _json_without_events(tmp: Path) -> Path:
    p = tmp / "trace.json"
    p.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": []}))
    return p


def _truncated_gz(tmp: Path) -> Path:
    p = tmp / "rank0.json.gz"
    doc = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": i, "dur": 1} for i in range(2000)]}
    data = gzip.compress(json.dumps(doc).encode())
    p.write_bytes(data[: len(data) // 2])
    return p


def _timer_events(n: int) -> list[dict[str, object]]:
    meta = {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "PP rank 0, TP rank 0, compute"}}
    step = {"step": 1, "mb_id": 0, "model_chunk": -1}
    return [meta] + [
        {"ph": "X", "name": "forward-compute", "pid": 0, "tid": 0, "ts": i * 2.0, "dur": 1.0, "args": step}
        for i in range(n)
    ]


def _truncated_timers_gz(tmp: Path) -> Path:
    p = tmp / "timeline.json.gz"
    data = gzip.compress(json.dumps(_timer_events(2000)).encode())
    p.write_bytes(data[: len(data) // 2])
    return p


def _timers_cut_inside(tmp: Path) -> Path:
    p = tmp / "timeline.json"
    p.write_text(json.dumps(_timer_events(50))[:-200])
    return p


def _array_without_pipeline(tmp: Path) -> Path:
    p = tmp / "chrome.json"
    p.write_text(json.dumps([{"ph": "X", "name": "step", "pid": 0, "tid": 0, "ts": 0, "dur": 5}]))
    return p


def _empty_array(tmp: Path) -> Path:
    p = tmp / "empty.json"
    p.write_text("[]")
    return p


def _empty_dir(tmp: Path) -> Path:
    d = tmp / "traces"
    d.mkdir()
    (d / "README.txt").write_text("no traces here\n")
    return d


def _folder_of_trace_folders(tmp: Path) -> Path:
    """Two captures side by side, each a folder holding one rank's Kineto file."""
    d = tmp / "trace_diff"
    for name in ("control", "test"):
        (d / name).mkdir(parents=True)
        with gzip.open(d / name / "rank-0.json.gz", "wt") as f:
            json.dump({"traceEvents": []}, f)
    return d


def _folder_of_runs(tmp: Path) -> Path:
    d = tmp / "tuned"
    for name in ("1-before", "2-after"):
        (d / name).mkdir(parents=True)
        (d / name / "meta.json").write_text("{}")
    return d


CASES: dict[str, tuple[Callable[[Path], Path], ErrorCode, tuple[str, ...]]] = {
    # case: (make it, its code, what the message names beside the file)
    "not sqlite": (_not_sqlite, ErrorCode.NOT_A_TRACE, ()),
    "sqlite, not nsys": (_other_sqlite, ErrorCode.NOT_A_TRACE, ("CUPTI_ACTIVITY_KIND_KERNEL",)),
    "nsys without kernels": (_no_kernels, ErrorCode.NO_KERNELS, ()),
    "json without traceEvents": (_json_without_events, ErrorCode.NOT_A_TRACE, ("traceEvents",)),
    "truncated gz": (_truncated_gz, ErrorCode.DAMAGED_FILE, ()),
    "timer trace, truncated gz": (_truncated_timers_gz, ErrorCode.DAMAGED_FILE, ()),
    "timer trace, cut inside an event": (_timers_cut_inside, ErrorCode.NOT_JSON, ()),
    "chrome array without pipeline events": (_array_without_pipeline, ErrorCode.NOT_A_TRACE, ("forward-compute",)),
    "empty chrome array": (_empty_array, ErrorCode.NOT_A_TRACE, ()),
    "directory without traces": (_empty_dir, ErrorCode.NO_TRACES, ()),
    "folder of runs (ppscope tune)": (_folder_of_runs, ErrorCode.FOLDER_OF_RUNS, ("1-before, 2-after",)),
    "folder of trace folders": (_folder_of_trace_folders, ErrorCode.FOLDER_OF_RUNS, ("control, test",)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", ["export", "analyze"])
def test_bad_input_is_one_line_naming_the_file(
    case: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make, code, names = CASES[case]
    path = make(tmp_path)
    before = fingerprint(path)
    args = [command, str(path)] + (
        ["--format", "chrome", "--out", str(tmp_path / "o.json")] if command == "export" else []
    )
    failed = cli_error(capsys, args)
    assert failed.exit_code != 0 and failed.code == code, failed
    lines = failed.err.strip().splitlines()
    assert len(lines) == 1, failed.err
    assert "Traceback" not in failed.err and str(path) in lines[0], lines[0]
    assert all(name in failed.text for name in names), failed.text  # the subfolders to choose from, the tables
    assert fingerprint(path) == before
    assert not (tmp_path / "o.json").exists()
