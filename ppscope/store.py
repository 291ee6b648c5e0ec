"""The run store: a directory with `meta.json`, one SQLite file per rank and, optionally, `requests.jsonl`.

Writers (one per rank, used by the recorder's flush thread) append in batches to their own file in WAL
mode, so readers can tail a run while it is written. Readers open every file read-only: loading a run
never writes to it. Each rank stores times on its own clock; the reader moves them onto the common clock
with the offsets in `meta.json` (common = local - offset_ns).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import tempfile
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, RunExistsError, RunNotFoundError, SchemaVersionError
from ppscope.trace import (
    COUNTER_COLUMNS,
    REQUEST_COLUMNS,
    SCHEMA_VERSION,
    SPAN_COLUMNS,
    RunMeta,
    Trace,
    counters_frame,
    requests_frame,
    spans_frame,
)

__all__ = [
    "META_FILE",
    "REQUESTS_FILE",
    "Cursor",
    "RankWriter",
    "RunTail",
    "create_run",
    "is_run_dir",
    "load_run",
    "rank_file",
    "read_meta",
    "read_requests",
    "read_since",
    "write_meta",
]

META_FILE = "meta.json"
REQUESTS_FILE = "requests.jsonl"
_RANK_RE = re.compile(r"^rank-(\d{5,})\.sqlite$")
_SQLITE_MAGIC = b"SQLite format 3\x00"

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
CREATE INDEX IF NOT EXISTS spans_start ON spans(start_ns);
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
    """Create a new run directory holding `meta.json`. Refuses a directory that already holds files."""
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise RunExistsError(f"{path} exists and is not a directory: choose another --out")
    if path.is_dir() and any(path.iterdir()):
        raise RunExistsError(f"{path} already holds files; ppscope never overwrites a run: choose another --out")
    path.mkdir(parents=True, exist_ok=True)
    write_meta(path, meta)
    return path


def write_meta(run_dir: str | os.PathLike[str], meta: RunMeta) -> None:
    """Replace `meta.json` atomically: a reader sees the old or the new file, never half of one."""
    path = Path(run_dir)
    fd, tmp = tempfile.mkstemp(prefix=".meta-", suffix=".json", dir=path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(meta.to_json())
        os.replace(tmp, path / META_FILE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class RankWriter:
    """Appends one rank's spans and counters to `rank-NNNNN.sqlite`. Not thread-safe: one thread writes.

    Rows are tuples in schema column order (`SPAN_COLUMNS`, `COUNTER_COLUMNS`), times on the rank's clock.
    """

    def __init__(self, run_dir: str | os.PathLike[str], rank: int) -> None:
        self.path = rank_file(run_dir, rank)
        if self.path.exists():
            raise RunExistsError(f"{self.path} already exists; ppscope never overwrites a rank's spans")
        if not Path(run_dir).is_dir():
            raise RunNotFoundError(f"{run_dir} is not a run directory: create it with create_run() first")
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


def read_meta(run_dir: str | os.PathLike[str]) -> RunMeta:
    path = _check_run_dir(run_dir)
    meta_path = path / META_FILE
    try:
        text = meta_path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptFileError(f"{meta_path}: cannot be read ({exc})") from None
    return RunMeta.from_json(text, where=str(meta_path))


def _check_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    path = Path(run_dir)
    if not path.exists():
        raise RunNotFoundError(f"{path} does not exist: give the directory that `ppscope run` wrote")
    if not path.is_dir():
        raise RunNotFoundError(f"{path} is not a run directory (a run is a directory with meta.json)")
    if not any(path.iterdir()):
        raise RunNotFoundError(f"{path} is empty: it holds no run (expected meta.json and rank-*.sqlite)")
    if not (path / META_FILE).is_file():
        raise RunNotFoundError(f"{path} has no {META_FILE}: it is not a ppscope run, or the run died before it started")
    return path


def _rank_files(path: Path) -> dict[int, Path]:
    found = {}
    for p in path.iterdir():
        m = _RANK_RE.match(p.name)
        if m:
            found[int(m.group(1))] = p
    return found


def _connect_ro(path: Path) -> sqlite3.Connection:
    """Open read-only. Checks the header first so a non-SQLite file gets a clear error, not a guess."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise CorruptFileError(f"{path}: cannot be read ({exc})") from None
    wal = path.with_name(path.name + "-wal")
    if head != _SQLITE_MAGIC and not (not head and wal.exists()):
        raise CorruptFileError(f"{path} is not an SQLite file (truncated or overwritten); remove it to load the rest")
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True, check_same_thread=False)
        db.execute("PRAGMA query_only=1")
        return db
    except sqlite3.Error as exc:
        raise CorruptFileError(f"{path}: cannot be opened as SQLite ({_brief(exc)})") from None


