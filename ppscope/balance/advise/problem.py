"""The rebalancer's problem: layer costs, stages, per-stage terms, a memory model and the objective.

Both the search (`ppscope.balance.advise.search`) and the rebalancer (`ppscope.balance.advise.rebalance`) read
these types; they know nothing about how a problem is solved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppscope.balance.costs import LayerCosts, StageCosts
from ppscope.errors import ErrorCode, InvalidConfigError

__all__ = ["OBJECTIVES", "UNLIMITED_TOKENS", "BalanceProblem", "MemoryModel"]

UNLIMITED_TOKENS = 1 << 62
"""KV capacity of a stage without a memory model, or of a model without KV cache."""

OBJECTIVES = ("throughput", "memory")


@dataclass(frozen=True, kw_only=True)
class MemoryModel:
    """What each stage must hold: weights of its layers (+ embedding / LM head at the ends) and KV cache."""

    limit_bytes: tuple[int, ...]
    """Memory each stage may use for weights, KV cache and reserve (already times the utilisation)."""
    layer_bytes: int
    """Weights of one decoder layer."""
    kv_bytes_per_token_per_layer: int
    embed_bytes: int = 0
    """Weights of the embedding, on the first stage."""
    head_bytes: int = 0
    """Weights of the final norm and LM head plus the logits buffer, on the last stage."""
    reserve_bytes: int = 0
    """Per stage: activations, workspace and runtime that are neither weights nor KV cache."""
    min_kv_tokens: int = 0
    """Every stage must hold at least this many tokens of KV cache."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit_bytes", tuple(int(b) for b in self.limit_bytes))
        for name in ("layer_bytes", "kv_bytes_per_token_per_layer", "embed_bytes", "head_bytes", "reserve_bytes"):
            if getattr(self, name) < 0:
                raise InvalidConfigError(
                    ErrorCode.BAD_VALUE, f"memory model: {name} must be >= 0, got {getattr(self, name)}"
                )
        if any(b < 0 for b in self.limit_bytes):
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE, f"memory model: stage limits must be >= 0 bytes, got {self.limit_bytes}"
            )
        if self.min_kv_tokens < 0:
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE, f"memory model: min_kv_tokens must be >= 0, got {self.min_kv_tokens}"
            )

    def free_bytes(self, stage: int, stages: int) -> int:
        """What stage `stage` has for its decoder layers and their KV cache."""
        fixed = self.reserve_bytes + (self.embed_bytes if stage == 0 else 0)
        fixed += self.head_bytes if stage == stages - 1 else 0
        return self.limit_bytes[stage] - fixed

    def kv_tokens(self, stage: int, stages: int, layers: int) -> int:
        """Tokens of KV cache the stage holds with `layers` layers; negative when its weights do not fit."""
        left = self.free_bytes(stage, stages) - layers * self.layer_bytes
        if left < 0:
            return -1
        per_token = layers * self.kv_bytes_per_token_per_layer
        return left // per_token if per_token else UNLIMITED_TOKENS

    def max_layers(self, stage: int, stages: int, kv_tokens: int) -> int:
        """Most layers the stage can hold and still keep `kv_tokens` tokens of KV cache."""
        free = self.free_bytes(stage, stages)
        if free < 0:
            return 0
        per_layer = self.layer_bytes + self.kv_bytes_per_token_per_layer * kv_tokens
        return free // per_layer if per_layer else UNLIMITED_TOKENS


@dataclass(frozen=True, kw_only=True)
class BalanceProblem:
    """Everything the rebalancer needs: costs, the number of stages, per-stage terms, memory, objective."""

    costs: LayerCosts
    stages: int
    stage_costs: StageCosts = field(default_factory=StageCosts)
    memory: MemoryModel | None = None
    objective: str = "throughput"

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise InvalidConfigError(ErrorCode.BAD_VALUE, f"the pipeline needs at least 1 stage, got {self.stages}")
        if self.costs.layers < self.stages:
            raise InvalidConfigError(
                ErrorCode.TOO_FEW_LAYERS,
                f"{self.costs.layers} layer cost(s) cannot fill {self.stages} stages (each needs at least one "
                f"layer): give one cost per decoder layer or use at most {self.costs.layers} stages",
            )
        if self.objective not in OBJECTIVES:
            raise InvalidConfigError(
                ErrorCode.UNKNOWN_CHOICE, f"unknown objective {self.objective!r}; valid: {', '.join(OBJECTIVES)}"
            )
        if self.objective == "memory" and self.memory is None:
            raise InvalidConfigError(
                ErrorCode.MISSING_OPTION,
                "objective `memory` maximises KV capacity, which needs a memory model (--model and --gpu-mem-gib)",
            )
        if self.memory is not None and len(self.memory.limit_bytes) != self.stages:
            raise InvalidConfigError(
                ErrorCode.COUNT_MISMATCH,
                f"memory model has {len(self.memory.limit_bytes)} stage limit(s) but the pipeline has {self.stages}",
            )
        self.stage_costs.resolve(self.stages)  # validates lengths and values now, not mid-search
