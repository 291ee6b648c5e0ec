"""A trace that cannot answer the question says so first, or refuses: never a confident figure from part of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from error_helpers import cli_error

from ppscope.analysis import analyze
from ppscope.analysis.report import render_text
from ppscope.balance.costs import LayerCosts
from ppscope.cli.main import main
from ppscope.errors import ErrorCode
from ppscope.formats.sources import open_trace
from ppscope.simulate.simulator import SimConfig, simulate, write_run
from ppscope.trace.notices import NoticeCode


@pytest.fixture
def gpipe_run(tmp_path: Path) -> Path:
    cfg = SimConfig(schedule="gpipe", stages=4, microbatches=8, steps=2, costs=LayerCosts.uniform(8, 1.0))
    return write_run(simulate(cfg), tmp_path / "sim")


def test_a_missing_rank_file_leads_the_report_and_withholds_the_pipelines_figures(gpipe_run: Path) -> None:
    (gpipe_run / "rank-00002.sqlite").unlink()
    result = analyze(open_trace(gpipe_run))
    assert result.missing is not None and result.missing.code == NoticeCode.MISSING_RANKS
    assert result.pp_size == 4 and result.theory.params["P"] == 4  # one P: the pipeline that ran
    assert result.unknown_stages == [2] and [s.stage for s in result.stages] == [0, 1, 3]
    assert result.bubble_ratio is None and result.theory_gap is None  # unknown, not an average of three
    assert result.imbalance is None and result.bottleneck_stage is None and result.balance_speedup is None
    text = render_text(result)
    assert text.startswith(f"incomplete: {result.missing}") and text.count("rank 2 of 4") == 2  # + the table's
    assert "perfect balance would speed" not in text and "gap to theory: " not in text
    assert "warning: rank 2" not in text  # the loader's notice is the same one, named once
    out = result.to_json()
    assert out["missing"] == {"code": "missing_ranks", "text": result.missing.text} and out["pp_size"] == 4
    assert out["stages"][2] == {"stage": 2, **dict.fromkeys(["ranks", "busy_ns", "bubble_ns", "bubble_ratio"])} | {
        "units": None,
        "time_per_mb_ns": None,
        "causes": None,
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["rebalance", "{run}"],
        ["rebalance", "{run}", "--workers", "2"],
        ["rebalance", "{run}", "--layer-costs", ",".join(["1"] * 8)],
        ["simulate", "--from", "{run}", "--out", "{out}"],
    ],
)
def test_every_command_names_the_missing_rank_in_the_same_words(
    argv: list[str], gpipe_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (gpipe_run / "rank-00002.sqlite").unlink()
    named = str(analyze(open_trace(gpipe_run)).missing)
    failed = cli_error(capsys, [a.format(run=gpipe_run, out=tmp_path / "replayed") for a in argv])
    assert failed.exit_code == 2 and failed.code == ErrorCode.MISSING_RANKS
    (err,) = failed.err.strip().splitlines()
    assert err.startswith(f"ppscope {argv[0]}: error: {named}: ")  # the words analyze names them in


def test_a_complete_run_misses_nothing(gpipe_run: Path) -> None:
    result = analyze(open_trace(gpipe_run))
    assert result.missing is None and result.balance_speedup is not None
    assert not render_text(result).startswith("incomplete")


def test_ppscopes_own_chrome_export_is_named_not_analysed_as_empty(
    gpipe_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim.json"
    assert main(["export", str(gpipe_run), "--format", "chrome", "--out", str(out)]) == 0
    capsys.readouterr()
    failed = cli_error(capsys, ["analyze", str(out)])
    assert failed.exit_code == 2 and failed.code == ErrorCode.NOT_A_TRACE  # not NO_SPANS: not read as empty
    assert failed.err.count("\n") == 1 and "sim" in failed.text.replace(str(out), "")  # the run it came from


def test_a_trace_with_no_spans_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0, "args": {}}]}))
    failed = cli_error(capsys, ["analyze", str(empty)])
    assert failed.exit_code == 2 and failed.code == ErrorCode.NO_SPANS
    assert failed.err.count("\n") == 1 and str(empty) in failed.text
