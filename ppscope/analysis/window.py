"""Choosing the analysed window: the whole run, the active part, the steady state, or one given in ms.

Whole run: first to last span of any stage. Active: first to last compute of any stage, leaving out start-up
(ranks waiting before anything computes) and shut-down. Steady state is found from compute spans alone: it
starts at the first instant by which every stage has begun computing (the pipeline has filled) and ends at
the instant the first stage finishes its last compute (before it drains). This module knows spans' times
and stage ids only.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ppscope.analysis.result import WindowInfo
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["active_window", "full_window", "parse_window_ms", "resolve_window", "steady_window"]


def parse_window_ms(text: str) -> tuple[float, float]:
    """`start_ms:end_ms` (ms from the trace's first span) -> (start_ms, end_ms)."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        start_ms, end_ms = float(parts[0]), float(parts[1])
    except ValueError:
        raise InvalidConfigError(
            ErrorCode.BAD_WINDOW,
            f"window {text!r} is not start_ms:end_ms (milliseconds from the trace's first span, e.g. 10:250)",
        ) from None
    if not (np.isfinite(start_ms) and np.isfinite(end_ms)) or end_ms <= start_ms or start_ms < 0:
        raise InvalidConfigError(ErrorCode.BAD_WINDOW, f"window {text!r} needs 0 <= start_ms < end_ms")
    return start_ms, end_ms


def full_window(start_ns: npt.NDArray[np.int64], end_ns: npt.NDArray[np.int64]) -> WindowInfo:
    """First to last span of any stage."""
    return WindowInfo(
        start_ns=int(start_ns.min()),
        end_ns=int(end_ns.max()),
        mode="full",
        how="whole run: from the first span of any stage to the last",
    )


def active_window(start_ns: npt.NDArray[np.int64], end_ns: npt.NDArray[np.int64]) -> WindowInfo:
    """First to last compute span of any stage (pass compute spans only)."""
    return WindowInfo(
        start_ns=int(start_ns.min()),
        end_ns=int(end_ns.max()),
        mode="active",
        how="active: from the first compute of any stage to the last (start-up and shut-down left out)",
    )


def steady_window(first_compute_ns: list[int], last_compute_ns: list[int]) -> WindowInfo | None:
    """From the latest first-compute start to the earliest last-compute end over stages; None if empty."""
    if not first_compute_ns:
        return None
    start, end = max(first_compute_ns), min(last_compute_ns)
    if end <= start:
        return None
    return WindowInfo(
        start_ns=int(start),
        end_ns=int(end),
        mode="steady",
        how="steady state: from the instant every stage has started computing to the instant the first stage "
        "finishes its last compute",
    )


def resolve_window(full: WindowInfo, window_ms: tuple[float, float] | None) -> tuple[WindowInfo, list[Notice]]:
    """An explicit ms window on the trace clock, clipped to the trace (and said so); raises when it misses the
    trace."""
    if window_ms is None:
        return full, []
    start_ns = full.start_ns + round(window_ms[0] * 1e6)
    end_ns = full.start_ns + round(window_ms[1] * 1e6)
    length_ms = full.length_ns / 1e6
    if start_ns >= full.end_ns:
        raise InvalidConfigError(
            ErrorCode.WINDOW_OUTSIDE_TRACE,
            f"window {window_ms[0]:g}:{window_ms[1]:g} ms lies outside the trace, which lasts {length_ms:.3f} ms "
            f"from its first span: pick start_ms below {length_ms:.3f}",
        )
    said = []
    if end_ns > full.end_ns:
        text = f"window end {window_ms[1]:g} ms is past the trace's end ({length_ms:.3f} ms); clipped to it"
        said.append(Notice(NoticeCode.WINDOW_CLIPPED, text))
        end_ns = full.end_ns
    return WindowInfo(
        start_ns=start_ns,
        end_ns=end_ns,
        mode="explicit",
        how=f"explicit: {window_ms[0]:g} to {(end_ns - full.start_ns) / 1e6:g} ms from the trace's first span",
    ), said
