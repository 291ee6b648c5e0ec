"""The engine's configuration: one validated dataclass that the CLI fills and every rank receives.

Validation happens here, before any process starts, so a bad option is one clear line. This module knows
nothing about processes, tensors or hardware (whether NCCL can run is decided in `ppscope.engine.prepare`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppscope.balance.shapes import PRESETS, ModelShape
from ppscope.errors import InvalidConfigError
from ppscope.simulate.schedule import SCHEDULES

__all__ = ["DTYPES", "EngineConfig", "parse_costs"]

DTYPES = ("float32", "float64", "bfloat16", "float16")
MAX_TIMEOUT_S = 1e6
"""The longest --timeout (11.6 days): longer ones overflow the timers they are handed to."""
MIN_RATE = 1e-3
"""The slowest Poisson --rate (one request per 17 minutes) whose arrival times fit a nanosecond clock."""
BACKENDS = ("auto", "gloo", "nccl")
SYNTHETIC = "synthetic"


def parse_costs(text: str, layers: int) -> list[float]:
    """`5` (every layer) or `5,5,7,...` (one per layer) into per-layer milliseconds."""
    try:
        values = [float(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise InvalidConfigError(f"--layer-cost-ms {text!r} is not a number or a comma-separated list") from None
    if len(values) == 1:
        values = values * layers
    if len(values) != layers:
        raise InvalidConfigError(
            f"--layer-cost-ms gives {len(values)} values for {layers} layers: give one value, or one per layer"
        )
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise InvalidConfigError(f"--layer-cost-ms {text!r} has a negative or non-finite cost: give ms >= 0")
    return values


@dataclass(kw_only=True)
class EngineConfig:
    """Everything one run of the engine needs. Times in ms unless named otherwise."""

    stages: int = 2
    """Pipeline stages = ranks."""
    schedule: str = "serve"
    """gpipe, interleaved or serve."""
    microbatches: int = 0
    """Micro-batches per step (gpipe/interleaved); 0 = one per stage."""
    chunks: int = 1
    """Model chunks per rank (interleaved)."""
    max_inflight: int = 0
    """Micro-batches in flight (serve); 0 = one per stage."""
    max_batch: int = 1
    """Requests per micro-batch (serve)."""
    model: str = "tiny"
    """A preset name, `synthetic`, or a Hugging Face Llama checkpoint directory."""
    layers: int = 8
    """Decoder layers of the synthetic model."""
    layer_cost_ms: str = "5"
    """Synthetic per-layer time: one value or one per layer."""
    embed_cost_ms: float = 0.0
    head_cost_ms: float = 0.0
    split: str | None = None
    """Layer counts per (virtual) stage, e.g. 5,4,4,3; default PPSCOPE_PP_LAYER_PARTITION or vLLM's rule."""
    requests: int = 8
    prompt_len: int = 16
    max_new_tokens: int = 8
    prompts: str | None = None
    """JSONL file of {"prompt_ids": [...], "max_new_tokens": n}."""
    seed: int = 0
    """Seeds the random weights, generated prompts, arrivals and sampling."""
    rate: float = 0.0
    """Poisson arrival rate in requests/s (serve); 0 = all at once."""
    temperature: float = 0.0
    """0 = greedy."""
    top_p: float = 1.0
    backend: str = "auto"
    dtype: str = "float32"
    timeout_s: float = 60.0
    """How long a rank waits for a peer before giving up; failures stop every rank within it."""
    record: bool = True
    out: str | None = None
    """Run directory; default runs/<timestamp>."""
    progress: bool = True
    nvtx: bool = True
    sample_interval_ms: float = 100.0
    """NVML / CPU counter period."""
    record_alternate_ms: float = 0.0
    """Benchmarks: recording pauses in every other window of this many ms of the host clock (0 = never), so
    one run measures throughput with and without it side by side (`requests.jsonl` has each token's time)."""

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise InvalidConfigError(f"--stages must be >= 1, got {self.stages}")
        if self.schedule not in SCHEDULES:
            raise InvalidConfigError(f"unknown --schedule {self.schedule!r}; valid: {', '.join(SCHEDULES)}")
        if self.chunks < 1 or (self.chunks > 1 and self.schedule != "interleaved"):
            raise InvalidConfigError(f"--chunks {self.chunks} needs --schedule interleaved (and chunks >= 1)")
        for name in ("microbatches", "max_inflight"):
            if getattr(self, name) < 0:
                raise InvalidConfigError(f"--{name.replace('_', '-')} must be >= 0 (0 = one per stage)")
        for name in ("max_batch", "requests", "prompt_len", "max_new_tokens", "layers"):
            if getattr(self, name) < 1:
                raise InvalidConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        floats = ("rate", "temperature", "top_p", "timeout_s", "embed_cost_ms", "head_cost_ms", "sample_interval_ms",
                  "record_alternate_ms")  # fmt: skip
        for name in floats:
            if not math.isfinite(getattr(self, name)):
                flag = "--timeout" if name == "timeout_s" else f"--{name.replace('_', '-')}"
                raise InvalidConfigError(f"{flag} must be a finite number, got {getattr(self, name)}")
        for name in ("rate", "temperature"):
            if getattr(self, name) < 0:
                raise InvalidConfigError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.top_p <= 1:
            raise InvalidConfigError(f"--top-p must be in (0, 1], got {self.top_p}")
        if 0 < self.rate < MIN_RATE:
            raise InvalidConfigError(
                f"--rate {self.rate} req/s is too slow to schedule: give 0 (all at once) or >= {MIN_RATE}"
            )
        if not 0 <= self.seed < 2**63:
            raise InvalidConfigError(f"--seed must be in [0, 2**63), got {self.seed}")
        if self.sample_interval_ms <= 0:
            raise InvalidConfigError("sample_interval_ms must be > 0")
        if self.backend not in BACKENDS:
            raise InvalidConfigError(f"unknown --backend {self.backend!r}; valid: {', '.join(BACKENDS)}")
        if self.dtype not in DTYPES:
            raise InvalidConfigError(f"unknown --dtype {self.dtype!r}; valid: {', '.join(DTYPES)}")
        if self.record_alternate_ms < 0 or (self.record_alternate_ms > 0 and not self.record):
            raise InvalidConfigError("record_alternate_ms must be >= 0, and > 0 only with recording on")
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise InvalidConfigError(f"--timeout must be > 0 and <= {MAX_TIMEOUT_S:.0f} seconds, got {self.timeout_s}")
        if self.model != SYNTHETIC and self.model not in PRESETS and not Path(self.model).is_dir():
            raise InvalidConfigError(
                f"--model {self.model!r} is neither a preset ({', '.join(PRESETS)}), `synthetic`, nor a directory "
                "holding a Hugging Face checkpoint (config.json + *.safetensors)"
            )
        if not self.synthetic and self.model not in PRESETS:
            self.shape()  # a checkpoint the engine would compute differently from transformers fails here
        if self.synthetic:
            parse_costs(self.layer_cost_ms, self.layers)
            if self.embed_cost_ms < 0 or self.head_cost_ms < 0:
                raise InvalidConfigError("--embed-cost-ms and --head-cost-ms must be >= 0")
        if self.prompts is not None and not Path(self.prompts).is_file():
            what = "is a directory" if Path(self.prompts).is_dir() else "does not exist"
            raise InvalidConfigError(f"--prompts {self.prompts} {what}: give a JSONL file of prompt_ids")
        self._refuse_unused()

    def _refuse_unused(self) -> None:
        """An option this run would ignore is refused: whoever gave it expects something that will not happen."""
        fields = EngineConfig.__dataclass_fields__
        serve = self.schedule == "serve"
        ignored = {
            "microbatches": "" if not serve else "serve keeps --max-inflight micro-batches in flight",
            "max_inflight": "" if serve else f"{self.schedule} runs --microbatches per step",
            "max_batch": "" if serve else f"{self.schedule} splits the requests over --microbatches",
            "rate": "" if serve else f"{self.schedule} takes every request at once",
            "requests": "" if self.prompts is None else "--prompts gives the requests",
            "prompt_len": "" if self.prompts is None else "--prompts gives the prompts",
        }
        for name in ("layers", "layer_cost_ms", "embed_cost_ms", "head_cost_ms"):
            ignored[name] = "" if self.synthetic else f"it shapes --model synthetic; {self.model} has its own layers"
        for name, why in ignored.items():
            if why and getattr(self, name) != fields[name].default:
                raise InvalidConfigError(f"--{name.replace('_', '-')} has no effect here ({why}): drop it")

    @property
    def synthetic(self) -> bool:
        return self.model == SYNTHETIC

    @property
    def inflight(self) -> int:
        """Micro-batches per step (gpipe/interleaved) or slots in flight (serve)."""
        n = self.max_inflight if self.schedule == "serve" else self.microbatches
        return n or self.stages

    @property
    def virtual_stages(self) -> int:
        return self.stages * self.chunks

    def shape(self) -> ModelShape:
        """The model's shape: a preset, the checkpoint's config, or `tiny`'s widths with --layers layers."""
        if self.synthetic:
            return dataclasses.replace(PRESETS["tiny"], name=SYNTHETIC, layers=self.layers)
        if self.model in PRESETS:
            return ModelShape.from_name(self.model)
        return ModelShape.from_hf_config(self.model, exact=True)

    def layer_costs_ms(self) -> list[float]:
        return parse_costs(self.layer_cost_ms, self.layers) if self.synthetic else []

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineConfig:
        return cls(**data)
