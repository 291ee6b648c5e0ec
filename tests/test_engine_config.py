"""The engine's configuration: typed sections, the flat form kept in meta.json and sent to ranks, and the one
table from command-line flags to fields."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest
from error_helpers import raises_code

from ppscope.cli.engine_options import OPTIONS, engine_config, in_flags
from ppscope.cli.main import build_parser
from ppscope.engine.config import (
    FLAT_KEYS,
    BenchConfig,
    EngineConfig,
    ModelConfig,
    OutputConfig,
    PipelineConfig,
    RuntimeConfig,
    WorkloadConfig,
)
from ppscope.errors import ErrorCode, InvalidConfigError, InvalidSplitError


def _given(tmp_path: Path) -> EngineConfig:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2]}\n')
    return EngineConfig(
        pipeline=PipelineConfig(stages=2, schedule="gpipe", microbatches=3, split=(1, 3)),
        model=ModelConfig(name="synthetic", layers=4, layer_cost_ms=(1.0, 2.0, 3.0, 4.5), head_cost_ms=2.0),
        workload=WorkloadConfig(prompts=prompts, max_new_tokens=3, temperature=0.7, top_p=0.9, seed=5),
        output=OutputConfig(out=tmp_path / "run", nvtx=False, progress=False),
        runtime=RuntimeConfig(backend="gloo", timeout_s=30.0),
        bench=BenchConfig(record_alternate_ms=20.0),
    )


def test_the_config_travels_whole_as_a_pickle_and_as_its_flat_form(tmp_path: Path) -> None:
    cfg = _given(tmp_path)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    flat = json.loads(json.dumps(cfg.to_json()))  # what a spawned rank gets, and meta.json keeps
    assert EngineConfig.from_json(flat) == cfg
    assert flat["split"] == [1, 3] and flat["layer_cost_ms"] == [1.0, 2.0, 3.0, 4.5] and flat["model"] == "synthetic"
    assert flat["out"] == str(tmp_path / "run") and flat["timeout_s"] == 30.0 and flat["record"] is True
    assert set(flat) == set(FLAT_KEYS) and len(flat) == 35 and flat["device"] == "auto"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.pipeline.stages = 3  # type: ignore[misc]


def test_an_older_run_s_flat_config_still_reads() -> None:
    """Before the sections, meta.json's config held the split and the layer costs as the text given."""
    old = {
        "stages": 2,
        "schedule": "serve",
        "microbatches": 0,
        "chunks": 1,
        "max_inflight": 2,
        "max_batch": 1,
        "model": "synthetic",
        "layers": 2,
        "layer_cost_ms": "0.5,1",
        "embed_cost_ms": 0.0,
        "head_cost_ms": 0.0,
        "split": "1,1",
        "requests": 8,
        "prompt_len": 16,
        "max_new_tokens": 8,
        "prompts": None,
        "seed": 0,
        "rate": 0.0,
        "temperature": 0.0,
        "top_p": 1.0,
        "backend": "auto",
        "dtype": "float32",
        "timeout_s": 60.0,
        "record": False,
        "out": "runs/r1",
        "progress": True,
        "nvtx": True,
        "sample_interval_ms": 100.0,
        "record_alternate_ms": 0.0,
    }
    cfg = EngineConfig.from_json(old)
    assert cfg.pipeline.split == (1, 1) and cfg.model.layer_cost_ms == (0.5, 1.0) and cfg.output.out == Path("runs/r1")
    assert cfg.pipeline.max_inflight == 2 and cfg.output.record is False
    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CONFIG_KEY):
        EngineConfig.from_json({**old, "stage": 2})


def test_a_refusal_names_the_field() -> None:
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE) as err:
        PipelineConfig(microbatches=-1)
    assert "pipeline.microbatches" in str(err.value)
    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CHOICE) as err:
        RuntimeConfig(backend="mpi")
    assert "runtime.backend" in str(err.value)
    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CHOICE) as err:
        ModelConfig(dtype="int8")
    assert "model.dtype" in str(err.value)
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE) as err:
        OutputConfig(sample_interval_ms=0.0)
    assert "output.sample_interval_ms" in str(err.value)
    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CONFIG_KEY) as err:
        EngineConfig.from_fields({"pipeline.stage": 2})
    assert "pipeline.stage" in str(err.value)


def test_derived_values_belong_to_their_section() -> None:
    assert PipelineConfig(stages=3).inflight == 3 and PipelineConfig(stages=3, max_inflight=5).inflight == 5
    assert PipelineConfig(stages=2, schedule="interleaved", chunks=2).virtual_stages == 4
    synthetic = ModelConfig(name="synthetic", layers=3, layer_cost_ms=(2.0,))
    assert synthetic.synthetic and synthetic.layer_costs_ms() == [2.0, 2.0, 2.0] and synthetic.shape().layers == 3
    assert ModelConfig().layer_costs_ms() == [] and ModelConfig().shape().name == "tiny"


@pytest.mark.parametrize("command", ["run", "tune"])
def test_the_command_line_s_defaults_are_the_config_s(command: str) -> None:
    assert engine_config(build_parser().parse_args([command])) == EngineConfig()


