"""The trace model: one schema for spans, counters, requests and run metadata, declared once.

Every producer (our engine through the run store, the nsys and Kineto importers, the simulator) returns a
`Trace`; every consumer (analyzer, rebalancer, exporters, dashboard) takes one. Bubbles are never stored:
they are derived from spans. This module knows nothing about where a trace came from.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, ErrorCode, IncompleteRunError, InvalidSpanError, SchemaVersionError
from ppscope.trace.actions import Phase
from ppscope.trace.notices import Notice, missing_ranks
from ppscope.trace.schemaframe import schema_frame

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        def __str__(self) -> str:
            return str(self.value)


__all__ = [
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "COUNTER_COLUMNS",
    "REQUEST_COLUMNS",
    "SCHEMA_VERSION",
    "SPAN_COLUMNS",
    "ClockInfo",
    "Lane",
    "Metric",
    "Phase",
    "RankInfo",
    "RunMeta",
    "SpanKind",
    "Trace",
    "counters_frame",
    "empty_counters",
    "empty_requests",
    "empty_spans",
    "lane_of",
    "requests_frame",
    "spans_frame",
]

SCHEMA_VERSION = 2
"""Version of the span/counter/metadata schema written by this ppscope; readers refuse newer ones and read
older ones. 2 added `RankInfo.replica`, `.sm_clock_mhz`, `.counters`, `ClockInfo.at_ns`, `.drift_ppm` and the
span kinds `backward` and `layer`: a reader of schema 1 refuses a rank entry with fields it does not know, so
it is told to upgrade rather than that the file is damaged."""


class SpanKind(StrEnum):
    """What a span measures. Compute kinds make a stage busy; the others explain why it is idle."""

    FORWARD = "forward"  # decoder layers of one chunk on one micro-batch
    EMBED = "embed"  # token embedding (first stage)
    HEAD = "head"  # final norm + LM head (last stage)
    SAMPLE = "sample"  # turning logits into token ids (last stage)
    SEND = "send"  # posting a send and waiting for it to complete: blocked on the receiver
    RECV = "recv"  # moving received bytes (transfer proper, when it can be told from waiting)
    RECV_WAIT = "recv_wait"  # waiting for a predecessor's data to arrive
    KERNEL = "kernel"  # an imported GPU kernel (compute)
    NCCL = "nccl"  # an imported communication kernel
    MEMCPY = "memcpy"  # an imported copy
    MEMSET = "memset"  # an imported memset
    RANGE = "range"  # an imported annotation range (NVTX, profiler step, CPU op) with no fixed meaning
    STEP = "step"  # one scheduler iteration on a rank (host side)
    HOST = "host"  # host-side work of the engine outside the model (scheduling, bookkeeping)
    MARK = "mark"  # a one-off event: start_ns == end_ns
    BACKWARD = "backward"  # training: one chunk's backward on one micro-batch (phase B full, I inputs, W weights)
    LAYER = "layer"  # one decoder layer inside a sampled `forward`; its name is `layer N` (see layer_span_name)
    COLLECTIVE = "collective"  # a collective not between neighbouring stages: gradient reduce, parameter gather
    OPTIMIZER = "optimizer"  # training: the optimizer step and what prepares it (gradient clipping, zeroing)


COMPUTE_KINDS: frozenset[str] = frozenset(
    {SpanKind.FORWARD, SpanKind.BACKWARD, SpanKind.EMBED, SpanKind.HEAD, SpanKind.SAMPLE, SpanKind.KERNEL}
)
"""Kinds whose union over a stage is that stage's busy time."""

COMM_KINDS: frozenset[str] = frozenset({SpanKind.SEND, SpanKind.RECV, SpanKind.RECV_WAIT, SpanKind.NCCL})
"""Kinds that move data between stages."""


class Lane(StrEnum):
    """Timeline row within a rank. Imports may also use a GPU stream name such as `stream 7`."""

    COMPUTE = "compute"
    SEND = "send"
    RECV = "recv"
    HOST = "host"
    LAYERS = "layers"  # the `layer` spans timed inside a rank's forwards


_DEFAULT_LANE: dict[str, str] = {
    SpanKind.SEND: Lane.SEND,
    SpanKind.RECV: Lane.RECV,
    SpanKind.RECV_WAIT: Lane.RECV,
    SpanKind.STEP: Lane.HOST,
    SpanKind.HOST: Lane.HOST,
    SpanKind.MARK: Lane.HOST,
    SpanKind.RANGE: Lane.HOST,
    SpanKind.LAYER: Lane.LAYERS,
}


