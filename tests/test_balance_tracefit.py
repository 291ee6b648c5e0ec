"""Another engine's trace plus the model: the model's shape calibrated on the trace's stage times.

The calibrated stage times of the split the trace ran must match the stage times the trace measured (within
5%; by construction they match exactly), on a synthetic Kineto trace whose stage times are known and on the
real third-party traces in ../shared/data (skipped, saying why, when that folder is absent).
"""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import ANY

import pytest
from error_helpers import cli_error, raises_code

from ppscope.balance.advise.rebalance import rebalance
from ppscope.balance.costs import LayerCosts
from ppscope.balance.modelled.tracefit import calibrate
from ppscope.cli.main import main
from ppscope.errors import ErrorCode, InvalidConfigError

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MFU = DATA / "nsys" / "mfu_2gpu_after.sqlite"
KINETO = DATA / "kineto" / "trace_filter"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"real third-party trace {path} is absent (a checkout without ../shared/data)")
    return path


def test_one_scale_and_a_remainder_per_stage_are_recovered() -> None:
    """Stage times made as k x the model + a fixed extra on the last stage give back k and that extra."""
    costs = LayerCosts(layer_ms=(1.0,) * 16, embed_ms=0.1, head_ms=2.0, sample_ms=0.5)
    split = [4, 4, 4, 4]
    modelled = [0.1 + 4, 4, 4, 4 + 2.5]
    measured = [3.0 * t for t in modelled]
    measured[-1] += 5.0  # e.g. a sampler the model does not know
    cal = calibrate(costs, split, measured)
    assert cal.scale == pytest.approx(3.0)
    assert cal.overhead_ms == pytest.approx((0.0, 0.0, 0.0, 5.0))
    assert cal.calibrated_ms(split) == pytest.approx(measured, rel=1e-12)
    assert cal.poorly_explained() == []
    advice = rebalance(cal.problem(), split)
    assert advice.proposed.split[-1] < 4  # the extra stays with the last stage: layers move off it
    # An overhead is a stage's, not its layers': moving one layer changes a stage by k x 1 ms exactly.
    assert cal.calibrated_ms([5, 4, 4, 3]) == pytest.approx([3 * 5.1, 12, 12, 3 * 5.5 + 5.0])


def test_a_stage_count_that_differs_from_the_split_is_refused() -> None:
    with raises_code(InvalidConfigError, ErrorCode.COUNT_MISMATCH):
        calibrate(LayerCosts(layer_ms=(1.0,) * 8), [4, 4], [1.0, 2.0, 3.0])
    with raises_code(InvalidConfigError, ErrorCode.NO_COMPUTE):
        calibrate(LayerCosts(layer_ms=(1.0,) * 8), [4, 4], [1.0, 0.0])


def _kineto_dir(folder: Path, stage_ms: list[float], passes: int = 20) -> Path:
    """One Kineto file per rank: `passes` kernels per stage, laid out as a pipeline, summing to `stage_ms`."""
    folder.mkdir()
    period = max(stage_ms) / passes * 1000 * 1.25  # µs, so that no stage's kernels overlap
    for rank, total in enumerate(stage_ms):
        dur = total / passes * 1000  # µs
        events = [
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"layer_gemm_{i}",
                "pid": 0,
                "tid": 7,
                "ts": 1_000_000 + i * period + rank * period / 2,
                "dur": dur,
                "args": {"stream": 7},
            }
            for i in range(passes)
        ]
        doc = {"schemaVersion": 1, "traceEvents": events, "distributedInfo": {"rank": rank, "world_size": 4}}
        (folder / f"rank-{rank}.json").write_text(json.dumps(doc))
    return folder


def _advice(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["rebalance", *argv, "--json"]) == 0, capsys.readouterr().err
    out: dict = json.loads(capsys.readouterr().out)
    return out


