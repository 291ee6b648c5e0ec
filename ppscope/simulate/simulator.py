"""The simulator: replay a schedule with modelled costs and return the predicted `Trace`, same schema as a run.

Each rank walks its action list from `ppscope.simulate.schedule` in order; an action starts when the rank is free and
its inputs have arrived (the previous virtual stage's activation, or for the first stage the tokens of the
previous step). Compute spans (`embed`, `forward`, `head`, `sample`) take the modelled costs; a rank's
sends go out one at a time over its link (latency + bytes ÷ bandwidth) as `send` spans, the receiver's
waiting shows as `recv_wait` and the transfer as `recv`, as the engine records them. Per-stage overhead is
left uncovered by spans, as host work is in a real run. The result is written as a normal run directory,
so `analyze`, `export` and the dashboard read predictions and measurements alike; `summarize` takes its
figures from the analyzer rather than defining them again. This module knows nothing about torch or processes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ppscope.analysis import analyze
from ppscope.balance.costs import LayerCosts
from ppscope.balance.split import stage_layer_ranges, validate_split, vllm_default_split
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.simulate.schedule import dependencies, make_schedule
from ppscope.trace.actions import Action
from ppscope.trace.model import SPAN_COLUMNS, Phase, RankInfo, RunMeta, SpanKind, Trace, requests_frame
from ppscope.trace.schedules import Schedule
from ppscope.trace.store import REQUESTS_FILE, RankWriter, create_run

__all__ = ["CommModel", "SimConfig", "simulate", "summarize", "write_run"]

_NS_PER_MS = 1_000_000


@dataclass(frozen=True, kw_only=True)
class CommModel:
    """One hop between neighbouring ranks: latency + bytes ÷ bandwidth."""

    latency_us: float = 0.0
    bandwidth_gb_per_s: float = 0.0
    """Link bandwidth in gigabytes per second (400 Gbit/s InfiniBand = 50 GB/s); 0: unlimited."""
    activation_bytes: int = 0
    """Bytes of the activation one micro-batch sends to the next stage."""
    token_bytes: int = 8
    """Bytes of the sampled tokens the last stage sends back to the first."""

    def __post_init__(self) -> None:
        for name in ("latency_us", "bandwidth_gb_per_s", "activation_bytes", "token_bytes"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise InvalidConfigError(
                    ErrorCode.BAD_VALUE, f"comm model: {name} must be a finite number >= 0, got {value!r}"
                )

    def transfer_ns(self, nbytes: int) -> int:
        wire = nbytes / self.bandwidth_gb_per_s if self.bandwidth_gb_per_s > 0 else 0.0  # ns: bytes ÷ (GB/s)
        return round(self.latency_us * 1000 + wire)


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """A pipeline to simulate. Costs are per micro-batch pass, in ms."""

    schedule: str
    """gpipe, interleaved or serve."""
    stages: int
    """Ranks (physical stages)."""
    microbatches: int
    """Micro-batches (gpipe, interleaved) or micro-batches in flight (serve)."""
    costs: LayerCosts
    chunks: int = 1
    """Model chunks per rank (interleaved)."""
    steps: int = 1
    """Passes per micro-batch: 1 (one prefill) or 1 + decode steps."""
    split: tuple[int, ...] = ()
    """Layer counts per virtual stage; empty: vLLM's default rule."""
    overhead_ms: float = 0.0
    """Host time per action on every rank, outside any span."""
    speed: tuple[float, ...] = ()
    """Relative speed of each rank (divides its compute); empty: all 1."""
    comm: CommModel = field(default_factory=CommModel)
    prefill_factor: float = 1.0
    """Cost of a step-0 pass (prefill) relative to a decode pass."""

    def __post_init__(self) -> None:
        if self.stages < 1 or self.microbatches < 1 or self.chunks < 1 or self.steps < 1:
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE, "--stages, --microbatches, --chunks and --steps must each be >= 1"
            )
        if self.schedule != Schedule.INTERLEAVED and self.chunks != 1:
            raise InvalidConfigError(
                ErrorCode.CONFLICTING_OPTIONS, f"--chunks {self.chunks} needs --schedule interleaved"
            )
        virtual = self.stages * self.chunks
        if self.costs.layers < virtual:
            raise InvalidConfigError(
                ErrorCode.TOO_FEW_LAYERS,
                f"{self.costs.layers} layers cannot fill {virtual} virtual stages ({self.stages} ranks x "
                f"{self.chunks} chunks): use fewer stages or chunks",
            )
        if self.split:
            validate_split(self.split, self.costs.layers, virtual)
        if self.speed and (len(self.speed) != self.stages or min(self.speed) <= 0):
            raise InvalidConfigError(
                ErrorCode.COUNT_MISMATCH, f"speed needs {self.stages} values > 0, got {list(self.speed)}"
            )
        if not np.isfinite(self.overhead_ms) or self.overhead_ms < 0 or not self.prefill_factor > 0:
            raise InvalidConfigError(ErrorCode.BAD_VALUE, "overhead must be >= 0 ms and the prefill factor > 0")

    @property
    def resolved_split(self) -> tuple[int, ...]:
        return self.split or tuple(vllm_default_split(self.costs.layers, self.stages * self.chunks))


