"""Each rank's clock offset to rank 0: zero for ranks that read rank 0's clock, else measured by ping-pong.

Ranks on rank 0's host (the same boot id and time namespace) read the same monotonic clock, so their offset is
0 exactly; a ping-pong would only add its own error. Ranks elsewhere are measured by ping-pong with rank 0 over
a CPU (gloo) process group, before the pipeline starts, when the links are quiet: CPU tensors, so both legs of
an exchange cost the same (a GPU's would add a kernel launch and a synchronisation to one leg only). Rank 0
answers every measured rank in turn; each keeps the exchange with the smallest round trip. Measured again at
the end of the run, the offset gives the clocks' drift (`ppscope.trace.clock.with_drift`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ppscope.trace.clock import estimate_offset, with_drift
from ppscope.trace.model import ClockInfo

__all__ = ["ClockSync", "host_clock_key", "ranks_to_measure", "system_clock"]

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
TIME_NAMESPACE = "/proc/self/ns/time"


def host_clock_key() -> str:
    """What names the monotonic clock this process reads: the kernel's boot id and the process's time namespace
    (Linux); empty where they cannot be read, so that no two processes are taken to share a clock."""
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        return ""
    try:
        namespace = os.readlink(TIME_NAMESPACE)
    except OSError:
        namespace = ""  # kernels before 5.6 have no time namespaces: one monotonic clock per boot
    return f"{boot} {namespace}" if boot else ""


def ranks_to_measure(keys: list[str]) -> list[int]:
    """The ranks whose offset to rank 0 must be measured, from every rank's clock key: those whose key is
    empty or differs from rank 0's."""
    return [r for r in range(1, len(keys)) if not keys[0] or keys[r] != keys[0]]


class ClockSync:
    """This rank's clock against rank 0's, over `group` (a gloo group; None: the default one, when it is
    gloo). `shared_clock`: this rank's clock is the host's own monotonic clock (`time.perf_counter_ns`), which
    other processes on the host read too. Every rank makes it, and calls `at_end`, at the same point."""

    def __init__(
        self,
        rank: int,
        world: int,
        clock: Callable[[], int],
        group: Any = None,
        *,
        shared_clock: bool,
        rounds: int = 32,
    ) -> None:
        self.rank, self.world, self.clock, self.group, self.rounds = rank, world, clock, group, rounds
        self.measured: list[int] = []
        """Ranks measured by ping-pong (the others read rank 0's clock)."""
        if world == 1:
            self.start = ClockInfo(method="none")
            return
        keys: list[Any] = [None] * world
        dist.all_gather_object(keys, host_clock_key() if shared_clock else "", group=group)
        self.measured = ranks_to_measure([str(k) for k in keys])
        self.start = self._measure()

    def at_end(self) -> ClockInfo:
        """This rank's ClockInfo, with the drift a second measurement shows (collective: every rank calls it)."""
        if not self.measured:
            return self.start
        end = self._measure()
        return with_drift(self.start, end) if self.rank in self.measured else self.start

    def _measure(self) -> ClockInfo:
        if self.rank == 0:
            self._answer()
            return ClockInfo(method="none")  # the reference clock itself
        if self.rank not in self.measured:
            return ClockInfo(method="same-host")
        buf = torch.zeros(1, dtype=torch.int64)
        samples = []
        for _ in range(self.rounds):
            t1 = self.clock()
            dist.send(buf, dst=0, group=self.group)
            dist.recv(buf, src=0, group=self.group)
            t2 = self.clock()
            samples.append((t1, int(buf[0]), t2))
        return estimate_offset(samples)

    def _answer(self) -> None:
        buf = torch.zeros(1, dtype=torch.int64)
        for peer in self.measured:
            for _ in range(self.rounds):
                dist.recv(buf, src=peer, group=self.group)
                buf[0] = self.clock()
                dist.send(buf, dst=peer, group=self.group)


def system_clock(clock: Callable[[], int]) -> bool:
    """Whether `clock` is the host's own monotonic clock, the one every process on the host reads."""
    return clock is time.perf_counter_ns
