"""Measure each rank's clock offset to rank 0 by ping-pong over the process group (see ppscope.trace.clock).

Rank 0 answers every other rank in turn; each rank keeps the exchange with the smallest round trip.
Runs before the pipeline starts, when the links are quiet.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ppscope.trace.clock import estimate_offset
from ppscope.trace.model import ClockInfo

__all__ = ["measure_offset"]


def measure_offset(
    rank: int, world: int, clock: Callable[[], int], device: torch.device, rounds: int = 32
) -> ClockInfo:
    """This rank's ClockInfo relative to rank 0 (rank 0 is the common clock: offset 0)."""
    if world == 1:
        return ClockInfo(method="none")
    buf = torch.zeros(1, dtype=torch.int64, device=device)
    if rank == 0:
        for peer in range(1, world):
            for _ in range(rounds):
                dist.recv(buf, src=peer)
                _settle(device)
                buf.fill_(clock())
                dist.send(buf, dst=peer)
        return ClockInfo(method="none")  # the reference clock itself
    samples = []
    for _ in range(rounds):
        t1 = clock()
        dist.send(buf, dst=0)
        dist.recv(buf, src=0)
        _settle(device)
        t0 = int(buf.item())
        t2 = clock()
        samples.append((t1, t0, t2))
    return estimate_offset(samples)


def _settle(device: torch.device) -> None:
    # NCCL receives return before the data is there; the stamp must come after it.
    if device.type == "cuda":
        torch.cuda.synchronize(device)
