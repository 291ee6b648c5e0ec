"""Read the tables of an `nsys export --type sqlite` file: discovered columns, integers straight to numpy.

This is the reading half of the nsys importer: it knows the tables, columns and GlobalId bit layout of
the format and returns plain frames; it does not decide ranks, stages or kinds of NVTX ranges. Files are
opened read-only (immutable): reading never writes next to the input.
"""

from __future__ import annotations

import json
import re
import sqlite3
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, ErrorCode, brief
from ppscope.formats.detect import open_sqlite_ro
from ppscope.trace.model import SPAN_COLUMNS, SpanKind, lane_of

__all__ = [
    "KERNEL",
    "NVTX",
    "NVTX_MARK",
    "NVTX_RANGE_TYPES",
    "PPSCOPE_DOMAIN",
    "RUNTIME",
    "NsysDb",
    "int_columns",
    "nvtx_rows",
    "parse_ppscope_message",
    "pid_of",
    "ppscope_fields",
    "read_strings",
    "row_columns",
    "runtime_rows",
    "with_defaults",
]

PPSCOPE_DOMAIN = "ppscope"
NVTX_RANGE_TYPES = (59, 60, 70, 71)
NVTX_MARK, NVTX_DOMAIN = 34, 75
KERNEL, RUNTIME, NVTX = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"
_MESSAGE_RE = re.compile(r"^s(-?\d+) ([a-z_]+)(?: mb(-?\d+))?(?: c(\d+))?$")
_KINDS = frozenset(str(k) for k in SpanKind)


def pid_of(global_id: Any) -> Any:
    """The OS pid inside an nsys globalTid/globalPid: bits 24..47."""
    return (global_id >> 24) & 0xFFFFFF


def parse_ppscope_message(text: str) -> tuple[int, str, int, int] | None:
    """(stage, kind, mb, chunk) from a recorder message like `s2 forward mb5 c1`, None if not one."""
    m = _MESSAGE_RE.match(text)
    if not m or m.group(2) not in _KINDS:
        return None
    return int(m.group(1)), m.group(2), int(m.group(3) or -1), int(m.group(4) or 0)


class NsysDb:
    """A read-only nsys file with its discovered tables and columns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = open_sqlite_ro(path)
        rows = self.query("SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')")
        self.columns: dict[str, set[str]] = {}
        self.views = {str(name) for name, kind in rows if kind == "view"}
        """Views have no rowid: their rows have no position to keep."""
        for name, _ in rows:
            cols = self.query(f"PRAGMA table_info('{name}')")
            self.columns[name] = {c[1] for c in cols}

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self.db.execute(sql, args).fetchall()
        except (sqlite3.Error, UnicodeDecodeError) as exc:  # text cells that are not UTF-8 fail as they are fetched
            raise CorruptFileError(
                ErrorCode.DAMAGED_FILE, f"{self.path}: unreadable nsys export ({brief(exc)})"
            ) from None

    def has(self, table: str) -> bool:
        return table in self.columns

    def col(self, table: str, column: str, alias: str | None = None, default: str = "NULL") -> str:
        """`column` (NULLs as `default`) when the table has it, else `default`: releases differ in columns.

        Integer columns get an integer default so pandas never turns them into floats (globalTid needs 64
        bits)."""
        return f"{self.expr(table, column, default)} AS {alias or column}"

    def expr(self, table: str, column: str, default: str = "NULL") -> str:
        """The SQL value of `col`, without its name."""
        return f'coalesce("{column}", {default})' if column in self.columns.get(table, ()) else default

    def count(self, table: str) -> int:
        return int(self.query(f"SELECT count(*) FROM {table}")[0][0]) if self.has(table) else 0


def read_strings(db: NsysDb) -> np.ndarray:
    """StringIds as an object array indexed by id (ids are small and dense in nsys exports)."""
    rows = db.query("SELECT id, value FROM StringIds WHERE typeof(id) = 'integer' AND id >= 0")
    if not rows:
        return np.array([""], dtype=object)
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    if int(ids.max()) > max(1 << 24, 64 * len(rows)):  # a window cut from a bigger export leaves gaps, not this
        raise CorruptFileError(
            ErrorCode.DAMAGED_FILE,
            f"{db.path}: StringIds ids reach {int(ids.max())} for {len(rows)} strings; the file is damaged",
        )
    out = np.full(int(ids.max()) + 1, "", dtype=object)
    out[ids] = [_text(r[1]) for r in rows]
    return out


def _text(value: Any) -> str:
    """A text cell as str: SQLite stores any type in any column, and a damaged file may hold blobs."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _lookup(strings: np.ndarray, ids: np.ndarray) -> np.ndarray:
    ok = (ids >= 0) & (ids < len(strings))
    out = np.full(len(ids), "", dtype=object)
    out[ok] = strings[ids[ok]]
    return out


