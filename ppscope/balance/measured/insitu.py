"""Layer costs measured inside the run: the `layer` spans the engine times in every k-th pass of each stage.

The engine (`ppscope.engine.schedules`, `--layer-spans K`) times each decoder layer of a sampled pass as a span
of its own, named `layer N`; the embedding, LM head and sampling have their own spans in every pass. Costs
taken here come from the same processes, batch shapes, caches and contention as the run they advise on, unlike
an isolated profile (`ppscope.balance.measured.profile`) or a fit of whole stages (`ppscope.balance.measured.fit`). Each
layer's cost is the median of its spans over the sampled passes; the embedding's, head's and sampling's the
median of theirs. This module knows nothing about how the costs are used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ppscope.balance.costs import LayerCosts
from ppscope.balance.measured.timings import RunTimings, as_timings
from ppscope.balance.measured.training import BACKWARD_PHASES, TRAIN_PASSES
from ppscope.balance.split import stage_layer_ranges
from ppscope.errors import ErrorCode, InvalidConfigError, UnsupportedInputError
from ppscope.trace.model import Phase, SpanKind, Trace

__all__ = ["InSituCosts", "has_layer_spans", "insitu_costs"]

_PHASES = (Phase.PREFILL, Phase.DECODE, "all")
MIN_TRAINING_PASSES = 5
"""Sampled micro-batches per layer below which a training run's layer spans are not trusted: one descheduled
layer among two samples is half the median."""


@dataclass(frozen=True, kw_only=True)
class InSituCosts:
    """Layer costs from a run's `layer` spans, and what they rest on."""

    costs: LayerCosts
    phase: str
    """The passes the medians are over: `decode`, `prefill` or `all`."""
    passes: tuple[int, ...]
    """Sampled passes behind each layer's median (its `layer` spans), in model order."""
    rest_ms: tuple[float, ...]
    """Per stage of the last run: its `forward` median minus the sum of its layers' medians (≥ 0): what a
    stage's pass spends outside its layers (the positions and masks of the pass, Python), whatever it holds."""
    runs: int
    """Runs whose spans were taken."""


def has_layer_spans(trace: Trace | RunTimings) -> bool:
    """Whether the run recorded any `layer` span."""
    if isinstance(trace, RunTimings):
        return trace.has_layers
    return bool((trace.spans["kind"] == SpanKind.LAYER).any())


def _phase_rows(spans: pd.DataFrame, phase: str) -> pd.DataFrame:
    return spans if phase == "all" else spans[spans["phase"] == phase]


def _median_ms(spans: pd.DataFrame, kind: str, stage: int) -> float | None:
    rows = spans[(spans["kind"] == kind) & (spans["stage"] == stage)]
    if rows.empty:
        return None
    return float(np.median(rows["ns"].to_numpy())) / 1e6


def _together(runs: Sequence[RunTimings]) -> pd.DataFrame:
    """The timed spans of several runs in one table (phases as text: each run has its own categories)."""
    return pd.concat([r.spans.astype({"phase": str}) for r in runs], ignore_index=True)


def insitu_costs(runs: Sequence[Trace | RunTimings], *, phase: str | None = None) -> InSituCosts:
    """Costs from the `layer` spans of `traces` (runs of one model): each layer's median over every run's
    sampled passes of `phase` (default `decode` when the runs have decode passes, else `all`), and the
    embedding's, head's and sampling's medians over their spans in the same passes."""
    if not runs:
        raise InvalidConfigError(ErrorCode.MISSING_OPTION, "give at least one run to take in-situ layer costs from")
    traces = [as_timings(r) for r in runs]
    if phase is not None and phase not in _PHASES:
        raise InvalidConfigError(ErrorCode.UNKNOWN_CHOICE, f"unknown phase {phase!r}; valid: {', '.join(_PHASES)}")
    layers = sum(traces[-1].meta.split)
    if not layers:
        raise UnsupportedInputError(
            ErrorCode.NO_LAYER_SPLIT, "the run records no layer split (meta.split): in-situ layer costs need one"
        )
    spans = _together(traces)
    laid = spans[spans["kind"] == SpanKind.LAYER]
    if laid.empty:
        raise UnsupportedInputError(
            ErrorCode.NO_LAYER_SPANS,
            "the run has no `layer` spans (recorded with --layer-spans 0, by an older ppscope, or not by the "
            "engine): use --costs fit (its stage spans) or --costs profile",
        )
    if laid["phase"].isin(BACKWARD_PHASES).any():
        return _training(traces, spans, laid, layers)
    if traces[-1].meta.chunks > 1:
        raise UnsupportedInputError(
            ErrorCode.UNSUPPORTED_SCHEDULE, "in-situ costs of interleaved runs (chunks > 1) are not supported"
        )
    chosen = phase or (Phase.DECODE if (laid["phase"] == Phase.DECODE).any() else "all")
    medians, passes = _layer_medians(_phase_rows(laid, chosen), layers, chosen)
    last = _phase_rows(_together(traces[-1:]), chosen)
    split = traces[-1].meta.split
    ends = _phase_rows(spans, chosen)
    extras = {
        "embed_ms": _median_ms(ends, SpanKind.EMBED, 0),
        "head_ms": _median_ms(ends, SpanKind.HEAD, len(split) - 1),
        "sample_ms": _median_ms(ends, SpanKind.SAMPLE, len(split) - 1),
    }
    rest = []
    for stage, (first, end) in enumerate(stage_layer_ranges(split)):
        forward = _median_ms(last, SpanKind.FORWARD, stage)
        rest.append(max((forward or 0.0) - sum(medians[first:end]), 0.0) if forward is not None else 0.0)
    return InSituCosts(
        costs=LayerCosts(layer_ms=tuple(medians), **{k: v or 0.0 for k, v in extras.items()}),
        phase=chosen,
        passes=tuple(passes),
        rest_ms=tuple(rest),
        runs=len(traces),
    )


