"""Write a Trace, or a run a rank file at a time, in any export format: the one entry point commands use."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ppscope.errors import ErrorCode, InvalidConfigError

if TYPE_CHECKING:
    from ppscope.trace.model import Trace

__all__ = ["EXPORT_FORMATS", "export_run", "export_trace"]

EXPORT_FORMATS = ("nsys-sqlite", "chrome", "nvtxt")
"""Values of `ppscope export --format`."""


def export_trace(trace: Trace, fmt: str, out: str | Path, *, force: bool = False) -> Path:
    """Write `trace` as `fmt` to `out` (nvtxt: a directory, one file per rank); returns what was written.

    Refuses an existing output unless `force`; a failed export leaves nothing behind."""
    out = Path(out)
    if fmt == "nsys-sqlite":
        from ppscope.formats.nsys.writer import export_nsys

        return export_nsys(trace, out, force=force)
    if fmt == "chrome":
        from ppscope.formats.chrome.writer import export_chrome

        return export_chrome(trace, out, force=force)
    if fmt == "nvtxt":
        from ppscope.formats.nvtxt import export_nvtxt

        export_nvtxt(trace, out, force=force)
        return out
    raise InvalidConfigError(
        ErrorCode.UNKNOWN_CHOICE, f"unknown export format {fmt!r}; valid: {', '.join(EXPORT_FORMATS)}"
    )


def export_run(run_dir: str | Path, fmt: str, out: str | Path, *, force: bool = False) -> Path:
    """`export_trace(load_run(run_dir), ...)`, the same output, reading one rank file at a time, so that memory
    holds one rank's spans (and, for chrome, one link's far side: its arrows pair sends with receives across
    ranks), not the job's. A run still being written is exported from one snapshot loaded whole: the rank-by-rank
    paths read each file twice, and the two reads of a growing run would not agree."""
    out = Path(out)
    from ppscope.trace.store import load_run, read_meta

    if read_meta(run_dir).status == "running":
        return export_trace(load_run(run_dir), fmt, out, force=force)
    if fmt == "nsys-sqlite":
        from ppscope.formats.nsys.writer import export_nsys_run

        return export_nsys_run(run_dir, out, force=force)
    if fmt == "chrome":
        from ppscope.formats.chrome.writer import export_chrome_run

        return export_chrome_run(run_dir, out, force=force)
    if fmt == "nvtxt":
        from ppscope.formats.nvtxt import export_nvtxt_run

        export_nvtxt_run(run_dir, out, force=force)
        return out
    raise InvalidConfigError(
        ErrorCode.UNKNOWN_CHOICE, f"unknown export format {fmt!r}; valid: {', '.join(EXPORT_FORMATS)}"
    )
