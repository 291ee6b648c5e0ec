"""`ppscope export`: export a run to nsys SQLite, Chrome/Perfetto JSON or NVTXT."""

from __future__ import annotations

from typing import Any

from ppscope.commands._common import add_planned

HELP = "Export a run to nsys SQLite, Chrome/Perfetto JSON or NVTXT"
EXAMPLE = "ppscope export runs/r1 --format chrome --out r1.json.gz"


def register(sub: Any) -> None:
    add_planned(sub, "export", HELP, EXAMPLE)
