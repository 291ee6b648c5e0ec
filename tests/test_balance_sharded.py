"""`ppscope rebalance RUN` reads a run directory a rank at a time (`run_timings`, in worker processes) and gives
the same JSON, key for key and to the last digit, as the costs computed from the whole trace in memory: on
simulated inference runs, training runs (full, split and interleaved backward, Kineto-style kernels), data-
parallel replicas, in-situ layer spans, an imported trace written as a run, and several runs at once."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from error_helpers import raises_code

from ppscope.balance.costs import LayerCosts
from ppscope.balance.measured import timings
from ppscope.balance.measured.choose import run_costs
from ppscope.balance.measured.timings import RunTimings, run_timings
from ppscope.cli.main import main
from ppscope.errors import CorruptFileError, ErrorCode, InvalidConfigError
from ppscope.formats.sources import open_trace
from ppscope.simulate.simulator import SimConfig, simulate, write_run
from ppscope.trace.model import Trace, spans_frame
from ppscope.trace.notices import NoticeCode
from ppscope.trace.store import load_run, rank_file

sys.path.insert(0, str(Path(__file__).parent))
from replica_helpers import replica_job
from test_balance_training_costs import _trace as training_run
from test_formats_pipelining import _write, gpipe_cpu

COSTS = LayerCosts(layer_ms=tuple(1.0 + 0.1 * i for i in range(6)), embed_ms=0.3, head_ms=0.7, sample_ms=0.2)


def _sim(schedule: str, steps: int, **kw: Any) -> Trace:
    return simulate(SimConfig(schedule=schedule, stages=3, microbatches=3, steps=steps, costs=COSTS, **kw))


def _jitter(trace: Trace, seed: int) -> Trace:
    """Every span up to 20% longer, at random: runs that vary, so that the advice has an interval."""
    spans = trace.spans.copy()
    ns = (spans["end_ns"] - spans["start_ns"]).to_numpy()
    spans["end_ns"] = spans["start_ns"] + (ns * (1 + 0.2 * np.random.default_rng(seed).random(len(spans)))).astype(
        np.int64
    )
    return dataclasses.replace(trace, spans=spans_frame(spans)).sorted()


def _with_layers(trace: Trace, every: int = 2) -> Trace:
    """`layer` spans inside every `every`-th forward, as the engine's `--layer-spans` writes them."""
    spans, split = trace.spans, trace.meta.split
    first = np.cumsum([0, *split])
    rows = []
    forwards = spans[spans["kind"] == "forward"].reset_index(drop=True)
    for i, f in enumerate(forwards.itertuples(index=False)):
        if i % every:
            continue
        step = (f.end_ns - f.start_ns) // (split[f.stage] + 1)
        for j in range(split[f.stage]):
            row = dict(f._asdict())
            start = f.start_ns + j * step
            row.update(
                kind="layer",
                lane="layers",
                name=f"layer {first[f.stage] + j}",
                start_ns=start,
                end_ns=start + step - (j * 997 + i * 31) % 500,
            )
            rows.append(row)
    return dataclasses.replace(trace, spans=spans_frame(pd.concat([spans, pd.DataFrame(rows)]))).sorted()


RUNS = {
    "gpipe": lambda: _jitter(_sim("gpipe", 8, speed=(1.0, 0.7, 1.2)), 0),
    "serve": lambda: _jitter(_sim("serve", 40), 1),
    "training": lambda: _jitter(training_run([2, 3, 2, 1], steps=12), 2),
    "zero-bubble": lambda: training_run([2, 3, 2, 1], steps=6, zero_bubble=True),
    "interleaved-training": lambda: training_run([2, 1, 2, 3], chunks=2, steps=6),
    "kineto": lambda: training_run([2, 3, 2, 1], kernels=True, steps=6),
    "replicas": lambda: replica_job(4, 3, slow={(1, 2): 1.3}),
    "insitu": lambda: _jitter(_with_layers(_sim("serve", 40)), 3),
}
EXTRA = {"kineto": ["--current-split", "2,3,2,1"]}


def _rebalance(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["rebalance", *argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's runs loaded whole (`load_run`), as before it read them rank by rank."""
    monkeypatch.setattr(timings, "run_timings", lambda path, workers=1: RunTimings.of(load_run(path)))


@pytest.mark.parametrize("name", list(RUNS))
def test_rebalance_of_a_run_read_rank_by_rank_equals_the_whole_trace(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = str(write_run(RUNS[name](), tmp_path / "run"))
    sharded = _rebalance(capsys, run, *EXTRA.get(name, []))
    with monkeypatch.context() as m:
        _whole(m)
        assert _rebalance(capsys, run, *EXTRA.get(name, [])) == sharded


def test_the_fixtures_cover_intervals_in_situ_costs_and_training(tmp_path: Path) -> None:
    # the comparison above is worth something only where the runs give these figures
    got = {n: run_costs([RUNS[n]()], None) for n in ("serve", "insitu", "training")}
    assert got["insitu"].source == "insitu" and got["training"].phase == "forward+backward"
    assert got["serve"].fit is not None and got["serve"].fit.phase == "decode"


@pytest.mark.slow
def test_worker_processes_several_runs_and_every_option_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = [str(write_run(RUNS[n](), tmp_path / n)) for n in ("insitu", "serve")]
    for extra in ([], ["--costs", "fit"], ["--phase", "prefill"]):
        sharded = _rebalance(capsys, *runs, "--workers", "2", *extra)
        assert sharded["predicted_interval"] is not None
        with monkeypatch.context() as m:
            _whole(m)
            assert _rebalance(capsys, *runs, *extra) == sharded


def test_an_imported_trace_written_as_a_run_rebalances_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = open_trace(_write(tmp_path / "k", gpipe_cpu()))
    run = str(write_run(dataclasses.replace(trace, warnings=[]), tmp_path / "run"))
    argv = [run, "--current-split", "1,1", "--layer-costs", "1,2"]
    sharded = _rebalance(capsys, *argv)
    with monkeypatch.context() as m:
        _whole(m)
        assert _rebalance(capsys, *argv) == sharded


def test_a_damaged_rank_file_is_left_out_as_load_run_leaves_it(tmp_path: Path) -> None:
    run = write_run(RUNS["replicas"](), tmp_path / "run")
    rank_file(run, 5).write_bytes(b"not a database at all" * 100)
    whole = load_run(run)
    assert [n.text.split("'")[0] for n in whole.warnings if n.code == NoticeCode.DAMAGED_FILE] == ["rank 5"]
    shares, merged = RunTimings.of(whole), run_timings(run, workers=2)
    assert run_costs([merged], None).costs == run_costs([shares], None).costs
    pd.testing.assert_frame_equal(
        merged.spans.astype({"phase": str}).sort_values(["start_ns", "rank", "ns"]).reset_index(drop=True),
        shares.spans.astype({"phase": str}).sort_values(["start_ns", "rank", "ns"]).reset_index(drop=True),
    )
    for r in range(12):  # nothing left to read: the error, as load_run raises it
        rank_file(run, r).write_bytes(b"")
    with pytest.raises(CorruptFileError):
        run_timings(run)
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        run_timings(run, workers=0)
