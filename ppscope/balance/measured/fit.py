"""Layer costs fitted from the spans of real runs: each stage's measured compute per pass, and the per-layer
costs that explain them (exactly where runs with different splits determine them, by least squares otherwise).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ppscope.balance.costs import LayerCosts
from ppscope.balance.measured.timings import RunTimings, as_timings
from ppscope.balance.measured.training import TRAIN_PASSES, training_passes
from ppscope.balance.split import stage_layer_ranges
from ppscope.errors import ErrorCode, InvalidConfigError, UnsupportedInputError
from ppscope.trace.model import Phase, SpanKind, Trace
from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["CostFit", "StageObservation", "fit_layer_costs", "observe_stages", "r_squared_text"]


@dataclass(frozen=True, kw_only=True)
class StageObservation:
    """What one run measured on one (virtual) stage: mean compute per micro-batch pass, in ms."""

    run: int
    """Index of the run among those fitted."""
    stage: int
    first_layer: int
    layers: int
    forward_ms: float
    """Decoder layers of the stage (the `forward` spans; in training, the forward phase's compute) per pass."""
    passes: int
    """(micro-batch, step) passes averaged."""
    embed_ms: float | None = None
    """`embed` spans per pass (first stage), None when the run records none."""
    head_ms: float | None = None
    sample_ms: float | None = None
    backward_ms: float | None = None
    """Training: the backward of the stage's part per pass (B, or I + W); None for inference."""

    @property
    def pass_ms(self) -> float:
        """What moves with the stage's layers: the forward, plus the backward in training."""
        return self.forward_ms + (self.backward_ms or 0.0)


@dataclass(frozen=True, kw_only=True)
class CostFit:
    """Layer costs fitted from stage spans, and how well the model explains them."""

    costs: LayerCosts
    phase: str
    """Which passes were used: `decode`, `prefill` or `all`; `forward+backward` for a training run, whose
    layer costs are then a micro-batch's forward plus backward through each layer."""
    observations: tuple[StageObservation, ...]
    uniform_layer_ms: float
    """The one per-layer cost that best explains every stage (least squares)."""
    r_squared: float | None
    """Share of the variance of stage times the uniform model explains (1.0: all of it); None when every
    stage holds the same layers and extras, so the model can only predict one time for all of them and there
    is nothing for it to explain."""
    rms_residual_ms: float
    """Root-mean-square error of the uniform model per stage."""
    layer_rms_residual_ms: float
    """Root-mean-square error of the per-layer costs (0 when the runs determine them exactly)."""
    extras_measured: bool
    """Embedding and head/sample times came from their own spans (True) or were fitted (False)."""
    notes: tuple[Notice, ...] = ()


def r_squared_text(r_squared: float | None) -> str:
    """R² for people: the figure, or a dash and why there is none."""
    return "R² – (no spread in layers per stage to explain)" if r_squared is None else f"R² {r_squared:.3f}"


_ALL = "all"


def _pick_phase(phases: frozenset[str], phase: str | None) -> str:
    """`phase` when given, else decode when the spans have decode passes, else all."""
    if phase:
        if phase not in (Phase.PREFILL, Phase.DECODE, _ALL):
            raise InvalidConfigError(ErrorCode.UNKNOWN_CHOICE, f"unknown phase {phase!r}; valid: prefill, decode, all")
        return phase
    return Phase.DECODE if Phase.DECODE in phases else _ALL


def _per_pass_ms(spans: pd.DataFrame, kind: str, stage: int) -> tuple[float | None, int]:
    """Mean time of one pass's span of `kind` on `stage`, and the passes. Each span is one pass: a stage
    records one span of each kind per pass, and (micro-batch, step) does not tell passes apart in a serve
    run, whose slots are reused by request after request (docs/ARCHITECTURE.md, "Notes behind design choices")."""
    rows = spans[(spans["kind"] == kind) & (spans["stage"] == stage)]
    if rows.empty:
        return None, 0
    return float(rows["ns"].mean()) / 1e6, len(rows)


def observe_stages(trace: Trace | RunTimings, *, run: int = 0, phase: str | None = None) -> list[StageObservation]:
    """Mean compute per micro-batch pass of each stage of one run (compute spans on lane `compute`)."""
    timings = as_timings(trace)
    meta = timings.meta
    if not meta.split:
        raise UnsupportedInputError(
            ErrorCode.NO_LAYER_SPLIT,
            "the trace records no layer split (meta.split), so stage times cannot be turned into layer costs: "
            "rebalance from --layer-costs instead",
        )
    if timings.training:
        return _observe_training(timings, run, phase)
    spans = timings.spans[timings.spans["compute"]]
    stage_of_rank = {info.rank: info.stage for info in meta.ranks if info.stage >= 0}
    if (spans["stage"] < 0).any():
        spans = spans.copy()
        unknown = spans["stage"] < 0
        spans.loc[unknown, "stage"] = spans.loc[unknown, "rank"].map(stage_of_rank).fillna(-1).astype("int32")
    chosen = _pick_phase(timings.compute_phases, phase)
    if chosen != _ALL:
        spans = spans[spans["phase"] == chosen]
    last = len(meta.split) - 1
    out = []
    for stage, (first, end) in enumerate(stage_layer_ranges(meta.split)):
        forward_ms, passes = _per_pass_ms(spans, SpanKind.FORWARD, stage)
        if forward_ms is None:
            raise UnsupportedInputError(
                ErrorCode.TOO_FEW_SAMPLES,
                f"stage {stage} has no forward spans{'' if chosen == _ALL else f' in phase {chosen}'}: "
                "cannot fit its layer costs (try --phase all, or a longer run)",
            )
        out.append(
            StageObservation(
                run=run,
                stage=stage,
                first_layer=first,
                layers=end - first,
                forward_ms=forward_ms,
                passes=passes,
                embed_ms=_per_pass_ms(spans, SpanKind.EMBED, stage)[0] if stage == 0 else None,
                head_ms=_per_pass_ms(spans, SpanKind.HEAD, stage)[0] if stage == last else None,
                sample_ms=_per_pass_ms(spans, SpanKind.SAMPLE, stage)[0] if stage == last else None,
            )
        )
    return out


def _observe_training(trace: RunTimings, run: int, phase: str | None) -> list[StageObservation]:
    """Mean forward and backward per micro-batch pass of each (virtual) stage of a training run."""
    if phase not in (None, _ALL, TRAIN_PASSES):
        raise InvalidConfigError(
            ErrorCode.CONFLICTING_OPTIONS,
            f"--phase {phase} is for inference runs: a training run's passes are forward + backward (omit --phase)",
        )
    split = trace.meta.split
    passes = training_passes(trace)
    trained = trace.top_stage + 1
    if trained != len(split):
        raise UnsupportedInputError(
            ErrorCode.COUNT_MISMATCH,
            f"the split {','.join(map(str, split))} gives {len(split)} stages but the run trains {trained} "
            "(virtual) stages: give one layer count per (virtual) stage, in stage order",
        )
    last = len(split) - 1
    out = []
    for stage, (first, end) in enumerate(stage_layer_ranges(split)):
        mine = passes[passes["stage"] == stage]
        if mine.empty:
            raise UnsupportedInputError(
                ErrorCode.TOO_FEW_SAMPLES,
                f"stage {stage} has no micro-batch with both a forward and a backward: cannot fit its layer costs "
                "(record at least one whole training step)",
            )

        def ms(column: str, mine: pd.DataFrame = mine) -> float:
            return float(mine[column].mean()) / 1e6

        out.append(
            StageObservation(
                run=run,
                stage=stage,
                first_layer=first,
                layers=end - first,
                forward_ms=ms("forward_ns"),
                passes=len(mine),
                backward_ms=ms("backward_ns"),
                embed_ms=ms("embed_ns") if stage == 0 and (mine["embed_ns"] > 0).any() else None,
                head_ms=ms("head_ns") if stage == last and (mine["head_ns"] > 0).any() else None,
                sample_ms=ms("sample_ns") if stage == last and (mine["sample_ns"] > 0).any() else None,
            )
        )
    return out


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present and len(present) == len(values) else None


def fit_layer_costs(traces: Sequence[Trace | RunTimings], *, phase: str | None = None) -> CostFit:
    """Per-layer, embedding and head costs from the compute spans of runs with known splits.

    Each stage's forward time per pass is the sum of its layers' costs (plus the embedding on the first and
    the head + sampling on the last, unless those have their own spans, which are then used directly).
    A uniform per-layer cost is fitted by least squares over every (run, stage), with its R²; per-layer
    costs then refine it: layers that no split separates share their segment's cost equally, so one run
    gives each stage's time ÷ its layer count, and runs with different splits resolve more.
    """
    if not traces:
        raise InvalidConfigError(ErrorCode.MISSING_OPTION, "give at least one run to fit costs from")
    obs: list[StageObservation] = []
    chosen = ""
    for i, run in enumerate(traces):
        trace = as_timings(run)
        got = observe_stages(trace, run=i, phase=phase)
        if obs and sum(o.layers for o in got) != sum(o.layers for o in obs if o.run == 0):
            raise UnsupportedInputError(
                ErrorCode.MIXED_RUNS, f"run {i} has a different number of layers than run 0: fit one model at once"
            )
        obs += got
        chosen = chosen or (TRAIN_PASSES if got[0].backward_ms is not None else _pick_phase(trace.phases, phase))
    if len({o.backward_ms is None for o in obs}) > 1:
        raise UnsupportedInputError(
            ErrorCode.MIXED_RUNS,
            "some runs train (forward + backward) and some do not: fit training and inference runs separately",
        )
    layers = sum(o.layers for o in obs if o.run == 0)
    last_stage = {o.run: o.stage for o in obs}  # the last observation of a run is its last stage
    is_first = np.array([o.stage == 0 for o in obs], dtype=float)
    is_last = np.array([o.stage == last_stage[o.run] for o in obs], dtype=float)
    embed = _mean([o.embed_ms for o in obs if o.stage == 0])
    head = _mean([o.head_ms for o in obs if o.stage == last_stage[o.run]])
    sample = _mean([o.sample_ms for o in obs if o.stage == last_stage[o.run]])
    fit_embed, fit_head = embed is None, head is None
    notes: list[Notice] = []

    # Uniform model: t = c * layers (+ e on the first stage, + h on the last, when they have no spans).
    t = np.array([o.pass_ms for o in obs])
    cols = [np.array([o.layers for o in obs], dtype=float)]
    a = np.column_stack(cols + ([is_first] if fit_embed else []) + ([is_last] if fit_head else []))
    if np.linalg.matrix_rank(a) < a.shape[1] and chosen == TRAIN_PASSES:
        # a trainer's stage runs its embedding or output layer inside its own forward and backward
        fit_embed = fit_head = False
        a = np.column_stack(cols)
        notes.append(
            Notice(
                NoticeCode.EMBED_IN_STAGES,
                "the embedding and output layer run inside the first and last stages' passes, and these runs "
                "cannot tell them from the layers: they are counted in those stages' layers (a run with another "
                "split, or more stages, separates them)",
            )
        )
    if np.linalg.matrix_rank(a) < a.shape[1]:
        raise UnsupportedInputError(
            ErrorCode.COSTS_NOT_SEPARABLE,
            "the runs cannot separate the embedding/LM-head cost from the layer cost (they record no embed/head "
            "spans and every stage is a first or last one): add a run with another split or with more stages",
        )
    coef, *_ = np.linalg.lstsq(a, t, rcond=None)
    ss_res = float(((t - a @ coef) ** 2).sum())
    ss_tot = float(((t - t.mean()) ** 2).sum())
    predicted = a @ coef
    if np.ptp(predicted) <= 1e-12 * max(1.0, float(np.abs(predicted).max())):
        r2: float | None = None  # one prediction for every stage: R² would only measure the noise
        notes.append(
            Notice(
                NoticeCode.SAME_LAYER_COUNTS,
                "every stage holds the same number of layers, so per-layer costs cannot be told apart from these "
                "runs: each layer costs its stage's time ÷ its layers (R² is not defined; add a run with another "
                "split)",
            )
        )
    else:
        r2 = 1.0 - ss_res / ss_tot if ss_tot > 1e-18 else 1.0
    c = float(coef[0])
    extras = np.zeros(len(obs))
    if fit_embed:
        embed = max(float(coef[1]), 0.0)
        extras += is_first * embed
        notes.append(Notice(NoticeCode.EMBED_FITTED, "embedding cost fitted (the runs record no embed spans)"))
    if fit_head:
        head = max(float(coef[-1]), 0.0)
        extras += is_last * head
        sample = 0.0  # the fitted head cost includes sampling
        notes.append(Notice(NoticeCode.HEAD_FITTED, "LM head + sampling cost fitted (the runs record no head spans)"))

    # Per-layer refinement over the segments no split separates: min-norm deviation from the uniform cost.
    bounds = sorted({0, layers} | {o.first_layer for o in obs} | {o.first_layer + o.layers for o in obs})
    segs = list(itertools.pairwise(bounds))
    b = np.array(
        [[1.0 if o.first_layer <= s0 and e0 <= o.first_layer + o.layers else 0.0 for s0, e0 in segs] for o in obs]
    )
    seg_len = np.array([e0 - s0 for s0, e0 in segs], dtype=float)
    delta, *_ = np.linalg.lstsq(b, t - extras - b @ (c * seg_len), rcond=None)
    seg_cost = c * seg_len + delta
    layer_rms = float(np.sqrt(np.mean((b @ seg_cost + extras - t) ** 2)))
    per_layer: list[float] = []
    for (s0, e0), cost in zip(segs, seg_cost, strict=True):
        per_layer += [float(cost) / (e0 - s0)] * (e0 - s0)
    if min(per_layer) < 0:
        text = "some fitted layer costs were negative and are set to 0: the stage times are noisy"
        notes.append(Notice(NoticeCode.NEGATIVE_COSTS, text))
        per_layer = [max(v, 0.0) for v in per_layer]
    return CostFit(
        costs=LayerCosts(
            layer_ms=tuple(per_layer), embed_ms=embed or 0.0, head_ms=head or 0.0, sample_ms=sample or 0.0
        ),
        phase=chosen,
        observations=tuple(obs),
        uniform_layer_ms=c,
        r_squared=r2,
        rms_residual_ms=float(np.sqrt(ss_res / len(t))),
        layer_rms_residual_ms=layer_rms,
        extras_measured=not (fit_embed or fit_head),
        notes=tuple(notes),
    )
