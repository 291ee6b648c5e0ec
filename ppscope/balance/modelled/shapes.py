"""Model shapes: the numbers that decide cost and memory of a decoder-only LLM, without any weights.

The engine builds its layers from a `ModelShape` (Llama-style only); the planner, the rebalancer and the
cost model (`ppscope.balance.modelled.roofline`) count parameters and bytes with one, including what the engine does
not run: biases and norms of Qwen's attention, mixture-of-experts MLPs (Mixtral, Qwen3-MoE, DeepSeek) and
DeepSeek's multi-head latent attention. `PRESETS` are the shapes the engine builds, `PUBLISHED` the
published shapes it only plans for; `from_hf_config` reads a Hugging Face `config.json` and refuses, naming
the field, what it cannot represent (alternating or sliding-window attention layers, sparse MoE strides).
It knows nothing about torch, and nothing about speed (`ppscope.balance.modelled.roofline`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppscope.balance.modelled.archs import MLA, MoE, Unrepresentable, arch_fields
from ppscope.errors import ErrorCode, InvalidConfigError, UnsupportedInputError
from ppscope.trace.notices import Notice, NoticeCode

__all__ = [
    "DTYPE_BYTES",
    "DTYPE_NAMES",
    "MLA",
    "PRESETS",
    "PUBLISHED",
    "RENAMED",
    "MoE",
    "ModelShape",
    "RopeScaling",
    "all_presets",
    "canonical_dtype",
    "dtype_bytes",
    "renamed_note",
]

DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "fp64": 8,
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp8": 1,
}
"""Bytes per element of each dtype name `ppscope plan` and the engine take (the engine runs float64 too)."""

DTYPE_NAMES: dict[str, str] = {"fp64": "float64", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
"""Short spellings and the full name each stands for: every command takes both."""


def canonical_dtype(name: str) -> str:
    """The full name of a dtype given either way (`fp16` -> `float16`); other names are returned as given."""
    return DTYPE_NAMES.get(name.strip().lower(), name.strip().lower())


@dataclass(frozen=True)
class RopeScaling:
    """How a checkpoint stretches its rotary positions (`rope_scaling` in config.json): `llama3` (Llama 3.1 and
    later: low frequencies slowed by `factor`, high ones kept, a smooth ramp between) or `linear` (every
    frequency slowed by `factor`)."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    """The context length the model was pretrained with (llama3 only)."""

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> RopeScaling | None:
        """None for plain RoPE; raises ValueError for a kind the engine cannot compute."""
        kind = cfg.get("rope_type", cfg.get("type")) or "default"
        if kind == "default":
            return None
        if kind == "linear":
            return cls("linear", float(cfg["factor"]))
        if kind == "llama3":
            return cls(
                "llama3",
                float(cfg["factor"]),
                float(cfg["low_freq_factor"]),
                float(cfg["high_freq_factor"]),
                int(cfg["original_max_position_embeddings"]),
            )
        raise ValueError(f"rope_scaling type {kind!r} (the engine computes default, linear and llama3)")


def _read_config(p: Path) -> dict[str, Any]:
    """A `config.json` as its JSON object."""
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise UnsupportedInputError(
            ErrorCode.BAD_MODEL_CONFIG, f"{p} does not exist: give a model directory with config.json"
        ) from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UnsupportedInputError(ErrorCode.BAD_MODEL_CONFIG, f"{p} is not a readable JSON config ({exc})") from None
    if not isinstance(cfg, dict):
        raise UnsupportedInputError(
            ErrorCode.BAD_MODEL_CONFIG, f"{p} is not a model config: it holds JSON but not an object"
        )
    return cfg


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """Shape of a Llama-style decoder (embedding, L x [attention + SwiGLU MLP], final norm, LM head)."""

    name: str
    layers: int
    """Decoder layers."""
    hidden: int
    """Model width d_model."""
    heads: int
    """Attention (query) heads."""
    kv_heads: int
    """Key/value heads (grouped-query attention when < heads)."""
    intermediate: int
    """SwiGLU MLP inner width."""
    vocab: int
    """Vocabulary size."""
    max_seq_len: int = 2048
    """Longest sequence (prompt + output) the KV cache holds per request."""
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    """LM head shares the embedding matrix."""
    rope_scaling: RopeScaling | None = None
    head_size: int = 0
    """Width of one attention head; 0: hidden / heads (Qwen3 sets it apart: 128 at hidden 5120 and 64 heads)."""
    qkv_bias: bool = False
    """The q, k and v projections carry biases (Qwen2)."""
    qk_norm: bool = False
    """An RMSNorm over each head's query and key (Qwen3)."""
    sliding_window: int = 0
    """Tokens of context every layer attends to and keeps in its KV cache; 0: all of them."""
    moe: MoE | None = None
    """Mixture-of-experts MLPs; None: every MLP is dense."""
    mla: MLA | None = None
    """Multi-head latent attention; None: grouped-query attention."""
    config_source: str = ""
    """Where a preset's numbers come from (the checkpoint's config.json); empty for a shape read from a file."""
    dtype: str = "bf16"
    """The dtype its checkpoint ships its weights in (`fp8` for DeepSeek-V3's block-quantised weights): what the
    cost model and the memory check take when no `--dtype` is given."""

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "max_seq_len"):
            if getattr(self, f) < 1:
                raise InvalidConfigError(
                    ErrorCode.BAD_MODEL, f"model {self.name!r}: {f} must be >= 1, got {getattr(self, f)}"
                )
        if self.head_size < 0 or self.sliding_window < 0:
            raise InvalidConfigError(
                ErrorCode.BAD_MODEL, f"model {self.name!r}: head_size and sliding_window must be >= 0"
            )
        if self.moe is not None and not 1 <= self.moe.per_token <= self.moe.experts:
            raise InvalidConfigError(
                ErrorCode.BAD_MODEL,
                f"model {self.name!r}: {self.moe.per_token} experts per token of {self.moe.experts} experts",
            )
        if self.head_size == 0 and self.hidden % self.heads:
            raise InvalidConfigError(
                ErrorCode.BAD_MODEL,
                f"model {self.name!r}: hidden {self.hidden} is not a multiple of heads {self.heads}",
            )
        if self.heads % self.kv_heads:
            raise InvalidConfigError(
                ErrorCode.BAD_MODEL,
                f"model {self.name!r}: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}",
            )

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def attn_params(self) -> int:
        """Parameters of one layer's attention: projections, their biases and norms."""
        d, h = self.hidden, self.heads
        if (m := self.mla) is not None:
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = d * h * qk if not m.q_lora_rank else d * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * h * qk
            kv = (
                d * (m.kv_lora_rank + m.qk_rope_head_dim)
                + m.kv_lora_rank
                + m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim)
            )
            return q + kv + h * m.v_head_dim * d
        q_width, kv_width = h * self.head_dim, self.kv_heads * self.head_dim
        bias = q_width + 2 * kv_width if self.qkv_bias else 0
        norm = 2 * self.head_dim if self.qk_norm else 0
        return 2 * d * q_width + 2 * d * kv_width + bias + norm

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer >= self.moe.dense_layers

    def mlp_params(self, layer: int) -> int:
        """Parameters of layer `layer`'s MLP: dense SwiGLU, or router + every expert."""
        if (m := self.moe) is None or not self.is_moe_layer(layer):
            return 3 * self.hidden * self.intermediate
        return self.hidden * m.experts + (m.experts + m.shared) * m.expert_params * self.hidden

    def active_params(self, layer: int) -> int:
        """Parameters one token goes through in layer `layer`: all but the experts it is not routed to."""
        if (m := self.moe) is None or not self.is_moe_layer(layer):
            return self.layer_params_at(layer)
        idle = (m.experts - m.per_token) * m.expert_params * self.hidden
        return self.layer_params_at(layer) - idle

    def layer_params_at(self, layer: int) -> int:
        """Parameters of decoder layer `layer` (0-based): attention, MLP and two RMSNorms."""
        return self.attn_params + self.mlp_params(layer) + 2 * self.hidden

    @property
    def layer_params(self) -> int:
        """Parameters of the largest decoder layer (a MoE one when there are any): memory is planned as if
        every layer were that large. Per layer: q, k, v, o projections, MLP, two RMSNorms."""
        return max(self.layer_params_at(0), self.layer_params_at(self.layers - 1))

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """Final norm plus LM head (the head's matrix is counted even when tied: the last stage holds it)."""
        return self.vocab * self.hidden + self.hidden

    @property
    def params(self) -> int:
        tied = self.vocab * self.hidden if self.tie_embeddings else 0
        dense = self.moe.dense_layers if self.moe is not None else self.layers
        dense = min(dense, self.layers)
        layers = dense * self.layer_params_at(0) + (self.layers - dense) * self.layer_params_at(self.layers - 1)
        return self.embed_params + layers + self.head_params - tied

    def kv_bytes_per_token_per_layer(self, dtype: str = "float16") -> int:
        """K and V of one token in one layer; with latent attention, the latent and the rotary key."""
        if (m := self.mla) is not None:
            return (m.kv_lora_rank + m.qk_rope_head_dim) * dtype_bytes(dtype)
        return 2 * self.kv_heads * self.head_dim * dtype_bytes(dtype)

    def kv_bytes_per_token_per_layer_per_gpu(self, dtype: str, tp: int) -> int:
        """One GPU's share of `kv_bytes_per_token_per_layer` under tensor parallelism: KV heads are divided
        (replicated when TP exceeds them); a latent is cached whole on every GPU, as vLLM does."""
        if self.mla is not None:
            return self.kv_bytes_per_token_per_layer(dtype)
        return 2 * -(-self.kv_heads // tp) * self.head_dim * dtype_bytes(dtype)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_name(cls, name: str) -> ModelShape:
        """A preset by name: one the engine builds (`PRESETS`) or a published shape it only plans for; an old
        name (`RENAMED`) gives the preset it was renamed to (`renamed_note` says so)."""
        presets = all_presets()
        try:
            return presets[RENAMED.get(name, name)]
        except KeyError:
            raise InvalidConfigError(
                ErrorCode.UNKNOWN_CHOICE, f"unknown model preset {name!r}; valid presets: {', '.join(presets)}"
            ) from None

    @classmethod
    def from_spec(cls, text: str) -> ModelShape:
        """What `--model` takes: a preset's name, or a `config.json` or the model directory holding it."""
        if text in all_presets() or text in RENAMED or not (text.endswith(".json") or Path(text).is_dir()):
            return cls.from_name(text)
        return cls.from_hf_config(text)

    @classmethod
    def from_hf_config(cls, path: str | os.PathLike[str], *, exact: bool = False) -> ModelShape:
        """Read a Hugging Face `config.json` (or the directory holding it).

        Planning needs only the shape: Llama, Mistral, Qwen2/3, Mixtral, Qwen3-MoE and DeepSeek-V2/V3 read with
        their parts (`ppscope.balance.modelled.archs`), another architecture as Llama-style when it has no part the
        shape would miss; a field the shape cannot represent is refused by name. `exact` (the engine, which computes
        with the weights) refuses anything it would compute differently from transformers: another
        architecture, biases, another activation, an unknown rope scaling."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        cfg = _read_config(p)
        if exact and (problem := _inexact(cfg)):
            raise UnsupportedInputError(
                ErrorCode.UNSUPPORTED_CHECKPOINT,
                f"{p}: the engine cannot run this checkpoint exactly: {problem}. It runs Llama-format models "
                "(LlamaForCausalLM); a preset or --model synthetic shows the same pipeline",
            )
        kind = str(cfg.get("model_type") or "llama")
        try:
            heads = int(cfg["num_attention_heads"])
            rope = _rope_fields(cfg)
            return cls(
                name=str(cfg.get("_name_or_path") or (p.parent.name if p.name == "config.json" else p.stem)),
                layers=int(cfg["num_hidden_layers"]),
                hidden=int(cfg["hidden_size"]),
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads") or heads),
                intermediate=int(cfg["intermediate_size"]),
                vocab=int(cfg["vocab_size"]),
                max_seq_len=int(cfg.get("max_position_embeddings", 2048)),
                rope_theta=float(cfg.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0),
                norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                rope_scaling=_rope_scaling(rope) if rope is not None else None,
                dtype=_shipped_dtype(cfg),
                **arch_fields(cfg),
            )
        except Unrepresentable as exc:
            raise UnsupportedInputError(ErrorCode.BAD_MODEL_CONFIG, f"{p}: cannot be represented: {exc}") from None
        except KeyError as exc:
            raise UnsupportedInputError(
                ErrorCode.BAD_MODEL_CONFIG,
                f"{p}: config.json lacks the field {exc}, which a {kind} model needs: give the checkpoint's own "
                "config.json, unedited",
            ) from None
        except (TypeError, ValueError) as exc:
            raise UnsupportedInputError(
                ErrorCode.BAD_MODEL_CONFIG,
                f"{p}: a field has a bad value ({exc}): give the checkpoint's own config.json",
            ) from None


def _shipped_dtype(cfg: dict[str, Any]) -> str:
    """The dtype a checkpoint's weights are stored in: fp8 where its `quantization_config` says so (DeepSeek-V3),
    else its `torch_dtype` (`dtype` in transformers 5) when ppscope sizes it, else bf16."""
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and str(quant.get("quant_method", "")).lower() == "fp8":
        return "fp8"
    named = {"bfloat16": "bf16", "float16": "fp16"}.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or ""))
    return named or "bf16"


def _rope_fields(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The rotary settings: `rope_scaling` beside a top-level `rope_theta` (transformers 4, what checkpoints on
    the Hub carry), or `rope_parameters` holding both (transformers 5)."""
    rope = cfg.get("rope_scaling")
    if rope is None:
        rope = cfg.get("rope_parameters")
    return rope if isinstance(rope, dict) else None


def _rope_scaling(cfg: dict[str, Any]) -> RopeScaling | None:
    try:
        return RopeScaling.from_hf(cfg)
    except (KeyError, TypeError, ValueError):
        return None  # the shape is all planning needs (the engine, `exact`, has refused such a config already)


def _inexact(cfg: dict[str, Any]) -> str:
    """Why the engine would not compute what transformers computes with this config ('' when it would)."""
    kind = cfg.get("model_type", "llama")
    if kind not in ("llama", "mistral"):
        return f"model_type is {kind!r}, not llama"
    if kind == "mistral" and cfg.get("sliding_window") is not None:
        return "it attends through a sliding window (sliding_window is set)"
    if cfg.get("hidden_act", "silu") != "silu":
        return f"hidden_act is {cfg.get('hidden_act')!r}, not silu"
    for bias in ("attention_bias", "mlp_bias"):
        if cfg.get(bias):
            return f"{bias} is true (the engine's projections have no bias)"
    heads, hidden, head_dim = cfg.get("num_attention_heads"), cfg.get("hidden_size"), cfg.get("head_dim")
    if head_dim is not None and isinstance(heads, int) and isinstance(hidden, int) and head_dim * heads != hidden:
        return f"head_dim {head_dim} is not hidden_size / num_attention_heads = {hidden} / {heads}"
    scaling = _rope_fields(cfg)
    if scaling is None and (cfg.get("rope_scaling") or cfg.get("rope_parameters")) is not None:
        return "rope_scaling is not an object"
    if scaling is not None:
        try:
            RopeScaling.from_hf(scaling)
        except (KeyError, TypeError) as exc:
            return f"rope_scaling lacks or has a bad field {exc}"
        except ValueError as exc:
            return str(exc)
    return ""


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype.strip().lower()]
    except KeyError:
        raise InvalidConfigError(
            ErrorCode.UNKNOWN_CHOICE, f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}"
        ) from None


