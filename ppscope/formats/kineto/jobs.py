"""Whether a folder's Kineto files are one job's ranks: empty files, files from another job, and what the
ranks' clocks are taken to be.

A file of zero bytes (or a gzip stream of nothing) is named as empty, never read as "no traces". A file
whose `distributedInfo.world_size` differs from the others', or whose events overlap no other file's in
time, is from another job: left out with a warning naming it, or, when no majority tells which file is the
odd one, refused in one line naming the files.
"""

from __future__ import annotations

import gzip
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppscope.errors import CorruptFileError, ErrorCode, UnsupportedInputError
from ppscope.formats.detect import GZIP_MAGIC
from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["CLOCK_NOTE", "JobFacts", "one_job", "refuse_empty"]

CLOCK_NOTE = Notice(
    NoticeCode.IMPORT_CLOCKS,
    "clocks: each file's times are read on its own base time (baseTimeNanoseconds, the profiler's wall-clock "
    "anchor), not measured between ranks by ppscope: ranks on different hosts line up only as well as the "
    "hosts' clocks agree",
)


@dataclass(frozen=True)
class JobFacts:
    """What tells one file's job: its name, top-level keys and the time its events cover."""

    name: str
    top: Mapping[str, Any]
    first_ns: int
    last_ns: int


def refuse_empty(path: Path) -> None:
    """Raise naming `path` when it holds nothing: zero bytes, or a gzip stream of nothing."""
    try:
        size = path.stat().st_size
        if size == 0:
            raise CorruptFileError(
                ErrorCode.EMPTY_FILE,
                f"{path} is empty (0 bytes): the profiler did not write it; remove it to analyse the other ranks",
            )
        with open(path, "rb") as f:
            gz = f.read(2) == GZIP_MAGIC
        if gz:
            with gzip.open(path, "rb") as f:
                head = f.read(64)
            if not head.strip():
                raise CorruptFileError(
                    ErrorCode.EMPTY_FILE,
                    f"{path} is empty (a gzip stream of nothing); remove it to analyse the other ranks",
                )
    except (OSError, EOFError, zlib.error):
        return  # damaged rather than empty: the reader names that


def one_job(files: Mapping[int, JobFacts]) -> tuple[list[int], list[Notice]]:
    """The ranks whose files are one job's, and the warnings naming those of another job (or refused)."""
    keep, said = _same_world(files)
    keep, more = _overlapping({r: files[r] for r in keep})
    return keep, said + more


def _world(top: Mapping[str, Any]) -> int | None:
    info = top.get("distributedInfo")
    size = info.get("world_size") if isinstance(info, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _same_world(files: Mapping[int, JobFacts]) -> tuple[list[int], list[Notice]]:
    sizes = {r: _world(f.top) for r, f in files.items()}
    counts = Counter(s for s in sizes.values() if s is not None)
    if len(counts) <= 1:
        return list(files), []
    (common, n), (_, n2) = counts.most_common(2)
    odd = sorted(f.name for r, f in files.items() if sizes[r] not in (None, common))
    if n == n2:
        raise UnsupportedInputError(
            ErrorCode.NOT_ONE_JOB,
            f"{', '.join(sorted(f.name for f in files.values()))} are not one job's ranks: their "
            "distributedInfo.world_size differ; give one job's files",
        )
    text = (
        f"left out {', '.join(odd)}: from another job (distributedInfo.world_size other than the {common} of the rest)"
    )
    return [r for r in files if sizes[r] in (None, common)], [Notice(NoticeCode.OTHER_JOB, text)]


def _overlapping(files: Mapping[int, JobFacts]) -> tuple[list[int], list[Notice]]:
    if len(files) < 2:
        return list(files), []

    def meets(a: JobFacts, b: JobFacts) -> bool:
        return a.first_ns <= b.last_ns and b.first_ns <= a.last_ns

    alone = [r for r, f in files.items() if not any(meets(f, g) for q, g in files.items() if q != r)]
    if not alone:
        return list(files), []
    if len(alone) == len(files):
        raise UnsupportedInputError(
            ErrorCode.NOT_ONE_JOB,
            f"{', '.join(sorted(f.name for f in files.values()))} do not overlap in time: they are not one "
            "job's ranks (or their clocks disagree by more than the trace lasts); give one job's files",
        )
    names = ", ".join(sorted(files[r].name for r in alone))
    text = f"left out {names}: its events overlap no other rank's in time, so it is from another job"
    return [r for r in files if r not in alone], [Notice(NoticeCode.OTHER_JOB, text)]
