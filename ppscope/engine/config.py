"""The engine's configuration: what one run needs, in typed sections, validated as it is made.

`EngineConfig` is made of `pipeline` (how the model is laid over the ranks), `model`, `workload` (the
requests and how tokens are drawn), `output` (what is recorded, where), `runtime` (backend, timeout),
`bench`, knobs only benchmarks set, and `emulate` (the synthetic model's waits made from a real model on a real
GPU, which sets the model section). Values are typed (a split is a tuple of ints, layer costs a tuple of ms):
text is parsed once, at the edge (`ppscope.cli.engine_options`). Each section checks its own fields when it
is made, `EngineConfig` what spans sections; a refusal names the field (`pipeline.microbatches must be >= 0`),
which the CLI words as its flag. `to_json`/`from_json` give the flat form kept as meta.json's `config` and
sent to each spawned rank. Nothing here knows about processes, tensors or hardware (whether NCCL can run is
decided in `ppscope.engine.prepare`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ppscope.balance.costs import parse_ms_list
from ppscope.balance.modelled.gpus import DEFAULT_GPU, gpu_named
from ppscope.balance.modelled.shapes import PRESETS, RENAMED, ModelShape, canonical_dtype
from ppscope.balance.split import parse_counts
from ppscope.engine.emulate import emulation, emulation_text
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.schedules import Schedule

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "BACKENDS",
    "DEVICES",
    "DTYPES",
    "FLAT_KEYS",
    "SECTIONS",
    "BenchConfig",
    "EmulateConfig",
    "EngineConfig",
    "ModelConfig",
    "OutputConfig",
    "PipelineConfig",
    "RuntimeConfig",
    "WorkloadConfig",
]

DTYPES = ("float32", "float64", "bfloat16", "float16")
MAX_TIMEOUT_S = 1e6
"""The longest timeout (11.6 days): longer ones overflow the timers they are handed to."""
MIN_RATE = 1e-3
"""The slowest Poisson rate (one request per 17 minutes) whose arrival times fit a nanosecond clock."""
BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")
SYNTHETIC = "synthetic"
LAYER_SPANS_EVERY = 8
"""By default each stage times its layers in every 8th pass: costs from inside the run at a small price
(benchmarks/bench_engine.py measures it)."""


def _finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise InvalidConfigError(ErrorCode.BAD_VALUE, f"{name} must be a finite number, got {value}")


def _at_least(name: str, value: int, low: int, note: str = "") -> None:
    if value < low:
        raise InvalidConfigError(ErrorCode.BAD_VALUE, f"{name} must be >= {low}{note}, got {value}")


def _one_of(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise InvalidConfigError(ErrorCode.UNKNOWN_CHOICE, f"unknown {name} {value!r}; valid: {', '.join(valid)}")


def _refuse_unused(section: str, values: Any, ignored: Mapping[str, str]) -> None:
    """A field this run would ignore, given other than its default, is refused: whoever gave it expects
    something that will not happen. `ignored`: field -> why it is ignored ("" where it is not)."""
    defaults = {f.name: f.default for f in dataclasses.fields(values)}
    for name, why in ignored.items():
        if why and getattr(values, name) != defaults[name]:
            raise InvalidConfigError(
                ErrorCode.CONFLICTING_OPTIONS, f"{section}.{name} has no effect here ({why}): drop it"
            )


def _ms_text(values: tuple[float, ...]) -> str:
    return ",".join(f"{v:g}" for v in values)


@dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """How the model is laid over the ranks and how micro-batches go round them."""

    stages: int = 2
    """Pipeline stages = ranks (count)."""
    schedule: str = Schedule.SERVE.value
    """`gpipe`, `interleaved` or `serve` (a name)."""
    microbatches: int = 0
    """Micro-batches per step, gpipe/interleaved (count; 0 = one per stage)."""
    chunks: int = 1
    """Model chunks per rank, interleaved (count)."""
    max_inflight: int = 0
    """Micro-batches in flight, serve (count; 0 = one per stage)."""
    max_batch: int = 1
    """Requests per micro-batch, serve (count)."""
    split: tuple[int, ...] | None = None
    """Decoder layers per virtual stage (counts); None = $PPSCOPE_PP_LAYER_PARTITION, else vLLM's rule."""

    def __post_init__(self) -> None:
        _at_least("pipeline.stages", self.stages, 1)
        _one_of("pipeline.schedule", self.schedule, Schedule.of_inference())
        if self.chunks < 1 or (self.chunks > 1 and self.schedule != Schedule.INTERLEAVED):
            raise InvalidConfigError(
                ErrorCode.CONFLICTING_OPTIONS,
                f"pipeline.chunks {self.chunks} needs pipeline.schedule interleaved (and chunks >= 1)",
            )
        for name in ("microbatches", "max_inflight"):
            _at_least(f"pipeline.{name}", getattr(self, name), 0, " (0 = one per stage)")
        _at_least("pipeline.max_batch", self.max_batch, 1)
        if self.split is not None and (not self.split or not all(type(n) is int for n in self.split)):
            raise InvalidConfigError(
                ErrorCode.COUNT_MISMATCH, f"pipeline.split {self.split} must hold one layer count per (virtual) stage"
            )
        serve = self.schedule == Schedule.SERVE
        _refuse_unused(
            "pipeline",
            self,
            {
                "microbatches": "serve keeps pipeline.max_inflight micro-batches in flight" if serve else "",
                "max_inflight": "" if serve else f"{self.schedule} runs pipeline.microbatches per step",
                "max_batch": "" if serve else f"{self.schedule} splits the requests over pipeline.microbatches",
            },
        )

    @property
    def inflight(self) -> int:
        """Micro-batches per step (gpipe/interleaved) or slots in flight (serve)."""
        n = self.max_inflight if self.schedule == Schedule.SERVE else self.microbatches
        return n or self.stages

    @property
    def virtual_stages(self) -> int:
        return self.stages * self.chunks


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The model the ranks run, and the costs of the synthetic one."""

    name: str = "tiny"
    """A preset name, `synthetic`, or a Hugging Face Llama checkpoint directory (a path)."""
    dtype: str = "float32"
    """Weights, activations and KV cache: float32, float64, bfloat16 or float16 (a name)."""
    layers: int = 8
    """Decoder layers of the synthetic model (count)."""
    layer_cost_ms: tuple[float, ...] = (5.0,)
    """Synthetic model: time of each decoder layer (ms), one value for every layer or one per layer."""
    embed_cost_ms: float = 0.0
    """Synthetic model: time of the embedding (ms)."""
    head_cost_ms: float = 0.0
    """Synthetic model: time of the final norm + LM head (ms)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))  # fp16 and float16 are one dtype
        # an old preset name builds the preset it was renamed to, and the run records the new name
        object.__setattr__(self, "name", RENAMED.get(self.name, self.name))
        _one_of("model.dtype", self.dtype, DTYPES)
        _at_least("model.layers", self.layers, 1)
        for name in ("embed_cost_ms", "head_cost_ms"):
            _finite(f"model.{name}", getattr(self, name))
        if self.name != SYNTHETIC and self.name not in PRESETS and not Path(self.name).is_dir():
            raise InvalidConfigError(
                ErrorCode.BAD_MODEL,
                f"model.name {self.name!r} is neither a preset ({', '.join(PRESETS)}), `synthetic`, nor a directory "
                "holding a Hugging Face checkpoint (config.json + *.safetensors)",
            )
        if not self.synthetic and self.name not in PRESETS:
            self.shape()  # a checkpoint the engine would compute differently from transformers fails here
        if self.synthetic:
            self._check_costs()
        else:
            why = f"it shapes model.name synthetic; {self.name} has its own layers"
            synthetic_only = ("layers", "layer_cost_ms", "embed_cost_ms", "head_cost_ms")
            _refuse_unused("model", self, dict.fromkeys(synthetic_only, why))

    def _check_costs(self) -> None:
        n = len(self.layer_cost_ms)
        if n not in (1, self.layers):
            raise InvalidConfigError(
                ErrorCode.COUNT_MISMATCH,
                f"model.layer_cost_ms gives {n} values for {self.layers} layers: give one value, or one per layer",
            )
        if not all(math.isfinite(v) and v >= 0 for v in self.layer_cost_ms):
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE,
                f"model.layer_cost_ms {_ms_text(self.layer_cost_ms)} has a negative or non-finite cost: give ms >= 0",
            )
        if self.embed_cost_ms < 0 or self.head_cost_ms < 0:
            raise InvalidConfigError(ErrorCode.BAD_VALUE, "model.embed_cost_ms and model.head_cost_ms must be >= 0")

    @property
    def synthetic(self) -> bool:
        return self.name == SYNTHETIC

    def shape(self) -> ModelShape:
        """The model's shape: a preset, the checkpoint's config, or `tiny`'s widths with `layers` layers."""
        if self.synthetic:
            return dataclasses.replace(PRESETS["tiny"], name=SYNTHETIC, layers=self.layers)
        if self.name in PRESETS:
            return ModelShape.from_name(self.name)
        return ModelShape.from_hf_config(self.name, exact=True)

    def layer_costs_ms(self) -> list[float]:
        """Each decoder layer's synthetic time (ms); empty for a real model."""
        if not self.synthetic:
            return []
        costs = self.layer_cost_ms
        return list(costs * self.layers if len(costs) == 1 else costs)


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    """The requests of the run and how their tokens are drawn."""

    prompts: Path | None = None
    """JSONL file of {"prompt_ids": [...], "max_new_tokens": n}; None = generated requests."""
    requests: int = 8
    """Generated requests (count)."""
    prompt_len: int = 16
    """Generated prompt length (tokens)."""
    max_new_tokens: int = 8
    """Tokens to generate per request (tokens; a prompts file's line may give its own)."""
    rate: float = 0.0
    """Poisson arrivals, serve (requests/s; 0 = all at once)."""
    temperature: float = 0.0
    """Sampling temperature (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling threshold (a probability in (0, 1])."""
    seed: int = 0
    """Seeds the random weights, generated prompts, arrivals and sampling (an integer in [0, 2**63))."""

    def __post_init__(self) -> None:
        for name in ("requests", "prompt_len", "max_new_tokens"):
            _at_least(f"workload.{name}", getattr(self, name), 1)
        for name in ("rate", "temperature", "top_p"):
            _finite(f"workload.{name}", getattr(self, name))
        for name in ("rate", "temperature"):
            if getattr(self, name) < 0:
                raise InvalidConfigError(
                    ErrorCode.BAD_VALUE, f"workload.{name} must be >= 0, got {getattr(self, name)}"
                )
        if not 0 < self.top_p <= 1:
            raise InvalidConfigError(ErrorCode.BAD_VALUE, f"workload.top_p must be in (0, 1], got {self.top_p}")
        if 0 < self.rate < MIN_RATE:
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE,
                f"workload.rate {self.rate} req/s is too slow to schedule: give 0 (all at once) or >= {MIN_RATE}",
            )
        if not 0 <= self.seed < 2**63:
            raise InvalidConfigError(ErrorCode.BAD_VALUE, f"workload.seed must be in [0, 2**63), got {self.seed}")
        if self.prompts is not None and not self.prompts.is_file():
            what = "is a directory" if self.prompts.is_dir() else "does not exist"
            raise InvalidConfigError(
                ErrorCode.BAD_PROMPTS, f"workload.prompts {self.prompts} {what}: give a JSONL file of prompt_ids"
            )
        if self.prompts is not None:
            gives = "workload.prompts gives the"
            _refuse_unused("workload", self, {"requests": f"{gives} requests", "prompt_len": f"{gives} prompts"})


