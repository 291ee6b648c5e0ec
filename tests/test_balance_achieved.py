"""The GPU table and presets against their sources, and the modelled decode times against published
measurements: each achieved-efficiency factor reproduces the measurement it was fitted to and predicts one it
was not fitted to within 15% (the sources are cited in ppscope/balance/modelled/gpus.py and in the note on
achieved efficiency in docs/ARCHITECTURE.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ppscope.balance.modelled.gpus import GPUS, NO_MEASUREMENT, gpu_named
from ppscope.balance.modelled.roofline import ALLREDUCE_LATENCY_S, Workload, model_costs
from ppscope.balance.modelled.shapes import PRESETS, RENAMED, ModelShape, RopeScaling, all_presets, renamed_note
from ppscope.trace.notices import NoticeCode

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
# Llama-2-7B (meta-llama/Llama-2-7b-hf config.json): the held-out model, in no preset.
LLAMA2_7B = ModelShape(name="llama2-7b", layers=32, hidden=4096, heads=32, kv_heads=32, intermediate=11008, vocab=32000)


def _decode_ms(shape: ModelShape, gpu: str, *, dtype: str = "bf16", peak: bool = False) -> float:
    """One batch-1 decode step of the whole model on one GPU, ms: what a tok/s measurement inverts."""
    g = gpu_named(gpu).at_peak() if peak else gpu_named(gpu)
    c = model_costs(shape, g, Workload(phase="decode", batch=1, context=128, dtype=dtype)).layer_costs()
    return sum(c.layer_ms) + c.embed_ms + c.head_ms + c.sample_ms


@pytest.mark.parametrize(
    ("model", "gpu", "tok_s", "fitted"),
    [
        ("llama3-8b", "h100-sxm", 126.90, True),  # torchao quantization README, H100, Llama-3.1-8B bf16
        ("llama3-8b", "a100-80gb", 95.64, True),  # torchao quantization README, A100-80GB, Llama-3-8B bf16
        ("llama3-8b", "h100-sxm", 133.44, False),  # torchao float8_benchmark_results.txt, its bf16 baseline
        ("llama2-7b", "a100-80gb", 104.9, False),  # gpt-fast README, A100-80GB (330 W), Llama-2-7B base
        ("llama2-7b", "a100-80gb", 107.38, False),  # torchao quantization README, A100-80GB, Llama-2-7B bf16
    ],
)
def test_modelled_decode_matches_published_measurements(model: str, gpu: str, tok_s: float, fitted: bool) -> None:
    shape = LLAMA2_7B if model == "llama2-7b" else ModelShape.from_name(model)
    measured_ms = 1e3 / tok_s
    ratio = _decode_ms(shape, gpu) / measured_ms
    assert ratio == pytest.approx(1, abs=0.005 if fitted else 0.15)
    assert _decode_ms(shape, gpu, peak=True) / measured_ms < 0.75  # the datasheet peaks: far too fast


def test_factors_scale_the_bandwidth_and_say_where_they_come_from() -> None:
    h100 = gpu_named("h100-sxm")
    assert h100.bandwidth == pytest.approx(3.35e12 * 0.569) and h100.at_peak().bandwidth == 3.35e12
    assert {g.achieved for g in GPUS.values() if g.family == "Hopper"} == {h100.achieved}
    assert "126.90 tok/s" in h100.achieved.memory_source and "torchao" in h100.achieved.memory_source
    assert h100.achieved.compute == 1 and h100.achieved.compute_source == NO_MEASUREMENT
    for name in ("l4", "l40s", "b200", "mi300x"):  # nothing published measures these families
        assert gpu_named(name).achieved.memory == 1 and gpu_named(name).achieved.memory_source == NO_MEASUREMENT
    lines = model_costs(ModelShape.from_name("llama3-8b"), h100, Workload()).assumptions()
    assert any("3.35 TB/s × 0.569 achieved" in a and "torchao" in a for a in lines)
    peak = model_costs(ModelShape.from_name("llama3-8b"), h100.at_peak(), Workload()).assumptions()
    assert any("× 1 achieved" in a and "--peak" in a for a in peak)


def test_memory_is_the_drivers_gib_for_planning_and_the_datasheets_gb_for_display() -> None:
    mib = {"l4": 23_034, "l40s": 46_068, "h100-sxm": 81_559, "h200": 143_771, "b200": 183_359, "h20": 97_871}
    mib |= {"h100-nvl": 95_830, "h200-nvl": 143_771, "a100-80gb": 81_920, "a100-40gb": 40_960}
    for name, smi in mib.items():
        assert GPUS[name].memory_gib == smi / 1024 and f"{smi:,} MiB" in GPUS[name].memory_gib_source
    assert GPUS["mi300x"].memory_gib == 205_822_885_888 / 2**30
    assert round(GPUS["l4"].memory_gib, 2) == 22.49 and GPUS["l4"].memory_gb == 24
    assert (GPUS["h20"].memory_gb, GPUS["h100-nvl"].memory_gb, GPUS["h200-nvl"].memory_gb) == (96, 94, 141)


def test_corrected_datasheet_figures() -> None:
    assert GPUS["b200"].memory_tb_per_s == 7.7  # the HGX B200 column per GPU, not the DGX's 64 TB/s ÷ 8
    assert (GPUS["h20"].memory_tb_per_s, GPUS["h20"].bf16_tflops, GPUS["h20"].fp8_tflops) == (4.0, 148, 296)
    assert (GPUS["h100-nvl"].memory_tb_per_s, GPUS["h100-nvl"].bf16_tflops) == (3.9, 1671 / 2)
    assert (GPUS["h200-nvl"].memory_tb_per_s, GPUS["h200-nvl"].fp8_tflops) == (4.8, 3341 / 2)
    mi = GPUS["mi300x"]
    assert (mi.topology, mi.peer_links, mi.link_gb_per_s) == ("mesh", 7, 64)  # 128 GB/s bidirectional per link
    assert [mi.peer_bandwidth(p) for p in (1, 3, 7, 9)] == [64e9, 192e9, 448e9, 448e9]
    assert (
        GPUS["h100-sxm"].peer_bandwidth(1) == GPUS["h100-sxm"].peer_bandwidth(7) == 450e9
    )  # NVSwitch: every peer at the port's bandwidth


def test_mi300x_tp2_all_reduce_uses_one_link() -> None:
    m = ModelShape.from_name("llama3-70b")
    mi = gpu_named("mi300x")
    two = model_costs(m, mi, Workload(batch=16, context=2048, tp=2)).layers[0]
    message = 16 * 8192 * 2
    assert two.comm_ms == pytest.approx(2 * (ALLREDUCE_LATENCY_S + 2 * 1 / 2 * message / 64e9) * 1e3)
    eight = model_costs(m, mi, Workload(batch=16, context=2048, tp=8)).layers[0]
    assert eight.comm_ms == pytest.approx(2 * (ALLREDUCE_LATENCY_S + 2 * 7 / 8 * message / 448e9) * 1e3)


def test_latent_attention_runs_absorbed_in_decode_and_expanded_in_prefill() -> None:
    m = ModelShape.from_name("deepseek-v3")
    h100 = gpu_named("h100-sxm")
    decode = model_costs(m, h100, Workload(phase="decode", batch=64, context=32_768)).layers[0]
    attention = 2 * 64 * 128 * ((512 + 64) + 512) * 32_768  # keys 576 wide, values 512, per head
    assert decode.flops == 2 * 64 * m.active_params(0) + attention
    prefill = model_costs(m, h100, Workload(phase="prefill", batch=1, context=1024)).layers[0]
    assert prefill.flops == 2 * 1024 * m.active_params(0) + 2 * 128 * (192 + 128) * 1024 * 1025 / 2


def test_llama31_405b_is_its_config_and_the_old_name_gives_it_with_a_note() -> None:
    read = ModelShape.from_hf_config(CONFIGS / "llama3.1-405b.json")
    preset = PRESETS["llama3.1-405b"]
    assert preset.max_seq_len == 131_072 and preset.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    assert dataclasses.replace(read, name=preset.name, config_source=preset.config_source) == preset
    assert ModelShape.from_name("llama3-405b") is preset and ModelShape.from_spec("llama3-405b") is preset
    assert RENAMED == {"llama3-405b": "llama3.1-405b"} and "llama3-405b" not in all_presets()
    note = renamed_note("llama3-405b")
    assert note is not None and note.code == NoticeCode.RENAMED_PRESET and renamed_note("llama3-70b") is None


def test_every_preset_cites_its_source_and_the_new_ones_are_their_configs() -> None:
    assert all(m.config_source for m in all_presets().values())
    mixtral = ModelShape.from_name("mixtral-8x7b")
    assert mixtral.moe is not None and (mixtral.moe.experts, mixtral.moe.per_token) == (8, 2)
    assert round(mixtral.params / 1e9, 1) == 46.7  # the model card's 46.7B
    qwen = (CONFIGS / "qwen2.5-72b.json").read_text()
    assert '"max_window_layers": 70,' in qwen  # Qwen2.5-72B-Instruct's; 80 is Qwen2-72B's
