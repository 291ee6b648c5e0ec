"""Reading rank files: open them read-only and check them, then read their spans column by column.

`ppscope.trace.store` lays out a run and reads it through this module. A rank file is an SQLite database; a
reader never writes to it (`mode=ro`, `query_only`), and anything wrong with it is a CorruptFileError or a
SchemaVersionError naming the file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import urllib.parse
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, ErrorCode, SchemaVersionError, brief
from ppscope.failures import FailureCode, RankError
from ppscope.trace.clock import offsets_at
from ppscope.trace.model import (
    COUNTER_COLUMNS,
    SCHEMA_VERSION,
    SPAN_COLUMNS,
    RunMeta,
    SpanKind,
    counters_frame,
    spans_frame,
)
from ppscope.trace.notices import Notice, NoticeCode

__all__ = [
    "UNSHIFTABLE",
    "RankFile",
    "Table",
    "connect_ro",
    "merge_values",
    "query",
    "read_p2p",
    "read_ranks",
    "read_sends",
    "spans_of",
    "start_order",
    "text_column",
    "unshiftable",
]

_SQLITE_MAGIC = b"SQLite format 3\x00"
_SPAN_COLS = list(SPAN_COLUMNS)
_COUNTER_COLS = list(COUNTER_COLUMNS)


def connect_ro(path: Path) -> sqlite3.Connection:
    """Open read-only. Checks the header first so a non-SQLite file gets a clear error, not a guess."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise CorruptFileError(ErrorCode.UNREADABLE_FILE, f"{path}: cannot be read ({exc})") from None
    wal = path.with_name(path.name + "-wal")
    if head != _SQLITE_MAGIC and not (not head and wal.exists()):
        raise CorruptFileError(
            ErrorCode.NOT_SQLITE, f"{path} is not an SQLite file (truncated or overwritten); remove it to load the rest"
        )
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True, check_same_thread=False)
        db.execute("PRAGMA query_only=1")
        return db
    except sqlite3.Error as exc:
        raise CorruptFileError(ErrorCode.NOT_SQLITE, f"{path}: cannot be opened as SQLite ({brief(exc)})") from None


def query(db: sqlite3.Connection, path: Path, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    try:
        return db.execute(sql, args).fetchall()
    except (sqlite3.Error, UnicodeDecodeError) as exc:  # text cells that are not UTF-8 fail as they are fetched
        raise CorruptFileError(
            ErrorCode.DAMAGED_FILE, f"{path}: unreadable ({brief(exc)}); the file is damaged or not a ppscope rank file"
        ) from None


def _check_rank_schema(db: sqlite3.Connection, path: Path) -> None:
    rows = query(db, path, "SELECT value FROM info WHERE key = 'schema_version'")
    try:
        version = int(json.loads(rows[0][0])) if rows else SCHEMA_VERSION
    except (ValueError, TypeError, OverflowError, RecursionError):  # not JSON, not a number, a blob, too deep
        raise CorruptFileError(
            ErrorCode.DAMAGED_FILE,
            f"{path}: its schema_version {rows[0][0]!r:.40} is not a number; the file is damaged",
        ) from None
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            ErrorCode.SCHEMA_TOO_NEW,
            f"{path} was written with trace schema {version}, newer than this ppscope's {SCHEMA_VERSION}: "
            "upgrade ppscope to read it",
        )


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


class Table:
    """The spans of one read, allocated once at their final size: numbers as numpy arrays of the schema's
    dtypes, text as int32 codes (-1: a missing cell, only from files read row by row)."""

    def __init__(self, n: int) -> None:
        self.ints = {c: np.empty(n, dtype=SPAN_COLUMNS[c]) for c in _INT_COLS}
        self.codes = {c: np.empty(n, dtype=np.int32) for c in _TEXT_COLS}


@dataclass
class RankFile:
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
    error: RankError | None = None  # the rank's own failure, when it recorded one (info keys `error` and
    # `failure_code`, under torchrun)


