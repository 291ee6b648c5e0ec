"""The run store: a directory with `meta.json`, one SQLite file per rank and, optionally, `requests.jsonl`.

Writers (one per rank, used by the recorder's flush thread) append in batches to their own file in WAL
mode, so readers can tail a run while it is written. Readers open every file read-only: loading a run
never writes to it. Each rank stores times on its own clock; the reader moves them onto the common clock
with the offsets in `meta.json` (common = local - offset_ns).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sqlite3
import tempfile
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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
    "read_rank_info",
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


# Note on the columnar read. Fetching spans as Python tuples costs about 15 objects per row, which for
# millions of rows dominates both the time and the peak memory of a load. Instead, SQLite concatenates each
# column of a chunk of rows into one string (group_concat, in C): numbers are parsed straight into numpy
# arrays, text cells are split and turned into integer codes into a small per-column dictionary (lanes,
# kinds, names and phases take few distinct values). The peak is then about the final frame plus a chunk.
# SQLite stores any type in any column, so a chunk is checked before it is trusted: the schema's NOT NULL
# rules out missing cells, one max() over the number columns of each row is a number only when no cell holds
# text or a blob (they sort above numbers), reals show as "1.0", "1e+20" or "Inf", and a text cell holding
# the separator changes the count of separators. A file that fails a check is read row by row instead,
# the slow way that names what is wrong with it.
_CHUNK_ROWS = 100_000
_INT_COLS = [c for c, t in SPAN_COLUMNS.items() if t is not str]
_TEXT_COLS = [c for c, t in SPAN_COLUMNS.items() if t is str]
_SEP = "\x1f"  # ASCII unit separator, between the text cells of a chunk (a literal: char(31) costs a call a row)
_CHUNK_SQL = (
    f"SELECT count(*), max(id), max(max({', '.join(_INT_COLS)})), "
    + ", ".join(f"group_concat({c})" for c in _INT_COLS)
    + ", "
    + ", ".join(f"group_concat({c}, '{_SEP}')" for c in _TEXT_COLS)
    + " FROM spans WHERE id > ? AND id <= ?"  # a range of row ids: no sort, no sub-query
)
_INT32 = (int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max))


class _Table:
    """The spans of one read, allocated once at their final size: numbers as numpy arrays of the schema's
    dtypes, text as int32 codes (-1: a missing cell, only from files read row by row)."""

    def __init__(self, n: int) -> None:
        self.ints = {c: np.empty(n, dtype=SPAN_COLUMNS[c]) for c in _INT_COLS}
        self.codes = {c: np.empty(n, dtype=np.int32) for c in _TEXT_COLS}


@dataclass
class _RankFile:
    """One rank file opened for a read: a read transaction holds its snapshot while the spans are counted,
    space is made for them, and they are read."""

    path: Path
    db: sqlite3.Connection
    after_span: int
    after_counter: int
    n_spans: int = 0
    row_by_row: bool = False  # the file's spans table lacks the schema's NOT NULL: no fast read
    values: dict[str, list[Any]] = field(default_factory=dict)  # the dictionary of each text column's codes
    last_span: int = 0
    last_counter: int = 0
    counters: pd.DataFrame | None = None  # None: no new counter


def _open_rank(path: Path, after_span: int, after_counter: int) -> _RankFile | None:
    """Open, check and count a rank file; None for one created with nothing committed yet."""
    db = _connect_ro(path)
    try:
        _query(db, path, "SELECT 1 FROM sqlite_master LIMIT 1")
        tables = {r[0] for r in _query(db, path, "SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"spans", "counters"} <= tables:
            if not tables:
                db.close()
                return None
            raise CorruptFileError(f"{path} is an SQLite file but not a ppscope rank file (no spans table)")
        if "info" in tables:
            _check_rank_schema(db, path)
        _query(db, path, "BEGIN")  # one snapshot for the count and every chunk, while a writer appends
        rf = _RankFile(path, db, after_span, after_counter, last_span=after_span)
        rf.n_spans = _query(db, path, "SELECT count(*) FROM spans WHERE id > ?", (after_span,))[0][0]
        not_null = {r[0] for r in _query(db, path, "SELECT name FROM pragma_table_info('spans') WHERE \"notnull\"")}
        rf.row_by_row = not not_null >= set(_SPAN_COLS)
        return rf
    except BaseException:
        db.close()
        raise


def _read_rank(rf: _RankFile, table: _Table, pos: int) -> None:
    """Read the file's spans into rows pos.. of `table`, and its counters, then close it."""
    try:
        if rf.row_by_row or not _read_chunks(rf, table, pos):
            _read_rows(rf, table, pos)
        rows = _query(
            rf.db,
            rf.path,
            f"SELECT id, {', '.join(_COUNTER_COLS)} FROM counters WHERE id > ? ORDER BY id",
            (rf.after_counter,),
        )
    finally:
        rf.db.close()
    try:
        if rows:
            rf.counters = counters_frame(pd.DataFrame([r[1:] for r in rows], columns=_COUNTER_COLS))
    except (ValueError, TypeError, OverflowError) as exc:
        raise CorruptFileError(_wrong_type(rf.path, exc)) from None
    rf.last_counter = int(rows[-1][0]) if rows else rf.after_counter


