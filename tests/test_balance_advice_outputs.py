"""Advice that fits the model it is for: layer counts checked, runs of one kind, speedups of like against like."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from error_helpers import cli_error, raises_code

from ppscope.balance.advise.rebalance import engine_lines
from ppscope.balance.costs import LayerCosts
from ppscope.cli.main import main
from ppscope.errors import ErrorCode, InvalidSplitError
from ppscope.simulate.simulator import SimConfig, simulate, write_run

COSTS = LayerCosts(layer_ms=(1.0,) * 7 + (3.0,), embed_ms=1.0, head_ms=3.0)


def _run(path: Path, schedule: str = "gpipe", split: tuple[int, ...] = (4, 4)) -> Path:
    cfg = SimConfig(schedule=schedule, stages=2, microbatches=4, steps=3, costs=COSTS, split=split)
    return write_run(simulate(cfg), path)


def test_layer_costs_that_do_not_cover_the_runs_layers_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path / "r")
    failed = cli_error(capsys, ["rebalance", str(run), "--layer-costs", "1,1,1,1"])
    assert failed.exit_code == 2 and failed.code == ErrorCode.COUNT_MISMATCH and failed.err.count("\n") == 1
    assert "--layer-costs" in failed.text and "4,4" in failed.text  # the option, and the run's split
    failed = cli_error(capsys, ["rebalance", "--layer-costs", "1,1,1,1", "--stages", "2", "--model", "llama3-8b"])
    assert failed.exit_code == 2 and failed.code == ErrorCode.COUNT_MISMATCH
    assert "llama3-8b" in failed.text and "32" in failed.text  # the model, and its layers


def test_given_costs_are_said_to_be_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path / "r")
    assert main(["rebalance", str(run), "--layer-costs", "1,1,1,1,1,1,1,3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cost_source"] == "given" and out["vllm_env"] == "VLLM_PP_LAYER_PARTITION=6,2"


def test_a_paste_line_never_names_another_models_split() -> None:
    assert engine_lines([5, 3], 8)["vllm_env"] == "VLLM_PP_LAYER_PARTITION=5,3"
    with raises_code(InvalidSplitError, ErrorCode.SPLIT_DOES_NOT_COVER_LAYERS):
        engine_lines([3, 1], 8)


def test_runs_of_different_kinds_are_not_fitted_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpipe, serve = _run(tmp_path / "g"), _run(tmp_path / "s", schedule="serve", split=(5, 3))
    failed = cli_error(capsys, ["rebalance", str(gpipe), str(serve)])
    assert failed.exit_code == 2 and failed.code == ErrorCode.MIXED_RUNS
    assert "gpipe" in failed.text and "serve" in failed.text and "--mix" in failed.text  # how, and how to go on
    assert main(["rebalance", str(gpipe), str(serve), "--mix", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["fit"]["notes"]
    mixed = [n["text"] for n in notes if n["code"] == "mixed_fit"]
    assert len(mixed) == 1 and "schedule (gpipe vs serve)" in mixed[0]  # what differed


def test_a_replay_compares_simulated_with_simulated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path / "r")
    assert main(["simulate", "--from", str(run), "--split", "5,3", "--out", str(tmp_path / "p"), "--json"]) == 0
    m = json.loads(capsys.readouterr().out)["measured"]
    assert m["predicted_speedup"] == pytest.approx(m["replay_ms"] / m["predicted_ms"])
    assert m["predicted_speedup"] > 1.0 and abs(m["replay_throughput_error"]) < 1e-3
    assert main(["simulate", "--from", str(run), "--split", "5,3", "--out", str(tmp_path / "q")]) == 0
    text = capsys.readouterr().out
    assert f"predicted speedup ×{m['predicted_speedup']:.3f} against the replay of split 4,4" in text
    assert "makespan" not in text  # one timing per split: the replay's lines


def test_a_replay_refuses_a_schedule_it_would_ignore(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path / "r", schedule="serve")
    failed = cli_error(capsys, ["simulate", "--from", str(run), "--schedule", "gpipe", "--out", str(tmp_path / "p")])
    assert failed.exit_code == 2 and failed.code == ErrorCode.CONFLICTING_OPTIONS and "--schedule" in failed.text
    assert not (tmp_path / "p").exists()


def test_kv_bytes_per_stage_read_without_separators_inside_a_list(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["rebalance", "--layer-costs", ",".join(["1"] * 32), "--stages", "2", "--model", "llama3-8b"]
    assert main(args) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("KV cache per token"))
    assert line.startswith("KV cache per token (proposed split): stage 0: 65536 B; stage 1: 65536 B")


def test_rebalance_says_keep_or_change_with_the_interval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path / "r")
    assert main(["rebalance", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["advice"] == "change" and out["predicted_interval"] is not None
    low, high = out["predicted_interval"]
    assert low <= out["predicted_speedup"] <= high  # a simulated run does not vary: the interval is the point
    # 40 layers of 1 ms and a head of 1.5 ms: 20,20 takes 21.5 ms, 21,19 21 ms: +2.4%, not worth a change
    assert main(["rebalance", "--layer-costs", ",".join(["1"] * 40), "--head-cost", "1.5", "--stages", "2"]) == 0
    text = capsys.readouterr().out
    assert "advice: KEEP the current split: the predicted gain +2.4% is under 3%" in text
    assert "ready to paste" not in text and "VLLM_PP_LAYER_PARTITION=" not in text
    assert "the proposed split, not advised: " in text


def test_the_table_says_which_statistic_each_column_of_ms_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "ms now" is predicted from the costs, "measured ms" the run's mean pass: the table says so, and the
    per-layer average printed is the mean over layers of the costs the split was found for (as the dashboard's)."""
    from ppscope.balance.measured.timings import RunTimings
    from ppscope.balance.report import RebalanceRequest, rebalance_runs
    from ppscope.trace.store import load_run

    run = _run(tmp_path / "r")
    assert main(["rebalance", str(run)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "predicted ms: a pass of each stage, from costs fitted to each stage's mean pass" in out
    assert "measured ms: the last run's mean pass of each stage, all its parts" in out
    assert "ms per layer under the uniform fit of each stage's mean pass" in out
    report = rebalance_runs([RunTimings.of(load_run(run))], RebalanceRequest())
    assert report.mean_layer_ms == pytest.approx(sum(report.costs.layer_ms) / 8)


def test_rebalance_leads_with_the_schedule_replay_which_the_run_then_bears_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a simulated GPipe run of 4,4 (layers of 1 ms, the head 3 ms): the slowest stage alone promises more
    # than a step of 4 micro-batches, which fills and drains, can gain; the run of the proposed split (the
    # simulator is the truth here) lands inside the replay's interval and far from the closed form
    def gpipe(path: Path, split: tuple[int, ...]) -> Path:
        costs = LayerCosts(layer_ms=(1.0,) * 8, embed_ms=1.0, head_ms=3.0)  # costs a fit of stage spans finds
        return write_run(
            simulate(SimConfig(schedule="gpipe", stages=2, microbatches=4, steps=3, costs=costs, split=split)), path
        )

    run = gpipe(tmp_path / "r", (4, 4))
    assert main(["rebalance", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sim = out["simulated"]
    assert out["predicted_speedup"] == sim["speedup"] and out["simulated_note"] is None
    assert sim["error"] < 1e-3  # the simulator replays its own run
    measured = _throughput(gpipe(tmp_path / "n", tuple(out["proposed_split"])), capsys) / _throughput(run, capsys)
    low, high = out["predicted_interval"]
    assert low - 1e-3 <= measured <= high + 1e-3 and measured == pytest.approx(sim["speedup"], rel=0.01)
    assert out["slowest_stage_speedup"] > measured + 0.05  # the closed form, beside it, overshoots
    assert main(["rebalance", str(run)]) == 0
    text = capsys.readouterr().out
    assert f"predicted speedup ×{sim['speedup']:.3f}" in text
    assert "the slowest stage alone (closed form, no fill, drain or hops): " in text
    # no run, no replay: the closed form leads
    assert main(["rebalance", "--layer-costs", "1,1,1,3", "--stages", "2", "--json"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert given["simulated"] is None and given["predicted_speedup"] == given["slowest_stage_speedup"]


def test_a_run_too_large_to_hold_whole_is_advised_rank_by_rank_without_a_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ppscope.cli.commands import rebalance
    from ppscope.trace.store import load_run, rank_file, span_count

    costs = LayerCosts(layer_ms=(1.0,) * 8, embed_ms=1.0, head_ms=3.0)
    run = write_run(simulate(SimConfig(schedule="gpipe", stages=2, microbatches=4, steps=3, costs=costs)), tmp_path)
    spans = span_count(run)
    assert spans == len(load_run(run).spans) > 0  # counted without reading a span
    monkeypatch.setattr(rebalance, "REPLAY_SPANS", spans - 1)
    assert main(["rebalance", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["simulated"] is None and out["predicted_speedup"] == out["slowest_stage_speedup"]
    assert f"the run has {spans:,} spans, more than the {spans - 1:,}" in out["simulated_note"]
    rank_file(run, 1).write_bytes(b"not a database")  # a file that cannot be read counts none: reading it says why
    assert 0 < span_count(run) < spans


def _throughput(run: Path, capsys: pytest.CaptureFixture[str]) -> float:
    assert main(["analyze", str(run), "--json"]) == 0
    return float(json.loads(capsys.readouterr().out)["throughput_tokens_per_s"])
