"""Where commands write (issue 24): never into a run or a trace they read, never over a file without --force,
never into a folder that does not exist, never to `-`; one-line errors, umask permissions, no half files."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from error_helpers import cli_error, raises_code
from test_formats_helpers import fingerprint, make_run

from ppscope.cli.main import main
from ppscope.errors import ErrorCode, InvalidConfigError, RunExistsError
from ppscope.formats.sources import open_trace
from ppscope.trace.outputs import atomic_file, atomic_folder, check_output
from ppscope.trace.store import enclosing_run, holds_run, load_run

Runs = tuple[Path, Path]
Capsys = pytest.CaptureFixture[str]
EXPORTS = {"nsys-sqlite": "x.sqlite", "chrome": "x.json", "nvtxt": "x-nvtxt"}
SIM = [
    "simulate",
    "--schedule",
    "gpipe",
    "--stages",
    "2",
    "--microbatches",
    "2",
    "--layers",
    "4",
    "--layer-cost-ms",
    "1",
]
CHEAP_RUN = [
    "--stages",
    "1",
    "--model",
    "synthetic",
    "--layers",
    "2",
    "--layer-cost-ms",
    "0.1",
    "--requests",
    "2",
    "--max-new-tokens",
    "2",
    "--no-progress",
]


OUTPUT_CODES = {
    ErrorCode.OUTPUT_INTO_INPUT,
    ErrorCode.RUN_EXISTS,
    ErrorCode.OUTPUT_WRONG_KIND,
    ErrorCode.OUTPUT_HOLDS_OTHER_FILES,
}
"""The refusals of an output that would replace or write into what is there."""


def one_line_error(capsys: Capsys, argv: list[str], codes: ErrorCode | set[ErrorCode], *names: str) -> None:
    """`ppscope ARGV` fails with exit code 2, one of `codes`, one line and no traceback, and its message names
    `names` (the option, the path)."""
    failed = cli_error(capsys, argv)
    assert failed.exit_code == 2 and failed.code in ({codes} if isinstance(codes, ErrorCode) else codes), (
        argv,
        failed,
    )
    assert "Traceback" not in failed.err and len(failed.err.strip().splitlines()) == 1, failed.err
    assert all(name in failed.text for name in names), failed.text


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root`: a file's SHA-256, `dir` for a folder, the target for a link."""
    out = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        if p.is_symlink():
            out[key] = f"-> {os.readlink(p)}"
        elif p.is_dir():
            out[key] = "dir"
        else:
            out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.chdir(tmp_path)
    return make_run(tmp_path / "runs" / "r1"), make_run(tmp_path / "runs" / "r2", stages=2)


# ---------------------------------------------------------------- 24.1: analyze --html


def test_analyze_html_never_replaces_a_file_of_the_run_it_reads(runs: Runs, capsys: Capsys) -> None:
    r1, _ = runs
    before = fingerprint(r1)
    for force in ([], ["--force"]):
        one_line_error(
            capsys, ["analyze", str(r1), "--json", "--html", str(r1 / "meta.json"), *force], ErrorCode.OUTPUT_INTO_INPUT
        )
    assert fingerprint(r1) == before and len(load_run(r1).spans)


def test_analyze_html_never_writes_into_another_run(runs: Runs, capsys: Capsys) -> None:
    r1, r2 = runs
    before = fingerprint(r2)
    for target in (r2 / "rank-00001.sqlite", r2 / "report.html", r2):
        for force in ([], ["--force"]):
            one_line_error(
                capsys,
                ["analyze", str(r1), "--json", "--html", str(target), *force],
                ErrorCode.OUTPUT_INTO_INPUT,
                str(r2.resolve()),
            )
    assert fingerprint(r2) == before and sorted(p.name for p in r2.iterdir()) == sorted(
        ["meta.json", "rank-00000.sqlite", "rank-00001.sqlite"]
    )


def test_analyze_html_replaces_an_existing_file_only_with_force(runs: Runs, tmp_path: Path, capsys: Capsys) -> None:
    r1, _ = runs
    report = tmp_path / "report.html"
    report.write_text("my notes")
    one_line_error(capsys, ["analyze", str(r1), "--json", "--html", str(report)], ErrorCode.RUN_EXISTS, "--force")
    assert report.read_text() == "my notes"
    assert main(["analyze", str(r1), "--json", "--html", str(report), "--force"]) == 0
    assert report.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_a_folder_with_another_tools_meta_json_is_not_a_run(runs: Runs, tmp_path: Path, capsys: Capsys) -> None:
    """The guard walks up the parents of every output: a project folder with some meta.json must not stop it."""
    r1, r2 = runs
    project = tmp_path / "project"
    project.mkdir()
    (project / "meta.json").write_text('{"title": "not ppscope"}')
    assert not holds_run(project) and holds_run(r2) and enclosing_run(r2 / "a" / "b") == r2.resolve()
    assert main(["analyze", str(r1), "--json", "--html", str(project / "report.html")]) == 0
    capsys.readouterr()
    started = tmp_path / "started"  # a run stopped before its ranks wrote anything is still a run
    assert main([*SIM, "--out", str(started)]) == 0
    for rank in started.glob("rank-*.sqlite"):
        rank.unlink()
    assert holds_run(started)