def test_text_is_parsed_once_into_typed_values() -> None:
    args = build_parser().parse_args(
        [
            "run",
            "--model",
            "synthetic",
            "--layers",
            "2",
            "--layer-cost-ms",
            "1,2.5",
            "--split",
            "1, 1",
            "--prompts",
            __file__,
            "--max-new-tokens",
            "2",
            "--out",
            "runs/x",
            "--timeout",
            "9",
            "--no-record",
        ]
    )
    cfg = engine_config(args)
    assert cfg.model.layer_cost_ms == (1.0, 2.5) and cfg.pipeline.split == (1, 1)
    assert cfg.workload.prompts == Path(__file__) and cfg.output.out == Path("runs/x")
    assert cfg.runtime.timeout_s == 9.0 and cfg.output.record is False
    with raises_code(InvalidSplitError, ErrorCode.SPLIT_NOT_INTEGERS):
        engine_config(build_parser().parse_args(["run", "--split", "2,x"]))
    with raises_code(InvalidConfigError, ErrorCode.SPLIT_NOT_INTEGERS):
        engine_config(build_parser().parse_args(["run", "--split", " "]))
    assert engine_config(build_parser().parse_args(["run", "--out", ""])).output.out is None  # the default directory


def test_every_field_but_the_benchmarks_and_the_counter_period_has_one_flag() -> None:
    fields = {f"{section}.{name}" for section, name in FLAT_KEYS.values()}
    by_option = [o.field for o in OPTIONS]
    assert len(by_option) == len(set(by_option)) and set(by_option) <= fields
    assert fields - set(by_option) == {
        "output.sample_interval_ms",
        "bench.record_alternate_ms",
        "bench.layer_spans_alternate_ms",
    }


def test_messages_are_worded_in_flags() -> None:
    assert (
        in_flags("pipeline.chunks 2 needs pipeline.schedule interleaved") == "--chunks 2 needs --schedule interleaved"
    )
    assert in_flags("runtime.timeout_s must be > 0; model.name 'x'") == "--timeout must be > 0; --model 'x'"
    assert in_flags("bench.record_alternate_ms, a.pipeline.stages") == "bench.record_alternate_ms, a.pipeline.stages"


@pytest.mark.parametrize(
    ("given", "name"),
    [("fp16", "float16"), ("bf16", "bfloat16"), ("FP32", "float32"), ("float64", "float64"), ("fp64", "float64")],
)
def test_every_command_takes_both_spellings_of_a_dtype(
    given: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ppscope.cli.main import main

    assert ModelConfig(dtype=given).dtype == name
    assert main(["plan", "--model", "llama3-8b", "--gpus", "2", "--dtype", given, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == given


def _toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return str(path)


def test_a_toml_file_in_sections_gives_the_run_and_flags_given_override_it(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        '[pipeline]\nstages = 3\nschedule = "gpipe"\nsplit = [3, 3, 2]\n'
        '[model]\nname = "synthetic"\nlayers = 8\nlayer_cost_ms = [1.5]\n'
        "[output]\nrecord = false\n[runtime]\ntimeout_s = 9\n",
    )
    cfg = engine_config(build_parser().parse_args(["run", "--config", path]))
    assert cfg == EngineConfig.from_file(path)
    assert (cfg.pipeline.stages, cfg.pipeline.schedule, cfg.pipeline.split) == (3, "gpipe", (3, 3, 2))
    assert cfg.model.name == "synthetic" and cfg.model.layer_cost_ms == (1.5,) and cfg.output.record is False
    # a flag given on the command line wins, even at its default value; one not given leaves the file's value
    args = build_parser().parse_args(["run", "--config", path, "--timeout", "60", "--split", "4,2,2"])
    cfg = engine_config(args)
    assert cfg.runtime.timeout_s == 60.0 and cfg.pipeline.split == (4, 2, 2) and cfg.pipeline.stages == 3
    assert engine_config(build_parser().parse_args(["tune", "--config", path, "--stages", "2", "--split", "4,4"]))


def test_a_run_s_meta_json_runs_it_again_into_a_new_directory(tmp_path: Path) -> None:
    ran = EngineConfig.from_fields(
        {"pipeline.stages": 4, "pipeline.schedule": "gpipe", "model.name": "synthetic", "output.out": tmp_path / "r1"}
    )
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"schema_version": 2, "config": ran.to_json()}))
    again = engine_config(build_parser().parse_args(["run", "--config", str(meta)]))
    assert again == dataclasses.replace(ran, output=dataclasses.replace(ran.output, out=None))


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("[pipline]\nstages = 2\n", ErrorCode.UNKNOWN_CONFIG_KEY),
        ("[pipeline]\nstage = 2\n", ErrorCode.UNKNOWN_CONFIG_KEY),
        ("[pipeline\nstages = 2\n", ErrorCode.CONFIG_FILE_UNREADABLE),
        ("[pipeline]\nstages = 0\n", ErrorCode.BAD_VALUE),
    ],
)
def test_a_bad_config_file_is_one_line_that_names_what_is_wrong(tmp_path: Path, text: str, code: ErrorCode) -> None:
    with raises_code(InvalidConfigError, code):
        engine_config(build_parser().parse_args(["run", "--config", _toml(tmp_path, text)]))


def test_a_missing_config_file_is_refused(tmp_path: Path) -> None:
    with raises_code(InvalidConfigError, ErrorCode.CONFIG_FILE_UNREADABLE):
        EngineConfig.from_file(tmp_path / "none.toml")