def _frame(rows: list[tuple[Any, ...]], columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame.from_records(rows, columns=columns) if rows else pd.DataFrame(columns=columns)


def _check_ints(db: NsysDb, table: str, df: pd.DataFrame, columns: list[str]) -> None:
    """Columns nsys writes as integers (NULLs already coalesced in SQL) must have come back as integers: pandas
    gives a column of Python ints an integer dtype, so one look at the dtype finds text, blobs or reals."""
    if not len(df):
        return
    bad = [c for c in columns if df[c].dtype.kind not in "iu"]
    if bad:
        raise CorruptFileError(
            ErrorCode.DAMAGED_FILE,
            f"{db.path}: {table}.{bad[0]} holds non-integer values where nsys writes integers; the file is damaged",
        )


def nvtx_rows(db: NsysDb, strings: np.ndarray) -> pd.DataFrame:
    cols = ["start", "end", "eventType", "globalTid", "domainId", "text", "textId", "jsonText", "category"]
    if not db.has(NVTX):
        return pd.DataFrame(columns=[*cols, "pid", "tid", "name", "ppscope"])
    types = (*NVTX_RANGE_TYPES, NVTX_MARK, NVTX_DOMAIN)
    ints = {"start": "0", "end": '"start"', "eventType": "0", "globalTid": "0", "domainId": "0", "textId": "-1"}
    select = ", ".join(db.col(NVTX, c, default=ints.get(c, "NULL")) for c in cols)
    rows = db.query(f"SELECT {select} FROM {NVTX} WHERE eventType IN ({', '.join(map(str, types))})")
    df = _frame(rows, cols)
    _check_ints(db, NVTX, df, list(ints))
    gtid = df["globalTid"].to_numpy(dtype=np.int64)
    df["pid"], df["tid"] = pid_of(gtid), gtid & 0xFFFFFF
    text_ids = df["textId"].to_numpy(dtype=np.int64)
    names = df["text"].to_numpy(dtype=object).copy()
    missing = pd.isna(names)
    odd = ~missing & ~df["text"].map(lambda v: isinstance(v, str)).to_numpy(dtype=bool)
    names[odd] = [_text(v) for v in names[odd]]
    names[missing] = _lookup(strings, text_ids[missing])
    df["name"] = names
    domains = df[df["eventType"] == NVTX_DOMAIN]
    ppscope_domains = {(int(r.pid), int(r.domainId)) for r in domains.itertuples() if r.name == PPSCOPE_DOMAIN}
    df = df[df["eventType"] != NVTX_DOMAIN].reset_index(drop=True)
    keys = zip(df["pid"].tolist(), df["domainId"].tolist(), strict=True)
    df["ppscope"] = np.fromiter(((k in ppscope_domains) for k in keys), dtype=bool, count=len(df))
    return df


def int_columns(
    db: NsysDb, table: str, columns: dict[str, str], where: str = "", args: tuple[Any, ...] = ()
) -> dict[str, np.ndarray] | None:
    """The integer columns `{alias: SQL value}` of `table`'s rows that match `where`, in table order, each
    parsed by numpy from one `group_concat` string; None when a cell is no integer, to fetch them row by row.

    SQLite sorts text and blobs above every number, so one max() over the row's cells is an integer only when
    none holds text; a real shows as `1.5`, `1e+20` or `Inf` in the joined text."""
    exprs = list(columns.values())
    top = f"max({', '.join(exprs)})" if len(exprs) > 1 else exprs[0]
    joined = ", ".join(f"group_concat({e})" for e in exprs)
    row = db.query(f"SELECT count(*), max({top}), {joined} FROM {table} {where}", args)[0]
    n, high, cells = row[0], row[1], row[2:]
    if not n:
        return {alias: np.empty(0, dtype=np.int64) for alias in columns}
    if not isinstance(high, int):
        return None
    out = {}
    for alias, text in zip(columns, cells, strict=True):
        if not isinstance(text, str) or "." in text or "e" in text or "I" in text:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)  # numpy says "unmatched data" this way
            try:
                values = np.fromstring(text, sep=",", dtype=np.int64)
            except (ValueError, DeprecationWarning):
                return None
        if len(values) != n:
            return None
        out[alias] = values
    return out


