"""Faults while the real engine runs (CPU, synthetic model): a rank killed, Ctrl-C, a dashboard tailing a run
that is written and then deleted, and two analyzers reading a run while it is written.

Each test starts `ppscope run` as a subprocess in its own session, so signals reach it as they would from a
terminal, and kills what is left of its process group at the end whatever happened.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ppscope.analysis import analyze
from ppscope.dashboard.data import LiveTrace
from ppscope.errors import ErrorCode, PPScopeError, RunNotFoundError
from ppscope.trace.rankfile import connect_ro
from ppscope.trace.store import RunTail, load_run, rank_file, read_meta

pytestmark = pytest.mark.timeout(120)

PYTHON = sys.executable
TIMEOUT_S = 10


def _run_cmd(out: Path, *, requests: int = 400, layer_cost_ms: str = "2") -> list[str]:
    return [
        PYTHON,
        "-m",
        "ppscope",
        "run",
        "--stages",
        "2",
        "--schedule",
        "serve",
        "--model",
        "synthetic",
        "--layers",
        "2",
        "--layer-cost-ms",
        layer_cost_ms,
        "--requests",
        str(requests),
        "--max-new-tokens",
        "16",
        "--timeout",
        str(TIMEOUT_S),
        "--no-progress",
        "--json",  # a failure is also one JSON object on stdout, with its code
        "--out",
        str(out),
    ]


def _children(pid: int) -> set[int]:
    """Every live descendant of `pid`, read from /proc (ranks are children of the forkserver, not the launcher)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass(kw_only=True)
class Started:
    proc: subprocess.Popen[bytes]
    out: Path
    rank_pids: list[int]
    family: set[int]


def _spans_on_disk(path: Path) -> int:
    """Spans a rank has committed to its file so far, read as any reader does (read-only, never writing);
    0 while the file or its schema is not there yet."""
    with contextlib.suppress(PPScopeError, sqlite3.Error), contextlib.closing(connect_ro(path)) as db:
        return int(db.execute("SELECT count(*) FROM spans").fetchone()[0])
    return 0


