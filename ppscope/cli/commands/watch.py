"""`ppscope watch`: follow a run directory as it is written and serve its live metrics to Prometheus.

A thin layer over `ppscope.live` (what the metrics are) and `ppscope.cli.exporter` (serving them);
prometheus_client and pandas are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from ppscope.errors import ErrorCode, InvalidConfigError

if TYPE_CHECKING:
    from types import FrameType

    from ppscope.cli.argtypes import Options, Subcommands

HELP = "Follow a run as it is written and serve its live metrics to Prometheus"
EXAMPLE = "ppscope watch runs/r1 --prometheus-port 9400  (then scrape http://127.0.0.1:9400/metrics)"
DEFAULT_WINDOW_S = 10.0
_DESCRIPTION = (
    f"{HELP}. Every --interval seconds it reads what the run wrote since (as the dashboard does), analyses its last "
    "--window seconds, and serves at http://HOST:PORT/metrics, in Prometheus' text format: bubble and busy ratio "
    "per stage, idle seconds by cause, hop latency histograms per link, tokens/s, the bottleneck stage and the "
    "predicted balance speedup (every metric is listed in the README, under `ppscope watch`). It stops when the run "
    "ends, or on Ctrl-C."
)


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "watch", help=HELP, description=_DESCRIPTION, epilog=f"example: {EXAMPLE}"
    )
    p.add_argument("run", metavar="RUN", help="a run directory (of `ppscope run`, or any program that records)")
    add_metrics_arguments(p, host_flag="--host", window_flag="--window", required=True)
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="seconds between updates (default 1)")
    p.add_argument(
        "--linger",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="once the run has ended, keep serving its last values this long, so a last scrape sees them (default 0)",
    )
    p.set_defaults(func=run)


def add_metrics_arguments(p: Options, *, host_flag: str, window_flag: str, required: bool) -> None:
    """--prometheus-port, the address and the window, on a parser or a group of one; `ppscope run` shares them,
    naming the last two --prometheus-host and --prometheus-window beside the engine's own options."""
    p.add_argument(
        "--prometheus-port",
        dest="prometheus_port",
        type=int,
        required=required,
        metavar="PORT",
        help="serve the metrics at http://HOST:PORT/metrics (0: any free port, printed)",
    )
    p.add_argument(
        host_flag,
        dest="prometheus_host",
        default="127.0.0.1",
        metavar="HOST",
        help="address to serve on (default 127.0.0.1: this machine only; 0.0.0.0 exposes them to every machine "
        "that reaches this one, without login)",
    )
    p.add_argument(
        window_flag,
        dest="metrics_window",
        type=float,
        default=DEFAULT_WINDOW_S,
        metavar="SECONDS",
        help=f"the sliding window the gauges describe, in seconds of the run (default {DEFAULT_WINDOW_S:g})",
    )


def check_seconds(value: float, flag: str, *, zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise InvalidConfigError(
            ErrorCode.BAD_VALUE,
            f"{flag} must be a {'non-negative' if zero else 'positive'} number of seconds, got {value}",
        )


def run(args: argparse.Namespace) -> int:
    from ppscope.cli.exporter import Exporter, is_loopback
    from ppscope.live.follow import RunFollower, follow
    from ppscope.trace.store import read_meta

    check_seconds(args.metrics_window, "--window")
    check_seconds(args.interval, "--interval")
    check_seconds(args.linger, "--linger", zero=True)
    read_meta(args.run)  # a path that is not a run is one line, before anything is served
    follower = RunFollower(args.run, window_s=args.metrics_window)
    exporter = Exporter(args.prometheus_host, args.prometheus_port)
    print(
        f"ppscope watch: serving the metrics of {args.run} at {exporter.url} (the last {args.metrics_window:g} s, "
        f"every {args.interval:g} s; Ctrl-C to stop)",
        flush=True,
    )
    if not is_loopback(args.prometheus_host):
        print(
            f"ppscope watch: warning: listening on {args.prometheus_host}: anyone who can reach this machine can "
            "read these metrics",
            file=sys.stderr,
        )
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as cleanly as Ctrl-C
    try:
        follow(follower, exporter.publish, interval_s=args.interval, stop=threading.Event())
        linger = f"; serving its last values for {args.linger:g} s" if args.linger else ""
        print(f"ppscope watch: the run has ended ({follower.meta.status}){linger}", flush=True)
        time.sleep(args.linger)
        print("ppscope watch: stopped", flush=True)
        return 0
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: 130, as every command that is interrupted
        print("ppscope watch: stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        exporter.close()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
