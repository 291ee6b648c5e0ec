"""Warnings as data: a `Notice` is what ppscope tells the user about a trace, an analysis or advice, with a
`NoticeCode` that says which case it is and the sentence that says it.

Code decides by the code, never by the sentence: the wording can change without changing what any program
does, and `--json` carries both (`{"code": ..., "text": ...}`). `str(notice)` is the sentence, so a report
prints it as before. Every code is declared below, once, with what it means.

(Named `Notice`, not `Warning`: `Warning` is Python's own exception class, and a module `warnings` would read
as the standard library's.)
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Iterable
from dataclasses import dataclass

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        def __str__(self) -> str:
            return str(self.value)


__all__ = ["Notice", "NoticeCode", "missing_ranks", "rank_list"]


class NoticeCode(StrEnum):
    """Which case a notice is. The values are stable: programs reading `--json` may test them."""

    # ---- reading a run directory (ppscope.trace)
    NOT_RECORDED = "not_recorded"
    """The run was recorded with `--no-record`: no spans, only the requests' latency."""
    MISSING_FILES = "missing_files"
    """No longer said: a run's ranks without a file are `missing_ranks`, as every command names them. Kept so
    that programs testing for it still load."""
    DAMAGED_FILE = "damaged_file"
    """A damaged file (a rank file, one of a job's Kineto files) was left out; the others were read."""
    RANK_FAILED = "rank_failed"
    """A rank recorded its own failure (or the count of further failures, or of ranks that lost their link)."""
    SPANS_REVERSED = "spans_reversed"
    """Spans or rows that end before they start (a damaged file) were left out."""
    SPANS_OUT_OF_RANGE = "spans_out_of_range"
    """Spans too near the int64 limits to move onto the common clock (a damaged file) were left out."""
    COUNTERS_OUT_OF_RANGE = "counters_out_of_range"
    """Counter samples too near the int64 limits to move onto the common clock were left out."""

    # ---- importing other formats (ppscope.formats)
    SKIPPED_FILES = "skipped_files"
    """JSON files without `traceEvents` (a config, a summary) next to the traces were skipped."""
    OTHER_JOB = "other_job"
    """Files from another job (another world size, or no overlap in time with the rest) were left out."""
    RANK_GUESSED = "rank_guessed"
    """A Kineto file says no rank, in its content or its name: its place in the file list was taken."""
    IMPORT_CLOCKS = "import_clocks"
    """Each imported file keeps its own base time: ranks on different hosts line up as well as the hosts'
    clocks agree."""
    GROUPS_CONFLICT = "groups_conflict"
    """A rank sits at two places of the pipeline process groups: stages were taken from the traffic."""
    GROUPS_INCOMPLETE = "groups_incomplete"
    """Some ranks are in no pipeline process group: stages were taken from the traffic."""
    ONE_RANK = "one_rank"
    """The import has one rank: it is stage 0."""
    STAGES_BY_TRAFFIC = "stages_by_traffic"
    """Stages were ordered by the direction of point-to-point traffic."""
    STAGES_BY_FALLBACK = "stages_by_fallback"
    """The direction of traffic could not be inferred: stages were ordered by rank or device id."""
    STAGES_FROM_NVTX = "stages_from_nvtx"
    """Stages were taken from ppscope's NVTX ranges in an nsys capture."""
    NVTX_DROPPED = "nvtx_dropped"
    """NVTX rows of processes without GPU work were left out."""
    RANGES_ON_GPU_TIME = "ranges_on_gpu_time"
    """ppscope ranges in an nsys capture were moved from CPU time to the extent of the kernels they launched."""
    NO_RUNTIME_ROWS = "no_runtime_rows"
    """An nsys capture has no CUDA runtime rows: kernels could not be attributed to ppscope ranges."""
    UNKNOWN_ACTIONS = "unknown_actions"
    """torch.distributed.pipelining action names ppscope does not know were read as plain ranges."""
    STAGELESS_ACTIONS = "stageless_actions"
    """Single-stage pipelining actions name no stage: it was taken from the process groups or the traffic."""
    SCHEDULE_FOUND = "schedule_found"
    """The pipelining schedule, placement, P, V and M read from the actions."""
    INFERRED_ACTIONS = "inferred_actions"
    """A rank has no action ranges: its actions were inferred from its operators."""
    UNMARKED_STEPS = "unmarked_steps"
    """Actions inferred from operators with no `ProfilerStep#N` ranges: their steps were told apart by the
    optimizer's step, a collective after each step's last backward, or the first stage's pauses."""
    ASSUMED_WAITS = "assumed_waits"
    """Input waits without a matching `gloo:recv` range: the time before the action's first operator was
    taken as the wait."""

    TIMER_PLACEMENT = "timer_placement"
    """Where a timer trace's stages, replicas and tensor-parallel ranks came from: its lane or process names,
    the events' `args`, or its processes (one replica each)."""
    TIMER_LANES_LEFT_OUT = "timer_lanes_left_out"
    """Events of a timer trace on lanes that name no pipeline rank, where other lanes do, were left out."""
    TIMER_EVENTS_LEFT_OUT = "timer_events_left_out"
    """Timed events of a timer trace without a numeric start or duration (or a negative one) were left out."""
    PRIMUS_MICROBATCHES_GUESSED = "primus_microbatches_guessed"
    """A Primus pipeline dump without `*_minibatch` lists (an older Primus): each pass's micro-batches were
    numbered in the order they ran."""

    # ---- the run's status and metadata (ppscope.analysis)
    RUN_RUNNING = "run_running"
    """The run is still being recorded (or ended without closing its recorder): a snapshot."""
    RUN_FAILED = "run_failed"
    """The run failed: the analysis covers what was recorded before the failure."""
    RUN_INTERRUPTED = "run_interrupted"
    """The run was interrupted: the analysis covers what was recorded before."""
    CPU_COUNTERS = "cpu_counters"
    """A rank recorded CPU counters, not its GPU's."""

    # ---- models and presets (ppscope.balance.modelled)
    RENAMED_PRESET = "renamed_preset"
    """A model preset was asked for by its old name; the preset it was renamed to is used."""

    # ---- the analysis (ppscope.analysis)
    NO_SPANS = "no_spans"
    """The trace holds no spans: nothing to analyse."""
    ZERO_LENGTH = "zero_length"
    """The trace lasts 0 ns (only instantaneous spans): no ratio can be computed."""
    STAGES_BY_RANK = "stages_by_rank"
    """Some ranks carry no stage number: every rank's stage was numbered by rank order."""
    NO_ACTIVE_WINDOW = "no_active_window"
    """`--active` without compute spans: the window is the whole run."""
    NO_STEADY_STATE = "no_steady_state"
    """`--steady` without a steady state: the whole run was analysed."""
    WINDOW_CLIPPED = "window_clipped"
    """The `--window` end is past the trace's end: clipped to it."""
    NO_COMPUTE = "no_compute"
    """No compute spans: every stage counts as idle."""
    COLLECTIVES_ONLY = "collectives_only"
    """Collectives but no point-to-point traffic: the trace does not look like a pipeline."""
    NO_P2P = "no_p2p"
    """No recv/send spans: idle time between computes is `unknown`."""
    NO_PIPELINE_EVIDENCE = "no_pipeline_evidence"
    """An imported trace shows no pipeline: its ranks exchange no message, or it holds no compute. Advice on
    its split is refused unless the user says it is one (`rebalance --assume-pipeline`, `--stage-of-rank`)."""
    ONE_STAGE = "one_stage"
    """One stage only: there is no pipeline."""
    COMPUTE_OVERLAP = "compute_overlap"
    """Compute spans overlap earlier ones on the same lane: busy time counts them once."""
    CLOCK_SKEW = "clock_skew"
    """Receives end before their send starts on the common clock, beyond the offsets' uncertainty."""
    BUSY_IMBALANCE = "busy_imbalance"
    """No `forward` spans on some stage: imbalance compares busy time per stage."""
    MISSING_RANKS = "missing_ranks"
    """Ranks of the run recorded nothing (no file, a damaged one, or no spans): built by `missing_ranks` alone,
    in the same words wherever it is said (the loaders, `AnalysisResult.missing`, `rebalance`, `simulate`)."""
    MISSING_STAGES = "missing_stages"
    """Fewer stages recorded spans than the run has (`AnalysisResult.missing`)."""

    # ---- data-parallel replicas (ppscope.analysis.replicas)
    UNPLACED_SPANS = "unplaced_spans"
    """Ranks recorded spans but have no (stage, replica): left out."""
    CROSSING_REPLICAS = "crossing_replicas"
    """Ranks of different replicas exchange messages: the placement may be wrong."""
    UNPLACED_MISSING = "unplaced_missing"
    """Ranks recorded nothing and have no (stage, replica): their replica is unknown."""

    # ---- what-ifs of a training step (ppscope.simulate.whatif)
    NO_TRAINING_STEP = "no_training_step"
    """Not a training trace: no forward/backward actions with a micro-batch and a step (inference), so no step
    to replay with changed costs."""
    WHOLE_TRACE_NEEDED = "whole_trace_needed"
    """A figure that needs every rank's spans at once (the what-ifs) was not made: the run was read rank by
    rank (`--workers`, `--ray`)."""
    NO_COMPLETE_STEP = "no_complete_step"
    """A training trace without a step that every stage of every replica runs in full (each cut by the trace's
    start or end, or a rank missing): nothing to replay with changed costs."""
    REPLAY_FAILED = "replay_failed"
    """A step's own action order cannot be replayed (an action whose input no rank runs, ranks waiting for
    each other)."""
    ONE_REPLICA = "one_replica"
    """One replica only: no other replica's stage to set the straggler to (`no_straggler` is null)."""

    # ---- advice (ppscope.balance, the CLI's cost model)
    OUT_OF_MEMORY = "out_of_memory"
    """A planned stage runs out of memory: its weights plus reserve exceed the usable memory."""
    LITTLE_KV_ROOM = "little_kv_room"
    """A planned stage has almost no room for KV cache."""
    NO_SPLIT_FITS = "no_split_fits"
    """No split of the layers over the stages fits in memory."""
    POORLY_EXPLAINED = "poorly_explained"
    """The calibrated cost model explains a stage poorly: most of its time is left to its fixed overhead."""

    # ---- layer costs from runs (ppscope.balance.measured: `rebalance --json` `fit.notes`, `tune --json` `notes`)
    EMBED_IN_STAGES = "embed_in_stages"
    """A training run's embedding and output layer run inside its first and last stages' passes and these runs
    cannot tell them apart from the layers: they are counted in those stages' layers."""
    SAME_LAYER_COUNTS = "same_layer_counts"
    """Every stage holds the same number of layers: per-layer costs cannot be told apart (R² is not defined);
    each layer costs its stage's time ÷ its layers."""
    EMBED_FITTED = "embed_fitted"
    """The runs record no embedding spans: the embedding's cost is fitted from the stage times."""
    HEAD_FITTED = "head_fitted"
    """The runs record no LM head spans: the LM head's and sampling's cost is fitted from the stage times."""
    NEGATIVE_COSTS = "negative_costs"
    """Some fitted layer costs came out negative and are set to 0: the stage times are noisy."""
    MIXED_FIT = "mixed_fit"
    """The runs differ (schedule, model, device, ...) and were fitted together anyway (`--mix`)."""
    INSITU_SET_ASIDE = "insitu_set_aside"
    """The run's layer spans do not cover every layer: the in-situ costs are set aside for the others."""
    PROFILE_SET_ASIDE = "profile_set_aside"
    """The run's layer profile times another number of layers: costs are fitted from its spans instead."""

    # ---- the tuning loop (ppscope.engine.tuning: `tune --json` and `demo --json` `notes`)
    COSTS_FROM = "costs_from"
    """Where the costs of run 1 come from (its layer spans, a profile, a fit of its stage spans), in words."""
    STAGE_OVERHEAD = "stage_overhead"
    """Each step of a stage spends time outside its layers (receiving, sending, Python), counted on every stage
    since no split moves it."""
    SHARED_CORES = "shared_cores"
    """CPU stages shared too few free cores: what other work took, and the bound that puts on the gain."""
    NO_SIMULATION = "no_simulation"
    """Run 1 could not be replayed with both splits: the slowest stage's ratio stands in for the replay."""
    ALREADY_BEST = "already_best"
    """The given split is already the best for these costs: nothing to run a second time."""
    KEPT_NOT_RUN = "kept_not_run"
    """The advice is to keep the given split, so the advised split is not run."""
    DEMO_LIMITS = "demo_limits"
    """The demo computes a tiny model on CPUs: what that can and cannot show."""

    # ---- why a predicted speedup has no interval (ppscope.balance: `rebalance --json` `no_interval`)
    GIVEN_COSTS = "given_costs"
    """The costs were given by hand, with no run: nothing shows how they vary."""
    MODELLED_COSTS = "modelled_costs"
    """The costs were modelled from the model's shape and the GPU's datasheet, not measured."""
    SINGLE_TRACE = "single_trace"
    """The cost model was calibrated on one trace's busy time per stage: one figure a stage, no spread."""
    TOO_SHORT = "too_short"
    """The runs are too short to tell how their stage times vary (some block of them lacks a pass)."""
    SAME_SPLIT = "same_split"
    """The proposed split is the current one: there is no gain to put an interval on."""


