"""`ppscope rebalance`'s answer as one typed report, built here for the command and the dashboard alike.

A `RebalanceRequest` holds every option that changes the answer; `rebalance_runs` answers it from runs (their
spans, layer spans or profile) or from costs given by hand, `rebalance_model` from the cost model (with no run,
or calibrated on another engine's trace, whose stage times the caller measures: this module reads no file and
knows no trace format). Either gives a `RebalanceReport`: the costs and where they came from, the split
search's answer, the interval on its gain, keep or change; `to_json` is `ppscope rebalance --json`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ppscope.balance.advise.advice import (
    GIVEN_COSTS,
    MODELLED_COSTS,
    SINGLE_TRACE,
    Advice,
    Interval,
    Simulated,
    advise,
    speedup_interval,
    too_short,
)
from ppscope.balance.advise.problem import BalanceProblem, MemoryModel
from ppscope.balance.advise.rebalance import JobKind, Rebalance, rebalance
from ppscope.balance.costs import LayerCosts, StageCosts, parse_ms_list
from ppscope.balance.measured.choose import RunCosts, run_costs
from ppscope.balance.measured.fit import CostFit
from ppscope.balance.measured.insitu import InSituCosts
from ppscope.balance.measured.profile import LayerProfile
from ppscope.balance.measured.timings import RunTimings
from ppscope.balance.measured.training import TRAIN_PASSES, is_training
from ppscope.balance.modelled.gpus import DEFAULT_GPU, GPU, GPUS, gpu_named
from ppscope.balance.modelled.plan import stage_memory_model
from ppscope.balance.modelled.roofline import ModelCosts, Workload, model_costs
from ppscope.balance.modelled.shapes import ModelShape, renamed_note
from ppscope.balance.modelled.tracefit import Calibration, calibrate
from ppscope.balance.split import (
    format_split,
    parse_counts,
    parse_split,
    validate_split,
    vllm_default_split,
)
from ppscope.errors import DoesNotFitError, ErrorCode, InvalidConfigError, UnsupportedInputError
from ppscope.trace.actions import Phase
from ppscope.trace.notices import Notice, NoticeCode
from ppscope.trace.schedules import Engine

__all__ = [
    "GivenCosts",
    "RebalanceReport",
    "RebalanceRequest",
    "TraceStages",
    "job_kind",
    "rebalance_model",
    "rebalance_runs",
]


@dataclass(frozen=True, kw_only=True)
class GivenCosts:
    """Layer costs given by hand, ms per pass: each layer's, or a number of layers of one cost; and the parts
    of the first and last stage, each None when not given."""

    layer_ms: str | None = None
    """Comma-separated ms per layer (`--layer-costs`)."""
    layers: int | None = None
    """With `each_layer_ms`: that many layers of equal cost."""
    each_layer_ms: float | None = None
    embed_ms: float | None = None
    head_ms: float | None = None
    sample_ms: float | None = None

    @property
    def any(self) -> bool:
        """Whether layer costs were given (the parts alone only adjust costs from elsewhere)."""
        return bool(self.layer_ms or self.layers or self.each_layer_ms is not None)

    @property
    def option(self) -> str:
        """The option the layer costs were given with, for messages."""
        return "--layer-costs" if self.layer_ms else "--layers"

    def resolve(self, fitted: LayerCosts | None = None, *, missing: str = "") -> LayerCosts:
        """These costs, on top of `fitted` ones where a part is not given; `missing` says what to give when
        neither gives the layers."""
        if self.layer_ms and (self.layers or self.each_layer_ms is not None):
            raise InvalidConfigError(
                ErrorCode.CONFLICTING_OPTIONS, "give either --layer-costs or --layers with --layer-cost-ms, not both"
            )
        if self.layer_ms:
            layer_ms = tuple(parse_ms_list(self.layer_ms, "--layer-costs"))
        elif self.layers or self.each_layer_ms is not None:
            if not self.layers or self.each_layer_ms is None:
                raise InvalidConfigError(
                    ErrorCode.MISSING_OPTION,
                    "--layers and --layer-cost-ms go together: e.g. --layers 32 --layer-cost-ms 1.5",
                )
            layer_ms = LayerCosts.uniform(self.layers, self.each_layer_ms).layer_ms
        elif fitted is not None:
            layer_ms = fitted.layer_ms
        else:
            raise InvalidConfigError(
                ErrorCode.MISSING_OPTION,
                missing or "give a RUN to fit costs from, or --layer-costs MS,MS,... (one per layer)",
            )
        base = fitted or LayerCosts(layer_ms=layer_ms)
        return LayerCosts(
            layer_ms=layer_ms,
            embed_ms=base.embed_ms if self.embed_ms is None else self.embed_ms,
            head_ms=base.head_ms if self.head_ms is None else self.head_ms,
            sample_ms=base.sample_ms if self.sample_ms is None else self.sample_ms,
        )


@dataclass(frozen=True, kw_only=True)
class RebalanceRequest:
    """Every option of `ppscope rebalance` that changes its answer. Per-stage terms are text as the options
    take them: one value, or one per stage."""

    given: GivenCosts = field(default_factory=GivenCosts)
    stages: int | None = None
    """Pipeline stages; default: the run's."""
    current_split: str | None = None
    """Layer counts per stage now; default: the run's, else vLLM's rule."""
    cost_choice: str = "auto"
    """With runs: `auto`, `insitu`, `profile` or `fit` (`ppscope.balance.measured.choose`)."""
    phase: str | None = None
    """The passes to use: `decode` (default), `prefill` or `all`."""
    mix: bool = False
    """Fit runs of different models, dtypes, devices or schedules together."""
    overhead_ms: str = "0"
    comm_ms: str = "0"
    speeds: str = "1"
    objective: str = "throughput"
    model: ModelShape | None = None
    """The model, for weight and KV sizes, and the cost model's shape; default: the run's."""
    model_name: str = ""
    """What `model` was asked for by (a preset's name, old or new, or a config path): an old name adds a note."""
    gpu_mem_gib: str | None = None
    """GPU memory per stage, GiB, for KV capacity and memory limits."""
    gpu_memory_utilization: float = 0.9
    dtype: str | None = None
    """Weights and KV dtype; default: the run's, else fp16 (bf16 for the cost model)."""
    tp: int = 1
    reserve_gib: float = 1.0
    min_kv_tokens: int = 0
    gpu: str | None = None
    """The GPU the cost model times the model on."""
    batch: int = 16
    """The cost model's pass: sequences per micro-batch."""
    context: int = 2048
    """The cost model's pass: tokens per sequence."""
    peak: bool = False
    """Time the model at the datasheet's peaks instead of the shares kernels were measured to reach."""

    def per_stage(self, text: str, what: str, stages: int) -> list[float]:
        """One value for every stage, or one per stage, from an option's text."""
        values = parse_ms_list(text, what)
        if len(values) not in (1, stages):
            raise InvalidConfigError(
                ErrorCode.COUNT_MISMATCH,
                f"{what} gives {len(values)} values for {stages} stages: give one, or one per stage",
            )
        return values * stages if len(values) == 1 else values

    def stage_costs(self, stages: int) -> StageCosts:
        return StageCosts(
            overhead_ms=self.per_stage(self.overhead_ms, "--overhead-ms", stages),
            comm_ms=self.per_stage(self.comm_ms, "--comm-ms", stages),
            speed=self.per_stage(self.speeds, "--speeds", stages),
        )

    def memory(self, shape: ModelShape | None, stages: int, dtype: str) -> MemoryModel | None:
        """The stages' memory, with --gpu-mem-gib; it needs the model to size weights and KV."""
        if not self.gpu_mem_gib:
            return None
        if shape is None:
            raise InvalidConfigError(
                ErrorCode.MISSING_OPTION, "--gpu-mem-gib needs --model (a preset or config.json) to size weights and KV"
            )
        return self.memory_of(shape, self.per_stage(self.gpu_mem_gib, "--gpu-mem-gib", stages), dtype)

    def memory_of(self, shape: ModelShape, gpu_mem_gib: list[float], dtype: str, min_kv_tokens: int = 0) -> MemoryModel:
        """The stages' memory model for GPUs of `gpu_mem_gib` each, with the request's utilisation, TP, reserve
        and KV tokens every stage must hold (at least `min_kv_tokens`)."""
        return stage_memory_model(
            shape,
            gpu_mem_gib,
            gpu_memory_utilization=self.gpu_memory_utilization,
            dtype=dtype,
            tp=self.tp,
            reserve_gib=self.reserve_gib,
            min_kv_tokens=max(self.min_kv_tokens, min_kv_tokens),
        )


