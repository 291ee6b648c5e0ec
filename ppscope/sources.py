"""Open whatever the user points at as a Trace: a ppscope run directory, or an imported trace.

The kind of input is decided by content, never by file extension. Every command that accepts a trace
(`analyze`, `rebalance`, `export`, `dashboard`) goes through `open_trace`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ppscope.errors import RunNotFoundError, UnsupportedInputError
from ppscope.store import is_run_dir, load_run
from ppscope.trace import Trace

__all__ = ["open_trace"]


def open_trace(path: str | os.PathLike[str]) -> Trace:
    """Load `path` as a Trace, whatever produced it."""
    p = Path(path)
    if not p.exists():
        raise RunNotFoundError(f"{p} does not exist: give a run directory, an nsys .sqlite or a Kineto trace")
    if p.is_dir() and (is_run_dir(p) or not any(p.iterdir())):
        return load_run(p)
    if p.is_dir() and any(p.glob("rank-*.sqlite")):
        return load_run(p)  # names the missing meta.json
    raise UnsupportedInputError(f"{p} is not a ppscope run directory (no meta.json)")
