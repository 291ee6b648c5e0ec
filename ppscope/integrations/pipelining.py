"""Record a torch.distributed.pipelining schedule with ppscope's recorder: every action a span, no profiler.

    from ppscope.integrations.pipelining import record_pipeline

    schedule = ScheduleInterleaved1F1B(stages, n_microbatches=8, loss_fn=loss_fn)
    with record_pipeline(schedule, "runs/train"):      # on every rank, after the process group is up
        for batch in loader:
            schedule.step(...)

Each rank writes its spans to the run directory while it trains (`ppscope dashboard runs/train` follows it
live; `ppscope analyze runs/train` reads it): a `forward` span per forward of a stage on a micro-batch, a
`backward` span per full backward (phase `B`), backward for inputs (`I`) or for weights (`W`), the loss as a
`head` span on the last stage, a `recv_wait` span for each wait for a neighbour's activations or gradients
(with the peer rank and the bytes) and a `send` span for posting each send and for each wait for a send to
complete. Spans carry the stage (virtual with several stages per rank), micro-batch, chunk (the stage's index
among the rank's) and step (calls of `schedule.step`). The run's metadata holds the layer split, layer counts
per (virtual) stage in stage order, for `ppscope rebalance`: given as `split=[...]`, or counted from each
stage's module (its `layers` ModuleList or ModuleDict, as torchtitan prunes it per stage).

How: the stages' compute methods and the getters of their P2P operations are wrapped on the instances, and
the two functions every torch schedule posts and waits for P2P operations through
(`torch.distributed.pipelining.schedules._batch_p2p` and `_wait_batch_p2p`) are wrapped in that module while a
recorder is open; they pass through untouched outside `schedule.step`. Ranks on one host share one clock
(CLOCK_MONOTONIC); ranks on several hosts measure their offset to rank 0 by ping-pong when recording starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.pipelining import schedules as _sched

from ppscope.balance.split import validate_split
from ppscope.formats.pipelining.actions import name_schedule, placement_name
from ppscope.integrations.layer_timer import LayerTimer, layer_modules
from ppscope.trace.actions import Action, ActionType
from ppscope.trace.clock import estimate_offset
from ppscope.trace.model import ClockInfo, RankInfo, RunMeta, SpanKind
from ppscope.trace.recorder import Recorder
from ppscope.trace.schedules import Schedule
from ppscope.trace.store import RankWriter, create_run, read_meta, write_meta

__all__ = ["PipelineRecorder", "record_pipeline"]

_OF_CLASS = {s.pipelining_class: s for s in Schedule.of_training()}
"""torch's schedule classes by name -> the schedule, where the action order names none."""
_F, _B = ActionType.FORWARD, ActionType.FULL_BACKWARD
_STAGE_METHODS = (
    "forward_one_chunk",
    "backward_one_chunk",
    "backward_weight_one_chunk",
    "get_fwd_recv_ops",
    "get_bwd_recv_ops",
    "get_fwd_send_ops",
    "get_bwd_send_ops",
)
_lock = threading.Lock()
_active: list[PipelineRecorder] = []  # the recorder whose schedule is stepping now (innermost last)
_originals: dict[str, Callable[..., Any]] = {}  # torch's module functions, while they are wrapped
_users = [0]  # open recorders


class _Tag(NamedTuple):
    """What a P2P operation handed out by a stage carries: recv or send, stage, micro-batch, the direction of
    its data (FORWARD: activations, FULL_BACKWARD: gradients), the peer's global rank and the bytes."""

    op: str
    stage: int
    mb: int
    direction: ActionType
    peer: int
    nbytes: int


def record_pipeline(schedule: Any, run_dir: str | os.PathLike[str], **options: Any) -> PipelineRecorder:
    """Start recording `schedule` into `run_dir` (created by rank 0; new or empty). Call on every rank of the
    job, after `init_process_group`: it synchronises the ranks once. Options: see `PipelineRecorder`."""
    return PipelineRecorder(schedule, run_dir, **options)


