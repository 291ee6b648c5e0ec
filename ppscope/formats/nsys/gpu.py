"""The GPU work of an nsys export (kernels, memcpy, memset), read a device at a time as numpy columns.

A million kernels fetched as Python tuples cost about ten Python objects a row: more time than the rest of
the import together, and most of its memory. Instead SQLite joins each column of one device's rows into one
string (`group_concat`, in C) and numpy parses it, so the Python objects alive at once are one device's few
strings, however many devices the export has. A kernel's name stays an integer code into the export's
string table until the trace's frame is built. SQLite stores any type in any column: a device whose cells are
not all integers (a damaged file) is fetched row by row instead, the slow way that says what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ppscope.formats.nsys.tables import KERNEL, NsysDb, int_columns, pid_of, row_columns
from ppscope.trace.model import SpanKind

__all__ = ["GPU_KINDS", "TABLE_BITS", "GpuWork", "gpu_work"]

MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
GPU_KINDS = [str(SpanKind.KERNEL), str(SpanKind.NCCL), str(SpanKind.MEMCPY), str(SpanKind.MEMSET)]
"""A GPU row's `kid` indexes this list."""
_COPY_KINDS = {1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP"}
_EXTRA_NAMES = [*(f"Memcpy {k}" for k in _COPY_KINDS.values()), "Memcpy", "Memset", ""]
"""Names that are not in StringIds, after it in the name table: copies by kind, memsets, and no name."""
TABLE_BITS = 48
"""A row's `pos` is its table's number << 48 | its rowid: the order the rows had when read table by table."""


@dataclass
class GpuWork:
    """GPU rows as one frame of integer columns: start, end, dev, stream, pid, corr, nbytes, `nid` (an index
    into `names`), `kid` (an index into `GPU_KINDS`) and `pos` (the row's place in the tables)."""

    rows: pd.DataFrame
    names: list[str]


def _tables(db: NsysDb) -> list[tuple[int, str]]:
    return [(i, t) for i, t in enumerate((KERNEL, MEMCPY, MEMSET)) if db.has(t)]


def _devices(db: NsysDb) -> list[Any]:
    """Every device id of the GPU rows, in order; a damaged cell's value among them as it is."""
    found: set[Any] = set()
    for _, table in _tables(db):
        dev = db.expr(table, "deviceId", "-1")
        found |= {r[0] for r in db.query(f"SELECT DISTINCT {dev} FROM {table}")}
    return sorted(found, key=lambda d: (not isinstance(d, int), d if isinstance(d, int) else 0, repr(d)))


def _columns(db: NsysDb, number: int, table: str) -> dict[str, str]:
    common = {
        "start": db.expr(table, "start", "0"),
        "end": db.expr(table, "end", "0"),
        "dev": db.expr(table, "deviceId", "-1"),
        "stream": db.expr(table, "streamId", "-1"),
        "gpid": db.expr(table, "globalPid", "0"),
        "corr": db.expr(table, "correlationId", "-1"),
        "pos": f"({number} << {TABLE_BITS}) | rowid" if table not in db.views else f"{number} << {TABLE_BITS}",
    }
    if table == KERNEL:
        name_col = "shortName" if "shortName" in db.columns[KERNEL] else "demangledName"
        return {**common, "nid": db.expr(table, name_col, "-1")}
    op = db.expr(table, "copyKind", "-1") if table == MEMCPY else "-1"
    return {**common, "nbytes": db.expr(table, "bytes", "0"), "op": op}


def _device_rows(db: NsysDb, device: Any, n_strings: int) -> list[dict[str, np.ndarray]]:
    """One device's rows of each GPU table. `nid` is a StringIds id, or -1 - an index into `_EXTRA_NAMES`."""
    parts = []
    for number, table in _tables(db):
        columns = _columns(db, number, table)
        where, args = f"WHERE {columns['dev']} = ?", (device,)
        cols = int_columns(db, table, columns, where, args)
        cols = cols if cols is not None else row_columns(db, table, columns, where, args)
        if not len(cols["start"]):
            continue
        if table == KERNEL:
            ids = cols["nid"]
            cols["nid"] = np.where((ids >= 0) & (ids < n_strings), ids, -len(_EXTRA_NAMES))  # no name: ""
            cols["nbytes"] = np.zeros(len(ids), dtype=np.int64)
        else:
            cols["nid"] = -1 - _copy_names(cols.pop("op"), memcpy=number == 1)
        cols["kid"] = np.full(len(cols["nid"]), (0, 2, 3)[number])
        parts.append(cols)
    return parts


def _copy_names(op: np.ndarray, memcpy: bool) -> np.ndarray:
    """Each copy's or memset's name, as an index into `_EXTRA_NAMES`: a copy by its kind when it is known."""
    if not memcpy:
        return np.full(len(op), _EXTRA_NAMES.index("Memset"), dtype=np.int64)
    by_kind = np.full(max(_COPY_KINDS) + 1, _EXTRA_NAMES.index("Memcpy"), dtype=np.int64)
    by_kind[list(_COPY_KINDS)] = np.arange(len(_COPY_KINDS))
    known = (op >= 0) & (op < len(by_kind))
    return np.where(known, by_kind[np.where(known, op, 0)], _EXTRA_NAMES.index("Memcpy"))


def _names(rows: dict[str, np.ndarray], strings: np.ndarray) -> list[str]:
    """Turn `nid` into an index into the returned names (only those used: StringIds can hold millions) and
    tell NCCL kernels from the others, once per distinct name."""
    nid = rows["nid"]
    named = nid >= 0
    used = np.zeros(len(strings), dtype=bool)
    used[nid[named]] = True
    ids = np.flatnonzero(used)
    remap = np.zeros(len(strings), dtype=np.int64)
    remap[ids] = np.arange(len(ids))
    names = [str(v) for v in strings[ids]]
    nccl = np.array([v.startswith(("nccl", "void nccl")) for v in names], dtype=bool)
    compact = np.where(named, remap[np.where(named, nid, 0)], len(ids) - 1 - nid)
    rows["kid"] = np.where(named & nccl[np.where(named, compact, 0)] if len(ids) else False, 1, rows["kid"])
    rows["nid"] = compact
    return [*names, *_EXTRA_NAMES]


def gpu_work(db: NsysDb, strings: np.ndarray) -> GpuWork:
    """Kernels, memcpy and memset rows of every device, read one device at a time (see the module's note)."""
    parts: list[dict[str, np.ndarray]] = []
    for device in _devices(db):
        parts += _device_rows(db, device, len(strings))
    order = ["start", "end", "dev", "stream", "gpid", "corr", "nbytes", "nid", "kid", "pos"]
    if not parts:
        return GpuWork(pd.DataFrame({c: np.empty(0, dtype=np.int64) for c in [*order, "pid"]}), list(_EXTRA_NAMES))
    joined = {c: np.concatenate([p[c] for p in parts]).astype(np.int64, copy=False) for c in order}
    parts.clear()
    names = _names(joined, strings)
    joined["pid"] = pid_of(joined["gpid"])
    return GpuWork(pd.DataFrame(joined, copy=False), names)
