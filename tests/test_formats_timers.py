"""Megatron-style pipeline timer traces (a Chrome trace of each timed pipeline operation): detection, the
reader's ranks, stages, replicas, steps and peers, the forms of the file, and what `analyze` finds in the
fixtures of `tests/data/megatron-timers/` (written by `scripts/megatron_timers.py` from the format)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest
from error_helpers import cli_error, raises_code

from ppscope.analysis.placement import apply_placement, placement_of
from ppscope.analysis.replicas import analyze_replicas
from ppscope.cli.main import main
from ppscope.errors import ErrorCode, UnsupportedInputError
from ppscope.formats.detect import InputKind, detect
from ppscope.formats.sources import open_trace
from ppscope.formats.timers.reader import load_timers
from ppscope.trace.model import SpanKind, Trace
from ppscope.trace.notices import NoticeCode

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "megatron-timers"
LAST_STAGE_SLOW = DATA / "last-stage-slow.json.gz"
ONE_RANK_SLOW = DATA / "one-rank-slow.json.gz"
KINETO = ROOT / "tests" / "data" / "pipelining" / "1f1b" / "rank-0.json.gz"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("megatron_timers", ROOT / "scripts" / "megatron_timers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["megatron_timers"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def _replicas(trace: Trace) -> Any:
    placement = placement_of(trace)
    assert placement is not None
    return analyze_replicas(apply_placement(trace, placement), placement)


def test_the_fixtures_are_what_the_generator_writes_now(tmp_path: Path) -> None:
    for path, job in ((LAST_STAGE_SLOW, GEN.LAST_STAGE_SLOW), (ONE_RANK_SLOW, GEN.ONE_RANK_SLOW)):
        fresh = GEN.write_trace(tmp_path / path.name, job)
        assert json.loads(gzip.decompress(fresh.read_bytes())) == json.loads(gzip.decompress(path.read_bytes()))


def test_a_bare_array_and_a_timer_object_are_timer_traces_and_kineto_stays_kineto(tmp_path: Path) -> None:
    assert detect(LAST_STAGE_SLOW).kind == InputKind.TIMERS
    obj = GEN.write_trace(tmp_path / "t.json", GEN.Job(replicas=1, stages=2, microbatches=2, steps=1), form="object")
    assert detect(obj).kind == InputKind.TIMERS
    assert detect(KINETO).kind == InputKind.KINETO
    plain = tmp_path / "kineto.json"  # a Kineto-shaped object without timer names still goes to the Kineto reader
    plain.write_text(
        json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]})
    )
    assert detect(plain).kind == InputKind.KINETO
    assert open_trace(KINETO).meta.source == "kineto"


def test_the_reader_gives_ranks_stages_replicas_steps_and_microbatches() -> None:
    trace = open_trace(LAST_STAGE_SLOW)
    meta = trace.meta
    assert meta.source == "timers" and meta.schedule == "1f1b"
    assert (meta.world_size, meta.pp_size, meta.microbatches, meta.chunks) == (8, 4, 8, 1)
    # Megatron's layout: rank = stage × DP + replica (TP 1)
    assert [(i.rank, i.stage, i.replica) for i in meta.ranks] == [(r, r // 2, r % 2) for r in range(8)]
    s = trace.spans
    assert sorted(s["step"].unique().tolist()) == [1, 2]
    fwd = s[s["kind"] == SpanKind.FORWARD]
    assert len(fwd) == 8 * 8 * 2 and fwd.groupby(["rank", "step"])["mb"].nunique().eq(8).all()
    assert len(s[s["kind"] == SpanKind.BACKWARD]) == 8 * 8 * 2
    assert set(s.loc[s["kind"] == SpanKind.COLLECTIVE, "name"]) >= {"grads-reduce-scatter", "params-all-gather"}
    assert set(s.loc[s["kind"] == SpanKind.OPTIMIZER, "name"]) == {"optimizer", "optimizer-clip-main-grad"}
    assert set(s.loc[s["name"] == "gc", "kind"]) == {SpanKind.HOST}
    notes = [w for w in trace.warnings if w.code == NoticeCode.TIMER_PLACEMENT]
    assert len(notes) == 1 and "one replica per process" in notes[0].text


def test_sends_and_receives_name_their_neighbour_in_the_same_replica() -> None:
    trace = open_trace(LAST_STAGE_SLOW)
    place = {i.rank: (i.stage, i.replica) for i in trace.meta.ranks}
    s = trace.spans
    toward = {"forward-send": 1, "forward-recv": -1, "backward-send": -1, "backward-recv": 1}
    toward |= {"forward-send-backward-recv": 1, "backward-send-forward-recv": -1}
    talk = s[s["name"].isin(list(toward))]
    assert len(talk) and (talk["peer"] >= 0).all()
    for rank, name, peer in talk[["rank", "name", "peer"]].itertuples(index=False):
        (stage, rep), (peer_stage, peer_rep) = place[rank], place[peer]
        assert peer_rep == rep and peer_stage == stage + toward[name]
    assert set(talk.loc[talk["name"].str.endswith("recv"), "kind"]) == {SpanKind.RECV_WAIT}


def test_array_object_and_gzip_forms_read_the_same(tmp_path: Path) -> None:
    job = GEN.Job(replicas=2, stages=2, microbatches=4, steps=2)
    frames = [
        load_timers(GEN.write_trace(tmp_path / name, job, form=form)).spans
        for name, form in (("a.json", "array"), ("o.json", "object"), ("a.json.gz", "array"), ("o.json.gz", "object"))
    ]
    for other in frames[1:]:
        pd.testing.assert_frame_equal(frames[0], other)


def test_analyze_names_the_slow_last_stage_the_bottleneck() -> None:
    ra = _replicas(open_trace(LAST_STAGE_SLOW))
    assert ra.bottleneck is not None and ra.bottleneck[0] == 3
    per_stage = {st.stage: st.median_ns for st in ra.stages}
    assert per_stage[3] == pytest.approx(345e6, rel=1e-3) and per_stage[0] == pytest.approx(212e6, rel=1e-3)
    result = ra.results[ra.shown_replica]
    assert result.bottleneck_stage == 3


def test_analyze_names_the_one_slow_rank_the_straggler() -> None:
    ra = _replicas(open_trace(ONE_RANK_SLOW))
    assert ra.bottleneck == (1, 1, 3)  # stage 1 of replica 1, rank 3
    spread = {st.stage: st for st in ra.stages}[1]
    assert (spread.straggler_replica, spread.straggler_rank) == (1, 3)
    assert spread.slowest_ns == pytest.approx(424e6, rel=1e-3)


def test_the_cli_prints_the_bottleneck_stage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(LAST_STAGE_SLOW)]) == 0
    out = capsys.readouterr().out
    assert "bottleneck: stage 3" in out and "2 data-parallel pipelines × 4 stages" in out


def _write(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(events))
    return path


def test_a_chrome_array_without_pipeline_events_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path / "other.json", [{"ph": "X", "name": "load", "pid": 0, "tid": 0, "ts": 1.5, "dur": 3.0}])
    with raises_code(UnsupportedInputError, ErrorCode.NOT_A_TRACE) as err:
        open_trace(path)
    assert "\n" not in str(err.value)
    failed = cli_error(capsys, ["analyze", str(path)])
    assert failed.exit_code == 2 and failed.code == ErrorCode.NOT_A_TRACE
    assert failed.err.count("\n") == 1 and "forward-compute" in failed.text  # the events it looks for


def _x(name: str, pid: int, tid: int, ts: float, dur: float, **args: int) -> dict[str, Any]:
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": {"step": 1, **args}}


def test_model_chunks_make_virtual_stages_and_an_interleaved_schedule(tmp_path: Path) -> None:
    meta = [
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": t, "args": {"name": f"PP rank {t}, TP rank 0, compute"}}
        for t in range(2)
    ]
    ops = [
        _x("forward-compute", 0, 0, 0.0, 1.0, mb_id=0, model_chunk=0),
        _x("forward-compute", 0, 1, 1.5, 1.0, mb_id=0, model_chunk=0),
        _x("forward-compute", 0, 0, 3.0, 1.0, mb_id=0, model_chunk=1),
        _x("forward-compute", 0, 1, 4.5, 1.0, mb_id=0, model_chunk=1),
        _x("backward-compute", 0, 1, 6.0, 2.0, mb_id=0, model_chunk=1),
        _x("backward-compute", 0, 0, 8.5, 2.0, mb_id=0, model_chunk=1),
        _x("forward-send", 0, 1, 5.6, 0.2, mb_id=0, model_chunk=0),  # virtual stage 1 → 2: back to PP rank 0
    ]
    trace = load_timers(_write(tmp_path / "vpp.json", meta + ops))
    assert trace.meta.schedule == "interleaved-1f1b" and trace.meta.chunks == 2
    f = trace.spans[trace.spans["kind"] == SpanKind.FORWARD]
    assert sorted(zip(f["rank"], f["chunk"], f["stage"], strict=True)) == [(0, 0, 0), (0, 1, 2), (1, 0, 1), (1, 1, 3)]
    send = trace.spans[trace.spans["kind"] == SpanKind.SEND]
    assert send["peer"].tolist() == [0]


def test_lanes_without_a_pp_rank_leave_each_process_one_rank_for_stage_of_rank(tmp_path: Path) -> None:
    ops = [_x("forward-compute", p, 0, 2.0 * p, 1.0, mb_id=0) for p in range(4)]
    trace = load_timers(_write(tmp_path / "bare.json", ops))
    assert [i.rank for i in trace.meta.ranks] == [0, 1, 2, 3] and {i.stage for i in trace.meta.ranks} == {-1}
    notes = [w.text for w in trace.warnings if w.code == NoticeCode.TIMER_PLACEMENT]
    assert len(notes) == 1 and "--stage-of-rank" in notes[0]


def test_pp_ranks_in_args_place_the_lanes(tmp_path: Path) -> None:
    ops = [_x("forward-compute", 7, 0, 0.0, 1.0, mb_id=0, pp_rank=1), _x("forward-compute", 7, 1, 2.0, 1.0, pp_rank=0)]
    trace = load_timers(_write(tmp_path / "args.json", ops))
    assert [(i.rank, i.stage) for i in trace.meta.ranks] == [(0, 0), (1, 1)]
    assert "in the args" in next(w.text for w in trace.warnings if w.code == NoticeCode.TIMER_PLACEMENT)


def test_events_without_numeric_times_are_left_out_and_said(tmp_path: Path) -> None:
    ops = [_x("forward-compute", 0, 0, 0.0, 1.0, pp_rank=0), {**_x("backward-compute", 0, 0, 0.0, 1.0), "ts": "soon"}]
    trace = load_timers(_write(tmp_path / "odd.json", ops))
    assert len(trace.spans) == 1
    assert any(w.code == NoticeCode.TIMER_EVENTS_LEFT_OUT for w in trace.warnings)


def test_every_forward_before_the_first_backward_is_gpipe(tmp_path: Path) -> None:
    ops = [
        _x("forward-compute", 0, 0, 0.0, 1.0, mb_id=0, pp_rank=0),
        _x("forward-compute", 0, 0, 1.5, 1.0, mb_id=1, pp_rank=0),
        _x("backward-compute", 0, 0, 5.0, 2.0, mb_id=0, pp_rank=0),
        _x("backward-compute", 0, 0, 7.5, 2.0, mb_id=1, pp_rank=0),
    ]
    trace = load_timers(_write(tmp_path / "gpipe.json", ops))
    assert (trace.meta.schedule, trace.meta.microbatches) == ("gpipe", 2)


def test_a_replica_without_one_of_its_stages_still_reads(tmp_path: Path) -> None:
    names = [(0, 1, 1), (1, 0, 2), (1, 1, 3)]  # (pid, PP rank, tid): replica 0 has no stage 0, rank 0
    meta = [
        {"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": f"PP rank {s}, TP rank 0, compute"}}
        for p, s, t in names
    ]
    ops = [_x("forward-compute", p, t, 1.0 * t, 1.0, mb_id=0) for p, _, t in names]
    trace = load_timers(_write(tmp_path / "gap.json", meta + ops))
    assert sorted((i.rank, i.stage, i.replica) for i in trace.meta.ranks) == [(1, 0, 1), (2, 1, 0), (3, 1, 1)]


def test_the_field_trace_reads_as_the_issue_asks_bottleneck_tail_and_what_ifs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """2 replicas x 4 stages, the last 1.6x slower: stage 3 is the bottleneck, the step's tail is dp_sync and
    optimizer (not drain), and what_if.balanced is the replay of the balanced costs, called directly."""
    from ppscope.simulate.whatif import balanced_costs, read_job, replay_job

    path = DATA / "last-stage-slow.json.gz"
    assert main(["analyze", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bottleneck_stage"] == 3
    tail = {c: sum(s["causes"][c] for s in d["stages"]) for c in ("dp_sync", "optimizer")}  # the detailed replica
    assert tail["dp_sync"] > 0 and tail["optimizer"] > 0
    trace = open_trace(path)
    placement = placement_of(trace)
    job, why = read_job(apply_placement(trace, placement) if placement else trace, placement)
    assert job is not None, why
    direct = replay_job(job, job.costs) / replay_job(job, balanced_costs(job.costs))
    assert d["what_if"]["balanced"]["speedup"] == pytest.approx(direct, rel=0.02)

    assert main(["analyze", str(DATA / "one-rank-slow.json.gz"), "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["what_if"]
    assert w["straggler"]["stage"] == 1 and w["straggler"]["replica"] == 1 and w["straggler"]["ranks"]
    assert w["no_straggler"]["speedup"] > w["balanced"]["speedup"]


def test_the_replicas_of_a_stage_are_not_added_together_in_its_costs(capsys: pytest.CaptureFixture[str]) -> None:
    """Each replica runs the stage's pass on the same step and micro-batch ids: a pass costs what one rank took
    (their mean), not their sum, so the advice's stage times are the trace's 212 and 345 ms."""
    argv = ["rebalance", str(DATA / "last-stage-slow.json.gz"), "--current-split", "8,8,8,8", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["measured_stage_ms"] == pytest.approx([212.0, 212.0, 212.0, 345.0])
    assert d["job"] == "training" and d["proposed_split"][-1] < 8