class PipelineRecorder:
    """Records one schedule's actions on this rank until `close()` (or the end of a `with` block).

    name: the schedule's name in the run (default: named from its action order, as the Kineto importer
    does); nvtx: also push NVTX ranges (for Nsight Systems); clock_sync: measure clock offsets by ping-pong
    (`auto`: only when the ranks are on several hosts); split: the decoder layers each (virtual) stage holds,
    in stage order, the same on every rank (default: counted from each stage's module, `_stage_layers`);
    layer_spans: time each decoder layer's forward and backward in every K-th micro-batch of each stage as
    `layer` spans (`layer N`, N in the model's numbering; 0: never), which `ppscope rebalance` takes as each
    layer's cost; it needs the split. On a GPU the layers are timed with CUDA events, resolved at each step's
    end (one synchronisation per step)."""

    def __init__(
        self,
        schedule: Any,
        run_dir: str | os.PathLike[str],
        *,
        name: str | None = None,
        nvtx: bool = False,
        clock_sync: str = "auto",
        flush_interval_s: float = 0.5,
        split: Sequence[int] | None = None,
        layer_spans: int = 8,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("record_pipeline needs torch.distributed initialised (init_process_group) first")
        self.schedule = schedule
        self.run_dir = Path(run_dir)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        stages = list(getattr(schedule, "_stages", None) or [schedule._stage])
        self.stages = sorted(stages, key=lambda s: s.stage_index)
        self.chunk = {s.stage_index: i for i, s in enumerate(self.stages)}
        self.position = int(self.stages[0].group_rank)
        self.step_no = -1
        self._tags: dict[int, _Tag] = {}  # by id of a P2P operation a stage handed out, until it is posted
        self._works: dict[int, tuple[_Tag, ...]] = {}  # by id of a posted operation's Work, until waited for
        order, placement = _order(schedule)
        guessed, why = name_schedule(order, placement)
        self.name = name or str(guessed or _OF_CLASS.get(type(schedule).__name__) or "")
        info = self._rank_info(clock_sync)
        held = {s.stage_index: _stage_layers(s.submod) for s in self.stages}
        group = self.stages[0].group  # this rank's pipeline: the ranks its stages talk to
        pipeline = tuple(dist.get_process_group_ranks(group)) if group is not None else tuple(range(self.world))
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, (info, held, pipeline))
        infos = _replicas([g[0] for g in gathered], [g[2] for g in gathered])
        self.split, self.split_source = _split(split, [g[1] for g in gathered], int(self.stages[0].num_stages))
        self._create(infos, placement, why)
        sink = RankWriter(self.run_dir, self.rank)
        self.recorder = Recorder(
            sink, rank=self.rank, stage=self.position, nvtx=nvtx, flush_interval_s=flush_interval_s
        )
        self._wrap()
        if layer_spans < 0:
            raise ValueError(f"layer_spans must be >= 0 (0: never), got {layer_spans}")
        self.layers = LayerTimer(self, layer_spans) if layer_spans and self.split else None

    # ------------------------------------------------------------ set-up

    def _rank_info(self, clock_sync: str) -> RankInfo:
        hosts: list[Any] = [None] * self.world
        dist.all_gather_object(hosts, socket.gethostname())
        sync = clock_sync == "always" or (clock_sync == "auto" and len(set(hosts)) > 1)
        device = self.stages[0].device
        return RankInfo(
            rank=self.rank,
            stage=self.position,
            host=hosts[self.rank],
            device=torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu",
            pid=os.getpid(),
            clock=_ping_pong(self.rank, self.world, torch.device(device)) if sync else ClockInfo(method="none"),
        )

    def _create(self, infos: list[RankInfo], placement: str, why: str) -> None:
        """Rank 0 creates the run; every rank raises when it could not (none waits for the others forever)."""
        failure: list[Any] = [None]
        if self.rank == 0:
            try:
                create_run(self.run_dir, self._meta(infos, placement, why))
            except Exception as exc:
                failure[0] = exc
        dist.broadcast_object_list(failure, src=0)
        if failure[0] is not None:
            raise failure[0]

    def _meta(self, infos: list[RankInfo], placement: str, why: str) -> RunMeta:
        s = self.schedule
        return RunMeta(
            source="pipelining",
            status="running",
            world_size=self.world,
            pp_size=int(self.stages[0].group_size),
            schedule=self.name,
            microbatches=int(s._n_microbatches),
            chunks=len(self.stages),
            split=list(self.split),
            split_source=self.split_source,
            model={"layers": sum(self.split)} if self.split else {},
            backend=str(dist.get_backend()),
            ranks=infos,
            versions={"torch": torch.__version__},
            config={
                "schedule_class": type(s).__name__,
                "placement": placement,
                "schedule_from": why,
                "num_stages": int(self.stages[0].num_stages),
            },
        )

    def _wrap(self) -> None:
        for stage in self.stages:
            for attr, wrapper in (
                ("forward_one_chunk", self._forward),
                ("backward_one_chunk", self._backward),
                ("backward_weight_one_chunk", self._weight),
                ("get_fwd_recv_ops", self._ops("recv", _F)),
                ("get_bwd_recv_ops", self._ops("recv", _B)),
                ("get_fwd_send_ops", self._ops("send", _F)),
                ("get_bwd_send_ops", self._ops("send", _B)),
            ):
                setattr(stage, attr, functools.partial(wrapper, stage, getattr(stage, attr)))
        step = self.schedule.step
        self.schedule.step = functools.partial(self._step, step)
        self.schedule._maybe_compute_loss = functools.partial(self._loss, self.schedule._maybe_compute_loss)
        with _lock:
            if not _users[0]:
                _originals.update(batch=_sched._batch_p2p, wait=_sched._wait_batch_p2p)
                _sched._batch_p2p = _batch_p2p
                _sched._wait_batch_p2p = _wait_batch_p2p
            _users[0] += 1

    # ------------------------------------------------------------ wrappers

    def _span(self, kind: str, stage: Any, mb: int, phase: ActionType, **fields: Any) -> Any:
        s = stage.stage_index
        return self.recorder.span(kind, stage=s, mb=mb, step=self.step_no, chunk=self.chunk[s], phase=phase, **fields)

    def _action(self, kind: str, stage: Any, mb: int, phase: ActionType) -> Any:
        """The span of action `phase` of `stage` on micro-batch `mb`, named as torch writes it (`2F0`)."""
        return self._span(kind, stage, mb, phase, name=str(Action(stage.stage_index, phase, mb)))

    def _step(self, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.step_no += 1
        _active.append(self)
        try:
            with self.recorder.span(SpanKind.STEP, step=self.step_no, name=f"step {self.step_no}"):
                if self.layers:
                    self.layers.begin_step()
                try:
                    return step(*args, **kwargs)
                finally:
                    if self.layers:
                        self.layers.end_step()
        finally:
            _active.remove(self)

    def _forward(self, stage: Any, fn: Callable[..., Any], mb: int, *args: Any, **kwargs: Any) -> Any:
        with (
            self._action(SpanKind.FORWARD, stage, mb, _F),
            self._running(stage, mb, _F),
        ):
            return fn(mb, *args, **kwargs)

    def _backward(self, stage: Any, fn: Callable[..., Any], mb: int, *args: Any, **kwargs: Any) -> Any:
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        phase = _B if full else ActionType.BACKWARD_INPUT
        with (
            self._action(SpanKind.BACKWARD, stage, mb, phase),
            self._running(stage, mb, phase),
        ):
            return fn(mb, *args, **kwargs)

    def _running(self, stage: Any, mb: int, phase: ActionType) -> Any:
        """While a stage computes a micro-batch: which one, for the layer timer's hooks."""
        return self.layers.running(stage.stage_index, mb, phase) if self.layers else contextlib.nullcontext()

    def _weight(self, stage: Any, fn: Callable[..., Any], mb: int, *args: Any, **kwargs: Any) -> Any:
        with self._action(SpanKind.BACKWARD, stage, mb, ActionType.BACKWARD_WEIGHT):
            return fn(mb, *args, **kwargs)

    def _loss(self, fn: Callable[..., Any], stage: Any, output: Any, targets: Any, mb: int, *a: Any, **k: Any) -> Any:
        if not (stage.is_last and getattr(self.schedule, "_loss_fn", None) is not None):
            return fn(stage, output, targets, mb, *a, **k)
        with self._span(SpanKind.HEAD, stage, mb, _F, name=f"{stage.stage_index}loss{mb}"):
            return fn(stage, output, targets, mb, *a, **k)

    def _ops(self, op: str, direction: ActionType) -> Callable[..., Any]:
        def getter(stage: Any, fn: Callable[..., Any], mb: int, *args: Any, **kwargs: Any) -> Any:
            ops = fn(mb, *args, **kwargs)
            for p in ops:
                nbytes = int(p.tensor.numel() * p.tensor.element_size())
                self._tags[id(p)] = _Tag(op, stage.stage_index, mb, direction, int(p.peer), nbytes)
            return ops

        return getter

    # ------------------------------------------------------------ P2P, called by the module wrappers

    def posted(self, ops: list[Any], post: Callable[[], list[Any]]) -> list[Any]:
        """Post `ops`: the time it takes is a `send` span when they include sends (one message per batch).
        Posting a batch that also holds a receive (Schedule1F1B fuses a send with the next receive) can block
        on that receive (gloo does): that time is then also a `recv_wait` span, which outranks the send as the
        cause, without peer or bytes (the message is counted where it is waited for), as a profile of the same
        job sees it (its time is inside the receive's operator)."""
        tags = tuple(t for t in (self._tags.pop(id(p), None) for p in ops) if t is not None)
        sends = [t for t in tags if t.op == "send"]
        recvs = [t for t in tags if t.op == "recv"]
        with contextlib.ExitStack() as held:
            if sends:
                held.enter_context(self._p2p(SpanKind.SEND, sends[0], sends[0].peer, sum(t.nbytes for t in sends)))
            if sends and recvs:
                held.enter_context(self._p2p(SpanKind.RECV_WAIT, recvs[0], -1, 0, " post"))
            works = post()
        for w in works:
            self._works[id(w)] = tags
        return works

    def waited(self, works: list[Any], wait: Callable[[], None]) -> None:
        """Wait for `works`: a `recv_wait` span when a receive is among them, else a `send` span (blocked until
        the peer took the data), without peer or bytes: the message was counted when it was posted."""
        tags = tuple(t for w in works for t in self._works.pop(id(w), ()))
        recvs = [t for t in tags if t.op == "recv"]
        if not tags:
            wait()
        elif recvs:
            with self._p2p(SpanKind.RECV_WAIT, recvs[0], recvs[0].peer, sum(t.nbytes for t in recvs)):
                wait()
        else:
            with self._p2p(SpanKind.SEND, tags[0], -1, 0, " wait"):
                wait()

    def _p2p(self, kind: str, tag: _Tag, peer: int, nbytes: int, suffix: str = "") -> Any:
        """A `send` or `recv_wait` span (`kind`) of the operation `tag`, named as torch's action (`1RECV_F0`)."""
        action = ActionType.send(tag.direction) if kind == SpanKind.SEND else ActionType.recv(tag.direction)
        name = f"{Action(tag.stage, action, tag.mb)}{suffix}"
        return self.recorder.span(
            kind,
            stage=tag.stage,
            mb=tag.mb,
            step=self.step_no,
            chunk=self.chunk[tag.stage],
            phase=tag.direction,
            peer=peer,
            nbytes=nbytes,
            name=name,
        )

    # ------------------------------------------------------------ end

    def close(self, status: str = "finished") -> None:
        """Stop recording, write what is left and mark the run `status` (rank 0). Idempotent."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if self.layers:
            self.layers.remove()
        for stage in self.stages:
            for attr in _STAGE_METHODS:
                stage.__dict__.pop(attr, None)
        for attr in ("step", "_maybe_compute_loss"):
            self.schedule.__dict__.pop(attr, None)
        with _lock:
            _users[0] -= 1
            if not _users[0]:
                _sched._batch_p2p, _sched._wait_batch_p2p = _originals["batch"], _originals["wait"]
                _originals.clear()
        self.recorder.close()
        if dist.is_initialized():
            dist.barrier()
        if self.rank == 0:
            meta = read_meta(self.run_dir)
            meta.status = status
            write_meta(self.run_dir, meta)

    def __enter__(self) -> PipelineRecorder:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        interrupted = exc_type is KeyboardInterrupt
        self.close("finished" if exc_type is None else "interrupted" if interrupted else "failed")


def _batch_p2p(p2p_ops: list[Any], desc: str | None = None) -> list[Any]:
    post = functools.partial(_originals["batch"], p2p_ops, desc=desc)
    return _active[-1].posted(p2p_ops, post) if _active else post()


def _wait_batch_p2p(work: list[Any]) -> None:
    wait = functools.partial(_originals["wait"], work)
    if _active:
        _active[-1].waited(work, wait)
    else:
        wait()


def _stage_layers(module: Any) -> int | None:
    """The decoder layers a stage's module holds (`layer_modules`: its shallowest `layers` ModuleList or
    ModuleDict, as torchtitan prunes it per stage); None without one."""
    layers = layer_modules(module)
    return None if layers is None else len(layers)


def _replicas(infos: list[RankInfo], pipelines: list[tuple[int, ...]]) -> list[RankInfo]:
    """Each rank's replica, where the job runs several pipelines (data parallel): the pipelines in the order of
    their lowest rank, each rank in its own's. One pipeline: left unsaid (-1). Tensor-parallel ranks of a stage,
    each in a pipeline group of its own, count as replicas of their own."""
    order = sorted(set(pipelines), key=min)
    if len(order) < 2:
        return infos
    index = {p: i for i, p in enumerate(order)}
    return [dataclasses.replace(info, replica=index[p]) for info, p in zip(infos, pipelines, strict=True)]


def _split(given: Sequence[int] | None, held: list[dict[int, int | None]], stages: int) -> tuple[list[int], str]:
    """The split to record and where it came from: `given`, checked; else every stage's counted layers,
    when each stage's module had them (a stage with no layers cannot be balanced); else none."""
    if given is not None:
        split = [int(n) for n in given]
        validate_split(split, sum(split), stages)
        return split, "record_pipeline(split=)"
    counted = {s: n for h in held for s, n in h.items() if n}
    if sorted(counted) != list(range(stages)):
        return [], ""
    return [counted[s] for s in range(stages)], "stage modules' layers"