@contextlib.contextmanager
def _started(out: Path, **kw: object) -> Iterator[Started]:
    """Start `ppscope run`, wait until every rank wrote its pid and spans, and clean up whatever happens."""
    proc = subprocess.Popen(_run_cmd(out, **kw), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # type: ignore[arg-type]
    family: set[int] = set()
    try:
        # A rank's file is made before its stage is built and the ranks meet, and its spans reach it from a
        # background flush: wait until each file holds some, however long a loaded machine takes to get there.
        deadline = time.monotonic() + 60
        pids: list[int] = []
        flushed = False
        while time.monotonic() < deadline and proc.poll() is None:
            family |= _children(proc.pid)
            with contextlib.suppress(OSError, ValueError, PPScopeError):
                ranks = json.loads((out / "meta.json").read_text()).get("ranks") or []
                pids = [int(r["pid"]) for r in ranks]
                flushed = len(pids) == 2 and all(_spans_on_disk(rank_file(out, r)) > 0 for r in range(2))
                if flushed:
                    break
            time.sleep(0.05)
        assert len(pids) == 2, f"the ranks never started: {proc.communicate(timeout=30)}"
        assert flushed, "no span reached the rank files within 60 s" + (
            f": {proc.communicate(timeout=30)}" if proc.poll() is not None else ""
        )
        family |= _children(proc.pid)
        yield Started(proc=proc, out=out, rank_pids=pids, family=family)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in family:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _wait_gone(pids: set[int], timeout_s: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = {p for p in pids if _alive(p)}
        if not left:
            return left
        time.sleep(0.05)
    return {p for p in pids if _alive(p)}


@dataclass(kw_only=True)
class Outcome:
    rc: int
    stderr: str
    error: dict[str, str] | None
    """The error that `--json` printed, with its code; None if it printed none."""
    seconds: float
    left: set[int]
    out: Path


def _signal_run(out: Path, how: str) -> Outcome:
    with _started(out) as run:
        t0 = time.monotonic()
        if how == "kill":
            os.kill(run.rank_pids[1], signal.SIGKILL)
        else:
            os.killpg(run.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        printed, err = run.proc.communicate(timeout=TIMEOUT_S + 30)
        seconds = time.monotonic() - t0
        left = _wait_gone(run.family | set(run.rank_pids))
        lines = printed.decode().strip().splitlines()
        error = json.loads(lines[-1]).get("error") if lines else None
        return Outcome(rc=run.proc.returncode, stderr=err.decode(), error=error, seconds=seconds, left=left, out=out)


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    return _signal_run(tmp_path_factory.mktemp("kill") / "run", "kill")


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    return _signal_run(tmp_path_factory.mktemp("int") / "run", "int")


@pytest.mark.slow
def test_sigkilled_rank_fails_the_run_within_its_timeout(killed: Outcome) -> None:
    assert killed.rc == 3, killed.stderr
    assert killed.seconds < TIMEOUT_S + 5
    assert killed.error is not None and killed.error["code"] == ErrorCode.RANK_KILLED, killed.stderr
    assert str(killed.out) in killed.error["text"]  # where the trace is
    assert not killed.left, f"processes left behind: {killed.left}"
    meta = read_meta(killed.out)
    assert meta.status == "failed" and "rank" in meta.error
    trace = load_run(killed.out)  # the killed rank's spans up to the kill are there
    per_rank = trace.spans.groupby("rank").size().to_dict()
    assert per_rank.get(0, 0) > 0 and per_rank.get(1, 0) > 0
    # The killed rank left its WAL behind. A reader may rebuild the WAL index (-shm, SQLite's shared memory,
    # not data) but must change nothing else.
    data_files = [p for p in killed.out.iterdir() if not p.name.endswith("-shm")]
    before = {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in data_files}
    done = subprocess.run(
        [PYTHON, "-m", "ppscope", "analyze", str(killed.out), "--json"], capture_output=True, timeout=120, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)
    assert {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in data_files} == before


@pytest.mark.slow
def test_sigkilled_rank_is_the_one_named(killed: Outcome) -> None:
    assert killed.error is not None and killed.error["text"].startswith("rank 1 "), killed.stderr


@pytest.mark.slow
def test_ctrl_c_marks_the_run_interrupted(interrupted: Outcome) -> None:
    assert interrupted.rc == 130, interrupted.stderr
    assert interrupted.error is None or interrupted.error["code"] == ErrorCode.INTERRUPTED, interrupted.error
    assert not interrupted.left, f"processes left behind: {interrupted.left}"
    meta = read_meta(interrupted.out)
    assert meta.status == "interrupted"
    trace = load_run(interrupted.out)
    assert set(trace.spans["rank"].unique()) == {0, 1}
    latency = analyze(trace).latency  # of the 400 requests asked for, those finished before the stop
    assert latency is not None and latency.requests == 400 and latency.finished == len(trace.requests) < 400


@pytest.mark.slow
def test_ctrl_c_lets_every_rank_flush_and_close(interrupted: Outcome) -> None:
    left = sorted(p.name for p in interrupted.out.glob("rank-*.sqlite-wal"))
    assert not left, f"ranks that did not flush and close their file: {left}"


@pytest.mark.slow
def test_dashboard_tails_a_run_while_written_then_deleted(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with _started(out, requests=60) as run:
        live = LiveTrace(out, is_run=True)
        versions = []
        while run.proc.poll() is None:
            live.refresh()  # never raises; a transient error is said in .error
            versions.append(live.version)
            time.sleep(0.05)
        assert run.proc.returncode == 0, run.proc.communicate()[1]
        live.refresh()
        assert live.error == "" and not live.live
        assert live.meta.status == "finished"
        assert len(live.trace.spans) == len(load_run(out).spans) > 0
        assert versions == sorted(versions) and versions[-1] > 1  # it grew while the run was written

    out2 = tmp_path / "run2"
    with _started(out2, requests=400) as run:
        live = LiveTrace(out2, is_run=True)
        live.refresh()
        shown = len(live.trace.spans)
        tail = RunTail(out2)
        tail.poll()
        shutil.rmtree(out2)
        for _ in range(5):
            live.refresh()
        assert live.gone and "does not exist" in live.error
        assert len(live.trace.spans) == shown  # the last good data is kept
        with pytest.raises(RunNotFoundError):
            tail.poll()


def _fingerprint(run_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run_dir.iterdir()) if p.is_file()}


def _two_analyzers(run_dir: Path) -> list[subprocess.CompletedProcess[str]]:
    cmd = [PYTHON, "-m", "ppscope", "analyze", str(run_dir), "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    done = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=90)
        finally:
            if p.poll() is None:
                p.kill()
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


@pytest.mark.slow
def test_two_analyzers_read_a_run_while_it_is_written(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # Far more requests than the readers can take to finish, however slow the machine: the run is stopped
    # (Ctrl-C) once they are done, so it cannot end before them and its length costs nothing.
    with _started(out, requests=100_000) as run:
        while_written = _two_analyzers(out)
        assert run.proc.poll() is None, f"the run ended before the readers did: {run.proc.communicate()[1]!r}"
        os.killpg(run.proc.pid, signal.SIGINT)
        _, err = run.proc.communicate(timeout=TIMEOUT_S + 30)
    assert run.proc.returncode == 130 and read_meta(out).status == "interrupted", err.decode()
    for done in while_written:
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)
    before = _fingerprint(out)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    for done in _two_analyzers(out):  # a reader-only period: nothing may change
        assert done.returncode == 0, done.stderr
    assert _fingerprint(out) == before
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