def test_synthetic_trace_calibrated_stage_times_match_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    known = [40.0, 41.0, 39.5, 55.0]  # ms of busy time per stage: the last one is slow
    trace = _kineto_dir(tmp_path / "trace", known)
    d = _advice(
        capsys,
        str(trace),
        "--model",
        "llama3-8b",
        "--current-split",
        "8,8,8,8",
        "--gpu",
        "h100-sxm",
        "--assume-pipeline",
    )
    assert d["cost_source"] == "trace" and d["current_split"] == [8, 8, 8, 8]
    assert d["assumed_pipeline"]["code"] == "no_pipeline_evidence"
    assert d["no_interval"]["code"] == "single_trace"  # one figure a stage: the costs' spread is unknown
    assert d["measured_stage_ms"] == pytest.approx(known, rel=1e-3)
    assert d["stage_times_ms"]["current"] == pytest.approx(known, rel=0.05)
    assert d["calibration"]["calibrated_ms"] == pytest.approx(d["measured_stage_ms"], rel=0.05)
    assert d["proposed_split"][-1] < 8 and d["predicted_speedup"] > 1.05
    assert d["vllm_env"] == "VLLM_PP_LAYER_PARTITION=" + ",".join(map(str, d["proposed_split"]))
    assert any("vLLM's default rule" not in a and "ran the split 8,8,8,8 (given)" in a for a in d["assumptions"])
    # --current-split defaults to vLLM's rule, and the report says so.
    d = _advice(capsys, str(trace), "--model", "llama3-8b", "--stage-of-rank", "0:0,1:1,2:2,3:3")
    assert d["current_split"] == [8, 8, 8, 8] and d["assumed_pipeline"] is None
    assert any("vLLM's default rule" in a for a in d["assumptions"])
    assert any("no --gpu given" in a for a in d["assumptions"])


def test_a_trace_whose_stages_differ_from_the_split_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _kineto_dir(tmp_path / "trace", [10.0, 10.0, 10.0, 12.0])
    argv = ["rebalance", str(trace), "--model", "llama3-8b", "--current-split", "16,16", "--assume-pipeline"]
    failed = cli_error(capsys, argv)
    assert failed.exit_code == 2 and failed.code == ErrorCode.SPLIT_STAGE_COUNT and failed.err.count("\n") == 1
    failed = cli_error(capsys, ["rebalance", str(trace), "--assume-pipeline"])  # no split, no model: say what to give
    assert failed.exit_code == 2 and failed.code == ErrorCode.NO_LAYER_SPLIT and failed.err.count("\n") == 1
    assert "--model" in failed.text


@pytest.mark.parametrize("path", [MFU, KINETO], ids=["nsys", "kineto"])
def test_real_third_party_trace_calibrated_times_match_the_measured_ones(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _need(path)
    d = _advice(capsys, str(trace), "--model", "llama3-8b", "--current-split", "18,14", "--assume-pipeline")
    measured = d["measured_stage_ms"]
    assert len(measured) == 2 and min(measured) > 0
    assert d["stage_times_ms"]["current"] == pytest.approx(measured, rel=0.05)
    assert max(d["stage_times_ms"]["proposed"]) <= max(measured) * (1 + 1e-9)  # never advises a slower split
    assert d["predicted_speedup"] >= 1.0
    for key in ("current_split", "proposed_split", "stage_times_ms", "predicted_speedup", "vllm_env", "sglang_env"):
        assert key in d


def test_real_trace_text_report_names_the_assumptions(capsys: pytest.CaptureFixture[str]) -> None:
    trace = _need(MFU)
    assert main(["rebalance", str(trace), "--model", "llama3-8b", "--assume-pipeline"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("assumed a pipeline (--assume-pipeline), though its 2 ranks exchange no message")
    assert "calibrated on" in out and "measured ms" in out and "Assumptions:" in out
    assert "busy time" in out and "vLLM's default rule" in out and "one scale for every part" in out


@pytest.mark.parametrize("path", [MFU, KINETO], ids=["nsys", "kineto"])
@pytest.mark.parametrize("with_model", [True, False], ids=["model", "fit"])
def test_a_trace_that_shows_no_pipeline_gets_no_split(
    path: Path, with_model: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ranks that exchange no message may be independent jobs: no split, no paste line, exit 4, and how to go on."""
    trace = _need(path)
    model = ["--model", "llama3-70b"] if with_model else ["--current-split", "40,40"]
    assert main(["rebalance", str(trace), *model, "--json"]) == 4
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"error": {"code": ErrorCode.NO_PIPELINE_EVIDENCE, "text": ANY}}  # no split
    assert captured.err.count("\n") == 1 and "--assume-pipeline" in captured.err  # how to go on
