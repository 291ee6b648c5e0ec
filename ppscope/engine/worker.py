"""One rank's main: process group, clock offset, recorder and counter sampler, stage module, the schedule loop,
flush. Spawned by `ppscope.engine.launch` or started by torchrun; the same function either way.

Only rank 0 writes the run's `meta.json` and `requests.jsonl`; every rank writes its own rank file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import os
import shlex
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ppscope.engine.binding import agree_backend, device_for, gpu_uuid, rendezvous, run_store
from ppscope.engine.clock_sync import ClockSync, system_clock
from ppscope.engine.comm import Ring, failure_code
from ppscope.engine.config import EngineConfig
from ppscope.engine.gputime import DeviceSpans
from ppscope.engine.model import calibrate_sleep
from ppscope.engine.prepare import Prepared, check_memory, make_source, prepare, torch_dtype
from ppscope.engine.requests import RequestLog
from ppscope.engine.sampling import Sampling
from ppscope.engine.schedules import Pipeline
from ppscope.engine.stage import build_stage
from ppscope.engine.testing import HostEvent, HostStream, device_timed, failure_after, host_headers, ping_pong
from ppscope.engine.testing import clock as test_clock
from ppscope.engine.usage import CounterSampler, find_gpu
from ppscope.errors import EngineFailedError, ErrorCode, InterruptedRunError, PPScopeError
from ppscope.failures import FailureCode, plain_error, rank_failure
from ppscope.simulate.schedule import ServePolicy
from ppscope.trace.model import ClockInfo, RankInfo
from ppscope.trace.recorder import Recorder
from ppscope.trace.schedules import Schedule
from ppscope.trace.store import RankWriter, create_run, read_meta, write_meta

__all__ = ["default_run_dir", "run_rank"]

ProgressFn = Callable[[int, int], None]
SWITCH_INTERVAL_S = 1e-4
"""How long a thread holding the GIL runs before it must hand it to a waiting one (Python's default: 5 ms)."""


def default_run_dir() -> Path:
    return Path("runs") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")


def _gpu_uuid(device: torch.device) -> str | None:
    """The UUID CUDA gives this rank's device (a MIG instance's own), None on a CPU."""
    if device.type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(device).uuid)


def _host_timer(rec: Recorder) -> DeviceSpans:
    """Device-timed spans on a stand-in stream that the host runs (PPSCOPE_TEST_DEVICE_TIMED)."""
    return DeviceSpans(rec, HostStream(), lambda: HostEvent(rec.now_ns), anchor_stream=HostStream())


