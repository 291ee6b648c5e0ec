"""Frames of a schema (a mapping of column name to dtype, as `ppscope.trace.model` declares them), built with
the fewest pandas calls: every loader ends in one, so its fixed cost is paid by every command.

A column given as a numpy array of integers (or booleans), or of Python strings only, becomes the schema's
dtype in one call; anything else (lists, floats, None among text, pandas objects) goes through pandas'
`astype`, which says what cannot be converted. Both give the same frame.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, ErrorCode

__all__ = ["schema_frame"]


def schema_frame(columns: Mapping[str, Any], data: Mapping[str, Any] | pd.DataFrame | None) -> pd.DataFrame:
    """A frame with exactly the schema's columns, in its order and dtypes (other columns dropped), indexed
    0..n-1; an empty one for None. The data is copied: the frame shares no memory with the caller's arrays."""
    if data is None:  # a shallow copy of one made once (pandas copies on write): building one takes a millisecond
        empty = _EMPTY.get(id(columns))
        if empty is None:
            empty = _EMPTY[id(columns)] = pd.DataFrame({c: pd.Series([], dtype=t) for c, t in columns.items()})
        return empty.copy(deep=False)
    missing = [c for c in columns if c not in data]
    if missing:
        raise CorruptFileError(ErrorCode.MISSING_COLUMNS, f"trace data lacks the column(s) {', '.join(missing)}")
    if not isinstance(data, pd.DataFrame) and all(isinstance(data[c], np.ndarray) for c in columns):
        return pd.DataFrame({c: _column(data[c], t) for c, t in columns.items()}, copy=False)
    df = data if isinstance(data, pd.DataFrame) else pd.DataFrame(dict(data))
    out = pd.DataFrame({c: df[c].astype(t) for c, t in columns.items()})
    return out.reset_index(drop=True)


def _column(values: np.ndarray, dtype: Any) -> Any:
    """One column in the schema's dtype, a copy: at numpy's speed where `astype` would give the same."""
    if dtype is str:
        if values.dtype == object and pd.api.types.infer_dtype(values, skipna=False) == "string":
            return pd.array(values, dtype=_TEXT)
    elif values.dtype.kind in "iub":
        return values.astype(dtype)
    return pd.Series(values).astype(dtype).array


_TEXT = pd.Series([], dtype=str).dtype
"""The dtype pandas gives text (`astype(str)`)."""

_EMPTY: dict[int, pd.DataFrame] = {}
"""An empty frame of each schema (by the identity of its columns' mapping, a constant of its module)."""