@dataclass(frozen=True, kw_only=True)
class TraceStages:
    """What another engine's trace measured of its stages, for the cost model to be calibrated on: busy time
    per stage over the analysed window, in the analyzer's stage order."""

    stage_ms: tuple[float, ...]
    stage_ranks: tuple[tuple[int, ...], ...]
    window_ms: float
    window_how: str
    """How the window was chosen, in words."""
    job: JobKind = JobKind.UNKNOWN
    """What the traced job is (`job_kind` of its timings)."""


@dataclass(frozen=True, kw_only=True)
class TrainingCosts:
    """A training run's costs: each layer's forward + backward per micro-batch, and where they came from."""

    source: str
    split_source: str | None
    chunks: int

    def to_json(self) -> dict[str, Any]:
        origin = {
            "pipelining": "the recording hook's forward and backward spans",
            "kineto": "the Kineto trace's operators, each counted in the pipelining action it ran in",
        }.get(self.source, "the run's forward and backward compute spans")
        virtual = self.chunks > 1
        assumption = (
            f"the split is per virtual stage ({self.chunks} per rank) and is balanced over them, each virtual stage "
            "as a stage of its own: the schedule is assumed to run at the pace of its slowest virtual stage"
        )
        return {
            "passes": TRAIN_PASSES,
            "from": origin,
            "split_source": self.split_source,
            "chunks": self.chunks,
            "virtual_stages": virtual,
            "assumption": assumption if virtual else None,
        }