def run_rank(
    cfg: EngineConfig,
    rank: int,
    world: int,
    *,
    local_rank: int = 0,
    run_dir: Path | None = None,
    progress: ProgressFn | None = None,
    prepared: Prepared | None = None,
) -> Path:
    """Run this rank to the end and return the run directory. With `run_dir` None (torchrun), rank 0 creates
    it and tells the others. Raises on any failure; the caller reports it."""
    prep = prepared or prepare(cfg, world)
    store: Any = None
    if world > 1:  # rank 0 decides the backend for every rank
        store = rendezvous(rank, world, cfg.runtime.timeout_s)
        uuid = gpu_uuid(local_rank) if cfg.runtime.backend != "gloo" and cfg.runtime.device != "cpu" else ""
        prep = dataclasses.replace(
            prep, backend=agree_backend(run_store(store), rank, world, cfg.runtime.backend, uuid)
        )
    backend = prep.backend
    device = device_for(backend, local_rank, cfg.runtime.device)
    if device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(local_world, 1)))
    group = None  # for what the host exchanges (clocks, objects): gloo, the default group's or one of its own
    if world > 1:
        timeout = datetime.timedelta(seconds=cfg.runtime.timeout_s)
        default_store = dist.PrefixStore("default_pg", store)  # as init_process_group makes it itself
        dist.init_process_group(backend, store=default_store, rank=rank, world_size=world, timeout=timeout)
        group = dist.new_group(backend="gloo") if backend != "gloo" else None
    # A thread that wakes (a message landed, a send completed) waits for the GIL up to the switch interval
    # (5 ms by default, a whole stage of a small model): let the holder hand it over much sooner.
    switch_s = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        return _run(cfg, prep, rank, world, device, run_dir, progress, group)
    finally:
        sys.setswitchinterval(switch_s)
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _run(
    cfg: EngineConfig,
    prep: Prepared,
    rank: int,
    world: int,
    device: torch.device,
    run_dir: Path | None,
    progress: ProgressFn | None,
    group: Any,
) -> Path:
    clock = test_clock(rank)
    sync = ClockSync(rank, world, clock, group, shared_clock=system_clock(clock) and not ping_pong())
    supervised = run_dir is not None
    if run_dir is None:  # torchrun: rank 0 names and creates the run, the others follow
        box: list[object] = [None]
        if rank == 0:
            path = cfg.output.out or default_run_dir()
            create_run(path, prep.meta(world))
            box[0] = str(path)
        if world > 1:
            dist.broadcast_object_list(box, src=0, group=group)
        run_dir = Path(str(box[0]))
        run_dir.mkdir(parents=True, exist_ok=True)  # other nodes without a shared file system
    try:
        return _run_pipeline(cfg, prep, rank, world, device, run_dir, progress, sync, not supervised)
    except BaseException as exc:
        if supervised:
            raise
        stopped = isinstance(exc, KeyboardInterrupt)
        why = (str(exc) or "interrupted by the user") if stopped else plain_error(exc)
        if rank == 0:  # torchrun: nobody else writes the run's status
            meta = read_meta(run_dir)
            meta.status, meta.error = ("interrupted" if stopped else "failed"), f"rank 0: {why}"
            write_meta(run_dir, meta)
        if isinstance(exc, PPScopeError):
            raise
        where = f"the trace up to then is in {run_dir} (`ppscope analyze {shlex.quote(str(run_dir))}` names the cause)"
        if not stopped:
            whose = failure_code(exc)
            said = f"{rank_failure(rank, exc, whose)}; {where}"
            if whose == FailureCode.PEER:  # its link broke under it: most likely an echo of another's failure
                raise EngineFailedError(ErrorCode.RANK_LOST_PEER, said) from exc
            raise EngineFailedError(ErrorCode.RANK_FAILED, said) from exc
        # torchrun stops every rank (SIGTERM) when one fails: the failure is in that rank's own line and file
        raise InterruptedRunError(ErrorCode.INTERRUPTED, f"rank {rank} {why}; {where}") from None


