"""Recorded runs for the dashboard tests, and the dashboard's loading layer (tailing, memo, vanished runs).

`record_gpipe_run` writes a small GPipe-shaped run through the real store (create_run + RankWriter), so
the other dashboard tests can import it: P ranks, M micro-batches, per micro-batch a recv wait (not on
rank 0), a forward and a send (not on the last rank), plus CPU counters and, optionally, requests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ppscope.dashboard.data import LiveTrace
from ppscope.trace.model import Metric, RankInfo, RunMeta
from ppscope.trace.store import REQUESTS_FILE, RankWriter, create_run, read_meta, write_meta

FWD_NS = 100_000  # 100 µs per forward
SEND_NS = 20_000


def gpipe_spans(
    rank: int, p: int, m: int, *, step: int = 0, t0: int = 0, fwd_ns: list[int] | None = None
) -> list[tuple[object, ...]]:
    """Spans of one rank in schema order: each micro-batch waits for the previous stage, runs, sends on.

    fwd_ns: forward time of each stage (default FWD_NS everywhere); a slower stage holds up the ones after it.
    """
    fwd = fwd_ns or [FWD_NS] * p
    end = [[0] * m for _ in range(p)]  # end of each forward, per stage and micro-batch
    rows: list[tuple[object, ...]] = []
    for r in range(rank + 1):
        for mb in range(m):
            ready = t0 if r == 0 else end[r - 1][mb] + SEND_NS
            free = t0 if mb == 0 else end[r][mb - 1] + (SEND_NS if r < p - 1 else 0)
            start = max(ready, free)
            end[r][mb] = start + fwd[r]
            if r != rank:
                continue

            def row(lane: str, kind: str, a: int, b: int, nbytes: int, peer: int, mb: int = mb) -> tuple[object, ...]:
                return (rank, rank, lane, kind, kind, mb, step, 0, "prefill", a, b, nbytes, 8, peer)

            if rank > 0:
                rows.append(row("recv", "recv_wait", min(free, start), start, 4096, rank - 1))
            rows.append(row("compute", "forward", start, end[r][mb], 0, -1))
            if rank < p - 1:
                rows.append(row("send", "send", end[r][mb], end[r][mb] + SEND_NS, 4096, rank + 1))
    return rows


def span_count(p: int, m: int) -> int:
    return p * m + 2 * (p - 1) * m


def record_gpipe_run(
    run_dir: Path,
    *,
    p: int = 2,
    m: int = 4,
    status: str = "finished",
    requests: int = 0,
    steps: int = 1,
    fwd_ns: list[int] | None = None,
    gpu: bool = False,
) -> Path:
    """`gpu`: each rank also samples its GPU's (device = rank) utilisation and memory, as NVML gives them."""
    meta = RunMeta(
        run_id=run_dir.name,
        status=status,
        world_size=p,
        pp_size=p,
        schedule="gpipe",
        microbatches=m,
        split=[2] * p,
        ranks=[RankInfo(rank=r, stage=r, device="cpu") for r in range(p)],
    )
    create_run(run_dir, meta)
    for rank in range(p):
        writer = RankWriter(run_dir, rank)
        step_ns = (m + p) * (max(fwd_ns or [FWD_NS]) + SEND_NS)
        spans = [row for s in range(steps) for row in gpipe_spans(rank, p, m, step=s, t0=s * step_ns, fwd_ns=fwd_ns)]
        counters = [(i * 50_000, rank, -1, str(Metric.CPU_UTIL_PCT), 50.0 + 10 * rank) for i in range(10)]
        if gpu:
            counters += [(i * 50_000, rank, rank, str(Metric.GPU_UTIL_PCT), 80.0) for i in range(10)]
            counters += [
                (i * 50_000, rank, rank, str(Metric.GPU_MEM_USED_BYTES), (rank + 1) * 2.0**30) for i in range(10)
            ]
        writer.write(spans, counters)
        writer.close()
    if requests:
        with open(run_dir / REQUESTS_FILE, "w") as f:
            for i in range(requests):
                arrival = i * 10_000
                rec = {
                    "id": i,
                    "prompt_len": 8,
                    "output_len": 4,
                    "arrival_ns": arrival,
                    "first_token_ns": arrival + 200_000 + i * 1_000,
                    "finish_ns": arrival + 500_000 + i * 3_000,
                }
                f.write(json.dumps(rec) + "\n")
    return run_dir


