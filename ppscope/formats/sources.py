"""Open whatever the user points at as a Trace: a ppscope run directory, or an imported trace.

The kind of input is decided by content, never by file extension (`ppscope.formats.detect`): an nsys
SQLite export, a Kineto JSON/JSON.gz file, a directory of per-rank Kineto files, a Chrome trace of pipeline
operations timed by the job (Megatron-style timers), or a run directory.
Every command that accepts a trace (`analyze`, `rebalance`, `export`, `dashboard`) goes through
`open_trace`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ppscope.formats.detect import InputKind, detect
from ppscope.trace.model import Trace
from ppscope.trace.store import load_run

__all__ = ["open_trace"]


def open_trace(path: str | os.PathLike[str]) -> Trace:
    """Load `path` as a Trace, whatever produced it."""
    found = detect(Path(path))
    if found.kind == InputKind.RUN:
        return load_run(found.path)
    if found.kind == InputKind.NSYS:
        from ppscope.formats.nsys.reader import load_nsys

        return load_nsys(found.path)
    if found.kind == InputKind.PRIMUS:
        from ppscope.formats.primus.reader import load_primus

        return load_primus(found.files)
    if found.kind == InputKind.TIMERS:
        from ppscope.formats.timers.reader import load_timers

        return load_timers(found.path)
    from ppscope.formats.kineto.reader import load_kineto

    return load_kineto(found.files)