def lane_of(kind: str) -> str:
    """The lane a span of `kind` goes on unless its producer says otherwise."""
    return str(_DEFAULT_LANE.get(kind, Lane.COMPUTE))


class Metric(StrEnum):
    """Counter metrics. GPU ones come from NVML; `cpu_util_pct` is a rank's process CPU use."""

    GPU_UTIL_PCT = "gpu_util_pct"
    GPU_MEM_USED_BYTES = "gpu_mem_used_bytes"
    GPU_POWER_W = "gpu_power_w"
    GPU_SM_CLOCK_MHZ = "gpu_sm_clock_mhz"
    CPU_UTIL_PCT = "cpu_util_pct"
    RSS_BYTES = "rss_bytes"


# Column name -> dtype. The one declaration of the span schema (docs/ARCHITECTURE.md, "Spans").
SPAN_COLUMNS: dict[str, Any] = {
    "rank": np.int32,  # global rank; for imports one per process/GPU
    "stage": np.int32,  # pipeline stage, virtual stage with interleaving; -1 unknown
    "lane": str,  # compute / send / recv / host, or a GPU stream
    "kind": str,  # a SpanKind value
    "name": str,  # label shown to people
    "mb": np.int32,  # micro-batch id, -1 none
    "step": np.int32,  # decode step / iteration, -1 none
    "chunk": np.int32,  # model chunk on this rank (interleaved PP), else 0
    "phase": str,  # prefill / decode / backward / ""; pipelining imports: the action type (F, B, I, W, ...)
    "start_ns": np.int64,  # on the run's common clock
    "end_ns": np.int64,
    "nbytes": np.int64,  # bytes moved, 0 none
    "tokens": np.int32,  # tokens processed, 0 none
    "peer": np.int32,  # peer rank of a send/recv, -1 none
}

COUNTER_COLUMNS: dict[str, Any] = {
    "ts_ns": np.int64,  # on the run's common clock
    "rank": np.int32,
    "device": np.int32,  # GPU index; -1 for the host CPU
    "metric": str,  # a Metric value
    "value": np.float64,
}

REQUEST_COLUMNS: dict[str, Any] = {
    "id": np.int64,
    "prompt_len": np.int32,
    "output_len": np.int32,
    "arrival_ns": np.int64,  # common clock; -1 unknown
    "first_token_ns": np.int64,
    "finish_ns": np.int64,
}


def spans_frame(data: Mapping[str, Any] | pd.DataFrame | None = None, *, validate: bool = True) -> pd.DataFrame:
    """A spans DataFrame with exactly the schema's columns and dtypes (extra columns are dropped)."""
    df = schema_frame(SPAN_COLUMNS, data)
    if validate and len(df):
        bad = df["end_ns"].to_numpy() < df["start_ns"].to_numpy()
        if bad.any():
            row = df[bad].iloc[0]
            raise InvalidSpanError(
                ErrorCode.SPAN_REVERSED,
                f"{int(bad.sum())} span(s) end before they start, e.g. {row['kind']} on rank {row['rank']}: "
                f"start_ns={row['start_ns']} end_ns={row['end_ns']}",
            )
    return df


def counters_frame(data: Mapping[str, Any] | pd.DataFrame | None = None) -> pd.DataFrame:
    return schema_frame(COUNTER_COLUMNS, data)


def requests_frame(data: Mapping[str, Any] | pd.DataFrame | None = None) -> pd.DataFrame:
    return schema_frame(REQUEST_COLUMNS, data)


def empty_spans() -> pd.DataFrame:
    return spans_frame(None)


def empty_counters() -> pd.DataFrame:
    return counters_frame(None)


def empty_requests() -> pd.DataFrame:
    return requests_frame(None)


@dataclass(kw_only=True)
class ClockInfo:
    """How one rank's clock relates to the common clock (rank 0's monotonic clock)."""

    offset_ns: int = 0
    """This rank's clock minus the common clock at `at_ns`: common = local - offset, where the offset at local
    time t is offset_ns + drift_ppm × 1e-6 × (t - at_ns) (`ppscope.trace.clock.offsets_at`)."""
    uncertainty_ns: int = 0
    """Half the round trip of the best ping-pong exchange: the true offset lies within ± this."""
    method: str = "none"
    """How the offset was found: `none` (rank 0, or a single rank), `same-host` (a rank on rank 0's host,
    which reads the same monotonic clock: offset 0 exactly), `ping-pong`, `import`."""
    at_ns: int = 0
    """When the offset was measured, on this rank's clock."""
    drift_ppm: float = 0.0
    """How fast the offset grows, in parts per million (ns per ms of this rank's clock): from a second
    measurement at the end of a run, when the offset moved by more than the two measurements'
    uncertainties; else 0."""


