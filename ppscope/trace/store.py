"""The run store: a directory with `meta.json`, one SQLite file per rank and, optionally, `requests.jsonl`.

Writers (one per rank, used by the recorder's flush thread) append in batches to their own file in WAL
mode, so readers can tail a run while it is written. Readers open every file read-only: loading a run
never writes to it (the reading of one rank file is `ppscope.trace.rankfile`). Each rank stores times on its own
clock; the reader moves them onto the common clock with the offsets in `meta.json` (common = local - offset,
the offset interpolated along a measured drift: `ppscope.trace.clock.offsets_at`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ppscope.errors import CorruptFileError, ErrorCode, InvalidConfigError, RunExistsError, RunNotFoundError
from ppscope.failures import RankError, recorded_failures
from ppscope.trace.counterfile import common_counters
from ppscope.trace.model import COUNTER_COLUMNS, SCHEMA_VERSION, SPAN_COLUMNS, RunMeta, Trace, counters_frame
from ppscope.trace.notices import Notice, NoticeCode, missing_ranks
from ppscope.trace.rankfile import (
    connect_ro,
    merge_values,
    query,
    read_ranks,
    spans_of,
)
from ppscope.trace.requestlog import read_requests_after

__all__ = [
    "DEMO_FILE",
    "META_FILE",
    "REQUESTS_FILE",
    "Cursor",
    "RankWriter",
    "RunTail",
    "check_new_run_dir",
    "check_outside_runs",
    "create_run",
    "damaged_note",
    "each_rank",
    "enclosing_run",
    "failures_said",
    "holds_run",
    "is_run_dir",
    "load_run",
    "rank_file",
    "read_meta",
    "read_rank_info",
    "read_rank_parts",
    "read_rank_spans",
    "read_requests",
    "read_since",
    "run_files",
    "write_meta",
]

META_FILE = "meta.json"
REQUESTS_FILE = "requests.jsonl"
DEMO_FILE = "demo.toml"
"""What `ppscope demo` found (`predicted_speedup`, `measured_speedup`, `measured_interval`, `advice`), beside its
run directories in the demo's folder: TOML, since a JSON file would make the folder read as a Kineto trace."""
_RANK_RE = re.compile(r"^rank-(\d{5,})\.sqlite$")

