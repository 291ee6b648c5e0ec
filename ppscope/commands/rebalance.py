"""`ppscope rebalance`: advise the layer split that minimises the slowest stage."""

from __future__ import annotations

from typing import Any

from ppscope.commands._common import add_planned

HELP = "Advise the layer split that minimises the slowest stage"
EXAMPLE = "ppscope rebalance runs/r1"


def register(sub: Any) -> None:
    add_planned(sub, "rebalance", HELP, EXAMPLE)
