"""One rank of the pipelining benchmark, under torchrun: the example's model and schedule, every step timed,
steps with and without recording taking turns one by one so that the machine's drift cancels in each pair.

Hook: recording open for the whole phase, its recorder paused on every other step. Profiler: a profiling
schedule that waits one step and records the next (each recorded step's trace is dropped, outside the timed
step). Rank 0 prints one JSON line: per phase the (bare, recorded) step pairs in ms, and the compute actions and
the spans per step and rank the hook recorded. Argument 1 is a scratch folder, argument 2 the schedule.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

from ppscope.integrations.pipelining import record_pipeline
from ppscope.trace.store import load_run

PAIRS = 12


def _example() -> Any:
    path = Path(__file__).resolve().parents[1] / "examples" / "pipelining_train.py"
    spec = importlib.util.spec_from_file_location("pipelining_train", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pairs(step: Callable[[], float], record: Callable[[bool], None]) -> list[tuple[float, float]]:
    out = []
    for _ in range(PAIRS):
        record(False)
        bare = step()
        record(True)
        out.append((bare, step()))
    return out


def main() -> None:
    scratch, name = Path(sys.argv[1]), sys.argv[2]
    ex = _example()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    args = ex.parse(["--schedule", name, "--microbatches", "8", "--layers", "8", "--dim", "64", "--seq", "32"])
    sched, parts = ex.build(args, rank, world, torch.device("cpu"))
    first, last = any(p.embed is not None for p in parts), any(p.head is not None for p in parts)
    tokens = torch.randint(0, args.vocab, (args.microbatches * args.mb_size, args.seq + 1))
    after_step: list[Callable[[], None]] = []

    def step() -> float:
        dist.barrier()
        t0 = time.perf_counter()
        sched.step(*((tokens[:, :-1],) if first else ()), target=tokens[:, 1:] if last else None, losses=[])
        dist.barrier()
        spent = (time.perf_counter() - t0) * 1e3
        for hook in after_step:
            hook()
        return spent

    step()  # metadata inference and warm-up
    result: dict[str, Any] = {}
    with record_pipeline(sched, scratch / "run") as rec:
        result["hook"] = _pairs(step, lambda on: rec.recorder.set_paused(not on))
    if rank == 0:
        spans = load_run(scratch / "run").spans
        result["actions"] = int(spans["kind"].isin(["forward", "backward"]).sum()) / (PAIRS * world)
        result["spans"] = len(spans) / (PAIRS * world)
    with profile(
        activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=0, active=1), on_trace_ready=lambda p: None
    ) as prof:
        after_step.append(prof.step)
        result["profiler"] = _pairs(step, lambda on: None)  # the profiler's schedule takes turns itself
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
