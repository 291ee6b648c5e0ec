"""A rank's failure in words: its error on one line, whether it is an echo of another rank's, and what a run's
readers say about the failures its ranks recorded themselves.

Under `ppscope run` the launcher hears every rank and names the cause in `meta.json`. Under torchrun nobody
hears them all: rank 0 writes the run's status (when torchrun stops it, "stopped by SIGTERM"), and each rank
that fails records its own error in its rank file, for the readers to name. Whether a failure is the rank's own
or an echo is decided where it happens, by the failing rank (`engine.comm.failure_code`), and travels with it
as a `FailureCode`; this module only words what it is given.
"""

from __future__ import annotations

import enum
import re
import sys
from collections.abc import Mapping
from typing import NamedTuple

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        def __str__(self) -> str:
            return str(self.value)


__all__ = ["FailureCode", "RankError", "is_peer_failure", "plain_error", "rank_failure", "recorded_failures"]


class FailureCode(StrEnum):
    """Whose failure a rank's error is. The values are stored in rank files (info key `failure_code`)."""

    OWN = "own"
    """The rank failed in its own code (an exception of the model, the schedule, the machine)."""
    PEER = "peer"
    """Its link or process group broke under it: another rank failed or hangs, and this error is an echo."""


class RankError(NamedTuple):
    """A rank's failure: its plain error (`plain_error`) and its code, None where a rank file of an older ppscope
    recorded only the text."""

    text: str
    code: FailureCode | None = None

    @property
    def peer(self) -> bool:
        """Whether it is an echo of another rank's failure: by its code, else (older files) by the text rule."""
        return self.code == FailureCode.PEER if self.code is not None else is_peer_failure(self.text)


_PEER_FAILURE = re.compile(
    r"(send to|receive from|received nothing from) rank \d+|by peer|broken pipe|timed out|remote process"
    r"|DistNetworkError|DistBackendError|DistStoreError",
    re.IGNORECASE,
)
"""An error a rank gets because another one failed or hangs, read from its text: only for rank files written
before ranks recorded a `FailureCode` (`RankError.peer`)."""
_SOURCE_LINE = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|cu|h|hpp):\d+\]\s*")
"""Where in its C++ source a library raised ("[/build/.../gloo/transport/tcp/pair.cc:537] "): not for users."""
_ADVICE_TAIL = re.compile(r"\s*(?:This is typically caused by|Exception raised from) .*$", re.DOTALL)
"""gloo's closing advice ("... GLHF!" and an emoji; the reader is told which rank to look at instead) and a
C++ backtrace."""
_LISTED = 3
"""Echoes named one by one before the rest are counted."""


def plain_error(exc: BaseException) -> str:
    """`Type: message` of a rank's error on one line, without a library's source location or its advice."""
    try:
        text = str(exc)
    except Exception:  # an exception whose message cannot be made still has a name
        text = ""
    text = _ADVICE_TAIL.sub("", _SOURCE_LINE.sub("", text))
    text = " ".join(text.split()).rstrip(".")  # a caller goes on after it with "; ..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_peer_failure(detail: str) -> bool:
    """Whether a recorded error's text reads as its link or process group breaking under it: the fallback for
    rank files of older ppscope versions, which recorded no `FailureCode`."""
    return _PEER_FAILURE.search(detail) is not None


def rank_failure(rank: int, exc: BaseException, code: FailureCode) -> str:
    """What a rank says of its own failure where nobody hears every rank (under torchrun each prints its own):
    its error, and when that is its link breaking (`code`), that another rank's failure is the likely cause."""
    error = _unrepeated(rank, plain_error(exc))
    if code == FailureCode.PEER:
        return f"rank {rank} failed: {error} (most likely an echo: the rank that failed first names the cause)"
    return f"rank {rank} failed: {error}"


def _unrepeated(rank: int, error: str) -> str:
    """The ring says which rank it is ("RuntimeError: rank 2: receive from ..."): once is enough."""
    return error.replace(f": rank {rank}: ", ": ", 1)


def recorded_failures(errors: Mapping[int, RankError], said: str = "") -> list[str]:
    """One line per failure the ranks recorded, causes before echoes: the ranks that failed in their own code,
    or when none did, those whose link broke (a rank killed outright records nothing). A failure `said` already
    (the run's own status, "rank R: error" from rank 0) is not repeated."""
    told = {r: e.text for r, e in sorted(errors.items()) if e.text and said != f"rank {r}: {e.text}"}
    own = {r: e for r, e in told.items() if not errors[r].peer}
    shown = own or told
    lines = [f"rank {r} failed: {_unrepeated(r, e)}" for r, e in list(shown.items())[:_LISTED]]
    if len(shown) > _LISTED:
        lines.append(f"{len(shown) - _LISTED} more rank(s) recorded a failure")
    if own and len(told) > len(own):
        lines.append(f"{len(told) - len(own)} rank(s) then lost their link to a failed one")
    return lines
