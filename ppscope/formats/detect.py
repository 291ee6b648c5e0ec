"""Tell what a path holds by its content, never its extension: a ppscope run directory, an nsys SQLite
export, a Kineto (PyTorch profiler) JSON or JSON.gz file, a directory of per-rank Kineto files, or a Chrome trace
of pipeline operations timed by the training job itself (Megatron-style timers: a bare array of events, or an
object whose first events are named `forward-compute`, `backward-recv`, ...).

Detection reads a few bytes of each candidate file and never writes. It does not parse traces: the
importers do that and name what is missing when a file is what it looks like but incomplete. An empty file
has no content to go by: given alone it is named as empty, and in a folder of Kineto files an empty `.json`
or `.gz` file goes to the Kineto reader, which names it, rather than being passed over.
"""

from __future__ import annotations

import enum
import os
import re
import sqlite3
import sys
import urllib.parse
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ppscope.errors import CorruptFileError, ErrorCode, RunNotFoundError, UnsupportedInputError, brief

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        pass


__all__ = [
    "GZIP_MAGIC",
    "SQLITE_MAGIC",
    "Detected",
    "InputKind",
    "detect",
    "is_primus_dump",
    "is_timer_trace",
    "json_head",
    "open_sqlite_ro",
    "sniff_file",
]

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
_RUN_META = "meta.json"
_TRACE_SUFFIXES = (".json", ".gz")  # an empty file has no content to tell it by: a trace's name says what it was


class InputKind(StrEnum):
    RUN = "run"  # a ppscope run directory (meta.json + rank-*.sqlite)
    NSYS = "nsys-sqlite"  # one `nsys export --type sqlite` file
    KINETO = "kineto"  # one or more Kineto JSON(.gz) files, one per rank
    TIMERS = "timers"  # one Chrome trace JSON(.gz) of pipeline operations timed by the job (Megatron-style timers)
    PRIMUS = "primus"  # AMD Primus' pipeline dump: pp_rank_N.json files (and config.json)


@dataclass(frozen=True)
class Detected:
    kind: InputKind
    path: Path
    files: list[Path] = field(default_factory=list)
    """The trace files to read (one per rank for Kineto; the file itself for nsys)."""


def sniff_file(path: Path) -> str:
    """`sqlite`, `gzip`, `json` or `` (unknown) from the first bytes of `path`."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as exc:
        raise CorruptFileError(ErrorCode.UNREADABLE_FILE, f"{path}: cannot be read ({exc})") from None
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if stripped.startswith((b"{", b"[")):
        return "json"
    return ""


def detect(path: str | os.PathLike[str]) -> Detected:
    """What `path` holds. Raises a one-line error naming the path when it is nothing ppscope reads."""
    p = Path(path)
    if not p.exists():
        raise RunNotFoundError(
            ErrorCode.RUN_NOT_FOUND, f"{p} does not exist: give a run directory, an nsys .sqlite or a Kineto trace"
        )
    if p.is_dir():
        return _detect_dir(p)
    kind = sniff_file(p)
    if not kind and p.stat().st_size == 0:
        raise CorruptFileError(
            ErrorCode.EMPTY_FILE, f"{p} is empty (0 bytes): give a trace the profiler finished writing"
        )
    if kind == "sqlite":
        return Detected(InputKind.NSYS, p, [p])
    if kind == "json" and is_primus_dump(p):
        return Detected(InputKind.PRIMUS, p.parent, [p])
    if kind in ("gzip", "json"):
        return Detected(InputKind.TIMERS if is_timer_trace(p) else InputKind.KINETO, p, [p])
    raise UnsupportedInputError(
        ErrorCode.NOT_A_TRACE,
        f"{p} is not a trace ppscope reads: it is not SQLite (nsys export), gzip or JSON (Kineto); "
        "give a run directory, an `nsys export --type sqlite` file or a PyTorch profiler trace",
    )


_HEAD = 1 << 16
"""Bytes of (inflated) JSON that tell a Chrome trace of pipeline timers from a Kineto trace."""
_TIMER_NAME = re.compile(rb'"name"\s*:\s*"(?:forward|backward)-(?:compute|send|recv)')
_KINETO_KEY = re.compile(rb'"(?:schemaVersion|deviceProperties|distributedInfo|baseTimeNanoseconds)"\s*:')


def json_head(path: Path, size: int = _HEAD) -> bytes:
    """The first `size` bytes of a JSON file's text, inflated when it is gzip (what of it the first bytes give);
    b"" where it cannot be read."""
    try:
        with open(path, "rb") as f:
            raw = f.read(size)
        if raw.startswith(GZIP_MAGIC):
            return zlib.decompressobj(wbits=31).decompress(raw, size)
    except (OSError, zlib.error):
        return b""
    return raw


def is_timer_trace(path: Path) -> bool:
    """A Chrome trace of pipeline operations rather than a Kineto trace: a bare JSON array (Kineto writes an
    object), or an object whose first events carry Megatron's timer names and none of Kineto's own keys."""
    head = json_head(path)
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"["):
        return True
    return bool(_TIMER_NAME.search(head)) and not _KINETO_KEY.search(head)


def is_primus_dump(path: Path) -> bool:
    """One of AMD Primus' pipeline dumps (`pp_rank_N.json`): an object of iterations timing `fwd_start`, ..."""
    head = json_head(path, 4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"{") and bool(_PRIMUS_KEY.search(head))


