"""`ppscope export`: formats, content detection, no overwrite without --force, never into the input."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from error_helpers import cli_error
from test_formats_helpers import KINETO, MFU, fingerprint, make_run, need

from ppscope.cli.main import main
from ppscope.errors import ErrorCode
from ppscope.formats.sources import open_trace
from ppscope.trace.notices import NoticeCode


@pytest.mark.parametrize("fmt", ["nsys-sqlite", "chrome", "nvtxt"])
def test_exports_a_run_in_every_format(fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    before = fingerprint(run)
    out = tmp_path / {"nsys-sqlite": "r.sqlite", "chrome": "r.json", "nvtxt": "r-nvtxt"}[fmt]
    assert main(["export", str(run), "--format", fmt, "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert fingerprint(run) == before
    if fmt == "nsys-sqlite":
        assert len(open_trace(out).spans) == len(open_trace(run).spans)
    elif fmt == "chrome":
        assert json.loads(out.read_text())["traceEvents"]
    else:
        assert len(list(out.glob("rank-*.nvtxt"))) == 3


def test_refuses_existing_output_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    out = tmp_path / "r.sqlite"
    out.write_bytes(b"precious")
    failed = cli_error(capsys, ["export", str(run), "--format", "nsys-sqlite", "--out", str(out)])
    assert failed.exit_code == 2 and failed.code == ErrorCode.RUN_EXISTS and "--force" in failed.text
    assert out.read_bytes() == b"precious"
    assert main(["export", str(run), "--format", "nsys-sqlite", "--out", str(out), "--force"]) == 0
    assert open_trace(out).meta.run_id == "interop"


def test_never_writes_into_the_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    before = fingerprint(run)
    assert main(["export", str(run), "--format", "chrome", "--out", str(run / "x.json"), "--force"]) == 2
    assert main(["export", str(run / "rank-00000.sqlite"), "--format", "chrome"]) != 0
    exported = tmp_path / "r.sqlite"
    assert main(["export", str(run), "--format", "nsys-sqlite", "--out", str(exported)]) == 0
    again = fingerprint(exported)
    failed = cli_error(capsys, ["export", str(exported), "--format", "nsys-sqlite", "--out", str(exported), "--force"])
    assert failed.exit_code == 2 and failed.code == ErrorCode.OUTPUT_INTO_INPUT
    assert fingerprint(run) == before and fingerprint(exported) == again


def test_missing_format_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    failed = cli_error(capsys, ["export", str(run)])
    assert failed.exit_code == 2 and failed.code == ErrorCode.MISSING_OPTION and failed.err.count("\n") == 1
    assert "nsys-sqlite, chrome, nvtxt" in failed.text  # the formats to choose from


def test_real_traces_through_the_command_line(tmp_path: Path) -> None:
    """nsys -> chrome and Kineto directory -> nsys, recognised by content (names hide the type)."""
    disguised = tmp_path / "capture.bin"
    disguised.write_bytes(need(MFU).read_bytes())
    args = ["export", str(disguised), "--format", "chrome", "--out", str(tmp_path / "m.json.gz")]
    out = subprocess.run([sys.executable, "-m", "ppscope", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (order,) = [n for n in open_trace(disguised).warnings if n.code == NoticeCode.STAGES_BY_FALLBACK]
    assert "device id" in order.text and f"note: {order.text}" in out.stderr  # what it ordered the stages by
    k = tmp_path / "k.sqlite"
    assert main(["export", str(need(KINETO)), "--format", "nsys-sqlite", "--out", str(k)]) == 0
    db = sqlite3.connect(k)
    assert db.execute("SELECT count(DISTINCT deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] == 2
    db.close()
