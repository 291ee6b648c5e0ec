"""`ppscope plan`: plan memory per stage and the TP x PP layout for a model and cluster."""

from __future__ import annotations

from typing import Any

from ppscope.commands._common import add_planned

HELP = "Plan memory per stage and the TP x PP layout for a model and cluster"
EXAMPLE = "ppscope plan --model llama3-70b --gpus 8"


def register(sub: Any) -> None:
    add_planned(sub, "plan", HELP, EXAMPLE)
