"""Named errors of ppscope: every user-facing failure is one of these, with an `ErrorCode` saying which case it is.

The CLI turns each into a one-line message and its exit code; anything else reaching the top is a bug
and keeps its traceback. Messages say what is wrong and how to fix it. As a `Notice` does for warnings
(`ppscope/trace/notices.py`), an error carries its code beside its message: code and tests that tell
failures apart test the code, so a message can be reworded without changing what any program does.
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        def __str__(self) -> str:
            return str(self.value)


__all__ = [
    "CorruptFileError",
    "DoesNotFitError",
    "EngineFailedError",
    "ErrorCode",
    "InterruptedRunError",
    "InvalidConfigError",
    "InvalidSpanError",
    "InvalidSplitError",
    "NoEvidenceError",
    "PPScopeError",
    "RunExistsError",
    "RunNotFoundError",
    "SchemaVersionError",
    "UnsupportedInputError",
    "WorkerFailedError",
    "brief",
]


class ErrorCode(StrEnum):
    """Which case an error is. The values are stable: programs and tests may test them, never the message."""

    # ---- options and configuration (InvalidConfigError)
    BAD_VALUE = "bad_value"
    """An option or configuration value is out of its range, or not a number of the kind it must be."""
    UNKNOWN_CHOICE = "unknown_choice"
    """A name that is none of the valid ones (a phase, schedule, preset, GPU, dtype, backend, export format,
    objective, cost source); the message lists the valid ones."""
    UNKNOWN_CONFIG_KEY = "unknown_config_key"
    """An engine configuration names a key, field or section that does not exist."""
    CONFIG_FILE_UNREADABLE = "config_file_unreadable"
    """An engine configuration file cannot be read, is not TOML or JSON, or holds no configuration."""
    CONFLICTING_OPTIONS = "conflicting_options"
    """Options that do not go together, or one that needs another (`--chunks` without `--schedule
    interleaved`), or one that has no effect here."""
    MISSING_OPTION = "missing_option"
    """Something required was not given: an option (`--stages`, `--model`), a run, a cost."""
    COUNT_MISMATCH = "count_mismatch"
    """Values per stage, per layer or per rank whose count differs from the stages, layers or ranks they
    describe."""
    TOO_FEW_LAYERS = "too_few_layers"
    """Fewer layers than (virtual) stages: some stage would hold none."""
    HEADS_NOT_DIVISIBLE = "heads_not_divisible"
    """The tensor-parallel degree does not divide the model's attention heads."""
    WORLD_SIZE_MISMATCH = "world_size_mismatch"
    """The stages (times TP) differ from the ranks started or the GPUs given."""
    BAD_MODEL = "bad_model"
    """A model's shape is inconsistent, or its name is neither a preset nor a checkpoint directory."""
    NOT_ENOUGH_MEMORY = "not_enough_memory"
    """The model, its KV cache or the ranks need more memory than there is."""
    NO_PIPELINE_EVIDENCE = "no_pipeline_evidence"
    """Advice refused (NoEvidenceError): nothing in the trace shows a pipeline; `--assume-pipeline` or
    `--stage-of-rank` says it is one."""
    NO_SPLIT_FITS = "no_split_fits"
    """No split of the layers over the stages fits the memory limits (advice refused: DoesNotFitError)."""
    NO_GPU = "no_gpu"
    """The device or backend asked for needs GPUs that are not there, or that ranks would share."""
    TIMEOUT_TOO_SHORT = "timeout_too_short"
    """The timeout is shorter than a rank waits for its first message."""
    BAD_PROMPTS = "bad_prompts"
    """A `--prompts` file cannot be read, or a line of it is not a request."""
    SEQUENCE_TOO_LONG = "sequence_too_long"
    """A request's prompt plus its new tokens exceed the positions the model holds."""
    BAD_WINDOW = "bad_window"
    """A `--window` that is not `start_ms:end_ms` with 0 <= start_ms < end_ms."""
    WINDOW_OUTSIDE_TRACE = "window_outside_trace"
    """A `--window` that starts after the trace ends."""
    BAD_PLACEMENT = "bad_placement"
    """A `--stage-of-rank` rule that cannot be parsed, or that does not fit the ranks or `--tp`."""
    BAD_ACTION = "bad_action"
    """A pipeline action's text that is not of the form `2F0`."""
    BAD_SCHEDULE = "bad_schedule"
    """A schedule whose actions are malformed: one twice, one on another rank, one missing or before what it
    needs."""
    SCHEDULE_DEADLOCK = "schedule_deadlock"
    """A schedule (or the ranks' orders of a step) in which nothing can run."""
    NO_COMPUTE = "no_compute"
    """Nothing to calibrate on or replay: no compute time, or every cost is 0."""
    NOT_INSTALLED = "not_installed"
    """An optional dependency that the command needs is not installed; the message says what to install."""
    CLUSTER_UNREACHABLE = "cluster_unreachable"
    """The Ray cluster given with `--ray` cannot be joined."""
    PORT_IN_USE = "port_in_use"
    """The port to serve on is taken."""
    CANNOT_LISTEN = "cannot_listen"
    """The address to serve on is not one of this machine's, or cannot be bound."""
    DASHBOARD_FAILED = "dashboard_failed"
    """The dashboard server exited, or did not answer, before it served."""

    # ---- layer splits (InvalidSplitError)
    SPLIT_NOT_INTEGERS = "split_not_integers"
    """A split that is not comma-separated layer counts (an empty entry, a word, no stage)."""
    SPLIT_STAGE_COUNT = "split_stage_count"
    """A split with another number of stages than the pipeline has."""
    SPLIT_DOES_NOT_COVER_LAYERS = "split_does_not_cover_layers"
    """A split whose counts do not sum to the model's layers."""
    SPLIT_EMPTY_STAGE = "split_empty_stage"
    """A split that gives a stage fewer than one layer."""
    SPLIT_LOOKS_LIKE_BOUNDS = "split_looks_like_bounds"
    """A split that reads as stage boundaries (where each stage ends), not layer counts."""

    # ---- spans at record time (InvalidSpanError)
    SPAN_REVERSED = "span_reversed"
    """A span that ends before it starts."""
    UNKNOWN_SPAN_KIND = "unknown_span_kind"
    """A span kind that is none of the valid ones."""
    UNKNOWN_SPAN_FIELD = "unknown_span_field"
    """A span field that is not a column of the span schema."""

    # ---- runs and outputs (RunNotFoundError, RunExistsError, InvalidConfigError)
    RUN_NOT_FOUND = "run_not_found"
    """The path given as a run or trace does not exist."""
    NOT_A_RUN = "not_a_run"
    """The path exists but is not a run directory (no `meta.json`)."""
    RUN_EMPTY = "run_empty"
    """The directory given as a run is empty."""
    NO_TRACE_GIVEN = "no_trace_given"
    """No run or trace was given."""
    TRACE_NOT_SERVED = "trace_not_served"
    """The dashboard was asked for a trace it was not started on."""
    RUN_EXISTS = "run_exists"
    """The output (a run, an export) exists already: ppscope does not overwrite it without `--force`."""
    OUTPUT_WRONG_KIND = "output_wrong_kind"
    """The output path is a file where a folder is needed, or a folder where a file is."""
    OUTPUT_HOLDS_OTHER_FILES = "output_holds_other_files"
    """`--force` would replace files that an earlier export did not write."""
    OUTPUT_PATH_EMPTY = "output_path_empty"
    """An output option given as an empty path."""
    OUTPUT_NOT_WRITABLE = "output_not_writable"
    """The output cannot be written there: its folder is missing, a file or read-only, or it is standard
    output."""
    OUTPUT_INTO_INPUT = "output_into_input"
    """The output would be written inside the input, or inside a run."""

    # ---- files that cannot be read as what they claim to be (CorruptFileError, SchemaVersionError)
    DAMAGED_FILE = "damaged_file"
    """A file is truncated or damaged: it cannot be read through, or its parts disagree."""
    UNREADABLE_FILE = "unreadable_file"
    """A file exists but the system refuses to read it (permissions, an I/O error)."""
    EMPTY_FILE = "empty_file"
    """A file of 0 bytes (or a gzip stream of nothing): the writer did not write it."""
    NOT_JSON = "not_json"
    """A file that must be JSON is not valid JSON."""
    NOT_SQLITE = "not_sqlite"
    """A file that must be SQLite (a rank file, an nsys export) is not, or cannot be opened as such."""
    NOT_A_RANK_FILE = "not_a_rank_file"
    """An SQLite file that is not a ppscope rank file."""
    BAD_METADATA = "bad_metadata"
    """A run's metadata (`meta.json`, a rank file's info) has a field of the wrong type or out of range."""
    BAD_PROFILE = "bad_profile"
    """A file that is not a ppscope layer profile."""
    MISSING_COLUMNS = "missing_columns"
    """Trace data lacks columns of the span schema."""
    RUN_CHANGED = "run_changed"
    """The run changed while it was read (it is still being recorded)."""
    SCHEMA_TOO_NEW = "schema_too_new"
    """A run or file written by a newer trace schema than this ppscope reads: upgrade ppscope."""

    # ---- inputs ppscope cannot use (UnsupportedInputError)
    NOT_A_TRACE = "not_a_trace"
    """A file of a format ppscope does not read as a trace (nor SQLite, gzip or Kineto JSON; SQLite but not
    nsys; ppscope's own Chrome export)."""
    NO_TRACES = "no_traces"
    """A folder, or a list of files, that holds no trace."""
    FOLDER_OF_RUNS = "folder_of_runs"
    """A folder of runs, or of folders of trace files, given where one is read."""
    NOT_ONE_JOB = "not_one_job"
    """Trace files that are not one job's ranks."""
    DUPLICATE_RANK = "duplicate_rank"
    """A rank that appears in two files."""
    NO_KERNELS = "no_kernels"
    """An nsys export without GPU kernels and without ppscope NVTX ranges."""
    NO_SPANS = "no_spans"
    """A trace with no spans (or no compute and no requests) to analyse, time or replay."""
    MISSING_RANKS = "missing_ranks"
    """A run lacks ranks that the command needs every one of (IncompleteRunError)."""
    NO_LAYER_SPLIT = "no_layer_split"
    """A trace that does not record how its layers are split over its stages."""
    NO_LAYER_SPANS = "no_layer_spans"
    """A run without `layer` spans, for in-situ layer costs."""
    TOO_FEW_SAMPLES = "too_few_samples"
    """Too few sampled passes (of a stage, of a layer) to take costs from."""
    COSTS_NOT_SEPARABLE = "costs_not_separable"
    """The runs cannot separate the embedding/LM-head cost from the layer cost."""
    MIXED_RUNS = "mixed_runs"
    """Runs that one cost model cannot describe together (training and inference, other models)."""
    NO_PROFILE = "no_profile"
    """A run without the layer profile that `--costs profile` reads."""
    PROFILE_MISMATCH = "profile_mismatch"
    """A layer profile of another model than the run's."""
    PHASE_NOT_AVAILABLE = "phase_not_available"
    """A phase the costs were not measured for (a profile has prefill and decode, not `all`)."""
    UNSUPPORTED_SCHEDULE = "unsupported_schedule"
    """A schedule the command does not handle (interleaved runs, weight gradients apart, unknown schedules)."""
    BAD_MODEL_CONFIG = "bad_model_config"
    """A model's `config.json` is missing, unreadable or lacks what the model needs."""
    UNSUPPORTED_CHECKPOINT = "unsupported_checkpoint"
    """A checkpoint the engine cannot run exactly (another architecture, quantized weights)."""
    CHECKPOINT_INCOMPLETE = "checkpoint_incomplete"
    """A checkpoint that lacks shards or tensors the model needs."""
    CHECKPOINT_MISMATCH = "checkpoint_mismatch"
    """A checkpoint whose index, shards and `config.json` disagree."""

    # ---- the engine and workers (EngineFailedError, InterruptedRunError, WorkerFailedError)
    RANK_FAILED = "rank_failed"
    """A rank of the engine failed; the message names it and its error."""
    RANK_LOST_PEER = "rank_lost_peer"
    """A rank reporting its own failure (under torchrun, each does) whose link to a peer broke under it: most
    likely an echo of another rank's failure, which that rank reports as RANK_FAILED."""
    RANK_KILLED = "rank_killed"
    """A rank was killed by a signal, or exited without reporting an error."""
    RANK_HANGS = "rank_hangs"
    """A rank is alive but silent: its peer received nothing from it."""
    INTERRUPTED = "interrupted"
    """The run was interrupted (Ctrl-C, SIGTERM); what was recorded is kept."""
    WORKER_DIED = "worker_died"
    """A worker of a distributed analysis died, and again when its task was retried."""