def _read_chunks(rf: _RankFile, table: _Table, pos: int) -> bool:
    """Read the spans chunk by chunk into `table` from row `pos` on; False as soon as a chunk breaks the
    schema (see the note above), to read the file row by row instead."""
    path, db = rf.path, rf.db
    last, end = rf.after_span, pos + rf.n_spans
    values: dict[str, dict[Any, int]] = {c: {} for c in _TEXT_COLS}
    (high,) = _query(db, path, "SELECT max(id) FROM spans")[0]
    while high is not None and last < high:
        try:
            row = db.execute(_CHUNK_SQL, (last, min(last + _CHUNK_ROWS, high))).fetchone()
        except UnicodeDecodeError:  # a cell that is not UTF-8: the row-by-row read says where
            return False
        except sqlite3.Error as exc:
            raise CorruptFileError(
                f"{path}: unreadable ({_brief(exc)}); the file is damaged or not a ppscope rank file"
            ) from None
        n, last_id, top = row[:3]
        if not n:  # a gap in the row ids (rows deleted): jump to the next one
            last = _query(db, path, "SELECT min(id) - 1 FROM spans WHERE id > ?", (last,))[0][0]
            continue
        if not isinstance(top, int) or pos + n > end:
            return False
        for c, cells in zip(_INT_COLS, row[3 : 3 + len(_INT_COLS)], strict=True):
            if "." in cells or "e" in cells or "I" in cells:  # a real number
                return False
            arr = np.fromstring(cells, sep=",", dtype=np.int64)
            if len(arr) != n:
                return False
            if SPAN_COLUMNS[c] is np.int32 and (arr.min() < _INT32[0] or arr.max() > _INT32[1]):
                return False
            table.ints[c][pos : pos + n] = arr
        for c, cells in zip(_TEXT_COLS, row[3 + len(_INT_COLS) :], strict=True):
            if cells.count(_SEP) != n - 1:
                return False
            codes, uniques = pd.factorize(np.array(cells.split(_SEP), dtype=object))
            known = values[c]
            lut = np.array([known.setdefault(v, len(known)) for v in uniques], dtype=np.int32)
            table.codes[c][pos : pos + n] = lut[codes]
        pos, last = pos + n, last_id
    if pos != end:
        return False
    rf.values = {c: list(v) for c, v in values.items()}
    rf.last_span = last
    return True


def _read_rows(rf: _RankFile, table: _Table, pos: int) -> None:
    """The spans fetched as rows and converted by pandas: slow, for files that need it."""
    rows = _query(
        rf.db, rf.path, f"SELECT id, {', '.join(_SPAN_COLS)} FROM spans WHERE id > ? ORDER BY id", (rf.after_span,)
    )
    if len(rows) != rf.n_spans:
        raise CorruptFileError(f"{rf.path}: counted {rf.n_spans} spans but read {len(rows)}; the file is damaged")
    try:
        spans = spans_frame(pd.DataFrame(rows, columns=["id", *_SPAN_COLS]).drop(columns="id"), validate=False)
    except (ValueError, TypeError, OverflowError) as exc:  # SQLite stores any type in any column
        raise CorruptFileError(_wrong_type(rf.path, exc)) from None
    for c in _INT_COLS:
        table.ints[c][pos : pos + len(rows)] = spans[c].to_numpy()
    for c in _TEXT_COLS:
        codes, uniques = pd.factorize(spans[c])  # a missing cell: code -1
        table.codes[c][pos : pos + len(rows)] = codes
        rf.values[c] = list(uniques)
    rf.last_span = int(rows[-1][0]) if rows else rf.after_span


def _wrong_type(path: Path, exc: Exception) -> str:
    return f"{path}: a span or counter holds a value of the wrong type ({exc}); the file is damaged"


