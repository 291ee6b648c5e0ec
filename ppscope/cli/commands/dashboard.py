"""`ppscope dashboard`: open the live dashboard on a run, a folder of runs, or an imported trace.

The dashboard is a Streamlit app (`ppscope/dashboard/app.py`) started in a child process on 127.0.0.1 unless
told otherwise. `dashboard_command` gives its command line and `start_dashboard` starts it and waits until
it answers, so other commands (`ppscope demo`) can open it too. Nothing here imports Streamlit.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ppscope.errors import ErrorCode, InvalidConfigError, PPScopeError, RunNotFoundError

if TYPE_CHECKING:
    from types import FrameType

    from ppscope.cli.argtypes import Subcommands

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "Dashboard", "dashboard_command", "find_app", "register", "start_dashboard"]

HELP = "Open the live dashboard on a run, a folder of runs, or an imported trace"
EXAMPLE = "ppscope dashboard runs/  (then open the URL it prints)"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8501
_PORT_TRIES = 50
_DESCRIPTION = (
    f"{HELP}. Starts a Streamlit server on {DEFAULT_HOST} (only this machine can reach it) and prints its URL. "
    "The page opens only the paths given here: a run directory (refreshed about every second while it is "
    "written), an nsys .sqlite export, a Kineto trace, or a folder whose runs are listed to pick from."
)


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "dashboard", help=HELP, description=_DESCRIPTION, epilog=f"example: {EXAMPLE}"
    )
    p.add_argument(
        "paths", nargs="+", metavar="PATH", help="run directory, nsys .sqlite, Kineto trace, or a folder of runs"
    )
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}; 0.0.0.0 exposes the dashboard, without login, "
        "to every machine that reaches this one)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"port (default: {DEFAULT_PORT}, or the next free one; 0 picks any free port)",
    )
    p.add_argument(
        "--ranks-in-memory",
        type=int,
        default=None,
        metavar="N",
        help="a run of several data-parallel pipelines with more rank files than N is shown a rank at a time "
        "(every page, without loading it; while it is written, read again as its files change); "
        "default 256",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    board = start_dashboard(args.paths, host=args.host, port=args.port, ranks_in_memory=args.ranks_in_memory)
    # `kill` stops the server too, not only Ctrl-C: in place before the URL is printed, so that a caller who
    # stops this process as soon as it has the URL never leaves the server behind
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        print(f"ppscope dashboard: serving {board.url}  (Ctrl-C to stop)", flush=True)
        if not is_loopback(args.host):
            print(
                f"ppscope dashboard: warning: listening on {args.host}: anyone who can reach this machine can see "
                "these traces (there is no login)",
                file=sys.stderr,
            )
        return board.process.wait()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: 130, as every command that is interrupted
        board.stop()
        print("ppscope dashboard: stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def find_app() -> Path:
    """Where the dashboard's Streamlit script is; a clear error when Streamlit or the app is not installed."""
    if importlib.util.find_spec("streamlit") is None:
        raise PPScopeError(
            ErrorCode.NOT_INSTALLED,
            "the dashboard needs Streamlit, which is not installed: pip install 'ppscope[dashboard]'",
        )
    spec = importlib.util.find_spec("ppscope.dashboard")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        app = Path(location) / "app.py"
        if app.is_file() and (Path(location) / "views.py").is_file():
            return app
    raise PPScopeError(
        ErrorCode.NOT_INSTALLED,
        "the ppscope dashboard app is not installed: reinstall with pip install 'ppscope[dashboard]'",
    )


def dashboard_command(
    paths: Sequence[str | os.PathLike[str]],
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    ranks_in_memory: int | None = None,
) -> list[str]:
    """The command line that serves the dashboard on `paths` at host:port (checks the paths exist);
    `ranks_in_memory`: the most rank files of a run of many pipelines that the dashboard loads whole."""
    _check_paths(paths)
    if not 0 < port < 65536:
        raise InvalidConfigError(ErrorCode.BAD_VALUE, f"--port must be between 1 and 65535, got {port}")
    if ranks_in_memory is not None and ranks_in_memory < 0:
        raise InvalidConfigError(ErrorCode.BAD_VALUE, f"--ranks-in-memory must be >= 0, got {ranks_in_memory}")
    limit = [] if ranks_in_memory is None else [f"--ranks-in-memory={ranks_in_memory}"]  # app.RANKS_OPTION
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(find_app()),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--server.fileWatcherType",
        "none",
        "--browser.gatherUsageStats",
        "false",
        "--global.developmentMode",
        "false",
        "--client.toolbarMode",
        "viewer",
        "--",
        *limit,
        *(str(p) for p in paths),
    ]


