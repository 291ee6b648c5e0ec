"""`ppscope rebalance --model M --stages P --gpu G` with no run, and `ppscope plan --gpu G`: the cost model's
figures on the command line, its JSON keys and its one-line refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from error_helpers import cli_error

from ppscope.balance.modelled.gpus import GPUS
from ppscope.cli.main import main
from ppscope.errors import ErrorCode

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
TODAYS_KEYS = ("current_split", "proposed_split", "stage_times_ms", "predicted_speedup", "vllm_env", "sglang_env")


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    out: dict = json.loads(capsys.readouterr().out)
    return out


def test_no_run_advice_has_todays_keys_and_moves_layers_off_the_heavy_head(
    capsys: pytest.CaptureFixture[str],
) -> None:
    d = _json(capsys, "rebalance", "--model", "llama3-8b", "--stages", "4", "--gpu", "h100-sxm", "--batch", "1")
    for key in TODAYS_KEYS:
        assert key in d
    assert d["cost_source"] == "model" and d["calibration"] is None and d["measured_stage_ms"] is None
    assert d["current_split"] == [8, 8, 8, 8]  # vLLM's rule
    # Llama-3-8B's LM head reads 128256 x 4096 weights, 2.4 layers' worth: the last stage sheds layers.
    head_layers = d["model_costs"]["head"]["weight_bytes"] / d["model_costs"]["layers"][0]["weight_bytes"]
    assert head_layers == pytest.approx(128256 * 4096 / 218_112_000, rel=1e-3)  # ≈ 2.41
    assert d["proposed_split"][-1] < 8 and d["predicted_speedup"] > 1.1
    layer = d["costs"]["layer_ms"][0]
    assert d["stage_times_ms"]["current"][1] == pytest.approx(8 * layer)
    assert any("h100-sxm" in a and "datasheet" in a for a in d["assumptions"])


@pytest.mark.parametrize(
    "model", ["deepseek-v3", str(CONFIGS / "mixtral-8x22b.json"), "qwen2.5-72b", str(CONFIGS / "qwen3-32b.json")]
)
def test_published_models_take_every_option(capsys: pytest.CaptureFixture[str], model: str) -> None:
    argv = ["rebalance", "--model", model, "--stages", "4", "--gpu", "h200", "--phase", "prefill", "--tp", "8"]
    d = _json(capsys, *argv, "--batch", "2", "--context", "1024", "--dtype", "fp8")
    assert sum(d["proposed_split"]) == len(d["costs"]["layer_ms"]) and d["predicted_speedup"] >= 1.0
    assert d["model_costs"]["tp"] == 8 and d["model_costs"]["phase"] == "prefill"
    assert any("TP=8" in a and "all-reduce" in a for a in d["assumptions"])


def test_deepseek_v3_moe_layers_cost_more_than_its_dense_ones_at_batch_16(
    capsys: pytest.CaptureFixture[str],
) -> None:
    d = _json(capsys, "rebalance", "--model", "deepseek-v3", "--stages", "8", "--gpu", "b200", "--dtype", "fp8")
    ms = d["costs"]["layer_ms"]
    assert ms[0] == ms[1] == ms[2] < ms[3] == ms[60]  # 3 dense, then MoE layers reading ~100 of 256 experts
    assert d["proposed_split"][0] > d["current_split"][0]  # the cheap dense layers go to the first stage


def test_text_report_names_the_source_and_the_assumptions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rebalance", "--model", "llama3-70b", "--stages", "4", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert "modelled from llama3-70b on h100-sxm, no run" in out and "memory-bound" in out
    assert "Assumptions:" in out and "NVIDIA H100" in out
    assert "KEEP" in out and "VLLM_PP_LAYER_PARTITION=" not in out  # +0.7%: no paste line for a split not advised


def test_paste_lines_fit_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    """The cost model times serving passes: vLLM and SGLang lines, not Megatron's or torchtitan's."""
    argv = ["rebalance", "--model", "llama3-8b", "--stages", "4", "--gpu", "h100", "--current-split", "12,8,6,6"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "ready to paste (a serving job):" in out and "VLLM_PP_LAYER_PARTITION=" in out
    assert "Megatron" not in out and "torchtitan" not in out
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["job"] == "serving" and d["vllm_env"] and d["megatron_layout"] is None and d["deepspeed"] is None


@pytest.mark.parametrize(
    ("argv", "code", "names"),
    [  # what the message names: the valid choices, the value refused, the counts
        (["--gpu", "v100"], ErrorCode.UNKNOWN_CHOICE, ("'v100'", ", ".join(GPUS))),
        ([], ErrorCode.MISSING_OPTION, ("--gpu", "llama3-8b", ", ".join(GPUS))),
        (["--gpu", "h100", "--stages", "0"], ErrorCode.BAD_VALUE, ()),
        (["--gpu", "h100", "--phase", "all"], ErrorCode.CONFLICTING_OPTIONS, ("--phase decode", "--phase prefill")),
        (["--gpu", "l4", "--dtype", "fp32"], ErrorCode.UNKNOWN_CHOICE, ("bf16, fp16 or fp8",)),
        (["--gpu", "l4", "--batch", "0"], ErrorCode.BAD_VALUE, ("--batch",)),
        (["--gpu", "l4", "--tp", "3"], ErrorCode.HEADS_NOT_DIVISIBLE, ("--tp 3",)),
        (["--gpu", "l4", "--current-split", "8,8"], ErrorCode.SPLIT_STAGE_COUNT, ("8,8",)),
    ],
)
def test_bad_input_is_one_line(
    argv: list[str], code: ErrorCode, names: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["rebalance", "--model", "llama3-8b"] + ([] if "--stages" in argv else ["--stages", "4"])
    failed = cli_error(capsys, [*base, *argv])
    assert failed.exit_code == 2 and failed.code == code, failed
    assert failed.err.count("\n") == 1 and all(name in failed.text for name in names), failed


def test_a_config_without_a_needed_field_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = json.loads((CONFIGS / "qwen3-8b.json").read_text())
    del cfg["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    argv = ["rebalance", "--model", str(tmp_path / "config.json"), "--stages", "2", "--gpu", "l40s"]
    failed = cli_error(capsys, argv)
    assert failed.exit_code == 2 and failed.code == ErrorCode.BAD_MODEL_CONFIG and failed.err.count("\n") == 1
    assert "num_hidden_layers" in failed.text  # the field it lacks


def _fewest_stages(text: str) -> tuple[int, str]:
    """The fewest stages that fit and their split, as a refusal names them: in the command to run at that size
    (`--stages N`), and as the one list of layer counts that sums to deepseek-v3's 61 layers."""
    stages = re.search(r"--stages (\d+)", text)
    assert stages is not None, text
    (split,) = [s for s in re.findall(r"\d+(?:,\d+)+", text) if sum(int(n) for n in s.split(",")) == 61]
    return int(stages.group(1)), split


