"""Kineto's times in exact nanoseconds: µs as ints, float text or floats, a value or a column at a time.

`ts` in epoch µs with a fraction has more digits than a float holds, so float text is kept as text and an int
or a short decimal becomes ns by integer arithmetic; only other values take a Decimal (more than 3 decimals
round half to even). A duration parsed as a float is turned into ns by numpy where a float is sure to give
its text's ns (`float_ns`); the reader decodes a batch with any other again, keeping its text.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, DecimalException
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ppscope.errors import CorruptFileError, ErrorCode

__all__ = ["NS_LIMIT", "float_ns", "ns_column", "to_ns"]


NS_LIMIT = 1 << 62
"""Times beyond ±2^62 ns (146 years) are damage, not data; below it a base plus a time still fits int64."""
_US_LIMIT = Decimal(NS_LIMIT) / 1000


def to_ns(value: Any, path: Path, what: str, name: str | None = None) -> int:
    """µs (int, or float text kept exact) to ns; a value that is not a number reads as 0. `what` (and the
    event's `name`, when given) say which value is out of range, only built into words when one is."""
    kind = type(value)
    if kind is int and -_US_FAST < value < _US_FAST:
        return int(value) * 1000
    if kind is str and value.isascii():  # float text with up to 3 decimals: `68.0`, `1682725898236567.125`
        whole, dot, frac = value.partition(".")
        if dot and 0 < len(frac) <= 3 and frac.isdigit() and whole.isdigit() and len(whole) <= 16:
            us = int(whole)
            if us < _US_FAST:
                return us * 1000 + int(frac.ljust(3, "0"))
    return _ns_exact(value, path, what if name is None else f"event {name[:40]!r}: {what}")


_US_FAST = NS_LIMIT // 1000
"""Below this many µs a time is in range (see `_ns_exact`): an int, or a decimal of up to 3 places, needs no
Decimal to become ns exactly."""


def _ns_exact(value: Any, path: Path, what: str) -> int:
    """`_ns` for any value: exponents, more than 3 decimals (rounded half to even), signs, damage."""
    try:
        us = Decimal(value) if isinstance(value, int) else Decimal(str(value))
    except DecimalException:  # not a number
        return 0
    if not us.is_finite():
        return 0
    if us.copy_abs() >= _US_LIMIT:  # compared first: 1e999999999 must not become a billion-digit int
        raise CorruptFileError(
            ErrorCode.DAMAGED_FILE, f"{path}: {what} {value!r} µs is out of range; the trace is damaged"
        )
    return int((us * 1000).to_integral_value())


def ns_column(
    values: list[Any], path: Path, what: str, names: Callable[[], list[Any]], memo: dict[str, int] | None = None
) -> npt.NDArray[np.int64]:
    """`to_ns` of each value, as one int64 array: a column of ints in range at numpy's speed, other columns a
    value at a time (float text looked up in `memo` first, where given: durations repeat). `names` gives the
    events' names, asked for only when a value is out of range, to say which."""
    kinds = set(map(type, values))
    if kinds == {int}:
        try:
            us = np.array(values, dtype=np.int64)
        except OverflowError:  # beyond int64: out of range, said below
            us = None
        if us is not None and bool((us > -_US_FAST).all() and (us < _US_FAST).all()):
            return us * 1000
    elif kinds <= {int, float}:
        ns = float_ns(values)
        if ns is not None:
            return ns
    try:
        if memo is None or kinds != {str}:
            return np.fromiter((to_ns(v, path, what) for v in values), np.int64, len(values))
        for text in set(values).difference(memo):  # each distinct text new to this file, once
            memo[text] = to_ns(text, path, what)
        ns = np.array(list(map(memo.__getitem__, values)), np.int64)
        if len(memo) > _MEMO_SIZE:  # a file of ever new durations: start again rather than grow
            memo.clear()
        return ns
    except CorruptFileError:
        for value, name in zip(values, names(), strict=True):  # again, to name the first event out of range
            to_ns(value, path, what, name)
        raise


_MEMO_SIZE = 1 << 16
"""Distinct durations remembered per file, at most (a few MB)."""


def float_ns(values: list[Any]) -> npt.NDArray[np.int64] | None:
    """µs given as ints and floats in ns, each the ns of the decimal text it was read from, whatever digits
    the float lost; None where that is not sure. Sure below 10^12 ns for a value within 10^-3 ns of a whole
    one: a float's error there is under 2.5 * 10^-4 ns, so the text lies within half a ns of that whole ns too
    and rounds to it (`to_ns`). Values further from a whole ns (more than 3 decimals) or larger need the text."""
    try:
        ns = np.array(values, dtype=np.float64) * 1000
    except (OverflowError, TypeError, ValueError):
        return None
    whole = np.rint(ns)
    if not bool((np.abs(ns) < _FLOAT_LIMIT).all() and (np.abs(ns - whole) < _FLOAT_SLACK).all()):
        return None  # NaN fails both
    return whole.astype(np.int64)


_FLOAT_LIMIT = 1e12
"""ns below which a float's error is under 2.5 * 10^-4 ns (`float_ns`)."""
_FLOAT_SLACK = 1e-3
"""How near a whole ns a float's ns must be for its text's to round to it (`float_ns`)."""
