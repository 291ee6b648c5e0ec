"""Cost model of a pipeline: what a layer, the embedding and the LM head cost, and what a stage adds.

`LayerCosts` holds what a layer, the embedding and the LM head + sampling cost; `StageCosts` holds what a
stage adds whatever layers it holds (fixed overhead, the hop to the next stage, its relative speed).
Where the costs come from lives beside it: `ppscope.balance.measured` (from runs) and
`ppscope.balance.modelled` (from a model's shape and a GPU's datasheet, with no run).
This module knows nothing about how a split is chosen (`ppscope.balance.advise.rebalance`) or simulated
(`ppscope.simulate.simulator`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ppscope.errors import ErrorCode, InvalidConfigError

__all__ = ["LayerCosts", "StageCosts", "parse_ms_list"]


def _check_cost(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidConfigError(
            ErrorCode.BAD_VALUE, f"{name} must be a number of milliseconds, got {value!r}"
        ) from None
    if not math.isfinite(v) or v < 0:
        raise InvalidConfigError(ErrorCode.BAD_VALUE, f"{name} must be a finite number >= 0 ms, got {value!r}")
    return v


def parse_ms_list(text: str, what: str) -> list[float]:
    """`1.0,1.2,0.9` into numbers, each finite and >= 0; `what` names the option in errors."""
    parts = [p.strip() for p in str(text).split(",")]
    if not str(text).strip() or any(not p for p in parts):
        raise InvalidConfigError(
            ErrorCode.BAD_VALUE, f"{what} {text!r} is empty or has an empty entry: give comma-separated numbers"
        )
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise InvalidConfigError(
            ErrorCode.BAD_VALUE, f"{what} {text!r} is not a comma-separated list of numbers"
        ) from None
    for i, v in enumerate(values):
        if not math.isfinite(v) or v < 0:
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE, f"{what}: entry {i} is {parts[i]}; every entry must be a finite number >= 0"
            )
    return values


@dataclass(frozen=True, kw_only=True)
class LayerCosts:
    """What the work of one micro-batch costs, in milliseconds."""

    layer_ms: tuple[float, ...]
    """Forward time of each decoder layer, in model order."""
    embed_ms: float = 0.0
    """Token embedding: extra work of the first stage."""
    head_ms: float = 0.0
    """Final norm + LM head: extra work of the last stage."""
    sample_ms: float = 0.0
    """Sampling tokens from the logits: extra work of the last stage."""

    def __post_init__(self) -> None:
        if not self.layer_ms:
            raise InvalidConfigError(
                ErrorCode.MISSING_OPTION, "layer costs are empty: give one cost in ms per decoder layer"
            )
        object.__setattr__(
            self, "layer_ms", tuple(_check_cost(f"layer {i} cost", c) for i, c in enumerate(self.layer_ms))
        )
        for name in ("embed_ms", "head_ms", "sample_ms"):
            object.__setattr__(self, name, _check_cost(name.replace("_ms", " cost"), getattr(self, name)))

    @classmethod
    def uniform(cls, layers: int, layer_ms: float, **extras: float) -> LayerCosts:
        if layers < 1:
            raise InvalidConfigError(ErrorCode.BAD_VALUE, f"the model needs at least 1 layer, got {layers}")
        return cls(layer_ms=(float(layer_ms),) * layers, **extras)

    @property
    def layers(self) -> int:
        return len(self.layer_ms)

    @property
    def last_extra_ms(self) -> float:
        """What the last stage does beyond its layers: LM head plus sampling."""
        return self.head_ms + self.sample_ms

    def to_json(self) -> dict[str, object]:
        """`costs` of `ppscope rebalance --json` and `ppscope tune --json` (docs/GLOSSARY.md)."""
        return {
            "layer_ms": list(self.layer_ms),
            "embed_ms": self.embed_ms,
            "head_ms": self.head_ms,
            "sample_ms": self.sample_ms,
        }


def _per_stage(name: str, value: float | Sequence[float], stages: int, *, positive: bool = False) -> list[float]:
    values = [value] * stages if isinstance(value, (int, float)) else list(value)
    if len(values) != stages:
        raise InvalidConfigError(
            ErrorCode.COUNT_MISMATCH, f"{name} has {len(values)} value(s) but the pipeline has {stages} stages"
        )
    out = []
    for i, v in enumerate(values):
        f = float(v)
        if not math.isfinite(f) or f < 0 or (positive and f <= 0):
            bound = "> 0" if positive else ">= 0"
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE, f"{name} of stage {i} must be a finite number {bound}, got {v!r}"
            )
        out.append(f)
    return out


@dataclass(frozen=True, kw_only=True)
class StageCosts:
    """Per-stage terms: one value for every stage, or one value per stage."""

    overhead_ms: float | Sequence[float] = 0.0
    """Fixed time a stage spends per micro-batch whatever it holds (launches, scheduling)."""
    comm_ms: float | Sequence[float] = 0.0
    """Time of the hop from this stage to the next (the last stage's hop returns tokens to the first)."""
    speed: float | Sequence[float] = 1.0
    """Relative speed of the stage's device (2.0 = twice as fast); divides its compute, not its hop."""

    def resolve(self, stages: int) -> tuple[list[float], list[float], list[float]]:
        """(overhead_ms, comm_ms, speed) per stage, validated. A one-stage pipeline has no hop."""
        overhead = _per_stage("overhead", self.overhead_ms, stages)
        comm = _per_stage("comm time", self.comm_ms, stages)
        speed = _per_stage("speed factor", self.speed, stages, positive=True)
        if stages == 1:
            comm = [0.0]
        return overhead, comm, speed
