"""`analyze_run` (a run read a rank or a stage at a time, in worker processes) equals `analyze(load_run(...))`
to the nanosecond, on every kind of run: every key of the JSON result, every gap."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from error_helpers import cli_error, raises_code

from ppscope.analysis import AnalysisConfig, AnalysisResult, analyze
from ppscope.analysis.sharded import analyze_run
from ppscope.balance.costs import LayerCosts
from ppscope.cli.main import main
from ppscope.errors import CorruptFileError, ErrorCode, InvalidConfigError
from ppscope.formats.sources import open_trace
from ppscope.simulate.simulator import CommModel, SimConfig, simulate, write_run
from ppscope.trace.model import ClockInfo, RankInfo, Trace
from ppscope.trace.notices import NoticeCode
from ppscope.trace.store import load_run, rank_file

sys.path.insert(0, str(Path(__file__).parent))
from replica_helpers import replica_job
from test_analysis_causes_per_step import _training
from test_formats_pipelining import _write, gpipe_cpu


def _same(a: AnalysisResult, b: AnalysisResult) -> None:
    assert json.dumps(a.to_json(), sort_keys=True) == json.dumps(b.to_json(), sort_keys=True)
    pd.testing.assert_frame_equal(a.gaps, b.gaps)


def _sim(tmp: Path, **kw: Any) -> Path:
    virtual = kw["stages"] * kw.get("chunks", 1)
    trace = simulate(SimConfig(costs=LayerCosts.uniform(2 * virtual, 1.0, head_ms=0.7), **kw))
    return write_run(trace, tmp / "run")


RUNS: dict[str, dict[str, Any]] = {
    "gpipe": dict(schedule="gpipe", stages=4, microbatches=8, steps=3, speed=(1.0, 0.7, 1.0, 1.2)),
    "interleaved": dict(schedule="interleaved", stages=2, microbatches=4, chunks=3, steps=2, prefill_factor=2.0),
    "serve": dict(
        schedule="serve",
        stages=3,
        microbatches=2,
        steps=6,
        overhead_ms=0.05,
        comm=CommModel(latency_us=20.0, activation_bytes=4096, bandwidth_gb_per_s=10.0),
    ),
    "one-stage": dict(schedule="gpipe", stages=1, microbatches=3, steps=2),
}


@pytest.mark.parametrize("name", list(RUNS))
@pytest.mark.parametrize(
    "config",
    [AnalysisConfig(), AnalysisConfig(steady=True), AnalysisConfig(active=True), AnalysisConfig(window_ms=(1.0, 4.0))],
    ids=["full", "steady", "active", "window"],
)
def test_simulated_runs_read_rank_by_rank_give_the_same_result(
    name: str, config: AnalysisConfig, tmp_path: Path
) -> None:
    run = _sim(tmp_path, **RUNS[name])
    _same(analyze(load_run(run), config), analyze_run(run, config))


def test_worker_processes_give_the_same_result(tmp_path: Path) -> None:
    run = _sim(tmp_path, **RUNS["serve"])
    _same(analyze(load_run(run)), analyze_run(run, workers=2))


@pytest.mark.parametrize("order", ["gpipe", "1f1b"])
def test_training_runs_give_the_same_result(order: str, tmp_path: Path) -> None:
    # training steps flush, so fill and drain need every stage's step ends: the merged waves
    run = write_run(_training(4, 6, order, steps=2, slow_last_backward=True), tmp_path / "run")
    _same(analyze(load_run(run)), analyze_run(run))


def test_an_imported_pipelining_trace_written_as_a_run_gives_the_same_result(tmp_path: Path) -> None:
    # action ranges (host inside actions), kernels, waits and sends with peers, a CPU trace's clocks
    trace = open_trace(_write(tmp_path / "k", gpipe_cpu()))
    run = write_run(dataclasses.replace(trace, warnings=[]), tmp_path / "run")
    _same(analyze(load_run(run)), analyze_run(run))


def test_estimated_clocks_are_checked_for_causality_pair_by_pair(tmp_path: Path) -> None:
    trace = simulate(SimConfig(schedule="gpipe", stages=3, microbatches=4, costs=LayerCosts.uniform(6, 1.0)))
    # rank 2's offset was "estimated" 5 ms wrong: its receives now end before their sends start
    meta = dataclasses.replace(
        trace.meta, ranks=[RankInfo(rank=r, clock=ClockInfo(method="ping-pong", uncertainty_ns=1000)) for r in range(3)]
    )
    spans = trace.spans.copy()
    late = spans["rank"] == 2
    spans.loc[late, ["start_ns", "end_ns"]] -= 5_000_000
    run = write_run(Trace(spans=spans, meta=meta, requests=trace.requests, counters=trace.counters), tmp_path / "r")
    whole, sharded = analyze(load_run(run)), analyze_run(run, workers=2)
    assert NoticeCode.CLOCK_SKEW in {w.code for w in sharded.warnings}
    _same(whole, sharded)


def test_a_missing_rank_file_is_named_and_the_rest_analyse(tmp_path: Path) -> None:
    run = _sim(tmp_path, **RUNS["gpipe"])
    rank_file(run, 2).unlink()
    whole, sharded = analyze(load_run(run)), analyze_run(run)
    assert sharded.missing is not None and sharded.missing.code == NoticeCode.MISSING_RANKS
    assert "rank 2 " in sharded.missing.text and sharded.missing == whole.missing  # names the rank, once
    assert sharded.missing not in sharded.warnings and sharded.unknown_stages == [2]
    _same(whole, sharded)


def test_a_damaged_rank_file_is_left_out_and_named_as_load_run_does(tmp_path: Path) -> None:
    run = _sim(tmp_path, **RUNS["gpipe"])
    rank_file(run, 1).write_bytes(b"not a database at all" * 100)
    whole, sharded = analyze(load_run(run)), analyze_run(run, workers=2)
    assert sharded.missing is not None and sharded.missing.code == NoticeCode.MISSING_RANKS
    (damaged,) = [n.text for n in sharded.warnings if n.code == NoticeCode.DAMAGED_FILE]
    assert "rank 1" in damaged  # names the rank
    _same(whole, sharded)
    for r in (0, 2, 3):  # nothing left to read: the error, as load_run raises it
        rank_file(run, r).write_bytes(b"")
    with pytest.raises(CorruptFileError) as sharded_error:
        analyze_run(run)
    with pytest.raises(CorruptFileError) as whole_error:
        load_run(run)
    assert str(sharded_error.value) == str(whole_error.value)


def test_workers_must_be_positive(tmp_path: Path) -> None:
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        analyze_run(_sim(tmp_path, **RUNS["one-stage"]), workers=0)


def test_the_command_gives_the_same_json_with_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _sim(tmp_path, **RUNS["gpipe"])
    assert main(["analyze", str(run), "--json", "--steady"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main(["analyze", str(run), "--json", "--steady", "--workers", "2"]) == 0
    assert json.loads(capsys.readouterr().out) == whole


@pytest.mark.parametrize(
    ("extra", "code"),
    [(["--html", "r.html"], ErrorCode.CONFLICTING_OPTIONS), ([], ErrorCode.CONFLICTING_OPTIONS)],
    ids=["html", "not-a-run"],
)
def test_the_command_refuses_workers_where_they_cannot_serve(
    extra: list[str], code: ErrorCode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = _sim(tmp_path, **RUNS["one-stage"]) if extra else _write(tmp_path / "k", gpipe_cpu())
    html = [*extra[:1], str(tmp_path / extra[1])] if extra else []
    failed = cli_error(capsys, ["analyze", str(target), "--workers", "2", *html])
    assert failed.exit_code == 2 and failed.code == code and "--workers" in failed.text
    assert "Traceback" not in failed.err and failed.err.count("\n") == 1


def test_gaps_can_be_left_out_and_nothing_else_changes(tmp_path: Path) -> None:
    run = _sim(tmp_path, **RUNS["gpipe"])
    whole, lean = analyze(load_run(run)), analyze_run(run, gaps=False)
    assert len(whole.gaps) > 0 and lean.gaps.empty
    assert json.dumps(whole.to_json(), sort_keys=True) == json.dumps(lean.to_json(), sort_keys=True)


@pytest.mark.parametrize("spec", [None, "rank//6"])
def test_replicas_read_rank_by_rank_give_the_same_comparison(
    spec: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 4 stages x 6 replicas, stage-major; stage 2 of replica 4 slowed; one rank file missing, one damaged
    run = write_run(replica_job(4, 6, slow={(2, 4): 1.3}, say_replica=spec is None), tmp_path / "job")
    (run / "rank-00001.sqlite").unlink()
    (run / "rank-00020.sqlite").write_bytes(b"not a database" * 100)
    extra = ["--stage-of-rank", spec] if spec else []
    assert main(["analyze", str(run), "--json", *extra]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main(["analyze", str(run), "--json", "--workers", "2", *extra]) == 0
    sharded = json.loads(capsys.readouterr().out)
    assert sharded == whole
    assert sharded["replicas"]["bottleneck"] == {"stage": 2, "replica": 4, "rank": 16}
    assert sharded["replicas"]["missing_ranks"] == [1, 20]
    assert main(["analyze", str(run), "--workers", "1", *extra]) == 0
    assert "rank 20's file is damaged" in capsys.readouterr().out


def test_the_scale_benchmarks_job_analyses_the_same_both_ways(tmp_path: Path) -> None:
    from benchmarks.bench_scale import write_job

    write_job(tmp_path / "job", ranks=5, spans=400)  # the benchmark's job, small
    _same(analyze(load_run(tmp_path / "job")), analyze_run(tmp_path / "job", workers=2))


def test_micro_batch_ids_travel_packed_as_runs_and_come_back_whole() -> None:
    """A rank's micro-batch ids go back to the driver as runs of consecutive ids where that is smaller."""
    import numpy as np

    from ppscope.analysis.sharded import id_runs, run_ids

    rng = np.random.default_rng(0)
    cases = [
        np.arange(12_500),
        np.r_[np.arange(5, 100), np.arange(200, 300), [500]],
        np.arange(0, 100, 2),
        np.unique(rng.integers(-5, 100, 60)),
        np.array([7]),
        np.array([], np.int64),
    ]
    for ids in cases:
        packed = id_runs(ids)
        assert np.array_equal(run_ids(packed), ids) and packed.nbytes <= ids.astype(np.int64).nbytes
    assert id_runs(np.arange(12_500)).tolist() == [[0, 12_499]]