def _run_pipeline(
    cfg: EngineConfig,
    prep: Prepared,
    rank: int,
    world: int,
    device: torch.device,
    run_dir: Path,
    progress: ProgressFn | None,
    sync: ClockSync,
    keep_failure: bool,
) -> Path:
    """`keep_failure`: record this rank's own error in its file (under torchrun, where no launcher hears it)."""
    cycles_per_ms = calibrate_sleep(device) if cfg.model.synthetic else 0.0
    gpu, counters = find_gpu(_gpu_uuid(device), device.index if device.index is not None else -1)
    info = RankInfo(
        rank=rank,
        stage=rank,
        host=socket.gethostname(),
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        pid=os.getpid(),
        clock=sync.start,
        sm_clock_mhz=cycles_per_ms / 1e3,
        counters=counters,
    )
    infos: list[RankInfo | None] = [None] * world if rank == 0 else []
    if world > 1:
        dist.gather_object(info, infos if rank == 0 else None, dst=0, group=sync.group)
    else:
        infos = [info]
    if rank == 0:
        meta = read_meta(run_dir)
        meta.ranks = [i for i in infos if i is not None]
        meta.backend = prep.backend  # as rank 0 decided it (the launcher's was this host's view)
        write_meta(run_dir, meta)

    shape = prep.shape
    work, schedule = cfg.workload, cfg.pipeline.schedule
    dtype = torch_dtype(cfg.model.dtype)
    out = cfg.output
    sink = RankWriter(run_dir, rank) if out.record else None
    log: RequestLog | None = None
    rec = Recorder(sink, rank=rank, stage=rank, enabled=out.record, nvtx=out.nvtx, clock=sync.clock)
    sampler: CounterSampler | None = None
    pipe: Pipeline | None = None
    frozen = False
    failure: dict[str, str] = {}
    try:  # from here on, whatever stops the rank (a Ctrl-C included) closes its file
        sampler = CounterSampler(rec, gpu, out.sample_interval_ms)
        if device.type == "cuda":
            free = torch.cuda.mem_get_info(device)[0]
            check_memory(prep, [rank], world, free, f"GPU {device.index}", processes=False)
        module = build_stage(make_source(cfg, shape), prep.split, rank, world, cfg.pipeline.chunks, device, dtype)
        module.allocate_cache(prep.cache_slots, prep.max_len, dtype, shape.kv_heads, shape.head_dim)
        # room in the receive posted ahead for the largest activation (a prefill of the longest prompts)
        act_nbytes = prep.max_seqs * max(prep.longest_prompt, 1) * shape.hidden * dtype.itemsize
        # as many receives posted ahead as messages may queue at a rank: every micro-batch in flight, and stop
        ring = Ring(
            rank,
            world,
            rec,
            prep.max_seqs,
            device if prep.backend == "nccl" else torch.device("cpu"),  # gloo: through host memory, a GPU too
            cfg.runtime.timeout_s,
            act_nbytes,
            depth=prep.inflight + 1,
            host_headers=host_headers(),
            compute=device,
        )
        pipe = Pipeline(
            module=module,
            ring=ring,
            recorder=rec,
            hidden=shape.hidden,
            vocab=shape.vocab,
            dtype=dtype,
            chunks=cfg.pipeline.chunks,
            sampling=Sampling(temperature=work.temperature, top_p=work.top_p, seed=work.seed),
            device_spans=_host_timer(rec) if device.type == "cpu" and device_timed() else None,
        )
        pipe.before_pass = failure_after(rank)
        pipe.alternate_ns = int(cfg.bench.record_alternate_ms * 1e6)
        pipe.layer_every = out.layer_spans if out.record else 0
        pipe.layer_alternate_ns = int(cfg.bench.layer_spans_alternate_ms * 1e6)
        if rank == 0:
            log = RequestLog(run_dir)
            pipe.on_finish = log
            arrivals = prep.arrivals_ns if schedule == Schedule.SERVE else []  # each made as the scheduler reaches it
        pipe.warm_up(prep.max_seqs, prep.longest_prompt)
        ring.start()
        # Everything built so far lives for the whole run. Left to the collector, a full collection walks it
        # all (~0.2M objects with torch loaded, ~0.1 s here): a stall of every stage behind this one. Frozen,
        # it is skipped; unfrozen at the end, so a caller running a rank in its own process gets its heap back.
        gc.collect()
        gc.freeze()
        frozen = True
        if world > 1:
            dist.barrier()  # every stage is built: the pipeline's clock starts now for everyone
        sampler.start()
        report = progress or (lambda done, tokens: None)
        if rank != 0:
            pipe.follow()
        elif schedule == Schedule.SERVE:
            policy = ServePolicy(max_inflight=prep.inflight, max_batch=prep.max_seqs)
            pipe.drive_serve(prep.requests, arrivals, policy, cfg.runtime.timeout_s, report)
        else:
            pipe.drive_batch(schedule, prep.requests, prep.inflight, report)
        pipe.close()
        ring.close()
    except Exception as exc:  # a failure; a KeyboardInterrupt (Ctrl-C, torchrun's SIGTERM) only stopped the rank
        if keep_failure:
            failure["error"] = plain_error(exc)
            failure["failure_code"] = str(failure_code(exc))  # whose failure: readers go by it, not by the text
        raise
    finally:
        if frozen:
            gc.unfreeze()
        if pipe is not None and pipe.device_spans is not None:
            with contextlib.suppress(Exception):  # a failed run keeps what its GPU finished (never waits for it)
                pipe.device_spans.poll()
        if sampler is not None:
            sampler.stop()
        rec.close(failure)
        if log is not None:
            log.close()
    clocks: list[ClockInfo | None] = [None] * world if rank == 0 else []
    if world > 1:  # every rank is done: the clocks are measured again, for their drift
        dist.gather_object(sync.at_end(), clocks if rank == 0 else None, dst=0, group=sync.group)
        dist.barrier()
    if rank == 0:
        meta = read_meta(run_dir)
        meta.status = "finished"
        for info in meta.ranks:
            info.clock = clocks[info.rank] or info.clock
        write_meta(run_dir, meta)
    return run_dir