@dataclass(frozen=True, kw_only=True)
class ModelSection:
    """What the cost model adds to a report: its costs, the calibration on a trace, assumptions, warnings."""

    costs: ModelCosts
    calibration: Calibration | None
    assumptions: tuple[str, ...]
    warnings: tuple[Notice, ...]


@dataclass(frozen=True, kw_only=True)
class RebalanceReport:
    """The answer of `ppscope rebalance`: one per request, whatever the costs came from."""

    split: Rebalance
    """The split search's answer: the current and the proposed split, and their predicted stage times."""
    decision: Advice
    interval: Interval | None
    costs: LayerCosts
    cost_source: str
    """`given`, `fit`, `insitu`, `profile` (from runs), `model` (no run) or `trace` (calibrated on one)."""
    kv_bytes_per_token: tuple[int, ...] | None
    """KV cache bytes per token of each stage of the proposed split; None without a model."""
    fit: CostFit | None = None
    fit_runs: int = 0
    fit_notes: tuple[Notice, ...] = ()
    insitu: InSituCosts | None = None
    profile: LayerProfile | None = None
    """The per-layer profile the costs come from (source `profile`), else None."""
    phase: str | None = None
    """The passes the costs describe (`decode`, `prefill`, `all`, or a training run's); None when given by hand
    or modelled."""
    measured_stage_ms: tuple[float, ...] | None = None
    """What the last run (or the trace) measured of each stage, next to the model's times for its split."""
    training: TrainingCosts | None = None
    model: ModelSection | None = None
    has_model: bool = False
    """Whether the report knew the model (KV sizes), given or the run's."""
    assumed_pipeline: Notice | None = None
    """What the trace lacked to show a pipeline, when the user said it is one (`--assume-pipeline`)."""
    simulated: Simulated | None = None
    """Both splits replayed on the run's schedule (`ppscope.simulate.advice.with_replay`): the headline."""
    simulated_note: str = ""
    """Why there is no replay, where there is none ("" where none was tried: costs without a run)."""

    @property
    def predicted_speedup(self) -> float:
        """The headline: the schedule replay's speedup where the run could be replayed, else the slowest stage's
        ratio (the closed form, `split.predicted_speedup`, always beside it)."""
        return self.simulated.speedup if self.simulated is not None else self.split.predicted_speedup

    def to_json(self) -> dict[str, Any]:
        """`ppscope rebalance --json` (keys in docs/GLOSSARY.md)."""
        out = self.split.to_dict()
        iv = self.interval
        out |= {
            "predicted_speedup": self.predicted_speedup,
            "simulated": None if self.simulated is None else dataclasses.asdict(self.simulated),
            "simulated_note": self.simulated_note or None,
            "predicted_interval": None if iv is None else [iv.low, iv.high],
            "predicted_interval_how": None if iv is None else f"{iv.level:.0%} interval, {iv.how}",
            "advice": self.decision.word,
            "advice_reason": self.decision.reason,
            "no_interval": None if self.decision.no_interval is None else self.decision.no_interval.to_json(),
            "costs": self.costs.to_json(),
            "kv_bytes_per_token": None if self.kv_bytes_per_token is None else list(self.kv_bytes_per_token),
            "fit": None if self.fit is None else self._fit_json(self.fit),
            "cost_source": self.cost_source,
            "measured_stage_ms": None if self.measured_stage_ms is None else list(self.measured_stage_ms),
            "training": None if self.training is None else self.training.to_json(),
            "assumed_pipeline": None if self.assumed_pipeline is None else self.assumed_pipeline.to_json(),
        }
        if self.model is None:
            out["insitu"] = None if self.insitu is None else _insitu_json(self.insitu)
        else:
            m = self.model
            out |= {
                "model_costs": m.costs.to_dict(),
                "calibration": None if m.calibration is None else m.calibration.to_dict(),
                "assumptions": list(m.assumptions),
                "warnings": [w.to_json() for w in m.warnings],
            }
        return out

    @property
    def mean_layer_ms(self) -> float:
        """The mean over layers of the cost each layer was given: the per-layer average the CLI and the
        dashboard both print."""
        return sum(self.costs.layer_ms) / self.costs.layers

    @property
    def stage_ms_statistic(self) -> str:
        """What the predicted stage times are, statistic included (docs/GLOSSARY.md)."""
        return _STAGE_MS_STATISTIC.get(self.cost_source, "a pass of each stage, from the costs")

    @property
    def measured_ms_statistic(self) -> str:
        """What `measured_stage_ms` is: a run's mean pass, or a trace's busy time over its window."""
        if self.cost_source == "trace":
            return "each stage's busy time over the trace's window, as `ppscope analyze` measures it"
        return "the last run's mean pass of each stage, all its parts"

    def _fit_json(self, fit: CostFit) -> dict[str, Any]:
        return {
            "phase": fit.phase,
            "runs": self.fit_runs,
            "uniform_layer_ms": fit.uniform_layer_ms,
            "r_squared": fit.r_squared,
            "rms_residual_ms": fit.rms_residual_ms,
            "layer_rms_residual_ms": fit.layer_rms_residual_ms,
            "extras_measured": fit.extras_measured,
            "notes": [n.to_json() for n in (*self.fit_notes, *fit.notes)],
        }


