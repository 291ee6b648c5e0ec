"""Work spread over processes: a pool of spawned workers, or this process alone, and results in order.

Used by the rank-by-rank analysis (`ppscope.analysis.sharded`) and by the Kineto importer, which read many
files with the same function. Workers are spawned (no inherited threads or locks) and run ppscope functions
only, so they never need the parent's `__main__`; spawning imports it all the same, and it is not always
importable (a Streamlit script, a notebook cell), so each start sees a plain one instead.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any, TypeVar

__all__ = ["Inline", "ordered", "processes"]

R = TypeVar("R")


class Inline:
    """An executor that runs each job when asked for its result, in this process."""

    def __enter__(self) -> Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def processes(workers: int) -> Executor | Inline:
    """`workers` spawned processes, or this process for one."""
    if workers <= 1:
        return Inline()
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


@contextlib.contextmanager
def _plain_main() -> Iterator[None]:
    """A plain `__main__` while workers start (each submit may start one)."""
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def ordered(pool: Any, fn: Callable[..., R], jobs: Iterable[tuple[Any, ...]], width: int) -> Iterator[R]:
    """`fn(*job)` for each job, in order, at most 2 × `width` submitted ahead of the one being consumed, so
    finished results never pile up faster than they are used. `pool`: an executor, `Inline`, or anything
    with `submit` returning a future (a Ray pool)."""
    if isinstance(pool, Inline):
        for job in jobs:
            yield fn(*job)
        return
    spawns = isinstance(pool, ProcessPoolExecutor)
    ahead: list[Future[R]] = []
    for job in jobs:
        with _plain_main() if spawns else contextlib.nullcontext():
            ahead.append(pool.submit(fn, *job))
        if len(ahead) > 2 * width:
            yield ahead.pop(0).result()
    for f in ahead:
        yield f.result()