_READ_THREADS = max(1, min(4, os.cpu_count() or 1))
_PARALLEL_SPANS = 4 * _CHUNK_ROWS  # below this, starting threads costs more than it saves


def _read_ranks(files: dict[int, Path], since: Cursor) -> tuple[_Table, list[tuple[int, _RankFile, int]]]:
    """Every rank file read into one table, several files at a time (SQLite lets go of the GIL while it
    builds a chunk); with each file, the row its spans start at."""
    opened: list[tuple[int, _RankFile, int]] = []
    try:
        total = 0
        for rank in sorted(files):  # in rank order, so the first damaged file is the one named
            rf = _open_rank(files[rank], since.spans.get(rank, 0), since.counters.get(rank, 0))
            if rf is not None:
                opened.append((rank, rf, total))
                total += rf.n_spans
        table = _Table(total)
        if len(opened) <= 1 or total < _PARALLEL_SPANS:
            for _, rf, pos in opened:
                _read_rank(rf, table, pos)
        else:
            with ThreadPoolExecutor(max_workers=min(len(opened), _READ_THREADS)) as pool:
                futures = [pool.submit(_read_rank, rf, table, pos) for _, rf, pos in opened]
                for f in futures:  # in rank order: the first damaged file raises
                    f.result()
    finally:
        for _, rf, _ in opened:
            rf.db.close()
    return table, opened


def _merge_values(table: _Table, opened: list[tuple[int, _RankFile, int]]) -> dict[str, list[Any]]:
    """Move each file's text codes onto one dictionary per column (in place); the dictionaries."""
    values: dict[str, list[Any]] = {}
    for c in _TEXT_COLS:
        merged: dict[Any, int] = {}
        for _, rf, pos in opened:
            lut = np.array([merged.setdefault(v, len(merged)) for v in rf.values.get(c, [])], dtype=np.int32)
            part = table.codes[c][pos : pos + rf.n_spans]
            if len(part) and (part < 0).any():
                part[part >= 0] = lut[part[part >= 0]]
            elif len(part):
                part[:] = lut[part]
        values[c] = list(merged)
    return values


def _spans_of(
    table: _Table, values: dict[str, list[Any]], files: dict[int, Path], meta: RunMeta, warnings: list[str]
) -> pd.DataFrame:
    """The table as one frame of the schema's dtypes, on the common clock, sorted like `Trace.sorted()`.
    Spans only a damaged file holds are left out with a warning: those that end before they start (the
    recorder refuses them) and those too near the int64 limits to move onto the common clock."""
    cols: dict[str, np.ndarray] = {**table.ints, **table.codes}
    if not len(cols["rank"]):
        return spans_frame()
    table.ints, table.codes = {}, {}  # each column is let go once sorted
    reversed_ = cols["end_ns"] < cols["start_ns"]
    wide = _unshiftable(cols["rank"], meta, cols["start_ns"], cols["end_ns"]) & ~reversed_
    for bad, what in ((reversed_, "end before they start"), (wide, _UNSHIFTABLE)):
        if bad.any():
            ranks = sorted(set(cols["rank"][bad].tolist()))
            where = ", ".join(files[r].name if r in files else f"rank {r}" for r in ranks)
            warnings.append(f"{int(bad.sum())} span(s) in {where} {what} (a damaged file); left them out")
    if reversed_.any() or wide.any():
        cols = {c: a[~(reversed_ | wide)] for c, a in cols.items()}
    for info in meta.ranks:
        offset = np.int64(info.clock.offset_ns)
        if offset:
            rows = cols["rank"] == info.rank
            cols["start_ns"][rows] -= offset
            cols["end_ns"][rows] -= offset
    order = _start_order(cols["start_ns"], cols["rank"], cols["end_ns"])
    for c in SPAN_COLUMNS:
        cols[c] = cols[c][order]  # one column at a time: the unsorted one is let go at once
    del order
    out: dict[str, Any] = {}
    for c, dtype in SPAN_COLUMNS.items():
        out[c] = _text_column(cols.pop(c), values[c], dtype) if c in values else cols.pop(c)
    return pd.DataFrame(out, copy=False)


_UNSHIFTABLE = "lie too near the int64 limits to move onto the common clock"


def _unshiftable(rank: np.ndarray, meta: RunMeta, *times: np.ndarray) -> np.ndarray:
    """Rows with a time that would wrap round int64 when moved by its rank's clock offset."""
    out = np.zeros(len(rank), dtype=bool)
    low, high = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
    for info in meta.ranks:
        offset = info.clock.offset_ns
        if offset:
            rows = rank == info.rank
            for ts in times:
                out |= rows & ((ts < low + offset) if offset > 0 else (ts > high + offset))
    return out


