"""`ppscope demo`: the whole loop on this machine, then the dashboard.

Runs the engine with its default split (or `--split`), finds the bottleneck, rebalances on per-layer costs timed
inside that run (docs/ARCHITECTURE.md, "The demo"), and where the advice is to change, runs the advised split
against the given one until the measurement decides, prints measured vs predicted gain and opens the dashboard
on both. With fewer than 2 GPUs the stages are emulated GPUs (Llama-3-8B on H100s by default: every part waits
the time the cost model gives it, scaled); `--model tiny` computes a tiny model on the CPUs instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ppscope.balance.modelled.gpus import DEFAULT_GPU
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.notices import Notice, NoticeCode

if TYPE_CHECKING:
    from ppscope.cli.argtypes import Subcommands
    from ppscope.engine.tuning import TuneResult

HELP = "Run, find the bottleneck, rebalance, re-run and show the measured gain, then open the dashboard"
EXAMPLE = "ppscope demo --no-dashboard"
EMULATED = "llama3-8b"
"""The model the demo emulates where there are fewer than 2 GPUs."""
DECIDE_WITHIN_S = 130.0
"""Seconds the pairs of runs may take to decide, after run 1 (the demo then takes about 2-3 minutes)."""
MOST_PAIRS = 5
TINY_LIMITS = (
    "the tiny model computes on this machine's CPUs, where the stages share cores with each other and with "
    "other programs, so what it measures is how the ranks compete for cores as much as how the pipeline is "
    "balanced; without --model the demo emulates GPU stages instead"
)


def register(sub: Subcommands) -> None:
    from ppscope.cli.commands.tune import add_tune_arguments
    from ppscope.cli.engine_options import add_option

    p: argparse.ArgumentParser = sub.add_parser("demo", help=HELP, description=f"{HELP}.", epilog=f"example: {EXAMPLE}")
    add_option(
        p,
        "--stages",
        default=None,
        help="pipeline stages (default 4 emulated; with --model on CPUs at most the cores; on GPUs one per GPU)",
    )
    add_option(
        p,
        "--model",
        default=None,
        help="compute this model instead of emulating one: a preset (tiny, ...), `synthetic` or a checkpoint "
        "directory (default: the emulated model, computed for real with 2 or more GPUs)",
    )
    add_option(p, "--emulate", default=None, help=f"the model preset to emulate (default {EMULATED})")
    add_option(p, "--gpu", default=None, help=f"the GPU the emulated stages stand for (default {DEFAULT_GPU})")
    add_option(p, "--split", help="layer counts per stage to start from, e.g. 1,7; sets --stages (vLLM's by default)")
    add_option(p, "--requests", default=None, help="requests (default 8 emulated, 16 computed)")
    add_option(p, "--max-new-tokens", default=None, help="tokens per request (default 40 emulated, 64 computed)")
    add_option(p, "--out", help="folder for the runs (default runs/demo-<timestamp>)")
    p.add_argument("--no-dashboard", dest="dashboard", action="store_false", help="do not open the dashboard")
    p.add_argument("--port", type=int, default=None, help="dashboard port (default 8501 or the next free one)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (progress goes to stderr)")
    add_tune_arguments(p, repeats=MOST_PAIRS, repeats_help="the most pairs of runs of both splits")
    p.set_defaults(func=run)


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def default_stages(emulated: bool) -> int:
    """4 emulated stages (waits hold no core); computed: one per GPU up to 4, else the CPU cores up to 4."""
    if emulated:
        return 4
    gpus = gpu_count()
    if gpus:
        return min(4, gpus) if gpus > 1 else 2
    return max(2, min(4, os.cpu_count() or 2))


def _setup(args: argparse.Namespace) -> tuple[dict[str, object], list[Notice]]:
    """The engine options the demo sets by default (dest -> value), and what it says of them: emulated GPU
    stages where there are fewer than 2 GPUs and no --model, the model computed otherwise."""
    emulated = args.model is None and gpu_count() < 2
    given: dict[str, object] = {}
    notes: list[Notice] = []
    if emulated:
        given.update(emulate=args.emulate or EMULATED, gpu=args.gpu or DEFAULT_GPU, model="tiny")
    else:
        if args.emulate or args.gpu:
            raise InvalidConfigError(
                ErrorCode.CONFLICTING_OPTIONS, "--emulate and --gpu need the emulated demo: drop --model, or drop them"
            )
        given.update(model=args.model or EMULATED, emulate="", gpu=DEFAULT_GPU)
        if given["model"] == "tiny" and gpu_count() == 0:
            notes.append(Notice(NoticeCode.DEMO_LIMITS, f"limits: {TINY_LIMITS}"))
    given["requests"] = args.requests or (8 if emulated else 16)
    given["max_new_tokens"] = args.max_new_tokens or (40 if emulated else 64)
    return given, notes


def demo_json(result: TuneResult) -> dict[str, object]:
    """The demo's answer first (predicted and measured speedups with their intervals, keep or change), then
    everything `ppscope tune --json` prints."""
    full = result.to_dict()
    keys = (
        "predicted_speedup",
        "predicted_interval",
        "measured_speedup",
        "measured_interval",
        "advice",
        "advice_reason",
        "realised_share_of_predicted_gain",
        "measurement",
        "emulated",
        "busy_cores_beside",
        "cost_source",
    )
    return {**{k: full[k] for k in keys}, "tune": full}


def _headline_toml(answer: dict[str, object]) -> str:
    """The figures the dashboard leads with, as TOML (numbers, a list of two, a word; a null is left out)."""
    keys = ("predicted_speedup", "measured_speedup", "measured_interval", "advice")
    return "".join(f"{k} = {json.dumps(answer[k])}\n" for k in keys if answer.get(k) is not None)


def dashboard_link(url: str, out: Path, result: TuneResult) -> str:
    """The dashboard opened on what the demo found: Compare of run 1 (A) and run 2 (B) where the advised split
    ran, else run 1's Timeline (labels as the dashboard lists a folder's runs: `folder/run`)."""
    from urllib.parse import urlencode

    def label(run_dir: Path) -> str:
        return f"{out.name}/{run_dir.name}"

    if result.after is None:
        query = {"section": "Timeline", "trace": label(result.before.run_dir)}
    else:
        query = {
            "section": "Compare",
            "trace": label(result.before.run_dir),
            "compare_with": label(result.after.run_dir),
        }
    return f"{url}/?{urlencode(query)}"


def run(args: argparse.Namespace) -> int:
    from ppscope.cli.engine_options import engine_config, split_option
    from ppscope.cli.tuning_report import print_tune
    from ppscope.engine.tuning import tune
    from ppscope.trace.outputs import check_output
    from ppscope.trace.store import DEMO_FILE

    split = split_option(args.split)
    given, said = _setup(args)
    stages = args.stages or len(split or ()) or default_stages(bool(given["emulate"]))
    # what the demo has no option for is as `ppscope run` has it by default
    cfg = engine_config(args, stages=stages, **given)
    out = check_output(str(cfg.output.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")), kind="runs")

    def step(msg: str) -> None:
        print(f"• {msg}", flush=True, file=sys.stderr if args.json else sys.stdout)

    for line in said:
        step(str(line))
    result = tune(
        cfg,
        out_dir=out,
        cost_source=args.costs,
        phase=args.phase,
        on_step=step,
        repeats=args.repeats,
        decide_within_s=DECIDE_WITHIN_S,
    )
    if said and args.json:  # the text has said it already, before run 1
        result = dataclasses.replace(result, notes=[*said, *result.notes])
    answer = demo_json(result)
    (out / DEMO_FILE).write_text(_headline_toml(answer), encoding="utf-8")  # the dashboard's Compare leads with it
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print_tune(result)
    if not args.dashboard:
        return 0
    from ppscope.cli.commands.dashboard import start_dashboard

    board = start_dashboard([str(out)], port=args.port, quiet=True)
    print(f"dashboard: {dashboard_link(board.url, out, result)}  (every run is listed there; Ctrl-C to stop)")
    try:
        return board.process.wait()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: 130, as every command that is interrupted
        board.stop()
        print("ppscope demo: stopped", file=sys.stderr)
        return 130
