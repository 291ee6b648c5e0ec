"""One rule for whether a Kineto import is complete (`RunMeta.ranks_missing`), whichever rank's file it is and
whichever command reads it: a file given alone is the job it was given as; a file that was there but could not
be read leaves its rank missing, named in the same words by `analyze` and `rebalance`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from error_helpers import cli_error

from ppscope.analysis import analyze
from ppscope.analysis.report import render_text
from ppscope.cli.main import main
from ppscope.errors import ErrorCode
from ppscope.formats.sources import open_trace
from ppscope.simulate.training import replay_training
from ppscope.trace.notices import NoticeCode

GPIPE = Path(__file__).parent / "data" / "pipelining" / "gpipe"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "kineto" / "trace_filter"
SINGLE = [GPIPE / "rank-0.json.gz", GPIPE / "rank-1.json.gz"] + [SHARED / f"sampled_rank-{r}.json.gz" for r in (0, 1)]


@pytest.mark.parametrize("path", SINGLE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_single_rank_file_is_complete_in_every_output(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    trace = open_trace(path)
    result = analyze(trace)
    assert result.missing is None and result.pp_size == 1 and result.bubble_ratio is not None
    assert not render_text(result).startswith("incomplete")
    replay, _ = replay_training(trace)
    assert "recorded nothing" not in (replay.note or "")
    assert main(["analyze", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["missing"] is None and out["pp_size"] == 1
    if path.parent == GPIPE:  # a training capture: costs from its actions, with the split given
        assert main(["rebalance", str(path), "--current-split", "4"]) == 0
        assert "recorded nothing" not in capsys.readouterr().out


@pytest.mark.parametrize("damaged", [0, 1])
def test_a_damaged_file_leaves_its_rank_missing_in_the_same_words_everywhere(
    damaged: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "job"
    shutil.copytree(GPIPE, folder)
    path = folder / f"rank-{damaged}.json.gz"
    path.write_bytes(path.read_bytes()[:300])  # cut short
    result = analyze(open_trace(folder))
    assert result.missing is not None and result.missing.code == NoticeCode.MISSING_RANKS
    assert f"rank {damaged} " in result.missing.text  # the rank
    assert result.pp_size == 2 and result.bubble_ratio is None
    assert main(["analyze", str(folder)]) == 0
    assert capsys.readouterr().out.startswith(f"incomplete: {result.missing}")
    failed = cli_error(capsys, ["rebalance", str(folder), "--current-split", "2,2"])
    assert failed.exit_code == 2 and failed.code == ErrorCode.MISSING_RANKS
    (err,) = failed.err.strip().splitlines()
    assert err.startswith(f"ppscope rebalance: error: {result.missing}: ")  # in the words analyze names it