@dataclass(kw_only=True)
class RankInfo:
    """What is known about one rank of a run."""

    rank: int
    stage: int = -1
    """First (or only) pipeline stage this rank runs; -1 unknown."""
    replica: int = -1
    """The data-parallel replica (one whole pipeline) this rank belongs to; -1 unknown: one pipeline. Ranks of
    one stage and one replica (tensor parallel) are analysed together as that replica's stage."""
    host: str = ""
    device: str = ""
    """Device name, e.g. `NVIDIA H100 80GB HBM3` or `cpu`."""
    pid: int = -1
    clock: ClockInfo = field(default_factory=ClockInfo)
    sm_clock_mhz: float = 0.0
    """The SM clock the synthetic model's GPU sleep was calibrated at (cycles of `torch.cuda._sleep` per µs,
    once the clock settled); 0 when not measured."""
    counters: str = ""
    """Where the rank's usage counters come from: `nvml GPU-…` or `nvml MIG-…` (the device NVML found by the
    UUID CUDA gives it), `cpu`, or `cpu:` and why NVML could not be used on a GPU rank; empty when not said."""


@dataclass(kw_only=True)
class RunMeta:
    """Run-level metadata, serialised to `meta.json`. Everything needed to interpret the spans."""

    schema_version: int = SCHEMA_VERSION
    run_id: str = ""
    source: str = "unknown"
    """Who produced the trace: `ppscope` (our engine), `nsys`, `kineto`, `simulator`; `unknown` when not said (a
    trace built in code or a hand-written meta.json: nothing engine-specific is assumed of it)."""
    created_unix_ns: int = 0
    status: str = "running"
    """`running`, `finished`, `failed` or `interrupted`."""
    world_size: int = 1
    """Number of ranks (processes) that record."""
    pp_size: int = 1
    """Pipeline stages (physical, one per rank in our engine)."""
    schedule: str = ""
    """`gpipe`, `interleaved`, `serve`, or empty when unknown."""
    microbatches: int = 0
    chunks: int = 1
    """Model chunks per rank (V of interleaved PP)."""
    split: list[int] = field(default_factory=list)
    """Layer counts per stage, in the format of VLLM_PP_LAYER_PARTITION."""
    split_source: str = ""
    """Where the split came from: `--split`, `PPSCOPE_PP_LAYER_PARTITION`, `vllm-default`, ..."""
    model: dict[str, Any] = field(default_factory=dict)
    """Model name and shape (layers, hidden size, heads, ...)."""
    backend: str = ""
    ranks: list[RankInfo] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    """The producer's full configuration, for reproducing the run."""
    error: str = ""
    """Why the run failed, when it did."""

    @property
    def unrecorded(self) -> bool:
        """An engine run made with `--no-record`: no rank writes spans, by design; only requests are kept."""
        return self.source == "ppscope" and self.config.get("record") is False

    @property
    def pipeline_engine(self) -> str | None:
        """The pipeline engine the trace shows (a `schedules.Engine` value): what the Kineto reader recognised
        (`config.pipelining.engine`), torch.distributed.pipelining for the recording hook's runs, else None."""
        found = self.config.get("pipelining")
        if isinstance(found, dict) and found.get("engine"):
            return str(found["engine"])
        return "torch.pipelining" if self.source == "pipelining" else None

    def rank_info(self, rank: int) -> RankInfo | None:
        for info in self.ranks:
            if info.rank == rank:
                return info
        return None

    def ranks_missing(self, recorded: Iterable[int]) -> list[int]:
        """The run's ranks that are not among `recorded`: the one rule of which ranks a trace should hold.

        Ranks 0 … `world_size` − 1; but where the metadata names a rank past them (an import of some files of a
        bigger job, numbered as the job numbers them: rank 1's file alone, two of 128 ranks), the ranks it
        names, so that which file was given does not decide whether the trace is complete. `world_size` 0 (one
        replica cut from a job) expects nothing."""
        named = {i.rank for i in self.ranks}
        expected = named if any(r >= self.world_size for r in named) else set(range(self.world_size))
        return sorted(expected - {int(r) for r in recorded}) if self.world_size > 0 else []

    def require_every_rank(self, recorded: Iterable[int], needs: str) -> None:
        """Raise IncompleteRunError naming the missing ranks (`notices.missing_ranks`) and what `needs` them."""
        missing = self.ranks_missing(recorded)
        if missing:
            raise IncompleteRunError(ErrorCode.MISSING_RANKS, f"{missing_ranks(missing, self.world_size)}: {needs}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "metadata") -> RunMeta:
        if not isinstance(data, Mapping):
            raise CorruptFileError(
                ErrorCode.BAD_METADATA, f"{where}: expected a JSON object, found {type(data).__name__}"
            )
        version = data.get("schema_version", SCHEMA_VERSION)
        if not isinstance(version, int):
            raise CorruptFileError(
                ErrorCode.BAD_METADATA, f"{where}: schema_version must be an integer, found {version!r}"
            )
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                ErrorCode.SCHEMA_TOO_NEW,
                f"{where} was written with trace schema {version}, newer than this ppscope's {SCHEMA_VERSION}: "
                "upgrade ppscope (pip install -U ppscope) to read it",
            )
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        try:
            ranks = [_rank_info(r) for r in kwargs.pop("ranks", [])]
            meta = cls(**kwargs, ranks=ranks)
        except (TypeError, ValueError, AttributeError) as exc:
            raise CorruptFileError(ErrorCode.BAD_METADATA, f"{where}: malformed metadata ({exc})") from None
        _check_types(meta, where)
        return meta

    @classmethod
    def from_json(cls, text: str, *, where: str = "metadata") -> RunMeta:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CorruptFileError(ErrorCode.NOT_JSON, f"{where} is not valid JSON ({exc})") from None
        return cls.from_dict(data, where=where)