def row_columns(
    db: NsysDb, table: str, columns: dict[str, str], where: str, args: tuple[Any, ...]
) -> dict[str, np.ndarray]:
    """`int_columns` the slow way, for cells that are not all integers: numpy converts what it can."""
    sel = ", ".join(f"{e} AS c{i}" for i, e in enumerate(columns.values()))
    rows = db.query(f"SELECT {sel} FROM {table} {where}", args)
    try:
        arr = np.array(rows, dtype=np.int64).reshape(len(rows), len(columns))
    except (TypeError, ValueError, OverflowError):
        raise CorruptFileError(
            ErrorCode.DAMAGED_FILE, f"{db.path}: {table} holds non-integer values where nsys writes integers"
        ) from None
    return {alias: arr[:, i] for i, alias in enumerate(columns)}


def runtime_rows(db: NsysDb) -> pd.DataFrame:
    """CUDA API calls that launched work: (rstart, pid, tid, corr), columnar when every cell is an integer."""
    if not db.has(RUNTIME):
        return pd.DataFrame(columns=["rstart", "pid", "tid", "corr"])
    columns = {
        "rstart": db.expr(RUNTIME, "start", "0"),
        "gtid": db.expr(RUNTIME, "globalTid", "0"),
        "corr": db.expr(RUNTIME, "correlationId", "-1"),
    }
    fast = int_columns(db, RUNTIME, columns, "WHERE correlationId IS NOT NULL")
    if fast is not None:
        gtid = fast.pop("gtid")
        return pd.DataFrame({**fast, "pid": pid_of(gtid), "tid": gtid & 0xFFFFFF})[["rstart", "corr", "pid", "tid"]]
    sel = ", ".join(
        [
            db.col(RUNTIME, "start", default="0"),
            db.col(RUNTIME, "globalTid", default="0"),
            db.col(RUNTIME, "correlationId", default="-1"),
        ]
    )
    df = _frame(db.query(f"SELECT {sel} FROM {RUNTIME} WHERE correlationId IS NOT NULL"), ["rstart", "gtid", "corr"])
    _check_ints(db, RUNTIME, df, ["rstart", "corr"])
    gtid = pd.to_numeric(df["gtid"], errors="coerce").fillna(0).astype(np.int64).to_numpy()
    df["pid"], df["tid"] = pid_of(gtid), gtid & 0xFFFFFF
    df["corr"] = df["corr"].astype(np.int64)
    df["rstart"] = df["rstart"].astype(np.int64)
    return df.drop(columns="gtid")


def ppscope_fields(rows: pd.DataFrame) -> pd.DataFrame:
    """Span fields of ppscope-domain NVTX rows: the message, then the JSON payload when present."""
    out = []
    for r in rows.itertuples(index=False):
        parsed = parse_ppscope_message(str(r.name))
        stage, kind, mb, chunk = parsed if parsed else (-1, str(SpanKind.RANGE), -1, 0)
        span: dict[str, Any] = {"stage": stage, "kind": kind, "mb": mb, "chunk": chunk, "name": str(r.name)}
        if isinstance(r.jsonText, str) and r.jsonText:
            try:
                extra = json.loads(r.jsonText)
            except json.JSONDecodeError:
                extra = {}
            if isinstance(extra, dict):
                span.update({k: v for k, v in extra.items() if k in SPAN_COLUMNS and _fits(k, v)})
        span.setdefault("lane", lane_of(span["kind"]))
        start = int(r.start)
        end = start if r.eventType == NVTX_MARK or pd.isna(r.end) else int(r.end)
        span.update(pid=int(r.pid), tid=int(r.tid), start_ns=start, end_ns=end)
        out.append(span)
    return pd.DataFrame(out)


def _fits(column: str, value: Any) -> bool:
    """A payload value of the schema's type for `column` (a damaged payload's other values are ignored)."""
    if SPAN_COLUMNS[column] is str:
        return isinstance(value, str)
    info = np.iinfo(SPAN_COLUMNS[column])
    return isinstance(value, int) and not isinstance(value, bool) and info.min <= value <= info.max


_DEFAULTS: dict[str, Any] = {
    "stage": -1,
    "mb": -1,
    "step": -1,
    "chunk": 0,
    "phase": "",
    "nbytes": 0,
    "tokens": 0,
    "peer": -1,
    "lane": "",
    "name": "",
}


def with_defaults(df: pd.DataFrame) -> pd.DataFrame:
    """Fill span fields a source does not know with the schema's "none" values, in place."""
    for c, v in _DEFAULTS.items():
        if c not in df.columns:
            df[c] = v
        else:
            df[c] = df[c].fillna(v) if isinstance(v, str) else pd.to_numeric(df[c], errors="coerce").fillna(v)
    return df