def _open_rank(path: Path, after_span: int, after_counter: int) -> RankFile | None:
    """Open, check and count a rank file; None for one created with nothing committed yet."""
    db = connect_ro(path)
    try:
        query(db, path, "SELECT 1 FROM sqlite_master LIMIT 1")
        tables = {r[0] for r in query(db, path, "SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"spans", "counters"} <= tables:
            if not tables:
                db.close()
                return None
            raise CorruptFileError(
                ErrorCode.NOT_A_RANK_FILE, f"{path} is an SQLite file but not a ppscope rank file (no spans table)"
            )
        error = None
        if "info" in tables:
            _check_rank_schema(db, path)
            error = _recorded_error(db)
        query(db, path, "BEGIN")  # one snapshot for the count and every chunk, while a writer appends
        rf = RankFile(path, db, after_span, after_counter, last_span=after_span, error=error)
        rf.n_spans = query(db, path, "SELECT count(*) FROM spans WHERE id > ?", (after_span,))[0][0]
        not_null = {r[0] for r in query(db, path, "SELECT name FROM pragma_table_info('spans') WHERE \"notnull\"")}
        rf.row_by_row = not not_null >= set(_SPAN_COLS)
        return rf
    except BaseException:
        db.close()
        raise


def _recorded_error(db: sqlite3.Connection) -> RankError | None:
    """A rank's recorded failure: the text of its error (info key `error`, a JSON string), at most 500
    characters, and its code (`failure_code`; None in files of older versions, which recorded none). Only a
    message: one that cannot be read is said so, and never stops the read of the spans."""
    try:
        rows = db.execute("SELECT value FROM info WHERE key = 'error'").fetchall()
        if not rows:
            return None
        raw = rows[0][0]
        try:
            value = json.loads(raw)
        except (TypeError, ValueError, RecursionError):
            value = raw
        text = " ".join(str(value).split())
    except (sqlite3.Error, ValueError, RecursionError):
        return RankError("(its recorded error cannot be read: the file is damaged)")
    text = text if len(text) <= 500 else text[:499] + "…"
    return RankError(text, _recorded_code(db)) if text else None


def _recorded_code(db: sqlite3.Connection) -> FailureCode | None:
    """The code a rank recorded beside its error; None when there is none (an older file) or it is unknown."""
    try:
        rows = db.execute("SELECT value FROM info WHERE key = 'failure_code'").fetchall()
        value = json.loads(rows[0][0]) if rows else None
    except (sqlite3.Error, TypeError, ValueError, RecursionError):
        return None
    return FailureCode(value) if value in set(FailureCode) else None


def _read_rank(rf: RankFile, table: Table, pos: int) -> None:
    """Read the file's spans into rows pos.. of `table`, and its counters, then close it."""
    try:
        if rf.row_by_row or not _read_chunks(rf, table, pos):
            _read_rows(rf, table, pos)
        rows = query(
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
        raise CorruptFileError(ErrorCode.DAMAGED_FILE, _wrong_type(rf.path, exc)) from None
    rf.last_counter = int(rows[-1][0]) if rows else rf.after_counter


def _read_chunks(rf: RankFile, table: Table, pos: int) -> bool:
    """Read the spans chunk by chunk into `table` from row `pos` on; False as soon as a chunk breaks the
    schema (see the note above), to read the file row by row instead."""
    path, db = rf.path, rf.db
    last, end = rf.after_span, pos + rf.n_spans
    values: dict[str, dict[Any, int]] = {c: {} for c in _TEXT_COLS}
    (high,) = query(db, path, "SELECT max(id) FROM spans")[0]
    while high is not None and last < high:
        try:
            row = db.execute(_CHUNK_SQL, (last, min(last + _CHUNK_ROWS, high))).fetchone()
        except UnicodeDecodeError:  # a cell that is not UTF-8: the row-by-row read says where
            return False
        except sqlite3.Error as exc:
            raise CorruptFileError(
                ErrorCode.DAMAGED_FILE,
                f"{path}: unreadable ({brief(exc)}); the file is damaged or not a ppscope rank file",
            ) from None
        n, last_id, top = row[:3]
        if not n:  # a gap in the row ids (rows deleted): jump to the next one
            last = query(db, path, "SELECT min(id) - 1 FROM spans WHERE id > ?", (last,))[0][0]
            continue
        if not isinstance(top, int) or pos + n > end:
            return False
        for c, cells in zip(_INT_COLS, row[3 : 3 + len(_INT_COLS)], strict=True):
            arr = _int_cells(cells, n, c)
            if arr is None:
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


def _read_rows(rf: RankFile, table: Table, pos: int) -> None:
    """The spans fetched as rows and converted by pandas: slow, for files that need it."""
    rows = query(
        rf.db, rf.path, f"SELECT id, {', '.join(_SPAN_COLS)} FROM spans WHERE id > ? ORDER BY id", (rf.after_span,)
    )
    if len(rows) != rf.n_spans:
        raise CorruptFileError(
            ErrorCode.DAMAGED_FILE, f"{rf.path}: counted {rf.n_spans} spans but read {len(rows)}; the file is damaged"
        )
    try:
        spans = spans_frame(pd.DataFrame(rows, columns=["id", *_SPAN_COLS]).drop(columns="id"), validate=False)
    except (ValueError, TypeError, OverflowError) as exc:  # SQLite stores any type in any column
        raise CorruptFileError(ErrorCode.DAMAGED_FILE, _wrong_type(rf.path, exc)) from None
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


def read_ranks(
    files: dict[int, Path], after_spans: dict[int, int], after_counters: dict[int, int]
) -> tuple[Table, list[tuple[int, RankFile, int]]]:
    """Every rank file read into one table, several files at a time (SQLite lets go of the GIL while it
    builds a chunk); with each file, the row its spans start at."""
    opened: list[tuple[int, RankFile, int]] = []
    try:
        total = 0
        for rank in sorted(files):  # in rank order, so the first damaged file is the one named
            with _about(files[rank]):
                rf = _open_rank(files[rank], after_spans.get(rank, 0), after_counters.get(rank, 0))
            if rf is not None:
                opened.append((rank, rf, total))
                total += rf.n_spans
        table = Table(total)
        if len(opened) <= 1 or total < _PARALLEL_SPANS:
            for _, rf, pos in opened:
                with _about(rf.path):
                    _read_rank(rf, table, pos)
        else:
            with ThreadPoolExecutor(max_workers=min(len(opened), _READ_THREADS)) as pool:
                futures = [(rf.path, pool.submit(_read_rank, rf, table, pos)) for _, rf, pos in opened]
                for path, f in futures:  # in rank order: the first damaged file raises
                    with _about(path):
                        f.result()
    finally:
        for _, rf, _ in opened:
            rf.db.close()
    return table, opened


@contextlib.contextmanager
def _about(path: Path) -> Iterator[None]:
    """A CorruptFileError raised inside is about the file at `path` (`exc.path`): its reader may leave it out."""
    try:
        yield
    except CorruptFileError as exc:
        if exc.path is None:
            exc.path = path
        raise


def merge_values(table: Table, opened: list[tuple[int, RankFile, int]]) -> dict[str, list[Any]]:
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


def spans_of(
    table: Table, values: dict[str, list[Any]], files: dict[int, Path], meta: RunMeta
) -> tuple[pd.DataFrame, list[Notice]]:
    """The table as one frame of the schema's dtypes, on the common clock, sorted like `Trace.sorted()`.
    Spans only a damaged file holds are left out, and said in the notices returned: those that end before
    they start (the recorder refuses them) and those too near the int64 limits to move onto the common clock."""
    cols: dict[str, np.ndarray] = {**table.ints, **table.codes}
    if not len(cols["rank"]):
        return spans_frame(), []
    table.ints, table.codes = {}, {}  # each column is let go once sorted
    reversed_ = cols["end_ns"] < cols["start_ns"]
    wide = unshiftable(cols["rank"], meta, cols["start_ns"], cols["end_ns"]) & ~reversed_
    said = []
    for bad, code, what in (
        (reversed_, NoticeCode.SPANS_REVERSED, "end before they start"),
        (wide, NoticeCode.SPANS_OUT_OF_RANGE, UNSHIFTABLE),
    ):
        if bad.any():
            ranks = sorted(set(cols["rank"][bad].tolist()))
            where = ", ".join(files[r].name if r in files else f"rank {r}" for r in ranks)
            said.append(Notice(code, f"{int(bad.sum())} span(s) in {where} {what} (a damaged file); left them out"))
    if reversed_.any() or wide.any():
        cols = {c: a[~(reversed_ | wide)] for c, a in cols.items()}
    for ts in (cols["start_ns"], cols["end_ns"]):
        to_common(cols["rank"], meta, ts)
    order = start_order(cols["start_ns"], cols["rank"], cols["end_ns"])
    for c in SPAN_COLUMNS:
        cols[c] = cols[c][order]  # one column at a time: the unsorted one is let go at once
    del order
    out: dict[str, Any] = {}
    for c, dtype in SPAN_COLUMNS.items():
        out[c] = text_column(cols.pop(c), values[c], dtype) if c in values else cols.pop(c)
    return pd.DataFrame(out, copy=False), said


_P2P_COLS = ["rank", "peer", "mb", "step", "chunk", "start_ns", "end_ns", "nbytes"]
_P2P_SQL = f"SELECT count(*), max(max({', '.join(_P2P_COLS)})), " + ", ".join(f"group_concat({c})" for c in _P2P_COLS)


def read_sends(path: Path, to: Sequence[int], meta: RunMeta) -> pd.DataFrame:
    """The `send` spans of one rank file to the ranks `to` (`read_p2p`), with their kind. The pairing of a link
    reads its sender's side so."""
    frame = read_p2p(path, [str(SpanKind.SEND)], to, meta)
    return frame.assign(kind=str(SpanKind.SEND)).astype({"kind": SPAN_COLUMNS["kind"]})


def read_p2p(path: Path, kinds: Sequence[str], peers: Sequence[int], meta: RunMeta) -> pd.DataFrame:
    """The spans of one rank file of one of `kinds` with a peer in `peers`, and only those rows (a filtered query,
    not a read of the whole file): columns rank, peer, mb, step, chunk, start_ns, end_ns, nbytes (not which of
    `kinds`), on the common clock, in the file's order, without the spans `spans_of` leaves out of a damaged
    file (ending before they start, unshiftable)."""
    where = f"FROM spans WHERE kind IN ({', '.join('?' * len(kinds))}) AND peer IN ({', '.join('?' * len(peers))})"
    args = [*map(str, kinds), *(int(q) for q in peers)]
    db = connect_ro(path)
    try:
        cols = _p2p_columns(query(db, path, f"{_P2P_SQL} {where}", args)[0])
        if cols is None:  # a cell that is not an integer: the rows, converted as `_read_rows` converts them
            rows = query(db, path, f"SELECT {', '.join(_P2P_COLS)} {where} ORDER BY id", args)
    finally:
        db.close()
    try:
        frame = pd.DataFrame(rows if cols is None else cols, columns=_P2P_COLS)
        frame = frame.astype({c: SPAN_COLUMNS[c] for c in _P2P_COLS})
    except (ValueError, TypeError, OverflowError) as exc:  # SQLite stores any type in any column
        raise CorruptFileError(ErrorCode.DAMAGED_FILE, _wrong_type(path, exc)) from None
    rank = frame["rank"].to_numpy(np.int64)
    start, end = (frame[c].to_numpy(np.int64, copy=True) for c in ("start_ns", "end_ns"))  # moved in place
    keep = ~((end < start) | unshiftable(rank, meta, start, end))
    if not keep.all():
        frame, rank, start, end = frame[keep], rank[keep], start[keep], end[keep]
    for c, ts in (("start_ns", start), ("end_ns", end)):
        to_common(rank, meta, ts)
        frame[c] = ts
    return frame


def _p2p_columns(row: tuple[Any, ...]) -> dict[str, np.ndarray] | None:
    """The columns of `_P2P_SQL`'s one row (each concatenated by SQLite, in the file's order, as `_read_chunks`
    reads them: no Python object per cell), checked as it checks them; None when a cell is not an integer."""
    n, top = row[:2]
    if not n:
        return {c: np.empty(0, np.int64) for c in _P2P_COLS}
    if not isinstance(top, int):
        return None
    cols = {}
    for c, cells in zip(_P2P_COLS, row[2:], strict=True):
        arr = _int_cells(cells, n, c)
        if arr is None:
            return None
        cols[c] = arr
    return cols


def _int_cells(cells: str, n: int, column: str) -> np.ndarray | None:
    """`n` integers of `column` that SQLite joined with commas, parsed in C; None when a cell is a real number,
    the count is off, or a value overflows the schema's int32."""
    if "." in cells or "e" in cells or "I" in cells:  # a real number
        return None
    arr = np.fromstring(cells, sep=",", dtype=np.int64)
    if len(arr) != n or (SPAN_COLUMNS[column] is np.int32 and (arr.min() < _INT32[0] or arr.max() > _INT32[1])):
        return None
    return arr


UNSHIFTABLE = "lie too near the int64 limits to move onto the common clock"


def unshiftable(rank: np.ndarray, meta: RunMeta, *times: np.ndarray) -> np.ndarray:
    """Rows with a time that would wrap round int64 when moved by its rank's clock offset."""
    out = np.zeros(len(rank), dtype=bool)
    low, high = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
    for info in meta.ranks:
        if info.clock.offset_ns or info.clock.drift_ppm:
            rows = np.flatnonzero(rank == info.rank)
            for ts in times:
                t = ts[rows]
                off = offsets_at(info.clock, t)
                out[rows] |= ((off > 0) & (t < low + np.maximum(off, 0))) | (
                    (off < 0) & (t > high + np.minimum(off, 0))
                )
    return out


def to_common(rank: np.ndarray, meta: RunMeta, ts: np.ndarray) -> None:
    """Move a column of times on their ranks' clocks onto the common clock, in place (leave out the
    `unshiftable` rows first)."""
    for info in meta.ranks:
        if info.clock.offset_ns or info.clock.drift_ppm:
            rows = rank == info.rank
            ts[rows] -= offsets_at(info.clock, ts[rows])


def start_order(start: np.ndarray, rank: np.ndarray, end: np.ndarray, position: np.ndarray | None = None) -> np.ndarray:
    """The order of a stable sort by (start, rank, end), as `Trace.sorted()` makes it, found faster: a plain
    sort by start, then a full sort of only the spans that share their start with another. Full ties keep
    their order in the arrays, or in `position` when given (rows gathered in another order than the one
    they had)."""
    order = np.argsort(start)
    first = start[order]
    tied = np.zeros(len(first), dtype=bool)
    np.equal(first[1:], first[:-1], out=tied[1:])
    tied[:-1] |= tied[1:].copy()
    if tied.any():
        sub = order[tied]  # groups of equal starts stay together: `first` is sorted
        pos = sub if position is None else position[sub]
        order[tied] = sub[np.lexsort((pos, end[sub], rank[sub], first[tied]))]  # ties by position: stable
    return order


@functools.cache
def _pandas_dtype(dtype: Any) -> Any:
    """What `astype(dtype)` makes here (`str` depends on the pandas version and on pyarrow)."""
    return pd.Series([], dtype=dtype).dtype


def text_column(codes: np.ndarray, values: list[Any], dtype: Any) -> Any:
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
