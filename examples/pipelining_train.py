"""Train a small decoder with torch.distributed.pipelining, for ppscope to measure its bubbles.

Run it under torchrun, one process per pipeline rank (gloo on CPUs, NCCL with one GPU per rank):

    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/pipelining_train.py \\
        --schedule interleaved-1f1b --microbatches 8 --profile traces/il --ppscope runs/il

`--profile DIR` writes one PyTorch-profiler (Kineto) trace per rank, `DIR/rank-N.json.gz`, each step a
`ProfilerStep#N` range (`--no-step-marks`: a plain `profile()` round the loop, never stepped, so none);
`--ppscope DIR` records every action of the schedule with ppscope's recorder instead (a run directory,
`ppscope.integrations.pipelining`). Both can be given at once; then the run directory also holds the
profiler's cost. `ppscope analyze DIR` reads either, and `ppscope dashboard DIR` shows it.
`--split 6,2` puts the layers unevenly on the stages; the recorder counts each stage's `layers`, so
`ppscope rebalance DIR` advises a better split (for the Kineto traces, give it `--current-split 6,2`).
`--dp D` runs D data-parallel replicas of the pipeline (ranks r·P to r·P + P − 1 are replica r, their
gradients averaged across replicas each step); the recorder notes each rank's replica, and `ppscope analyze`
compares the replicas stage by stage.

Schedules, with the stages each rank holds: `gpipe` and `1f1b` one stage per rank; `interleaved-1f1b`,
`looped-bfs` and `zero-bubble` (torch's interleaved ZB1P) `--chunks` stages per rank, stage s on rank
s mod P; `zbv` and `dualpipev` two stages per rank in a V (rank r holds stages r and 2P-1-r).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, schedules

SCHEDULES = {
    "gpipe": ("ScheduleGPipe", "single"),
    "1f1b": ("Schedule1F1B", "single"),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", "loop"),
    "looped-bfs": ("ScheduleLoopedBFS", "loop"),
    "zero-bubble": ("ScheduleInterleavedZeroBubble", "loop"),
    "zbv": ("ScheduleZBVZeroBubble", "v"),
    "dualpipev": ("ScheduleDualPipeV", "v"),
}


class Block(nn.Module):
    """A pre-norm decoder block: causal self-attention and an MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


class DecoderPart(nn.Module):
    """The layers [first, last) of the decoder; the embedding on the first part, norm and head on the last."""

    def __init__(self, args: argparse.Namespace, first: int, last: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.dim) if first == 0 else None
        self.layers = nn.ModuleDict({str(i): Block(args.dim, args.heads) for i in range(first, last)})
        is_last = last == args.layers
        self.norm = nn.LayerNorm(args.dim) if is_last else None
        self.head = nn.Linear(args.dim, args.vocab) if is_last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None and self.head is not None:
            h = self.head(self.norm(h))
        return h


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per step (8)")
    p.add_argument("--chunks", type=int, default=2, help="stages per rank of loop schedules (2)")
    p.add_argument("--steps", type=int, default=3, help="training steps (3)")
    p.add_argument("--layers", type=int, default=8, help="decoder layers, split evenly over the stages (8)")
    p.add_argument("--split", metavar="N,N,...", help="layers per (virtual) stage in stage order (default: even)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq", type=int, default=32, help="tokens per sequence (32)")
    p.add_argument("--mb-size", type=int, default=2, help="sequences per micro-batch (2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas of the pipeline (1)")
    p.add_argument("--profile", metavar="DIR", help="write a Kineto trace per rank, DIR/rank-N.json.gz")
    p.add_argument(
        "--no-step-marks",
        action="store_true",
        help="profile with a plain profile() round the loop and no prof.step(): no ProfilerStep#N ranges",
    )
    p.add_argument("--ppscope", metavar="DIR", help="record the schedule's actions into a ppscope run directory")
    return p.parse_args(argv)


def stages_of(rank: int, ranks: int, placement: str, chunks: int) -> list[int]:
    """The stage indices rank `rank` holds."""
    if placement == "single":
        return [rank]
    if placement == "v":
        return [rank, 2 * ranks - 1 - rank]
    return [rank + c * ranks for c in range(chunks)]


def layer_range(stage: int, stages: int, layers: int, split: str | None = None) -> tuple[int, int]:
    """The layers of `stage`: `split`'s counts, or an even split of `layers`, the remainder on the first stages."""
    if split:
        counts = [int(n) for n in split.split(",")]
        if len(counts) != stages or sum(counts) != layers or min(counts) < 1:
            sys.exit(f"--split {split} must give {stages} counts of at least 1 layer, summing to --layers {layers}")
        return sum(counts[:stage]), sum(counts[: stage + 1])
    base, extra = divmod(layers, stages)
    first = stage * base + min(stage, extra)
    return first, first + base + (stage < extra)


