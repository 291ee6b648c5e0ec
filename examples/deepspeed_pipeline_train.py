"""Train a small model with DeepSpeed's pipeline engine under the PyTorch profiler, for ppscope to read.

DeepSpeed's `PipelineModule` with its 1F1B `TrainSchedule`, one stage per rank, on CPU over gloo (DeepSpeed
picks its CPU accelerator itself where there is no GPU). Run it under torchrun:

    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        examples/deepspeed_pipeline_train.py --steps 3 --microbatches 8 --profile traces/ds

Each rank writes its Kineto trace to `DIR/rank-N.json.gz`. The profiler is a plain `profile()` wrapped round
the `train_batch()` calls, never stepped, as a user wraps a few steps: the trace holds no `ProfilerStep#N`
range and no DeepSpeed instruction names, only the operators, gloo's ranges and the optimizer's step.
The optimizer is a plain torch SGD (DeepSpeed's own Adam needs a compiled op). Needs `pip install
deepspeed` (the `capture` extra); its first start builds a shared-memory op (about 40 s, cached after).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """A pre-norm MLP block with a residual; a pipeline layer takes and gives one tensor."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        return x + self.mlp(self.norm(x))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3, help="train_batch() calls profiled (3)")
    p.add_argument("--warmup", type=int, default=1, help="train_batch() calls before the profiler starts (1)")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per step (8)")
    p.add_argument("--mb-size", type=int, default=2, help="sequences per micro-batch (2)")
    p.add_argument("--layers", type=int, default=4, help="blocks, split evenly over the stages (4)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq", type=int, default=32, help="tokens per sequence (32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", metavar="DIR", help="write a Kineto trace per rank, DIR/rank-N.json.gz")
    return p.parse_args(argv)


def batches(args: argparse.Namespace) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Micro-batches of (tokens, next tokens), the same on every rank: (mb, seq) each."""
    gen = torch.Generator().manual_seed(args.seed)
    while True:
        tokens = torch.randint(0, args.vocab, (args.mb_size, args.seq + 1), generator=gen)
        yield tokens[:, :-1], tokens[:, 1:]


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if "LOCAL_RANK" not in os.environ:
        sys.exit("run under torchrun: python -m torch.distributed.run --nproc-per-node 2 " + sys.argv[0])
    import deepspeed
    from deepspeed.pipe import PipelineModule

    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(args.seed)
    layers = [
        nn.Embedding(args.vocab, args.dim),
        *(Block(args.dim) for _ in range(args.layers)),
        nn.LayerNorm(args.dim),
        nn.Linear(args.dim, args.vocab),
    ]
    model = PipelineModule(layers=layers, num_stages=ranks, loss_fn=loss_fn, partition_method="uniform")
    config = {
        "train_micro_batch_size_per_gpu": args.mb_size,
        "gradient_accumulation_steps": args.microbatches,
        "steps_per_print": 10**9,
    }
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optim, config=config)
    data = batches(args)
    for _ in range(args.warmup):
        engine.train_batch(data_iter=data)
    t0 = time.perf_counter()
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            losses = [engine.train_batch(data_iter=data) for _ in range(args.steps)]
        prof.export_chrome_trace(str(Path(args.profile) / f"rank-{rank}.json.gz"))
    else:
        losses = [engine.train_batch(data_iter=data) for _ in range(args.steps)]
    if rank == 0:
        shown = ", ".join(f"{float(loss):.4f}" for loss in losses)
        print(f"{args.steps} steps in {time.perf_counter() - t0:.2f} s on {ranks} ranks; loss {shown}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
