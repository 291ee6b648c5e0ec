"""Kineto's JSON read fast: `traceEvents` streamed in batches, and times turned into exact nanoseconds.

A rank's trace can hold millions of events. The file is read in chunks of 1 MiB of text; the whole events in a
chunk are decoded by one call of a C decoder (`_Stream.batch`), so Python runs once per event only for what
the importer keeps, and memory holds one chunk of events, never the file's list. The importer's batches
(`iter_event_batches`) are decoded by msgspec into `Event`s that hold only the fields it reads: the others,
most of an event's text (`args` of a kernel has a dozen), are parsed but never built into objects. A batch
msgspec does not take (a value of another type than an event's, NaN, a lone surrogate) is decoded by the
standard library's decoder and its events made the same `Event`s, so both give the importer the same values.
Float text is kept as text (`float_hook=str`, `parse_float=str`): `ts` in epoch µs with a fraction has more
digits than a float holds exactly, and an int or a short decimal becomes ns by integer arithmetic; only other
values take a Decimal.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Callable, Iterator
from decimal import Decimal, DecimalException
from pathlib import Path
from typing import IO, Any, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from ppscope.errors import CorruptFileError, UnsupportedInputError
from ppscope.formats.detect import GZIP_MAGIC

__all__ = [
    *("NS_LIMIT", "UNSET", "Args", "Event", "group_key", "iter_event_batches", "iter_trace_events", "ns_column"),
    "to_ns",
]

_CHUNK = 1 << 20
_DECODER = json.JSONDecoder(parse_float=str)  # keep float text: `ts` in epoch µs needs exact ns
UNSET = msgspec.UNSET


class Args(msgspec.Struct, gc=False):
    """The fields of an event's `args` that the importer reads (`correlation` UNSET where the event has none)."""

    correlation: Any = UNSET
    bytes: Any = 0


class Event(msgspec.Struct, gc=False):
    """One event of `traceEvents`, its fields as the importer reads them: missing ones take the defaults, and
    values keep their JSON types (a float as its text), whatever they are; `args` is None unless an object."""

    ph: Any = None
    cat: Any = None
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = 0
    dur: Any = 0
    args: Args | None = None


_EVENTS = msgspec.json.Decoder(list[Event], float_hook=str)


def event_of(item: Any) -> Event | None:
    """A plain decoded event as an `Event` with the values msgspec gives it; None for an item that is no event."""
    if not isinstance(item, dict):
        return None
    a = item.get("args")
    args = Args(a.get("correlation", UNSET), a.get("bytes", 0)) if isinstance(a, dict) else None
    get = item.get
    return Event(get("ph"), get("cat"), get("name", ""), get("pid"), get("tid"), get("ts", 0), get("dur", 0), args)


def _events(text: str) -> list[Event]:
    """The events of an array's text: msgspec's typed decode, or the plain one's where msgspec refuses it (a
    JSONDecodeError where the text is no JSON at all)."""
    try:
        return _EVENTS.decode(text)
    except msgspec.DecodeError:
        return [e for e in map(event_of, _DECODER.decode(text)) if e is not None]


def _dicts(text: str) -> list[dict[str, Any]]:
    items = _DECODER.decode(text)
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


_T = TypeVar("_T")


def _open_text(path: Path) -> IO[str]:
    with open(path, "rb") as f:
        gz = f.read(2) == GZIP_MAGIC
    raw = gzip.open(path, "rb") if gz else open(path, "rb")  # noqa: SIM115 - closed by the wrapper
    return io.TextIOWrapper(raw, encoding="utf-8")