def _order(schedule: Any) -> tuple[dict[int, list[Action]], str]:
    """One step's compute actions per rank (the schedule's own `pipeline_order`) and the placement."""
    order: dict[int, list[Action]] = {}
    for rank, actions in (getattr(schedule, "pipeline_order", None) or {}).items():
        ours = (_action(a) for a in actions if a is not None)
        order[int(rank)] = [a for a in ours if a is not None and a.is_compute]
    held = {r: sorted({p.stage for a in acts for p in (a.parts or (a,))}) for r, acts in order.items()}
    return order, placement_name(held) if held and all(held.values()) else "unknown"


def _action(a: Any) -> Action | None:
    """torch's `_Action` as ppscope's; None for a type this ppscope does not know (a newer torch's)."""
    try:
        kind = ActionType(a.computation_type.value)
    except ValueError:
        return None
    if a.sub_actions:
        parts = (_action(p) for p in a.sub_actions)
        return Action(-1, kind, parts=tuple(p for p in parts if p is not None))
    mb = -1 if a.microbatch_index is None else int(a.microbatch_index)
    return Action(int(a.stage_index), kind, mb)


def _ping_pong(rank: int, world: int, device: torch.device, rounds: int = 16) -> ClockInfo:
    """This rank's clock offset to rank 0's (rank 0: none), from the exchange with the shortest round trip."""
    buf = torch.zeros(1, dtype=torch.int64, device=device)
    clock = time.perf_counter_ns  # the recorder's clock
    samples = []
    for peer in range(1, world):
        for _ in range(rounds):
            if rank == 0:
                dist.recv(buf, src=peer)
                buf.fill_(clock())
                dist.send(buf, dst=peer)
            elif rank == peer:
                t1 = clock()
                dist.send(buf, dst=0)
                dist.recv(buf, src=0)
                samples.append((t1, int(buf.item()), clock()))
    return estimate_offset(samples) if samples else ClockInfo(method="none")