def _rank_info(data: Any) -> RankInfo:
    if not isinstance(data, Mapping):
        raise TypeError(f"a rank entry must be an object, found {type(data).__name__}")
    fields = dict(data)
    clock = fields.pop("clock", {}) or {}
    if not isinstance(clock, Mapping):
        raise TypeError("a rank's clock must be an object")
    for given, cls in ((fields, RankInfo), (clock, ClockInfo)):
        unknown = set(given) - {f.name for f in dataclasses.fields(cls)}
        if unknown:  # named here, as repr: a key may hold any character, newlines included
            raise TypeError(f"unknown {cls.__name__} field(s) {', '.join(sorted(map(repr, unknown)))}")
    return RankInfo(**fields, clock=ClockInfo(**clock))


_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "run_id": str,
    "source": str,
    "created_unix_ns": int,
    "status": str,
    "world_size": int,
    "pp_size": int,
    "schedule": str,
    "microbatches": int,
    "chunks": int,
    "split": list,
    "split_source": str,
    "model": dict,
    "backend": str,
    "versions": dict,
    "config": dict,
    "error": str,
}


def _check_types(meta: RunMeta, where: str) -> None:
    for name, typ in _FIELD_TYPES.items():
        value = getattr(meta, name)
        if not isinstance(value, typ) or (isinstance(value, bool) and typ is int):
            raise CorruptFileError(
                ErrorCode.BAD_METADATA, f"{where}: field {name!r} has the wrong type ({type(value).__name__})"
            )
    wide = [n for n, t in _FIELD_TYPES.items() if t is int and not -(1 << 63) <= getattr(meta, n) < 1 << 63]
    wide += [n for n in ("world_size", "pp_size") if not 0 <= getattr(meta, n) < 1 << 31]
    if wide:
        raise CorruptFileError(
            ErrorCode.BAD_METADATA, f"{where}: field {wide[0]!r} is out of range ({getattr(meta, wide[0])})"
        )
    if not all(isinstance(n, int) for n in meta.split):
        raise CorruptFileError(
            ErrorCode.BAD_METADATA, f"{where}: split must be a list of integers, found {meta.split!r}"
        )
    for info in meta.ranks:
        values = (info.rank, info.stage, info.replica, info.pid, info.clock.offset_ns, info.clock.uncertainty_ns)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise CorruptFileError(
                ErrorCode.BAD_METADATA,
                f"{where}: rank entries need integer rank, stage, replica, pid, clock.offset_ns and "
                "clock.uncertainty_ns",
            )
        if not all(isinstance(v, str) for v in (info.host, info.device, info.clock.method, info.counters)):
            raise CorruptFileError(
                ErrorCode.BAD_METADATA, f"{where}: rank entries need text host, device, counters and clock.method"
            )
        limits = ((info.rank, 1 << 31), (info.stage, 1 << 31), (info.replica, 1 << 31), (info.clock.offset_ns, 1 << 62))
        if not all(-limit < v < limit for v, limit in (*limits, (info.clock.uncertainty_ns, 1 << 62))):
            raise CorruptFileError(
                ErrorCode.BAD_METADATA, f"{where}: rank {info.rank}: rank, stage or clock offset out of range"
            )
        _check_numbers(info, where)


