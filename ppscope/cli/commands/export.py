"""`ppscope export`: export a run or an imported trace to nsys SQLite, Chrome/Perfetto JSON or NVTXT."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ppscope.formats import EXPORT_FORMATS as FORMATS

if TYPE_CHECKING:
    from ppscope.cli.argtypes import Subcommands

HELP = "Export a run to nsys SQLite, Chrome/Perfetto JSON or NVTXT"
EXAMPLE = "ppscope export runs/r1 --format chrome --out r1.json.gz"
_DEFAULT_SUFFIX = {"nsys-sqlite": ".nsys.sqlite", "chrome": ".trace.json.gz", "nvtxt": "-nvtxt"}

_DESCRIPTION = (
    f"{HELP}. INPUT is anything ppscope reads (a run directory, an nsys .sqlite export, a Kineto JSON/JSON.gz "
    "file or a directory of them), recognised by content. nsys-sqlite writes the tables of `nsys export --type "
    "sqlite` (NVTX ranges + a launch and a kernel row per compute/communication span); chrome writes Chrome "
    "trace JSON for Perfetto (gzip when --out ends in .gz); nvtxt writes one NVTXT file per rank into the --out "
    "directory (best effort: not checked against Nsight itself). Nothing inside the input or any run is "
    "written; an existing output is replaced only with --force (nvtxt: only an earlier export)."
)


def register(sub: Subcommands) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "export", help=HELP, description=_DESCRIPTION, epilog=f"example: {EXAMPLE}"
    )
    p.add_argument("input", metavar="INPUT", help="a run directory, an nsys .sqlite export or a Kineto trace")
    p.add_argument("--format", choices=FORMATS, default=None, help="output format (required)")
    p.add_argument("--out", metavar="PATH", help="output file (nvtxt: directory); default: INPUT's name + suffix")
    p.add_argument("--force", action="store_true", help="replace an existing output (never one inside a run)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ppscope.errors import ErrorCode, InvalidConfigError
    from ppscope.formats import export_run, export_trace
    from ppscope.formats.detect import InputKind, detect
    from ppscope.formats.nvtxt import NVTXT_FILES
    from ppscope.formats.sources import open_trace
    from ppscope.trace.outputs import check_output

    found = detect(args.input)  # cheap: names a missing or unreadable input before anything else
    if args.format is None:
        raise InvalidConfigError(ErrorCode.MISSING_OPTION, f"give --format, one of {', '.join(FORMATS)}")
    src = Path(args.input)
    given = args.out if args.out is not None else src.name.split(".")[0] + _DEFAULT_SUFFIX[args.format]
    out = check_output(  # before reading: a refused --out costs nothing
        given,
        kind="folder" if args.format == "nvtxt" else "file",
        inputs=[src, *found.files],
        force=args.force,
        replaceable=NVTXT_FILES,
    )
    if found.kind == InputKind.RUN:  # rank by rank where the format allows
        print(f"wrote {export_run(found.path, args.format, out, force=args.force)}")
        return 0
    trace = open_trace(src)
    for warning in trace.warnings:
        print(f"ppscope export: note: {warning}", file=sys.stderr)
    written = export_trace(trace, args.format, out, force=args.force)
    print(f"wrote {written}")
    return 0
