"""`ppscope run`: run the pipeline-parallel engine and record every receive, forward and send."""

from __future__ import annotations

from typing import Any

from ppscope.commands._common import add_planned

HELP = "Run the pipeline-parallel engine and record every receive, forward and send"
EXAMPLE = "ppscope run --stages 4 --schedule serve --out runs/r1"


def register(sub: Any) -> None:
    add_planned(sub, "run", HELP, EXAMPLE)