@dataclass(frozen=True)
class Notice:
    """One warning: its code (which case) and its text (the sentence the user reads)."""

    code: NoticeCode
    text: str

    def __str__(self) -> str:
        return self.text

    def to_json(self) -> dict[str, str]:
        return {"code": str(self.code), "text": self.text}


def missing_ranks(ranks: Iterable[int], world_size: int) -> Notice:
    """The one sentence naming ranks of a run that recorded nothing (`RunMeta.ranks_missing`): every command
    says it in these words, and adds only what it cannot do without them."""
    shown = sorted(ranks)
    which = f"rank {shown[0]}" if len(shown) == 1 else f"ranks {rank_list(shown)}"
    return Notice(
        NoticeCode.MISSING_RANKS,
        f"{which} of {world_size} recorded nothing (no file, a damaged file, or no spans)",
    )


def rank_list(ranks: list[int], most: int = 12) -> str:
    """`0-3, 7, 9-11`: consecutive numbers as ranges, at most `most` pieces (then `... (n in all)`)."""
    pieces: list[str] = []
    for r in sorted(ranks):
        if pieces and pieces[-1].split("-")[-1] == str(r - 1):
            pieces[-1] = f"{pieces[-1].split('-')[0]}-{r}"
        else:
            pieces.append(str(r))
    if len(pieces) > most:
        return ", ".join(pieces[:most]) + f", ... ({len(ranks)} in all)"
    return ", ".join(pieces)