def _brief(exc: BaseException, limit: int = 200) -> str:
    """SQLite's message on one line, shortened: it quotes a damaged schema, newlines and all."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _query(db: sqlite3.Connection, path: Path, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    try:
        return db.execute(sql, args).fetchall()
    except (sqlite3.Error, UnicodeDecodeError) as exc:  # text cells that are not UTF-8 fail as they are fetched
        raise CorruptFileError(
            f"{path}: unreadable ({_brief(exc)}); the file is damaged or not a ppscope rank file"
        ) from None


def _check_rank_schema(db: sqlite3.Connection, path: Path) -> None:
    rows = _query(db, path, "SELECT value FROM info WHERE key = 'schema_version'")
    try:
        version = int(json.loads(rows[0][0])) if rows else SCHEMA_VERSION
    except (ValueError, TypeError, OverflowError):  # not JSON, not a number, a blob
        raise CorruptFileError(
            f"{path}: its schema_version {rows[0][0]!r:.40} is not a number; the file is damaged"
        ) from None
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{path} was written with trace schema {version}, newer than this ppscope's {SCHEMA_VERSION}: "
            "upgrade ppscope to read it"
        )


@dataclass(frozen=True)
class Cursor:
    """Where an incremental read stopped: per rank, the last span and counter row ids seen."""

    spans: dict[int, int] = field(default_factory=dict)
    counters: dict[int, int] = field(default_factory=dict)
    requests_bytes: int = 0


def _read_rank(
    path: Path, after_span: int, after_counter: int
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int, int]:
    db = _connect_ro(path)
    try:
        _query(db, path, "SELECT 1 FROM sqlite_master LIMIT 1")
        tables = {r[0] for r in _query(db, path, "SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"spans", "counters"} <= tables:
            if not tables:  # created but nothing committed yet
                return [], [], after_span, after_counter
            raise CorruptFileError(f"{path} is an SQLite file but not a ppscope rank file (no spans table)")
        if "info" in tables:
            _check_rank_schema(db, path)
        spans = _query(
            db, path, f"SELECT id, {', '.join(_SPAN_COLS)} FROM spans WHERE id > ? ORDER BY id", (after_span,)
        )
        counters = _query(
            db,
            path,
            f"SELECT id, {', '.join(_COUNTER_COLS)} FROM counters WHERE id > ? ORDER BY id",
            (after_counter,),
        )
    finally:
        db.close()
    last_span = spans[-1][0] if spans else after_span
    last_counter = counters[-1][0] if counters else after_counter
    return spans, counters, last_span, last_counter


def _to_frames(
    span_rows: list[tuple[Any, ...]], counter_rows: list[tuple[Any, ...]]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    spans = pd.DataFrame(span_rows, columns=["id", *_SPAN_COLS]).drop(columns="id")
    counters = pd.DataFrame(counter_rows, columns=["id", *_COUNTER_COLS]).drop(columns="id")
    return spans_frame(spans, validate=False), counters_frame(counters)


def _wrong_type(
    files: dict[int, Path],
    read: dict[int, tuple[int, int]],
    span_rows: list[tuple[Any, ...]],
    counter_rows: list[tuple[Any, ...]],
    exc: Exception,
) -> str:
    """The message for rows that do not convert to the schema's types, naming the rank file they came from
    (found by converting each file's rows alone: only on this error path)."""
    bounds = [*read.values(), (len(span_rows), len(counter_rows))]
    for (rank, (s0, c0)), (s1, c1) in zip(read.items(), bounds[1:], strict=True):
        try:
            _to_frames(span_rows[s0:s1], counter_rows[c0:c1])
        except (ValueError, TypeError, OverflowError) as own:
            exc = own
            return f"{files[rank]}: a span or counter holds a value of the wrong type ({exc}); the file is damaged"
    return f"a rank file holds a value of the wrong type ({exc}); the run is damaged"


def _drop_reversed(spans: pd.DataFrame, files: dict[int, Path], warnings: list[str]) -> pd.DataFrame:
    """Spans that end before they start can only come from a damaged file (the recorder refuses them): leave
    them out and say so, rather than refuse the whole run."""
    bad = spans["end_ns"].to_numpy() < spans["start_ns"].to_numpy()
    if not bad.any():
        return spans
    ranks = sorted(set(spans.loc[bad, "rank"].tolist()))
    where = ", ".join(files[r].name if r in files else f"rank {r}" for r in ranks)
    warnings.append(f"{int(bad.sum())} span(s) in {where} end before they start (a damaged file); left them out")
    return spans[~bad].reset_index(drop=True)


def _apply_offsets(spans: pd.DataFrame, counters: pd.DataFrame, meta: RunMeta) -> None:
    for info in meta.ranks:
        offset = np.int64(info.clock.offset_ns)
        if not offset:
            continue
        rows = spans["rank"].to_numpy() == info.rank
        spans.loc[rows, "start_ns"] -= offset
        spans.loc[rows, "end_ns"] -= offset
        counters.loc[counters["rank"].to_numpy() == info.rank, "ts_ns"] -= offset


def read_since(run_dir: str | os.PathLike[str], since: Cursor | None = None) -> tuple[Trace, Cursor]:
    """Everything written to the run after `since` (all of it when None), and the cursor to pass next time.

    Spans are on the common clock and sorted by start time. A rank file that is missing is reported in
    `Trace.warnings`; one that is damaged raises CorruptFileError naming it.
    """
    path = _check_run_dir(run_dir)
    meta = read_meta(path)
    since = since or Cursor()
    files = _rank_files(path)
    warnings = []
    missing = sorted(set(range(meta.world_size)) - set(files))
    if missing:
        names = ", ".join(rank_file(path, r).name for r in missing)
        warnings.append(f"rank(s) {', '.join(map(str, missing))} have no file ({names}); loaded the rest")
    span_rows: list[tuple[Any, ...]] = []
    counter_rows: list[tuple[Any, ...]] = []
    span_pos, counter_pos = dict(since.spans), dict(since.counters)
    read: dict[int, tuple[int, int]] = {}
    for rank in sorted(files):
        s, c, span_pos[rank], counter_pos[rank] = _read_rank(
            files[rank], since.spans.get(rank, 0), since.counters.get(rank, 0)
        )
        read[rank] = (len(span_rows), len(counter_rows))
        span_rows += s
        counter_rows += c
    try:
        spans, counters = _to_frames(span_rows, counter_rows)
    except (ValueError, TypeError, OverflowError) as exc:  # SQLite stores any type in any column
        raise CorruptFileError(_wrong_type(files, read, span_rows, counter_rows, exc)) from None
    spans = _drop_reversed(spans, files, warnings)
    _apply_offsets(spans, counters, meta)
    requests, req_pos = _read_requests(path, since.requests_bytes)
    trace = Trace(spans=spans, counters=counters, meta=meta, requests=requests, warnings=warnings).sorted()
    return trace, Cursor(spans=span_pos, counters=counter_pos, requests_bytes=req_pos)


def load_run(run_dir: str | os.PathLike[str]) -> Trace:
    """The whole run as one Trace: every rank merged onto the common clock, spans sorted by start."""
    trace, _ = read_since(run_dir)
    return trace


def read_requests(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    return _read_requests(Path(run_dir), 0)[0]


_REQUEST_BOUNDS = {c: (int(np.iinfo(t).min), int(np.iinfo(t).max)) for c, t in REQUEST_COLUMNS.items()}


def _read_requests(path: Path, offset: int) -> tuple[pd.DataFrame, int]:
    """Complete lines of `requests.jsonl` after byte `offset`; a half-written last line waits for later."""
    req_path = path / REQUESTS_FILE
    if not req_path.is_file():
        return requests_frame(), offset
    with open(req_path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    rows = []
    for lineno, line in enumerate(data[:end].splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            row = {c: int(obj.get(c, -1) if obj.get(c) is not None else -1) for c in REQUEST_COLUMNS}
        except (json.JSONDecodeError, TypeError, ValueError, AttributeError, OverflowError):
            raise CorruptFileError(f"{req_path}: line {lineno} after byte {offset} is not a request record") from None
        wide = [c for c, v in row.items() if not _REQUEST_BOUNDS[c][0] <= v <= _REQUEST_BOUNDS[c][1]]
        if wide:
            raise CorruptFileError(f"{req_path}: line {lineno} after byte {offset}: {wide[0]} is out of range")
        rows.append(row)
    frame = requests_frame(pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))) if rows else requests_frame()
    return frame, offset + end


class RunTail:
    """Follows a run while it is written: each `poll()` returns only what arrived since the last one."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.cursor = Cursor()

    def poll(self) -> Trace:
        delta, self.cursor = read_since(self.run_dir, self.cursor)
        return delta
