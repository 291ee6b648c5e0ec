"""Which files the dashboard may open: only the paths given on the command line, and runs inside a folder given.

The page never takes a path as text. It shows the labels of a `Catalog` and hands back the one picked;
a folder's entries are listed here, resolved, and kept only when they stay inside that folder (a symlink
pointing elsewhere is left out). This module knows paths only: it does not load traces.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ppscope.errors import ErrorCode, RunNotFoundError
from ppscope.trace.store import is_run_dir

__all__ = ["MAX_ENTRIES", "Catalog", "Entry", "catalog_from_args", "md"]

MAX_ENTRIES = 500
"""A folder lists at most this many runs (newest first), so a huge folder cannot stall the page."""


@dataclass(frozen=True)
class Entry:
    """One thing the user may pick: a run directory or an imported trace file, by its resolved path."""

    label: str
    """What the page shows: the name as given, or `folder/name` for a run inside a folder."""
    path: Path
    """Resolved absolute path."""
    is_run: bool
    """True for a ppscope run directory (tailed while it is written); False for an import (read once)."""


@dataclass(frozen=True)
class Catalog:
    """The paths given on the command line: single traces, and folders whose runs are listed on each call."""

    singles: tuple[Entry, ...]
    folders: tuple[Path, ...]

    def entries(self) -> list[Entry]:
        """Everything that may be opened now; folders are rescanned, so runs written meanwhile appear."""
        found = list(self.singles)
        for folder in self.folders:
            found += _scan(folder)
        return found

    def pick(self, label: str, entries: list[Entry] | None = None) -> Entry:
        """The entry shown as `label` among `entries` (default: as listed now); anything else is refused."""
        for entry in self.entries() if entries is None else entries:
            if entry.label == label:
                return entry
        raise RunNotFoundError(
            ErrorCode.TRACE_NOT_SERVED, f"{label!r} is not among the traces this dashboard was started on"
        )


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+\-.!|~:$])")


def md(text: object) -> str:
    """`text` made literal for Streamlit's markdown: paths, run names and messages from files may hold
    `*`, `[link](…)`, `$math$` or `:colour[…]`, which must show as written, never as formatting."""
    return _MD_SPECIAL.sub(r"\\\1", str(text))


def catalog_from_args(paths: Sequence[str | os.PathLike[str]]) -> Catalog:
    """Sort the command-line paths into single traces and folders of runs. Each must exist."""
    if not paths:
        raise RunNotFoundError(
            ErrorCode.NO_TRACE_GIVEN,
            "no trace given: pass a run directory, an nsys .sqlite, a Kineto trace or a folder",
        )
    singles: list[Entry] = []
    folders: list[Path] = []
    for raw in paths:
        given = Path(raw)
        if not given.exists():
            raise RunNotFoundError(
                ErrorCode.RUN_NOT_FOUND,
                f"{given} does not exist: give a run directory, a trace file or a folder of runs",
            )
        path = given.resolve()
        if path.is_dir() and not is_run_dir(path) and not _is_trace(path):
            folders.append(path)
        else:
            singles.append(Entry(label=str(raw), path=path, is_run=is_run_dir(path)))
    return Catalog(singles=tuple(singles), folders=tuple(folders))


def _is_trace(path: Path) -> bool:
    """Whether `path` is a trace the importers read (decided by content); False when they are not installed."""
    try:
        from ppscope.formats.detect import detect
    except ImportError:
        return False
    try:
        detect(path)
    except Exception:  # detect names what it cannot read; here any failure just means "not a trace"
        return False
    return True


def _scan(folder: Path) -> list[Entry]:
    try:
        children = list(folder.iterdir())
    except OSError:
        return []  # deleted or unreadable meanwhile: the page says the folder holds nothing
    found = []
    for child in children:
        try:
            resolved = child.resolve()
            inside = resolved.is_relative_to(folder)
            mtime = child.stat().st_mtime
        except (OSError, RuntimeError):  # vanished meanwhile, or a symlink loop
            continue
        if not inside:
            continue
        if is_run_dir(resolved):
            found.append((mtime, Entry(label=f"{folder.name}/{child.name}", path=resolved, is_run=True)))
        elif resolved.is_file() and _is_trace(resolved):
            found.append((mtime, Entry(label=f"{folder.name}/{child.name}", path=resolved, is_run=False)))
    found.sort(key=lambda item: (-item[0], item[1].label))
    return [entry for _, entry in found[:MAX_ENTRIES]]