@dataclass(frozen=True, kw_only=True)
class OutputConfig:
    """What the run records and shows, and where."""

    out: Path | None = None
    """Run directory (a path; None = runs/<timestamp>)."""
    record: bool = True
    """Record spans and counters (False: an overhead baseline that records nothing)."""
    nvtx: bool = True
    """Push an NVTX range for every recorded span."""
    progress: bool = True
    """Show a progress bar on stderr."""
    sample_interval_ms: float = 100.0
    """NVML / CPU counter period (ms)."""
    layer_spans: int = LAYER_SPANS_EVERY
    """Time each decoder layer of every k-th pass of each stage as a `layer` span, the layer costs measured
    inside the run (k, a count; 0 = never)."""

    def __post_init__(self) -> None:
        _at_least("output.layer_spans", self.layer_spans, 0, " (0 = never)")
        _finite("output.sample_interval_ms", self.sample_interval_ms)
        if self.sample_interval_ms <= 0:
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE, f"output.sample_interval_ms must be > 0, got {self.sample_interval_ms}"
            )


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """How the ranks talk and how long they wait for each other."""

    backend: str = "auto"
    """auto, gloo or nccl (a name; auto = nccl with a GPU per rank)."""
    timeout_s: float = 60.0
    """How long a rank waits for a peer before giving up (s); a failure stops every rank within it."""
    device: str = "auto"
    """auto, cpu or cuda: where each rank computes. auto: its GPU with NCCL, else the CPU. cuda with gloo: every
    rank on a GPU (ranks share one where there are fewer GPUs than ranks), activations through host memory."""

    def __post_init__(self) -> None:
        _one_of("runtime.backend", self.backend, BACKENDS)
        _one_of("runtime.device", self.device, DEVICES)
        if self.backend == "nccl" and self.device == "cpu":
            raise InvalidConfigError(
                ErrorCode.CONFLICTING_OPTIONS,
                "--backend nccl carries tensors between GPUs: use --device cuda or auto with it, "
                "or --backend gloo for ranks on the CPU",
            )
        _finite("runtime.timeout_s", self.timeout_s)
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE,
                f"runtime.timeout_s must be > 0 and <= {MAX_TIMEOUT_S:.0f} seconds, got {self.timeout_s}",
            )


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """Benchmarks only, never a command-line option: knobs that change what a run measures. Alternating
    recording lets one run measure throughput with and without it side by side (`requests.jsonl` has each
    token's time)."""

    record_alternate_ms: float = 0.0
    """Recording pauses in every other window of this many ms of the host clock (ms; 0 = never)."""
    layer_spans_alternate_ms: float = 0.0
    """Layer spans are taken only in every other window of this many ms of the host clock (ms; 0 = always)."""

    def __post_init__(self) -> None:
        for name in ("record_alternate_ms", "layer_spans_alternate_ms"):
            value = getattr(self, name)
            _finite(f"bench.{name}", value)
            if value < 0:
                raise InvalidConfigError(ErrorCode.BAD_VALUE, f"bench.{name} must be >= 0, got {value}")


