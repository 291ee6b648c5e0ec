"""What rings of sleeping processes achieve here without the engine: the references for its efficiency.

P processes pass messages round a ring, each holding a message for `stage_ms` (the synthetic model's own
sleep) before passing it on, with nothing of the engine in between:
- `ring_efficiency`: P messages circulate for good, the steady state of `--schedule serve` with P in flight.
  Over gloo (`torch.distributed` isend/irecv, the engine's group layout: the wrap-around link on its own
  group, receives posted ahead), the floor for the engine on CPUs; over an OS pipe per link, the machine's own
  floor (a wake-up per hop and nothing else).
- `gpipe_efficiency`: over gloo, M micro-batches per step, the step flushed (every token back at rank 0)
  before the next begins, as `--schedule gpipe` does.
The engine's efficiency divided by its reference's is what the engine itself costs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable, Sequence
from typing import Any

from ppscope.engine.launch import free_port, main_not_reimported

__all__ = ["gpipe_efficiency", "ring_efficiency", "steady_ratio"]

_JOIN_S = 60.0


def ring_efficiency(transport: str, stages: int = 4, stage_ms: float = 5.0, passes: int = 160) -> float:
    """Steady-state hops per second ÷ the ideal (1 per `stage_ms`) at rank 0, first and last fifth dropped."""
    if transport == "gloo":
        times = _spawn(_gloo_ring_rank, stages, stage_ms, passes)
    elif transport == "pipe":
        links = [os.pipe() for _ in range(stages)]  # link r feeds rank r
        try:
            times = _spawn(_pipe_rank, stages, stage_ms, passes, links=links)
        finally:
            for fd in (fd for link in links for fd in link):
                os.close(fd)
    else:
        raise ValueError(f"unknown transport {transport!r}; valid: gloo, pipe")
    return steady_ratio([s for s, _ in times[0]], stage_ms)


def steady_ratio(starts_ns: Sequence[int], stage_ms: float) -> float:
    """Passes per second at one rank ÷ the ideal (one per `stage_ms`), over the steady state: the passes
    starting between the first and last fifth."""
    starts = sorted(starts_ns)
    lo, hi = starts[len(starts) // 5], starts[-len(starts) // 5]
    n = sum(1 for t in starts if lo <= t < hi)
    return n / ((hi - lo) / 1e9) / (1e3 / stage_ms)


def gpipe_efficiency(stages: int = 4, microbatches: int = 8, steps: int = 6, stage_ms: float = 5.0) -> float:
    """Micro-batch steps per second over the compute window ÷ the ideal, M per (M + P - 1) stage times."""
    times = _spawn(_gloo_gpipe_rank, stages, stage_ms, steps, microbatches=microbatches)
    spans = [span for rank_spans in times.values() for span in rank_spans]
    window_s = (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e9
    ideal = microbatches / ((microbatches + stages - 1) * stage_ms / 1e3)
    return microbatches * steps / window_s / ideal


def _spawn(
    target: Callable[..., None], stages: int, stage_ms: float, count: int, *, links: Any = None, microbatches: int = 0
) -> dict[int, list[tuple[int, int]]]:
    """Run `target` as P processes; each returns its (start_ns, end_ns) of every hold."""
    # gloo ranks start fresh (spawn); pipe ranks fork, to inherit the pipes, and touch nothing but them
    ctx: Any = mp.get_context("fork" if links is not None else "spawn")
    results: Any = ctx.Queue()
    extra = links if links is not None else (free_port(), microbatches)
    procs = [ctx.Process(target=target, args=(r, stages, stage_ms, count, extra, results)) for r in range(stages)]
    with main_not_reimported():  # the caller's main may be anything (a benchmark harness, a test runner)
        for p in procs:
            p.start()
    try:
        if links is not None:
            for r in range(stages):
                os.write(links[r][1], b"x")  # one message per rank: P in flight
        got: dict[int, list[tuple[int, int]]] = {}
        deadline = time.monotonic() + _JOIN_S
        while len(got) < stages:
            try:
                rank, spans = results.get(timeout=0.2)
                got[rank] = spans
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    what = f"rank {dead[0]} exited with code {procs[dead[0]].exitcode}" if dead else "no result"
                    raise RuntimeError(f"reference ring failed: {what} (its error is above)") from None
        return got
    finally:
        for p in procs:
            p.join(timeout=_JOIN_S)
            if p.is_alive():
                p.kill()


def _pipe_rank(r: int, stages: int, stage_ms: float, passes: int, links: Any, out: Any) -> None:
    import torch

    from ppscope.engine.model import sleep_ms

    cpu = torch.device("cpu")
    rfd, wfd = links[r][0], links[(r + 1) % stages][1]
    spans = []
    for _ in range(passes):
        os.read(rfd, 1)
        start = time.perf_counter_ns()
        sleep_ms(stage_ms, cpu)
        spans.append((start, time.perf_counter_ns()))
        os.write(wfd, b"x")  # the last few land in a pipe nobody reads any more: harmless
    out.put((r, spans))


class _GlooLinks:
    """One rank's links, laid out as the engine's: the wrap-around link on its own group, `depth` receives
    posted ahead and each one that lands posted again at once, until all `total` that will come are posted."""

    def __init__(self, r: int, stages: int, port: int, depth: int, total: int) -> None:
        import collections

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=stages)
        wrap = dist.new_group(list(range(stages)))
        self.dist, self.torch = dist, torch
        self.prev, self.next = (r - 1) % stages, (r + 1) % stages
        self.group_in, self.group_out = (wrap if r == 0 else None), (wrap if r == stages - 1 else None)
        self.posted: collections.deque[tuple[Any, Any]] = collections.deque()
        self.sends: list[Any] = []
        self.left = total
        for _ in range(min(depth, total)):
            self._post()

    def _post(self) -> None:
        self.left -= 1
        buf = self.torch.zeros(64, dtype=self.torch.int64)
        self.posted.append((buf, self.dist.irecv(buf, src=self.prev, group=self.group_in)))

    def recv(self) -> Any:
        buf, work = self.posted.popleft()
        work.wait()
        if self.left > 0:
            self._post()
        return buf

    def send(self, msg: Any) -> None:
        self.sends.append(self.dist.isend(msg, dst=self.next, group=self.group_out))

    def close(self) -> None:
        for work in self.sends:
            work.wait()
        self.dist.barrier()
        self.dist.destroy_process_group()


def _gloo_ring_rank(r: int, stages: int, stage_ms: float, passes: int, extra: Any, out: Any) -> None:
    from ppscope.engine.model import sleep_ms

    links = _GlooLinks(r, stages, extra[0], depth=stages + 1, total=passes)
    if r == 0:  # P messages in flight; rank 0 then stops feeding P passes early so every send is received
        for _ in range(stages):
            links.send(links.torch.zeros(64, dtype=links.torch.int64))
    spans = []
    for i in range(passes):
        msg = links.recv().clone()
        start = time.perf_counter_ns()
        sleep_ms(stage_ms, msg.device)
        spans.append((start, time.perf_counter_ns()))
        if r != 0 or i < passes - stages:
            links.send(msg)
    out.put((r, spans))
    links.close()


def _gloo_gpipe_rank(r: int, stages: int, stage_ms: float, steps: int, extra: Any, out: Any) -> None:
    from ppscope.engine.model import sleep_ms

    m = extra[1]
    links = _GlooLinks(r, stages, extra[0], depth=m + 1, total=m * steps)
    spans = []
    for _ in range(steps):
        for _ in range(m):
            msg = links.torch.zeros(64, dtype=links.torch.int64) if r == 0 else links.recv().clone()
            start = time.perf_counter_ns()
            sleep_ms(stage_ms, msg.device)
            spans.append((start, time.perf_counter_ns()))
            links.send(msg)
        if r == 0:  # the flush: every micro-batch back before the next step
            for _ in range(m):
                links.recv()
    out.put((r, spans))
    links.close()
