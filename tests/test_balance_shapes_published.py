"""Published model shapes: each preset is its config.json, and what the shape cannot represent is refused by
name. Their sizes against hand-computed ones are in tests/test_balance_roofline.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from error_helpers import raises_code

from ppscope.balance.modelled.shapes import PRESETS, PUBLISHED, ModelShape
from ppscope.errors import ErrorCode, UnsupportedInputError

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_published_preset_is_its_config(name: str) -> None:
    read = ModelShape.from_hf_config(CONFIGS / f"{name}.json")
    assert read.name == name  # a file not called config.json is named by its stem
    cited = PUBLISHED[name].config_source
    assert f"tests/data/configs/{name}.json" in cited  # each preset cites the config.json it was read from
    assert dataclasses.replace(read, name=name, config_source=cited) == PUBLISHED[name] == ModelShape.from_name(name)


def test_published_shapes_are_not_the_engines() -> None:
    """The engine builds PRESETS only: it would run a MoE or latent-attention shape as a dense Llama."""
    assert not set(PUBLISHED) & set(PRESETS)
    assert ModelShape.from_name("llama3-8b") is PRESETS["llama3-8b"]


def _config(tmp_path: Path, base: str, **changes: object) -> Path:
    cfg = json.loads((CONFIGS / f"{base}.json").read_text())
    for key, value in changes.items():
        if value is None:
            del cfg[key]
        else:
            cfg[key] = value
    out = tmp_path / "config.json"
    out.write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize(
    ("base", "changes", "fragment"),
    [
        ("qwen3-8b", {"hidden_size": None}, "lacks the field 'hidden_size'"),
        ("mixtral-8x22b", {"num_experts_per_tok": None}, "lacks the field 'num_experts_per_tok'"),
        ("deepseek-v3", {"kv_lora_rank": None}, "lacks the field 'kv_lora_rank'"),
        ("qwen2.5-7b", {"use_sliding_window": True}, "`use_sliding_window` is true"),
        ("deepseek-v3", {"moe_layer_freq": 2}, "`moe_layer_freq` is 2"),
        ("qwen3-8b", {"model_type": "newarch", "num_experts": 64}, "`num_experts` is set"),
        ("qwen3-8b", {"model_type": "gemma3", "layer_types": ["sliding", "full"]}, "`layer_types` is set"),
    ],
)
def test_a_config_the_model_cannot_represent_is_refused_naming_the_field(
    tmp_path: Path, base: str, changes: dict[str, object], fragment: str
) -> None:
    with raises_code(UnsupportedInputError, ErrorCode.BAD_MODEL_CONFIG) as err:
        ModelShape.from_hf_config(_config(tmp_path, base, **changes))
    assert "\n" not in str(err.value)


def test_mistral_windows_every_layer(tmp_path: Path) -> None:
    m = ModelShape.from_hf_config(_config(tmp_path, "qwen3-8b", model_type="mistral", sliding_window=4096))
    assert m.sliding_window == 4096 and not m.qk_norm


def test_deepseek_v3_reads_as_3_dense_and_58_moe_layers_with_a_latent_cache() -> None:
    m = ModelShape.from_hf_config(CONFIGS / "deepseek-v3.json")
    assert m.moe is not None and m.mla is not None
    assert [m.is_moe_layer(i) for i in range(m.layers)] == [False] * 3 + [True] * 58
    assert m.kv_bytes_per_token_per_layer("bf16") == (512 + 64) * 2  # kv_lora_rank + qk_rope_head_dim


def test_unknown_preset_lists_them_all() -> None:
    from ppscope.errors import InvalidConfigError

    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CHOICE) as err:
        ModelShape.from_name("llama2-7b")
    assert "deepseek-v3" in str(err.value)
