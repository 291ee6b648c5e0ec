"""What a ring of sleeping processes achieves here without the engine: the reference for its efficiency.

P processes in a ring pass P messages round, each holding a message for `stage_ms` (the synthetic model's
own sleep) before passing it on: the steady state of `--schedule serve` with P in flight, minus everything
the engine does. Two transports:
- `gloo`: `torch.distributed` isend/irecv on gloo with the engine's group layout (the wrap-around link on
  its own group), a receive posted ahead: the floor for the engine on CPUs.
- `pipe`: an OS pipe per link: the machine's own floor (a wake-up per hop and nothing else).
The engine's serve efficiency divided by the gloo ring's is what the engine itself costs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
from typing import Any

__all__ = ["ring_efficiency"]

_JOIN_S = 60.0


def ring_efficiency(transport: str, stages: int = 4, stage_ms: float = 5.0, passes: int = 160) -> float:
    """Steady-state hops per second ÷ the ideal (1 per `stage_ms`) at one rank, first and last fifth dropped."""
    # gloo ranks start fresh (spawn); pipe ranks fork, to inherit the pipes, and touch nothing but them
    ctx = mp.get_context("spawn" if transport == "gloo" else "fork")
    results: Any = ctx.Queue()
    if transport == "gloo":
        port = _free_port()
        procs = [ctx.Process(target=_gloo_rank, args=(r, stages, port, stage_ms, passes, results))
                 for r in range(stages)]  # fmt: skip
    elif transport == "pipe":
        links = [os.pipe() for _ in range(stages)]  # link r feeds rank r
        procs = [ctx.Process(target=_pipe_rank, args=(r, stages, links, stage_ms, passes, results))
                 for r in range(stages)]  # fmt: skip
    else:
        raise ValueError(f"unknown transport {transport!r}; valid: gloo, pipe")
    for p in procs:
        p.start()
    try:
        if transport == "pipe":
            for r in range(stages):
                os.write(links[r][1], b"x")  # one message per rank: P in flight
        times = dict(results.get(timeout=_JOIN_S) for _ in range(stages))
    finally:
        for p in procs:
            p.join(timeout=_JOIN_S)
            if p.is_alive():
                p.kill()
    starts = sorted(times[0])
    lo, hi = starts[len(starts) // 5], starts[-len(starts) // 5]
    n = sum(1 for t in starts if lo <= t < hi)
    return n / ((hi - lo) / 1e9) / (1e3 / stage_ms)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pipe_rank(r: int, stages: int, links: list[tuple[int, int]], stage_ms: float, passes: int, out: Any) -> None:
    import torch

    from engine.model import sleep_ms

    cpu = torch.device("cpu")
    rfd, wfd = links[r][0], links[(r + 1) % stages][1]
    starts = []
    for _ in range(passes):
        os.read(rfd, 1)
        starts.append(time.perf_counter_ns())
        sleep_ms(stage_ms, cpu)
        os.write(wfd, b"x")  # the last few land in a pipe nobody reads any more: harmless
    out.put((r, starts))


def _gloo_rank(r: int, stages: int, port: int, stage_ms: float, passes: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    from engine.model import sleep_ms

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=stages)
    wrap = dist.new_group(list(range(stages)))  # as the engine: the last rank -> rank 0 link on its own group
    prev, nxt = (r - 1) % stages, (r + 1) % stages
    group_in, group_out = (wrap if r == 0 else None), (wrap if r == stages - 1 else None)
    buf = torch.zeros(64, dtype=torch.int64)
    sends = []
    if r == 0:  # P messages in flight; rank 0 then stops feeding P passes early so every send is received
        sends = [dist.isend(buf.clone(), dst=nxt) for _ in range(stages)]
    posted = dist.irecv(buf, src=prev, group=group_in)
    starts = []
    for i in range(passes):
        posted.wait()
        starts.append(time.perf_counter_ns())
        msg = buf.clone()
        if i < passes - 1:
            posted = dist.irecv(buf, src=prev, group=group_in)  # posted ahead, as the engine does
        sleep_ms(stage_ms, buf.device)
        if r != 0 or i < passes - stages:
            sends.append(dist.isend(msg, dst=nxt, group=group_out))
    for work in sends:
        work.wait()
    out.put((r, starts))
    dist.barrier()
    dist.destroy_process_group()
