"""`ppscope run`: run the pipeline-parallel engine and record every receive, forward and send.

A thin layer over `ppscope.engine.launch.run`; torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from pathlib import Path

    from ppscope.cli.argtypes import Subcommands
    from ppscope.engine.config import EngineConfig

from ppscope.trace.schedules import Schedule

HELP = "Run the pipeline-parallel engine and record every receive, forward and send"
EXAMPLE = "ppscope run --stages 4 --schedule serve --out runs/r1"
EPILOG = f"""examples:
  {EXAMPLE}
  ppscope run --stages 4 --model synthetic --layers 16 --layer-cost-ms 2 --head-cost-ms 6 --schedule gpipe
  ppscope run --stages 2 --schedule interleaved --chunks 2 --split 2,2,2,2
  torchrun --nproc-per-node 8 -m ppscope run --stages 8 --model /models/llama --out /shared/runs/r1
"""


def register(sub: Subcommands) -> None:
    from ppscope.cli.commands.watch import add_metrics_arguments
    from ppscope.cli.engine_options import add_engine_arguments

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
    metrics = p.add_argument_group("live metrics (as `ppscope watch` serves them, for this run)")
    add_metrics_arguments(metrics, host_flag="--prometheus-host", window_flag="--prometheus-window", required=False)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ppscope.trace.outputs import check_output

    if args.out is not None:  # before torch loads (the run checks it again as it creates it)
        check_output(args.out, kind="run")
    # A Ctrl-C while torch loads can be swallowed by it or abort the process: it is held until torch is in,
    # then raised here, before anything is created.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, "pthread_sigmask") else None
    try:
        from ppscope.engine.launch import run
    finally:
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    from ppscope.cli.engine_options import engine_config

    cfg = engine_config(args)
    from ppscope.balance.modelled.shapes import renamed_note

    if (note := renamed_note(str(getattr(args, "model", "") or ""))) is not None:
        print(f"ppscope run: note: {note.text}", file=sys.stderr)  # the engine builds the renamed preset
    start = time.perf_counter()
    with _live_metrics(args, cfg) as cfg:
        run_dir = run(cfg)
    wall_s = time.perf_counter() - start
    summary = _summary(run_dir, wall_s, cfg.pipeline.inflight)
    if args.profile_layers and summary:  # rank 0 only under torchrun
        from ppscope.engine.profiler import profile_layers, write_profile

        summary["profile"] = str(write_profile(profile_layers(cfg), run_dir))
    if args.json:
        print(json.dumps(summary, indent=2))
    elif summary:
        rate, with_startup = summary["throughput_tokens_per_s"], summary["throughput_tokens_per_s_incl_startup"]
        print(
            f"run {summary['run_dir']}: {summary['requests']} requests, {summary['tokens']} tokens: "
            f"{_rate(rate)} from first arrival to last finish (as `ppscope analyze` reports "
            f"it); {summary['wall_s']:.2f} s in all with start-up, {_rate(with_startup)}\n"
            f"{_shape_line(summary)}\n"
            + (f"engine: {cfg.emulate.text()}\n" if cfg.emulate.on else "")
            + f"next: ppscope analyze {shlex.quote(str(summary['run_dir']))}"
        )
    return 0


@contextlib.contextmanager
def _live_metrics(args: argparse.Namespace, cfg: EngineConfig) -> Iterator[EngineConfig]:
    """With --prometheus-port, serve the run's live metrics while it runs (a watcher thread follows the run
    directory, as `ppscope watch` does) and stop once the watcher has read how it ended. Yields the config, with
    the run directory settled beforehand so that the watcher knows where to look."""
    if args.prometheus_port is None:
        yield cfg
        return
    from ppscope.cli.commands.watch import check_seconds
    from ppscope.cli.exporter import BackgroundWatch, Exporter, is_loopback
    from ppscope.engine.launch import under_torchrun
    from ppscope.engine.worker import default_run_dir
    from ppscope.errors import ErrorCode, InvalidConfigError

    check_seconds(args.metrics_window, "--prometheus-window")
    if under_torchrun():
        raise InvalidConfigError(
            ErrorCode.CONFLICTING_OPTIONS,
            "--prometheus-port serves a run started here; under torchrun, serve the run with `ppscope watch RUN "
            "--prometheus-port PORT` on a machine that sees its run directory",
        )
    out = cfg.output.out or default_run_dir()
    cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, out=out))
    exporter = Exporter(args.prometheus_host, args.prometheus_port)
    print(f"ppscope run: serving live metrics at {exporter.url}", file=sys.stderr, flush=True)
    if not is_loopback(args.prometheus_host):
        print(
            f"ppscope run: warning: listening on {args.prometheus_host}: anyone who can reach this machine can "
            "read these metrics",
            file=sys.stderr,
        )
    watch = BackgroundWatch(out, exporter, window_s=args.metrics_window, interval_s=1.0)
    try:
        yield cfg
    finally:
        watch.finish()
        exporter.close()
        if watch.error:
            print(f"ppscope run: warning: live metrics stopped early: {watch.error}", file=sys.stderr)


_SOURCES = {"--split": "--split", "vllm-default": "vLLM's default rule"}


class _Summary(TypedDict, total=False):
    """`ppscope run --json`: what the run did, from its metadata and request log; empty on ranks other than 0
    under torchrun (rank 0 reports)."""

    run_dir: str
    status: str
    pp_size: int
    schedule: str
    split: list[int]
    split_source: str
    microbatches: int
    microbatches_asked: int
    requests: int
    tokens: int
    wall_s: float
    throughput_tokens_per_s: float | None
    throughput_tokens_per_s_incl_startup: float | None
    profile: str
    """With --profile-layers: the profile.json written."""


def _shape_line(summary: _Summary) -> str:
    """How the run was laid out: schedule, split and where it came from, micro-batches (and why fewer than
    asked: each holds at least one request)."""
    split = ",".join(map(str, summary["split"]))
    source = _SOURCES.get(summary["split_source"], summary["split_source"])
    n, asked = summary["microbatches"], summary["microbatches_asked"]
    what = "in flight" if summary["schedule"] == Schedule.SERVE else "per step"
    stages = f"{summary['pp_size']} stage{'s' * (summary['pp_size'] != 1)}"
    line = f"{summary['schedule']} on {stages}, split {split} ({source}), {n} micro-batch{'es' * (n != 1)} {what}"
    if n < asked:
        line += f" (asked for {asked}; one per request at most)"
    return line


def _summary(run_dir: Path, wall_s: float, asked: int) -> _Summary:
    """`asked`: micro-batches per step or in flight the run was given (it runs at most one per request)."""
    import os

    from ppscope.analysis.latency import request_latency
    from ppscope.trace.store import read_meta, read_requests

    if os.environ.get("RANK", "0") != "0" or not (run_dir / "meta.json").is_file():
        return {}  # under torchrun only rank 0 reports
    meta = read_meta(run_dir)
    reqs = read_requests(run_dir)
    tokens = int(reqs["output_len"].sum()) if len(reqs) else 0
    latency = request_latency(reqs, len(reqs))
    return {
        "run_dir": str(run_dir),
        "status": meta.status,
        "pp_size": meta.pp_size,
        "schedule": meta.schedule,
        "split": meta.split,
        "split_source": meta.split_source,
        "microbatches": meta.microbatches,
        "microbatches_asked": asked,
        "requests": len(reqs),
        "tokens": tokens,
        "wall_s": wall_s,
        "throughput_tokens_per_s": latency.tokens_per_s if latency is not None else None,
        "throughput_tokens_per_s_incl_startup": tokens / wall_s if wall_s > 0 else None,
    }


def _rate(tokens_per_s: float | None) -> str:
    return "– tokens/s (no request finished)" if tokens_per_s is None else f"{tokens_per_s:,.1f} tokens/s"
