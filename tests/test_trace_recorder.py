"""The recorder: spans, NVTX ranges, counters, marks, the disabled mode and the flush thread."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from error_helpers import raises_code

from ppscope.errors import ErrorCode, InvalidSpanError
from ppscope.trace.model import RunMeta, SpanKind
from ppscope.trace.recorder import KIND_COLORS, Recorder
from ppscope.trace.store import RankWriter, create_run, load_run, read_rank_info


class SpyDomain:
    """Stands in for an NVTX domain and remembers what the recorder asked of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.attributes: list[dict[str, Any]] = []

    def get_category_id(self, name: str) -> int:
        return hash(name) % 1000

    def get_event_attributes(self, **kw: Any) -> int:
        self.attributes.append(kw)
        return len(self.attributes) - 1

    def push_range(self, attr: Any = None) -> None:
        self.calls.append(("push", attr))

    def pop_range(self) -> None:
        self.calls.append(("pop", None))

    def mark(self, **kw: Any) -> None:
        self.calls.append(("mark", kw["message"]))


def _fake_clock() -> Any:
    counter = itertools.count(1_000, 10)
    return lambda: next(counter)


def test_span_records_fields_and_times() -> None:
    rec = Recorder(rank=2, stage=2, nvtx=False, clock=_fake_clock())
    with rec.span(SpanKind.SEND, mb=4, step=1, phase="decode", peer=3) as s:
        s.nbytes = 4096
    with rec.span("forward", stage=5, chunk=1, tokens=8, name="layers 4-7"):
        pass
    df = rec.frame()
    assert df["kind"].tolist() == ["send", "forward"]
    assert df["lane"].tolist() == ["send", "compute"]
    first = df.iloc[0]
    assert (first["rank"], first["stage"], first["mb"], first["step"], first["peer"]) == (2, 2, 4, 1, 3)
    assert (first["start_ns"], first["end_ns"], first["nbytes"], first["phase"]) == (1_000, 1_010, 4096, "decode")
    second = df.iloc[1]
    assert (second["stage"], second["chunk"], second["tokens"], second["name"]) == (5, 1, 8, "layers 4-7")


def test_decorator_records_each_call() -> None:
    rec = Recorder(rank=0, stage=0, nvtx=False)

    @rec.span("head", phase="decode")
    def head(x: int) -> int:
        return x + 1

    assert [head(i) for i in range(3)] == [1, 2, 3]
    df = rec.frame()
    assert df["kind"].tolist() == ["head"] * 3 and (df["phase"] == "decode").all()


def test_nvtx_ranges_are_pushed_and_popped_with_cached_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    import nvtx

    spy = SpyDomain()
    monkeypatch.setattr(nvtx, "get_domain", lambda name: spy if name == "ppscope" else None)
    rec = Recorder(rank=1, stage=1)
    for _ in range(2):
        for mb in range(3):
            with rec.span("forward", mb=mb):
                pass
    rec.mark("prefill done")
    assert [c[0] for c in spy.calls] == ["push", "pop"] * 6 + ["mark"]
    assert len(spy.attributes) == 3  # one cached attribute object per (kind, stage, mb)
    assert spy.attributes[2]["message"] == "s1 forward mb2"
    assert spy.attributes[2]["payload"] == 2
    assert spy.attributes[0]["color"] == KIND_COLORS["forward"]
    assert [c[1] for c in spy.calls if c[0] == "push"] == [0, 1, 2, 0, 1, 2]


def test_disabled_recorder_records_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nvtx

    spy = SpyDomain()
    monkeypatch.setattr(nvtx, "get_domain", lambda name: spy)
    run = tmp_path / "run"
    create_run(run, RunMeta())
    rec = Recorder(RankWriter(run, 0), enabled=False)
    with rec.span("forward", mb=1) as s:
        s.nbytes = 5

    @rec.span("head")
    def f() -> int:
        return 7

    assert f() == 7
    rec.counter("cpu_util_pct", 3.0)
    rec.mark("x")
    rec.record("forward", 1, 2)
    rec.close()
    assert spy.calls == []
    assert len(rec.frame()) == 0
    trace = load_run(run)
    assert len(trace.spans) == 0 and len(trace.counters) == 0


def test_record_rejects_end_before_start() -> None:
    rec = Recorder(nvtx=False)
    with raises_code(InvalidSpanError, ErrorCode.SPAN_REVERSED):
        rec.record("forward", 10, 5)


def test_unknown_kind_is_rejected() -> None:
    rec = Recorder(nvtx=False)
    with raises_code(InvalidSpanError, ErrorCode.UNKNOWN_SPAN_KIND):
        rec.span("fwd")


