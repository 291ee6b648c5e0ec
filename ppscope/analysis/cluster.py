"""The per-rank work of `analyze_run` as Ray tasks: a cluster when one machine is not enough.

Ray, because multi-node vLLM already runs on it: `ppscope analyze RUN --ray ADDRESS` joins that cluster
(`local` starts a Ray instance on this machine). Each task reads its rank files at the path it is given, so
every node must see the run directory at the same path (a shared filesystem). Ray is the optional extra
`ppscope[cluster]`, imported only here and only when asked. A task whose worker dies is retried once by Ray;
if it dies again, the error names the ranks it was reading.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ppscope.errors import ErrorCode, InvalidConfigError, WorkerFailedError, brief

__all__ = ["RayPool"]

_INSTALL = "pip install 'ppscope[cluster]' (or pip install ray)"


class RayPool:
    """An executor whose `submit` runs a function as a Ray task (retried once if its worker dies)."""

    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise InvalidConfigError(
                ErrorCode.NOT_INSTALLED, f"--ray needs Ray, which is not installed: {_INSTALL}"
            ) from None
        self._ray = ray
        self._started = False
        self._address = address
        self._remote: dict[Callable[..., Any], Any] = {}

    def __enter__(self) -> RayPool:
        ray = self._ray
        if not ray.is_initialized():
            try:
                if self._address == "local":
                    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
                else:
                    ray.init(address=self._address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise InvalidConfigError(
                    ErrorCode.CLUSTER_UNREACHABLE,
                    f"--ray {self._address}: could not join the Ray cluster ({brief(exc)}); give the head's "
                    "address (ray://HOST:10001 or HOST:6379), or `local` to start one here",
                ) from None
            self._started = True
        return self

    @property
    def slots(self) -> int:
        """The cluster's CPUs: how many tasks are worth keeping in flight."""
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self._ray.shutdown()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(max_retries=1, retry_exceptions=False)(fn)
        inner = remote.remote(*args).future()
        outer: Future[Any] = Future()
        inner.add_done_callback(lambda f: _settle(outer, f, self._ray, args))
        return outer


def _settle(outer: Future[Any], inner: Future[Any], ray: Any, args: tuple[Any, ...]) -> None:
    """The task's own error as it was raised (a damaged file stays a CorruptFileError); a worker that died
    twice as a WorkerFailedError naming its ranks."""
    try:
        outer.set_result(inner.result())
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, Exception) else exc
        outer.set_exception(cause)
    except ray.exceptions.RayError as exc:
        ranks = sorted(args[0]) if args and isinstance(args[0], dict) else []  # a task's first argument: its files
        what = f"rank(s) {', '.join(map(str, ranks))}" if ranks else "its ranks"
        outer.set_exception(
            WorkerFailedError(
                ErrorCode.WORKER_DIED,
                f"the Ray worker reading {what} died twice ({brief(exc)}); the other ranks were fine",
            )
        )