_STAGE_MS_STATISTIC = {
    "insitu": "a pass of each stage, from each layer's median over its sampled passes",
    "profile": "a pass of each stage, from the per-layer profile's medians",
    "fit": "a pass of each stage, from costs fitted to each stage's mean pass",
    "given": "a pass of each stage, from the costs given",
    "model": "a pass of each stage, from the cost model",
    "trace": "each stage's busy time over the trace's window, from the calibrated cost model",
}


def _insitu_json(got: InSituCosts) -> dict[str, Any]:
    return {"phase": got.phase, "runs": got.runs, "passes": list(got.passes), "rest_ms": list(got.rest_ms)}


_EVERY_RANK = "rebalancing needs every stage's costs (give the run with every rank's file)"


def _run_stages(stages: int | None, current: list[int]) -> int:
    """The run's stage count, which `--stages`, when given, must equal."""
    if stages is not None and stages != len(current):
        raise InvalidConfigError(
            ErrorCode.COUNT_MISMATCH, f"--stages {stages} differs from the run's {len(current)} stages"
        )
    return len(current)


def rebalance_runs(
    runs: Sequence[RunTimings],
    request: RebalanceRequest,
    *,
    profile: LayerProfile | None = None,
    where: str = "the run",
) -> RebalanceReport:
    """The advice from runs (the last is the current one): costs from their spans, their layer spans or the
    last run's `profile` (`request.cost_choice`), parts given by hand on top; or, with no run, from the costs
    given alone. The interval on the gain comes from the runs' own variability. `where` names the last run in
    errors."""
    runs, training = _with_training_split(list(runs), request)
    given, got, current, stages = request.given.any, None, None, request.stages
    meta = runs[-1].meta if runs else None
    if meta is not None:
        current = list(meta.split) or None
        if given and current is not None:
            _check_given_layers(request.given, current)
        got = _run_costs(runs, request, profile, where)
        if current is not None:
            stages = _run_stages(stages, current)
    fit = got.fit if got is not None else None
    base = got.costs if got is not None and got.source in ("profile", "insitu") else (fit.costs if fit else None)
    costs = request.given.resolve(base)
    if stages is None:
        raise InvalidConfigError(ErrorCode.MISSING_OPTION, "give --stages P with --layer-costs")
    if request.current_split:
        current = parse_split(request.current_split, costs.layers, stages)
    dtype = request.dtype or (str(meta.config.get("dtype") or "") if meta else "") or "fp16"
    shape = request.model or (_run_shape(meta.model) if meta else None)
    _check_model(shape, costs, request.given)
    problem = BalanceProblem(
        costs=costs,
        stages=stages,
        stage_costs=request.stage_costs(stages),
        memory=request.memory(shape, stages, dtype),
        objective=request.objective,
    )
    split = rebalance(problem, current, chunks=training.chunks if training else 1)
    split = dataclasses.replace(split, job=job_kind(runs[-1]) if runs else JobKind.UNKNOWN)
    interval, decision = _decide(runs, problem, split)
    return RebalanceReport(
        split=split,
        decision=decision,
        interval=interval,
        costs=costs,
        cost_source="given" if given else (got.source if got is not None else "fit"),
        kv_bytes_per_token=_kv_bytes(shape, split, dtype),
        fit=fit,
        fit_runs=len(runs),
        fit_notes=got.notes if got is not None else (),
        insitu=got.insitu if got is not None else None,
        profile=got.profile if got is not None else None,
        phase=got.phase if got is not None else None,
        measured_stage_ms=None if fit is None else _last_run_stage_ms(fit, len(runs)),
        training=training,
        has_model=shape is not None,
    )


