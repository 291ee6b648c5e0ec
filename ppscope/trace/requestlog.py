"""Reading a run's request log (`requests.jsonl`, one JSON object per request) from a byte offset on, so a
run still being written is read a line at a time as it grows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, ErrorCode
from ppscope.trace.model import REQUEST_COLUMNS, requests_frame

__all__ = ["read_requests_after"]

_REQUEST_BOUNDS = {c: (int(np.iinfo(t).min), int(np.iinfo(t).max)) for c, t in REQUEST_COLUMNS.items()}


def read_requests_after(req_path: Path, offset: int) -> tuple[pd.DataFrame, int]:
    """Complete lines of `requests.jsonl` after byte `offset`; a half-written last line waits for later."""
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
            raise CorruptFileError(
                ErrorCode.DAMAGED_FILE, f"{req_path}: line {lineno} after byte {offset} is not a request record"
            ) from None
        wide = [c for c, v in row.items() if not _REQUEST_BOUNDS[c][0] <= v <= _REQUEST_BOUNDS[c][1]]
        if wide:
            raise CorruptFileError(
                ErrorCode.DAMAGED_FILE, f"{req_path}: line {lineno} after byte {offset}: {wide[0]} is out of range"
            )
        rows.append(row)
    frame = requests_frame(pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))) if rows else requests_frame()
    return frame, offset + end