# ---------------------------------------------------------------- 24.6: missing and unwritable places


@pytest.mark.parametrize("fmt", list(EXPORTS))
def test_a_missing_folder_is_an_error_and_is_not_created(fmt: str, runs: Runs, tmp_path: Path, capsys: Capsys) -> None:
    r1, _ = runs
    missing = tmp_path / "nonexistent"
    one_line_error(
        capsys,
        ["export", str(r1), "--format", fmt, "--out", str(missing / EXPORTS[fmt])],
        ErrorCode.OUTPUT_NOT_WRITABLE,
        str(missing),
    )
    assert not missing.exists()
    one_line_error(
        capsys,
        ["analyze", str(r1), "--json", "--html", str(missing / "r.html")],
        ErrorCode.OUTPUT_NOT_WRITABLE,
        str(missing),
    )
    assert not missing.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux") or not Path("/proc/self").exists(), reason="Linux /proc")
@pytest.mark.parametrize("place", ["/proc/foo.json", "/sys/x.json"])
def test_an_unwritable_place_is_one_line(place: str, runs: Runs, capsys: Capsys) -> None:
    r1, _ = runs
    for fmt in EXPORTS:
        one_line_error(
            capsys, ["export", str(r1), "--format", fmt, "--out", place], ErrorCode.OUTPUT_NOT_WRITABLE, place
        )
    one_line_error(
        capsys, ["analyze", str(r1), "--json", "--html", place], ErrorCode.OUTPUT_NOT_WRITABLE, "--html", place
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="permissions do not stop this user (root)")
def test_a_read_only_folder_is_one_line(runs: Runs, tmp_path: Path, capsys: Capsys) -> None:
    r1, _ = runs
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        one_line_error(
            capsys,
            ["export", str(r1), "--format", "chrome", "--out", str(locked / "x.json")],
            ErrorCode.OUTPUT_NOT_WRITABLE,
        )
    finally:
        locked.chmod(0o755)


# ---------------------------------------------------------------- 24.15: `-` and permissions


def test_dash_is_refused_not_made_a_file(runs: Runs, tmp_path: Path, capsys: Capsys) -> None:
    """`-` is a request for stdout, which carries the report: refused in one line, and `./-` still names a file."""
    r1, _ = runs
    for fmt in EXPORTS:
        one_line_error(capsys, ["export", str(r1), "--format", fmt, "--out", "-"], ErrorCode.OUTPUT_NOT_WRITABLE, "./-")
    one_line_error(capsys, ["analyze", str(r1), "--json", "--html", "-"], ErrorCode.OUTPUT_NOT_WRITABLE, "--html")
    one_line_error(capsys, [*SIM, "--out", "-"], ErrorCode.OUTPUT_NOT_WRITABLE, "--out")
    one_line_error(capsys, ["run", *CHEAP_RUN, "--out", "-"], ErrorCode.OUTPUT_NOT_WRITABLE, "--out")
    assert not (tmp_path / "-").exists()
    assert main(["export", str(r1), "--format", "chrome", "--out", "./-"]) == 0
    assert (tmp_path / "-").is_file()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_get_the_umasks_permissions(umask: int, runs: Runs, tmp_path: Path) -> None:
    r1, _ = runs
    old = os.umask(umask)
    try:
        for fmt, name in EXPORTS.items():
            assert main(["export", str(r1), "--format", fmt, "--out", name]) == 0
        assert main(["analyze", str(r1), "--json", "--html", "r.html"]) == 0
    finally:
        os.umask(old)
    files = [tmp_path / "x.sqlite", tmp_path / "x.json", tmp_path / "r.html", *(tmp_path / "x-nvtxt").iterdir()]
    assert {f.name: f.stat().st_mode & 0o777 for f in files} == {f.name: 0o666 & ~umask for f in files}
    assert (tmp_path / "x-nvtxt").stat().st_mode & 0o777 == 0o777 & ~umask


# ---------------------------------------------------------------- writes are whole or absent


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    with pytest.raises(ZeroDivisionError), atomic_file(out) as tmp:
        tmp.write_text("half")
        1 / 0  # noqa: B018
    folder = tmp_path / "nv"
    folder.mkdir()
    (folder / "rank-0.nvtxt").write_text("earlier")
    with pytest.raises(ZeroDivisionError), atomic_folder(folder, force=True, replaceable="rank-*.nvtxt") as tmp:
        (tmp / "rank-0.nvtxt").write_text("half")
        1 / 0  # noqa: B018
    assert snapshot(tmp_path) == {"nv": "dir", "nv/rank-0.nvtxt": hashlib.sha256(b"earlier").hexdigest()}


