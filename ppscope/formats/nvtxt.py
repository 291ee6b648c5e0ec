"""Write a Trace as NVTXT, the NVTX text format Nsight imports to annotate a report: one file per rank.

Best effort: the file follows the NVTXT format as NVIDIA documents it (comments `#`, `Name = value`
variables, `@Instruction, Param, ...` implicit parameter lists, one instruction per line), but it has
NOT been checked against Nsight Systems' importer. Ranges are `RangeStartEnd` instructions (they need not
nest), one thread per lane, messages as the recorder writes them (`s2 forward mb5`), imported spans
under their own names. `read_nvtxt` reads back exactly the subset written here, for tests; it is not a
general NVTXT parser.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

from ppscope import __version__
from ppscope.errors import CorruptFileError, ErrorCode
from ppscope.formats.nsys.writer import ppscope_message
from ppscope.trace.model import SpanKind, Trace
from ppscope.trace.outputs import atomic_folder
from ppscope.trace.store import damaged_note, each_rank, run_files

__all__ = ["NVTXT_FILES", "NVTXT_NOTE", "export_nvtxt", "export_nvtxt_run", "nvtxt_message", "read_nvtxt"]

NVTXT_FILES = "rank-*.nvtxt"
"""What an NVTXT export folder holds: all that `--force` may replace."""
NVTXT_NOTE = "best effort: follows NVIDIA's NVTXT description; not checked against Nsight Systems' importer"
_RANGE = re.compile(r'^RangeStartEnd, (-?\d+), (-?\d+), ThreadId, "(.*)"$')
_MARK = re.compile(r'^Marker, (-?\d+), ThreadId, "(.*)"$')
_THREAD = re.compile(r"^ThreadId = (\d+)$")


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def export_nvtxt(trace: Trace, out: str | Path, *, force: bool = False) -> list[Path]:
    """Write `out/rank-<r>.nvtxt` for every rank. Refuses a non-empty `out` unless `force`, and even then one
    holding anything but an earlier export's `rank-*.nvtxt` files."""
    out = Path(out)
    with atomic_folder(out, force=force, replaceable=NVTXT_FILES) as tmp:
        for rank in trace.ranks:
            mine = trace.spans[trace.spans["rank"] == rank]
            (tmp / f"rank-{rank}.nvtxt").write_text(_rank_text(mine, trace.meta.run_id, rank))
    return [out / f"rank-{rank}.nvtxt" for rank in trace.ranks]


def export_nvtxt_run(run_dir: str | Path, out: str | Path, *, force: bool = False) -> list[Path]:
    """`export_nvtxt(load_run(run_dir))`, the same files, reading one rank file at a time: each rank's file
    needs only its own spans. A damaged rank file is left out and named on stderr, as `load_run` does."""
    meta, files, notes = run_files(run_dir)
    written: list[Path] = []
    damaged: dict[int, CorruptFileError] = {}
    with atomic_folder(Path(out), force=force, replaceable=NVTXT_FILES) as tmp:
        for rank, spans, _ in each_rank(files, meta, damaged, notes):
            if len(spans):
                (tmp / f"rank-{rank}.nvtxt").write_text(_rank_text(spans, meta.run_id, rank))
                written.append(Path(out) / f"rank-{rank}.nvtxt")
        if damaged and len(damaged) == len(files):
            raise next(iter(damaged.values()))
    for note in notes + [damaged_note(r, why) for r, why in sorted(damaged.items())]:
        print(f"ppscope export: note: {note}", file=sys.stderr)
    return written


def _rank_text(spans: pd.DataFrame, run_id: str, rank: int) -> str:
    """One rank's NVTXT file from its spans."""
    spans = spans.sort_values(["lane", "start_ns"], kind="stable")
    stages = sorted(int(s) for s in spans["stage"].unique() if s >= 0)
    stage = stages[0] if stages else -1
    pid = 1000 + rank
    lines = [
        f"# NVTXT written by ppscope {__version__}: rank {rank} / stage {stage} of run {run_id!r}",
        f"# {NVTXT_NOTE}",
        "# Times are integer ns on the run's common clock (the engine uses the host's monotonic clock).",
        f'SetFileDisplayName, "ppscope rank {rank} / stage {stage}"',
        "TimeBase = ClockMonotonicRaw",
        f"ProcessId = {pid}",
        "@RangeStartEnd, Start, End, ThreadId, Message",
        "@Marker, Time, ThreadId, Message",
    ]
    for i, (lane, group) in enumerate(spans.groupby("lane", sort=False)):
        lines.append(f"# lane {lane}")
        lines.append(f"ThreadId = {pid + i}")
        for s in group.itertuples(index=False):
            message = _quote(nvtxt_message(s.kind, s.name, s.stage, s.mb, s.chunk))
            if s.kind == SpanKind.MARK:
                lines.append(f'Marker, {int(s.start_ns)}, ThreadId, "{message}"')
            else:
                lines.append(f'RangeStartEnd, {int(s.start_ns)}, {int(s.end_ns)}, ThreadId, "{message}"')
    return "\n".join(lines) + "\n"


_IMPORTED_KINDS = frozenset({SpanKind.KERNEL, SpanKind.NCCL, SpanKind.MEMCPY, SpanKind.MEMSET, SpanKind.RANGE})


def nvtxt_message(kind: str, name: str, stage: int, mb: int, chunk: int) -> str:
    """The recorder's message (`s2 forward mb5`) for our spans; the original name for imported ones."""
    if kind in _IMPORTED_KINDS:
        return str(name)
    return ppscope_message(int(stage), str(kind), int(mb), int(chunk))


def read_nvtxt(path: str | Path) -> list[tuple[int, int, int, str]]:
    """(thread id, start ns, end ns, message) of every range and marker in a file written by ppscope."""
    out = []
    thread = -1
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line or line.startswith(("#", "@", "SetFileDisplayName")) or (" = " in line and not _THREAD.match(line)):
            continue
        if m := _THREAD.match(line):
            thread = int(m.group(1))
        elif m := _RANGE.match(line):
            out.append((thread, int(m.group(1)), int(m.group(2)), m.group(3).replace('\\"', '"')))
        elif m := _MARK.match(line):
            out.append((thread, int(m.group(1)), int(m.group(1)), m.group(2).replace('\\"', '"')))
        else:
            raise CorruptFileError(
                ErrorCode.DAMAGED_FILE, f"{path}:{lineno}: not an NVTXT line ppscope writes: {line[:60]!r}"
            )
    return out
