"""Hand-built traces with exactly known busy time, bubbles and causes (integer ns, exact equality)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from ppscope.analysis import CAUSES, AnalysisConfig, analyze
from ppscope.analysis.intervals import Intervals, clip, covered_within, union_length
from ppscope.trace.model import RankInfo, RunMeta, Trace, requests_frame
from ppscope.trace.notices import NoticeCode


def _trace(rows: list[dict[str, Any]], **meta: Any) -> Trace:
    return Trace.from_records(rows, meta=RunMeta(**meta))


def _fwd(rank: int, mb: int, start: int, end: int, **kw: Any) -> dict[str, Any]:
    return dict(rank=rank, stage=rank, kind="forward", mb=mb, start_ns=start, end_ns=end, **kw)


def _gpipe(p: int, m: int, t: int) -> list[dict[str, Any]]:
    return [_fwd(s, mb, (s + mb) * t, (s + mb + 1) * t) for s in range(p) for mb in range(m)]


def test_gpipe_fill_drain_exact() -> None:
    p, m, t = 4, 3, 1000
    res = analyze(_trace(_gpipe(p, m, t), pp_size=p, schedule="gpipe", microbatches=m, world_size=p))
    assert res.window is not None and res.window.length_ns == (m + p - 1) * t
    for s in res.stages:
        assert s.busy_ns == m * t
        assert s.causes["fill"] == s.stage * t
        assert s.causes["drain"] == (p - 1 - s.stage) * t
        assert s.bubble_ns == (p - 1) * t
        assert s.time_per_mb_ns == t
    assert res.bubble_ratio == (p - 1) / (m + p - 1)
    assert res.theory.bubble_ratio == res.bubble_ratio
    assert res.imbalance == 0.0 and res.balance_speedup == 1.0


def test_every_cause_with_precedence() -> None:
    # Stage 1, window [0, 100): compute [10,20) and [60,70) and [90,100); stage 0 spans the window.
    rows = [
        _fwd(0, 0, 0, 100),
        _fwd(1, 0, 10, 20),
        _fwd(1, 1, 60, 70),
        _fwd(1, 2, 90, 100),
        dict(rank=1, stage=1, kind="recv_wait", start_ns=0, end_ns=10, peer=0),  # before first compute: fill
        dict(rank=1, stage=1, kind="send", start_ns=20, end_ns=30, peer=2),  # downstream 10
        dict(rank=1, stage=1, kind="recv_wait", start_ns=30, end_ns=45, peer=0),  # upstream 15 minus comm 5
        dict(rank=1, stage=1, kind="recv", start_ns=40, end_ns=50, peer=0),  # comm 10, wins over recv_wait
        dict(rank=1, stage=1, kind="nccl", lane="stream 7", start_ns=50, end_ns=60),  # imported comm kernel 10
        dict(rank=1, stage=1, kind="memcpy", name="Memcpy HtoD", lane="stream 9", start_ns=70, end_ns=76),  # 6
        dict(rank=1, stage=1, kind="memcpy", name="Memcpy PtoP", lane="stream 9", start_ns=76, end_ns=80),  # comm
        dict(rank=1, stage=1, kind="step", start_ns=0, end_ns=100),  # host-side span: explains nothing
        # [80,90): nothing but the step span -> host 10
    ]
    res = analyze(_trace(rows, pp_size=2, world_size=2))
    s1 = res.stage(1)
    assert s1.busy_ns == 30
    assert s1.causes == {
        "fill": 10,
        "drain": 0,
        "upstream": 10,
        "dependency": 0,
        "downstream": 10,
        "comm": 24,
        "memcpy": 6,
        "dp_sync": 0,
        "optimizer": 0,
        "host": 10,
        "unknown": 0,
        "no_requests": 0,
    }
    assert sum(s1.causes.values()) == s1.bubble_ns == 70
    gaps = res.gaps[res.gaps["stage"] == 1]
    assert list(gaps["cause"]) == ["fill", "downstream", "upstream", "comm", "memcpy", "comm", "host"]
    assert list(gaps["start_ns"]) == [0, 20, 30, 40, 70, 76, 80]
    assert list(gaps["end_ns"]) == [10, 30, 40, 60, 76, 80, 90]


def test_a_training_steps_data_parallel_tail_is_its_own_cause_not_drain() -> None:
    """The gradient all-reduce and the optimizer after a stage's last backward are `dp_sync` and `optimizer`,
    whether the source names them by kind or by PyTorch's ranges; a copy is `memcpy`, even in the drain's place
    it stays a drain (positional causes outrank it)."""
    rows = [
        _fwd(0, 0, 0, 10),
        _fwd(1, 0, 15, 25),
        dict(rank=1, stage=1, kind="backward", mb=0, phase="B", start_ns=25, end_ns=35),
        dict(rank=0, stage=0, kind="backward", mb=0, phase="B", start_ns=40, end_ns=50),
        dict(rank=1, stage=1, kind="collective", name="grads-reduce-scatter", start_ns=35, end_ns=60),
        dict(rank=0, stage=0, kind="range", name="gloo:all_reduce", start_ns=50, end_ns=60),
        dict(rank=1, stage=1, kind="optimizer", name="optimizer", start_ns=60, end_ns=70),
        dict(rank=0, stage=0, kind="range", name="Optimizer.step#SGD.step", start_ns=60, end_ns=70),
    ]
    res = analyze(_trace(rows, pp_size=2, world_size=2, schedule="gpipe", microbatches=1))
    s0, s1 = res.stage(0), res.stage(1)
    assert (s1.causes["fill"], s1.causes["dp_sync"], s1.causes["optimizer"], s1.causes["drain"]) == (15, 25, 10, 0)
    assert (s0.causes["dp_sync"], s0.causes["optimizer"]) == (10, 10)
    assert s0.causes["fill"] + s0.causes["drain"] == 30  # between its forward and its backward: the waves' gap
    assert s0.causes["comm"] == s1.causes["comm"] == 0


def test_a_collective_outside_training_is_comm() -> None:
    rows = [
        _fwd(0, 0, 0, 10),
        _fwd(0, 1, 20, 30),
        dict(rank=0, stage=0, kind="range", name="nccl:all_reduce", start_ns=10, end_ns=20),
        _fwd(1, 0, 10, 20),
        _fwd(1, 1, 30, 40),
    ]
    res = analyze(_trace(rows, pp_size=2, world_size=2))
    assert res.stage(0).causes["comm"] == 10 and res.stage(0).causes["dp_sync"] == 0


def test_serve_time_with_no_request_in_the_system_is_not_a_pipeline_wait() -> None:
    # serve, 2 stages: request 0 is in the system [0, 40), request 1 [70, 110); between them both stages wait
    # in recv for work that has not arrived
    rows = [
        _fwd(0, 0, 0, 10),
        _fwd(1, 0, 10, 20),
        _fwd(0, 1, 70, 80),
        _fwd(1, 1, 80, 90),
        dict(rank=0, stage=0, kind="recv_wait", start_ns=10, end_ns=70, peer=1),
        dict(rank=1, stage=1, kind="recv_wait", start_ns=20, end_ns=80, peer=0),
        dict(rank=0, stage=0, kind="recv_wait", start_ns=80, end_ns=110, peer=1),
    ]
    requests = pd.DataFrame(
        {
            "id": [0, 1],
            "arrival_ns": [0, 70],
            "first_token_ns": [40, 110],
            "finish_ns": [40, 110],
            "prompt_len": [4, 4],
            "output_len": [1, 1],
        }
    )
    meta = dict(pp_size=2, world_size=2, schedule="serve", status="finished")
    trace = Trace.from_records(rows, meta=RunMeta(**meta))
    res = analyze(dataclasses.replace(trace, requests=requests_frame(requests)))
    s0, s1 = res.stage(0), res.stage(1)
    assert s0.causes["no_requests"] == s1.causes["no_requests"] == 30  # [40, 70)
    assert (s0.causes["upstream"], s0.causes["drain"]) == (30, 30)  # [10, 40); [80, 110)
    assert (s1.causes["fill"], s1.causes["upstream"], s1.causes["drain"]) == (10, 20 + 10, 20)  # [20,40) [70,80)
    assert sum(s0.causes.values()) == s0.bubble_ns and sum(s1.causes.values()) == s1.bubble_ns
    # while the run is being written, requests still in flight are not in the table yet: no such claim
    live = dataclasses.replace(trace, requests=requests_frame(requests), meta=RunMeta(**{**meta, "status": "running"}))
    assert all(s.causes["no_requests"] == 0 for s in analyze(live).stages)
    gpipe = dataclasses.replace(trace, requests=requests_frame(requests), meta=RunMeta(**{**meta, "schedule": "gpipe"}))
    assert all(s.causes["no_requests"] == 0 for s in analyze(gpipe).stages)


def test_decode_dependency_when_fewer_in_flight_than_stages() -> None:
    # 2 stages, 1 micro-batch circulating in decode: every wait is the ring dependency.
    rows = []
    for step in range(3):
        base = step * 40
        rows += [
            _fwd(0, 0, base, base + 10, phase="decode", step=step),
            dict(rank=0, stage=0, kind="recv_wait", phase="decode", start_ns=base + 10, end_ns=base + 40, peer=1),
            dict(rank=1, stage=1, kind="recv_wait", phase="decode", start_ns=base, end_ns=base + 20, peer=0),
            _fwd(1, 0, base + 20, base + 30, phase="decode", step=step),
        ]
    res = analyze(_trace(rows, pp_size=2, world_size=2, schedule="serve", config={"max_inflight": 1}))
    assert res.inflight == 1
    s0, s1 = res.stage(0), res.stage(1)
    # Window [0, 120). Stage 0 waits [10,40) and [50,80) for its token; drains after its last compute at 90.
    assert s0.causes["dependency"] == 60 and s0.causes["drain"] == 30 and s0.bubble_ns == 90
    # Stage 1 fills [0,20), waits [40,60) and [80,100), has uncovered [30,40) and [70,80), drains [110,120).
    assert s1.causes["fill"] == 20 and s1.causes["dependency"] == 40 and s1.causes["host"] == 20
    assert s1.causes["drain"] == 10
    assert res.theory.bubble_ratio == 0.5
    # With enough in flight the same waits are `upstream`.
    res2 = analyze(_trace(rows, pp_size=2, world_size=2, schedule="serve", config={"max_inflight": 2}))
    assert res2.stage(1).causes["upstream"] == 40 and res2.stage(1).causes["dependency"] == 0


def test_import_without_waits_reports_unknown() -> None:
    rows = [
        dict(rank=0, kind="kernel", lane="stream 7", start_ns=0, end_ns=10),
        dict(rank=0, kind="kernel", lane="stream 7", start_ns=30, end_ns=40),
        dict(rank=0, kind="nccl", lane="stream 9", start_ns=10, end_ns=15),
        dict(rank=1, kind="kernel", lane="stream 7", start_ns=5, end_ns=40),
    ]
    res = analyze(_trace(rows, source="kineto", world_size=2))
    assert [s.stage for s in res.stages] == [0, 1]
    assert res.stage(0).causes["comm"] == 5 and res.stage(0).causes["unknown"] == 15
    assert res.stage(0).causes["host"] == 0
    assert res.stage(1).causes["fill"] == 5
    assert NoticeCode.NO_P2P in {w.code for w in res.warnings}
    assert res.imbalance_basis == "busy"
    assert res.bottleneck_stage == 1


def test_meta_stage_mapping_and_interleaved_chunks() -> None:
    # Ranks 5 and 3 run physical stages 0 and 1; chunk 1 spans carry virtual stages 2 and 3.
    rows = [
        dict(rank=5, stage=0, chunk=0, kind="forward", mb=0, start_ns=0, end_ns=10),
        dict(rank=5, stage=2, chunk=1, kind="forward", mb=0, start_ns=20, end_ns=30),
        dict(rank=3, stage=1, chunk=0, kind="forward", mb=0, start_ns=10, end_ns=20),
        dict(rank=3, stage=3, chunk=1, kind="forward", mb=0, start_ns=30, end_ns=40),
    ]
    meta = dict(pp_size=2, world_size=2, chunks=2, ranks=[RankInfo(rank=5, stage=0), RankInfo(rank=3, stage=1)])
    res = analyze(_trace(rows, **meta))
    assert [(s.stage, s.ranks) for s in res.stages] == [(0, [5]), (1, [3])]
    assert res.stage(0).busy_ns == 20 and res.stage(0).causes["unknown"] == 10 and res.stage(0).causes["drain"] == 10
    assert res.stage(1).units == 1 and res.stage(1).time_per_mb_ns == 20


def test_overlapping_compute_counted_once_with_warning() -> None:
    rows = [_fwd(0, 0, 0, 10), _fwd(0, 1, 5, 15), _fwd(0, 2, 20, 30)]
    res = analyze(_trace(rows))
    assert res.stage(0).busy_ns == 25 and res.stage(0).causes["unknown"] == 5
    assert NoticeCode.COMPUTE_OVERLAP in {w.code for w in res.warnings}


def test_overlap_of_one_ns_is_found_at_epoch_times() -> None:
    """Ends are compared as integers: at 2^60 ns a float is 256 ns coarse and would round this overlap away."""
    t = 1 << 60
    rows = [_fwd(0, 0, t, t + 100), _fwd(0, 1, t + 99, t + 300)]
    res = analyze(_trace(rows))
    assert res.stage(0).busy_ns == 300
    assert NoticeCode.COMPUTE_OVERLAP in {w.code for w in res.warnings}


def test_causes_sum_to_bubble_on_random_trace() -> None:
    rng = np.random.default_rng(0)
    n = 3000
    start = rng.integers(0, 10**7, n)
    kinds = rng.choice(["forward", "recv_wait", "send", "recv", "nccl", "step"], n)
    df = pd.DataFrame(
        dict(
            rank=rng.integers(0, 4, n),
            stage=-1,
            lane="compute",
            kind=kinds,
            name="x",
            mb=rng.integers(0, 8, n),
            step=-1,
            chunk=0,
            phase="",
            start_ns=start,
            end_ns=start + rng.integers(0, 10**5, n),
            nbytes=0,
            tokens=0,
            peer=-1,
        )
    )
    res = analyze(Trace(spans=df))
    for s in res.stages:
        assert sum(s.causes.values()) == s.bubble_ns
        assert set(s.causes) == set(CAUSES)
        sub = df[(df["rank"] == s.ranks[0]) & (df["kind"] == "forward")]
        assert s.busy_ns == union_length(Intervals(sub["start_ns"].to_numpy(), sub["end_ns"].to_numpy()))


def test_steady_window_excludes_fill_and_drain() -> None:
    p, m, t = 3, 6, 100
    res = analyze(_trace(_gpipe(p, m, t), pp_size=p, schedule="gpipe", microbatches=m), AnalysisConfig(steady=True))
    assert res.window is not None and res.window.mode == "steady"
    assert (res.window.start_ns, res.window.end_ns) == ((p - 1) * t, m * t)
    assert res.bubble_ratio == 0.0
    assert "fill and drain" in res.theory.note


def test_explicit_window_clips_spans() -> None:
    res = analyze(_trace(_gpipe(2, 2, 10**6)), AnalysisConfig(window_ms=(0.5, 2.5)))
    assert res.window is not None and res.window.length_ns == 2 * 10**6
    assert res.stage(0).busy_ns == 15 * 10**5 and res.stage(0).causes["drain"] == 5 * 10**5
    assert res.stage(1).busy_ns == 15 * 10**5 and res.stage(1).causes["fill"] == 5 * 10**5


def test_active_window_leaves_out_start_up() -> None:
    rows = [
        dict(rank=1, stage=1, kind="recv_wait", start_ns=0, end_ns=60, peer=0),  # posted before anything runs
        _fwd(0, 0, 40, 50),
        _fwd(1, 0, 60, 70),
    ]
    full = analyze(_trace(rows))
    active = analyze(_trace(rows), AnalysisConfig(active=True))
    assert full.window is not None and full.window.length_ns == 70
    assert active.window is not None and (active.window.start_ns, active.window.end_ns) == (40, 70)
    assert active.stage(1).causes["fill"] == 20 and active.stage(0).causes["drain"] == 20


def test_training_fill_and_drain_are_exact_at_epoch_times() -> None:
    """A 1F1B-like step on one stage, placed at 0 and at 2^60 ns (an epoch time in ns, where float64 steps are
    256 ns apart): the warm-up and cool-down move by exactly the offset, to the ns."""
    from ppscope.analysis.steps import ComputeSpans, fill_drain

    def spans(base: int) -> ComputeSpans:
        start = np.array([0, 101, 233, 377], np.int64) + base  # F, F, B, B with odd gaps
        return ComputeSpans(
            group=np.zeros(4, np.int64),
            step=np.zeros(4, np.int64),
            backward=np.array([False, False, True, True]),
            start_ns=start,
            end_ns=start + 97,
        )

    at_zero = fill_drain(spans(0), 1, 0, 1_000, flush=True)[0]
    base = 1 << 60
    at_epoch = fill_drain(spans(base), 1, base, base + 1_000, flush=True)[0]
    for near, far in zip(at_zero, at_epoch, strict=True):
        assert far.start_ns.tolist() == [s + base for s in near.start_ns.tolist()]
        assert far.end_ns.tolist() == [e + base for e in near.end_ns.tolist()]
    fill = at_zero[0]
    assert (198, 233) in zip(fill.start_ns.tolist(), fill.end_ns.tolist(), strict=True)  # last forward to first B


_SPAN = st.tuples(st.integers(-50, 200), st.integers(0, 60)).map(lambda p: (p[0], p[0] + p[1]))


@settings(max_examples=200, deadline=None)
@given(st.lists(_SPAN, max_size=12), st.lists(_SPAN, min_size=1, max_size=8))
def test_covered_within_is_the_union_clipped_to_each_window(
    spans: list[tuple[int, int]], windows: list[tuple[int, int]]
) -> None:
    iv = Intervals(np.array([a for a, _ in spans], np.int64), np.array([b for _, b in spans], np.int64))
    lo, hi = np.array([a for a, _ in windows], np.int64), np.array([b for _, b in windows], np.int64)
    want = [union_length(clip(iv, a, b)) for a, b in windows]
    assert covered_within(iv, lo, hi).tolist() == want