@dataclass(frozen=True, kw_only=True)
class EmulateConfig:
    """Emulated GPU stages: the synthetic model waits, part by part, the time the cost model gives a real model
    on a real GPU, scaled (`ppscope.engine.emulate`)."""

    model: str = ""
    """The model preset whose decode pass is emulated (a name, e.g. llama3-8b; "" = no emulation)."""
    gpu: str = DEFAULT_GPU
    """The GPU it is timed on (a name of the GPU table)."""
    scale: float = 0.0
    """Every modelled time is multiplied by this (a factor; 0 = chosen so a stage's step takes about 30 ms)."""

    def __post_init__(self) -> None:
        _finite("emulate.scale", self.scale)
        if self.model:
            gpu_named(self.gpu)  # an unknown GPU is refused here, with the valid names
        else:
            _refuse_unused("emulate", self, dict.fromkeys(("gpu", "scale"), "emulate.model is not set"))

    @property
    def on(self) -> bool:
        return bool(self.model)

    def text(self) -> str:
        """`emulated llama3-8b on h100-sxm (roofline), ×15 slower`; "" when not emulating."""
        return emulation_text(self.model, self.gpu, self.scale) if self.on else ""


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Everything one run of the engine needs; every rank gets the same."""

    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    """Stages, schedule, micro-batches, chunks, split."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Which model, its dtype, the synthetic model's layers and costs."""
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    """Requests (generated or from a file), arrivals, sampling, seed."""
    output: OutputConfig = field(default_factory=OutputConfig)
    """Run directory, what is recorded, progress bar."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Backend and timeout."""
    bench: BenchConfig = field(default_factory=BenchConfig)
    """Benchmarks only."""
    emulate: EmulateConfig = field(default_factory=EmulateConfig)
    """Emulated GPU stages: which model on which GPU the synthetic model's waits stand for."""

    def __post_init__(self) -> None:
        if self.emulate.on:
            self._emulate()
        schedule = self.pipeline.schedule
        if schedule != Schedule.SERVE:
            _refuse_unused("workload", self.workload, {"rate": f"{schedule} takes every request at once"})
        if self.bench.record_alternate_ms > 0 and not self.output.record:
            raise InvalidConfigError(
                ErrorCode.CONFLICTING_OPTIONS,
                "bench.record_alternate_ms must be 0 with recording off: it pauses the recording",
            )
        if self.bench.layer_spans_alternate_ms > 0 and not (self.output.record and self.output.layer_spans):
            raise InvalidConfigError(
                ErrorCode.CONFLICTING_OPTIONS,
                "bench.layer_spans_alternate_ms needs recording on and output.layer_spans > 0: it pauses the layer "
                "spans",
            )

    def _emulate(self) -> None:
        """Set the model section to the emulation's synthetic model, and the chosen scale: a model section given
        beside it (other than the one it sets, as a run's meta.json holds) would be ignored, so it is refused."""
        w = self.workload
        made = emulation(
            self.emulate.model,
            self.emulate.gpu,
            stages=self.pipeline.stages,
            batch=self.pipeline.max_batch,
            context=w.prompt_len + w.max_new_tokens // 2,  # the mean context of the decode passes
            scale=self.emulate.scale,
        )
        model = ModelConfig(
            name=SYNTHETIC,
            dtype=self.model.dtype,
            layers=len(made.layer_ms),
            layer_cost_ms=made.layer_ms,
            embed_cost_ms=made.embed_ms,
            head_cost_ms=made.head_ms,
        )
        if self.model not in (ModelConfig(dtype=self.model.dtype), model):
            raise InvalidConfigError(
                ErrorCode.CONFLICTING_OPTIONS,
                f"model.name {self.model.name!r} has no effect with emulate.model {self.emulate.model}: the emulation "
                "sets the synthetic model's layers and costs; drop model.name (or emulate.model)",
            )
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "emulate", dataclasses.replace(self.emulate, scale=made.scale))

    def to_json(self) -> dict[str, Any]:
        """The flat form (meta.json's `config`, what a spawned rank is sent): one key per field, as before the
        sections (`model` is model.name); tuples as lists, paths as text."""
        return {key: _to_json(getattr(getattr(self, section), name)) for key, (section, name) in FLAT_KEYS.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineConfig:
        """The config of a flat form (`to_json`'s, or an older run's, whose split and layer costs were text)."""
        unknown = sorted(set(data) - set(FLAT_KEYS))
        if unknown:
            raise InvalidConfigError(
                ErrorCode.UNKNOWN_CONFIG_KEY, f"unknown engine config key(s): {', '.join(unknown)}"
            )
        return cls.from_fields({".".join(FLAT_KEYS[key]): _from_json(key, value) for key, value in data.items()})

    @classmethod
    def from_file(cls, path: str | Path) -> EngineConfig:
        """The config a file holds: TOML in EngineConfig's sections (`[pipeline]`, `[model]`, ...), a run's
        `meta.json` (its `config`, less its run directory: a re-run writes a new one), or the flat JSON form."""
        return cls.from_fields(config_fields(path))

    @classmethod
    def from_fields(cls, values: Mapping[str, Any]) -> EngineConfig:
        """The config of `section.field` -> typed value (the rest default)."""
        given: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        for path, value in values.items():
            section, _, name = path.partition(".")
            if section not in SECTIONS or name not in {f.name for f in dataclasses.fields(SECTIONS[section])}:
                raise InvalidConfigError(ErrorCode.UNKNOWN_CONFIG_KEY, f"unknown engine config field {path!r}")
            given[section][name] = value
        return cls(**{name: SECTIONS[name](**kw) for name, kw in given.items()})


SECTIONS: dict[str, type[Any]] = {
    "pipeline": PipelineConfig,
    "model": ModelConfig,
    "workload": WorkloadConfig,
    "output": OutputConfig,
    "runtime": RuntimeConfig,
    "bench": BenchConfig,
    "emulate": EmulateConfig,
}
"""Section name -> its dataclass, in EngineConfig's order."""
assert list(SECTIONS) == [f.name for f in dataclasses.fields(EngineConfig)], "SECTIONS lists EngineConfig's fields"
FLAT_KEYS: dict[str, tuple[str, str]] = {
    ("model" if (section, f.name) == ("model", "name") else f"emulate_{f.name}" if section == "emulate" else f.name): (
        section,
        f.name,
    )
    for section, kind in SECTIONS.items()
    for f in dataclasses.fields(kind)
}
"""Key of the flat form -> (section, field); the emulate section's keys are prefixed (`emulate_model`)."""
assert len(FLAT_KEYS) == sum(len(dataclasses.fields(kind)) for kind in SECTIONS.values()), "flat keys collide"


def _to_json(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return str(value) if isinstance(value, Path) else value


def _from_json(key: str, value: Any) -> Any:
    if value is None:
        return None
    if key == "split":
        return tuple(parse_counts(value) if isinstance(value, str) else (int(n) for n in value))
    if key == "layer_cost_ms":
        return tuple(parse_ms_list(value, "layer_cost_ms") if isinstance(value, str) else (float(v) for v in value))
    if key in ("prompts", "out"):
        return Path(value)
    return value


def config_fields(path: str | Path) -> dict[str, Any]:
    """`section.field` -> typed value of each field a config file sets (see `EngineConfig.from_file`)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidConfigError(
            ErrorCode.CONFIG_FILE_UNREADABLE, f"cannot read the config file {path}: {exc}"
        ) from None
    if path.suffix == ".json" or text.lstrip().startswith("{"):
        return _json_fields(path, text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidConfigError(
            ErrorCode.CONFIG_FILE_UNREADABLE, f"{path} is not TOML ({exc}): give [section] tables of `key = value`"
        ) from None
    fields: dict[str, Any] = {}
    for section, table in data.items():
        if section not in SECTIONS or not isinstance(table, dict):
            raise InvalidConfigError(
                ErrorCode.UNKNOWN_CONFIG_KEY, f"{path}: unknown section [{section}]; valid: {', '.join(SECTIONS)}"
            )
        for name, value in table.items():
            key = _FLAT_KEY_OF.get((section, name))
            if key is None:
                known = ", ".join(f.name for f in dataclasses.fields(SECTIONS[section]))
                raise InvalidConfigError(
                    ErrorCode.UNKNOWN_CONFIG_KEY, f"{path}: [{section}] has no field {name!r}; valid: {known}"
                )
            fields[f"{section}.{name}"] = _from_json(key, value)
    return fields


def _json_fields(path: Path, text: str) -> dict[str, Any]:
    """A run's meta.json (its `config`, without the run directory) or the flat form."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidConfigError(ErrorCode.CONFIG_FILE_UNREADABLE, f"{path} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InvalidConfigError(
            ErrorCode.CONFIG_FILE_UNREADABLE,
            f"{path} holds no config: give a TOML file, a run's meta.json or a flat JSON object",
        )
    if "config" in data:  # a run's metadata: re-run what it ran, into a new directory
        data = {k: v for k, v in dict(data["config"] or {}).items() if k != "out"}
    unknown = sorted(set(data) - set(FLAT_KEYS))
    if unknown:
        raise InvalidConfigError(
            ErrorCode.UNKNOWN_CONFIG_KEY, f"{path}: unknown engine config key(s): {', '.join(unknown)}"
        )
    return {".".join(FLAT_KEYS[key]): _from_json(key, value) for key, value in data.items()}


_FLAT_KEY_OF = {where: key for key, where in FLAT_KEYS.items()}
