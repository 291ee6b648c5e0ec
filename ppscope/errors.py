"""Named errors of ppscope: every user-facing failure is one of these.

The CLI turns each into a one-line message and its exit code; anything else reaching the top is a bug
and keeps its traceback. Messages say what is wrong and how to fix it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CorruptFileError",
    "DoesNotFitError",
    "EngineFailedError",
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


def brief(exc: BaseException, limit: int = 200) -> str:
    """A library's exception text on one line and at most `limit` characters, to quote inside a ppscope error:
    SQLite, for one, quotes a damaged schema, newlines and all, into its messages."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class PPScopeError(Exception):
    """Base of every error ppscope reports to a user as one line."""

    exit_code: int = 1


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
