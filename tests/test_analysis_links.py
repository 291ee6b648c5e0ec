"""Links paired inside the stage tasks (`ppscope.analysis.links`): a sender's sends read alone are the rows the
whole load has, the causality summaries of parts merge into that of the whole, and what a stage task sends
back does not grow with the spans."""

from __future__ import annotations

import dataclasses
import pickle
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import ppscope.analysis.sharded as sharded
from ppscope.analysis import analyze
from ppscope.analysis.links import Violations, causality_warnings, plan_links
from ppscope.analysis.sharded import analyze_run
from ppscope.balance.costs import LayerCosts
from ppscope.simulate.simulator import SimConfig, simulate, write_run
from ppscope.trace.clock import causality_violations
from ppscope.trace.model import ClockInfo, RankInfo, Trace
from ppscope.trace.notices import NoticeCode
from ppscope.trace.rankfile import read_sends
from ppscope.trace.store import load_run, rank_file, run_files

sys.path.insert(0, str(Path(__file__).parent))
from test_analysis_sharded import _same


def _drifting_run(tmp: Path, *, reversed_send: bool = False) -> Path:
    """A gpipe run of 3 stages whose ranks 1 and 2 have estimated clocks, offset and drifting."""
    trace = simulate(SimConfig(schedule="gpipe", stages=3, microbatches=4, steps=2, costs=LayerCosts.uniform(6, 1.0)))
    clocks = {
        1: ClockInfo(offset_ns=-3_000, uncertainty_ns=500, method="ping-pong", drift_ppm=40.0),
        2: ClockInfo(offset_ns=7_000_000, uncertainty_ns=500, method="ping-pong", at_ns=1_000_000),
    }
    meta = dataclasses.replace(trace.meta, ranks=[RankInfo(rank=r, clock=clocks.get(r, ClockInfo())) for r in range(3)])
    spans = trace.spans.copy()
    if reversed_send:  # a damaged file's send that ends before it starts: every reader leaves it out
        first = spans.index[(spans["rank"] == 1) & (spans["kind"] == "send")][0]
        spans.loc[first, "end_ns"] = spans.loc[first, "start_ns"] - 1
    return write_run(Trace(spans=spans, meta=meta, requests=trace.requests, counters=trace.counters), tmp / "run")


def test_a_senders_sends_read_alone_are_the_rows_of_the_whole_load(tmp_path: Path) -> None:
    run = _drifting_run(tmp_path, reversed_send=True)
    meta, _, _ = run_files(run)
    whole = load_run(run).spans
    for sender, to in ((1, [2]), (1, [0, 2]), (2, [1]), (0, [1, 2])):
        mine = whole[(whole["rank"] == sender) & (whole["kind"] == "send") & whole["peer"].isin(to)]
        got = read_sends(rank_file(run, sender), to, meta)
        assert len(got) > 0 or sender == 2
        want = mine[list(got.columns)].sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)
        pd.testing.assert_frame_equal(
            got.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True), want
        )


def test_drifting_estimated_clocks_give_the_same_result_paired_in_the_tasks(tmp_path: Path) -> None:
    run = _drifting_run(tmp_path, reversed_send=True)
    whole = analyze(load_run(run))
    assert NoticeCode.CLOCK_SKEW in {w.code for w in whole.warnings}  # rank 2's offset is 7 ms off
    _same(whole, analyze_run(run, workers=2))


def _messages(rng: np.random.Generator, n: int) -> pd.DataFrame:
    """Sends and their receives between 4 ranks, both ways, times on a coarse grid so that many ties."""
    src = rng.integers(0, 4, n)
    dst = (src + rng.integers(1, 4, n)) % 4
    mb, step = rng.integers(-1, 3, n), rng.integers(0, 2, n)
    posted = rng.integers(0, 10, n) * 1000
    done = posted + rng.integers(-3, 3, n) * 1000
    kind = rng.choice(["recv", "recv_wait"], n)
    sends = pd.DataFrame(
        {"rank": src, "peer": dst, "kind": "send", "mb": mb, "step": step, "start_ns": posted, "end_ns": posted + 10}
    )
    recvs = pd.DataFrame(
        {"rank": dst, "peer": src, "kind": kind, "mb": mb, "step": step, "start_ns": done - 10, "end_ns": done}
    )
    return pd.concat([sends, recvs], ignore_index=True).sort_values(["start_ns", "rank", "end_ns"], kind="stable")