@dataclass
class Dashboard:
    """A running dashboard server."""

    process: subprocess.Popen[bytes]
    url: str

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (terminate, then kill if it does not exit in time)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_dashboard(
    paths: Sequence[str | os.PathLike[str]],
    *,
    host: str = DEFAULT_HOST,
    port: int | None = None,
    wait_s: float = 60.0,
    quiet: bool = False,
    ranks_in_memory: int | None = None,
) -> Dashboard:
    """Start the dashboard server on `paths` and return once it answers at its URL.

    port None takes DEFAULT_PORT or the next free one, 0 any free port; an explicit port that is taken is
    an error. quiet=True sends the server's own output to /dev/null. `ranks_in_memory`: as `dashboard_command`.
    """
    _check_paths(paths)
    chosen = _choose_port(host, port)
    cmd = dashboard_command(paths, host=host, port=chosen, ranks_in_memory=ranks_in_memory)
    env = dict(os.environ)
    root = str(find_app().parent.parent)  # the app imports `dashboard`, also from a source checkout
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    out = subprocess.DEVNULL if quiet else None
    process = subprocess.Popen(cmd, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    shown_host = f"[{host}]" if ":" in host else host
    board = Dashboard(process=process, url=f"http://{shown_host}:{chosen}")
    _wait_until_up(board, host, chosen, wait_s)
    return board


def _check_paths(paths: Sequence[str | os.PathLike[str]]) -> None:
    if not paths:
        raise RunNotFoundError(
            ErrorCode.NO_TRACE_GIVEN,
            "no trace given: pass a run directory, an nsys .sqlite, a Kineto trace or a folder",
        )
    for path in paths:
        if not Path(path).exists():
            raise RunNotFoundError(
                ErrorCode.RUN_NOT_FOUND,
                f"{path} does not exist: give a run directory, a trace file or a folder of runs",
            )


def _wait_until_up(board: Dashboard, host: str, port: int, wait_s: float) -> None:
    connect = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    shown = f"[{connect}]" if ":" in connect else connect
    health = f"http://{shown}:{port}/_stcore/health"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        code = board.process.poll()
        if code is not None:
            raise PPScopeError(
                ErrorCode.DASHBOARD_FAILED,
                f"the dashboard server exited with status {code} before it answered (its output says why)",
            )
        with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(health, timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.2)
    board.stop()
    raise PPScopeError(
        ErrorCode.DASHBOARD_FAILED, f"the dashboard server did not answer at {board.url} within {wait_s:.0f} s"
    )


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (a server bound there is reachable from nowhere else)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _choose_port(host: str, port: int | None) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, 0))  # also tells a bad --host from busy ports
        except (OSError, OverflowError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            raise InvalidConfigError(
                ErrorCode.CANNOT_LISTEN, f"cannot listen on {host!r}: {why}; give an address of this machine"
            ) from None
        any_port = int(s.getsockname()[1])
    if port == 0:
        return any_port
    if port is not None:
        if not 0 < port < 65536:
            raise InvalidConfigError(ErrorCode.BAD_VALUE, f"--port must be between 1 and 65535, got {port}")
        if not _port_free(host, port):
            raise InvalidConfigError(
                ErrorCode.PORT_IN_USE, f"port {port} on {host} is in use: pick another --port, or --port 0 for any"
            )
        return port
    for candidate in range(DEFAULT_PORT, DEFAULT_PORT + _PORT_TRIES):
        if _port_free(host, candidate):
            return candidate
    raise InvalidConfigError(
        ErrorCode.PORT_IN_USE,
        f"ports {DEFAULT_PORT}-{DEFAULT_PORT + _PORT_TRIES - 1} on {host} are all in use: give --port N or --port 0",
    )