_SPAN_COLS = list(SPAN_COLUMNS)
_COUNTER_COLS = list(COUNTER_COLUMNS)
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS spans (
    id INTEGER PRIMARY KEY,
    rank INTEGER NOT NULL, stage INTEGER NOT NULL, lane TEXT NOT NULL, kind TEXT NOT NULL,
    name TEXT NOT NULL, mb INTEGER NOT NULL, step INTEGER NOT NULL, chunk INTEGER NOT NULL,
    phase TEXT NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL,
    nbytes INTEGER NOT NULL, tokens INTEGER NOT NULL, peer INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    id INTEGER PRIMARY KEY,
    ts_ns INTEGER NOT NULL, rank INTEGER NOT NULL, device INTEGER NOT NULL,
    metric TEXT NOT NULL, value REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO info VALUES ('schema_version', '{SCHEMA_VERSION}');
"""
_INSERT_SPAN = f"INSERT INTO spans ({', '.join(_SPAN_COLS)}) VALUES ({', '.join('?' * len(_SPAN_COLS))})"
_INSERT_COUNTER = f"INSERT INTO counters ({', '.join(_COUNTER_COLS)}) VALUES ({', '.join('?' * len(_COUNTER_COLS))})"


def rank_file(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"rank-{rank:05d}.sqlite"


# ---------------------------------------------------------------- writing


def create_run(run_dir: str | os.PathLike[str], meta: RunMeta) -> Path:
    """Create a new run directory holding `meta.json`. Refuses a directory that already holds files, and
    one that cannot be made (a file on the way, no permission) in one line.

    A `meta` without `run_id` gets the directory's name, and one without `created_unix_ns` the time now:
    a run deleted and made again under the same name is then another run to a reader that follows it."""
    path = Path(run_dir)
    made = False
    try:
        check_new_run_dir(path)
        made = not path.is_dir()
        path.mkdir(parents=True, exist_ok=True)
        meta = dataclasses.replace(
            meta, run_id=meta.run_id or path.resolve().name, created_unix_ns=meta.created_unix_ns or time.time_ns()
        )
        write_meta(path, meta, exclusive=True)  # two runs started at once with one --out: one of them gets it
    except FileExistsError:
        raise RunExistsError(
            ErrorCode.RUN_EXISTS,
            f"{path} was just taken by another run; ppscope never overwrites a run: choose another --out",
        ) from None
    except OSError as exc:
        if made:
            with contextlib.suppress(OSError):
                path.rmdir()
        reason = exc.strerror or str(exc)
        if exc.filename is not None and Path(exc.filename) != path:
            reason += f" ({exc.filename})"
        raise InvalidConfigError(
            ErrorCode.OUTPUT_NOT_WRITABLE, f"cannot create run directory {path}: {reason}; choose another --out"
        ) from None
    return path


def check_new_run_dir(run_dir: str | os.PathLike[str]) -> None:
    """Refuse a path where a new run cannot go: a file, a directory that already holds files, or a place
    inside another run."""
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise RunExistsError(ErrorCode.OUTPUT_WRONG_KIND, f"{path} exists and is not a directory: choose another --out")
    if path.is_dir() and any(path.iterdir()):
        raise RunExistsError(
            ErrorCode.RUN_EXISTS, f"{path} already holds files; ppscope never overwrites a run: choose another --out"
        )
    run = enclosing_run(path.parent)  # not `path`: a run started at once with this one may be filling it
    if run is not None:
        raise _inside_run(f"--out {path}", run, same=False)


def write_meta(run_dir: str | os.PathLike[str], meta: RunMeta, *, exclusive: bool = False) -> None:
    """Replace `meta.json` atomically: a reader sees the old or the new file, never half of one. The file
    gets the umask's permissions, as every other file of the run (mkstemp's would be owner-only).
    `exclusive`: only create it, raising FileExistsError if it is there (the test and the creation are one
    step, a hard link, so of two writers exactly one succeeds)."""
    path = Path(run_dir)
    tmp = path / f".meta-{secrets.token_hex(8)}.json"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(meta.to_json())
        if exclusive:
            _move_exclusive(tmp, path / META_FILE)
        else:
            os.replace(tmp, path / META_FILE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _move_exclusive(src: Path, dst: Path) -> None:
    """Rename `src` to `dst` unless `dst` exists (FileExistsError)."""
    try:
        os.link(src, dst)
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links: claim the name, then fill it (a reader may see it empty)
        os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        os.replace(src, dst)
    else:
        os.unlink(src)


class RankWriter:
    """Appends one rank's spans and counters to `rank-NNNNN.sqlite`. Not thread-safe: one thread writes.

    Rows are tuples in schema column order (`SPAN_COLUMNS`, `COUNTER_COLUMNS`), times on the rank's clock.
    """

    def __init__(self, run_dir: str | os.PathLike[str], rank: int) -> None:
        self.path = rank_file(run_dir, rank)
        if self.path.exists():
            raise RunExistsError(
                ErrorCode.RUN_EXISTS, f"{self.path} already exists; ppscope never overwrites a rank's spans"
            )
        if not Path(run_dir).is_dir():
            raise RunNotFoundError(
                ErrorCode.NOT_A_RUN, f"{run_dir} is not a run directory: create it with create_run() first"
            )
        # The flush thread is the only user after construction, so the thread check is off on purpose.
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self.rank = rank
        self.spans_written = 0
        self.counters_written = 0

    def write(self, spans: Sequence[tuple[Any, ...]] = (), counters: Sequence[tuple[Any, ...]] = ()) -> None:
        """Append one batch in one transaction."""
        if not spans and not counters:
            return
        with _transaction(self._db):
            if spans:
                self._db.executemany(_INSERT_SPAN, spans)
            if counters:
                self._db.executemany(_INSERT_COUNTER, counters)
        self.spans_written += len(spans)
        self.counters_written += len(counters)

    def set_info(self, key: str, value: Any) -> None:
        with _transaction(self._db):
            self._db.execute("INSERT OR REPLACE INTO info VALUES (?, ?)", (key, json.dumps(value)))

    def close(self) -> None:
        """Checkpoint and leave a plain rollback-journal file, so read-only readers need no side files."""
        if self._db is None:
            return
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA journal_mode=DELETE")
        self._db.close()
        self._db = None  # type: ignore[assignment]


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Any:
    db.execute("BEGIN")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


# ---------------------------------------------------------------- reading


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / META_FILE).is_file()


def holds_run(path: str | os.PathLike[str]) -> bool:
    """True for a directory ppscope wrote as a run: `meta.json` beside `rank-*.sqlite` files, or a `meta.json`
    that ppscope wrote (a run stopped before its ranks started). Narrower than `is_run_dir`, which reads any
    folder with a `meta.json`: this one decides where nothing may be written, and a project folder holding
    some other tool's `meta.json` is not a run."""
    folder = Path(path)
    if not (folder / META_FILE).is_file():
        return False
    try:
        if any(_RANK_RE.match(name) for name in os.listdir(folder)):
            return True
        with open(folder / META_FILE, "rb") as f:
            data = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"schema_version", "pp_size", "ranks"} <= data.keys()


