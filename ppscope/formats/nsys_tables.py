"""Read the tables of an `nsys export --type sqlite` file: discovered columns, integers straight to numpy.

This is the reading half of the nsys importer: it knows the tables, columns and GlobalId bit layout of
the format and returns plain frames; it does not decide ranks, stages or kinds of NVTX ranges. Files are
opened read-only (immutable): reading never writes next to the input.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, brief
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
    "gpu_work",
    "nvtx_rows",
    "parse_ppscope_message",
    "pid_of",
    "ppscope_fields",
    "read_strings",
    "runtime_rows",
    "with_defaults",
]

PPSCOPE_DOMAIN = "ppscope"
NVTX_RANGE_TYPES = (59, 60, 70, 71)
NVTX_MARK, NVTX_DOMAIN = 34, 75
KERNEL, RUNTIME, NVTX = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"
_MEMCPY, _MEMSET = "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
_MESSAGE_RE = re.compile(r"^s(-?\d+) ([a-z_]+)(?: mb(-?\d+))?(?: c(\d+))?$")
_KINDS = frozenset(str(k) for k in SpanKind)
_COPY_KINDS = {1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP"}


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
        rows = self.query("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
        self.columns: dict[str, set[str]] = {}
        for (name,) in rows:
            cols = self.query(f"PRAGMA table_info('{name}')")
            self.columns[name] = {c[1] for c in cols}

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return self.db.execute(sql, args).fetchall()
        except (sqlite3.Error, UnicodeDecodeError) as exc:  # text cells that are not UTF-8 fail as they are fetched
            raise CorruptFileError(f"{self.path}: unreadable nsys export ({brief(exc)})") from None

    def has(self, table: str) -> bool:
        return table in self.columns

    def col(self, table: str, column: str, alias: str | None = None, default: str = "NULL") -> str:
        """`column` (NULLs as `default`) when the table has it, else `default`: releases differ in columns.

        Integer columns get an integer default so pandas never turns them into floats (globalTid needs 64
        bits)."""
        expr = f'coalesce("{column}", {default})' if column in self.columns.get(table, ()) else default
        return f"{expr} AS {alias or column}"

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
            f"{db.path}: StringIds ids reach {int(ids.max())} for {len(rows)} strings; the file is damaged"
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
            f"{db.path}: {table}.{bad[0]} holds non-integer values where nsys writes integers; the file is damaged"
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


_GPU_COLUMNS = ["start", "end", "dev", "stream", "gpid", "corr", "nbytes", "op"]


def _int_rows(db: NsysDb, table: str, columns: list[tuple[str, str, str]]) -> np.ndarray:
    """Integer columns `(column, alias, default)` of `table` as one (rows, columns) int64 array.

    Every column is coalesced to an integer in SQL, so the rows convert to numpy in one step: this is
    the hot path of a million-kernel import."""
    sel = ", ".join(db.col(table, c, alias, default) for c, alias, default in columns)
    rows = db.query(f"SELECT {sel} FROM {table}")
    if not rows:
        return np.empty((0, len(columns)), dtype=np.int64)
    try:
        return np.array(rows, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise CorruptFileError(f"{db.path}: {table} holds non-integer values where nsys writes integers") from None


def gpu_work(db: NsysDb, strings: np.ndarray) -> pd.DataFrame:
    """Kernels, memcpy and memset rows: pid, device, stream, kind, name, start, end, nbytes, corr."""
    parts = []
    common = [
        ("start", "start", "0"),
        ("end", "end", "0"),
        ("deviceId", "dev", "-1"),
        ("streamId", "stream", "-1"),
        ("globalPid", "gpid", "0"),
        ("correlationId", "corr", "-1"),
    ]
    if db.has(KERNEL):
        name_col = "shortName" if "shortName" in db.columns[KERNEL] else "demangledName"
        arr = _int_rows(db, KERNEL, [*common, (name_col, "nid", "-1")])
        df = pd.DataFrame(arr[:, :6], columns=_GPU_COLUMNS[:6])
        ids = arr[:, 6]
        df["name"] = _lookup(strings, ids)
        # NCCL or not is decided once per distinct name, not once per row.
        is_nccl = np.array([str(v).startswith(("nccl", "void nccl")) for v in strings], dtype=bool)
        ok = (ids >= 0) & (ids < len(strings))
        nccl = np.zeros(len(ids), dtype=bool)
        nccl[ok] = is_nccl[ids[ok]]
        df["kind"] = np.where(nccl, str(SpanKind.NCCL), str(SpanKind.KERNEL))
        df["nbytes"] = 0
        parts.append(df)
    for table, kind in ((_MEMCPY, SpanKind.MEMCPY), (_MEMSET, SpanKind.MEMSET)):
        if not db.has(table):
            continue
        op = ("copyKind", "op", "-1") if table == _MEMCPY else ("nonexistent", "op", "-1")
        arr = _int_rows(db, table, [*common, ("bytes", "nbytes", "0"), op])
        df = pd.DataFrame(arr[:, :7], columns=_GPU_COLUMNS[:7])
        if kind == SpanKind.MEMCPY:
            df["name"] = ["Memcpy " + _COPY_KINDS[o] if o in _COPY_KINDS else "Memcpy" for o in arr[:, 7].tolist()]
        else:
            df["name"] = "Memset"
        df["kind"] = str(kind)
        parts.append(df)
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame({c: pd.Series([], dtype=np.int64) for c in [*_GPU_COLUMNS[:7], "pid"]}).assign(
            name="", kind=""
        )
    gpu = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    gpu["pid"] = pid_of(gpu["gpid"].to_numpy())
    return gpu


def runtime_rows(db: NsysDb) -> pd.DataFrame:
    if not db.has(RUNTIME):
        return pd.DataFrame(columns=["rstart", "pid", "tid", "corr"])
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
