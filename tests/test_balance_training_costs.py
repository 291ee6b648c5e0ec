"""Rebalancing a training run: each layer costs its forward + backward per micro-batch, fitted per (virtual)
stage from the passes a trace labels F, B, I and W; the advice in Megatron's and torchtitan's terms too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from error_helpers import cli_error

from ppscope.balance.advise.rebalance import engine_lines, megatron_args
from ppscope.balance.measured.fit import fit_layer_costs
from ppscope.balance.measured.training import training_passes
from ppscope.cli.main import main
from ppscope.errors import ErrorCode
from ppscope.simulate.simulator import write_run
from ppscope.trace.model import RankInfo, RunMeta, Trace

F_MS, B_MS, LOSS_MS = 1.0, 2.0, 0.5  # every layer's forward and backward, the loss on the last stage
WOBBLE = sum(1.0 + 0.02 * (i % 5) / 4 for i in range(16)) / 16  # the mean slowing of 4 steps of 4 micro-batches


def _trace(
    split: list[int],
    *,
    chunks: int = 1,
    record_split: bool = True,
    kernels: bool = False,
    zero_bubble: bool = False,
    steps: int = 4,
    m: int = 4,
) -> Trace:
    """A training run with known costs: each (virtual) stage's forward takes F_MS per layer, its backward
    B_MS per layer (as I + W halves when `zero_bubble`), on rank stage mod P; `kernels`: as the Kineto
    importer gives it, two `kernel` operators per action and no split. Each pass is slower by a
    deterministic wobble of up to 2%, so that the runs vary. Each step runs every forward, then every backward
    (GPipe's order), an action starting once its rank is free and its input has come (1 µs later)."""
    stages = len(split)
    ranks = stages // chunks
    clock = dict.fromkeys(range(ranks), 0)
    done: dict[tuple[str, int, int], int] = {}  # (F or B, stage, mb) -> its end
    rows = []

    def put(rank: int, kind: str, ms: float, after: int = 0, **labels: object) -> None:
        ns = int(ms * 1e6)
        parts = [ns // 2, ns - ns // 2] if kernels and kind != "head" else [ns]
        clock[rank] = max(clock[rank], after)
        for part in parts:
            start = clock[rank]
            rows.append(
                {
                    "rank": rank,
                    "kind": "kernel" if kernels else kind,
                    "start_ns": start,
                    "end_ns": start + part,
                    "lane": "compute",
                    **labels,
                }
            )
            clock[rank] = start + part + 1000

    def wobble(step: int, mb: int) -> float:
        return 1.0 + 0.02 * ((step * m + mb) % 5) / 4

    for step in range(steps):
        for s in range(stages):
            for mb in range(m):
                labels = {"stage": s, "mb": mb, "step": step, "chunk": s // ranks}
                put(
                    s % ranks,
                    "forward",
                    F_MS * split[s] * wobble(step, mb),
                    done.get(("F", s - 1, mb), 0),
                    phase="F",
                    **labels,
                )
                if s == stages - 1 and not kernels:
                    put(s % ranks, "head", LOSS_MS, phase="F", **labels)
                done[("F", s, mb)] = clock[s % ranks]
        for s in reversed(range(stages)):
            for mb in range(m):
                labels = {"stage": s, "mb": mb, "step": step, "chunk": s // ranks}
                back, after = B_MS * split[s] * wobble(step, mb), done.get(("B", s + 1, mb), 0)
                if zero_bubble:
                    put(s % ranks, "backward", back / 2, after, phase="I", **labels)
                    put(s % ranks, "backward", back / 2, phase="W", **labels)
                else:
                    put(s % ranks, "backward", back, after, phase="B", **labels)
                done[("B", s, mb)] = clock[s % ranks]
        for r in range(ranks):  # the optimizer: compute of no micro-batch
            put(r, "forward", 5.0, phase="F", stage=-1, mb=-1, step=step)
    meta = RunMeta(
        source="kineto" if kernels else "pipelining",
        status="finished",
        world_size=ranks,
        pp_size=ranks,
        schedule="interleaved-1f1b" if chunks > 1 else "1f1b",
        microbatches=m,
        chunks=chunks,
        split=list(split) if record_split and not kernels else [],
        ranks=[RankInfo(rank=r, stage=r) for r in range(ranks)],
    )
    return Trace.from_records(rows, meta=meta)


def _rebalance(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["rebalance", *argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_a_pass_is_its_forward_and_backward() -> None:
    passes = training_passes(_trace([6, 2], zero_bubble=True))
    assert len(passes) == 2 * 4 * 4  # stages × micro-batches × steps; the optimizer is no pass
    first = passes[(passes["stage"] == 0) & (passes["step"] == 0) & (passes["mb"] == 0)].iloc[0]
    assert (first["forward_ns"], first["backward_ns"]) == (6_000_000, 12_000_000)  # I + W together
    last = passes[passes["stage"] == 1]
    assert (last["head_ns"] == 500_000).all() and (last["embed_ns"] == 0).all()


@pytest.mark.parametrize("zero_bubble", [False, True])
def test_layer_costs_are_forward_plus_backward(zero_bubble: bool) -> None:
    trace = _trace([6, 2], zero_bubble=zero_bubble)
    fit = fit_layer_costs([trace])
    spans = trace.spans
    for o in fit.observations:  # each stage's pass is the mean of its spans' forward + backward per micro-batch
        mine = spans[(spans["stage"] == o.stage) & spans["kind"].isin(["forward", "backward"])]
        assert o.pass_ms == pytest.approx((mine["end_ns"] - mine["start_ns"]).sum() / 16 / 1e6)
        assert o.backward_ms == pytest.approx(2 * o.forward_ms)
    assert fit.phase == "forward+backward"
    assert fit.costs.layer_ms == pytest.approx([(F_MS + B_MS) * WOBBLE] * 8, rel=1e-6)
    assert fit.costs.head_ms == pytest.approx(LOSS_MS) and fit.costs.embed_ms == pytest.approx(0, abs=1e-4)


def test_a_training_run_advises_moving_layers_off_the_slow_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(_trace([6, 2]), tmp_path / "run")
    out = _rebalance(capsys, str(run))
    assert out["current_split"] == [6, 2] and out["proposed_split"] == [4, 4]
    times = out["stage_times_ms"]
    assert isinstance(times, dict) and times["current"][0] == pytest.approx(18 * WOBBLE, rel=1e-6)
    closed = 18 * WOBBLE / (12 * WOBBLE + LOSS_MS)  # the slowest stage's time now ÷ proposed
    assert out["slowest_stage_speedup"] == pytest.approx(closed, rel=1e-6)
    # the headline is the step replayed in its own order (4,4 by hand: 78.5 ms -> 62 ms, ×1.27): GPipe's fill
    # and drain of 4 micro-batches over 2 stages take some of the closed form's gain; the replay of the run as
    # it is reproduces it
    simulated = out["simulated"]
    assert isinstance(simulated, dict) and simulated["error"] < 0.01
    assert out["predicted_speedup"] == simulated["speedup"] and 1.2 < simulated["speedup"] < closed
    assert out["advice"] == "change" and out["cost_source"] == "fit"
    assert out["megatron_args"] == "--decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 4"
    assert out["megatron_layout"] == "--pipeline-model-parallel-layout 'Et*4|t*4,L'"
    assert str(out["torchtitan_toml"]).startswith('module_fqns_per_model_part = [["tok_embeddings", "layers.0"')
    assert out["job"] == "training" and out["vllm_env"] is None and out["sglang_env"] is None  # serving engines'
    training = out["training"]
    assert isinstance(training, dict) and training["passes"] == "forward+backward"
    assert main(["rebalance", str(run)]) == 0
    text = capsys.readouterr().out
    assert "each layer's cost is its forward + backward per micro-batch" in text
    assert "recording hook's forward and backward spans" in text
    assert "--pipeline-model-parallel-layout 'Et*4|t*4,L'" in text and "module_fqns_per_model_part" in text
    assert "ready to paste (a training job):" in text and "VLLM_PP_LAYER_PARTITION" not in text


def test_a_kineto_trace_takes_its_split_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(_trace([2, 6], kernels=True), tmp_path / "run")
    failed = cli_error(capsys, ["rebalance", str(run)])
    assert failed.exit_code == 2 and failed.code == ErrorCode.NO_LAYER_SPLIT
    assert failed.err.count("\n") == 1 and "--current-split" in failed.text  # how to give it
    out = _rebalance(capsys, str(run), "--current-split", "2,6")
    assert out["proposed_split"] == [4, 4] and out["current_split"] == [2, 6]
    training = out["training"]
    assert isinstance(training, dict) and training["split_source"] == "--current-split"
    assert "Kineto trace's operators" in str(training["from"])
    failed = cli_error(capsys, ["rebalance", str(run), "--current-split", "2,2,4"])  # one count per stage it trains
    assert failed.exit_code == 2 and failed.code == ErrorCode.COUNT_MISMATCH and "2,2,4" in failed.text


def test_a_hook_run_without_a_split_says_how_to_give_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(_trace([6, 2], record_split=False), tmp_path / "run")
    failed = cli_error(capsys, ["rebalance", str(run)])
    assert failed.exit_code == 2 and failed.code == ErrorCode.NO_LAYER_SPLIT and failed.err.count("\n") == 1
    assert "record_pipeline(schedule, run_dir, split=[...])" in failed.text  # the call that records one
    failed = cli_error(capsys, ["rebalance", str(run), "--phase", "decode", "--current-split", "6,2"])
    assert failed.exit_code == 2 and failed.code == ErrorCode.CONFLICTING_OPTIONS and "--phase" in failed.text


def test_virtual_stages_are_balanced_each_as_a_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(_trace([3, 1, 1, 3], chunks=2), tmp_path / "run")
    out = _rebalance(capsys, str(run))
    assert out["proposed_split"] == [2, 2, 2, 2]
    assert out["megatron_layout"] == "--pipeline-model-parallel-layout 'Et*2|t*2|t*2|t*2,L'"
    assert out["megatron_args"] == "--decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 4"
    training = out["training"]
    assert (
        isinstance(training, dict) and training["virtual_stages"] and "slowest virtual stage" in training["assumption"]
    )
    assert main(["rebalance", str(run)]) == 0
    assert "virtual stage" in capsys.readouterr().out


def test_megatron_flags_count_a_ranks_layers_over_its_virtual_stages() -> None:
    assert megatron_args([2, 3, 2, 3], chunks=2) == (
        "--decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 6"
    )
    assert megatron_args([2, 3, 3, 2], chunks=2) is None  # rank 0's virtual stages differ: Megatron spreads evenly
    assert "equal virtual stages on each rank" in engine_lines([2, 3, 3, 2], 10, chunks=2)["megatron_args"]


def test_a_deepspeed_job_gets_the_sentence_not_lines_it_cannot_take(capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSpeed's PipelineModule takes no layer counts per stage: no vLLM, Megatron or torchtitan line."""
    capture = Path(__file__).parent / "data" / "deepspeed-pipeline"
    assert main(["rebalance", str(capture), "--current-split", "4,4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["job"] == "deepspeed" and "partition_method" in out["deepspeed"]
    assert all(
        out[k] is None for k in ("vllm_env", "sglang_env", "megatron_args", "megatron_layout", "torchtitan_toml")
    )
