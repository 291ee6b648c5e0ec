"""A run's counters (the GPU and CPU samples the engine takes): put on the common clock, or one rank's read alone.

A rank samples a few counters a second, so its counters are small next to its spans (a 10-minute run of the
engine: a few thousand rows a rank); the dashboard's GPU usage page of a large run reads them a rank file at a
time (`read_rank_counters`) without the spans, and gets the rows a whole load (`store.read_since`) gives for
that rank: both pass them through `common_counters`. A reader never writes to the file it reads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, ErrorCode
from ppscope.trace.model import COUNTER_COLUMNS, RunMeta, counters_frame
from ppscope.trace.notices import Notice, NoticeCode
from ppscope.trace.rankfile import UNSHIFTABLE, connect_ro, query, to_common, unshiftable

__all__ = ["common_counters", "read_rank_counters"]

_COLS = list(COUNTER_COLUMNS)


def common_counters(counters: pd.DataFrame, meta: RunMeta) -> tuple[pd.DataFrame, list[Notice]]:
    """Counters as read from rank files, moved onto the common clock and sorted as `Trace.sorted()` sorts them;
    samples whose time cannot be moved (a damaged file) are left out, and counted in the notices returned."""
    said = []
    wide = unshiftable(counters["rank"].to_numpy(), meta, counters["ts_ns"].to_numpy())
    if wide.any():
        text = f"{int(wide.sum())} counter sample(s) {UNSHIFTABLE} (a damaged file); left them out"
        said.append(Notice(NoticeCode.COUNTERS_OUT_OF_RANGE, text))
        counters = counters[~wide].reset_index(drop=True)
    if any(info.clock.offset_ns or info.clock.drift_ppm for info in meta.ranks):
        ts = counters["ts_ns"].to_numpy(np.int64, copy=True)
        to_common(counters["rank"].to_numpy(), meta, ts)
        counters["ts_ns"] = ts
    return counters.sort_values(["ts_ns", "rank"], kind="stable").reset_index(drop=True), said


def read_rank_counters(path: Path, meta: RunMeta) -> pd.DataFrame:
    """The counters of one rank file alone (its spans are not read), on the common clock: the rows of that rank
    that `load_run` would give (the samples it leaves out are said by `load_run`, not here). A file created
    with nothing committed yet has none; a damaged one raises CorruptFileError naming it."""
    db = connect_ro(path)
    try:
        tables = {r[0] for r in query(db, path, "SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return counters_frame()
        if "counters" not in tables:
            raise CorruptFileError(
                ErrorCode.NOT_A_RANK_FILE, f"{path} is an SQLite file but not a ppscope rank file (no counters table)"
            )
        rows = query(db, path, f"SELECT {', '.join(_COLS)} FROM counters ORDER BY id")
    finally:
        db.close()
    if not rows:
        return counters_frame()
    try:
        frame = counters_frame(pd.DataFrame(rows, columns=_COLS))
    except (ValueError, TypeError, OverflowError) as exc:  # SQLite stores any type in any column
        why = f"a counter holds a value of the wrong type ({exc})"
        raise CorruptFileError(ErrorCode.DAMAGED_FILE, f"{path}: {why}; the file is damaged") from None
    return common_counters(frame, meta)[0]
