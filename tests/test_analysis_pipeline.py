"""Pipeline-level figures: per-hop traffic, balance, stage mapping."""

from __future__ import annotations

import pytest

from ppscope.analysis import analyze
from ppscope.analysis.pipeline import count_distinct, hop_stats, message_latencies, stage_imbalance
from ppscope.analysis.result import StageResult
from ppscope.trace.model import RunMeta, Trace


def test_hop_stats_exact() -> None:
    rows = [
        dict(rank=0, kind="send", start_ns=0, end_ns=10, peer=1, nbytes=1000),
        dict(rank=0, kind="send", start_ns=20, end_ns=25, peer=1, nbytes=1000),
        dict(rank=1, kind="recv_wait", start_ns=0, end_ns=4, peer=0),
        dict(rank=1, kind="recv", start_ns=4, end_ns=10, peer=0, nbytes=1000),
        dict(rank=1, kind="recv", start_ns=20, end_ns=24, peer=0, nbytes=1000),
        dict(rank=1, kind="send", start_ns=30, end_ns=31, peer=0, nbytes=8),  # tokens back round the ring
        dict(rank=1, kind="send", start_ns=40, end_ns=41, peer=-1, nbytes=8),  # no peer: left out
    ]
    hops = hop_stats(Trace.from_records(rows).spans)
    assert [(h.src_rank, h.dst_rank) for h in hops] == [(0, 1), (1, 0)]
    h = hops[0]
    assert (h.messages, h.nbytes, h.send_ns, h.recv_ns, h.wait_ns) == (2, 2000, 15, 10, 4)
    assert h.bandwidth_gb_per_s == pytest.approx(2000 / 10)  # bytes per ns = GB/s, over the timed transfer
    back = hops[1]
    assert (back.messages, back.nbytes, back.send_ns) == (1, 8, 1)
    # no `recv` span on this hop: the transfer was not timed, which is not 0 (the time blocked in a send is no
    # transfer time either)
    assert back.recv_ns is None and back.bandwidth_gb_per_s is None
    assert "inside the receive wait" in back.unmeasured["recv_ns"] and set(back.unmeasured) >= {"bandwidth_gb_per_s"}


def test_message_latency_is_post_to_wake_of_a_waiting_receiver() -> None:
    rows = [
        # micro-batch 0, step 0: rank 1 waits from 0; rank 0 posts at 10; rank 1 wakes at 15 -> 5 ns
        dict(rank=1, kind="recv_wait", start_ns=0, end_ns=15, peer=0, mb=0, step=0),
        dict(rank=0, kind="send", start_ns=10, end_ns=12, peer=1, mb=0, step=0),
        # micro-batch 1: rank 1 was busy when it was posted (its wait starts after the post): not a latency
        dict(rank=0, kind="send", start_ns=20, end_ns=22, peer=1, mb=1, step=0),
        dict(rank=1, kind="recv_wait", start_ns=30, end_ns=31, peer=0, mb=1, step=0),
        # the tokens back, their wait labelled with the step they start (as the simulator does): 7 ns
        dict(rank=1, kind="send", start_ns=40, end_ns=41, peer=0, mb=0, step=0),
        dict(rank=0, kind="recv_wait", start_ns=35, end_ns=47, peer=1, mb=0, step=1),
        # a send nobody's wait covers, and an imported-style wait without micro-batch ids: left out
        dict(rank=1, kind="send", start_ns=60, end_ns=61, peer=0, mb=1, step=0),
        dict(rank=0, kind="recv_wait", start_ns=55, end_ns=70, peer=1),
    ]
    spans = Trace.from_records(rows).spans
    lat = message_latencies(spans)
    assert sorted(zip(lat["src"], lat["dst"], lat["latency_ns"], strict=True)) == [(0, 1, 5), (1, 0, 7)]
    assert {(h.src_rank, h.dst_rank): h.latency_ns for h in hop_stats(spans)} == {(0, 1): 5, (1, 0): 7}
    no_ids = [dict(rank=0, kind="send", start_ns=0, end_ns=1, peer=1), dict(rank=1, kind="recv_wait", end_ns=3, peer=0)]
    assert [h.latency_ns for h in hop_stats(Trace.from_records(no_ids).spans)] == [None]


