"""Kineto's JSON read fast: `traceEvents` streamed in batches of a few fields per event.

A rank's trace can hold millions of events. The file is read as bytes, up to 1 MiB at a time, inflated by a
thread of its own (`ReadAhead`: ISA-L's inflate, or zlib's, works without the interpreter's lock, so on a
second core); the whole events in what was read are decoded by one call of a C decoder (`_Stream.batch`), so
Python runs once per event only for what the importer keeps, and memory holds about one chunk of events,
never the file's list.
The importer's batches (`iter_event_batches`) are decoded by msgspec into `Event`s that hold only the fields
it reads: the others, most of an event's text (`args` of a kernel has a dozen), are parsed but never built
into objects. A batch msgspec does not take (a value of another type than an event's, NaN, a lone surrogate)
is decoded by the standard library's decoder and its events made the same `Event`s, so both give the
importer the same values.
Float text is kept as text (`float_hook=str`, `parse_float=str`), so that times become exact ns
(`times`); durations are parsed as floats in C where a float is sure to give the text's ns
(`times.float_ns`), which Kineto's 3 decimals are; a batch with another is decoded again with its text.
"""

from __future__ import annotations

import json
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar, cast

import msgspec

from ppscope.errors import CorruptFileError, ErrorCode, UnsupportedInputError
from ppscope.formats.detect import GZIP_MAGIC
from ppscope.formats.kineto.times import float_ns

try:  # ISA-L's inflate: zlib's calls and results, three to four times as fast
    from isal import isal_zlib as _zlib
except ImportError:  # a platform isal has no wheel for
    _zlib = zlib  # type: ignore[misc]
_INFLATE_ERRORS = (OSError, EOFError, zlib.error, cast(type[Exception], _zlib.error))  # isal's stub has an instance

