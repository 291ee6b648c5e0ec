"""The recorder: one NVTX range and one timed span per step of the pipeline, cheap enough to record every step.

`Recorder.span()` is a context manager and a decorator. Entering pushes an NVTX range (domain `ppscope`,
one cached attribute object per kind/stage/micro-batch, colour and category per kind, payload = micro-batch)
and reads the clock; leaving pops the range and appends a tuple to a lock-free deque. A background thread
drains the deque into the rank's SQLite file in batches, so the hot path never touches I/O and never
synchronises a device. GPU timing (CUDA events resolved after the fact) is the engine's job: it hands the
resolved times to `Recorder.record()`. What a span costs, `make bench` measures (benchmarks/RESULTS.md,
"recorder").
"""

from __future__ import annotations

import collections
import functools
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ppscope.errors import ErrorCode, InvalidSpanError
from ppscope.trace.model import SPAN_COLUMNS, SpanKind, lane_of

if TYPE_CHECKING:
    import pandas as pd

    from ppscope.trace.store import RankWriter

__all__ = ["KIND_COLORS", "Recorder"]

F = TypeVar("F", bound=Callable[..., Any])

# ARGB colours per kind, as Nsight Systems shows them (and the dashboard reuses them).
KIND_COLORS: dict[str, int] = {
    SpanKind.FORWARD: 0xFF4C78A8,
    SpanKind.LAYER: 0xFF6F9AC8,
    SpanKind.BACKWARD: 0xFF9ECAE9,
    SpanKind.EMBED: 0xFF72B7B2,
    SpanKind.HEAD: 0xFFF58518,
    SpanKind.SAMPLE: 0xFFE45756,
    SpanKind.SEND: 0xFF54A24B,
    SpanKind.RECV: 0xFFB279A2,
    SpanKind.RECV_WAIT: 0xFFBAB0AC,
    SpanKind.STEP: 0xFF9D755D,
    SpanKind.HOST: 0xFFFF9DA6,
    SpanKind.MARK: 0xFF000000,
}
_KINDS = frozenset(str(k) for k in SpanKind)
_LANES = {str(k): lane_of(k) for k in SpanKind}
_COMPUTE = lane_of(SpanKind.FORWARD)
_FLUSH_BATCH = 8192
_MISSING = object()


class _Span:
    """One open span. `nbytes`, `tokens` and `peer` may be set inside the `with` block (`span.nbytes = n`)."""

    __slots__ = ("_attr", "_head", "_nvtx", "_rec", "nbytes", "peer", "start_ns", "tokens")

    def __init__(self, rec: Recorder, head: tuple[Any, ...], attr: Any, nbytes: int, tokens: int, peer: int) -> None:
        self._rec = rec
        self._head = head  # (rank, stage, lane, kind, name, mb, step, chunk, phase): the row up to start_ns
        self._attr = attr  # cached NVTX event attributes (None from a domain no tool listens to)
        self._nvtx = rec.nvtx
        self.nbytes = nbytes
        self.tokens = tokens
        self.peer = peer
        self.start_ns = 0

    def __enter__(self) -> _Span:
        if self._nvtx:
            self._rec._push(self._attr)
        self.start_ns = self._rec._clock()
        return self

    def __exit__(self, *exc: object) -> None:
        rec = self._rec
        end_ns = rec._clock()
        if self._nvtx:
            rec._pop()
        # Flattened into a schema row by the flush thread, off the hot path.
        rec._append((self._head, self.start_ns, end_ns, self.nbytes, self.tokens, self.peer))
        next(rec._recorded)

    def __call__(self, fn: F) -> F:
        """Use as a decorator: every call of `fn` is one span with these fields."""
        rec, head, attr = self._rec, self._head, self._attr
        nbytes, tokens, peer = self.nbytes, self.tokens, self.peer

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _Span(rec, head, attr, nbytes, tokens, peer):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class _Range:
    """An NVTX range alone (see `Recorder.nvtx_range`)."""

    __slots__ = ("_attr", "_pop", "_push")

    def __init__(self, push: Callable[[Any], None], pop: Callable[[], None], attr: Any) -> None:
        self._push, self._pop, self._attr = push, pop, attr

    def __enter__(self) -> _Range:
        self._push(self._attr)
        return self

    def __exit__(self, *exc: object) -> None:
        self._pop()


class _NullSpan:
    """What a disabled recorder hands out: does nothing, accepts field updates, decorates transparently."""

    __slots__ = ("nbytes", "peer", "tokens")

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: F) -> F:
        return fn


_NULL_SPAN = _NullSpan()


