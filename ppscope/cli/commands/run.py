"""`ppscope run`: run the pipeline-parallel engine and record every receive, forward and send.

A thin layer over `ppscope.engine.launch.run`; torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import time
from typing import Any

HELP = "Run the pipeline-parallel engine and record every receive, forward and send"
EXAMPLE = "ppscope run --stages 4 --schedule serve --out runs/r1"
EPILOG = f"""examples:
  {EXAMPLE}
  ppscope run --stages 4 --model synthetic --layers 16 --layer-cost-ms 2 --head-cost-ms 6 --schedule gpipe
  ppscope run --stages 2 --schedule interleaved --chunks 2 --split 2,2,2,2
  torchrun --nproc-per-node 8 -m ppscope run --stages 8 --model /models/llama --out /shared/runs/r1
"""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "run",
        help=HELP,
        description=f"{HELP}. Spawns one process per stage on this machine, or runs as one rank under torchrun.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_arguments(p)
    p.add_argument(
        "--profile-layers",
        action="store_true",
        help="after the run, time every layer, the embedding and the LM head + sampling on this device for a "
        "prefill and a decode pass, into the run's profile.json (what `ppscope rebalance RUN` balances on)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_run)


def add_engine_arguments(
    p: argparse.ArgumentParser, *, out_help: str = "run directory (default runs/<timestamp>; never overwritten)"
) -> None:
    """The options of one engine run (shared with `ppscope tune`)."""
    g = p.add_argument_group("pipeline")
    g.add_argument("--stages", type=int, default=2, help="pipeline stages = processes (default 2)")
    g.add_argument("--schedule", default="serve", help="gpipe | interleaved | serve (default serve)")
    g.add_argument(
        "--microbatches", type=int, default=0, help="micro-batches per step, gpipe/interleaved (default: stages)"
    )
    g.add_argument("--chunks", type=int, default=1, help="model chunks per rank, interleaved (default 1)")
    g.add_argument("--max-inflight", type=int, default=0, help="micro-batches in flight, serve (default: stages)")
    g.add_argument("--max-batch", type=int, default=1, help="requests per micro-batch, serve (default 1)")
    g.add_argument("--split", default=None, help="layer counts per (virtual) stage, e.g. 5,4,4,3 "
                   "(default: $PPSCOPE_PP_LAYER_PARTITION, else vLLM's rule)")  # fmt: skip
    g.add_argument("--backend", default="auto", help="auto | nccl | gloo (default auto: nccl with GPUs)")
    g.add_argument("--timeout", dest="timeout_s", type=float, default=60.0,
                   help="seconds a rank waits for a peer; a failure stops all within it (default 60)")  # fmt: skip
    m = p.add_argument_group("model")
    m.add_argument("--model", default="tiny", help="preset (tiny, llama3-8b, ...), `synthetic`, or a Hugging Face "
                   "Llama checkpoint directory (default tiny)")  # fmt: skip
    m.add_argument("--dtype", default="float32", help="float32 | float64 | bfloat16 | float16 (default float32)")
    m.add_argument("--layers", type=int, default=8, help="synthetic model: decoder layers (default 8)")
    m.add_argument("--layer-cost-ms", default="5", help="synthetic: ms per layer, one value or one per layer")
    m.add_argument("--embed-cost-ms", type=float, default=0.0, help="synthetic: ms of the embedding")
    m.add_argument("--head-cost-ms", type=float, default=0.0, help="synthetic: ms of the final norm + LM head")
    r = p.add_argument_group("requests")
    r.add_argument("--prompts", default=None, help='JSONL file, one {"prompt_ids": [...], "max_new_tokens": n} a line')
    r.add_argument("--requests", type=int, default=8, help="generated requests (default 8)")
    r.add_argument("--prompt-len", type=int, default=16, help="generated prompt length (default 16)")
    r.add_argument("--max-new-tokens", type=int, default=8, help="tokens to generate per request (default 8)")
    r.add_argument(
        "--rate", type=float, default=0.0, help="serve: Poisson arrivals per second (default 0: all at once)"
    )
    r.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    r.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (default 1)")
    r.add_argument("--seed", type=int, default=0, help="seeds weights, prompts, arrivals and sampling (default 0)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=None, help=out_help)
    o.add_argument("--no-record", dest="record", action="store_false", help="record nothing (overhead baseline)")
    o.add_argument("--no-nvtx", dest="nvtx", action="store_false", help="record spans without NVTX ranges")
    o.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def _run(args: argparse.Namespace) -> int:
    from ppscope.trace.outputs import check_output

    if args.out is not None:  # before torch loads (the run checks it again as it creates it)
        check_output(args.out, kind="run")
    # A Ctrl-C while torch loads can be swallowed by it or abort the process: it is held until torch is in,
    # then raised here, before anything is created.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, "pthread_sigmask") else None
    try:
        from ppscope.engine.config import EngineConfig
        from ppscope.engine.launch import run
    finally:
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    fields = {k: v for k, v in vars(args).items() if k not in ("func", "command", "json", "profile_layers")}
    cfg = EngineConfig(**fields)
    start = time.perf_counter()
    run_dir = run(cfg)
    wall_s = time.perf_counter() - start
    summary = _summary(run_dir, wall_s, cfg.inflight)
    if args.profile_layers and summary:  # rank 0 only under torchrun
        from ppscope.engine.profiler import profile_layers, write_profile

        summary["profile"] = str(write_profile(profile_layers(cfg), run_dir))
    if args.json:
        print(json.dumps(summary, indent=2))
    elif summary:
        print(
            f"run {summary['run_dir']}: {summary['requests']} requests, {summary['tokens']} tokens in "
            f"{summary['wall_s']:.2f} s ({summary['tokens_per_s']:.1f} tokens/s incl. start-up)\n"
            f"{_shape_line(summary)}\n"
            f"next: ppscope analyze {shlex.quote(str(summary['run_dir']))}"
        )
    return 0


_SOURCES = {"--split": "--split", "vllm-default": "vLLM's default rule"}


def _shape_line(summary: dict[str, Any]) -> str:
    """How the run was laid out: schedule, split and where it came from, micro-batches (and why fewer than
    asked: each holds at least one request)."""
    split = ",".join(map(str, summary["split"]))
    source = _SOURCES.get(summary["split_source"], summary["split_source"])
    n, asked = summary["microbatches"], summary["microbatches_asked"]
    what = "in flight" if summary["schedule"] == "serve" else "per step"
    stages = f"{summary['stages']} stage{'s' * (summary['stages'] != 1)}"
    line = f"{summary['schedule']} on {stages}, split {split} ({source}), {n} micro-batch{'es' * (n != 1)} {what}"
    if n < asked:
        line += f" (asked for {asked}; one per request at most)"
    return line


def _summary(run_dir: Any, wall_s: float, asked: int) -> dict[str, Any]:
    """`asked`: micro-batches per step or in flight the run was given (it runs at most one per request)."""
    import os

    from ppscope.trace.store import read_meta, read_requests

    if os.environ.get("RANK", "0") != "0" or not (run_dir / "meta.json").is_file():
        return {}  # under torchrun only rank 0 reports
    meta = read_meta(run_dir)
    reqs = read_requests(run_dir)
    tokens = int(reqs["output_len"].sum()) if len(reqs) else 0
    return {
        "run_dir": str(run_dir),
        "status": meta.status,
        "stages": meta.pp_size,
        "schedule": meta.schedule,
        "split": meta.split,
        "split_source": meta.split_source,
        "microbatches": meta.microbatches,
        "microbatches_asked": asked,
        "requests": len(reqs),
        "tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
    }
