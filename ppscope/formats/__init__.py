"""Interop: importers (nsys SQLite, Kineto JSON) and exporters (nsys SQLite, Chrome/Perfetto, NVTXT).

Importers turn third-party traces into a `Trace`; exporters write a `Trace` for the tools people already
use. Detection by content lives in `detect`; `ppscope.sources.open_trace` is the one entry point commands
use to read.
"""

from __future__ import annotations

__all__ = ["EXPORT_FORMATS"]

EXPORT_FORMATS = ("nsys-sqlite", "chrome", "nvtxt")
"""Values of `ppscope export --format`."""