def brief(exc: BaseException, limit: int = 200) -> str:
    """A library's exception text on one line and at most `limit` characters, to quote inside a ppscope error:
    SQLite, for one, quotes a damaged schema, newlines and all, into its messages."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class PPScopeError(Exception):
    """Base of every error ppscope reports to a user as one line: its `code` (which case) and its message
    (`str(error)`, the line the user reads)."""

    exit_code: int = 1

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled across processes (a worker's error) with its code; the default would call cls(message)
        return type(self), (self.code, str(self)), self.__dict__

    def to_json(self) -> dict[str, str]:
        return {"code": str(self.code), "text": str(self)}


class InvalidConfigError(PPScopeError):
    """A configuration value or command-line option is out of range or inconsistent."""

    exit_code = 2


class InvalidSplitError(InvalidConfigError):
    """A layer split (counts per stage) that does not cover the model's layers."""


class DoesNotFitError(InvalidConfigError):
    """Advice refused because the model does not fit: no split holds each stage's weights and KV cache in its
    GPU's memory. Where the GPU is known, the message gives the fewest stages that fit, and their split."""

    exit_code = 5


class InvalidSpanError(PPScopeError):
    """A span with impossible fields (end before start, unknown kind) at record time."""


class RunNotFoundError(PPScopeError):
    """The path given as a run does not exist or holds no run."""

    exit_code = 2