def test_live_trace_reads_only_what_arrives(tmp_path: Path) -> None:
    run = tmp_path / "run"
    meta = RunMeta(world_size=1, pp_size=1, status="running")
    create_run(run, meta)
    writer = RankWriter(run, 0)
    writer.write(gpipe_spans(0, 1, 3))
    live = LiveTrace(run, is_run=True)
    first = live.refresh()
    assert len(first.spans) == 3 and live.live and live.version == 1
    assert live.refresh() is first and live.version == 1  # nothing new: same object, no reload
    writer.write(gpipe_spans(0, 1, 2, step=1, t0=10_000_000))
    second = live.refresh()
    assert len(second.spans) == 5 and live.version == 2
    assert second.spans["start_ns"].is_monotonic_increasing
    writer.close()
    write_meta(run, RunMeta(**{**vars(read_meta(run)), "status": "finished"}))
    live.refresh()
    assert not live.live and live.version == 3


def test_memo_recomputes_only_after_new_data(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run")
    live = LiveTrace(run, is_run=True)
    live.refresh()
    calls: list[int] = []

    def count(trace: object) -> int:
        calls.append(1)
        return len(calls)

    assert live.memo("n", count) == 1
    live.refresh()
    assert live.memo("n", count) == 1 and len(calls) == 1


def test_deleted_run_gives_a_message_and_keeps_the_last_data(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run", status="running")
    live = LiveTrace(run, is_run=True)
    assert len(live.refresh().spans) == span_count(2, 4)
    shutil.rmtree(run)
    trace = live.refresh()
    assert len(trace.spans) == span_count(2, 4)
    assert "does not exist" in live.error and "showing what was read before" in live.error
    assert not live.live  # stops refreshing


def test_truncated_rank_file_gives_a_message(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run")
    (run / "rank-00001.sqlite").write_bytes(b"not sqlite at all")
    live = LiveTrace(run, is_run=True)
    trace = live.refresh()
    assert len(trace.spans) == 0
    assert "rank-00001.sqlite" in live.error
    assert not live.live  # the run says it finished: no point refreshing


@pytest.mark.parametrize("requests", [0, 5])
def test_recorded_run_round_trips(tmp_path: Path, requests: int) -> None:
    run = record_gpipe_run(tmp_path / "run", p=3, m=2, requests=requests)
    trace = LiveTrace(run, is_run=True).refresh()
    assert len(trace.spans) == span_count(3, 2)
    assert len(trace.requests) == requests


def test_rank_file_being_created_does_not_stop_a_live_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    create_run(run, RunMeta(world_size=1, status="running"))
    (run / "rank-00000.sqlite").touch()  # created, header not written yet
    live = LiveTrace(run, is_run=True)
    assert len(live.refresh().spans) == 0
    assert "rank-00000.sqlite" in live.error
    assert live.live, "a running run keeps refreshing through a transient read error"
    (run / "rank-00000.sqlite").unlink()
    writer = RankWriter(run, 0)
    writer.write(gpipe_spans(0, 1, 2))
    assert len(live.refresh().spans) == 2 and live.error == ""
    writer.close()


def test_run_replaced_at_the_same_path_is_read_again(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run", p=2, m=4)
    live = LiveTrace(run, is_run=True)
    assert len(live.refresh().spans) == span_count(2, 4)
    shutil.rmtree(run)
    record_gpipe_run(run, p=2, m=2)  # a new run: same path and name, another creation time, row ids start again
    assert len(live.refresh().spans) == span_count(2, 2)


def test_clock_offsets_written_late_are_applied_to_rows_read_before(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run", p=2, m=2, status="running")
    live = LiveTrace(run, is_run=True)
    before = live.refresh().spans
    meta = read_meta(run)
    meta.ranks[1].clock.offset_ns = 5_000
    write_meta(run, meta)
    after = live.refresh().spans
    r1_before = before[before["rank"] == 1]["start_ns"].to_numpy()
    r1_after = after[after["rank"] == 1]["start_ns"].to_numpy()
    assert len(after) == len(before) and (r1_after == r1_before - 5_000).all()
