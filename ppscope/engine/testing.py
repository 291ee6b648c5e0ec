"""Hooks that exist for ppscope's own tests, and for nothing else: a real run never sets them.

Each is an environment variable, so that it reaches every rank however it was started (spawned by the
launcher, which hands its environment on, or by torchrun) without a field in `EngineConfig`:

- `PPSCOPE_TEST_CLOCK_SKEW_NS=RANK=NS[,RANK=NS]`: nanoseconds added to a rank's clock, to check that the
  clock offset is estimated and undone;
- `PPSCOPE_TEST_CLOCK_DRIFT_PPM=RANK=PPM[,...]`: that rank's clock runs PPM parts per million fast, to check
  that the drift is measured and undone;
- `PPSCOPE_TEST_PING_PONG=1`: ranks on rank 0's host are measured by ping-pong too, as if on another host
  (the GPU check compares that measurement with the 0 they get);
- `PPSCOPE_TEST_FAIL=RANK=N[,...]`: that rank raises after N passes, to check how a failure is reported;
- `PPSCOPE_TEST_HOST_HEADERS=1`: a CPU ring speaks a GPU ring's protocol (headers on process groups of
  their own, every payload a message of its own; see `ppscope.engine.comm`), so that it is tested without
  a GPU;
- `PPSCOPE_TEST_DEVICE_TIMED=1`: a CPU rank also times its spans as a GPU rank does, through
  `ppscope.engine.gputime` on a stand-in stream whose work is done when it is queued, so that the schedules'
  and the ring's device-timed path runs without a GPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = [
    "DEVICE_TIMED_ENV",
    "DRIFT_ENV",
    "FAIL_ENV",
    "HOST_HEADERS_ENV",
    "PING_PONG_ENV",
    "SKEW_ENV",
    "HostEvent",
    "HostStream",
    "clock",
    "device_timed",
    "failure_after",
    "host_headers",
    "ping_pong",
]

SKEW_ENV = "PPSCOPE_TEST_CLOCK_SKEW_NS"
DRIFT_ENV = "PPSCOPE_TEST_CLOCK_DRIFT_PPM"
PING_PONG_ENV = "PPSCOPE_TEST_PING_PONG"
FAIL_ENV = "PPSCOPE_TEST_FAIL"
HOST_HEADERS_ENV = "PPSCOPE_TEST_HOST_HEADERS"
DEVICE_TIMED_ENV = "PPSCOPE_TEST_DEVICE_TIMED"


def rank_value(name: str, rank: int) -> int:
    """The value for `rank` in a hook variable `RANK=VALUE[,RANK=VALUE]`, else 0."""
    for item in os.environ.get(name, "").split(","):
        key, _, value = item.partition("=")
        if key.strip() == str(rank) and value.strip():
            return int(value)
    return 0


def clock(rank: int) -> Callable[[], int]:
    """This rank's clock in ns: perf_counter_ns, skewed and drifting as PPSCOPE_TEST_CLOCK_SKEW_NS and
    PPSCOPE_TEST_CLOCK_DRIFT_PPM say."""
    skew, ppm = rank_value(SKEW_ENV, rank), rank_value(DRIFT_ENV, rank)
    if not skew and not ppm:
        return time.perf_counter_ns
    since = time.perf_counter_ns()
    return lambda: (now := time.perf_counter_ns()) + skew + (now - since) * ppm // 1_000_000


def ping_pong() -> bool:
    """Whether ranks on rank 0's host are to be measured by ping-pong too (PPSCOPE_TEST_PING_PONG=1)."""
    return os.environ.get(PING_PONG_ENV) == "1"


def failure_after(rank: int) -> Callable[[int], None]:
    """Called with each pass's number (from 1) before it runs: raises once PPSCOPE_TEST_FAIL's number of passes
    for this rank is done (never without one)."""
    passes = rank_value(FAIL_ENV, rank)

    def check(n: int) -> None:
        if passes and n > passes:
            raise RuntimeError(f"injected failure after {passes} passes")

    return check


def host_headers() -> bool:
    """Whether a CPU ring is to speak a GPU ring's protocol (PPSCOPE_TEST_HOST_HEADERS=1, or
    PPSCOPE_TEST_DEVICE_TIMED=1, which implies it)."""
    return os.environ.get(HOST_HEADERS_ENV) == "1" or device_timed()


def device_timed() -> bool:
    """Whether a CPU rank is to time its spans as a GPU rank does (PPSCOPE_TEST_DEVICE_TIMED=1)."""
    return os.environ.get(DEVICE_TIMED_ENV) == "1"


class HostStream:
    """A stand-in for a CUDA stream whose work is done as soon as it is queued (the host ran it)."""

    def synchronize(self) -> None:
        pass


class HostEvent:
    """A stand-in for a timing CUDA event on a `HostStream`: it happens when it is recorded, on `clock`."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.at = 0

    def record(self, stream: object = None) -> None:
        self.at = self.clock()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event: HostEvent) -> float:
        return (end_event.at - self.at) / 1e6
