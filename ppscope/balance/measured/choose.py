"""The costs to balance a run on: its in-situ layer spans when it has them, else its per-layer profile when it
has one, else a fit of its stage spans.

`ppscope rebalance RUN` and the dashboard's Rebalance page both ask this question; `run_costs` is the one
answer, with the one set of errors. The caller reads the profile (`ppscope.balance.measured.profile.read_profile`),
since what to do with a damaged one is its own business. This module knows nothing about how the costs are
balanced or shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppscope.balance.costs import LayerCosts
from ppscope.balance.measured.fit import CostFit, fit_layer_costs
from ppscope.balance.measured.insitu import InSituCosts, has_layer_spans, insitu_costs
from ppscope.balance.measured.profile import PROFILE_FILE, LayerProfile
from ppscope.balance.measured.timings import RunTimings, as_timings
from ppscope.balance.measured.training import TRAIN_PASSES, is_training
from ppscope.errors import ErrorCode, InvalidConfigError, UnsupportedInputError
from ppscope.trace.model import Phase, Trace
from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["COST_CHOICES", "RunCosts", "mixed_runs", "run_costs"]

COST_CHOICES = ("auto", "insitu", "profile", "fit")
"""`auto`: the last run's `layer` spans when it has them, else its profile when it has one that covers its layers,
else the fit; `insitu`, `profile` or `fit`: that one."""


@dataclass(frozen=True, kw_only=True)
class RunCosts:
    """The layer costs of a run and where they came from."""

    costs: LayerCosts
    source: str
    """`insitu` (the runs' `layer` spans), `profile` (the run's profile.json) or `fit` (least squares over the
    runs' stage spans)."""
    fit: CostFit | None
    """The fit of the stage spans: the costs themselves for `fit`, a comparison next to a profile; None when
    the spans cannot be fitted and the profile does without them."""
    profile: LayerProfile | None
    """The profile the costs come from (source `profile`), else None."""
    phase: str
    """The pass the costs describe: the profile's `decode`/`prefill`, or the fit's (`all` too)."""
    notes: tuple[Notice, ...] = ()
    """Why a profile the run has was left aside."""
    insitu: InSituCosts | None = None
    """The in-situ costs, with the passes behind them (source `insitu`), else None."""


def run_costs(
    runs: Sequence[Trace | RunTimings],
    profile: LayerProfile | None,
    *,
    choice: str = "auto",
    phase: str | None = None,
    where: str = "the run",
    mix: bool = False,
) -> RunCosts:
    """Costs to rebalance the last of `traces` on: the runs' `layer` spans when `choice` is `insitu`, or `auto`
    and the last run has them; else `profile` (the last run's) when `choice` allows and it
    covers the run's layers, else a fit of every run's stage spans (fitted beside a profile too, for
    comparison, when the spans allow). `phase`: which passes (default decode); `where` names the run in errors.
    Runs of different models, dtypes, devices or schedules are refused unless `mix` (then a note says so).
    A run in memory is reduced to its timings once (`ppscope.balance.measured.timings`); a run directory read rank by
    rank comes as timings already."""
    notes: tuple[Notice, ...] = ()
    traces = [as_timings(r) for r in runs]
    if choice not in COST_CHOICES:
        raise InvalidConfigError(
            ErrorCode.UNKNOWN_CHOICE, f"unknown cost source {choice!r}; valid: {', '.join(COST_CHOICES)}"
        )
    if not traces:
        raise InvalidConfigError(ErrorCode.MISSING_OPTION, "give at least one run to take costs from")
    _check_rebalanceable(traces[-1])
    mixed = mixed_runs(traces)
    if mixed and not mix:
        raise InvalidConfigError(
            ErrorCode.MIXED_RUNS,
            f"the runs differ in {mixed}: one cost model cannot describe them. Fit one kind of run at a time, or "
            "give --mix to fit them together anyway",
        )
    if mixed:
        notes += (Notice(NoticeCode.MIXED_FIT, f"fitted across runs that differ in {mixed} (--mix)"),)
    if choice == "insitu" or (choice == "auto" and has_layer_spans(traces[-1])):
        try:
            got = insitu_costs([t for t in traces if has_layer_spans(t)] or traces, phase=phase)
        except UnsupportedInputError as exc:
            if choice == "insitu":
                raise
            got = None  # auto: layer spans that do not cover every layer leave the choice to the others
            notes += (Notice(NoticeCode.INSITU_SET_ASIDE, f"in-situ costs left aside: {exc}"),)
        if got is not None:
            try:  # a training run's passes are forward + backward whatever the phase asked
                beside: CostFit | None = fit_layer_costs(traces, phase=None if got.phase == TRAIN_PASSES else got.phase)
            except UnsupportedInputError:
                beside = None
            return RunCosts(
                costs=got.costs, source="insitu", fit=beside, profile=None, phase=got.phase, notes=notes, insitu=got
            )
    profiled, profile_notes = _profile_costs(profile, sum(traces[-1].meta.split), choice, phase, where)
    notes += profile_notes
    if profiled is None:
        fit = fit_layer_costs(traces, phase=phase)
        return RunCosts(costs=fit.costs, source="fit", fit=fit, profile=None, phase=fit.phase, notes=notes)
    try:
        beside = fit_layer_costs(traces, phase=phase)
    except UnsupportedInputError:
        beside = None  # the profile is enough; the spans just cannot be fitted
    return RunCosts(costs=profiled, source="profile", fit=beside, profile=profile, phase=phase or Phase.DECODE)


def mixed_runs(traces: Sequence[Trace | RunTimings]) -> str:
    """What the runs differ in, among model, dtype, device and schedule, in words ('' when alike)."""
    kinds = {
        "model": lambda m: str(m.model.get("name") or ""),
        "dtype": lambda m: str(m.config.get("dtype") or ""),
        "device": lambda m: ",".join(sorted({r.device.split(":")[0] for r in m.ranks if r.device})),
        "schedule": lambda m: m.schedule,
    }
    differ = []
    for name, of in kinds.items():
        values = [of(t.meta) for t in traces]
        if len(set(values)) > 1:
            differ.append(f"{name} ({' vs '.join(dict.fromkeys(v or '?' for v in values))})")
    return ", ".join(differ)


def _check_rebalanceable(trace: RunTimings) -> None:
    """Raise unless the run's layers can be rebalanced: a known split; one chunk per rank, unless it trains
    (then the split is per virtual stage, and so is the balance)."""
    training = is_training(trace)
    if not trace.meta.split and training:
        raise UnsupportedInputError(
            ErrorCode.NO_LAYER_SPLIT,
            "the training run does not say how its layers are split across its (virtual) stages: give "
            "--current-split N,N,... (layer counts per stage, in stage order), or record the run with "
            "record_pipeline(schedule, run_dir, split=[...]) or with stage modules whose `layers` it can count",
        )
    if not trace.meta.split:
        raise UnsupportedInputError(
            ErrorCode.NO_LAYER_SPLIT,
            "the trace does not say how its layers are split across stages (ppscope runs record it; nsys and "
            "Kineto imports cannot), so layer costs cannot be fitted from it. Give the model to calibrate on it: "
            "`ppscope rebalance TRACE --model PRESET|config.json [--current-split N,N,..]`, or the costs yourself: "
            "`ppscope rebalance --layer-costs MS,MS,... --stages P`",
        )
    if trace.meta.chunks > 1 and not training:
        raise InvalidConfigError(
            ErrorCode.UNSUPPORTED_SCHEDULE,
            "rebalancing interleaved runs (chunks > 1) is not supported: rebalance a gpipe or serve run",
        )


def _profile_costs(
    profile: LayerProfile | None, layers: int, choice: str, phase: str | None, where: str
) -> tuple[LayerCosts | None, tuple[Notice, ...]]:
    """The profile's costs for `phase` when `choice` takes them (None: fit instead), and why not when the
    run has a profile that is left aside."""
    if choice == "fit":
        return None, ()
    if profile is None:
        if choice == "profile":
            raise UnsupportedInputError(
                ErrorCode.NO_PROFILE,
                f"{where} has no {PROFILE_FILE}: profile the model with `ppscope tune`, or use --costs fit",
            )
        return None, ()
    if phase == "all":
        raise UnsupportedInputError(
            ErrorCode.PHASE_NOT_AVAILABLE, "a profile has a prefill and a decode phase, not `all`: give --phase decode"
        )
    costs = profile.phase(phase or Phase.DECODE).costs()
    if costs.layers == layers:
        return costs, ()
    mismatch = f"{where}'s {PROFILE_FILE} times {costs.layers} layers, the run has {layers}"
    if choice == "profile":
        raise UnsupportedInputError(
            ErrorCode.PROFILE_MISMATCH, f"{mismatch}: it profiles another model; use --costs fit"
        )
    return None, (Notice(NoticeCode.PROFILE_SET_ASIDE, f"{mismatch}: costs fitted from its spans instead"),)
