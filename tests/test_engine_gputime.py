"""Device-timed spans, checked against a GPU simulated on the host clock: work queued on its stream runs
after the work queued before it, while the host goes on at once, as with CUDA. The host clock is virtual: it
moves only when the host sleeps or waits for the device, so every time below is exact, however busy the
machine running the tests."""

from __future__ import annotations

import pytest

from ppscope.engine.gputime import DeviceSpans
from ppscope.trace.recorder import Recorder

MS = 1_000_000


class Clock:
    """The host's clock, in ns: still until the host sleeps or waits."""

    def __init__(self) -> None:
        self.ns = 10**12

    def __call__(self) -> int:
        return self.ns

    def sleep_until(self, t_ns: int) -> None:
        self.ns = max(self.ns, t_ns)

    def sleep(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


class FakeGpu:
    """One stream. Times are host nanoseconds; the device's timer runs `rate` times as fast as the host's."""

    def __init__(self, rate: float = 1.0, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.busy_until = 0
        self.rate = rate
        self.ran: list[tuple[int, int]] = []
        """(start, end) of each piece of work, on the host clock: the truth the spans must find."""

    def launch(self, ms: float) -> None:
        start = max(self.clock(), self.busy_until)
        self.busy_until = start + int(ms * MS)
        self.ran.append((start, self.busy_until))

    def synchronize(self) -> None:
        self.clock.sleep_until(self.busy_until)

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.at = -1

    def record(self, stream: object = None) -> None:
        on = stream if isinstance(stream, FakeGpu) else self.gpu  # a stream of the same device, same timer
        self.at = max(self.gpu.clock(), on.busy_until)

    def query(self) -> bool:
        return self.gpu.clock() >= self.at

    def synchronize(self) -> None:
        self.gpu.clock.sleep_until(self.at)

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.at - self.at) * self.gpu.rate / MS


def _timer(gpu: FakeGpu, reanchor_s: float = 2.0) -> tuple[Recorder, DeviceSpans]:
    rec = Recorder(None, rank=0, stage=0, nvtx=False, clock=gpu.clock)
    return rec, DeviceSpans(rec, gpu, gpu.event, reanchor_s=reanchor_s)


def test_spans_take_the_device_time_of_their_work_not_the_launch_time() -> None:
    gpu = FakeGpu()
    rec, dev = _timer(gpu)
    launched = gpu.clock()
    for mb in range(3):
        with dev.span("forward", mb=mb, step=0, phase="prefill"):
            gpu.launch(20)
    assert gpu.clock() == launched  # the host did not wait for the work
    assert dev.close() == 3
    spans = rec.frame().sort_values("mb")
    assert spans["mb"].tolist() == [0, 1, 2]
    for (start, end), got in zip(gpu.ran, spans.itertuples(), strict=True):
        assert abs(got.start_ns - start) < 0.3 * MS
        assert abs(got.end_ns - end) < 0.3 * MS
        assert got.kind == "forward" and got.phase == "prefill"


def test_poll_hands_over_only_finished_work_in_stream_order() -> None:
    gpu = FakeGpu()
    rec, dev = _timer(gpu)
    with dev.span("forward", mb=0):
        gpu.launch(5)
    with dev.span("head", mb=0):
        gpu.launch(200)
    gpu_first_done = gpu.ran[0][1]
    gpu.clock.sleep_until(gpu_first_done + MS)
    assert dev.poll() == 1  # the forward is done, the head is still running
    assert dev.pending == 1
    assert rec.frame()["kind"].tolist() == ["forward"]
    dev.close()
    assert rec.frame()["kind"].tolist() == ["forward", "head"]


@pytest.mark.parametrize(("reanchor_s", "bounded"), [(0.05, True), (1e9, False)])
def test_a_renewed_anchor_keeps_a_drifting_device_timer_on_the_host_clock(reanchor_s: float, bounded: bool) -> None:
    gpu = FakeGpu(rate=1.002)  # 2000 ppm: far worse than a real GPU, so the effect shows within a second
    rec, dev = _timer(gpu, reanchor_s)
    for mb in range(12):
        with dev.span("forward", mb=mb):
            gpu.launch(10)
        gpu.synchronize()
        gpu.clock.sleep(0.05)  # the host is idle between passes, as when it waits for the next message
        dev.poll()
    dev.close()
    spans = rec.frame().sort_values("mb")
    worst = max(abs(got - start) for (start, _), got in zip(gpu.ran, spans["start_ns"], strict=True))
    if bounded:
        assert dev.anchors > 3
        assert worst < 0.4 * MS  # 2000 ppm over at most ~0.1 s since the last anchor
    else:
        assert dev.anchors == 1
        assert worst > 0.8 * MS  # 2000 ppm over ~0.7 s


@pytest.mark.parametrize("own_stream", [True, False])
def test_an_anchor_on_its_own_stream_is_renewed_however_busy_the_compute_stream(own_stream: bool) -> None:
    gpu = FakeGpu(rate=1.002)
    side = FakeGpu(rate=1.002, clock=gpu.clock) if own_stream else None  # another stream of the same GPU
    rec = Recorder(None, rank=0, stage=0, nvtx=False, clock=gpu.clock)
    dev = DeviceSpans(rec, gpu, gpu.event, reanchor_s=0.05, anchor_stream=side)
    for mb in range(60):  # the host runs ahead: some work is always queued when it polls
        with dev.span("forward", mb=mb):
            gpu.launch(10)
        dev.poll()
        if dev.pending > 2:
            gpu.clock.sleep(0.01)
    dev.close()
    spans = rec.frame().sort_values("mb")
    worst = max(abs(got - start) for (start, _), got in zip(gpu.ran, spans["start_ns"], strict=True))
    if own_stream:
        assert dev.anchors > 5 and worst < 0.4 * MS
    else:
        assert dev.anchors == 1 and worst > 0.8 * MS


def test_anchor_uncertainty_is_reported_and_small() -> None:
    gpu = FakeGpu()
    _, dev = _timer(gpu)
    assert 0 <= dev.anchor.uncertainty_ns < 5 * MS


def test_device_spans_push_one_nvtx_range_each_and_record_no_host_span(monkeypatch: pytest.MonkeyPatch) -> None:
    import nvtx
    from test_trace_recorder import SpyDomain

    spy = SpyDomain()
    monkeypatch.setattr(nvtx, "get_domain", lambda name: spy if name == "ppscope" else None)
    gpu = FakeGpu()
    rec = Recorder(None, rank=3, stage=3, clock=gpu.clock)
    dev = DeviceSpans(rec, gpu, gpu.event)
    with dev.span("head", stage=3, mb=2):
        gpu.launch(1)
        assert spy.calls == [("push", 0)]  # the range brackets the launch, as nsys expects
    assert spy.calls == [("push", 0), ("pop", None)]
    assert spy.attributes[0]["message"] == "s3 head mb2"
    assert len(rec.frame()) == 0  # nothing until the device has run it
    dev.close()
    assert rec.frame()["kind"].tolist() == ["head"]


def test_a_span_begun_while_recording_is_kept_through_a_pause_and_none_begins_during_one() -> None:
    gpu = FakeGpu()
    rec, dev = _timer(gpu)
    with dev.span("forward", mb=0):
        gpu.launch(5)
    rec.set_paused(True)  # the pause of `record_alternate_ms` comes before the forward's work is done
    with dev.span("forward", mb=1):
        gpu.launch(5)
    assert dev.pending == 1  # nothing timed while paused
    assert dev.close() == 1  # resolved during the pause, the span begun before it is kept
    assert rec.frame()["mb"].tolist() == [0]
    # --no-record: nothing, pause or not
    off = Recorder(None, rank=0, stage=0, nvtx=False, enabled=False, clock=gpu.clock)
    dev_off = DeviceSpans(off, gpu, gpu.event)
    with dev_off.span("forward", mb=0):
        gpu.launch(1)
    assert dev_off.close() == 0 and off.spans_recorded == 0


@pytest.mark.parametrize("own_stream", [True, False])
def test_the_first_span_after_an_idle_gap_is_placed_from_a_fresh_anchor(own_stream: bool) -> None:
    """The host idles 10 s between two passes (a sparse --rate) without polling: the span that starts after
    the gap must not be placed from the anchor taken before it (2000 ppm over 10 s: 20 ms off)."""
    gpu = FakeGpu(rate=1.002)
    side = FakeGpu(rate=1.002, clock=gpu.clock) if own_stream else None
    rec = Recorder(None, rank=0, stage=0, nvtx=False, clock=gpu.clock)
    dev = DeviceSpans(rec, gpu, gpu.event, reanchor_s=2.0, anchor_stream=side)
    with dev.span("forward", mb=0):
        gpu.launch(10)
    gpu.synchronize()
    gpu.clock.sleep(10.0)
    with dev.span("forward", mb=1):
        gpu.launch(10)
    dev.close()
    spans = rec.frame().sort_values("mb")
    assert dev.anchors == 2
    for (start, end), got in zip(gpu.ran, spans.itertuples(), strict=True):
        assert abs(got.start_ns - start) < 0.1 * MS and abs(got.end_ns - end) < 0.1 * MS


def test_a_span_since_a_host_time_starts_then_and_ends_where_its_work_ends() -> None:
    """A receive's span on a GPU: from when the host began waiting for the header to when the stream has the
    payload, whatever the stream did meanwhile."""
    gpu = FakeGpu()
    rec, dev = _timer(gpu)
    with dev.span("forward", mb=0):
        gpu.launch(8)  # still running while the host waits for the next header
    waited = gpu.clock()
    gpu.clock.sleep(0.003)
    with dev.span("recv_wait", since_ns=waited, mb=1):
        gpu.launch(1)  # the stream's wait for the payload
    dev.close()
    span = rec.frame().set_index("mb").loc[1]
    assert span["start_ns"] == waited
    assert abs(span["end_ns"] - gpu.ran[1][1]) < 0.3 * MS