def _durations_ns(cfg: SimConfig) -> list[dict[str, int]]:
    """Compute kinds -> duration of one decode pass, per virtual stage (rank speed applied)."""
    split = cfg.resolved_split
    last = len(split) - 1
    out = []
    for v, (first, end) in enumerate(stage_layer_ranges(split)):
        speed = cfg.speed[v % cfg.stages] if cfg.speed else 1.0
        parts = {}
        if v == 0:
            parts[SpanKind.EMBED] = cfg.costs.embed_ms
        parts[SpanKind.FORWARD] = sum(cfg.costs.layer_ms[first:end])
        if v == last:
            parts[SpanKind.HEAD] = cfg.costs.head_ms
            parts[SpanKind.SAMPLE] = cfg.costs.sample_ms
        out.append({str(k): round(ms * _NS_PER_MS / speed) for k, ms in parts.items()})
    return out


def simulate(cfg: SimConfig) -> Trace:
    """The predicted trace of `cfg`, starting at time 0 on the common clock."""
    plan = make_schedule(cfg.schedule, cfg.stages, cfg.microbatches, cfg.chunks, cfg.steps)
    row = functools.partial(_row, plan.ranks)  # each span's chunk: its stage // ranks
    last = plan.virtual_stages - 1
    durations = _durations_ns(cfg)
    overhead = round(cfg.overhead_ms * _NS_PER_MS)
    act_ns = cfg.comm.transfer_ns(cfg.comm.activation_bytes)
    tok_ns = cfg.comm.transfer_ns(cfg.comm.token_bytes)
    rows: list[tuple[Any, ...]] = []
    done: dict[Action, int] = {}
    arrival: dict[Action, int] = {}  # when an action's output reaches the rank that consumes it
    rank_free = [0] * plan.ranks
    link_free = [0] * plan.ranks
    pos = [0] * plan.ranks
    total = sum(len(a) for a in plan.actions)
    first_token: dict[int, int] = {}
    finish: dict[int, int] = {}
    while len(done) < total:
        progressed = False
        for r in range(plan.ranks):
            while pos[r] < len(plan.actions[r]):
                a = plan.actions[r][pos[r]]
                deps = dependencies(plan, a)
                if any(d not in arrival for d in deps):
                    break
                ready = max((arrival[d] for d in deps), default=0)
                start = max(rank_free[r], ready)
                if deps and ready > rank_free[r]:  # idle in receive; the transfer itself is a `recv` span
                    rows.append(
                        row(r, a, SpanKind.RECV_WAIT, rank_free[r], ready, lane="recv", peer=(r - 1) % plan.ranks)
                    )
                t = start + overhead
                scale = cfg.prefill_factor if a.step == 0 else 1.0
                for kind, dur in durations[a.stage].items():
                    d = round(dur * scale)
                    if d:  # a part that costs nothing leaves no span, as in a run that does not do it
                        rows.append(row(r, a, kind, t, t + d, lane="compute"))
                    t += d
                done[a] = rank_free[r] = t
                nbytes, hop = (cfg.comm.token_bytes, tok_ns) if a.stage == last else (cfg.comm.activation_bytes, act_ns)
                send_start = max(t, link_free[r])
                arrival[a] = link_free[r] = send_start + hop
                peer = (r + 1) % plan.ranks
                rows.append(row(r, a, SpanKind.SEND, send_start, arrival[a], lane="send", nbytes=nbytes, peer=peer))
                if hop:
                    nxt = 0 if a.stage == last else a.stage + 1
                    into = Action(nxt, a.type, a.mb, a.step)
                    rows.append(
                        row(peer, into, SpanKind.RECV, send_start, arrival[a], lane="recv", nbytes=nbytes, peer=r)
                    )
                if a.stage == last:
                    first_token.setdefault(a.mb, arrival[a])
                    finish[a.mb] = arrival[a]
                pos[r] += 1
                progressed = True
        if not progressed:
            raise InvalidConfigError(
                ErrorCode.SCHEDULE_DEADLOCK, f"schedule {plan.name} deadlocks in the simulator (a schedule bug)"
            )
    meta = _meta(cfg, plan.virtual_stages)
    trace = Trace.from_records(rows, meta=meta).sorted()
    trace.requests = requests_frame(
        {
            "id": list(first_token),
            "prompt_len": [0] * len(first_token),
            "output_len": [cfg.steps] * len(first_token),
            "arrival_ns": [0] * len(first_token),
            "first_token_ns": list(first_token.values()),
            "finish_ns": [finish[m] for m in first_token],
        }
    )
    return trace