def _require_every_rank(runs: Sequence[RunTimings]) -> None:
    """A stage without costs has no answer: name the ranks that recorded nothing, not a symptom of it."""
    for timed in runs:
        timed.meta.require_every_rank(timed.ranks, _EVERY_RANK)


def _check_model(shape: ModelShape | None, costs: LayerCosts, given: GivenCosts) -> None:
    """The model whose memory is sized is the one whose layers are costed."""
    if shape is not None and shape.layers != costs.layers:
        raise InvalidConfigError(
            ErrorCode.COUNT_MISMATCH,
            f"--model {shape.name} has {shape.layers} layers but "
            f"{given.option if given.any else 'the costs'} cover {costs.layers}: give one cost per layer of the "
            "model whose split you want",
        )


def _run_costs(
    runs: list[RunTimings], request: RebalanceRequest, profile: LayerProfile | None, where: str
) -> RunCosts | None:
    """The runs' costs; None where they cannot be fitted but the costs were given by hand, which
    need only the run's split."""
    _require_every_rank(runs)  # before the fallback below: given costs do not make up a missing stage
    try:
        return run_costs(runs, profile, choice=request.cost_choice, phase=request.phase, where=where, mix=request.mix)
    except UnsupportedInputError:
        if not request.given.any:
            raise
        return None


def _with_training_split(
    runs: list[RunTimings], request: RebalanceRequest
) -> tuple[list[RunTimings], TrainingCosts | None]:
    """For a training run: what its costs are, and the runs with the last given the split of
    --current-split when it records none (in memory: the files are only read)."""
    if not runs or not is_training(runs[-1]):
        return runs, None
    last = runs[-1]
    meta = last.meta
    if not meta.split and request.current_split:
        split = parse_counts(request.current_split, "4,4")
        validate_split(split, sum(split))
        meta = dataclasses.replace(meta, split=split, split_source="--current-split")
        runs = [*runs[:-1], dataclasses.replace(last, meta=meta)]
    return runs, TrainingCosts(source=meta.source, split_source=meta.split_source or None, chunks=meta.chunks)


def job_kind(run: RunTimings) -> JobKind:
    """What a run's split is for: DeepSpeed's when its reader recognised that engine, training when it runs
    backward passes, serving when it is ppscope's engine or its spans are decode or prefill passes, else
    unknown (an imported trace of bare kernels)."""
    if run.meta.pipeline_engine == Engine.DEEPSPEED:
        return JobKind.DEEPSPEED
    if run.training:
        return JobKind.TRAINING
    if run.meta.source == "ppscope" or run.phases & {Phase.DECODE, Phase.PREFILL}:
        return JobKind.SERVING
    return JobKind.UNKNOWN


