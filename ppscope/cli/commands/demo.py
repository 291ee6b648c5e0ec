"""`ppscope demo`: the whole loop on the default tiny model on this machine, then the dashboard.

Runs the engine with its default split (or `--split`), finds the bottleneck, rebalances on per-layer costs timed
inside that run (docs/ARCHITECTURE.md, "The demo"), re-runs with the advised split, prints measured vs predicted
gain and opens the dashboard on both runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ppscope.cli.argtypes import Subcommands
    from ppscope.engine.tuning import TuneResult

HELP = "Run, find the bottleneck, rebalance, re-run and show the measured gain, then open the dashboard"
EXAMPLE = "ppscope demo --no-dashboard"


def register(sub: Subcommands) -> None:
    from ppscope.cli.commands.tune import add_tune_arguments
    from ppscope.cli.engine_options import add_option

    p: argparse.ArgumentParser = sub.add_parser("demo", help=HELP, description=f"{HELP}.", epilog=f"example: {EXAMPLE}")
    add_option(p, "--stages", default=None, help="pipeline stages (default 4; without a GPU at most the CPU cores)")
    add_option(p, "--model", help="model preset, `synthetic` or a checkpoint directory (default tiny)")
    add_option(p, "--split", help="layer counts per stage to start from, e.g. 1,7; sets --stages (vLLM's by default)")
    add_option(p, "--requests", default=16, help="requests (default 16)")
    add_option(p, "--max-new-tokens", default=64, help="tokens per request (default 64)")
    add_option(p, "--out", help="folder for the runs (default runs/demo-<timestamp>)")
    p.add_argument("--no-dashboard", dest="dashboard", action="store_false", help="do not open the dashboard")
    p.add_argument("--port", type=int, default=None, help="dashboard port (default 8501 or the next free one)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (progress goes to stderr)")
    add_tune_arguments(p, repeats=3)  # one pair of runs on a busy machine can be 30% apart: the median of three
    p.set_defaults(func=run)


def default_stages() -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return min(4, torch.cuda.device_count()) if torch.cuda.device_count() > 1 else 2
    except ImportError:
        pass
    return max(2, min(4, os.cpu_count() or 2))


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
        "cost_source",
    )
    return {**{k: full[k] for k in keys}, "tune": full}


def run(args: argparse.Namespace) -> int:
    from ppscope.cli.engine_options import engine_config, split_option
    from ppscope.cli.tuning_report import print_tune
    from ppscope.engine.tuning import tune
    from ppscope.trace.outputs import check_output

    split = split_option(args.split)
    # what the demo has no option for is as `ppscope run` has it by default
    cfg = engine_config(args, stages=args.stages or len(split or ()) or default_stages())
    out = check_output(str(cfg.output.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")), kind="runs")

    def step(msg: str) -> None:
        print(f"• {msg}", flush=True, file=sys.stderr if args.json else sys.stdout)

    result = tune(cfg, out_dir=out, cost_source=args.costs, phase=args.phase, on_step=step, repeats=args.repeats)
    if args.json:
        print(json.dumps(demo_json(result), indent=2))
    else:
        print_tune(result)
    if not args.dashboard:
        return 0
    from ppscope.cli.commands.dashboard import start_dashboard

    board = start_dashboard([str(out)], port=args.port, quiet=True)
    print(f"dashboard: {board.url}  (both runs are listed there; Ctrl-C to stop)", flush=True)
    try:
        return board.process.wait()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: 130, as every command that is interrupted
        board.stop()
        print("ppscope demo: stopped", file=sys.stderr)
        return 130
