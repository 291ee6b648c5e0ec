"""Emulated GPU stages: the synthetic model's waits made from the cost model, in the run config and its flags."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from ppscope.balance.advise.problem import BalanceProblem
from ppscope.balance.advise.rebalance import rebalance
from ppscope.balance.costs import LayerCosts
from ppscope.balance.modelled import ModelShape, Workload, gpu_named, model_costs
from ppscope.cli.engine_options import add_engine_arguments, engine_config
from ppscope.engine.config import EngineConfig
from ppscope.engine.emulate import MEAN_STAGE_MS, WAIT_RESOLUTION_MS, emulation
from ppscope.errors import InvalidConfigError


def _modelled(model: str = "llama3-8b", gpu: str = "h100-sxm", batch: int = 1, context: int = 36) -> LayerCosts:
    return model_costs(
        ModelShape.from_name(model), gpu_named(gpu), Workload(batch=batch, context=context)
    ).layer_costs()


def test_the_waits_are_the_cost_model_s_times_scaled_by_one_factor() -> None:
    made = emulation("llama3-8b", "h100-sxm", stages=4, batch=1, context=36)
    parts = _modelled()
    assert made.layer_ms[1:] == pytest.approx([ms * made.scale for ms in parts.layer_ms[1:]])
    # parts far below the wait's resolution join their neighbour's: the embedding the first layer's, sampling
    # the LM head's, so the whole pass keeps its time
    assert parts.embed_ms * made.scale < WAIT_RESOLUTION_MS and made.embed_ms == 0.0
    assert made.layer_ms[0] == pytest.approx((parts.layer_ms[0] + parts.embed_ms) * made.scale)
    assert made.head_ms == pytest.approx((parts.head_ms + parts.sample_ms) * made.scale)
    total = sum(made.layer_ms) + made.embed_ms + made.head_ms
    assert 20.0 <= total / 4 <= 50.0 and total / 4 == pytest.approx(MEAN_STAGE_MS, rel=0.05)
    assert made.text() == f"emulated llama3-8b on h100-sxm (roofline), ×{made.scale:g} slower"


def test_the_scale_is_the_one_given_and_another_gpu_changes_the_waits() -> None:
    given = emulation("llama3-8b", "h100-sxm", stages=4, batch=1, context=36, scale=10.0)
    parts = _modelled()
    assert given.scale == 10.0 and given.head_ms == pytest.approx((parts.head_ms + parts.sample_ms) * 10)
    slower = emulation("llama3-8b", "a100-80gb", stages=4, batch=1, context=36, scale=10.0)
    assert slower.layer_ms[5] > given.layer_ms[5]  # less memory bandwidth: a memory-bound decode layer takes longer


def test_the_emulated_pipeline_has_the_real_model_s_imbalance() -> None:
    # vLLM's 8,8,8,8 leaves the LM head on the last stage, which the rebalancer lightens, as on real GPUs
    made = emulation("llama3-8b", "h100-sxm", stages=4, batch=1, context=36)
    costs = LayerCosts(layer_ms=made.layer_ms, embed_ms=made.embed_ms, head_ms=made.head_ms, sample_ms=0.0)
    advice = rebalance(BalanceProblem(costs=costs, stages=4), current=(8, 8, 8, 8))
    assert advice.current.bottleneck == 3 and advice.proposed.split[-1] < 8 and advice.predicted_speedup > 1.05


def test_unknown_model_or_gpu_is_refused_with_the_valid_names() -> None:
    with pytest.raises(InvalidConfigError, match=r"not a model preset; valid: .*llama3-8b"):
        emulation("llama-9", "h100-sxm", stages=4, batch=1, context=36)
    with pytest.raises(InvalidConfigError, match="h100-sxm"):
        EngineConfig.from_fields({"emulate.model": "llama3-8b", "emulate.gpu": "tpu"})
    with pytest.raises(InvalidConfigError, match=r"emulate\.gpu has no effect here"):
        EngineConfig.from_fields({"emulate.gpu": "a100-80gb"})


def test_the_config_section_sets_the_synthetic_model_and_keeps_one_scale_across_splits() -> None:
    cfg = EngineConfig.from_fields({"emulate.model": "llama3-8b", "pipeline.stages": 4})
    assert cfg.model.synthetic and cfg.model.layers == 32 and cfg.emulate.scale > 0
    assert (
        cfg.model.layer_cost_ms
        == emulation(
            "llama3-8b",
            "h100-sxm",
            stages=4,
            batch=1,
            context=cfg.workload.prompt_len + cfg.workload.max_new_tokens // 2,
        ).layer_ms
    )
    # run 2 of a comparison changes the split: the waits stay those of run 1
    other = dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, split=(8, 9, 9, 6)))
    assert other.model == cfg.model and other.emulate == cfg.emulate
    # the flat form (meta.json's config) runs it again as it ran
    flat = cfg.to_json()
    assert flat["emulate_model"] == "llama3-8b" and flat["emulate_scale"] == cfg.emulate.scale
    assert EngineConfig.from_json(flat) == cfg
    with pytest.raises(InvalidConfigError, match=r"model\.name 'llama3-70b' has no effect with emulate\.model"):
        EngineConfig.from_fields({"emulate.model": "llama3-8b", "model.name": "llama3-70b"})


def test_a_toml_emulate_section_and_the_flags_give_the_same_config(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('[pipeline]\nstages = 4\n[emulate]\nmodel = "llama3-8b"\ngpu = "h100-sxm"\n')
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    from_flags = engine_config(parser.parse_args(["--stages", "4", "--emulate", "llama3-8b", "--gpu", "h100-sxm"]))
    from_file = engine_config(parser.parse_args(["--config", str(toml)]))
    assert from_flags == from_file and from_flags.emulate.text().startswith("emulated llama3-8b on h100-sxm")