@pytest.mark.parametrize("seed", range(8))
def test_violations_of_each_receivers_links_merge_into_those_of_the_whole(seed: int) -> None:
    spans = _messages(np.random.default_rng(seed), 300)
    bad = causality_violations(spans)
    assert len(bad) > 0
    whole = Violations.of(bad)
    # the worst is the one listed first among the latest, as the warning always said
    early = bad["send_start_ns"] - bad["recv_end_ns"]
    first = bad.loc[early.idxmax()]
    assert whole.worst is not None and whole.worst[4:] == (int(first["mb"]), int(first["step"]))
    assert -whole.worst[0] == int(early.max()) and whole.count == len(bad)
    send = (spans["kind"] == "send").to_numpy()
    receiver = np.where(send, spans["peer"], spans["rank"])
    merged = Violations()
    for d in (3, 1, 0, 2):  # in any order
        merged = merged.merged(Violations.of(causality_violations(spans[receiver == d])))
    assert merged == whole
    assert causality_warnings(merged) == causality_warnings(whole)


def test_links_are_planned_once_each_in_their_receivers_stage() -> None:
    # stage 0: ranks 0 1 (tensor parallel), stage 1: rank 2, stage 2: rank 3; rank 9 recorded nothing here
    sends = {0: {1, 2}, 1: {2}, 2: {0, 3, 9}, 3: {2}}
    plans = plan_links([(0, [0, 1]), (1, [2]), (2, [3])], sends)
    assert [p.senders for p in plans] == [{2: [0]}, {0: [2], 1: [2], 3: [2]}, {2: [3]}]
    assert [p.lone for p in plans] == [[], [9], []]


def _stage_bytes(monkeypatch: pytest.MonkeyPatch, run: Path) -> int:
    """The pickled size of everything the stage tasks of `analyze_run(run)` send back."""
    sizes: list[int] = []
    real = sharded.ordered

    def counting(pool: Any, fn: Callable[..., Any], jobs: Iterable[tuple[Any, ...]], width: int) -> Iterator[Any]:
        for out in real(pool, fn, jobs, width):
            if fn is sharded._stage:
                sizes.append(len(pickle.dumps(out)))
            yield out

    monkeypatch.setattr(sharded, "ordered", counting)
    analyze_run(run, gaps=False)
    return sum(sizes)


def test_what_a_stage_task_sends_back_does_not_grow_with_its_spans(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from benchmarks.bench_scale import write_job

    write_job(tmp_path / "small", ranks=4, spans=800)
    write_job(tmp_path / "large", ranks=4, spans=8_000)
    small, large = _stage_bytes(monkeypatch, tmp_path / "small"), _stage_bytes(monkeypatch, tmp_path / "large")
    assert large < 1.2 * small  # 10x the spans (6,000 point-to-point spans a rank), the same few KB


def test_a_send_holding_a_real_number_is_read_as_the_whole_load_reads_it(tmp_path: Path) -> None:
    import sqlite3

    run = _drifting_run(tmp_path)
    with sqlite3.connect(rank_file(run, 1)) as db:  # SQLite stores any type in any column: a damaged file
        db.execute("UPDATE spans SET nbytes = 4096.5 WHERE id = (SELECT min(id) FROM spans WHERE kind = 'send')")
    meta, _, _ = run_files(run)
    whole = load_run(run).spans
    got = read_sends(rank_file(run, 1), [2], meta)
    mine = whole[(whole["rank"] == 1) & (whole["kind"] == "send")]
    want = mine[list(got.columns)].sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(got.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True), want)
    _same(analyze(load_run(run)), analyze_run(run))
