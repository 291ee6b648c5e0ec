"""The launcher when a run goes wrong early or in pieces: Ctrl-C while the ranks start, the rank to blame when
several fail, and an --out that cannot be made."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from error_helpers import cli_error, raises_code

from ppscope.engine.config import EngineConfig, ModelConfig, OutputConfig, PipelineConfig, WorkloadConfig
from ppscope.engine.launch import CPP_LOG_LEVEL_ENV, _interrupt_deferred, _supervise, rank_environment, run
from ppscope.engine.testing import FAIL_ENV
from ppscope.errors import EngineFailedError, ErrorCode
from ppscope.failures import FailureCode, RankError
from ppscope.trace.store import read_meta

pytestmark = pytest.mark.timeout(120)

FAST = ModelConfig(name="synthetic", layers=2, layer_cost_ms=(0.0,))
QUIET = OutputConfig(progress=False)
PEER, OWN = FailureCode.PEER, FailureCode.OWN
PEER_ERROR = (
    "RuntimeError: rank 1: receive from rank 0 failed: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:14008. This is typically caused by a remote worker crashing. GLHF!"
)


@contextlib.contextmanager
def _launched(args: list[str], **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """`ppscope run ARGS` in a session of its own, so signals reach it as from a terminal; whatever is left of it
    is killed at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppscope", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.0, 0.4])
