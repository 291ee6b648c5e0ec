"""Write Megatron-style pipeline timer traces (a Chrome trace of each timed pipeline operation) with a known
imbalance, from the format: ppscope's own generator, not a capture of Megatron-LM.

Each data-parallel replica runs 1F1B (Megatron's `forward_backward_pipelining_without_interleaving`: warm-up
forwards, then one forward and one backward in turn, then the cool-down backwards) and its timeline is an
event simulation of that order: an operation starts when its rank is free, a receive ends one transfer after
its peer posted the send, so every wait is a consequence of the schedule and the costs. After its last
backward each rank reduces its gradients across the replicas of its stage (`grads-reduce-scatter`, ending
when the slowest replica joins), all-reduces the embedding (first and last stage) and layer-norm gradients,
clips the gradient norm (an all-reduce over every rank), steps the optimizer and gathers the parameters
(`params-all-gather`, across the stage's replicas again); the next step starts after a `gc`.

    python scripts/megatron_timers.py tests/data/megatron-timers      # the test fixtures

`write_trace` is what the tests and the benchmark call.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MS = 1000.0
XFER_US = 0.6 * MS
"""One activation or gradient transfer between neighbouring stages."""
GAP_US = 25.0
"""Host time between two operations of a rank."""
BASE_US = 1_765_000_000_000_000.0
"""The first step's start, in epoch µs as Megatron's timers write them."""
FORWARD_SHARE = 1 / 3
"""A micro-batch's forward + backward split 1 : 2."""


@dataclass
class Job:
    """The job to write: `replicas` × `stages` ranks (TP 1), 1F1B over `microbatches` per step; `mb_ms` is the
    forward + backward time of one micro-batch on a (stage, replica), `default_mb_ms` where not given."""

    replicas: int = 2
    stages: int = 4
    microbatches: int = 8
    steps: int = 2
    default_mb_ms: float = 212.0
    mb_ms: dict[tuple[int, int], float] = field(default_factory=dict)
    """(stage, replica) -> forward + backward ms of one micro-batch."""
    process_names: bool = False
    """Name each process `DP rank D` (else the pid is the replica, as in the field trace)."""

    def cost_us(self, stage: int, replica: int) -> tuple[float, float]:
        total = self.mb_ms.get((stage, replica), self.default_mb_ms) * MS
        return total * FORWARD_SHARE, total * (1 - FORWARD_SHARE)


def one_f_one_b(stage: int, stages: int, mbs: int) -> list[tuple[str, int, int]]:
    """One stage's timed operations in Megatron's 1F1B order: (name, forward mb, backward mb), -1 for none;
    the first stage receives no activation and the last sends none (nor receives a gradient)."""
    first, last = stage == 0, stage == stages - 1
    warmup = min(stages - stage - 1, mbs)
    ops: list[tuple[str, int, int]] = []
    for m in range(warmup):
        ops += [] if first else [("forward-recv", m, -1)]
        ops += [("forward-compute", m, -1)] + ([] if last else [("forward-send", m, -1)])
    if warmup < mbs and not first:
        ops.append(("forward-recv", warmup, -1))
    for i in range(mbs - warmup):
        f, b = warmup + i, i
        ops.append(("forward-compute", f, -1))
        ops += [] if last else [("forward-send-backward-recv", f, b)]
        ops.append(("backward-compute", -1, b))
        if not first:
            ops.append(("backward-send", -1, b) if f == mbs - 1 else ("backward-send-forward-recv", f + 1, b))
    for b in range(mbs - warmup, mbs):
        ops += [] if last else [("backward-recv", -1, b)]
        ops += [("backward-compute", -1, b)] + ([] if first else [("backward-send", -1, b)])
    return ops


_Span = tuple[str, float, float, int]
"""(name, start µs, end µs, micro-batch)."""