def _layer_medians(laid: pd.DataFrame, layers: int, chosen: str) -> tuple[list[float], list[int]]:
    """Each layer's median in ms over its `layer` spans of phase `chosen`, and how many there were; every layer
    needs one."""
    index = laid["layer"].to_numpy()
    ms = laid["ns"].to_numpy() / 1e6
    medians, passes = [], []
    for i in range(layers):
        mine = ms[index == i]
        passes.append(int(mine.size))
        medians.append(float(np.median(mine)) if mine.size else float("nan"))
    missing = [i for i, n in enumerate(passes) if n == 0]
    if missing:
        raise UnsupportedInputError(
            ErrorCode.TOO_FEW_SAMPLES,
            f"no {'' if chosen == 'all' else chosen + ' '}`layer` span of layer(s) {_first(missing)} in the run: it "
            "sampled too few passes; run longer or with a smaller --layer-spans K (or give --phase all)",
        )
    return medians, passes


def _training(traces: Sequence[RunTimings], spans: pd.DataFrame, laid: pd.DataFrame, layers: int) -> InSituCosts:
    """A training run's layer spans (the pipelining hook's): each layer's forward median plus its backward
    median (B, or I where the backward is split); the first stage's pass outside its layers as the embedding,
    the last stage's, with its loss (`head` spans), as the head. Weight gradients computed
    on their own (W) fall in no layer's span, so a run with W actions is left to the fit of whole passes."""
    if any(t.weight_grads for t in traces):
        raise UnsupportedInputError(
            ErrorCode.UNSUPPORTED_SCHEDULE,
            "the run computes weight gradients apart (W actions), which no layer span holds: its costs come "
            "from whole passes (--costs fit)",
        )
    index = laid["layer"].to_numpy()
    ms = laid["ns"].to_numpy() / 1e6
    backward = laid["phase"].isin(BACKWARD_PHASES).to_numpy()
    medians, passes, missing = [], [], []
    for i in range(layers):
        fwd, bwd = ms[(index == i) & ~backward], ms[(index == i) & backward]
        passes.append(int(min(fwd.size, bwd.size)))
        if not (fwd.size and bwd.size):
            missing.append(i)
            medians.append(float("nan"))
        else:
            medians.append(float(np.median(fwd)) + float(np.median(bwd)))
    if missing:
        raise UnsupportedInputError(
            ErrorCode.TOO_FEW_SAMPLES,
            f"no forward and backward `layer` spans of layer(s) {_first(missing)}: too few sampled micro-batches; "
            "train longer or record with a smaller layer_spans",
        )
    if min(passes) < MIN_TRAINING_PASSES:
        raise UnsupportedInputError(
            ErrorCode.TOO_FEW_SAMPLES,
            f"only {min(passes)} sampled micro-batch(es) per layer, too few for a median a stall cannot move (at "
            f"least {MIN_TRAINING_PASSES}); train longer or record with a smaller layer_spans",
        )
    split = traces[-1].meta.split
    last = _together(traces[-1:])
    rest = []
    for stage, (first, end) in enumerate(stage_layer_ranges(split)):
        forward = _median_ms(last, SpanKind.FORWARD, stage)
        back = _median_ms(last, SpanKind.BACKWARD, stage)
        whole = (forward or 0.0) + (back or 0.0)
        rest.append(max(whole - sum(medians[first:end]), 0.0) if forward is not None else 0.0)
    # a trainer's stage runs its embedding (first) and norm and output (last) inside its own forward and
    # backward, with no spans of their own: the first and last stages' time outside their layers is theirs
    head = (_median_ms(spans, SpanKind.HEAD, len(split) - 1) or 0.0) + (rest[-1] if len(rest) > 1 else 0.0)
    return InSituCosts(
        costs=LayerCosts(layer_ms=tuple(medians), embed_ms=rest[0] if len(rest) > 1 else 0.0, head_ms=head),
        phase=TRAIN_PASSES,
        passes=tuple(passes),
        rest_ms=tuple(rest),
        runs=len(traces),
    )


def _first(layers: list[int]) -> str:
    """The first 8 of `layers` for a message, then `...`."""
    return ", ".join(map(str, layers[:8])) + (", ..." if len(layers) > 8 else "")
