"""Device-timed spans: CUDA events on the compute stream, resolved to the recorder's clock after the fact.

A kernel launch returns long before the kernel runs, so host timestamps around GPU work measure the launch,
not the work; synchronising after each span to fix that would stall the host and empty the GPU's queue. So
on a GPU a span records one event on the stream where its work starts and one where it ends, and nothing
waits: `poll()` later turns every span whose end event has completed into a recorder span, its times the
events' offsets from an *anchor* event whose time on the recorder's clock is known.

The anchor is an event recorded on an idle stream between two host clock readings, so it ran between them;
its time is their midpoint, give or take half their distance (a few microseconds). The GPU's timer and the
host's clock drift apart by some parts per million, and the timer's float32 milliseconds lose precision
with distance from the anchor (62 us ten minutes on), so an anchor older than `reanchor_s` is renewed, looked
at when a span starts (so the first span after an idle gap is not placed from an anchor as old as the gap)
and at each `poll()`. Given an `anchor_stream` of its own (a stream nothing else uses, as the engine does),
the anchor is recorded there and renewed on time however busy the compute stream is; without one, on the
compute stream whenever no timed work is outstanding (renewing waits for it, which is then idle or nearly
so). Each span keeps the anchor it was timed against.

This module needs torch only through the event and stream objects it is given, so tests drive it with a
simulated device on a CPU.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ppscope.trace.recorder import Recorder

__all__ = ["Anchor", "DeviceEvent", "DeviceSpans", "Stream"]


class DeviceEvent(Protocol):
    """What DeviceSpans needs of `torch.cuda.Event(enable_timing=True)`."""

    def record(self, stream: Any = None) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end_event: Any) -> float: ...  # milliseconds from self to end_event


class Stream(Protocol):
    """What DeviceSpans needs of `torch.cuda.Stream`."""

    def synchronize(self) -> None: ...


@dataclass(frozen=True)
class Anchor:
    event: DeviceEvent
    host_ns: int
    """When the event ran, on the recorder's clock."""
    uncertainty_ns: int

    def to_host(self, event: DeviceEvent) -> int:
        return self.host_ns + round(self.event.elapsed_time(event) * 1e6)


@dataclass(frozen=True)
class _Pending:
    anchor: Anchor
    start: DeviceEvent | None
    end: DeviceEvent
    kind: str
    fields: dict[str, Any]
    since_ns: int | None = None
    """The start on the host's clock, when the span has no start event."""


class DeviceSpans:
    """Spans of work on one stream, timed on the device. Use from one thread (the rank's compute thread)."""

    def __init__(
        self,
        rec: Recorder,
        stream: Stream,
        new_event: Callable[[], DeviceEvent],
        *,
        reanchor_s: float = 2.0,
        anchor_stream: Stream | None = None,
    ) -> None:
        self.rec = rec
        self.stream = stream
        self.anchor_stream = anchor_stream
        self._new_event = new_event
        self.reanchor_ns = int(reanchor_s * 1e9)
        self._pending: collections.deque[_Pending] = collections.deque()
        self._spare: list[DeviceEvent] = []
        self.anchor = self._make_anchor()
        self.anchors = 1
        """How many anchors were taken (the first one included)."""

    def _event(self) -> DeviceEvent:
        return self._spare.pop() if self._spare else self._new_event()

    def _make_anchor(self) -> Anchor:
        stream = self.anchor_stream or self.stream
        stream.synchronize()  # idle: the anchor event runs as soon as it is recorded
        event = self._new_event()
        before = self.rec.now_ns()
        event.record(stream)
        event.synchronize()
        after = self.rec.now_ns()
        return Anchor(event, (before + after) // 2, (after - before + 1) // 2)

    @contextlib.contextmanager
    def span(self, kind: str, *, since_ns: int | None = None, **fields: Any) -> Iterator[None]:
        """Time the work the body puts on the stream as one span of `kind` (recorder fields as keywords).
        The host does not wait: the span reaches the recorder at a later `poll()` or `close()`, even if the
        recording was paused since; nothing is timed while it is paused (or off).

        `since_ns`: the span starts then, on the recorder's clock, instead of where the work starts on the
        stream: a wait the host began before it could queue the work (a receive's wait for its header)."""
        if not self.rec.enabled:
            yield
            return
        self._renew_if_old()
        start = self._event() if since_ns is None else None
        end = self._event()
        where = {k: fields[k] for k in ("stage", "mb", "chunk") if k in fields}
        with self.rec.nvtx_range(kind, **where):
            if start is not None:
                start.record(self.stream)
            yield
            end.record(self.stream)
        self._pending.append(_Pending(self.anchor, start, end, kind, fields, since_ns))

    def poll(self) -> int:
        """Hand every span whose work has finished to the recorder, in stream order; return how many."""
        done = self._resolve_finished()
        self._renew_if_old()
        return done

    def _resolve_finished(self) -> int:
        done = 0
        while self._pending and self._pending[0].end.query():
            self._resolve(self._pending.popleft())
            done += 1
        return done

    def _renew_if_old(self) -> None:
        """A new anchor when this one is older than `reanchor_s`: at once on an anchor stream of its own, else
        only when no timed work is outstanding on the compute stream (finished work is resolved first)."""
        if self.rec.now_ns() - self.anchor.host_ns <= self.reanchor_ns:
            return
        if self.anchor_stream is None:
            self._resolve_finished()
            if self._pending:
                return
        self.anchor = self._make_anchor()
        self.anchors += 1

    def close(self) -> int:
        """Wait for the stream and hand over every span still pending; return how many."""
        self.stream.synchronize()
        done = len(self._pending)
        while self._pending:
            self._resolve(self._pending.popleft())
        return done

    def _resolve(self, p: _Pending) -> None:
        end = p.anchor.to_host(p.end)
        if p.start is not None:
            start = p.anchor.to_host(p.start)
        else:  # a host start may lie a hair past an end placed from the anchor (within its uncertainty)
            start = min(end, p.since_ns if p.since_ns is not None else end)
        self.rec.record(p.kind, start, end, begun_recording=True, **p.fields)
        self._spare += [e for e in (p.start, p.end) if e is not None]  # recorded again once completed

    @property
    def pending(self) -> int:
        return len(self._pending)