def test_memory_limits_apply_to_modelled_costs(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["rebalance", "--model", "llama3-70b", "--stages", "4", "--gpu", "a100-80gb", "--gpu-mem-gib", "80"]
    d = _json(capsys, *argv)
    assert d["kv_capacity_tokens"]["proposed"] > 0 and d["warnings"] == []
    d = _json(capsys, "rebalance", "--model", "llama3.1-405b", "--stages", "2", "--gpu", "h200", "--tp", "8")
    old = _json(capsys, "rebalance", "--model", "llama3-405b", "--stages", "2", "--gpu", "h200", "--tp", "8")
    assert [w["code"] for w in old["warnings"]][:1] == ["renamed_preset"]  # the old name works, with a note
    assert old["stage_times_ms"] == d["stage_times_ms"]
    assert any(a.startswith("memory checked: the split search kept each stage's") for a in d["assumptions"])


def test_a_model_that_does_not_fit_gets_no_split_but_the_fewest_stages_that_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """671 B parameters do not fit on four 80 GB GPUs, even in the FP8 DeepSeek-V3 ships: no split, no paste
    line, exit 5, and the fewest stages at this TP that hold it, with their split."""
    failed = cli_error(capsys, ["rebalance", "--model", "deepseek-v3", "--stages", "4", "--gpu", "h100-sxm"])
    assert failed.exit_code == 5 and failed.code == ErrorCode.NO_SPLIT_FITS  # no split, the refusal's code
    assert failed.err.count("\n") == 1
    stages, named = _fewest_stages(failed.text)
    split = [int(n) for n in named.split(",")]
    assert len(split) == stages and sum(split) == 61
    d = _json(capsys, "rebalance", "--model", "deepseek-v3", "--stages", str(stages), "--gpu", "h100-sxm")
    assert d["proposed_split"] == split  # the advice at that size fits, as the refusal said
    fewer = ["rebalance", "--model", "deepseek-v3", "--stages", str(stages - 1), "--gpu", "h100-sxm"]
    failed = cli_error(capsys, fewer)  # one stage fewer: refused the same way
    assert failed.exit_code == 5 and _fewest_stages(failed.text) == (stages, named)
    assert any("deepseek-v3's checkpoint ships them" in a for a in d["assumptions"])  # its own dtype, said


def test_plan_prints_each_stages_decode_step_from_the_same_model(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "llama3-70b", "--gpus", "4", "--pp", "4", "--gpu", "h100-sxm", "--batch", "1"]
    d = _json(capsys, *argv)
    steps = d["step_times"]
    assert steps["gpu"] == "h100-sxm" and len(steps["stage_ms"]) == 4
    r = _json(capsys, "rebalance", "--model", "llama3-70b", "--stages", "4", "--gpu", "h100-sxm", "--batch", "1")
    assert steps["stage_ms"] == pytest.approx(r["stage_times_ms"]["current"])  # one cost model for both
    assert d["usable_bytes_per_gpu"] == int(81_559 * 2**20 * 0.9)  # the H100's 81,559 MiB the driver reports
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "decode step on h100-sxm" in out and "micro-batch steps/s" in out
    d = _json(capsys, "plan", "--model", "qwen3-32b", "--gpus", "2", "--gpu", "mi300x")
    assert d["usable_bytes_per_gpu"] == int(205_822_885_888 * 0.9) and d["step_times"]["stage_ms"]  # rocm-smi


def test_model_advice_says_it_is_not_a_training_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rebalance", "--model", "llama3-8b", "--stages", "4", "--gpu", "h100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["training"] is None  # the key every rebalance JSON has
    assert main(["rebalance", "--model", "llama3-8b", "--stages", "4", "--gpu", "h100"]) == 0
    assert "training run" not in capsys.readouterr().out
