"""`ppscope dashboard`: open the live dashboard on a run, a folder of runs, or an imported trace."""

from __future__ import annotations

from typing import Any

from ppscope.commands._common import add_planned

HELP = "Open the live dashboard on a run, a folder of runs, or an imported trace"
EXAMPLE = "ppscope dashboard runs/"


def register(sub: Any) -> None:
    add_planned(sub, "dashboard", HELP, EXAMPLE)