# `tiny` runs comfortably on a laptop CPU and, like real models, has an LM head that costs about two decoder
# layers (12288 x 256 = 3.1M weights against 1.2M per layer, 2.7 layers' worth; Llama-3-8B's is 2.4), which
# is what makes the last stage the bottleneck in real deployments. On a 2-core CPU a decode step of the head
# measured 1.6-2.4x a layer's: a layer's many small ops cost more than their FLOPs say, one big matmul less.
PRESETS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape(
            name="tiny",
            layers=8,
            hidden=256,
            heads=8,
            kv_heads=4,
            intermediate=1280,
            vocab=12288,
            max_seq_len=512,
            config_source="ppscope's own test shape (no checkpoint)",
        ),
        ModelShape(
            name="llama3-8b",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            intermediate=14336,
            vocab=128256,
            max_seq_len=8192,
            rope_theta=500000.0,
            config_source="meta-llama/Meta-Llama-3-8B config.json",
        ),
        ModelShape(
            name="llama3-70b",
            layers=80,
            hidden=8192,
            heads=64,
            kv_heads=8,
            intermediate=28672,
            vocab=128256,
            max_seq_len=8192,
            rope_theta=500000.0,
            config_source="meta-llama/Meta-Llama-3-70B config.json",
        ),
        ModelShape(
            name="llama3.1-405b",
            layers=126,
            hidden=16384,
            heads=128,
            kv_heads=8,
            intermediate=53248,
            vocab=128256,
            max_seq_len=131072,
            rope_theta=500000.0,
            rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
            config_source="meta-llama/Llama-3.1-405B-Instruct config.json (tests/data/configs/llama3.1-405b.json)",
        ),
    )
}
"""Llama-style shapes the engine builds (and plans for)."""

