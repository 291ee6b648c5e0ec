"""`ppscope tune`: run the engine, measure costs, rebalance, re-run with the advised split, compare.

Takes the same options as `ppscope run` (it reuses its parser) plus where costs come from.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ppscope.cli.argtypes import Subcommands

from ppscope.trace.actions import Phase

HELP = "Run, measure per-layer costs, rebalance, re-run with the advised split and compare measured vs predicted"
EXAMPLE = "ppscope tune --stages 4 --model synthetic --layers 8 --layer-cost-ms 5 --head-cost-ms 15"


def register(sub: Subcommands) -> None:
    from ppscope.cli.engine_options import add_engine_arguments

    p: argparse.ArgumentParser = sub.add_parser(
        "tune",
        help=HELP,
        description=f"{HELP}. Run 1 uses the split as given (default: vLLM's rule); run 2 the advised one.",
        epilog=f"example: {EXAMPLE}",
    )
    add_engine_arguments(p, out_help="folder for both runs (default runs/tune-<timestamp>; never overwritten)")
    add_tune_arguments(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def add_tune_arguments(
    p: argparse.ArgumentParser, repeats: int = 1, repeats_help: str = "runs of each split, pair by pair in ABBA order"
) -> None:
    p.add_argument(
        "--costs",
        default="insitu",
        choices=("insitu", "profile", "fit"),
        help="insitu: each layer timed inside run 1, every K-th pass (--layer-spans, default); profile: "
        "each layer timed alone on the device, cold; fit: from run 1's stage spans",
    )
    p.add_argument(
        "--phase",
        default=Phase.DECODE.value,
        choices=(Phase.DECODE.value, Phase.PREFILL.value),
        help="which pass to balance for (default decode: it dominates serving)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=repeats,
        help=f"{repeats_help}; the measured gain is the median pair's (default {repeats})",
    )


def run(args: argparse.Namespace) -> int:
    from ppscope.cli.engine_options import engine_config
    from ppscope.cli.tuning_report import print_tune
    from ppscope.engine.tuning import tune
    from ppscope.trace.outputs import check_output

    cfg = engine_config(args)
    out = check_output(str(cfg.output.out or Path("runs") / time.strftime("tune-%Y%m%d-%H%M%S")), kind="runs")
    result = tune(
        cfg, out_dir=out, cost_source=args.costs, phase=args.phase, on_step=_say(args.json), repeats=args.repeats
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_tune(result)
    return 0


def _say(quiet: bool) -> Callable[[str], None]:
    def step(msg: str) -> None:
        if not quiet:
            print(f"• {msg}", flush=True)

    return step