def test_message_latency_pairs_each_wait_with_its_own_post_when_keys_recur() -> None:
    # 2000 messages under one (hop, micro-batch, step) key, as an imported trace without steps or an old serve
    # run gives: each wait pairs with the post inside it, not with the other 1999 (4M pairs, 13G in one run)
    n = 2000
    rows = []
    for i in range(n):
        t = 100 * i
        rows.append(dict(rank=0, kind="send", start_ns=t + 10, end_ns=t + 12, peer=1, mb=0, step=0))
        rows.append(dict(rank=1, kind="recv_wait", start_ns=t, end_ns=t + 10 + i % 7 + 1, peer=0, mb=0, step=0))
    lat = message_latencies(Trace.from_records(rows).spans)
    assert len(lat) == n and sorted(lat["latency_ns"]) == sorted(i % 7 + 1 for i in range(n))


def test_message_latency_is_exact_on_epoch_times_beside_a_wait_that_pairs_with_nothing() -> None:
    t = 1_700_000_000_000_000_000  # nanoseconds since 1970: beyond float64's exact integers
    rows = [
        dict(rank=1, kind="recv_wait", start_ns=t, end_ns=t + 15, peer=0, mb=0, step=0),
        dict(rank=0, kind="send", start_ns=t + 1, end_ns=t + 2, peer=1, mb=0, step=0),
        dict(rank=1, kind="recv_wait", start_ns=t + 100, end_ns=t + 115, peer=0, mb=3, step=0),  # no post
    ]
    assert message_latencies(Trace.from_records(rows).spans)["latency_ns"].tolist() == [14]


def test_hop_stats_without_comm() -> None:
    assert hop_stats(Trace.from_records([dict(rank=0, kind="forward", start_ns=0, end_ns=1)]).spans) == []


def _stage(stage: int, busy: int, per_mb: float | None) -> StageResult:
    return StageResult(
        stage=stage,
        ranks=[stage],
        busy_ns=busy,
        bubble_ns=0,
        bubble_ratio=0.0,
        causes={},
        units=1.0,
        time_per_mb_ns=per_mb,
    )


def test_balance() -> None:
    imb, basis, worst, gain = stage_imbalance([_stage(0, 10, 10.0), _stage(1, 10, 20.0), _stage(2, 10, 30.0)])
    assert basis == "time_per_mb" and worst == 2
    assert imb == pytest.approx(1 - 20 / 30) and gain == pytest.approx(30 / 20)
    imb, basis, worst, gain = stage_imbalance([_stage(0, 10, None), _stage(1, 40, 20.0)])
    assert basis == "busy" and worst == 1 and gain == pytest.approx(40 / 25)
    assert stage_imbalance([]) == (None, "none", None, None)


def test_count_distinct() -> None:
    import numpy as np

    assert count_distinct(np.array([3, 1, 3, 2, 1], np.int64)) == 3
    assert count_distinct(np.array([], np.int64)) == 0


def test_stage_from_span_stage_when_meta_has_none() -> None:
    rows = [
        dict(rank=0, stage=1, kind="forward", start_ns=0, end_ns=10),
        dict(rank=0, stage=3, chunk=1, kind="forward", start_ns=20, end_ns=30),  # virtual stage of chunk 1
        dict(rank=1, stage=0, kind="forward", start_ns=0, end_ns=10),
    ]
    res = analyze(Trace.from_records(rows, meta=RunMeta(world_size=2)))
    assert [(s.stage, s.ranks) for s in res.stages] == [(0, [1]), (1, [0])]