class Recorder:
    """Records spans, counters and marks of one rank.

    sink: where batches go (a `RankWriter`); None keeps everything in memory for `frame()` (tests,
    benchmarks). enabled=False records nothing and emits no NVTX. stage: default stage of this rank's
    spans. clock: the time source, `time.perf_counter_ns` (CLOCK_MONOTONIC on Linux: one clock for every
    process of a host); tests may inject a skewed one.
    """

    def __init__(
        self,
        sink: RankWriter | None = None,
        *,
        rank: int = 0,
        stage: int = -1,
        enabled: bool = True,
        nvtx: bool = True,
        flush_interval_s: float = 0.5,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.rank = rank
        self.stage = stage
        self.enabled = enabled
        """Whether recording happens now: false when built disabled, or while paused (`set_paused`)."""
        self.nvtx = enabled and nvtx
        self._built = (enabled, self.nvtx)
        self._clock = clock
        self._sink = sink if enabled else None
        self._buffer: collections.deque[tuple[Any, ...]] = collections.deque()
        self._counters: collections.deque[tuple[Any, ...]] = collections.deque()
        self._kept: list[tuple[Any, ...]] = []  # sink-less mode only
        self._kept_counters: list[tuple[Any, ...]] = []
        self._attr_cache: dict[tuple[str, int, int, int], Any] = {}
        self._domain: Any = None
        if self.nvtx:
            import nvtx as _nvtx

            self._domain = _nvtx.get_domain("ppscope")
            self._push = self._domain.push_range
            self._pop = self._domain.pop_range
        self._append = self._buffer.append
        # Spans are counted as they are recorded, apart from the flush thread's count of what it wrote, so
        # the two can be compared. next() on itertools.count is atomic: threads may record at once.
        self._recorded = itertools.count()
        self._count_reads = 0
        self._count_lock = threading.Lock()
        self.spans_written = 0
        self._flush_error: BaseException | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # flush now (a pause), not at the end of the interval
        self._lock = threading.Lock()  # serialises drains (flush thread vs explicit flush)
        self._thread: threading.Thread | None = None
        if self._sink is not None:
            self._interval = flush_interval_s
            self._thread = threading.Thread(target=self._run, name=f"ppscope-flush-r{rank}", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------ hot path

    def span(
        self,
        kind: str,
        *,
        stage: int | None = None,
        mb: int = -1,
        step: int = -1,
        chunk: int = 0,
        phase: str = "",
        name: str = "",
        lane: str = "",
        nbytes: int = 0,
        tokens: int = 0,
        peer: int = -1,
    ) -> Any:
        """A context manager (or decorator) that records one span of `kind` around its body."""
        if not self.enabled:
            return _NULL_SPAN
        if kind not in _KINDS:
            raise InvalidSpanError(
                ErrorCode.UNKNOWN_SPAN_KIND, f"unknown span kind {kind!r}; valid kinds: {sorted(_KINDS)}"
            )
        if stage is None:
            stage = self.stage
        attr = None
        if self.nvtx:
            attr = self._attr_cache.get((kind, stage, mb, chunk), _MISSING)
            if attr is _MISSING:
                attr = self._attributes(kind, stage, mb, chunk)
        head = (self.rank, stage, lane or _LANES.get(kind, _COMPUTE), kind, name or kind, mb, step, chunk, phase)
        return _Span(self, head, attr, nbytes, tokens, peer)

    def record(
        self,
        kind: str,
        start_ns: int,
        end_ns: int,
        *,
        stage: int | None = None,
        mb: int = -1,
        step: int = -1,
        chunk: int = 0,
        phase: str = "",
        name: str = "",
        lane: str = "",
        nbytes: int = 0,
        tokens: int = 0,
        peer: int = -1,
        begun_recording: bool = False,
    ) -> None:
        """Record a span whose times were measured elsewhere (e.g. CUDA events resolved to this clock).
        `begun_recording`: the span began while recording was on, so a pause since does not drop it, as it
        does not drop a `span` open when the pause began (a recorder built disabled records nothing)."""
        if not (self.enabled or (begun_recording and self._built[0])):
            return
        if kind not in _KINDS:
            raise InvalidSpanError(
                ErrorCode.UNKNOWN_SPAN_KIND, f"unknown span kind {kind!r}; valid kinds: {sorted(_KINDS)}"
            )
        if end_ns < start_ns:
            raise InvalidSpanError(
                ErrorCode.SPAN_REVERSED,
                f"{kind} span on rank {self.rank} ends before it starts "
                f"(start_ns={start_ns}, end_ns={end_ns}): pass the times in order",
            )
        st = self.stage if stage is None else stage
        head = (self.rank, st, lane or _LANES[kind], kind, name or kind, mb, step, chunk, phase)
        self._append((head, int(start_ns), int(end_ns), nbytes, tokens, peer))
        next(self._recorded)

    def mark(self, name: str, *, stage: int | None = None, mb: int = -1, step: int = -1) -> None:
        """A one-off event (a span of zero length, kind `mark`), also an NVTX mark."""
        if not self.enabled:
            return
        now = self._clock()
        if self.nvtx:
            self._domain.mark(message=name, color=KIND_COLORS[SpanKind.MARK])
        self.record(SpanKind.MARK, now, now, stage=stage, mb=mb, step=step, name=name)

    def counter(self, metric: str, value: float, *, device: int = -1, ts_ns: int | None = None) -> None:
        """One sample of a metric (see `Metric`); device -1 means the host."""
        if not self.enabled:
            return
        ts = self._clock() if ts_ns is None else ts_ns
        self._counters.append((int(ts), self.rank, int(device), str(metric), float(value)))

    @property
    def spans_recorded(self) -> int:
        """Spans recorded so far, counted when each was recorded (`spans_written` counts what reached the
        sink; after `close()` the two are equal unless spans were lost)."""
        with self._count_lock:  # reading the count advances it: subtract the earlier reads
            n = next(self._recorded) - self._count_reads
            self._count_reads += 1
        return n

    def set_paused(self, paused: bool) -> None:
        """Pause or resume recording without closing: while paused, spans, counters, marks and NVTX ranges are
        skipped (a span open when the pause began is still recorded). For measuring within one run what
        recording costs. A pause also wakes the flush thread, so what was recorded before it is written at
        once rather than during the pause. A recorder built disabled stays disabled."""
        on, nvtx = self._built
        if paused and self.enabled and self._thread is not None:
            self._wake.set()
        self.enabled = on and not paused
        self.nvtx = nvtx and not paused

    def now_ns(self) -> int:
        """The recorder's clock, for producers that time things themselves."""
        return self._clock()

    def nvtx_range(self, kind: str, *, stage: int | None = None, mb: int = -1, chunk: int = 0) -> Any:
        """The NVTX range of a span without the span: for work timed elsewhere (CUDA events), whose times
        reach `record()` later. A no-op context manager when NVTX is off."""
        if not self.nvtx:
            return _NULL_SPAN
        attr = self._attributes(kind, self.stage if stage is None else stage, mb, chunk)  # cached per key
        return _Range(self._push, self._pop, attr)

    def _attributes(self, kind: str, stage: int, mb: int, chunk: int) -> Any:
        key = (kind, stage, mb, chunk)
        attr = self._attr_cache.get(key, _MISSING)
        if attr is _MISSING:
            message = f"s{stage} {kind}" + (f" mb{mb}" if mb >= 0 else "") + (f" c{chunk}" if chunk else "")
            attr = self._domain.get_event_attributes(
                message=message,
                color=KIND_COLORS.get(kind, 0xFF888888),
                category=self._domain.get_category_id(kind),
                payload=mb,
            )
            self._attr_cache[key] = attr
        return attr

    # ------------------------------------------------------------ flushing

    def _drain(self) -> None:
        with self._lock:
            while self._buffer or self._counters:
                spans = [(*head, s, e, b, t, p) for head, s, e, b, t, p in _take(self._buffer, _FLUSH_BATCH)]
                counters = _take(self._counters, _FLUSH_BATCH)
                if self._sink is not None:
                    self._sink.write(spans, counters)
                else:
                    self._kept += spans
                    self._kept_counters += counters
                self.spans_written += len(spans)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._drain()
            except BaseException as exc:  # keep recording in memory; close() reports it
                self._flush_error = exc
                return

    def flush(self) -> None:
        """Write everything recorded so far (blocks until it is in the file)."""
        if self._built[0]:
            self._drain()

    def close(self, info: Mapping[str, Any] | None = None) -> None:
        """Stop the flush thread, write what is left, leave both span counts in the rank file (info keys
        `spans_recorded` and `spans_written`, for whoever checks that none was lost) with `info`'s keys, and
        close the sink. A write that failed is raised here, after the counts are stored. Idempotent."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._flush_error = self._flush_error, None
        if self._built[0] and error is None:
            try:
                self._drain()
            except BaseException as exc:
                error = exc
        if self._sink is not None:
            sink, self._sink = self._sink, None
            try:
                sink.set_info("spans_recorded", self.spans_recorded)
                sink.set_info("spans_written", self.spans_written)
                for key, value in (info or {}).items():
                    sink.set_info(key, value)
            except Exception:
                if error is None:
                    raise  # else the failed write says more than this
            finally:
                sink.close()
        if error is not None:
            raise error

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def frame(self) -> pd.DataFrame:
        """The spans kept in memory (sink-less mode), as a schema DataFrame."""
        import pandas as pd

        from ppscope.trace.model import spans_frame

        self.flush()
        return spans_frame(pd.DataFrame(self._kept, columns=list(SPAN_COLUMNS)))


def _take(dq: collections.deque[tuple[Any, ...]], limit: int) -> list[tuple[Any, ...]]:
    # deque.popleft is atomic, so producers can append while we drain.
    n = min(len(dq), limit)
    return [dq.popleft() for _ in range(n)]