RENAMED: dict[str, str] = {"llama3-405b": "llama3.1-405b"}
"""Old preset names and the presets they now give: there is no Llama 3 405B, the 405B is Llama 3.1."""


def renamed_note(name: str) -> Notice | None:
    """The note a command prints when `name` is an old preset name; None for any other."""
    if name not in RENAMED:
        return None
    text = (
        f"{name} is the old name of the preset {RENAMED[name]}: the 405B model is Llama 3.1 (131,072 tokens of "
        f"context with llama3 RoPE scaling), not Llama 3; use --model {RENAMED[name]}"
    )
    return Notice(NoticeCode.RENAMED_PRESET, text)


# Published shapes the engine does not build (biases, head norms, experts, latent attention): the planner, the
# rebalancer and the cost model use them. Each is read from the model's published config.json, kept in
# tests/data/configs/ (tests/test_balance_roofline.py checks they agree). Qwen3 has no dense 72B: its largest is 32B.
PUBLISHED: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape(
            name="qwen2.5-7b",
            layers=28,
            hidden=3584,
            heads=28,
            kv_heads=4,
            intermediate=18944,
            vocab=152064,
            max_seq_len=32768,
            rope_theta=1e6,
            norm_eps=1e-6,
            qkv_bias=True,
            config_source="Qwen/Qwen2.5-7B-Instruct config.json (tests/data/configs/qwen2.5-7b.json)",
        ),
        ModelShape(
            name="qwen2.5-32b",
            layers=64,
            hidden=5120,
            heads=40,
            kv_heads=8,
            intermediate=27648,
            vocab=152064,
            max_seq_len=32768,
            rope_theta=1e6,
            norm_eps=1e-6,
            qkv_bias=True,
            config_source="Qwen/Qwen2.5-32B-Instruct config.json (tests/data/configs/qwen2.5-32b.json)",
        ),
        ModelShape(
            name="qwen2.5-72b",
            layers=80,
            hidden=8192,
            heads=64,
            kv_heads=8,
            intermediate=29568,
            vocab=152064,
            max_seq_len=32768,
            rope_theta=1e6,
            norm_eps=1e-6,
            qkv_bias=True,
            config_source="Qwen/Qwen2.5-72B-Instruct config.json (tests/data/configs/qwen2.5-72b.json)",
        ),
        ModelShape(
            name="qwen3-8b",
            layers=36,
            hidden=4096,
            heads=32,
            kv_heads=8,
            intermediate=12288,
            vocab=151936,
            max_seq_len=40960,
            rope_theta=1e6,
            norm_eps=1e-6,
            qk_norm=True,
            config_source="Qwen/Qwen3-8B config.json (tests/data/configs/qwen3-8b.json)",
        ),
        ModelShape(
            name="qwen3-32b",
            layers=64,
            hidden=5120,
            heads=64,
            kv_heads=8,
            intermediate=25600,
            vocab=151936,
            max_seq_len=40960,
            rope_theta=1e6,
            norm_eps=1e-6,
            qk_norm=True,
            head_size=128,
            config_source="Qwen/Qwen3-32B config.json (tests/data/configs/qwen3-32b.json)",
        ),
        ModelShape(
            name="mixtral-8x7b",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            intermediate=14336,
            vocab=32000,
            max_seq_len=32768,
            rope_theta=1e6,
            moe=MoE(experts=8, per_token=2, intermediate=14336),
            config_source="mistralai/Mixtral-8x7B-Instruct-v0.1 config.json (tests/data/configs/mixtral-8x7b.json)",
        ),
        ModelShape(
            name="mixtral-8x22b",
            layers=56,
            hidden=6144,
            heads=48,
            kv_heads=8,
            intermediate=16384,
            vocab=32768,
            max_seq_len=65536,
            rope_theta=1e6,
            moe=MoE(experts=8, per_token=2, intermediate=16384),
            config_source="mistralai/Mixtral-8x22B-Instruct-v0.1 config.json (tests/data/configs/mixtral-8x22b.json)",
        ),
        ModelShape(
            name="deepseek-v3",
            layers=61,
            hidden=7168,
            heads=128,
            kv_heads=128,
            intermediate=18432,
            vocab=129280,
            max_seq_len=163840,
            norm_eps=1e-6,
            moe=MoE(experts=256, per_token=8, intermediate=2048, shared=1, dense_layers=3),
            mla=MLA(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536),
            config_source="deepseek-ai/DeepSeek-V3 config.json (tests/data/configs/deepseek-v3.json)",
            dtype="fp8",  # quantization_config: quant_method fp8, e4m3 in 128 x 128 blocks
        ),
    )
}
"""Published shapes for planning and cost modelling only (the engine refuses them)."""


def all_presets() -> dict[str, ModelShape]:
    """Every preset `--model` takes: the engine's, then the published ones."""
    return {**PRESETS, **PUBLISHED}
