"""Model shapes: the numbers that decide cost and memory of a Llama-style decoder, without any weights.

The engine builds its layers from a `ModelShape`; the planner and the rebalancer count bytes with one.
Presets carry the published shapes of well-known models; `from_hf_config` reads a Hugging Face
`config.json`. This module knows nothing about torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppscope.errors import InvalidConfigError, UnsupportedInputError

__all__ = ["DTYPE_BYTES", "DTYPE_NAMES", "PRESETS", "ModelShape", "RopeScaling", "canonical_dtype", "dtype_bytes"]

DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "fp64": 8, "float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "fp8": 1,
}  # fmt: skip
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
                "llama3", float(cfg["factor"]), float(cfg["low_freq_factor"]), float(cfg["high_freq_factor"]),
                int(cfg["original_max_position_embeddings"]),
            )  # fmt: skip
        raise ValueError(f"rope_scaling type {kind!r} (the engine computes default, linear and llama3)")


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

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "max_seq_len"):
            if getattr(self, f) < 1:
                raise InvalidConfigError(f"model {self.name!r}: {f} must be >= 1, got {getattr(self, f)}")
        if self.hidden % self.heads:
            raise InvalidConfigError(
                f"model {self.name!r}: hidden {self.hidden} is not a multiple of heads {self.heads}"
            )
        if self.heads % self.kv_heads:
            raise InvalidConfigError(
                f"model {self.name!r}: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: q, k, v, o projections, gate/up/down MLP, two RMSNorms."""
        attn = self.hidden * self.hidden * 2 + 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate
        return attn + mlp + 2 * self.hidden

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
        return self.embed_params + self.layers * self.layer_params + self.head_params - tied

    def kv_bytes_per_token_per_layer(self, dtype: str = "float16") -> int:
        """K and V of one token in one layer."""
        return 2 * self.kv_heads * self.head_dim * dtype_bytes(dtype)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_name(cls, name: str) -> ModelShape:
        try:
            return PRESETS[name]
        except KeyError:
            raise InvalidConfigError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}") from None

    @classmethod
    def from_hf_config(cls, path: str | os.PathLike[str], *, exact: bool = False) -> ModelShape:
        """Read a Hugging Face Llama-format `config.json` (or the directory holding it).

        Planning needs only the shape, so a config of another architecture with the same parts reads too;
        `exact` (the engine, which computes with the weights) refuses anything it would compute differently
        from transformers: another architecture, biases, another activation, an unknown rope scaling."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        try:
            cfg = json.loads(p.read_text())
        except FileNotFoundError:
            raise UnsupportedInputError(f"{p} does not exist: give a model directory with config.json") from None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UnsupportedInputError(f"{p} is not a readable JSON config ({exc})") from None
        if not isinstance(cfg, dict):
            raise UnsupportedInputError(f"{p} is not a model config: it holds JSON but not an object")
        if exact and (problem := _inexact(cfg)):
            raise UnsupportedInputError(
                f"{p}: the engine cannot run this checkpoint exactly: {problem}. It runs Llama-format models "
                "(LlamaForCausalLM); a preset or --model synthetic shows the same pipeline"
            )
        try:
            heads = int(cfg["num_attention_heads"])
            rope = _rope_fields(cfg)
            return cls(
                name=str(cfg.get("_name_or_path") or p.parent.name),
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
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UnsupportedInputError(f"{p}: not a Llama-style config (missing or bad field {exc})") from None


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
        raise InvalidConfigError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}") from None


# `tiny` runs comfortably on a laptop CPU and, like real models, has an LM head that costs about two decoder
# layers (12288 x 256 = 3.1M weights against 1.2M per layer, 2.7 layers' worth; Llama-3-8B's is 2.4), which
# is what makes the last stage the bottleneck in real deployments. On a 2-core CPU a decode step of the head
# measured 1.6-2.4x a layer's: a layer's many small ops cost more than their FLOPs say, one big matmul less.
PRESETS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape(name="tiny", layers=8, hidden=256, heads=8, kv_heads=4, intermediate=1280, vocab=12288,
                   max_seq_len=512),
        ModelShape(name="llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336,
                   vocab=128256, max_seq_len=8192, rope_theta=500000.0),
        ModelShape(name="llama3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, intermediate=28672,
                   vocab=128256, max_seq_len=8192, rope_theta=500000.0),
        ModelShape(name="llama3-405b", layers=126, hidden=16384, heads=128, kv_heads=8, intermediate=53248,
                   vocab=128256, max_seq_len=8192, rope_theta=500000.0),
    )
}  # fmt: skip
