"""Options the engine cannot honour are refused in one line before anything starts; what it does honour is
recorded as it ran (micro-batches and cache at most one per request)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from error_helpers import cli_error, raises_code

from ppscope.cli.main import main
from ppscope.engine.config import (
    EngineConfig,
    ModelConfig,
    OutputConfig,
    PipelineConfig,
    RuntimeConfig,
    WorkloadConfig,
)
from ppscope.engine.prepare import check_memory, prepare
from ppscope.errors import ErrorCode, InvalidConfigError, InvalidSplitError

SYNTHETIC: dict[str, Any] = {"name": "synthetic", "layers": 4, "layer_cost_ms": (0.0,)}


@pytest.mark.parametrize(
    ("section", "options", "code"),
    [
        (WorkloadConfig, {"rate": float("nan")}, ErrorCode.BAD_VALUE),
        (WorkloadConfig, {"rate": 1e-300}, ErrorCode.BAD_VALUE),
        (WorkloadConfig, {"temperature": float("nan")}, ErrorCode.BAD_VALUE),
        (WorkloadConfig, {"top_p": float("inf")}, ErrorCode.BAD_VALUE),
        (WorkloadConfig, {"rate": -1.0}, ErrorCode.BAD_VALUE),
        (WorkloadConfig, {"temperature": -0.5}, ErrorCode.BAD_VALUE),
        (WorkloadConfig, {"top_p": 0.0}, ErrorCode.BAD_VALUE),
        (WorkloadConfig, {"top_p": 1.5}, ErrorCode.BAD_VALUE),
        (RuntimeConfig, {"timeout_s": float("inf")}, ErrorCode.BAD_VALUE),
        (RuntimeConfig, {"timeout_s": 1e12}, ErrorCode.BAD_VALUE),
        (WorkloadConfig, {"seed": 2**70}, ErrorCode.BAD_VALUE),
        (WorkloadConfig, {"seed": -1}, ErrorCode.BAD_VALUE),
        (ModelConfig, {**SYNTHETIC, "layer_cost_ms": (float("nan"),)}, ErrorCode.BAD_VALUE),
        (ModelConfig, {**SYNTHETIC, "layer_cost_ms": (1.0, float("inf"), 1.0, 1.0)}, ErrorCode.BAD_VALUE),
        (ModelConfig, {**SYNTHETIC, "layer_cost_ms": (1.0, 2.0)}, ErrorCode.COUNT_MISMATCH),
        (ModelConfig, {**SYNTHETIC, "embed_cost_ms": float("nan")}, ErrorCode.BAD_VALUE),
        (PipelineConfig, {"microbatches": -1}, ErrorCode.BAD_VALUE),
        (PipelineConfig, {"stages": 0}, ErrorCode.BAD_VALUE),
        (PipelineConfig, {"split": ()}, ErrorCode.COUNT_MISMATCH),
    ],
)
def test_non_finite_and_out_of_range_values_are_refused(
    section: type, options: dict[str, Any], code: ErrorCode
) -> None:
    with raises_code(InvalidConfigError, code):
        section(**options)


@pytest.mark.parametrize(
    ("argv", "code", "names"),
    [  # the flag the message names (never the config field), and what else it must name: the value, the choices
        (["--rate", "nan"], ErrorCode.BAD_VALUE, ("--rate", "nan")),
        (["--timeout", "inf"], ErrorCode.BAD_VALUE, ("--timeout",)),
        (["--microbatches", "-1"], ErrorCode.BAD_VALUE, ("--microbatches",)),
        (
            ["--model", "synthetic", "--layers", "4", "--layer-cost-ms", "1,inf,1,1"],
            ErrorCode.BAD_VALUE,
            ("--layer-cost-ms", "inf"),
        ),
        (
            ["--model", "synthetic", "--layers", "4", "--layer-cost-ms", "1,2"],
            ErrorCode.COUNT_MISMATCH,
            ("--layer-cost-ms",),
        ),
        (["--split", "a,b"], ErrorCode.SPLIT_NOT_INTEGERS, ("'a,b'",)),
        (["--chunks", "2"], ErrorCode.CONFLICTING_OPTIONS, ("--chunks", "--schedule interleaved")),
        (["--model", "nowhere"], ErrorCode.BAD_MODEL, ("--model", "'nowhere'")),
        (["--schedule", "gpipe", "--rate", "5"], ErrorCode.CONFLICTING_OPTIONS, ("--rate",)),
        (["--schedule", "gpipe", "--max-inflight", "2"], ErrorCode.CONFLICTING_OPTIONS, ("--max-inflight",)),
        (["--schedule", "interleaved", "--max-batch", "2"], ErrorCode.CONFLICTING_OPTIONS, ("--max-batch",)),
        (["--microbatches", "3"], ErrorCode.CONFLICTING_OPTIONS, ("--microbatches", "--max-inflight")),
        (["--layers", "3"], ErrorCode.CONFLICTING_OPTIONS, ("--layers",)),
        (["--layer-cost-ms", "1,2"], ErrorCode.CONFLICTING_OPTIONS, ("--layer-cost-ms",)),
        (["--head-cost-ms", "2"], ErrorCode.CONFLICTING_OPTIONS, ("--head-cost-ms",)),
        (["--prompts", __file__, "--requests", "4"], ErrorCode.CONFLICTING_OPTIONS, ("--requests", "--prompts")),
        (["--device", "tpu"], ErrorCode.UNKNOWN_CHOICE, ("--device", "'tpu'", "auto, cpu, cuda")),
        (["--backend", "nccl", "--device", "cpu"], ErrorCode.CONFLICTING_OPTIONS, ("--backend nccl", "--device")),
    ],
)
def test_the_command_line_names_flags_where_the_config_names_fields(
    argv: list[str], code: ErrorCode, names: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = cli_error(capsys, ["run", "--no-progress", "--out", str(tmp_path / "run"), *argv])
    assert failed.exit_code == 2 and failed.code == code, failed
    assert all(name in failed.text for name in names), failed.text
    assert not re.search(r"\b(pipeline|model|workload|output|runtime)\.\w", failed.err), failed.err


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            lambda: EngineConfig(pipeline=PipelineConfig(schedule="gpipe"), workload=WorkloadConfig(rate=5.0)),
            r"workload.rate has no effect here \(gpipe takes every request at once\)",
        ),
        (lambda: PipelineConfig(schedule="gpipe", max_inflight=2), "pipeline.max_inflight has no effect here"),
        (lambda: PipelineConfig(schedule="interleaved", max_batch=2), "pipeline.max_batch has no effect here"),
        (lambda: PipelineConfig(schedule="serve", microbatches=3), "serve keeps pipeline.max_inflight micro-batches"),
        (lambda: ModelConfig(layers=3), "model.layers has no effect here .*tiny has its own layers"),
        (lambda: ModelConfig(layer_cost_ms=(1.0, 2.0)), "model.layer_cost_ms has no effect here"),
        (lambda: ModelConfig(head_cost_ms=2.0), "model.head_cost_ms has no effect here"),
    ],
)
def test_an_option_the_run_would_ignore_is_refused(config: Any, message: str) -> None:
    with raises_code(InvalidConfigError, ErrorCode.CONFLICTING_OPTIONS):
        config()


def test_generated_request_options_are_refused_beside_a_prompts_file(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2], "max_new_tokens": 2}\n')
    WorkloadConfig(prompts=prompts, max_new_tokens=3)  # the default for lines without their own
    for options in ({"requests": 4}, {"prompt_len": 8}):
        with raises_code(InvalidConfigError, ErrorCode.CONFLICTING_OPTIONS):
            WorkloadConfig(prompts=prompts, **options)
    with raises_code(InvalidConfigError, ErrorCode.BAD_PROMPTS):
        WorkloadConfig(prompts=tmp_path)


def test_refusals_are_one_line_with_exit_code_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--rate", "nan"], ["--schedule", "gpipe", "--rate", "5"], ["--layers", "3"]):
        failed = cli_error(capsys, ["run", "--no-progress", "--out", str(tmp_path / "run"), *argv])
        assert failed.exit_code == 2 and failed.err.count("\n") == 1 and "Traceback" not in failed.err, failed.err
    assert not (tmp_path / "run").exists()


def _config(pipeline: PipelineConfig, requests: int) -> EngineConfig:
    return EngineConfig(pipeline=pipeline, workload=WorkloadConfig(requests=requests))


def test_micro_batches_and_cache_are_at_most_one_per_request() -> None:
    gpipe = prepare(_config(PipelineConfig(stages=2, schedule="gpipe", microbatches=5), requests=2), 2)
    assert (gpipe.inflight, gpipe.max_seqs, gpipe.meta(2).microbatches) == (2, 1, 2)
    serve = prepare(_config(PipelineConfig(stages=2, max_inflight=5, max_batch=4), requests=3), 2)
    assert (serve.inflight, serve.max_seqs, serve.cache_slots) == (3, 3, 9)
    assert serve.meta(2).microbatches == 3 and serve.meta(2).config["max_inflight"] == 3
    default = prepare(_config(PipelineConfig(stages=4, schedule="gpipe"), requests=8), 4)
    assert (default.inflight, default.max_seqs, default.cache_slots) == (4, 2, 8)


def test_meta_json_keeps_the_flat_config_its_readers_take() -> None:
    """The analyzer reads `requests` and `max_inflight`, the store `record`, rebalance `dtype`: as the run had them."""
    cfg = EngineConfig(
        pipeline=PipelineConfig(stages=2, split=(6, 2)),
        workload=WorkloadConfig(requests=3),
        output=OutputConfig(record=False),
    )
    config = prepare(cfg, 2).meta(2).config
    assert (config["requests"], config["max_inflight"], config["record"], config["dtype"]) == (3, 2, False, "float32")
    assert (config["split"], config["model"], config["microbatches"]) == ([6, 2], "tiny", 0)
    assert EngineConfig.from_json(json.loads(json.dumps(config))).pipeline.max_inflight == 2


def test_the_run_says_how_it_was_laid_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--stages", "1", "--model", "synthetic", "--layers", "2", "--layer-cost-ms", "0", "--no-progress"]
    assert (
        main([*args, "--schedule", "gpipe", "--microbatches", "5", "--requests", "2", "--out", str(tmp_path / "a")])
        == 0
    )
    said = capsys.readouterr().out
    assert "gpipe on 1 stage, split 2 (vLLM's default rule), 2 micro-batches per step (asked for 5; one per" in said
    assert main([*args, "--split", "2", "--out", str(tmp_path / "b")]) == 0
    said = capsys.readouterr().out
    assert "serve on 1 stage, split 2 (--split), 1 micro-batch in flight\n" in said  # the default: one per stage


def test_the_run_leads_with_the_throughput_analyze_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Start-up (torch, the process group) is no part of the pipeline's speed: that figure comes second."""
    args = ["run", "--stages", "1", "--model", "synthetic", "--layers", "2", "--layer-cost-ms", "1", "--no-progress"]
    assert main([*args, "--requests", "3", "--out", str(tmp_path / "a"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert main(["analyze", str(tmp_path / "a"), "--json"]) == 0
    analysed = json.loads(capsys.readouterr().out)
    assert summary["throughput_tokens_per_s"] == pytest.approx(analysed["throughput_tokens_per_s"])
    assert summary["throughput_tokens_per_s_incl_startup"] < summary["throughput_tokens_per_s"]
    assert main([*args, "--requests", "3", "--out", str(tmp_path / "b")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "tokens/s from first arrival to last finish (as `ppscope analyze` reports it); " in first
    assert first.index("from first arrival") < first.index("with start-up")


@pytest.mark.parametrize(
    ("pipeline", "model", "wait"),
    [
        ({"stages": 2}, {"layer_cost_ms": (1e7,)}, "20000.0"),  # the second rank waits for the first one's 2 layers
        ({"stages": 4}, {"layer_cost_ms": (1.0, 1.0, 1.0, 70000.0)}, "70.0"),  # rank 0 waits for the last's tokens
        ({"stages": 2}, {"layer_cost_ms": (1.0,), "embed_cost_ms": 61000.0}, "61.0"),
        ({"stages": 4, "schedule": "interleaved", "chunks": 2}, {"layers": 8, "layer_cost_ms": (25000.0,)}, "75.0"),
    ],
)
def test_synthetic_costs_a_rank_cannot_wait_for_are_refused(
    pipeline: dict[str, Any], model: dict[str, Any], wait: str
) -> None:
    stages, synthetic = pipeline["stages"], ModelConfig(**{**SYNTHETIC, **model})
    with raises_code(InvalidConfigError, ErrorCode.TIMEOUT_TOO_SHORT):
        prepare(EngineConfig(pipeline=PipelineConfig(**pipeline), model=synthetic), stages)
    longer = RuntimeConfig(timeout_s=float(wait) + 1)
    assert prepare(EngineConfig(pipeline=PipelineConfig(**pipeline), model=synthetic, runtime=longer), stages)
    assert prepare(EngineConfig(pipeline=PipelineConfig(stages=1), model=synthetic), 1)


def test_memory_refusal_names_what_sizes_the_cache() -> None:
    serve = prepare(_config(PipelineConfig(stages=2, max_inflight=2, max_batch=4), requests=8), 2)
    with raises_code(InvalidConfigError, ErrorCode.NOT_ENOUGH_MEMORY):
        check_memory(serve, [0, 1], 2, 1 << 20, "this host", processes=True)
    gpipe = prepare(_config(PipelineConfig(stages=2, schedule="gpipe"), requests=6), 2)
    with raises_code(InvalidConfigError, ErrorCode.NOT_ENOUGH_MEMORY):
        check_memory(gpipe, [0, 1], 2, 1 << 20, "this host", processes=True)
    many = prepare(
        EngineConfig(pipeline=PipelineConfig(stages=64), model=ModelConfig(**{**SYNTHETIC, "layers": 64})), 64
    )
    with raises_code(InvalidConfigError, ErrorCode.NOT_ENOUGH_MEMORY):
        check_memory(many, list(range(64)), 64, 8 << 30, "this host", processes=True)


def test_too_many_chunks_says_how_many_fit() -> None:
    with raises_code(InvalidSplitError, ErrorCode.TOO_FEW_LAYERS) as err:
        prepare(EngineConfig(pipeline=PipelineConfig(stages=2, schedule="interleaved", chunks=8)), 2)
    assert "at most 4 chunks" in str(err.value)  # how many fit


def test_a_request_too_long_for_the_model_is_named(tmp_path: Path) -> None:
    with raises_code(InvalidConfigError, ErrorCode.SEQUENCE_TOO_LONG):
        prepare(EngineConfig(workload=WorkloadConfig(prompt_len=500, max_new_tokens=20)), 2)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2], "max_new_tokens": 2}\n{"prompt_ids": [1, 2], "max_new_tokens": 600}\n')
    with raises_code(InvalidConfigError, ErrorCode.SEQUENCE_TOO_LONG) as err:
        prepare(EngineConfig(workload=WorkloadConfig(prompts=prompts)), 2)
    assert f"{prompts}:2:" in str(err.value)  # the file and the line of the request


@pytest.mark.parametrize(
    ("gpus", "world", "local", "requested", "expected"),
    [
        (0, 2, None, "auto", "gloo"),
        (8, 8, None, "auto", "nccl"),
        (8, 16, "8", "auto", "nccl"),  # torchrun, 2 nodes of 8: a GPU for every rank of this node
        (8, 16, None, "auto", "gloo"),  # one machine, 16 ranks, 8 GPUs
        (4, 8, "8", "nccl", "needs a GPU per rank: 8 ranks on this node, 4"),
        (0, 2, None, "nccl", "needs NVIDIA GPUs"),
        (1, 16, "8", "auto", "nccl"),  # SLURM/Kubernetes: each process sees its own GPU (rank 0 checks they differ)
        (1, 16, "8", "nccl", "nccl"),
        (1, 2, None, "nccl", "needs a GPU per rank: 2 ranks on this node, 1"),  # spawned here: they would share it
    ],
)
def test_backend_follows_the_gpus_of_this_node(
    monkeypatch: pytest.MonkeyPatch, gpus: int, world: int, local: str | None, requested: str, expected: str
) -> None:
    import torch

    from ppscope.engine.prepare import resolve_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    if local is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    if expected in ("gloo", "nccl"):
        assert resolve_backend(requested, world) == expected
    else:
        with raises_code(InvalidConfigError, ErrorCode.NO_GPU):
            resolve_backend(requested, world)


@pytest.mark.parametrize(
    ("gpus", "world", "requested", "device", "expected"),
    [
        (1, 2, "auto", "cuda", "gloo"),  # one GPU, two ranks: they share it, activations through host memory
        (2, 2, "auto", "cuda", "nccl"),
        (2, 2, "auto", "cpu", "gloo"),  # GPUs there, ranks on the CPU as asked
        (1, 2, "gloo", "cuda", "gloo"),
        (0, 2, "gloo", "cuda", "--device cuda needs an NVIDIA GPU and none is visible: use --device cpu"),
        (1, 2, "nccl", "auto", "use fewer --stages per node, or --backend gloo --device cuda to share the GPUs"),
    ],
)
def test_device_says_where_ranks_compute(
    monkeypatch: pytest.MonkeyPatch, gpus: int, world: int, requested: str, device: str, expected: str
) -> None:
    import torch

    from ppscope.engine.prepare import resolve_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    if expected in ("gloo", "nccl"):
        assert resolve_backend(requested, world, device) == expected
    else:
        with raises_code(InvalidConfigError, ErrorCode.NO_GPU):
            resolve_backend(requested, world, device)


def test_device_cuda_without_a_gpu_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --device cuda runs")
    argv = ["run", "--no-progress", "--out", str(tmp_path / "run"), "--backend", "gloo", "--device", "cuda"]
    failed = cli_error(capsys, argv)
    assert failed.exit_code == 2 and failed.code == ErrorCode.NO_GPU and failed.err.count("\n") == 1, failed.err
    assert "--device cuda" in failed.text  # the option to change
    assert not (tmp_path / "run").exists()
