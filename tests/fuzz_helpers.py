"""Shared pieces of the bad-input property tests: byte mutations, the one property every case must hold,
and a count of the cases run (printed at the end of the module, `pytest -s` shows it)."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from ppscope.analysis import analyze
from ppscope.errors import PPScopeError
from ppscope.simulate.training import is_training, replay_training
from ppscope.trace.model import Trace, spans_frame

__all__ = ["CASES", "DATA", "FUZZ", "OUTCOMES", "Damaged", "check_input", "examples", "fingerprint", "mutated"]

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CASES: Counter[str] = Counter()
"""Cases run per test, for the report."""
OUTCOMES: dict[str, Counter[str]] = {}
"""Per test, how its cases ended (`ok`, or the error class)."""

SCALE = float(os.environ.get("PPSCOPE_FUZZ_SCALE", "1"))
"""Multiplies every test's case count. Set (e.g. 20) for a longer campaign: cases are then drawn at random,
not the fixed set the suite runs."""

FUZZ = settings(
    deadline=20_000,  # ms: a case that takes this long is a hang, not a slow machine
    derandomize=SCALE == 1,  # the suite runs the same cases every time: green or red, never flaky
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)


def examples(n: int) -> int:
    """`n` cases, times PPSCOPE_FUZZ_SCALE."""
    return max(1, round(n * SCALE))


class Damaged(bytes):
    """Damaged bytes that print as what was done to them, not as a megabyte of data."""

    what = ""

    def __repr__(self) -> str:
        return f"<{len(self)} bytes: {self.what}>"


@st.composite
def mutated(draw: st.DrawFn, original: bytes) -> Damaged:
    """`original` truncated, with bits flipped, a run of bytes overwritten, or replaced by random bytes."""
    how = draw(st.sampled_from(["truncate", "flip", "overwrite", "random", "flip+truncate"]))
    data = bytearray(original)
    n = len(data)
    done = []
    if how == "random":
        data = bytearray(draw(st.binary(max_size=4096)))
        done.append(f"random {bytes(data[:16])!r}…")
    if how in ("flip", "flip+truncate"):
        for _ in range(draw(st.integers(1, 16))):
            i, bit = draw(st.integers(0, n - 1)), draw(st.integers(0, 7))
            data[i] ^= 1 << bit
            done.append(f"flip {i}:{bit}")
    if how == "overwrite":
        start = draw(st.integers(0, n - 1))
        length = draw(st.integers(1, 4096))
        data[start : start + length] = draw(st.binary(min_size=1, max_size=4096))
        done.append(f"overwrite {start}+{length}")
    if how in ("truncate", "flip+truncate"):
        keep = draw(st.integers(0, n - 1))
        data = data[:keep]
        done.append(f"truncate to {keep}")
    out = Damaged(data)
    out.what = ", ".join(done)
    return out


def fingerprint(path: Path) -> dict[str, str]:
    """sha256 of every file under `path` (or of `path` itself)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def check_input(name: str, path: Path, load: Callable[[Path], Trace]) -> str:
    """The property: `load(path)` ends in a named ppscope error (one line) or a Trace the analyzer takes
    (or refuses with a named error); nothing else escapes, and the input is not written. Returns the
    outcome, for the tallies."""
    CASES[name] += 1
    before = fingerprint(path)
    mtimes = {p: os.stat(p).st_mtime_ns for p in before}
    try:
        trace = load(path)
    except PPScopeError as exc:
        _one_line(exc)
        outcome = type(exc).__name__
    else:
        assert isinstance(trace, Trace)
        spans_frame(trace.spans, validate=True)  # a valid Trace: schema types, no span ending before it starts
        try:
            analyze(trace)
            outcome = "ok"
            if is_training(trace):  # the replay `ppscope analyze` prints: a note when it cannot, never an error
                replay, _ = replay_training(trace)
                assert replay.bubble_ratio is not None or replay.note
        except PPScopeError as exc:
            _one_line(exc)
            outcome = f"ok+{type(exc).__name__}"
    assert fingerprint(path) == before, f"{path} was written by a reader"
    assert {p: os.stat(p).st_mtime_ns for p in before} == mtimes
    OUTCOMES.setdefault(name, Counter())[outcome] += 1
    return outcome


def _one_line(exc: Any) -> None:
    message = str(exc)
    assert message and "\n" not in message.strip(), f"not a one-line message: {message!r}"