def _check_given_layers(given: GivenCosts, split: list[int]) -> None:
    """Costs given by hand describe the run's model: one per layer of its split."""
    layers = given.resolve().layers
    if layers != sum(split):
        raise InvalidConfigError(
            ErrorCode.COUNT_MISMATCH,
            f"{given.option} gives {layers} layer cost(s) but the run has {sum(split)} layers "
            f"(split {','.join(map(str, split))}): give one cost per layer of the run's model",
        )


def _run_shape(run_model: dict[str, Any]) -> ModelShape | None:
    """The model the run recorded, when it recorded its whole shape."""
    fields = {"name", "layers", "hidden", "heads", "kv_heads", "intermediate", "vocab"}
    if fields <= set(run_model):
        return ModelShape(**{k: run_model[k] for k in fields | {"tie_embeddings"} if k in run_model})
    return None


def _last_run_stage_ms(fit: CostFit, runs: int) -> tuple[float, ...]:
    """What the last run's spans show of each stage per pass, all its parts together."""
    last = [o for o in fit.observations if o.run == runs - 1]
    return tuple(o.pass_ms + (o.embed_ms or 0.0) + (o.head_ms or 0.0) + (o.sample_ms or 0.0) for o in last)


def _kv_bytes(shape: ModelShape | None, split: Rebalance, dtype: str) -> tuple[int, ...] | None:
    if shape is None:
        return None
    return tuple(n * shape.kv_bytes_per_token_per_layer(dtype) for n in split.proposed.split)


def _decide(
    runs: Sequence[RunTimings], problem: BalanceProblem, split: Rebalance, no_interval: Notice | None = None
) -> tuple[Interval | None, Advice]:
    """The interval of the predicted speedup from the runs' own variability, and keep or change."""
    cur, new = split.current.split, split.proposed.split
    interval = speedup_interval(runs, problem, cur, new) if runs and cur != new else None
    if problem.objective == "memory":
        return interval, Advice(change=cur != new, reason="objective memory: the split that holds the most KV cache")
    why = no_interval or (GIVEN_COSTS if not runs else too_short(len(runs)))
    return interval, advise(cur, new, split.predicted_speedup, interval, why)


@dataclass(frozen=True, kw_only=True)
class _Modelled:
    """What a cost path hands the rebalancer, and what it tells the reader."""

    costs: LayerCosts
    """Modelled ms per pass, or trace ms (calibrated)."""
    stage_costs: StageCosts
    stages: int
    current: list[int] | None
    """The split to compare with; None: vLLM's rule."""
    calibration: Calibration | None = None
    measured_ms: tuple[float, ...] | None = None
    assumptions: tuple[str, ...] = ()


def rebalance_model(shape: ModelShape, request: RebalanceRequest, trace: TraceStages | None = None) -> RebalanceReport:
    """The advice from the cost model: every part of `shape` timed from the GPU's datasheet, with no run, or
    calibrated on the stage times of another engine's `trace`."""
    if request.phase == "all":
        raise InvalidConfigError(
            ErrorCode.CONFLICTING_OPTIONS, "the cost model times one phase: give --phase decode or --phase prefill"
        )
    if trace is None and not request.gpu:
        raise InvalidConfigError(
            ErrorCode.MISSING_OPTION,
            f"give --gpu NAME to time {shape.name} without a run (known GPUs: {', '.join(GPUS)}), or --layer-costs",
        )
    dtype = request.dtype or shape.dtype
    gpu = gpu_named(request.gpu or DEFAULT_GPU)
    if request.peak or trace is not None:
        gpu = gpu.at_peak()  # a trace's calibration measures what the achieved shares would have guessed
    work = Workload(
        phase=request.phase or Phase.DECODE, batch=request.batch, context=request.context, dtype=dtype, tp=request.tp
    )
    modelled = model_costs(shape, gpu, work)
    got = _from_trace(request, shape, modelled, trace) if trace else _without_run(request, shape, modelled)
    held = request.memory(shape, got.stages, dtype) or _gpu_memory(shape, request, dtype, got.stages)
    problem = BalanceProblem(
        costs=got.costs, stages=got.stages, stage_costs=got.stage_costs, memory=held, objective=request.objective
    )
    try:
        split = rebalance(problem, got.current)
    except DoesNotFitError:
        if request.gpu and not request.gpu_mem_gib:
            raise _does_not_fit(shape, request, problem, dtype) from None
        raise
    split = dataclasses.replace(split, job=JobKind.SERVING if trace is None else trace.job)
    checked = _memory_note(request, held)
    interval, decision = _decide([], problem, split, MODELLED_COSTS if trace is None else SINGLE_TRACE)
    warnings = _model_warnings(request, shape, gpu, list(split.current.split), got.calibration, dtype)
    return RebalanceReport(
        split=split,
        decision=decision,
        interval=interval,
        costs=got.costs,
        cost_source="model" if got.calibration is None else "trace",
        kv_bytes_per_token=_kv_bytes(shape, split, dtype),
        measured_stage_ms=got.measured_ms,
        model=ModelSection(
            costs=modelled,
            calibration=got.calibration,
            assumptions=(*got.assumptions, *_dtype_note(shape, request), checked, *modelled.assumptions()),
            warnings=tuple(warnings),
        ),
        has_model=True,
    )