def check_outside_runs(path: str | os.PathLike[str], what: str) -> None:
    """Refuse `path` when it is or lies inside a run directory: nothing but the run's own recorder writes
    there. `what` names the path in the message, e.g. `--html runs/r1/meta.json`."""
    run = enclosing_run(path)
    if run is not None:
        raise _inside_run(what, run, same=run == Path(path).resolve())


def _inside_run(what: str, run: Path, *, same: bool) -> InvalidConfigError:
    where = "the run" if same else "inside the run"
    return InvalidConfigError(
        ErrorCode.OUTPUT_INTO_INPUT, f"{what} is {where} {run}: ppscope never writes into a run; give a path outside it"
    )


def enclosing_run(path: str | os.PathLike[str]) -> Path | None:
    """The run directory `path` is or lies inside (`holds_run`), looking at `path` and each of its parents
    once symbolic links are resolved; None when there is none."""
    target = Path(path).resolve()
    return next((p for p in (target, *target.parents) if holds_run(p)), None)


def read_meta(run_dir: str | os.PathLike[str]) -> RunMeta:
    path = _check_run_dir(run_dir)
    meta_path = path / META_FILE
    try:
        text = meta_path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptFileError(ErrorCode.UNREADABLE_FILE, f"{meta_path}: cannot be read ({exc})") from None
    return RunMeta.from_json(text, where=str(meta_path))


def _check_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    path = Path(run_dir)
    if not path.exists():
        raise RunNotFoundError(
            ErrorCode.RUN_NOT_FOUND, f"{path} does not exist: give the directory that `ppscope run` wrote"
        )
    if not path.is_dir():
        raise RunNotFoundError(
            ErrorCode.NOT_A_RUN, f"{path} is not a run directory (a run is a directory with meta.json)"
        )
    if not any(path.iterdir()):
        raise RunNotFoundError(
            ErrorCode.RUN_EMPTY, f"{path} is empty: it holds no run (expected meta.json and rank-*.sqlite)"
        )
    if not (path / META_FILE).is_file():
        raise RunNotFoundError(
            ErrorCode.NOT_A_RUN,
            f"{path} has no {META_FILE}: it is not a ppscope run, or the run died before it started",
        )
    return path


def rank_file_count(run_dir: str | os.PathLike[str]) -> int:
    """How many rank files the run directory holds (not their SQLite logs, nor other files)."""
    return len(_rank_files(Path(run_dir)))


def span_count(run_dir: str | os.PathLike[str]) -> int:
    """How many spans the run's rank files hold, without reading them: each file's highest span id (spans are
    appended, never deleted). A file that cannot be opened counts 0: reading it says what is wrong with it."""
    total = 0
    for path in _rank_files(Path(run_dir)).values():
        try:
            db = connect_ro(path)
        except CorruptFileError:
            continue
        try:
            rows = query(db, path, "SELECT max(id) FROM spans")
        except CorruptFileError:
            rows = []
        finally:
            db.close()
        total += int(rows[0][0] or 0) if rows else 0
    return total


def _rank_files(path: Path) -> dict[int, Path]:
    found = {}
    for p in path.iterdir():
        m = _RANK_RE.match(p.name)
        if m:
            found[int(m.group(1))] = p
    return found


