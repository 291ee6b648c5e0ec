"""The `ppscope` command: every subcommand has help and an example; errors are one line, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import ppscope
from ppscope.cli.main import COMMANDS, main
from ppscope.errors import ErrorCode


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ppscope", *args], capture_output=True, text=True, timeout=60)


def test_version() -> None:
    out = _run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"ppscope {ppscope.__version__}"


def test_help_lists_every_command() -> None:
    out = _run("--help")
    assert out.returncode == 0
    for name in ("run", "analyze", "rebalance", "simulate", "plan", "export", "dashboard", "demo"):
        assert name in COMMANDS
        assert f"    {name}" in out.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_and_an_example(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert f"usage: ppscope {name}" in text
    assert "example" in text.lower(), f"`ppscope {name} --help` shows no example"


@pytest.mark.parametrize("name", ["analyze", "export", "rebalance", "dashboard"])
def test_bad_input_is_one_line_without_traceback(name: str, tmp_path: Path) -> None:
    out = _run(name, str(tmp_path / "no-such-run"))
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ppscope {name}: error:"), out.stderr


def test_under_json_an_error_is_also_a_json_object_with_its_code(tmp_path: Path) -> None:
    out = _run("analyze", str(tmp_path / "no-such-run"), "--json")
    assert out.returncode == 2 and out.stderr.startswith("ppscope analyze: error: ")
    error = json.loads(out.stdout)["error"]
    assert error["code"] == ErrorCode.RUN_NOT_FOUND and out.stderr.strip().endswith(error["text"])
    assert _run("analyze", str(tmp_path / "no-such-run")).stdout == ""  # without --json, stdout stays empty


def test_a_mistyped_option_shows_the_usage_of_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--stags", "4"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ppscope run ") and err.strip().endswith("error: unrecognized arguments: --stags 4")


def test_import_ppscope_pulls_in_neither_torch_nor_streamlit() -> None:
    code = (
        "import sys, ppscope, ppscope.cli.main, ppscope.trace.store, ppscope.trace.recorder\n"
        "import ppscope.trace.model, ppscope.balance.modelled.shapes, ppscope.trace.outputs\n"
        "ppscope.cli.main.build_parser()\n"
        "bad = [m for m in ('torch', 'streamlit') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_ctrl_c_while_the_commands_load_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ppscope.cli.main

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ppscope.cli.main, "build_parser", interrupted)
    assert main(["analyze", "x"]) == 130
    assert capsys.readouterr().err == "ppscope: interrupted\n"