def _start_order(start: np.ndarray, rank: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The order of a stable sort by (start, rank, end), as `Trace.sorted()` makes it, found faster: a plain
    sort by start, then a full sort of only the spans that share their start with another."""
    order = np.argsort(start)
    first = start[order]
    tied = np.zeros(len(first), dtype=bool)
    np.equal(first[1:], first[:-1], out=tied[1:])
    tied[:-1] |= tied[1:].copy()
    if tied.any():
        sub = order[tied]  # groups of equal starts stay together: `first` is sorted
        order[tied] = sub[np.lexsort((sub, end[sub], rank[sub], first[tied]))]  # ties by position: stable
    return order


@functools.cache
def _pandas_dtype(dtype: Any) -> Any:
    """What `astype(dtype)` makes here (`str` depends on the pandas version and on pyarrow)."""
    return pd.Series([], dtype=dtype).dtype


def _text_column(codes: np.ndarray, values: list[Any], dtype: Any) -> Any:
    """Codes into `values` as a column of the schema's text dtype; straight from Arrow when pandas keeps its
    strings there (a dictionary decoded in C, no Python string per cell)."""
    target = _pandas_dtype(dtype)
    if isinstance(target, pd.StringDtype) and target.storage == "pyarrow":
        import pyarrow as pa

        missing = codes < 0
        indices = pa.array(codes, mask=missing) if missing.any() else pa.array(codes)  # no copy without a mask
        text = pa.DictionaryArray.from_arrays(indices, pa.array(values, type=pa.large_string())).dictionary_decode()
        del indices
        return text.to_pandas(types_mapper={pa.large_string(): target}.get)  # pandas keeps large_string: no copy
    categories = pd.Index(values, dtype=object)
    return pd.Series(pd.Categorical.from_codes(codes, categories=categories), copy=False).astype(dtype)


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
    table, opened = _read_ranks(files, since)
    span_pos, counter_pos = dict(since.spans), dict(since.counters)
    for rank, rf, _ in opened:
        span_pos[rank], counter_pos[rank] = rf.last_span, rf.last_counter
    values = _merge_values(table, opened)
    parts = [rf.counters for _, rf, _ in opened if rf.counters is not None]
    counters = pd.concat(parts, ignore_index=True) if parts else counters_frame()
    del opened
    spans = _spans_of(table, values, files, meta, warnings)
    wide = _unshiftable(counters["rank"].to_numpy(), meta, counters["ts_ns"].to_numpy())
    if wide.any():
        warnings.append(f"{int(wide.sum())} counter sample(s) {_UNSHIFTABLE} (a damaged file); left them out")
        counters = counters[~wide].reset_index(drop=True)
    for info in meta.ranks:
        if info.clock.offset_ns:
            counters.loc[counters["rank"].to_numpy() == info.rank, "ts_ns"] -= np.int64(info.clock.offset_ns)
    counters = counters.sort_values(["ts_ns", "rank"], kind="stable").reset_index(drop=True)  # as Trace.sorted()
    requests, req_pos = _read_requests(path, since.requests_bytes)
    trace = Trace(spans=spans, counters=counters, meta=meta, requests=requests, warnings=warnings)
    return trace, Cursor(spans=span_pos, counters=counter_pos, requests_bytes=req_pos)


def load_run(run_dir: str | os.PathLike[str]) -> Trace:
    """The whole run as one Trace: every rank merged onto the common clock, spans sorted by start."""
    trace, _ = read_since(run_dir)
    return trace


def read_rank_info(run_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """The `info` table of each rank file (schema version, and the recorder's span counts once it closed:
    `spans_recorded`, `spans_written`), read-only, values decoded from JSON."""
    path = _check_run_dir(run_dir)
    out: dict[int, dict[str, Any]] = {}
    for rank, file in sorted(_rank_files(path).items()):
        db = _connect_ro(file)
        try:
            tables = {r[0] for r in _query(db, file, "SELECT name FROM sqlite_master WHERE type='table'")}
            rows = _query(db, file, "SELECT key, value FROM info") if "info" in tables else []
        finally:
            db.close()
        try:
            out[rank] = {str(k): json.loads(v) for k, v in rows}
        except (TypeError, ValueError):
            raise CorruptFileError(
                f"{file}: its info table holds a value that is not JSON; the file is damaged"
            ) from None
    return out


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
