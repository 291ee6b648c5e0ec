"""What each architecture's `config.json` adds to a Llama-style shape, and what ppscope cannot represent.

A Llama-style decoder is the common core (`ppscope.balance.modelled.shapes.ModelShape`). Qwen2 adds biases to q, k
and v; Qwen3 a norm over each head's query and key and a head width of its own; Mixtral and Qwen3-MoE
mixture-of-experts MLPs; DeepSeek-V2/V3 both, with shared experts, leading dense layers and multi-head latent
attention. `arch_fields` reads those parts from a config and raises `Unrepresentable`, naming the field, for
what the cost model would get wrong: layers of different kinds in a pattern (sliding-window layers among full
ones, MoE every k-th layer), or MoE or latent attention in an architecture it does not know. It knows nothing
about the rest of the shape, about speed or about torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["KNOWN_TYPES", "MLA", "MoE", "Unrepresentable", "arch_fields"]

KNOWN_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3")
"""`model_type`s read with every part they have; another type is read as Llama-style when it has no part
ppscope would miss."""

_FOREIGN_PARTS = {
    "num_local_experts": "mixture-of-experts MLPs",
    "num_experts": "mixture-of-experts MLPs",
    "n_routed_experts": "mixture-of-experts MLPs",
    "kv_lora_rank": "latent attention",
    "layer_types": "layers of different kinds",
    "sliding_window_pattern": "sliding-window layers among full ones",
}


class Unrepresentable(ValueError):
    """A config field whose meaning the shape cannot hold; the message names the field."""


@dataclass(frozen=True, kw_only=True)
class MoE:
    """Mixture-of-experts MLPs: a router sends each token to `per_token` of `experts` SwiGLU experts."""

    experts: int
    """Routed experts in each MoE layer."""
    per_token: int
    """Routed experts each token goes to (top-k)."""
    intermediate: int
    """Inner width of one expert's SwiGLU MLP."""
    shared: int = 0
    """Experts every token goes through besides the routed ones, each as wide as a routed one (DeepSeek: 1)."""
    dense_layers: int = 0
    """Leading decoder layers with a dense MLP of the model's `intermediate` width (DeepSeek-V3: 3)."""

    @property
    def expert_params(self) -> int:
        """Parameters of one expert per unit of model width: gate, up and down projections."""
        return 3 * self.intermediate


@dataclass(frozen=True, kw_only=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values cached as one compressed latent per token."""

    kv_lora_rank: int
    """Width of the cached key/value latent."""
    qk_nope_head_dim: int
    """Per-head query/key width without rotary embedding."""
    qk_rope_head_dim: int
    """Per-head rotary width; the rotary key is cached once per token beside the latent."""
    v_head_dim: int
    """Per-head value width."""
    q_lora_rank: int = 0
    """Width of the compressed query; 0: queries are projected from the hidden state directly."""


def arch_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The `ModelShape` fields beyond the Llama core that `cfg` sets (head_size, qkv_bias, qk_norm,
    sliding_window, moe, mla). Raises Unrepresentable naming the field the shape cannot hold, KeyError naming
    a field the architecture needs and lacks."""
    kind = str(cfg.get("model_type") or "llama")
    if kind not in KNOWN_TYPES:
        for field, what in _FOREIGN_PARTS.items():
            if cfg.get(field):
                raise Unrepresentable(
                    f"`{field}` is set ({what}) in a model_type ppscope does not know ({kind!r}): it models "
                    f"{', '.join(KNOWN_TYPES)}"
                )
    out: dict[str, Any] = {"qkv_bias": kind == "qwen2" or bool(cfg.get("attention_bias"))}
    out["qk_norm"] = kind in ("qwen3", "qwen3_moe")
    head_dim, heads, hidden = cfg.get("head_dim"), int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    if head_dim and not kind.startswith("deepseek") and int(head_dim) * heads != hidden:
        out["head_size"] = int(head_dim)
    out["sliding_window"] = _window(cfg, kind)
    if kind == "mixtral":
        out["moe"] = MoE(
            experts=int(cfg["num_local_experts"]),
            per_token=int(cfg["num_experts_per_tok"]),
            intermediate=int(cfg["intermediate_size"]),
        )
    elif kind == "qwen3_moe":
        _require(cfg, "decoder_sparse_step", 1, "a MoE MLP in every layer")
        if cfg.get("mlp_only_layers"):
            raise Unrepresentable("`mlp_only_layers` is not empty: ppscope models a MoE MLP in every layer")
        out["moe"] = MoE(
            experts=int(cfg["num_experts"]),
            per_token=int(cfg["num_experts_per_tok"]),
            intermediate=int(cfg["moe_intermediate_size"]),
        )
    elif kind.startswith("deepseek"):
        out.update(_deepseek(cfg))
    return out


def _window(cfg: dict[str, Any], kind: str) -> int:
    """Mistral and Mixtral window every layer when `sliding_window` is set; Qwen windows only some layers."""
    if kind in ("mistral", "mixtral"):
        return int(cfg.get("sliding_window") or 0)
    if kind.startswith("qwen") and cfg.get("use_sliding_window"):
        raise Unrepresentable(
            "`use_sliding_window` is true: layers past `max_window_layers` attend through a window and the others "
            "do not, which ppscope does not model"
        )
    return 0


def _deepseek(cfg: dict[str, Any]) -> dict[str, Any]:
    _require(cfg, "moe_layer_freq", 1, "a MoE MLP in every layer after `first_k_dense_replace`")
    out: dict[str, Any] = {
        "mla": MLA(
            kv_lora_rank=int(cfg["kv_lora_rank"]),
            qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
            qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
            v_head_dim=int(cfg["v_head_dim"]),
            q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        )
    }
    if cfg.get("n_routed_experts"):
        out["moe"] = MoE(
            experts=int(cfg["n_routed_experts"]),
            per_token=int(cfg["num_experts_per_tok"]),
            intermediate=int(cfg["moe_intermediate_size"]),
            shared=int(cfg.get("n_shared_experts") or 0),
            dense_layers=int(cfg.get("first_k_dense_replace") or 0),
        )
    return out


def _require(cfg: dict[str, Any], field: str, value: int, model: str) -> None:
    if field in cfg and cfg[field] is not None and int(cfg[field]) != value:
        raise Unrepresentable(f"`{field}` is {cfg[field]}, not {value}: ppscope models {model}")