@dataclass(frozen=True)
class Cursor:
    """Where an incremental read stopped: per rank, the last span and counter row ids seen."""

    spans: dict[int, int] = field(default_factory=dict)
    counters: dict[int, int] = field(default_factory=dict)
    requests_bytes: int = 0


def read_since(
    run_dir: str | os.PathLike[str], since: Cursor | None = None, *, leave_out: Sequence[int] = ()
) -> tuple[Trace, Cursor]:
    """Everything written to the run after `since` (all of it when None), and the cursor to pass next time.

    Spans are on the common clock and sorted by start time. A rank file that is missing is reported in
    `Trace.warnings`; one that is damaged raises CorruptFileError naming it. Ranks in `leave_out` are not read.
    """
    meta, files, said = run_files(run_dir, leave_out)
    path = _check_run_dir(run_dir)
    since = since or Cursor()
    table, opened = read_ranks(files, since.spans, since.counters)
    said += failures_said({rank: rf.error for rank, rf, _ in opened if rf.error is not None}, meta.error)
    span_pos, counter_pos = dict(since.spans), dict(since.counters)
    for rank, rf, _ in opened:
        span_pos[rank], counter_pos[rank] = rf.last_span, rf.last_counter
    values = merge_values(table, opened)
    parts = [rf.counters for _, rf, _ in opened if rf.counters is not None]
    del opened
    spans, of_spans = spans_of(table, values, files, meta)
    counters, of_counters = _counters_of(parts, meta)
    requests, req_pos = read_requests_after(path / REQUESTS_FILE, since.requests_bytes)
    trace = Trace(spans=spans, counters=counters, meta=meta, requests=requests, warnings=said + of_spans + of_counters)
    return trace, Cursor(spans=span_pos, counters=counter_pos, requests_bytes=req_pos)


def _counters_of(parts: list[pd.DataFrame], meta: RunMeta) -> tuple[pd.DataFrame, list[Notice]]:
    """The counters of the files read, on the common clock and sorted as `Trace.sorted()` sorts them (see
    `counterfile.common_counters`), with what was left out of them."""
    return common_counters(pd.concat(parts, ignore_index=True) if parts else counters_frame(), meta)


def run_files(
    run_dir: str | os.PathLike[str], leave_out: Sequence[int] = ()
) -> tuple[RunMeta, dict[int, Path], list[Notice]]:
    """A run's metadata, its rank files by rank but those of `leave_out`, and what is to be said of the files
    it lacks."""
    path = _check_run_dir(run_dir)
    meta = read_meta(path)
    files = {r: f for r, f in _rank_files(path).items() if r not in leave_out}
    said = []
    missing = meta.ranks_missing([*files, *leave_out])
    if meta.unrecorded:
        text = "recorded with --no-record: there are no spans, only the requests' latency"
        said.append(Notice(NoticeCode.NOT_RECORDED, text))
    elif missing:  # in the words the analysis and every command use (`missing_ranks`)
        said.append(missing_ranks(missing, meta.world_size))
    return meta, files, said


def read_rank_spans(
    files: dict[int, Path], ranks: Sequence[int], meta: RunMeta
) -> tuple[pd.DataFrame, dict[int, RankError], list[Notice]]:
    """The spans of `ranks` alone, on the common clock and sorted as `load_run` sorts them, with the errors
    those ranks recorded and the warnings of their damaged spans: a large run read a few ranks at a time.
    `files` and `meta` are `run_files`'s."""
    spans, _, errors, said = read_rank_parts(files, ranks, meta)
    return spans, errors, said


def read_rank_parts(
    files: dict[int, Path], ranks: Sequence[int], meta: RunMeta
) -> tuple[pd.DataFrame, pd.DataFrame, dict[int, RankError], list[Notice]]:
    """`read_rank_spans` with the ranks' counters (beside the spans), as `load_run` holds them."""
    chosen = {r: files[r] for r in ranks if r in files}
    table, opened = read_ranks(chosen, {}, {})
    errors = {rank: rf.error for rank, rf, _ in opened if rf.error is not None}
    values = merge_values(table, opened)
    parts = [rf.counters for _, rf, _ in opened if rf.counters is not None]
    del opened
    spans, of_spans = spans_of(table, values, chosen, meta)
    counters, of_counters = _counters_of(parts, meta)
    return spans, counters, errors, of_spans + of_counters