def test_the_check_refuses_what_the_write_would_refuse(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with raises_code(RunExistsError, ErrorCode.OUTPUT_WRONG_KIND):
        check_output(tmp_path)
    with raises_code(InvalidConfigError, ErrorCode.OUTPUT_NOT_WRITABLE):
        check_output(tmp_path / "f" / "x.json")
    with raises_code(InvalidConfigError, ErrorCode.OUTPUT_PATH_EMPTY):
        check_output("")
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "gone.json")  # a dangling link is an existing name too
    with raises_code(RunExistsError, ErrorCode.RUN_EXISTS):
        check_output(link)


# ---------------------------------------------------------------- new runs


def test_new_runs_are_refused_inside_a_run(runs: Runs, capsys: Capsys) -> None:
    r1, r2 = runs
    before = {r: fingerprint(r) for r in runs}
    for args in (
        [*SIM, "--out", str(r1 / "sub")],
        [*SIM[:1], "--from", str(r1), "--out", str(r2 / "sub")],
        ["run", *CHEAP_RUN, "--out", str(r1 / "sub")],
        ["tune", *CHEAP_RUN, "--out", str(r2)],
        ["demo", "--no-dashboard", "--out", str(r1 / "demo")],
    ):
        one_line_error(capsys, args, ErrorCode.OUTPUT_INTO_INPUT)
    assert {r: fingerprint(r) for r in runs} == before
    assert not (r1 / "sub").exists() and not (r2 / "sub").exists() and not (r1 / "demo").exists()


# ---------------------------------------------------------------- every command, every place


def _commands(target: Path, r1: Path, *, force: bool) -> Iterator[list[str]]:
    """Every command with an output option, writing to `target`, reading r1."""
    flag = ["--force"] if force else []
    yield ["analyze", str(r1), "--json", "--html", str(target), *flag]
    for fmt in EXPORTS:
        yield ["export", str(r1), "--format", fmt, "--out", str(target), *flag]
    yield [*SIM, "--out", str(target)]
    yield ["simulate", "--from", str(r1), "--out", str(target)]
    yield ["run", *CHEAP_RUN, "--out", str(target)]
    yield ["tune", *CHEAP_RUN, "--out", str(target)]
    yield ["demo", "--no-dashboard", "--out", str(target)]


def test_no_command_writes_into_a_run_or_replaces_a_file(runs: Runs, tmp_path: Path, capsys: Capsys) -> None:
    """Outputs pointed into the input run, into a run next to it, at a run, at an exported trace being read or
    at any existing file or folder are refused, with --force too where it is one; no file anywhere changes."""
    r1, r2 = runs
    trace = tmp_path / "r1.sqlite"
    assert main(["export", str(r1), "--format", "nsys-sqlite", "--out", str(trace)]) == 0
    (tmp_path / "mine.html").write_text("keep")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    (tmp_path / "runs" / "latest").symlink_to("r1")  # a way into a run that names no run
    capsys.readouterr()
    before = snapshot(tmp_path)
    in_runs = [p for r in (r1, r2) for p in (r, r / "meta.json", r / "rank-00001.sqlite", r / "new", r / "a" / "b")]
    in_runs += [tmp_path / "runs" / "latest" / "new.html", tmp_path / "runs" / "latest"]
    for target in in_runs:
        for force in (False, True):
            for args in _commands(target, r1, force=force):
                one_line_error(capsys, args, OUTPUT_CODES)
                assert snapshot(tmp_path) == before, args
    existing = [*_commands(tmp_path / "mine.html", r1, force=False), *_commands(trace, trace, force=True)]
    existing += [a for a in _commands(tmp_path / "mine", r1, force=False) if a[0] not in ("tune", "demo")]
    for args in existing:  # tune and demo add runs to an existing folder: that replaces nothing
        one_line_error(capsys, args, OUTPUT_CODES)
        assert snapshot(tmp_path) == before, args

    # Written where they may, each command adds its output and changes nothing else.
    fresh = tmp_path / "out"
    fresh.mkdir()
    outputs = {"analyze": "r.html", "nsys-sqlite": "x.sqlite", "chrome": "x.json", "nvtxt": "x-nvtxt"}
    names = [*outputs, "simulate", "replay", "run"]  # tune and demo take minutes
    for name, args in zip(names, list(_commands(fresh / "_", r1, force=False))[: len(names)], strict=True):
        out = fresh / outputs.get(name, name)
        assert main([*args[:-1], str(out)]) == 0, args
        capsys.readouterr()
        assert out.exists()
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("out")} == before
    assert len(open_trace(fresh / "x.sqlite").spans) == len(load_run(r1).spans)
