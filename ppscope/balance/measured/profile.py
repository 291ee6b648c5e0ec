"""A run's per-layer cost profile (`profile.json`): measured forward time of every decoder layer, the
embedding and the LM head + sampling, for a prefill and for a decode step.

The engine writes it (`ppscope.engine.profiler`); this module reads it without torch and turns one phase into the
`LayerCosts` the rebalancer takes. It knows nothing about how the times were taken.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppscope.balance.costs import LayerCosts
from ppscope.errors import CorruptFileError, ErrorCode, InvalidConfigError
from ppscope.trace.actions import Phase

__all__ = ["PHASES", "PROFILE_FILE", "LayerProfile", "PhaseCosts", "read_profile"]

PROFILE_FILE = "profile.json"
PHASES = (Phase.DECODE, Phase.PREFILL)


@dataclass(frozen=True, kw_only=True)
class PhaseCosts:
    """Median time per pass of each part of the model, in ms, for one kind of pass."""

    layer_ms: tuple[float, ...]
    embed_ms: float
    head_ms: float
    """Final norm + LM head."""
    sample_ms: float
    tokens: int
    """Tokens in the timed pass (prompt length for prefill, sequences for decode)."""
    layer_ms_each: tuple[float, ...] = ()
    """Each layer's own median when `layer_ms` holds their common median instead (layers of one shape, whose
    differences are the machine's noise); empty when `layer_ms` is each layer's own."""

    def costs(self) -> LayerCosts:
        return LayerCosts(
            layer_ms=self.layer_ms, embed_ms=self.embed_ms, head_ms=self.head_ms, sample_ms=self.sample_ms
        )


@dataclass(frozen=True, kw_only=True)
class LayerProfile:
    model: str
    device: str
    dtype: str
    method: str
    """`cuda-events` or `perf_counter`."""
    repeats: int
    prefill: PhaseCosts
    decode: PhaseCosts
    cache_flush_bytes: int = 0
    """Bytes written before each timed pass to empty the device's caches; 0: passes timed back to back, with
    warm caches (profiles written before this field, and synthetic models, whose layers only sleep)."""

    @property
    def how(self) -> str:
        """How the passes were timed, for people: `perf_counter, cold caches`."""
        return f"{self.method}, {'cold' if self.cache_flush_bytes else 'warm'} caches"

    def phase(self, name: str) -> PhaseCosts:
        if name not in PHASES:
            raise InvalidConfigError(ErrorCode.UNKNOWN_CHOICE, f"unknown phase {name!r}; valid: {', '.join(PHASES)}")
        return self.decode if name == Phase.DECODE else self.prefill

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, *, where: str) -> LayerProfile:
        try:
            phases = {
                p: PhaseCosts(
                    **{
                        **data[p],
                        "layer_ms": tuple(data[p]["layer_ms"]),
                        "layer_ms_each": tuple(data[p].get("layer_ms_each", ())),
                    }
                )
                for p in PHASES
            }
            rest = {k: v for k, v in data.items() if k not in PHASES}
            profile = cls(**rest, prefill=phases[Phase.PREFILL], decode=phases[Phase.DECODE])
            for p in PHASES:
                profile.phase(p).costs()  # validates every cost
        except (KeyError, TypeError, ValueError, AttributeError, InvalidConfigError) as exc:
            raise CorruptFileError(ErrorCode.BAD_PROFILE, f"{where}: not a ppscope layer profile ({exc})") from None
        return profile


def read_profile(run_dir: str | os.PathLike[str]) -> LayerProfile | None:
    """The run's profile, or None when the run was not profiled."""
    path = Path(run_dir) / PROFILE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(ErrorCode.NOT_JSON, f"{path}: cannot be read as JSON ({exc})") from None
    return LayerProfile.from_dict(data, where=str(path))
