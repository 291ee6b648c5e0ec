"""`ppscope analyze`: report bubbles, their causes and the bottleneck stage of a run or an nsys/Kineto trace."""

from __future__ import annotations

from typing import Any

from ppscope.commands._common import add_planned

HELP = "Report bubbles, their causes and the bottleneck stage of a run or an nsys/Kineto trace"
EXAMPLE = "ppscope analyze runs/r1"


def register(sub: Any) -> None:
    add_planned(sub, "analyze", HELP, EXAMPLE)
