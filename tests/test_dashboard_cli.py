"""`ppscope dashboard`: the command line it starts, port and host handling, and the real server answering."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from error_helpers import raises_code
from test_dashboard_runs import record_gpipe_run

from ppscope.cli.commands.dashboard import DEFAULT_HOST, _choose_port, dashboard_command, find_app
from ppscope.errors import ErrorCode, InvalidConfigError, RunNotFoundError


def test_command_line_binds_to_loopback_and_passes_only_the_paths(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run")
    cmd = dashboard_command([run], port=8600)
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"]
    assert Path(cmd[4]) == find_app() and find_app().name == "app.py"
    opts = dict(zip(cmd[5 : cmd.index("--") : 2], cmd[6 : cmd.index("--") : 2], strict=True))
    assert opts["--server.address"] == DEFAULT_HOST == "127.0.0.1"
    assert opts["--server.port"] == "8600"
    assert opts["--server.headless"] == "true"
    assert opts["--browser.gatherUsageStats"] == "false"
    assert cmd[cmd.index("--") + 1 :] == [str(run)]


def test_missing_path_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with raises_code(RunNotFoundError, ErrorCode.RUN_NOT_FOUND):
        dashboard_command([tmp_path / "nope"])
    with raises_code(RunNotFoundError, ErrorCode.NO_TRACE_GIVEN):
        dashboard_command([])


def test_ports() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with raises_code(InvalidConfigError, ErrorCode.PORT_IN_USE) as err:
            _choose_port("127.0.0.1", taken)
        assert f"port {taken} " in str(err.value)
    assert 0 < _choose_port("127.0.0.1", 0) < 65536
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        _choose_port("127.0.0.1", 70000)
    with raises_code(InvalidConfigError, ErrorCode.CANNOT_LISTEN) as err:
        _choose_port("203.0.113.7", None)  # not an address of this machine
    assert "'203.0.113.7'" in str(err.value)


@pytest.mark.slow
def test_cli_prints_the_url_and_serves(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppscope", "dashboard", str(run), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        url = ""
        deadline = time.monotonic() + 90
        assert proc.stdout is not None
        while time.monotonic() < deadline and not url:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("ppscope dashboard: serving "):
                url = line.split()[3]
        assert url.startswith("http://127.0.0.1:"), "no URL printed"
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=10) as resp:
            assert resp.status == 200
        proc.terminate()  # only the ppscope process: it must take its server down with it
        assert proc.wait(30) == 130  # stopped by a signal, as every command
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
