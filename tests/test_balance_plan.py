"""The capacity planner: bytes per stage, the 70B sanity example, layout rules, the split that fixes memory."""

from __future__ import annotations

import json

import pytest
from error_helpers import cli_error, raises_code

from ppscope.balance.modelled.plan import GIB, Cluster, PlanConfig, plan
from ppscope.balance.modelled.shapes import ModelShape
from ppscope.cli.main import main
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.notices import NoticeCode

LLAMA70 = ModelShape.from_name("llama3-70b")


def seventy_b_on_four(gpu_mem_gib: float) -> PlanConfig:
    return PlanConfig(model=LLAMA70, cluster=Cluster(gpus=4, gpu_mem_gib=gpu_mem_gib), pp=4, max_model_len=8192)


def test_70b_fp16_pp4_holds_35_gb_of_weights_per_gpu_not_17_5() -> None:
    result = plan(seventy_b_on_four(80))
    weights = [s.weights_bytes for s in result.stages]
    assert sum(weights) == pytest.approx(LLAMA70.params * 2, rel=0.01)  # only the logits buffer on top
    for w in weights:
        assert w == pytest.approx(70e9 * 2 / 4, rel=0.05)  # ≈ 35 GB, never 17.5 GB
    assert result.stages[0].extra_bytes == LLAMA70.embed_params * 2
    assert result.stages[-1].extra_bytes > LLAMA70.head_params * 2  # LM head plus the logits buffer
    assert result.kv_bytes_per_token_per_layer == 2 * 8 * 128 * 2


@pytest.mark.parametrize(("dtype", "nbytes"), [("float64", 8), ("float32", 4), ("bf16", 2), ("fp8", 1)])
def test_kv_bytes_per_token_per_layer_is_k_and_v_of_every_kv_head(dtype: str, nbytes: int) -> None:
    tiny = ModelShape.from_name("tiny")  # 4 KV heads of 256 / 8 = 32 dimensions
    assert tiny.kv_bytes_per_token_per_layer(dtype) == 2 * 4 * 32 * nbytes  # the engine's float64 too


def test_70b_pp4_has_almost_no_kv_room_on_40_gib_and_ample_on_80() -> None:
    small, large = plan(seventy_b_on_four(40)), plan(seventy_b_on_four(80))
    assert small.config.cluster.usable_bytes == int(36 * GIB)
    assert NoticeCode.LITTLE_KV_ROOM in {w.code for w in small.warnings}
    assert small.pipeline_kv_sequences <= 4
    assert not large.warnings and large.kv_verdict == "ample" and small.kv_verdict == "almost none"
    assert large.pipeline_kv_sequences >= 10 * max(small.pipeline_kv_sequences, 1)
    # the ends carry the embedding and the LM head: moving a layer off each end raises the pipeline's capacity
    assert small.fix_split is not None and small.fix_split[0] < 20 and small.fix_split[-1] < 20
    assert small.fix_stages is not None
    assert min(s.kv_tokens for s in small.fix_stages) > small.pipeline_kv_tokens


def test_a_stage_that_runs_out_of_memory_is_named_with_the_fixing_split() -> None:
    cfg = PlanConfig(model=LLAMA70, cluster=Cluster(gpus=4, gpu_mem_gib=38), pp=4, max_model_len=8192, reserve_gib=0.5)
    result = plan(cfg)
    oom = [n.text for n in result.warnings if n.code == NoticeCode.OUT_OF_MEMORY]
    assert oom and all(("stage 0" in text) or ("stage 3" in text) for text in oom)  # the stage is named
    assert result.kv_verdict == "out of memory"
    assert result.fix_split is not None and result.fix_stages is not None
    assert all(s.fits for s in result.fix_stages)
    assert result.to_dict()["fix_vllm_env"].startswith("VLLM_PP_LAYER_PARTITION=")


@pytest.mark.parametrize(
    ("model", "gpus", "mem", "latency", "tp", "pp"),
    [
        ("llama3-8b", 8, 80, False, 1, 1),  # fits on one GPU
        ("llama3-70b", 8, 40, False, 8, 1),  # fits in a node with TP
        ("llama3.1-405b", 16, 80, False, 8, 2),  # TP = GPUs per node x PP across nodes
        ("llama3-8b", 8, 80, True, 8, 1),  # latency-sensitive: widest TP, smallest PP
    ],
)
def test_layout_rules(model: str, gpus: int, mem: float, latency: bool, tp: int, pp: int) -> None:
    cfg = PlanConfig(
        model=ModelShape.from_name(model), cluster=Cluster(gpus=gpus, gpu_mem_gib=mem), latency_sensitive=latency
    )
    layout = plan(cfg).layout
    assert (layout.tp, layout.pp) == (tp, pp)
    assert layout.replicas == gpus // (tp * pp)


def test_too_big_says_what_to_do() -> None:
    cfg = PlanConfig(model=ModelShape.from_name("llama3.1-405b"), cluster=Cluster(gpus=4, gpu_mem_gib=40))
    with raises_code(InvalidConfigError, ErrorCode.NOT_ENOUGH_MEMORY):
        plan(cfg)
    with raises_code(InvalidConfigError, ErrorCode.WORLD_SIZE_MISMATCH):
        plan(PlanConfig(model=LLAMA70, cluster=Cluster(gpus=4), tp=2, pp=4))
    with raises_code(InvalidConfigError, ErrorCode.HEADS_NOT_DIVISIBLE):
        plan(PlanConfig(model=LLAMA70, cluster=Cluster(gpus=8), tp=3))
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        Cluster(gpus=4, gpu_memory_utilization=1.5)


def test_cli_plan_json_and_text(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = [
        "plan",
        "--model",
        "llama3-70b",
        "--gpus",
        "4",
        "--gpu-mem-gib",
        "40",
        "--pp",
        "4",
        "--max-model-len",
        "8192",
    ]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in (
        "tp",
        "pp_size",
        "stages",
        "pipeline_kv_tokens",
        "kv_bytes_per_token_per_layer",
        "fix_split",
        "assumptions",
    ):
        assert key in data
    assert data["stages"][1]["weights_bytes"] == pytest.approx(35e9, rel=0.05)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert (
        "room for KV cache is ALMOST NONE" in text
        and "almost no room for KV cache" in text
        and "VLLM_PP_LAYER_PARTITION=" in text
        and "Assumptions" in text
    )
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "num_hidden_layers": 4,
                "hidden_size": 256,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "intermediate_size": 1024,
                "vocab_size": 8192,
                "max_position_embeddings": 512,
            }
        )
    )
    assert main(["plan", "--model", str(config), "--gpus", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tp"] == 1
    failed = cli_error(capsys, ["plan", "--model", "nope", "--gpus", "1"])
    assert failed.exit_code == 2 and failed.code == ErrorCode.UNKNOWN_CHOICE
    assert "'nope'" in failed.text and "llama3-8b" in failed.text  # the name, and the valid ones
