"""The cost model from a model's shape and a GPU's datasheet: sizes against hand-computed ones.

Every expected figure below is written as the arithmetic a reader can redo from the published config.json
(tests/data/configs/), not as a number copied from the code.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from error_helpers import raises_code

from ppscope.balance.modelled.gpus import GPUS, gpu_named
from ppscope.balance.modelled.roofline import ALLREDUCE_LATENCY_S, Workload, expected_experts, model_costs
from ppscope.balance.modelled.shapes import ModelShape
from ppscope.errors import ErrorCode, InvalidConfigError

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
H100 = gpu_named("h100-sxm").at_peak()  # sizes by hand at the datasheet's peaks (tests/test_balance_achieved.py
# checks the shares of them kernels reach)


def test_qwen3_32b_sizes_by_hand() -> None:
    """Dense, grouped-query attention with a head width of its own (128, not 5120 / 64 = 80), q/k norms."""
    m = ModelShape.from_hf_config(CONFIGS / "qwen3-32b.json")
    d, heads, kv, hd, inter, vocab = 5120, 64, 8, 128, 25600, 151936
    attn = (
        d * heads * hd  # q_proj: 5120 x 8192 = 41,943,040
        + 2 * d * kv * hd  # k_proj and v_proj: 2 x 5120 x 1024 = 10,485,760
        + heads * hd * d  # o_proj: 8192 x 5120 = 41,943,040
        + 2 * hd  # q_norm and k_norm: 256
    )
    assert attn == 94_372_096 == m.attn_params
    layer = attn + 3 * d * inter + 2 * d  # + gate/up/down 393,216,000 + two RMSNorms 10,240
    assert layer == 487_598_336 == m.layer_params_at(0) == m.layer_params
    total = 64 * layer + vocab * d + (vocab * d + d)  # layers + embedding + (LM head + final norm); untied
    assert total == 32_762_123_264 == m.params  # the model card: 32.8B
    assert m.kv_bytes_per_token_per_layer("bf16") == 2 * kv * hd * 2 == 4096  # K and V, 8 heads x 128, 2 B

    # One decode step of 4 sequences with 1000 tokens of context each, bf16, on one H100 SXM.
    c = model_costs(m, H100, Workload(phase="decode", batch=4, context=1000, dtype="bf16"))
    one = c.layers[0]
    assert one.weight_bytes == layer * 2 == 975_196_672
    assert one.kv_bytes == 4 * 1000 * 4096 == 16_384_000
    attention = 2 * 4 * heads * (hd + hd) * 1000  # q·k and p·v over 1000 keys, 64 heads, 4 sequences
    assert one.flops == 2 * 4 * layer + attention == 4_031_858_688
    assert one.memory_ms == pytest.approx((975_196_672 + 16_384_000) / 3.35e12 * 1e3)  # 0.2960 ms
    assert one.compute_ms == pytest.approx(4_031_858_688 / 989.5e12 * 1e3)  # 0.0041 ms: memory-bound
    assert one.bound == "memory" and one.ms == one.memory_ms and one.comm_ms == 0
    head = c.head
    assert head.weight_bytes == (vocab * d + d) * 2 == 1_555_834_880
    assert head.other_bytes == 4 * vocab * 4  # fp32 logits of one token per sequence
    assert head.flops == 2 * 4 * d * vocab == 6_223_298_560
    assert c.sample.other_bytes == 4 * vocab * 4


def test_mixtral_8x22b_sizes_by_hand() -> None:
    """Mixture of experts: 8 experts, 2 per token; a batch reads the experts its tokens reach."""
    m = ModelShape.from_hf_config(CONFIGS / "mixtral-8x22b.json")
    d, kv, hd, inter, vocab = 6144, 8, 128, 16384, 32768
    attn = 2 * d * d + 2 * d * kv * hd  # q and o: 6144 x 6144 each; k and v: 6144 x 1024 each
    assert attn == 88_080_384 == m.attn_params
    expert = 3 * d * inter  # gate, up, down: 301,989,888
    layer = attn + d * 8 + 8 * expert + 2 * d  # + router 49,152 + 8 experts + two norms
    assert layer == 2_504_060_928 == m.layer_params
    assert 56 * layer + 2 * vocab * d + d == 140_630_071_296 == m.params  # the model card: 141B
    active = layer - 6 * expert  # a token skips 6 of the 8 experts
    assert active == 692_121_600 == m.active_params(0)
    assert m.kv_bytes_per_token_per_layer("bf16") == 2 * kv * hd * 2 == 4096

    one = model_costs(m, H100, Workload(batch=1, context=1000)).layers[0]
    assert one.weight_bytes == active * 2  # one token reads its 2 experts
    assert one.flops == 2 * active + 2 * 48 * (hd + hd) * 1000
    # Four tokens reach 8 x (1 - (6/8)^4) = 5.46875 distinct experts on average.
    assert expected_experts(8, 2, 4) == pytest.approx(5.46875)
    four = model_costs(m, H100, Workload(batch=4, context=1000)).layers[0]
    assert four.weight_bytes == pytest.approx((layer - (8 - 5.46875) * expert) * 2)  # 3,479,298,048
    assert four.weight_bytes == pytest.approx(3_479_298_048)
    assert four.flops == 2 * 4 * active + 2 * 4 * 48 * 256 * 1000  # FLOPs count the 2 experts per token


def test_deepseek_v3_latent_attention_and_dense_then_moe_layers() -> None:
    m = ModelShape.from_hf_config(CONFIGS / "deepseek-v3.json")
    assert m.moe is not None and m.mla is not None
    assert [m.is_moe_layer(i) for i in range(m.layers)].count(False) == 3 and m.layers == 61  # 3 dense, 58 MoE
    d, h = 7168, 128
    attn = (
        d * 1536
        + 1536  # q_a_proj to the 1536-wide query latent, and its norm
        + 1536 * h * (128 + 64)  # q_b_proj: 128 heads of 128 + 64 (rotary) widths
        + d * (512 + 64)
        + 512  # kv_a_proj_with_mqa to the 512 latent + 64 rotary key, and its norm
        + 512 * h * (128 + 128)  # kv_b_proj: keys (128) and values (128) of every head
        + h * 128 * d  # o_proj
    )
    assert attn == 187_107_328 == m.attn_params
    dense = attn + 3 * d * 18432 + 2 * d
    moe = attn + d * 256 + (256 + 1) * 3 * d * 2048 + 2 * d  # router, 256 routed + 1 shared expert
    assert (m.layer_params_at(0), m.layer_params_at(3)) == (dense, moe) == (583_483_392, 11_507_286_016)
    assert 3 * dense + 58 * moe + 2 * 129280 * d + d == 671_026_404_352 == m.params  # the paper: 671B
    # The cache holds the latent and the rotary key, not per-head K and V: (512 + 64) x 2 B per token per layer,
    # whole on every GPU of a TP group.
    assert m.kv_bytes_per_token_per_layer("bf16") == 1152 == m.kv_bytes_per_token_per_layer_per_gpu("bf16", 8)
    # One token reads 8 routed + 1 shared expert: as many MLP weights as a dense layer has (9 x 44.04M = 396.4M).
    one = model_costs(m, H100, Workload(batch=1, context=1)).layers
    assert m.active_params(3) - attn - d * 256 - 2 * d == 9 * 3 * d * 2048 == 396_361_728 == 3 * d * 18432
    assert one[3].weight_bytes == m.active_params(3) * 2


def test_tensor_parallelism_divides_and_adds_two_all_reduces_per_layer() -> None:
    m = ModelShape.from_name("llama3-70b")
    one = model_costs(m, H100, Workload(batch=16, context=2048)).layers[0]
    eight = model_costs(m, H100, Workload(batch=16, context=2048, tp=8)).layers[0]
    assert eight.weight_bytes == pytest.approx(one.weight_bytes / 8)
    assert eight.kv_bytes == 16 * 2048 * (2 * 1 * 128 * 2)  # 8 KV heads over 8 GPUs: one each
    message = 16 * 8192 * 2  # one token per sequence x hidden, in BF16
    ring = 2 * 7 / 8 * message / 450e9  # 2(T-1)/T of it over each NVLink direction (900 GB/s bidirectional)
    assert eight.comm_ms == pytest.approx(2 * (ALLREDUCE_LATENCY_S + ring) * 1e3)
    with raises_code(InvalidConfigError, ErrorCode.HEADS_NOT_DIVISIBLE):
        model_costs(m, H100, Workload(tp=3))


def test_prefill_is_compute_bound_and_counts_causal_attention() -> None:
    m = ModelShape.from_name("llama3-8b")
    c = model_costs(m, H100, Workload(phase="prefill", batch=2, context=512)).layers[0]
    pairs = 512 * 513 / 2  # causal: position i attends to i + 1 keys
    assert c.flops == 2 * 2 * 512 * m.layer_params + 2 * 2 * 32 * (128 + 128) * pairs
    assert c.kv_bytes == 2 * 512 * m.kv_bytes_per_token_per_layer("bf16")  # written once
    assert c.bound == "compute"


def test_gpu_table_figures_are_dense_and_an_unknown_gpu_lists_the_known_ones() -> None:
    assert set(GPUS) >= {"h100-sxm", "h100-pcie", "h200", "a100-40gb", "a100-80gb", "l40s", "l4", "b200", "mi300x"}
    assert GPUS["h100-sxm"].bf16_tflops == 1979 / 2 and GPUS["h100-sxm"].fp8_tflops == 3958 / 2
    assert GPUS["h100-pcie"].bf16_tflops == 1513 / 2 and GPUS["l4"].fp8_tflops == 485 / 2
    assert GPUS["b200"].bf16_tflops == 36_000 / 8 / 2  # the 8-GPU board's 36 PFLOPS with sparsity
    assert all(g.source and g.link for g in GPUS.values())
    assert gpu_named("H100") is GPUS["h100-sxm"] and gpu_named("A100_40GB") is GPUS["a100-40gb"]
    assert GPUS["a100-80gb"].peak_flops("fp8") == 312e12  # no FP8 tensor cores: the BF16 peak
    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CHOICE) as err:
        gpu_named("v100")
    assert all(name in str(err.value) for name in ("h100-sxm", "a100-40gb", "mi300x"))  # the valid ones
    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CHOICE):
        model_costs(ModelShape.from_name("tiny"), H100, Workload(dtype="fp32"))


def test_a_sliding_window_caps_the_kv_read() -> None:
    m = dataclasses.replace(ModelShape.from_name("qwen3-8b"), sliding_window=4096)
    c = model_costs(m, H100, Workload(batch=1, context=10_000)).layers[0]
    assert c.kv_bytes == 4096 * m.kv_bytes_per_token_per_layer("bf16")