def _dtype_note(shape: ModelShape, request: RebalanceRequest) -> tuple[str, ...]:
    """Where the dtype comes from, when the user gave none."""
    if request.dtype:
        return ()
    return (f"weights in {shape.dtype}, as {shape.name}'s checkpoint ships them (--dtype for another)",)


def _memory_note(request: RebalanceRequest, memory: MemoryModel | None) -> str:
    """What was checked of memory, as an assumption."""
    if memory is None:
        return "memory was not checked: give --gpu or --gpu-mem-gib to check that each stage holds its weights and KV"
    if request.gpu_mem_gib:
        return "memory: the split search kept every stage within --gpu-mem-gib"
    return (
        f"memory checked: the split search kept each stage's weights and {_tokens_text(request)} of KV cache within "
        f"the {_usable_text(request, memory)}"
    )


def _tokens_text(request: RebalanceRequest) -> str:
    return f"{request.batch * request.context:,} tokens ({request.batch} × {request.context})"


def _usable_text(request: RebalanceRequest, memory: MemoryModel) -> str:
    gpu = gpu_named(request.gpu or DEFAULT_GPU)
    return f"{memory.limit_bytes[0] / 2**30:.1f} GiB usable of a {gpu.name}'s {gpu.memory_gib:.1f} GiB"


def _gpu_memory(shape: ModelShape, request: RebalanceRequest, dtype: str, stages: int) -> MemoryModel | None:
    """Each stage's memory on the GPU given by --gpu (None without one), every stage to hold its weights and the
    KV cache of the request's batch and context."""
    if not request.gpu or stages < 1:  # no stage: BalanceProblem says so
        return None
    return request.memory_of(
        shape, [gpu_named(request.gpu).memory_gib] * stages, dtype, request.batch * request.context
    )


def _does_not_fit(shape: ModelShape, request: RebalanceRequest, problem: BalanceProblem, dtype: str) -> DoesNotFitError:
    """No split of the problem's stages holds the model on the GPU: what it needs, and the fewest stages that
    hold it at this TP, with their split."""
    memory = problem.memory
    assert memory is not None
    stages, gpu = problem.stages, gpu_named(request.gpu or DEFAULT_GPU)
    weights = (memory.embed_bytes + memory.head_bytes + problem.costs.layers * memory.layer_bytes) / 2**30
    fewest = _fewest_stages(shape, request, problem, dtype)
    then = (
        f"the fewest stages that hold it at TP {request.tp} are {fewest[0]}, split {format_split(fewest[1])} "
        f"(ppscope rebalance --model {shape.name} --gpu {gpu.name} --stages {fewest[0]})"
        if fewest is not None
        else f"no number of stages holds it at TP {request.tp}: raise --tp"
    )
    return DoesNotFitError(
        ErrorCode.NO_SPLIT_FITS,
        f"{shape.name} does not fit on {stages} × {gpu.name} at TP {request.tp} in {dtype}: its weights are "
        f"{weights:.1f} GiB per TP rank, and no split over {stages} stages keeps each stage's share and "
        f"{_tokens_text(request)} of KV cache within the {_usable_text(request, memory)}; no split advised. "
        f"{then[0].upper()}{then[1:]}",
    )


def _fewest_stages(
    shape: ModelShape, request: RebalanceRequest, problem: BalanceProblem, dtype: str
) -> tuple[int, tuple[int, ...]] | None:
    """The fewest stages, more than the problem's, with a split that holds every stage's weights and KV cache,
    and the fastest such split; None when no number of stages does."""
    for n in range(problem.stages + 1, problem.costs.layers + 1):
        memory = _gpu_memory(shape, request, dtype, n)
        try:
            return n, rebalance(BalanceProblem(costs=problem.costs, stages=n, memory=memory)).proposed.split
        except DoesNotFitError:
            continue
    return None