__all__ = [
    "UNSET",
    "Args",
    "Event",
    "EventText",
    "ReadAhead",
    "group_key",
    "iter_chrome_batches",
    "iter_event_batches",
    "iter_trace_events",
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
    values keep their JSON types (a float as its text), whatever they are; `args` is None unless an object.
    `dur` is a number, a float where its ns are the text's (`float_ns`); any other value is read by `_events`
    as an `EventText`'s."""

    ph: Any = None
    cat: Any = None
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = 0
    dur: int | float = 0
    args: Args | None = None


class EventText(Event, gc=False):
    """An `Event` whose `dur` keeps its JSON type, a float as its text."""

    dur: Any = 0


_EVENTS = msgspec.json.Decoder(list[Event], float_hook=str)
_EVENTS_TEXT = msgspec.json.Decoder(list[EventText], float_hook=str)


def event_of(item: Any) -> Event | None:
    """A plain decoded event as an `Event` with the values msgspec gives it; None for an item that is no event."""
    if not isinstance(item, dict):
        return None
    a = item.get("args")
    args = Args(a.get("correlation", UNSET), a.get("bytes", 0)) if isinstance(a, dict) else None
    get = item.get
    return EventText(get("ph"), get("cat"), get("name", ""), get("pid"), get("tid"), get("ts", 0), get("dur", 0), args)


def _events(text: bytes) -> list[Event]:
    """The events of an array's text: msgspec's typed decode, durations as numbers (a float is parsed in C, not
    handed to Python as text); their text where a float does not hold their ns (`float_ns`), or where one is
    no number; the plain decoder's where msgspec refuses the text (a JSONDecodeError where it is no JSON)."""
    try:
        events = _EVENTS.decode(text)
        if float_ns([e.dur for e in events]) is not None:
            return events
    except msgspec.DecodeError:
        pass
    try:
        return cast(list[Event], _EVENTS_TEXT.decode(text))
    except msgspec.DecodeError:
        return [e for e in map(event_of, _DECODER.decode(_text(text))) if e is not None]


def _dicts(text: bytes) -> list[dict[str, Any]]:
    items = _DECODER.decode(_text(text))
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Damaged(str(exc)) from None


class _Damaged(Exception):
    """Bytes that are no UTF-8, or a file that does not read to its end: said with the file's path."""


_T = TypeVar("_T")
_READ = 1 << 18
"""The reading thread hands the file over in pieces of this many bytes (or `_CHUNK`, if smaller)."""
_AHEAD = 8
"""Pieces read ahead of the decoder, at most."""


class ReadAhead:
    """A file's bytes (gunzipped) in pieces read by a thread of its own: the inflate lets go of the interpreter's
    lock, so a gzip file is inflated on one core while its events are decoded on another. At most `_AHEAD`
    pieces wait; `close` stops the thread. `after`: the reader of the file decoded before this one, which this
    one's thread waits for before it streams its file, so that the two do not share one core while the file
    before is needed first. A small file inflated at once does not wait: it takes a few ms, at once while the
    decoder waits for the first file, where waiting would leave it to start while the decoder holds the
    interpreter's lock, each of its calls then waiting for the lock (up to 5 ms each)."""

    def __init__(self, path: Path, after: ReadAhead | None = None) -> None:
        self.path = path
        self.pieces: queue.Queue[bytes | _Damaged] = queue.Queue(_AHEAD)
        self.stop = threading.Event()
        self.done = False  # the end of the file was taken
        self.thread = threading.Thread(target=self._read, args=(min(_CHUNK, _READ), after), name="kineto-read")
        self.thread.daemon = True
        self.thread.start()

    def _read(self, size: int, after: ReadAhead | None) -> None:
        try:
            with open(self.path, "rb") as raw:
                gz = raw.read(2) == GZIP_MAGIC
                raw.seek(0)
                whole = _inflated_at_once(raw) if gz else None
                if whole is not None:
                    pieces: Iterator[bytes] = (whole[i : i + size] for i in range(0, len(whole), size))
                else:
                    if after is not None:
                        after.thread.join()
                    pieces = _inflated(raw, size) if gz else iter(lambda: raw.read(size), b"")
                for piece in pieces:
                    if not self._put(piece):
                        return
            self._put(b"")
        except _INFLATE_ERRORS as exc:
            self._put(_Damaged(str(exc)))

    def _put(self, item: bytes | _Damaged) -> bool:
        while not self.stop.is_set():
            try:
                self.pieces.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def take(self, limit: int) -> bytes:
        """The next piece, and those already waiting behind it up to `limit` bytes in all; b"" at the end."""
        got: list[bytes] = []
        size = 0
        while not self.done and (not got or (size < limit and not self.pieces.empty())):
            piece = self._get(block=not got)
            self.done = not piece
            got.append(piece)
            size += len(piece)
        return b"".join(got)

    def _get(self, block: bool) -> bytes:
        item = self.pieces.get(block)
        if isinstance(item, _Damaged):
            raise CorruptFileError(
                ErrorCode.DAMAGED_FILE, f"{self.path}: truncated or damaged ({item}); copy the trace again"
            )
        return item

    def finish(self) -> None:
        """Read on to the end of the file, so that damage past the text decoded (a gzip checksum, which follows
        its member's last byte, or bytes after it) is said whether or not the thread reached it before the
        decoder was done."""
        while self.take(_CHUNK):
            pass

    def close(self) -> None:
        """Stops the thread (it ends within 0.1 s, or after the piece it inflates), once or more."""
        self.stop.set()
        self.thread.join()


def _inflated_at_once(raw: IO[bytes]) -> bytes | None:
    """A small gzip file of one member, inflated by one call of zlib that never takes the interpreter's lock
    back: a streamed inflate takes it back for every block of output it grows into, and waits each time for
    the decoder to let go of it, so that the two take turns on two cores. None (and `raw` back at its start)
    for a larger file, or one of other members or bytes after its one, which is streamed.

    One member and nothing after it: no other member header in the file, and its last 8 bytes the checksum
    and length of what was inflated (zlib checks the member's own)."""
    data = raw.read(_AT_ONCE + 1)
    size = int.from_bytes(data[-4:], "little")
    if len(data) <= _AT_ONCE and len(data) > 18 and size <= _AT_ONCE_OUT and data.find(_MEMBER, 1) < 0:
        whole = _zlib.decompress(data, wbits=31, bufsize=max(size, 1))
        if data[-8:] == (_zlib.crc32(whole).to_bytes(4, "little") + (len(whole) & 0xFFFFFFFF).to_bytes(4, "little")):
            return whole
    raw.seek(0)
    return None


_AT_ONCE = 1 << 20
"""Gzip files up to this size are inflated at once (deflate inflates at most 1032 bytes a byte: 1 GiB at most,
whose length the member's 4 bytes of length then hold whole)."""
_AT_ONCE_OUT = 64 << 20
"""Nor more than this much JSON, held whole while it is decoded."""
_MEMBER = GZIP_MAGIC + b"\x08"
"""A gzip member's first bytes (deflate, the only method gzip defines)."""


def _inflated(raw: IO[bytes], size: int) -> Iterator[bytes]:
    """A gzip file's content in pieces of up to `size` bytes, each member after the other. zlib itself, not
    `gzip.GzipFile`: each call inflates a whole piece without the interpreter's lock, where the gzip module takes
    it back every 8 kB read."""
    pending = b""
    while True:
        unzip = _zlib.decompressobj(wbits=31)  # a gzip member: its header and its CRC and length are checked
        while not unzip.eof:
            if not pending:
                pending = raw.read(_READ)
                if not pending:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            piece = unzip.decompress(pending, size)
            pending = unzip.unconsumed_tail
            if piece:
                yield piece
        pending = unzip.unused_data.lstrip(b"\0") or raw.read(_READ).lstrip(b"\0")  # padding after a member
        if not pending:
            return


_WHITE = frozenset(b" \t\r\n")
_OPEN = ord("{")
_CUTS = 3
"""Cuts tried, each before the last, before the items up to the first are read one at a time."""
_VALUE_WINDOW = 1 << 12
"""Top-level values are decoded from a window of the buffer this large at first, four times larger each try."""


class _Stream:
    """A JSON text read in chunks of bytes; array items are decoded in batches, other values with `raw_decode`
    as soon as they are complete."""

    def __init__(self, f: ReadAhead, path: Path) -> None:
        self.f, self.path = f, path
        self.buf, self.pos, self.eof = b"", 0, False
        self.odd_until = -1  # the end of a run of events that `batch` could not decode: one at a time up to it

    def _more(self) -> bool:
        if self.eof:
            return False
        chunk = self.f.take(_CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf[self.pos :] + chunk
        self.odd_until -= self.pos
        self.pos = 0
        return True

    def peek(self) -> str:
        while True:
            buf, pos = self.buf, self.pos
            while pos < len(buf) and buf[pos] in _WHITE:
                pos += 1
            self.pos = pos
            if pos < len(buf):
                return chr(buf[pos])
            if not self._more():
                return ""

    def expect(self, char: str) -> None:
        if self.peek() != char:
            found = self.peek() or "end of file"
            raise CorruptFileError(
                ErrorCode.NOT_JSON, f"{self.path}: not valid JSON (expected {char!r}, found {found!r})"
            )
        self.pos += 1

    def batch(self, decode: Callable[[bytes], list[_T]]) -> list[_T] | None:
        """The complete array items in the buffer, decoded in one call of `decode` (C speed, no Python per item);
        None when the buffer holds no `},` after one, or the text up to the last one is not a list of whole items.

        An item ends in `}` followed by `,` and the next item's `{`; text cut at such a `},` inside a string or a
        nested object does not decode, so a decoded batch is exactly the items before that point."""
        end = self._cut(len(self.buf))
        if end < 0 and self._more():  # the buffer ends inside its first item: read on, rather than try it alone
            end = self._cut(len(self.buf))
        failed = -1
        for _ in range(_CUTS):
            if end < 0 or end <= self.odd_until:
                break
            try:
                items = decode(b"[" + self.buf[self.pos : end + 1] + b"]")
            except json.JSONDecodeError:  # cut inside an item after all (a list of objects), or damage
                failed, end = max(failed, end), self._cut(end)
                continue
            except _Damaged as exc:
                raise CorruptFileError(
                    ErrorCode.DAMAGED_FILE, f"{self.path}: truncated or damaged ({exc}); copy the trace again"
                ) from None
            self.pos = end + 2
            return items
        self.odd_until = max(self.odd_until, failed)  # the items up to a cut that did not decode: one at a time
        return None

    def _cut(self, before: int) -> int:
        """Where the last whole item before `before` ends: a `},` that the next item's `{` follows (an object
        nested in an item is followed by a key, or is the last of a list, or rarely, of a list of objects); -1
        for none."""
        buf, white = self.buf, _WHITE
        end = buf.rfind(b"},", self.pos, before)
        while end >= 0:
            after = end + 2
            while after < len(buf) and buf[after] in white:
                after += 1
            if after < len(buf) and buf[after] == _OPEN:
                return end
            end = buf.rfind(b"},", self.pos, end)
        return -1

    def value(self) -> Any:
        """The JSON value at the position, decoded from a window of the buffer that grows until it holds it."""
        self.peek()
        window = _VALUE_WINDOW
        while True:
            whole = self.pos + window >= len(self.buf)
            data = self.buf[self.pos : self.pos + window]
            try:
                text = data.decode("utf-8")
                value, end = _DECODER.raw_decode(text)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                if not whole:  # the window may end inside the value, or inside a character
                    window *= 4
                    continue
                if self._more():
                    continue
                if isinstance(exc, UnicodeDecodeError):
                    raise CorruptFileError(
                        ErrorCode.DAMAGED_FILE, f"{self.path}: truncated or damaged ({exc}); copy the trace again"
                    ) from None
                raise CorruptFileError(
                    ErrorCode.NOT_JSON, f"{self.path}: not valid JSON or truncated ({exc.msg})"
                ) from None
            # A number may continue beyond the window, or in the next chunk: make sure it ended before them.
            if end == len(text) and not whole:
                window *= 4
                continue
            if end == len(text) and not self.eof and self._more():
                continue
            self.pos += end if text.isascii() else len(text[:end].encode("utf-8"))
            return value


def iter_trace_events(path: Path, top: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield each event of `traceEvents` as decoded; other top-level keys are stored into `top` as they pass."""
    for batch in _batches(path, top, _dicts, lambda item: item if isinstance(item, dict) else None):
        yield from batch


def iter_event_batches(path: Path, top: dict[str, Any], source: ReadAhead | None = None) -> Iterator[list[Event]]:
    """Yield the events of `traceEvents` as `Event`s, a batch at a time; other top-level keys go into `top`.
    `source`: the file's reader, where one was started ahead (it is closed with the batches)."""
    return _batches(path, top, _events, event_of, source)


def iter_chrome_batches(
    path: Path, top: dict[str, Any], decode: Callable[[bytes], list[_T]], one: Callable[[Any], _T | None]
) -> Iterator[list[_T]]:
    """The events of any Chrome trace JSON, `traceEvents` of an object or a bare array, in batches each decoded
    by `decode` (an item at a time by `one` where a batch's text does not decode); an object's other keys go
    into `top`."""
    return _batches(path, top, decode, one, bare=True)


def _batches(
    path: Path,
    top: dict[str, Any],
    decode: Callable[[bytes], list[_T]],
    one: Callable[[Any], _T | None],
    source: ReadAhead | None = None,
    bare: bool = False,
) -> Iterator[list[_T]]:
    """The items of `traceEvents` in batches, each decoded by `decode` (or, where a batch's text does not
    decode, a value at a time by `one`, None for an item that is no event); `bare`: a top-level array is
    the list of events itself (Chrome's other form), not refused."""
    f = source or ReadAhead(path)
    try:
        s = _Stream(f, path)
        if bare and s.peek() == "[":
            yield from _items(s, decode, one)
            f.finish()
            return
        if s.peek() != "{":
            raise UnsupportedInputError(
                ErrorCode.NOT_A_TRACE, f"{path} is JSON but not a Kineto trace: it is not a JSON object"
            )
        s.expect("{")
        seen = False
        while s.peek() not in ("}", ""):
            key = s.value()
            s.expect(":")
            if key == "traceEvents" and s.peek() == "[":
                seen = True
                yield from _items(s, decode, one)
            else:
                top[str(key)] = s.value()
            if s.peek() == ",":
                s.pos += 1
        s.expect("}")
        f.finish()
    finally:
        f.close()
    if not seen:
        raise UnsupportedInputError(
            ErrorCode.NOT_A_TRACE, f"{path} is JSON but not a Kineto trace: it has no traceEvents list"
        )


def _items(s: _Stream, decode: Callable[[bytes], list[_T]], one: Callable[[Any], _T | None]) -> Iterator[list[_T]]:
    """The items of the array at the stream's position, in batches; the stream is left after its `]`."""
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


def group_key(value: Any) -> Any:
    """A pid or tid as a value that groups: a list or object where a number belongs reads as its text."""
    return value if value is None or isinstance(value, (int, float, str)) else json.dumps(value)