def each_rank(
    files: dict[int, Path], meta: RunMeta, damaged: dict[int, CorruptFileError], notes: list[Notice] | None = None
) -> Iterator[tuple[int, pd.DataFrame, pd.DataFrame]]:
    """Each rank's spans and counters read alone (`read_rank_parts`), in rank order; a damaged rank file is left
    out and its error put in `damaged` (by rank), for the caller to name as `load_run` does (`damaged_note`).
    What a damaged file's rows lose (spans that end before they start, ...) goes into `notes`, once each.
    (A generator: what it learns on the way is put into the caller's `damaged` and `notes`.)"""
    for rank in sorted(files):
        try:
            spans, counters, _, said = read_rank_parts(files, [rank], meta)
        except CorruptFileError as exc:
            damaged[rank] = exc
            continue
        if notes is not None:
            notes.extend(n for n in said if n not in notes)
        yield rank, spans, counters


def load_run(run_dir: str | os.PathLike[str]) -> Trace:
    """The whole run as one Trace: every rank merged onto the common clock, spans sorted by start.

    A damaged rank file is left out and named in `Trace.warnings`, as a missing one is, so that one bad file
    of a many-rank job does not hide the others; when no other rank file can be read, its CorruptFileError is
    raised. (Each damaged file found costs one more read of the others.)
    """
    damaged: dict[int, CorruptFileError] = {}
    while True:
        try:
            trace, _ = read_since(run_dir, leave_out=tuple(damaged))
        except CorruptFileError as exc:
            rank = _damaged_rank(Path(run_dir), exc, damaged)
            if rank is None:
                raise
            damaged[rank] = exc
            continue
        if not damaged:
            return trace
        if not len(trace.spans) and not (set(_rank_files(Path(run_dir))) - set(damaged)):
            raise next(iter(damaged.values()))
        for rank, why in sorted(damaged.items()):
            trace.warnings.append(damaged_note(rank, why))
        return trace


def damaged_note(rank: int, why: str | CorruptFileError) -> Notice:
    """What is said of a damaged rank file left out of a run's analysis."""
    return Notice(NoticeCode.DAMAGED_FILE, f"rank {rank}'s file is damaged, left out (loaded the rest): {why}")


def failures_said(errors: Mapping[int, RankError], said: str = "") -> list[Notice]:
    """The failures the ranks recorded (rank -> its error and code), as `failures.recorded_failures` words them."""
    return [Notice(NoticeCode.RANK_FAILED, line) for line in recorded_failures(errors, said)]


def _damaged_rank(path: Path, exc: CorruptFileError, known: dict[int, CorruptFileError]) -> int | None:
    """The rank whose file a CorruptFileError is about (`exc.path`), when other rank files remain to be read;
    else None."""
    files = {r: f for r, f in _rank_files(path).items() if r not in known}
    if len(files) < 2 or exc.path is None:
        return None
    return next((r for r, f in sorted(files.items()) if f == exc.path), None)


def read_rank_info(run_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """The `info` table of each rank file (schema version, the recorder's span counts once it closed:
    `spans_recorded`, `spans_written`, and under torchrun a failed rank's `error`), read-only, values decoded
    from JSON."""
    path = _check_run_dir(run_dir)
    out: dict[int, dict[str, Any]] = {}
    for rank, file in sorted(_rank_files(path).items()):
        db = connect_ro(file)
        try:
            tables = {r[0] for r in query(db, file, "SELECT name FROM sqlite_master WHERE type='table'")}
            rows = query(db, file, "SELECT key, value FROM info") if "info" in tables else []
        finally:
            db.close()
        try:
            out[rank] = {str(k): json.loads(v) for k, v in rows}
        except (TypeError, ValueError):
            raise CorruptFileError(
                ErrorCode.DAMAGED_FILE, f"{file}: its info table holds a value that is not JSON; the file is damaged"
            ) from None
    return out


def read_requests(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    return read_requests_after(Path(run_dir) / REQUESTS_FILE, 0)[0]


class RunTail:
    """Follows a run while it is written: each `poll()` returns only what arrived since the last one."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.cursor = Cursor()

    def poll(self) -> Trace:
        delta, self.cursor = read_since(self.run_dir, self.cursor)
        return delta