def build(
    args: argparse.Namespace, rank: int, ranks: int, device: torch.device, group: dist.ProcessGroup | None = None
) -> tuple[Any, list[nn.Module]]:
    """This rank's stages and the schedule over them: `rank` of the `ranks` of its pipeline (`group`)."""
    cls_name, placement = SCHEDULES[args.schedule]
    local = stages_of(rank, ranks, placement, args.chunks)
    n_stages = ranks * len(local)
    if args.layers < n_stages:
        sys.exit(f"--layers {args.layers} is fewer than the {n_stages} stages of {args.schedule}")
    parts: list[nn.Module] = []
    stages = []
    for s in local:
        torch.manual_seed(args.seed + s)  # every stage's weights are the same whatever the placement
        part = DecoderPart(args, *layer_range(s, n_stages, args.layers, args.split)).to(device)
        parts.append(part)
        stages.append(PipelineStage(part, s, n_stages, device, group=group))
    cls = getattr(schedules, cls_name)

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    first = stages[0] if placement == "single" else stages
    return cls(first, n_microbatches=args.microbatches, loss_fn=loss_fn), parts


@contextlib.contextmanager
def profiled(out: str | None, rank: int, steps: int, marks: bool = True) -> Iterator[Any]:
    """The PyTorch profiler around the training loop (every step, each a `ProfilerStep#N` range), its trace
    written to OUT/rank-N.json.gz. Without `marks`, a plain `profile()` round the loop that is never
    stepped, as a user wraps a few steps: the trace has no `ProfilerStep#N` range (yields None)."""
    if not out:
        yield None
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    Path(out).mkdir(parents=True, exist_ok=True)
    path = str(Path(out) / f"rank-{rank}.json.gz")
    if not marks:
        with torch.profiler.profile(activities=activities) as plain:
            yield None
        plain.export_chrome_trace(path)
        return
    with torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(path),
    ) as prof:
        yield prof


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    rank, ranks = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if "LOCAL_RANK" not in os.environ:
        sys.exit("run under torchrun: python -m torch.distributed.run --nproc-per-node 2 " + sys.argv[0])
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= ranks
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    torch.set_num_threads(1)
    if args.dp < 1 or ranks % args.dp:
        sys.exit(f"--dp {args.dp} must divide the {ranks} ranks")
    pp = ranks // args.dp
    replica = rank // pp
    pipeline, replicas = None, None  # one pipeline: the default group
    if args.dp > 1:  # every rank makes every group, in one order, named as DeviceMesh names its dimensions
        pipelines = [dist.new_group(list(range(d * pp, (d + 1) * pp)), group_desc="mesh_pp") for d in range(args.dp)]
        across = [dist.new_group([s + d * pp for d in range(args.dp)], group_desc="mesh_dp") for s in range(pp)]
        pipeline, replicas = pipelines[replica], across[rank % pp]
    schedule, parts = build(args, rank % pp, pp, device, pipeline)
    recorder = None
    if args.ppscope:
        from ppscope.integrations.pipelining import record_pipeline

        recorder = record_pipeline(schedule, args.ppscope, name=args.schedule)
    params = [p for part in parts for p in part.parameters()]
    optim = torch.optim.SGD(params, lr=0.01)
    gen = torch.Generator().manual_seed(args.seed + replica)  # each replica its own batch
    batch = args.microbatches * args.mb_size
    tokens = torch.randint(0, args.vocab, (batch, args.seq + 1), generator=gen).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    t0 = time.perf_counter()
    try:
        with profiled(args.profile, rank, args.steps, not args.no_step_marks) as prof:
            for step in range(args.steps):
                optim.zero_grad()
                holds_first = any(p.embed is not None for p in parts)
                holds_last = any(p.head is not None for p in parts)
                losses: list[torch.Tensor] = []
                schedule.step(*((x,) if holds_first else ()), target=y if holds_last else None, losses=losses)
                if replicas is not None:
                    for p in params:  # the replicas' mean gradient
                        if p.grad is not None:
                            dist.all_reduce(p.grad, group=replicas)
                            p.grad /= args.dp
                optim.step()
                if prof is not None:
                    prof.step()
                if holds_last:
                    mean = torch.stack(losses).mean().item()
                    print(f"step {step}: loss {mean:.4f} (rank {rank}, replica {replica})", flush=True)
    finally:
        if recorder is not None:
            recorder.close()
    if rank == 0:
        print(f"{args.schedule}: {args.steps} steps in {time.perf_counter() - t0:.2f} s on {ranks} ranks", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
