"""`ppscope demo`: run, find the bottleneck, rebalance, re-run and show the measured gain."""

from __future__ import annotations

from typing import Any

from ppscope.commands._common import add_planned

HELP = "Run, find the bottleneck, rebalance, re-run and show the measured gain"
EXAMPLE = "ppscope demo"


def register(sub: Any) -> None:
    add_planned(sub, "demo", HELP, EXAMPLE)