def _row(
    ranks: int,
    r: int,
    a: Action,
    kind: str,
    start: int,
    end: int,
    *,
    lane: str,
    nbytes: int = 0,
    tokens: int = 0,
    peer: int = -1,
) -> tuple[Any, ...]:
    """One span of action `a` on rank `r` of a pipeline of `ranks` ranks (its chunk: stage // ranks)."""
    phase = str(Phase.PREFILL if a.step == 0 else Phase.DECODE)
    name = f"s{a.stage} {kind} mb{a.mb}"
    chunk = a.stage // ranks
    return (r, a.stage, lane, str(kind), name, a.mb, a.step, chunk, phase, start, end, nbytes, tokens, peer)


def _meta(cfg: SimConfig, virtual: int) -> RunMeta:
    config = dataclasses.asdict(cfg)
    config["costs"]["layer_ms"] = list(cfg.costs.layer_ms)
    return RunMeta(
        source="simulator",
        created_unix_ns=time.time_ns(),
        status="finished",
        world_size=cfg.stages,
        pp_size=cfg.stages,
        schedule=cfg.schedule,
        microbatches=cfg.microbatches,
        chunks=cfg.chunks,
        split=list(cfg.resolved_split),
        split_source="--split" if cfg.split else "vllm-default",
        model={"name": "simulated", "layers": cfg.costs.layers},
        backend="simulated",
        ranks=[RankInfo(rank=r, stage=r, device="simulated") for r in range(cfg.stages)],
        config=config,
    )


def write_run(trace: Trace, run_dir: str | os.PathLike[str]) -> Path:
    """Write `trace` as a run directory (meta.json, one SQLite file per rank, requests.jsonl)."""
    path = create_run(run_dir, trace.meta)
    cols = list(SPAN_COLUMNS)
    for rank in range(trace.meta.world_size):
        part = trace.spans[trace.spans["rank"] == rank]
        writer = RankWriter(path, rank)
        try:
            writer.write(spans=[tuple(_plain(v) for v in row) for row in part[cols].itertuples(index=False)])
        finally:
            writer.close()
    if len(trace.requests):
        with open(path / REQUESTS_FILE, "w") as f:
            for rec in trace.requests.to_dict("records"):
                f.write(json.dumps({k: int(v) for k, v in rec.items()}) + "\n")
    return path


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def summarize(cfg: SimConfig, trace: Trace) -> dict[str, Any]:
    """Headline figures of a simulated trace (keys documented in the README). The window (makespan), busy
    time, bubble ratio and theory are the analyzer's, over the whole run as `ppscope analyze` takes it by
    default: a prediction and its analysis cannot disagree."""
    result = analyze(trace)
    window_ns = result.window.length_ns if result.window is not None else 0
    passes = cfg.microbatches * cfg.steps
    return {
        "schedule": cfg.schedule,
        "pp_size": cfg.stages,
        "microbatches": cfg.microbatches,
        "chunks": cfg.chunks,
        "steps": cfg.steps,
        "split": list(cfg.resolved_split),
        "makespan_ms": window_ns / _NS_PER_MS,
        "passes_per_s": passes / (window_ns / 1e9) if window_ns > 0 else 0.0,
        "busy_ms_per_rank": [s.busy_ns / _NS_PER_MS for s in result.stages],
        "bubble_ratio": result.bubble_ratio,
        "theory_bubble_ratio": result.theory.bubble_ratio,
        "theory_formula": result.theory.formula,
    }