class _Stream:
    """A JSON text read in chunks; values are decoded with `raw_decode` as soon as they are complete."""

    def __init__(self, f: IO[str], path: Path) -> None:
        self.f, self.path = f, path
        self.buf, self.pos, self.eof = "", 0, False
        self.odd_until = -1  # the end of a run of events that `batch` could not decode: one at a time up to it

    def _more(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.f.read(_CHUNK)
        except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
            raise CorruptFileError(f"{self.path}: truncated or damaged ({exc}); copy the trace again") from None
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf[self.pos :] + chunk
        self.odd_until -= self.pos
        self.pos = 0
        return True

    def peek(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def expect(self, char: str) -> None:
        if self.peek() != char:
            found = self.peek() or "end of file"
            raise CorruptFileError(f"{self.path}: not valid JSON (expected {char!r}, found {found!r})")
        self.pos += 1

    def batch(self, decode: Callable[[str], list[_T]]) -> list[_T] | None:
        """The complete array items in the buffer, decoded in one call of `decode` (C speed, no Python per item);
        None when the buffer holds no `},` after one, or the text up to the last one is not a list of whole items.

        An item ends in `}` followed by `,`; text cut at a `},` inside a string or a nested object does not
        decode, so a decoded batch is exactly the items before that point."""
        end = self.buf.rfind("},", self.pos)
        if end < 0 and self._more():  # the buffer ends inside its first item: read on, rather than try it alone
            end = self.buf.rfind("},", self.pos)
        if end < 0 or end <= self.odd_until:
            return None
        try:
            items = decode("[" + self.buf[self.pos : end + 1] + "]")
        except json.JSONDecodeError:
            self.odd_until = end
            return None
        self.pos = end + 2
        return items

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._more():
                    continue
                raise CorruptFileError(f"{self.path}: not valid JSON or truncated ({exc.msg})") from None
            # A number may continue in the next chunk: make sure it ended before the buffer did.
            if end == len(self.buf) and not self.eof and self._more():
                continue
            self.pos = end
            return value


def iter_trace_events(path: Path, top: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield each event of `traceEvents` as decoded; other top-level keys are stored into `top` as they pass."""
    for batch in _batches(path, top, _dicts, lambda item: item if isinstance(item, dict) else None):
        yield from batch


def iter_event_batches(path: Path, top: dict[str, Any]) -> Iterator[list[Event]]:
    """Yield the events of `traceEvents` as `Event`s, a batch at a time; other top-level keys go into `top`."""
    return _batches(path, top, _events, event_of)


def _batches(
    path: Path, top: dict[str, Any], decode: Callable[[str], list[_T]], one: Callable[[Any], _T | None]
) -> Iterator[list[_T]]:
    """The items of `traceEvents` in batches, each decoded by `decode` (or, where a batch's text does not
    decode, a value at a time by `one`, None for an item that is no event)."""
    with _open_text(path) as f:
        s = _Stream(f, path)
        if s.peek() != "{":
            raise UnsupportedInputError(f"{path} is JSON but not a Kineto trace: it is not a JSON object")
        s.expect("{")
        seen = False
        while s.peek() not in ("}", ""):
            key = s.value()
            s.expect(":")
            if key == "traceEvents" and s.peek() == "[":
                seen = True
                s.expect("[")
                while s.peek() not in ("]", ""):
                    batch = s.batch(decode)
                    if batch is not None:
                        yield batch
                        continue
                    event = one(s.value())
                    if event is not None:
                        yield [event]
                    if s.peek() == ",":
                        s.pos += 1
                s.expect("]")
            else:
                top[str(key)] = s.value()
            if s.peek() == ",":
                s.pos += 1
        s.expect("}")
    if not seen:
        raise UnsupportedInputError(f"{path} is JSON but not a Kineto trace: it has no traceEvents list")


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
        raise CorruptFileError(f"{path}: {what} {value!r} µs is out of range; the trace is damaged")
    return int((us * 1000).to_integral_value())


def group_key(value: Any) -> Any:
    """A pid or tid as a value that groups: a list or object where a number belongs reads as its text."""
    return value if value is None or isinstance(value, (int, float, str)) else json.dumps(value)


def ns_column(
    values: list[Any], path: Path, what: str, names: Callable[[], list[Any]], memo: dict[str, int] | None = None
) -> npt.NDArray[np.int64]:
    """`to_ns` of each value, as one int64 array: a column of ints in range at numpy's speed, other columns a
    value at a time (float text looked up in `memo` first, where given: durations repeat). `names` gives the
    events' names, asked for only when a value is out of range, to say which."""
    if set(map(type, values)) == {int}:
        try:
            us = np.array(values, dtype=np.int64)
        except OverflowError:  # beyond int64: out of range, said below
            us = None
        if us is not None and bool((us > -_US_FAST).all() and (us < _US_FAST).all()):
            return us * 1000
    try:
        if memo is None or set(map(type, values)) != {str}:
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