def _without_run(request: RebalanceRequest, shape: ModelShape, modelled: ModelCosts) -> _Modelled:
    """The modelled costs as they are, with the request's per-stage terms."""
    if request.stages is None:
        raise InvalidConfigError(
            ErrorCode.MISSING_OPTION, f"give --stages P: how many pipeline stages to split {shape.name}'s layers over"
        )
    stages = request.stages
    return _Modelled(
        costs=modelled.layer_costs(),
        stage_costs=request.stage_costs(stages),
        stages=stages,
        current=parse_split(request.current_split, shape.layers, stages) if request.current_split else None,
    )


def _from_trace(request: RebalanceRequest, shape: ModelShape, modelled: ModelCosts, trace: TraceStages) -> _Modelled:
    """The modelled costs calibrated on the trace's stage busy times, for the split it ran."""
    measured = list(trace.stage_ms)
    stages = len(measured)
    if request.stages is not None and request.stages != stages:
        raise InvalidConfigError(
            ErrorCode.COUNT_MISMATCH, f"--stages {request.stages} differs from the trace's {stages} stages"
        )
    if request.overhead_ms != "0" or request.speeds != "1":
        raise InvalidConfigError(
            ErrorCode.CONFLICTING_OPTIONS,
            "--overhead-ms and --speeds are set by the calibration on the trace: leave them out with a trace",
        )
    if request.current_split:
        ran = parse_split(request.current_split, shape.layers, stages)
    else:
        ran = vllm_default_split(shape.layers, stages)
    calibration = calibrate(modelled.layer_costs(), ran, measured)
    return _Modelled(
        costs=calibration.costs,
        stage_costs=StageCosts(
            overhead_ms=list(calibration.overhead_ms), comm_ms=request.per_stage(request.comm_ms, "--comm-ms", stages)
        ),
        stages=stages,
        current=ran,
        calibration=calibration,
        measured_ms=tuple(measured),
        assumptions=_trace_assumptions(request, trace, ran, modelled.gpu.name),
    )


def _trace_assumptions(request: RebalanceRequest, trace: TraceStages, ran: list[int], gpu: str) -> tuple[str, ...]:
    ranks = "; ".join(f"stage {s}: rank(s) {', '.join(map(str, r))}" for s, r in enumerate(trace.stage_ranks))
    return (
        f"the trace's stages are the pipeline's, in order, as the analyzer numbers them ({ranks})",
        "each stage's time is its busy time (the union of its compute kernels) over the analysed window "
        f"({trace.window_ms:.1f} ms, {trace.window_how.rstrip('.')}): every stage runs the same "
        "passes, so the times compare as per-pass times do",
        f"the trace ran the split {format_split(ran)}"
        + (" (given)" if request.current_split else " (vLLM's default rule; give --current-split if it ran another)"),
        f"its passes are {request.phase or Phase.DECODE} passes, shaped as below; the model's shape is calibrated with "
        "one scale for every part (the smallest measured ÷ modelled ratio over stages) plus a fixed overhead per "
        "stage (the rest of its time), which stays with the stage whatever layers it holds",
        f"the shape is timed on a {gpu} at its datasheet peaks"
        + ("" if request.gpu else " (no --gpu given: after calibration only the shape matters)")
        + ": the calibration on the trace replaces the achieved-efficiency factors of the GPU table, its scale "
        "being what this engine reaches of those peaks",
    )


def _model_warnings(
    request: RebalanceRequest,
    shape: ModelShape,
    gpu: GPU,
    split: list[int],
    calibration: Calibration | None,
    dtype: str,
) -> list[Notice]:
    """Stages whose weights exceed the GPU (with --gpu), and stages the calibrated model explains poorly."""
    out = [n] if (n := renamed_note(request.model_name)) is not None else []
    if calibration is not None:
        out += [
            Notice(
                NoticeCode.POORLY_EXPLAINED,
                f"the model explains stage {s} poorly: {calibration.overhead_ms[s] / calibration.measured_ms[s]:.0%} "
                f"of its measured time is left to its fixed overhead (check --model, --current-split "
                f"{format_split(calibration.split)} and --phase)",
            )
            for s in calibration.poorly_explained()
        ]
    return out
