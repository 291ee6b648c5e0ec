"""Kineto's JSON read fast: `traceEvents` streamed in batches, and times turned into exact nanoseconds.

A rank's trace can hold millions of events. The file is read in chunks of 1 MiB of text; the whole events in a
chunk are decoded by one call of the C decoder (`_Stream.batch`), so Python runs once per event only for what
the importer keeps, and memory holds one chunk of events, never the file's list. Float text is kept as text
(`parse_float=str`): `ts` in epoch µs with a fraction has more digits than a float holds exactly, and an int or
a short decimal becomes ns by integer arithmetic; only other values take a Decimal.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterator
from decimal import Decimal, DecimalException
from pathlib import Path
from typing import IO, Any

from ppscope.errors import CorruptFileError, UnsupportedInputError
from ppscope.formats.detect import GZIP_MAGIC

__all__ = ["NS_LIMIT", "group_key", "iter_trace_events", "to_ns"]

_CHUNK = 1 << 20
_DECODER = json.JSONDecoder(parse_float=str)  # keep float text: `ts` in epoch µs needs exact ns


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

    def batch(self) -> list[Any] | None:
        """The complete array items in the buffer, decoded in one call (C speed, no Python per item); None when
        the buffer holds no `},` after one, or the text up to the last one is not a list of whole items.

        An item ends in `}` followed by `,`; text cut at a `},` inside a string or a nested object does not
        decode, so a decoded batch is exactly the items before that point."""
        end = self.buf.rfind("},", self.pos)
        if end < 0 or end <= self.odd_until:
            return None
        try:
            items = _DECODER.decode("[" + self.buf[self.pos : end + 1] + "]")
        except json.JSONDecodeError:
            self.odd_until = end
            return None
        self.pos = end + 2
        return items if isinstance(items, list) else None

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
    """Yield each event of `traceEvents`; other top-level keys are stored into `top` as they pass."""
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
                    batch = s.batch()
                    if batch is not None:
                        yield from (event for event in batch if isinstance(event, dict))
                        continue
                    event = s.value()
                    if isinstance(event, dict):
                        yield event
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
