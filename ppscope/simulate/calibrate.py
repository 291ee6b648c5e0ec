"""Calibrating the simulator on a measured run: the same pipeline with costs and comm taken from its spans.

`replay_config` reads a run's schedule, sizes and split from its metadata, fits layer costs from its compute
spans (`ppscope.balance.measured.fit`), takes the hop latency from its `recv` (transfer) spans (plus, in a run of
ppscope's engine, where those time only a payload sent after its header, the messages' post-to-wake latency) and the
per-action host overhead from the gaps no span covers; `compare` sets a simulated trace against the measured
one. `Replay` asks "what would this run have done with another split": the replayed config under any split,
each prediction timed against the run as `compare` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ppscope.analysis.pipeline import message_latencies
from ppscope.balance.costs import LayerCosts
from ppscope.balance.measured.fit import fit_layer_costs
from ppscope.errors import ErrorCode, UnsupportedInputError
from ppscope.simulate.simulator import CommModel, SimConfig, simulate
from ppscope.trace.model import SpanKind, Trace
from ppscope.trace.schedules import Schedule

__all__ = ["MAX_REPLAY_STEPS", "Prediction", "Replay", "compare", "hop_latency_us", "makespan_ns", "replay_config"]

MAX_REPLAY_STEPS = 256
"""A replay simulates at most this many passes per micro-batch: a serve run of 100k requests has ~10^5 of them
per slot, minutes of simulation for a steady state that 256 already show."""


def replay_config(trace: Trace, *, phase: str = "all", costs: LayerCosts | None = None) -> SimConfig:
    """A SimConfig that reproduces `trace`: same schedule, sizes and split, fitted costs (or `costs`, when the
    caller has better ones, e.g. a profile), measured hops."""
    meta = trace.meta
    if meta.schedule not in Schedule.of_inference():
        raise UnsupportedInputError(
            ErrorCode.UNSUPPORTED_SCHEDULE,
            f"the run's schedule is {meta.schedule or 'unknown'!r}: only gpipe, interleaved and serve runs replay",
        )
    spans = trace.spans
    meta.require_every_rank(spans["rank"].unique(), "a replay needs every stage's costs")
    if costs is None:
        costs = fit_layer_costs([trace], phase=phase).costs
    recv = spans[spans["kind"] == SpanKind.RECV]
    latency_us = float((recv["end_ns"] - recv["start_ns"]).mean()) / 1e3 if len(recv) else 0.0
    if meta.source == "ppscope":  # the engine's `recv` spans time only a payload sent after its header, and
        # its waits cover both: their post-to-wake latency is the whole hop, when a receiver was waiting
        latency_us = hop_latency_us(spans) or latency_us
    overhead_ms = _host_gap_ms(spans)
    steps = min(_steps(trace), MAX_REPLAY_STEPS)
    return SimConfig(
        schedule=meta.schedule,
        stages=meta.pp_size,
        microbatches=max(meta.microbatches, 1),
        chunks=meta.chunks,
        steps=steps,
        costs=costs,
        split=tuple(meta.split),
        overhead_ms=overhead_ms,
        comm=CommModel(latency_us=latency_us),
    )


def hop_latency_us(spans: pd.DataFrame) -> float | None:
    """Median time from a rank posting a message to the successor, already waiting for it, waking up with it
    (`analysis.pipeline.message_latencies`), over all hops. In an engine run that is the whole hop of a message
    whose payload rides in its header, the hop that `recv` spans miss (they time only a payload sent apart,
    after its header). None when no message pairs up that way."""
    latency = message_latencies(spans)
    return float(latency["latency_ns"].median()) / 1e3 if len(latency) else None


def _host_gap_ms(spans: pd.DataFrame) -> float:
    """Mean time a rank spends between being able to start an action and starting it (no span covers it)."""
    comp = spans[spans["lane"] == "compute"]
    keys = ["rank", "stage", "mb", "step"]
    acts = comp.groupby(keys, sort=False).agg(start=("start_ns", "min"), end=("end_ns", "max")).reset_index()
    waits = spans[spans["kind"] == SpanKind.RECV_WAIT].groupby(keys)["end_ns"].max().rename("arrived")
    acts = acts.join(waits, on=keys).sort_values(["rank", "start"])
    prev_end = acts.groupby("rank")["end"].shift(1)
    ready = pd.concat([prev_end, acts["arrived"]], axis=1).max(axis=1)
    gaps = (acts["start"] - ready).dropna()
    gaps = gaps[gaps >= 0]
    return float(gaps.mean()) / 1e6 if len(gaps) else 0.0


def makespan_ns(trace: Trace) -> int:
    """From the first arrival to the last finish (requests), else from the first to the last compute span."""
    req = trace.requests
    if len(req) and (req["finish_ns"] >= 0).all():
        start = req["arrival_ns"][req["arrival_ns"] >= 0]
        first = int(start.min()) if len(start) else int(trace.spans["start_ns"].min())
        return int(req["finish_ns"].max()) - first
    comp = trace.spans[trace.spans["lane"] == "compute"]
    if comp.empty:
        raise UnsupportedInputError(
            ErrorCode.NO_SPANS, "the trace has no compute spans and no finished requests: nothing to time"
        )
    return int(comp["end_ns"].max() - comp["start_ns"].min())


def _steps(trace: Trace) -> int:
    """Passes per micro-batch: the highest step + 1 (in a serve run a slot's steps run on through every request
    it takes)."""
    top = trace.spans["step"].max() if len(trace.spans) else -1
    return int(top) + 1 if top >= 0 else 1


def compare(measured: Trace, predicted: Trace) -> dict[str, Any]:
    """Predicted vs measured time for the same work. `throughput_error` = predicted throughput ÷ measured − 1
    (= measured time ÷ predicted time − 1): +0.05 means the simulator is 5% optimistic. A replay of a long run
    simulates its first `MAX_REPLAY_STEPS` steps: its time is scaled to the run's steps (once filled, a
    pipeline's time grows in proportion)."""
    m = makespan_ns(measured)
    p = makespan_ns(predicted) * _steps(measured) / _steps(predicted)
    return {
        "measured_ms": m / 1e6,
        "predicted_ms": p / 1e6,
        "throughput_error": m / p - 1.0 if p else float("inf"),
    }


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """The simulator's replay of a run under one split, timed against the run (`compare`)."""

    config: SimConfig
    """The simulated config: the replayed one with the split asked for."""
    trace: Trace
    """The predicted trace."""
    measured_ms: float
    predicted_ms: float
    """Simulated time, scaled to the run's steps when the replay simulates fewer."""
    throughput_error: float
    """Measured time ÷ predicted time − 1: the simulator's error under the run's own split, the predicted
    speedup − 1 of another split."""

    @property
    def split(self) -> tuple[int, ...]:
        """The layer counts per virtual stage that were simulated."""
        return self.config.resolved_split


@dataclass(frozen=True, kw_only=True)
class Replay:
    """A measured run set up for the simulator (`replay_config`), to predict it under its split or others."""

    measured: Trace
    config: SimConfig
    """The replayed config, with the run's own split."""

    @classmethod
    def of(cls, measured: Trace, *, costs: LayerCosts | None = None) -> Replay:
        """Replay `measured` with costs fitted from its spans, or `costs` when the caller has better ones."""
        return cls(measured=measured, config=replay_config(measured, costs=costs))

    def predict(self, split: Sequence[int] | None = None) -> Prediction:
        """The run simulated with `split` (None: its own), and its time against the run's."""
        cfg = self.config if split is None else dataclasses.replace(self.config, split=tuple(split))
        trace = simulate(cfg)
        return Prediction(config=cfg, trace=trace, **compare(self.measured, trace))