def test_counters_marks_and_flush_to_store(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta())
    rec = Recorder(RankWriter(run, 0), rank=0, stage=0, nvtx=False, flush_interval_s=10)
    rec.counter("gpu_util_pct", 87.5, device=3, ts_ns=123)
    rec.mark("start")
    for i in range(20_000):  # more than one flush batch
        rec.record("forward", i, i + 1, mb=i)
    assert rec.spans_written == 0  # the flush thread has not run yet: nothing blocked on I/O
    rec.close()
    assert rec.spans_recorded == rec.spans_written == 20_001
    trace = load_run(run)
    assert len(trace.spans) == 20_001
    marks = trace.spans[trace.spans["kind"] == "mark"]
    assert marks["name"].tolist() == ["start"] and (marks["start_ns"] == marks["end_ns"]).all()
    c = trace.counters.iloc[0]
    assert (c["ts_ns"], c["device"], c["metric"], c["value"]) == (123, 3, "gpu_util_pct", 87.5)


def test_a_pause_writes_what_was_recorded_at_once(tmp_path: Path) -> None:
    import time

    run = tmp_path / "run"
    create_run(run, RunMeta())
    rec = Recorder(RankWriter(run, 0), rank=0, stage=0, nvtx=False, flush_interval_s=60)
    try:
        for i in range(100):
            rec.record("forward", i, i + 1, mb=i)
        rec.set_paused(True)  # the flush thread wakes now, not in 60 s
        deadline = time.monotonic() + 30
        while rec.spans_written < 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rec.spans_written == 100
        rec.record("forward", 200, 201)  # paused: not recorded
        rec.set_paused(False)
        rec.record("forward", 300, 301)
    finally:
        rec.close()
    assert load_run(run).spans["start_ns"].tolist() == [*range(100), 300]


def test_close_is_idempotent(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta())
    rec = Recorder(RankWriter(run, 0), nvtx=False)
    rec.close()
    rec.close()


def test_spans_are_counted_as_recorded_and_both_counts_stored(tmp_path: Path) -> None:
    import threading

    from ppscope.trace.store import read_rank_info

    run = tmp_path / "run"
    create_run(run, RunMeta())
    rec = Recorder(RankWriter(run, 0), rank=0, stage=0, nvtx=False, flush_interval_s=0.001)
    n = 20_000

    def work(tid: int) -> None:
        for i in range(n):
            if i % 2:
                with rec.span("forward", mb=tid, step=i):
                    pass
            else:
                rec.record("send", i, i + 1, mb=tid, step=i)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rec.spans_recorded == 2 * n  # read twice: reading the count does not change it
    assert rec.spans_recorded == 2 * n
    rec.close()
    assert rec.spans_written == 2 * n
    info = read_rank_info(run)[0]
    assert info["spans_recorded"] == info["spans_written"] == 2 * n
    spans = load_run(run).spans
    assert len(spans) == 2 * n
    assert sorted(spans.groupby("mb").size().tolist()) == [n, n]


def test_counts_show_spans_that_never_reached_the_file() -> None:
    class BrokenSink:
        spans_written = 0

        def __init__(self) -> None:
            self.info: dict[str, Any] = {}

        def write(self, spans: Any = (), counters: Any = ()) -> None:
            raise OSError("disk full")

        def set_info(self, key: str, value: Any) -> None:
            self.info[key] = value

        def close(self) -> None:
            pass

    sink = BrokenSink()
    rec = Recorder(sink, nvtx=False, flush_interval_s=60)  # type: ignore[arg-type]
    for i in range(5):
        rec.record("forward", i, i + 1)
    assert (rec.spans_recorded, rec.spans_written) == (5, 0)  # nothing flushed yet
    with pytest.raises(OSError, match="disk full"):
        rec.close()
    assert sink.info == {"spans_recorded": 5, "spans_written": 0}


def test_paused_recorder_skips_everything_and_still_writes_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nvtx

    spy = SpyDomain()
    monkeypatch.setattr(nvtx, "get_domain", lambda name: spy)
    run = tmp_path / "run"
    create_run(run, RunMeta())
    rec = Recorder(RankWriter(run, 0))
    rec.record("forward", 1, 2, mb=0)
    rec.set_paused(True)
    with rec.span("forward", mb=1):
        pass
    rec.record("send", 3, 4, mb=1)
    rec.counter("cpu_util_pct", 3.0)
    rec.mark("paused")
    assert spy.calls == []  # no NVTX while paused
    rec.set_paused(False)
    with rec.span("forward", mb=2):
        pass
    assert [c for c, _ in spy.calls] == ["push", "pop"]
    rec.set_paused(True)  # closing while paused still writes what was recorded before
    rec.close()
    spans = load_run(run).spans
    assert sorted(spans["mb"].tolist()) == [0, 2]
    assert len(load_run(run).counters) == 0
    assert read_rank_info(run)[0]["spans_recorded"] == 2


def test_a_recorder_built_disabled_stays_disabled_when_resumed() -> None:
    rec = Recorder(None, enabled=False)
    rec.set_paused(False)
    rec.record("forward", 1, 2)
    assert not rec.enabled and not rec.nvtx and len(rec.frame()) == 0