_PRIMUS_KEY = re.compile(rb'"(?:fwd|bwd)_start"\s*:\s*\[')


def _detect_dir(p: Path) -> Detected:
    if (p / _RUN_META).is_file() or any(p.glob("rank-*.sqlite")):
        return Detected(InputKind.RUN, p, [])
    files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
    primus = [f for f in files if f.name.startswith("pp_rank_") and is_primus_dump(f)]
    if primus:
        return Detected(InputKind.PRIMUS, p, primus + [f for f in files if f.name == "config.json"])
    kineto = [f for f in files if sniff_file(f) in ("gzip", "json")]
    empty = [f for f in files if f.name.endswith(_TRACE_SUFFIXES) and f.stat().st_size == 0]
    if kineto or empty:  # an empty trace file is named by the reader, not taken for a folder without traces
        return Detected(InputKind.KINETO, p, sorted(kineto + empty))
    nsys = [f for f in files if sniff_file(f) == "sqlite"]
    if len(nsys) == 1:
        return Detected(InputKind.NSYS, nsys[0], nsys)
    if not any(p.iterdir()):
        raise RunNotFoundError(ErrorCode.RUN_EMPTY, f"{p} is empty: it holds no run and no trace files")
    runs = sorted(d.name for d in p.iterdir() if d.is_dir() and (d / _RUN_META).is_file())
    if runs:  # e.g. the folder of `ppscope tune` or `ppscope demo`, which holds a run before and one after
        listed = ", ".join(runs[:4]) + (f" and {len(runs) - 4} more" if len(runs) > 4 else "")
        raise UnsupportedInputError(
            ErrorCode.FOLDER_OF_RUNS, f"{p} is a folder of runs ({listed}): give one of them, e.g. {p / runs[0]}"
        )
    held = _folders_of_traces(p)
    if held:  # e.g. two captures side by side (control/ and test/), each a folder of rank files
        listed = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        raise UnsupportedInputError(
            ErrorCode.FOLDER_OF_RUNS,
            f"{p} holds no traces itself, but its subfolders {listed} do: give one of them, e.g. {p / held[0]}",
        )
    raise UnsupportedInputError(
        ErrorCode.NO_TRACES,
        f"{p} holds no traces: no {_RUN_META} (ppscope run), no Kineto JSON/JSON.gz files"
        + (f", and {len(nsys)} SQLite files (give one nsys export at a time)" if nsys else ", no nsys .sqlite"),
    )


def _folders_of_traces(p: Path) -> list[str]:
    """The subfolders of `p` that hold trace files themselves (Kineto JSON, gzip or SQLite): a look at their
    first bytes, one level down, never deeper."""
    held = []
    for d in sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith(".")):
        files = (f for f in d.iterdir() if f.is_file() and not f.name.startswith("."))
        if any(sniff_file(f) in ("gzip", "json", "sqlite") for f in files):
            held.append(d.name)
    return held


def open_sqlite_ro(path: Path) -> sqlite3.Connection:
    """Open an SQLite file read-only (immutable: no journal, no lock files), or say why not."""
    if sniff_file(path) != "sqlite":
        raise UnsupportedInputError(
            ErrorCode.NOT_A_TRACE, f"{path} is not an SQLite file, so not an nsys export (`nsys export --type sqlite`)"
        )
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro&immutable=1"
    try:
        db = sqlite3.connect(uri, uri=True, check_same_thread=False)
        db.execute("PRAGMA query_only=1")
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        raise CorruptFileError(
            ErrorCode.NOT_SQLITE, f"{path}: cannot be opened as SQLite ({brief(exc)}); the file is damaged"
        ) from None
    return db
