"""`ppscope simulate`: predict a pipeline's timeline for a schedule, split and cost model."""

from __future__ import annotations

from typing import Any

from ppscope.commands._common import add_planned

HELP = "Predict a pipeline's timeline for a schedule, split and cost model"
EXAMPLE = "ppscope simulate --schedule gpipe --stages 4 --microbatches 8"


def register(sub: Any) -> None:
    add_planned(sub, "simulate", HELP, EXAMPLE)