class RunExistsError(PPScopeError):
    """Refusing to write a run into a directory that already holds data."""

    exit_code = 2


class CorruptFileError(PPScopeError):
    """A file exists but cannot be read as what it claims to be (truncated, not SQLite, bad JSON)."""

    path: Path | None = None
    """The file, where the reader of many files set it (a run's rank files): which one to leave out."""


class SchemaVersionError(PPScopeError):
    """A run or file written by a newer ppscope schema than this one understands."""


class UnsupportedInputError(PPScopeError):
    """An input whose format ppscope does not recognise or that lacks what is needed."""

    exit_code = 2


class IncompleteRunError(UnsupportedInputError):
    """A run lacks ranks that a command needs every one of; the message names them as every command does
    (`ppscope.trace.notices.missing_ranks`)."""


class NoEvidenceError(PPScopeError):
    """Advice refused because the evidence it needs is missing (a trace that shows no pipeline): the message
    says what is missing and how to go on."""

    exit_code = 4


class EngineFailedError(PPScopeError):
    """A rank of the engine failed; the message names the rank and its error."""

    exit_code = 3


class InterruptedRunError(PPScopeError):
    """The user interrupted a run (Ctrl-C); what was recorded up to then is kept."""

    exit_code = 130


class WorkerFailedError(PPScopeError):
    """A worker of a distributed analysis died, and again when its task was retried; names what it read."""