def test_ctrl_c_while_the_ranks_start_is_one_line_and_marks_the_run(tmp_path: Path, after_s: float) -> None:
    """Ctrl-C from a terminal (SIGINT to the whole process group) once the run directory exists, while the fork
    server imports the engine and the ranks start: one line, exit 130, and the run is marked interrupted."""
    out = tmp_path / "run"
    args = ["--stages", "2", "--requests", "50", "--max-new-tokens", "50", "--no-progress", "--json", "--out", str(out)]
    with _launched(args) as proc:
        deadline = time.monotonic() + 60
        while not (out / "meta.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(after_s)
        os.killpg(proc.pid, signal.SIGINT)
        printed, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert len(err.strip().splitlines()) == 1, err
    error = json.loads(printed)["error"]
    assert error["code"] == ErrorCode.INTERRUPTED and str(out) in error["text"], error  # where the record is
    meta = read_meta(out)
    assert meta.status == "interrupted" and meta.error == "interrupted by the user"


@pytest.mark.slow
@pytest.mark.timeout(900)  # 50 runs of 2 to 5 s each
def test_ctrl_c_at_50_random_moments_never_leaves_a_run_running(tmp_path: Path) -> None:
    """Ctrl-C anywhere in a run's life, from the moment its directory exists to its end: the run is marked
    interrupted (exit 130) or, when the run ended first, finished; never left `running`."""
    rng = random.Random(50)
    args = ["--stages", "2", "--requests", "2", "--max-new-tokens", "4", "--no-progress"]
    seen: dict[str, int] = {}
    for i in range(50):
        out = tmp_path / f"run-{i}"
        with _launched([*args, "--out", str(out)]) as proc:
            deadline = time.monotonic() + 60
            while not (out / "meta.json").exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 3.0))  # a run of this size lasts 2 to 4 s from here
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        status = read_meta(out).status
        # a run that ended first is finished, its process stopped or not on its way out (130 while it prints its
        # summary, -2 as the interpreter exits); one that was interrupted says so and exits 130
        assert status in ("interrupted", "finished"), (i, status, err)
        assert proc.returncode in ((130,) if status == "interrupted" else (0, 130, -2)), (i, status, err)
        seen[status] = seen.get(status, 0) + 1
    assert seen.get("interrupted", 0) > 0  # the moments reached into the run, not only past its end


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_every_rank_and_marks_the_run(tmp_path: Path) -> None:
    """A job scheduler's SIGTERM to the launcher alone: the ranks (children of the fork server, not of the
    launcher) must not run on orphaned, and the run must not stay `running`."""
    out = tmp_path / "run"
    args = [
        "--stages",
        "2",
        "--model",
        "synthetic",
        "--layers",
        "2",
        "--layer-cost-ms",
        "200",
        "--requests",
        "4",
        "--max-new-tokens",
        "8",
        "--no-progress",
        "--out",
        str(out),
    ]
    with _launched(args) as proc:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if (out / "meta.json").exists() and read_meta(out).ranks:
                break
            time.sleep(0.05)
        pids = [r.pid for r in read_meta(out).ranks]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and len(err.strip().splitlines()) == 1, err
    meta = read_meta(out)
    assert (meta.status, meta.error) == ("interrupted", "stopped by SIGTERM"), meta
    deadline = time.monotonic() + 10  # stopped, and reaped by whoever is their parent now
    while (alive := [pid for pid in pids if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_ctrl_c_is_held_until_the_end_of_a_deferred_block() -> None:
    with pytest.raises(KeyboardInterrupt), _interrupt_deferred():
        signal.raise_signal(signal.SIGINT)
        reached = True
    assert reached
    with _interrupt_deferred(drop=True):
        signal.raise_signal(signal.SIGINT)


class _Proc:
    """What `_supervise` reads of a rank's process."""

    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode

    def join(self, timeout: float | None = None) -> None:
        pass


def _supervised(procs: list[_Proc], events: list[tuple[Any, ...]], tmp_path: Path) -> EngineFailedError:
    q: queue.Queue[tuple[Any, ...]] = queue.Queue()
    for e in events:
        q.put(e)
    cfg = EngineConfig(pipeline=PipelineConfig(stages=len(procs)), model=FAST, output=QUIET)
    with pytest.raises(EngineFailedError) as exc:
        _supervise(cfg, procs, q, tmp_path, 1, None)  # type: ignore[arg-type]
    assert "\n" not in str(exc.value)
    return exc.value


def test_the_rank_whose_own_code_failed_is_blamed_not_the_peer_that_lost_it(tmp_path: Path) -> None:
    """A failing rank tears its process group down before it reports, so its peer's 'connection closed' often
    arrives first: the report names the root cause, and the echo is left out."""
    own = "RuntimeError: injected failure after 1 passes"
    procs = [_Proc(1), _Proc(1), _Proc(None)]
    err = _supervised(
        procs,
        [
            ("error", 1, RankError(PEER_ERROR, PEER), None),
            ("error", 2, RankError("TimeoutError: rank 2 received nothing from rank 1 for 60 s", PEER), 1),
            ("error", 0, RankError(own, OWN), None),
        ],
        tmp_path,
    )
    msg = str(err)
    assert err.code == ErrorCode.RANK_FAILED and msg.startswith("rank 0 ") and own in msg  # the cause, its error
    assert PEER_ERROR not in msg and str(tmp_path) in msg  # not the echo; where the trace is


def test_a_killed_rank_is_blamed_before_the_errors_it_caused(tmp_path: Path) -> None:
    err = _supervised([_Proc(-signal.SIGKILL), _Proc(1)], [("error", 1, RankError(PEER_ERROR, PEER), None)], tmp_path)
    msg = str(err)
    assert err.code == ErrorCode.RANK_KILLED and msg.startswith("rank 0 ") and "SIGKILL" in msg, msg  # blamed first
    assert msg.index("SIGKILL") < msg.index("rank 1") < msg.index(PEER_ERROR), msg  # then the error it caused
    err = _supervised([_Proc(7), _Proc(1)], [("error", 1, RankError(PEER_ERROR, PEER), None)], tmp_path)
    msg = str(err)
    assert err.code == ErrorCode.RANK_KILLED and msg.startswith("rank 0 ") and " 7 " in msg, msg  # its exit code
    assert msg.index(" 7 ") < msg.index("rank 1"), msg


def test_only_peer_failures_name_the_first_to_report(tmp_path: Path) -> None:
    err = _supervised(
        [_Proc(1), _Proc(1)],
        [
            ("error", 1, RankError(PEER_ERROR, PEER), None),
            (
                "error",
                0,
                RankError("RuntimeError: rank 0: send to rank 1 failed: Connection reset by peer", PEER),
                None,
            ),
        ],
        tmp_path,
    )
    assert err.code == ErrorCode.RANK_FAILED and str(err).startswith("rank 1 ") and PEER_ERROR in str(err)


@pytest.mark.slow
def test_a_failed_middle_rank_is_named_among_its_peers_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three real ranks: the middle one fails, both of its neighbours lose their link to it."""
    monkeypatch.setenv(FAIL_ENV, "1=1")
    # Rank 1's own report may come after its neighbours' on a loaded machine, and is weighed only if it comes
    # within the blame wait. Every rank reports here, which ends the wait at once, so a long one costs nothing.
    monkeypatch.setattr("ppscope.engine.launch._BLAME_WAIT_S", 30.0)
    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=3),
        model=ModelConfig(name="synthetic", layers=3, layer_cost_ms=(0.0,)),
        workload=WorkloadConfig(requests=3, max_new_tokens=3),
        output=OutputConfig(progress=False, out=tmp_path / "run"),
    )
    with raises_code(EngineFailedError, ErrorCode.RANK_FAILED) as err:
        run(cfg)
    assert str(err.value).startswith("rank 1 ") and "RuntimeError: injected failure after 1 passes" in str(err.value)
    meta = read_meta(tmp_path / "run")
    assert meta.status == "failed" and meta.error.startswith("rank 1 ") and "injected failure" in meta.error


def test_out_that_cannot_be_made_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile.txt").write_text("x")
    out = tmp_path / "afile.txt" / "sub"
    argv = ["run", "--model", "synthetic", "--layers", "2", "--layer-cost-ms", "0", "--requests", "1"]
    failed = cli_error(capsys, [*argv, "--max-new-tokens", "1", "--no-progress", "--out", str(out)])
    assert failed.exit_code == 2 and failed.code == ErrorCode.OUTPUT_NOT_WRITABLE and failed.err.count("\n") == 1
    assert str(out) in failed.text and "--out" in failed.text  # the path, and the option that fixes it
    assert (tmp_path / "afile.txt").read_text() == "x" and json.dumps(sorted(os.listdir(tmp_path))) == '["afile.txt"]'


@pytest.mark.slow
def test_a_silent_rank_others_heard_nothing_from_is_named_as_hanging(tmp_path: Path) -> None:
    """A frozen rank (kill -STOP, a deadlock) reports nothing; its successor times out waiting for it and its
    predecessor loses the link when the successor goes: the frozen one is named, not the first to report."""
    timeout = "TimeoutError: rank 2 received nothing from rank 1 for 5 s (a peer failed or hangs)"
    err = _supervised(
        [_Proc(1), _Proc(None), _Proc(1)],
        [("error", 0, RankError(PEER_ERROR, PEER), None), ("error", 2, RankError(timeout, PEER), 1)],
        tmp_path,
    )
    assert err.code == ErrorCode.RANK_HANGS and str(err).startswith("rank 1 ") and timeout in str(err), err


@pytest.mark.slow
@pytest.mark.parametrize("given", [None, "WARNING"])
def test_ranks_load_torch_with_its_cpp_logs_quiet_unless_the_caller_set_them(tmp_path: Path, given: str | None) -> None:
    """torch reads its C++ log level once, as it loads: the level must be in the environment each rank's process
    (or the fork server it comes from) started with, which /proc/PID/environ shows. The run lasts until the test
    has read it (40 s of work), then is stopped with Ctrl-C."""
    env = {k: v for k, v in os.environ.items() if k != CPP_LOG_LEVEL_ENV}
    if given:
        env[CPP_LOG_LEVEL_ENV] = given
    out = tmp_path / "run"
    args = [
        "--stages",
        "2",
        "--model",
        "synthetic",
        "--layers",
        "2",
        "--layer-cost-ms",
        "50",
        "--requests",
        "2",
        "--max-new-tokens",
        "400",
        "--no-progress",
        "--out",
        str(out),
    ]
    with _launched(args, env=env) as proc:
        deadline = time.monotonic() + 60
        ranks: list[int] = []
        while proc.poll() is None and time.monotonic() < deadline and len(ranks) < 2:
            time.sleep(0.05)
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                ranks = [int(r["pid"]) for r in json.loads((out / "meta.json").read_text())["ranks"]]
        assert len(ranks) == 2 and proc.poll() is None, (
            f"the ranks never started: {proc.stderr.read() if proc.poll() is not None and proc.stderr else ''}"
        )
        started = [Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") for pid in ranks]
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    for environ in started:
        assert f"{CPP_LOG_LEVEL_ENV}={given or 'FATAL'}".encode() in environ
    assert rank_environment({"A": "1"}, "gloo") == {"A": "1", CPP_LOG_LEVEL_ENV: "FATAL"}
    assert rank_environment({CPP_LOG_LEVEL_ENV: "INFO"}, "gloo") == {CPP_LOG_LEVEL_ENV: "INFO"}
    assert rank_environment({"A": "1"}, "nccl") == {"A": "1"}  # NCCL's watchdog may say what a hang waits on


def test_the_silent_peer_travels_as_a_field_not_as_text() -> None:
    from ppscope.engine.comm import PeerTimeout, silent_peer

    timeout = PeerTimeout("rank 2 received nothing from rank 1 for 5 s", peer=1)
    assert silent_peer(timeout) == 1
    try:
        try:
            raise timeout
        except PeerTimeout as inner:
            raise RuntimeError("stage 2 stopped") from inner
    except RuntimeError as outer:
        assert silent_peer(outer) == 1
    assert silent_peer(TimeoutError("rank 2 received nothing from rank 1 for 5 s")) is None


def test_a_backend_timeout_becomes_a_code_in_one_adapter() -> None:
    """gloo says a receive timed out only in its message: `wait_failure` reads it, once, into a code."""
    from ppscope.engine.comm import WaitFailure, wait_failure

    gloo = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Timed out waiting 5000ms for recv operation to complete")
    assert wait_failure(gloo) is WaitFailure.TIMEOUT
    assert wait_failure(RuntimeError("Connection closed by peer [127.0.0.1]:5555")) is WaitFailure.BROKEN


def test_a_rank_says_whose_failure_it_is_by_the_type_of_its_error() -> None:
    """The failing rank decides, where it fails: its link breaking (the ring's own errors, torch.distributed's,
    gloo's connection closed by its peer) is an echo, anything else its own; the code travels, not the text."""
    import torch.distributed as dist

    from ppscope.engine.comm import PeerLinkError, PeerTimeout, failure_code

    assert failure_code(PeerTimeout("rank 2 received nothing from rank 1 for 5 s", peer=1)) is PEER
    assert failure_code(PeerLinkError("rank 2: receive from rank 1 failed: x", peer=1)) is PEER
    assert failure_code(dist.DistNetworkError("anything at all")) is PEER
    assert failure_code(RuntimeError("Connection closed by peer [127.0.0.1]:5555")) is PEER  # gloo's, untyped
    assert failure_code(RuntimeError("injected failure after 1 passes")) is OWN
    assert failure_code(KeyError("a message that says: send to rank 3 timed out")) is OWN  # words, not the type
    try:
        try:
            raise PeerTimeout("rank 2 received nothing from rank 1 for 5 s", peer=1)
        except PeerTimeout as inner:
            raise ValueError("stage 2 stopped") from inner
    except ValueError as outer:
        assert failure_code(outer) is PEER


@pytest.mark.slow
def test_a_message_that_only_reads_like_a_timeout_names_no_hang(tmp_path: Path) -> None:
    """Wording is for people: a rank is named as hanging only when a peer's report says it waited on it."""
    timeout = "TimeoutError: rank 2 received nothing from rank 1 for 5 s (a peer failed or hangs)"
    err = _supervised(
        [_Proc(1), _Proc(None), _Proc(1)],
        [("error", 0, RankError(PEER_ERROR, PEER), None), ("error", 2, RankError(timeout, PEER), None)],
        tmp_path,
    )
    assert err.code != ErrorCode.RANK_HANGS, err


def test_a_rank_interrupted_inside_an_import_is_interrupted_once_it_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    # A signal handled in a module lock's weakref callback raises into a frame whose exception Python prints
    # as "ignored" and drops: the handler asks again a moment later instead of raising there.
    import types

    from ppscope.engine import launch

    later: list[tuple[float, Any, tuple[Any, ...]]] = []

    class Timer:
        def __init__(self, delay: float, fn: Any, args: tuple[Any, ...]) -> None:
            later.append((delay, fn, args))

        def start(self) -> None:
            pass

    monkeypatch.setattr(launch.threading, "Timer", Timer)
    importing = types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename="<frozen importlib._bootstrap>"))
    launch._interrupt_once(signal.SIGINT, importing)  # no raise
    assert later == [(0.05, os.kill, (os.getpid(), signal.SIGINT))]
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN  # the next one still stops the rank
    elsewhere = types.SimpleNamespace(f_code=types.SimpleNamespace(co_filename=__file__))
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            launch._interrupt_once(signal.SIGINT, elsewhere)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
