"""Spans kept as columns until an importer's last step: numbers as numpy arrays, text as codes into a list.

A million imported kernels share a few hundred names, lanes and kinds. Held as codes, they cost four bytes
a row and no Python string each, and the trace's text columns are made from the codes in one step
(`ppscope.trace.rankfile.text_column`), the way the run store reads its own files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ppscope.trace.model import SPAN_COLUMNS
from ppscope.trace.rankfile import start_order, text_column

__all__ = ["SpanColumns", "build_spans", "spans_frame_of"]

_TEXT = [c for c, t in SPAN_COLUMNS.items() if t is str]
_NUMBERS = [c for c, t in SPAN_COLUMNS.items() if t is not str]


@dataclass
class SpanColumns:
    """Some spans: every number column of the schema, every text column as (codes, values), and each row's
    `position`, the place it would have in the input, which breaks full ties when spans are sorted."""

    numbers: dict[str, np.ndarray]
    text: dict[str, tuple[np.ndarray, list[str]]]
    position: np.ndarray
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = len(self.position)

    @classmethod
    def of_frame(cls, df: pd.DataFrame, position: np.ndarray) -> SpanColumns:
        """A frame with every span column (a few thousand rows: ranges, marks), as columns."""
        numbers = {c: df[c].astype(SPAN_COLUMNS[c]).to_numpy() for c in _NUMBERS}
        text = {}
        for c in _TEXT:
            codes, values = pd.factorize(df[c].astype(str).to_numpy(dtype=object))
            text[c] = (codes.astype(np.int32), [str(v) for v in values])
        return cls(numbers, text, position)


def _joined_text(parts: list[SpanColumns], column: str) -> tuple[np.ndarray, list[str]]:
    """One column's codes over all parts, into one list of the values that occur."""
    codes, values, offset = [], [], 0
    for p in parts:
        c, v = p.text[column]
        codes.append(c.astype(np.int64) + offset)
        p.text[column] = (np.empty(0, dtype=np.int32), [])  # used up
        values += v
        offset += len(v)
    joined = np.concatenate(codes)
    used = np.zeros(len(values), dtype=bool)
    used[joined] = True
    keep = np.flatnonzero(used)
    remap = np.zeros(len(values), dtype=np.int32)
    remap[keep] = np.arange(len(keep), dtype=np.int32)
    return remap[joined], [values[i] for i in keep.tolist()]


def _take(parts: list[SpanColumns], column: str) -> np.ndarray:
    """One number column over all parts, let go of in the parts: memory holds it once, not twice."""
    return np.concatenate([p.numbers.pop(column) for p in parts])


def build_spans(parts: list[SpanColumns]) -> tuple[pd.DataFrame, int]:
    """The parts as one spans frame of the schema's dtypes, in `Trace.sorted()`'s order (full ties by
    position); and how many spans were left out because they end before they start. The parts are used up,
    a column at a time."""
    parts = [p for p in parts if p.size]
    if not parts:
        return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in SPAN_COLUMNS.items()}), 0
    keys = {c: _take(parts, c) for c in ("start_ns", "rank", "end_ns")}
    position = np.concatenate([p.position for p in parts])
    kept = np.flatnonzero(keys["end_ns"] >= keys["start_ns"])
    dropped = len(position) - len(kept)
    if dropped:
        start, rank, end = (keys[c][kept] for c in ("start_ns", "rank", "end_ns"))
        order = kept[start_order(start, rank, end, position[kept])]
    else:
        order = start_order(keys["start_ns"], keys["rank"], keys["end_ns"], position)
    del position, kept
    out = {}
    for c, dtype in SPAN_COLUMNS.items():
        if c in _TEXT:
            codes, values = _joined_text(parts, c)
            out[c] = text_column(codes[order], values, dtype)
        else:
            joined = keys.pop(c) if c in keys else _take(parts, c)
            out[c] = joined[order].astype(dtype, copy=False)
            del joined  # before the next column is joined
    return pd.DataFrame(out, copy=False), dropped


def spans_frame_of(spans: dict[str, Any]) -> pd.DataFrame:
    """Spans given as a dict of columns (an importer's, numbers as numpy arrays, text as lists) as a frame, text
    as Python objects: a name shared by many spans stays one object, not a string per span."""
    return pd.DataFrame({**spans, **{c: pd.Series(spans[c], dtype=object) for c in _FRAME_TEXT}})


_FRAME_TEXT = ("kind", "name", "lane")
