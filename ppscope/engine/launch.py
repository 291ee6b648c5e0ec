"""Start the ranks: spawn one process per stage on this machine, or run as one rank under torchrun.

`run(config)` is what `ppscope run` calls. Locally it checks the configuration (a bad split fails before
any process starts), creates the run directory, spawns the ranks on a free port, shows a progress bar,
and, when a rank fails, stops the others and raises EngineFailedError naming the rank whose failure caused
the others' (see `_failure`); what was recorded up to then stays readable. Under torchrun
(RANK/WORLD_SIZE/MASTER_ADDR set) this process is one rank and torchrun does the supervising.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ppscope.balance.modelled.shapes import PRESETS
from ppscope.engine.comm import failure_code, silent_peer
from ppscope.engine.config import EngineConfig
from ppscope.engine.prepare import Prepared, check_memory, host_available_bytes, prepare
from ppscope.engine.worker import default_run_dir, run_rank
from ppscope.errors import EngineFailedError, ErrorCode, InterruptedRunError, PPScopeError
from ppscope.failures import RankError, plain_error, rank_failure
from ppscope.trace.store import check_new_run_dir, create_run, read_meta, write_meta

CPP_LOG_LEVEL_ENV = "TORCH_CPP_LOG_LEVEL"
"""torch's C++ log level, read once as torch loads. Gloo ranks started here default it to FATAL: a failure
reaches the user as one line naming the rank that caused it, and a peer's fall-out logged from C++ beside it
(gloo's 'connectFullMesh failed' when a rank stops while the ranks connect) is noise. NCCL ranks keep torch's
default: its watchdog's report may be all that says which transfer a hang waits on. Set it to see gloo's
logs; the fork server keeps the level it started with, so in one process the first run's level holds."""
_INTERRUPT_GRACE_S = 15.0
"""How long ranks get to flush and close their files after Ctrl-C before they are terminated."""
_BLAME_WAIT_S = 3.0
"""After a rank fails, how long the others get to report (or show how they died) before the cause is named;
the wait ends as soon as every rank has reported or exited and nothing is left to read."""

__all__ = [
    "CPP_LOG_LEVEL_ENV",
    "free_port",
    "main_not_reimported",
    "rank_environment",
    "run",
    "under_torchrun",
]

ProgressHook = Callable[[int, int, int], None]
"""Called with (requests finished, requests total, tokens generated)."""


def under_torchrun() -> bool:
    env = os.environ
    return "TORCHELASTIC_RUN_ID" in env or all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(cfg: EngineConfig, *, on_progress: ProgressHook | None = None) -> Path:
    """Run the engine to the end and return the run directory. A SIGTERM is taken as a Ctrl-C: the ranks
    stop and the run is marked interrupted (torchrun stops every rank with it when one fails)."""
    with _sigterm_interrupts():
        if under_torchrun():
            return _run_torchrun(cfg)
        return _run_local(cfg, on_progress)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    why = "stopped by SIGTERM"
    if under_torchrun():
        why += " (torchrun sends it to every rank when one fails: see its log)"

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the run is stopping
        raise KeyboardInterrupt(why)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_local(cfg: EngineConfig, on_progress: ProgressHook | None) -> Path:
    stages = cfg.pipeline.stages
    prep = prepare(cfg, stages)  # raises before anything starts
    _check_checkpoint(cfg, prep)
    if prep.backend == "gloo" and cfg.runtime.device != "cuda":  # all on this host (on GPUs each rank checks its own)
        check_memory(prep, list(range(stages)), stages, host_available_bytes(), "this host", processes=True)
    run_dir = cfg.output.out or default_run_dir()
    procs: list[Any] = []
    events: Any = None
    created = False
    try:
        # A Ctrl-C while the run directory is made and the ranks start waits until every rank is known, so
        # all of them are stopped and the run is marked interrupted, wherever it came.
        with _interrupt_deferred():
            create_run(run_dir, prep.meta(stages))
            created = True
            if stages > 1:
                procs, events = _start_ranks(cfg, run_dir, prep.backend)
        if stages == 1:
            return _run_inline(cfg, prep, run_dir, on_progress)
        _supervise(cfg, procs, events, run_dir, len(prep.requests), on_progress)
    except KeyboardInterrupt as exc:
        with _interrupt_deferred(drop=True):  # a second Ctrl-C must not cut this short: the run would stay "running"
            _interrupt_all(procs, grace_s=min(cfg.runtime.timeout_s, _INTERRUPT_GRACE_S))
            if created:
                _mark(run_dir, "interrupted", str(exc) or "interrupted by the user")
        if not created:
            raise InterruptedRunError(
                ErrorCode.INTERRUPTED, "interrupted before the run started; nothing was recorded"
            ) from None
        raise InterruptedRunError(
            ErrorCode.INTERRUPTED, f"interrupted; what was recorded up to then is in {run_dir}"
        ) from None
    except EngineFailedError as exc:
        _stop_all(procs)
        _mark(run_dir, "failed", str(exc))
        raise
    return run_dir


def _start_ranks(cfg: EngineConfig, run_dir: Path, backend: str) -> tuple[list[Any], Any]:
    """Start every rank; returns the processes and the queue they report on."""
    ctx = _context()
    events = ctx.Queue()
    port = free_port()
    env = rank_environment(os.environ, backend)
    stages = cfg.pipeline.stages
    procs = [
        ctx.Process(
            target=_child,
            args=(cfg.to_json(), r, stages, port, str(run_dir.resolve()), events, env, os.getcwd()),
            name=f"ppscope-rank{r}",
        )
        for r in range(stages)
    ]
    # The fork server and the ranks start with SIGINT blocked: the server ignores it once it has imported
    # the engine (a Ctrl-C while it imports would print its traceback) and each rank unblocks it in `_child`
    # with its handler in place, so a Ctrl-C that came meanwhile is acted on there and not lost.
    server = ctx.get_start_method() == "forkserver"
    if server:  # the resource tracker first: it blocks, then unblocks, SIGINT around its own start
        from multiprocessing import forkserver, resource_tracker

        resource_tracker.ensure_running()
    with main_not_reimported(), _sigint_blocked(), _environ(CPP_LOG_LEVEL_ENV, env.get(CPP_LOG_LEVEL_ENV)):
        if server:
            forkserver.ensure_running()
        for p in procs:
            p.start()
    return procs, events


def rank_environment(caller: Mapping[str, str], backend: str) -> dict[str, str]:
    """The environment of the ranks started here: the caller's, with gloo's C++ logs quiet unless it says."""
    return {CPP_LOG_LEVEL_ENV: "FATAL", **caller} if backend == "gloo" else dict(caller)


@contextlib.contextmanager
def _environ(key: str, value: str | None) -> Iterator[None]:
    """`key` set to `value` (None: left as it is) in this process's environment inside the block, so that a
    process started there (the fork server, a spawned rank) has it from its start, before it imports torch; as it
    was afterwards."""
    if value is None:
        yield
        return
    before = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


@contextlib.contextmanager
def _interrupt_deferred(*, drop: bool = False) -> Iterator[None]:
    """Hold a Ctrl-C that comes inside the block and raise it at the end (or `drop` it). Signals reach only
    the main thread: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
    if got and not drop:
        signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """Block SIGINT in this thread, so processes started inside inherit it blocked."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def main_not_reimported() -> Iterator[None]:
    """Start children without re-running the caller's `__main__` (multiprocessing does by default): the ranks
    need only `engine`, and the caller's main may be a script that cannot run twice (a notebook, a test
    harness, an app server)."""
    main = sys.modules.get("__main__")
    saved: dict[str, Any] = {
        k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__
    }
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def _context() -> Any:
    """forkserver where there is one: a server with torch imported forks each rank in milliseconds, and it
    never ran a kernel, so no thread pool or CUDA context is copied. Elsewhere spawn."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["ppscope.engine.worker"])
        return ctx
    return mp.get_context("spawn")


def _run_inline(cfg: EngineConfig, prep: Prepared, run_dir: Path, on_progress: ProgressHook | None) -> Path:
    """One stage needs no processes: run it here, with the same failure reporting."""
    total = len(prep.requests)
    bar = _ProgressBar(total) if cfg.output.progress and on_progress is None else None

    def progress(finished: int, tokens: int) -> None:
        if on_progress:
            on_progress(finished, total, tokens)
        if bar:
            bar.update(finished, tokens)

    try:
        return run_rank(cfg, 0, 1, run_dir=run_dir, progress=progress, prepared=prep)
    except KeyboardInterrupt:
        _mark(run_dir, "interrupted", "interrupted by the user")
        raise InterruptedRunError(
            ErrorCode.INTERRUPTED, f"interrupted; what was recorded up to then is in {run_dir}"
        ) from None
    except Exception as exc:
        error = f"rank 0 failed: {type(exc).__name__}: {exc}; the trace up to then is in {run_dir}"
        _mark(run_dir, "failed", error)
        raise EngineFailedError(ErrorCode.RANK_FAILED, error) from exc
    finally:
        if bar:
            bar.close()


def _supervise(
    cfg: EngineConfig, procs: list[Any], events: Any, run_dir: Path, total: int, on_progress: ProgressHook | None
) -> None:
    done: set[int] = set()
    errors: dict[int, RankError] = {}
    waited_on: dict[int, int] = {}  # rank -> the peer it timed out waiting for
    blame_at: float | None = None  # once a rank failed: when to stop waiting for the others' reports
    bar = _ProgressBar(total) if cfg.output.progress and on_progress is None else None
    try:
        while len(done) < len(procs):
            # Once a rank failed, the cause is named when the wait is over, or when every rank has reported or
            # exited before a read found the queue empty (a rank writes its report to the queue before it exits).
            if blame_at is not None and (time.monotonic() >= blame_at or len(done) + len(errors) == len(procs)):
                raise _failure(procs, errors, waited_on, run_dir)
            exited = [p.exitcode is not None for p in procs]
            try:
                event = events.get(timeout=0.1)
            except queue.Empty:
                event = None
                if blame_at is not None and all(r in done or r in errors or exited[r] for r in range(len(procs))):
                    raise _failure(procs, errors, waited_on, run_dir) from None
            if event is not None:
                kind = event[0]
                if kind == "progress":
                    if on_progress:
                        on_progress(event[1], total, event[2])
                    if bar:
                        bar.update(event[1], event[2])
                elif kind == "interrupted":  # Ctrl-C reached the ranks before (or instead of) this process
                    raise KeyboardInterrupt
                elif kind == "error":
                    errors.setdefault(event[1], event[2])
                    if event[3] is not None:
                        waited_on.setdefault(event[1], event[3])
                    blame_at = blame_at or time.monotonic() + _BLAME_WAIT_S
                elif kind == "done":
                    done.add(event[1])
                    if bar and event[2] >= 0:
                        bar.update(event[2], event[3])
                continue
            if blame_at is None and any(r not in done and p.exitcode not in (None, 0) for r, p in enumerate(procs)):
                blame_at = time.monotonic() + _BLAME_WAIT_S  # its report, if any, may still be in the queue
    finally:
        if bar:
            bar.close()
    for p in procs:
        p.join(timeout=cfg.runtime.timeout_s)


def _interrupt_all(procs: list[Any], grace_s: float) -> None:
    """Ctrl-C: pass SIGINT on (ranks in another process group did not get it) and give every rank time to
    flush and close its file before anything harder; a rank that has not exited by then is terminated."""
    for p in procs:
        if p.is_alive() and p.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    _stop_all(procs)


def _failure(
    procs: list[Any], errors: dict[int, RankError], waited_on: dict[int, int], run_dir: Path
) -> EngineFailedError:
    """The failure to report: its root cause, not its echoes. When one rank fails its peers fail too, and their
    errors often arrive first (a failing rank tears its process group down before it reports), so a rank killed
    by a signal comes first, then one that failed in its own code, then one that exited without a word, and a
    rank whose link to a peer broke last; among equals, the first to report. Its timestamp would not help: a
    rank's error is reported after the teardown that made its peers fail."""
    where = f"the trace up to then is in {run_dir}"
    silent = {r: p.exitcode for r, p in enumerate(procs) if r not in errors and p.exitcode not in (None, 0)}
    killed = [r for r, code in silent.items() if code < 0]
    own = [r for r, error in errors.items() if not error.peer]
    if killed or (silent and not own):
        rank = (killed or list(silent))[0]
        code = silent[rank]
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            cause = f"rank {rank} was killed by {name}"
        else:
            cause = f"rank {rank} exited with code {code} without reporting an error (killed? out of memory?)"
        if errors:
            then = (own or list(errors))[0]
            cause += f"; rank {then} then failed: {errors[then].text}"
        return EngineFailedError(ErrorCode.RANK_KILLED, f"{cause}; {where}")
    if not own:  # a rank still running, silent, from which a peer received nothing: it hangs
        for peer, rank in waited_on.items():
            if 0 <= rank < len(procs) and rank not in errors and procs[rank].exitcode is None:
                return EngineFailedError(
                    ErrorCode.RANK_HANGS,
                    f"rank {rank} hangs (alive, silent): rank {peer}: {errors[peer].text}; {where}",
                )
    first = (own or list(errors))[0]
    return EngineFailedError(ErrorCode.RANK_FAILED, f"rank {first} failed: {errors[first].text}; {where}")


def _stop_all(procs: list[Any], grace_s: float = 1.0) -> None:
    """Terminate every rank; kill those still there after `grace_s` in all (a stopped or hung one)."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(deadline - time.monotonic(), 0.0))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


def _mark(run_dir: Path, status: str, error: str) -> None:
    with contextlib.suppress(PPScopeError, OSError):
        meta = read_meta(run_dir)
        meta.status, meta.error = status, error
        write_meta(run_dir, meta)


def _interrupt_once(signum: int, frame: Any) -> None:
    """A rank stops at the first Ctrl-C and ignores any further one, so it finishes flushing its spans.

    Caught inside the import machinery (a module lock's weakref callback), an exception is printed as "ignored"
    and dropped: the rank would neither stop nor keep its stderr clean. There the signal is sent again a moment
    later, once the import is done."""
    if frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _child(
    cfg_dict: dict[str, Any],
    rank: int,
    world: int,
    port: int,
    run_dir: str,
    events: Any,
    env: dict[str, str],
    cwd: str,
) -> None:
    # A forkserver child inherits the server's environment and directory, fixed when it started: take the
    # caller's, so relative paths (--prompts, --model) and test hooks mean what they meant to the caller.
    for key in set(os.environ) - set(env):
        del os.environ[key]
    os.environ.update(env)
    os.chdir(cwd)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["LOCAL_WORLD_SIZE"] = str(world)
    signal.signal(signal.SIGINT, _interrupt_once)
    last = [0.0]
    counts = [-1, -1]

    def progress(finished: int, tokens: int) -> None:
        now = time.monotonic()
        counts[:] = [finished, tokens]
        if now - last[0] >= 0.1:
            last[0] = now
            events.put(("progress", finished, tokens))

    try:
        if hasattr(signal, "pthread_sigmask"):  # started with it blocked (see _start_ranks); a Ctrl-C since lands here
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        cfg = EngineConfig.from_json(cfg_dict)
        run_rank(cfg, rank, world, local_rank=rank, run_dir=Path(run_dir), progress=progress if rank == 0 else None)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            events.put(("interrupted", rank))
        else:
            events.put(("error", rank, RankError(plain_error(exc), failure_code(exc)), silent_peer(exc)))
        events.close()
        events.join_thread()
        os._exit(1)
    events.put(("done", rank, *counts))
    events.close()
    events.join_thread()


def _check_checkpoint(cfg: EngineConfig, prep: Prepared) -> None:
    """A checkpoint directory's files are checked from their headers here, before any process starts or the
    run directory exists: a damaged file or a missing tensor would otherwise fail inside the ranks."""
    name = cfg.model.name
    if not cfg.model.synthetic and name not in PRESETS:
        from ppscope.engine.hf import check_checkpoint

        check_checkpoint(name, prep.shape)


def _run_torchrun(cfg: EngineConfig) -> Path:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    prep = prepare(cfg, world)
    _check_checkpoint(cfg, prep)
    if cfg.output.out:  # every rank refuses alike, before any starts (rank 0 alone would leave the others failing)
        check_new_run_dir(cfg.output.out)
    try:
        return run_rank(cfg, rank, world, local_rank=local, run_dir=None, prepared=prep)
    except PPScopeError:
        raise
    except Exception as exc:
        raise EngineFailedError(ErrorCode.RANK_FAILED, rank_failure(rank, exc, failure_code(exc))) from exc


class _ProgressBar:
    """A rich progress bar of requests finished, with tokens generated, on stderr: stdout is for results
    (`ppscope run --json | jq` must read JSON alone)."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._p = Progress(
            TextColumn("requests"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[tokens]} tokens"),
            TimeElapsedColumn(),
            transient=False,
            console=Console(stderr=True),
        )
        self._task = self._p.add_task("run", total=total, tokens=0)
        self._p.start()

    def update(self, finished: int, tokens: int) -> None:
        self._p.update(self._task, completed=finished, tokens=tokens)

    def close(self) -> None:
        self._p.stop()