def _pipeline(job: Job, replica: int, ready: list[float]) -> list[list[_Span]]:
    """One replica's step as each stage's spans, each stage starting at `ready[stage]`: the 1F1B order run as
    an event simulation (a receive waits for its peer's send; the loop advances whichever stage can)."""
    p = job.stages
    plans = [one_f_one_b(s, p, job.microbatches) for s in range(p)]
    at, free = [0] * p, list(ready)
    sent_f: list[dict[int, float]] = [{} for _ in range(p)]
    sent_b: list[dict[int, float]] = [{} for _ in range(p)]
    out: list[list[_Span]] = [[] for _ in range(p)]
    while any(at[s] < len(plans[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while at[s] < len(plans[s]):
                span = _advance(job, replica, s, plans[s][at[s]], free[s], sent_f, sent_b)
                if span is None:
                    break
                out[s].append(span)
                free[s] = span[2] + GAP_US
                at[s] += 1
                moved = True
        if not moved:
            raise RuntimeError("the 1F1B order deadlocked: a bug in this generator")
    return out


def _advance(
    job: Job,
    replica: int,
    s: int,
    op: tuple[str, int, int],
    start: float,
    sent_f: list[dict[int, float]],
    sent_b: list[dict[int, float]],
) -> _Span | None:
    """The span of `op` on stage `s` from `start`, or None while the send it waits for is not posted."""
    name, fm, bm = op
    fwd, bwd = job.cost_us(s, replica)
    mb = fm if bm < 0 else bm
    if name == "forward-compute":
        return name, start, start + fwd, fm
    if name == "backward-compute":
        return name, start, start + bwd, bm
    # a send is posted when the rank reaches the operation, before the receive it is paired with completes
    if name in ("forward-send", "forward-send-backward-recv"):
        sent_f[s].setdefault(fm, start)
    if name in ("backward-send", "backward-send-forward-recv"):
        sent_b[s].setdefault(bm, start)
    posted: float | None = start
    if name in ("forward-recv", "backward-send-forward-recv"):
        posted = sent_f[s - 1].get(fm)
    elif name in ("backward-recv", "forward-send-backward-recv"):
        posted = sent_b[s + 1].get(bm)
    if posted is None:
        return None
    return name, start, max(start, posted) + XFER_US, mb


_TAIL: list[tuple[str, str, float]] = [
    # (name, who waits for whom: "dp" the stage's replicas, "embed" first and last stage, "all" every rank, "" none)
    ("grads-reduce-scatter", "dp", 24 * MS),
    ("embedding-grads-all-reduce", "embed", 2 * MS),
    ("layernorm-grads-all-reduce", "", 0.8 * MS),
    ("optimizer-clip-main-grad", "all", 1.5 * MS),
    ("optimizer", "", 14 * MS),
    ("params-all-gather", "dp", 18 * MS),
    ("gc", "", 4 * MS),
]


def _tail(job: Job, free: dict[tuple[int, int], float]) -> dict[tuple[int, int], list[_Span]]:
    """The step's data-parallel tail on every (stage, replica), from `free` (its last backward's end): each
    collective ends its duration after the last of its members joined."""
    out: dict[tuple[int, int], list[_Span]] = {k: [] for k in free}
    for name, group, dur in _TAIL:
        if name == "embedding-grads-all-reduce" and job.stages < 2:
            continue
        members = [k for k in free if group != "embed" or k[0] in (0, job.stages - 1)]
        joined = {k: free[k] for k in members}
        for k in members:
            peers = [
                joined[o]
                for o in members
                if group == "all" or (group == "dp" and o[0] == k[0]) or (group == "embed" and o[1] == k[1]) or o == k
            ]
            end = max(peers) + dur
            out[k].append((name, joined[k], end, -1))
            free[k] = end + GAP_US
    return out


def spans_of(job: Job) -> dict[tuple[int, int], list[tuple[str, float, float, int, int]]]:
    """Every (stage, replica)'s spans over the job's steps: (name, start µs, end µs, micro-batch, step)."""
    keys = [(s, r) for r in range(job.replicas) for s in range(job.stages)]
    free = dict.fromkeys(keys, BASE_US)
    out: dict[tuple[int, int], list[tuple[str, float, float, int, int]]] = {k: [] for k in keys}
    for step in range(1, job.steps + 1):
        for r in range(job.replicas):
            for s, spans in enumerate(_pipeline(job, r, [free[(s, r)] for s in range(job.stages)])):
                out[(s, r)] += [(n, a, b, m, step) for n, a, b, m in spans]
                free[(s, r)] = spans[-1][2] + GAP_US
        for k, spans in _tail(job, free).items():
            out[k] += [(n, a, b, m, step) for n, a, b, m in spans]
    return out


_LANES = {"compute": 0, "pp-comm": 1, "dp-comm": 2, "misc": 3}


def _lane(name: str) -> str:
    if name.endswith("-compute"):
        return "compute"
    if name.startswith(("forward-", "backward-")):
        return "pp-comm"
    if name.startswith(("grads-", "params-", "embedding-", "layernorm-")):
        return "dp-comm"
    return "misc"


def events_of(job: Job) -> list[dict[str, Any]]:
    """The Chrome trace's events: metadata naming each lane, then every timed operation (`ph: "X"`)."""
    events: list[dict[str, Any]] = []
    for r in range(job.replicas):
        if job.process_names:
            events.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"DP rank {r}"}})
        for s in range(job.stages):
            for lane, i in _LANES.items():
                text = f"PP rank {s}, TP rank 0, {lane}"
                events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": s * 10 + i, "args": {"name": text}})
    for (s, r), spans in spans_of(job).items():
        for seq, (name, a, b, mb, step) in enumerate(spans):
            args = {"step": step, "mb_id": mb, "model_chunk": -1, "seq_id": seq}
            tid = s * 10 + _LANES[_lane(name)]
            events.append(
                {"ph": "X", "name": name, "pid": r, "tid": tid, "ts": round(a, 3), "dur": round(b - a, 3), "args": args}
            )
    return events


def write_trace(path: Path, job: Job, form: str = "array") -> Path:
    """Write `job`'s trace to `path` (gzip when it ends in `.gz`): `form` `array` (a bare JSON array, as the
    field trace) or `object` (`{"traceEvents": [...]}`)."""
    events = events_of(job)
    data = json.dumps(events if form == "array" else {"traceEvents": events}, separators=(",", ":")).encode()
    opener: Callable[..., Any] = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(data)
    return path


LAST_STAGE_SLOW = Job(mb_ms={(3, 0): 345.0, (3, 1): 345.0})
"""2 replicas × 4 stages, 1F1B, 8 micro-batches, 2 steps; the last stage 0.345 s per micro-batch, the others 0.212 s."""
ONE_RANK_SLOW = Job(mb_ms={(1, 1): 424.0}, process_names=True)
"""The same job with one rank (stage 1 of replica 1) 2× slower than the others."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write the fixtures into")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    print(write_trace(out / "last-stage-slow.json.gz", LAST_STAGE_SLOW))
    print(write_trace(out / "one-rank-slow.json.gz", ONE_RANK_SLOW))


if __name__ == "__main__":
    main()