def _check_numbers(info: RankInfo, where: str) -> None:
    at, drift, mhz = info.clock.at_ns, info.clock.drift_ppm, info.sm_clock_mhz
    if not isinstance(mhz, (int, float)) or isinstance(mhz, bool) or not 0 <= mhz < 1e6:
        raise CorruptFileError(
            ErrorCode.BAD_METADATA, f"{where}: rank {info.rank}: sm_clock_mhz must be a number from 0 to 1e6"
        )
    if not isinstance(at, int) or isinstance(at, bool) or not -(1 << 62) < at < 1 << 62:
        raise CorruptFileError(
            ErrorCode.BAD_METADATA, f"{where}: rank {info.rank}: clock.at_ns must be an integer in range"
        )
    if not isinstance(drift, (int, float)) or isinstance(drift, bool) or not -1e5 < drift < 1e5:
        raise CorruptFileError(
            ErrorCode.BAD_METADATA, f"{where}: rank {info.rank}: clock.drift_ppm must be a number under 1e5 in size"
        )


@dataclass
class Trace:
    """A run's spans, counters, requests and metadata, whatever produced it."""

    spans: pd.DataFrame = field(default_factory=empty_spans)
    counters: pd.DataFrame = field(default_factory=empty_counters)
    meta: RunMeta = field(default_factory=RunMeta)
    requests: pd.DataFrame = field(default_factory=empty_requests)
    warnings: list[Notice] = field(default_factory=list)
    """What the loader could not read or had to guess, for the user to see."""

    @classmethod
    def from_records(
        cls,
        spans: Iterable[Sequence[Any]] | Iterable[Mapping[str, Any]] = (),
        *,
        meta: RunMeta | None = None,
        counters: Iterable[Sequence[Any]] = (),
    ) -> Trace:
        """Build a trace from rows: tuples in schema order or dicts (missing fields take defaults)."""
        rows = [_span_row(r) for r in spans]
        span_df = pd.DataFrame(rows, columns=list(SPAN_COLUMNS)) if rows else None
        counter_df = pd.DataFrame(list(counters), columns=list(COUNTER_COLUMNS)) if counters else None
        return cls(
            spans=spans_frame(span_df),
            counters=counters_frame(counter_df),
            meta=meta or RunMeta(),
        )

    @property
    def ranks(self) -> list[int]:
        return sorted(int(r) for r in self.spans["rank"].unique())

    @property
    def stages(self) -> list[int]:
        return sorted(int(s) for s in self.spans["stage"].unique() if s >= 0)

    def sorted(self) -> Trace:
        """The same trace with spans ordered by (start, rank): the canonical order of every loader."""
        spans, counters = _sorted(self.spans, ["start_ns", "rank", "end_ns"]), _sorted(self.counters, ["ts_ns", "rank"])
        return dataclasses.replace(self, spans=spans, counters=counters)


def _sorted(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """`frame` by `keys` (a stable sort), indexed 0..n-1; a frame already so (most loaders build them in order)
    as a new frame sharing its columns, told at numpy's speed (pandas copies on write: neither frame's changes
    reach the other)."""
    index = frame.index
    if isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1:
        tied = np.ones(max(len(frame) - 1, 0), bool)  # pairs of neighbours equal on the keys so far
        for key in keys:
            values = frame[key].to_numpy()
            if (tied & (values[1:] < values[:-1])).any():
                break
            tied &= values[1:] == values[:-1]
        else:
            return frame.copy(deep=False)
    return frame.sort_values(keys, kind="stable").reset_index(drop=True)


_SPAN_DEFAULTS: dict[str, Any] = {
    "rank": 0,
    "stage": -1,
    "lane": "",
    "kind": SpanKind.RANGE,
    "name": "",
    "mb": -1,
    "step": -1,
    "chunk": 0,
    "phase": "",
    "start_ns": 0,
    "end_ns": 0,
    "nbytes": 0,
    "tokens": 0,
    "peer": -1,
}


def _span_row(row: Sequence[Any] | Mapping[str, Any]) -> tuple[Any, ...]:
    if not isinstance(row, Mapping):
        return tuple(row)
    unknown = set(row) - set(SPAN_COLUMNS)
    if unknown:
        raise InvalidSpanError(
            ErrorCode.UNKNOWN_SPAN_FIELD, f"unknown span field(s) {sorted(unknown)}; valid: {list(SPAN_COLUMNS)}"
        )
    merged = {**_SPAN_DEFAULTS, **row}
    if not merged["lane"]:
        merged["lane"] = lane_of(str(merged["kind"]))
    if not merged["name"]:
        merged["name"] = str(merged["kind"])
    return tuple(str(v) if isinstance(v, StrEnum) else v for v in merged.values())
