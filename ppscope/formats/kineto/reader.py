"""Read PyTorch profiler (Kineto) traces, one JSON or JSON.gz file per rank, as one Trace.

Events are streamed out of `traceEvents` a chunk of text at a time (`decode.py`), so a large file is
never held as one list of dicts; a job's large files are read by worker processes, one file each. GPU events
(pid = device, tid = stream) go on `stream N` lanes of their file's rank; kernels whose name starts with
`nccl` are communication; `ProfilerStep#N` annotations become steps, and GPU work inherits the step of the
CPU launch that issued it (matched on the correlation id). `ts` is taken as relative to
`baseTimeNanoseconds` when the file has one, else as absolute microseconds. CPU operator events (`cpu_op`,
`cuda_runtime`, `python_function`) are read for correlation only, not kept as spans.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, ErrorCode, UnsupportedInputError
from ppscope.formats.kineto.columns import Columns
from ppscope.formats.kineto.decode import ReadAhead, iter_event_batches
from ppscope.formats.kineto.decode import iter_trace_events as iter_trace_events
from ppscope.formats.kineto.groups import group_placement
from ppscope.formats.kineto.jobs import CLOCK_NOTE, JobFacts, one_job, refuse_empty
from ppscope.formats.kineto.times import NS_LIMIT
from ppscope.formats.ordering import order_stages
from ppscope.formats.pipelining.job import PipelineRank, cpu_compute, read_pipeline
from ppscope.formats.pipelining.rank import RankEvents, top_level
from ppscope.formats.spancolumns import spans_frame_of
from ppscope.pool import ordered, processes
from ppscope.trace.model import SPAN_COLUMNS, ClockInfo, RankInfo, RunMeta, Trace, spans_frame
from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["iter_trace_events", "load_kineto"]

_RANK_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclass
class _File:
    """One rank file read: its top-level keys, the spans ppscope keeps as they are, the pipeline's events."""

    top: dict[str, Any]
    spans: dict[str, Any]
    """Spans as columns (`Columns.spans`), without rank, stage, mb, chunk, phase, tokens or peer (GPU work,
    ranges, steps)."""
    events: RankEvents
    p2p: list[tuple[str, int]]
    gpu: bool
    """The file holds GPU activity: kernels are the compute, not the CPU operators."""


def _read_file(path: Path, source: ReadAhead | None = None) -> _File:
    """One rank file, times on the common clock (the file's base time added).

    The collector is paused meanwhile: the events decoded make no cycles, and what is kept (the columns'
    lists of names and ids) would otherwise be walked again and again by full collections as it grows (a
    quarter of the time of a 500 k-event file)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _read_events(path, source)
    finally:
        if paused:
            gc.enable()


def _read_events(path: Path, source: ReadAhead | None) -> _File:
    top: dict[str, Any] = {}
    cols = Columns(path)
    for batch in iter_event_batches(path, top, source):
        cols.add(batch)
    shift = _shift(path, top.get("baseTimeNanoseconds"))
    spans, ranges = cols.spans(shift)
    flows = np.concatenate(cols.flows) if cols.flows else np.zeros(0, np.int64)
    events = RankEvents(path.name, ranges, cols.operators(shift), flows + shift)
    return _File(top, spans, events, [(op, t + shift) for op, t in cols.p2p()], bool(cols.gpu["kind"]))


_PARALLEL_BYTES = 64 << 20
"""Below this much JSON in all, starting worker processes costs more than reading the files here."""


def _workers(paths: list[Path]) -> int:
    """Processes to read `paths` with: one per file up to the CPUs, when they are large enough to be worth it."""
    if len(paths) < 2 or sum(p.stat().st_size for p in paths) < _PARALLEL_BYTES:
        return 1
    return min(len(paths), os.cpu_count() or 1)


def _read_or_say(path: Path, alone: bool, source: ReadAhead | None = None) -> tuple[_File | None, str | None]:
    """`_read_file`, in a worker: (the file, None); (None, None) for a JSON file that is no trace; (None, why)
    for a damaged one. A file given alone raises instead: there is nothing else to read."""
    try:
        return _read_file(path, source), None
    except UnsupportedInputError:
        if alone:
            raise
        return None, None
    except CorruptFileError as exc:
        if alone:
            raise
        return None, str(exc)


def _read_here(paths: list[Path], alone: bool) -> Iterator[tuple[_File | None, str | None]]:
    """`_read_or_say` of each file in turn, in this process; the next file is inflated by a thread of its own
    meanwhile (`ReadAhead`: zlib works without the interpreter's lock), so that two cores share the work."""
    ahead: ReadAhead | None = None
    try:
        for i, path in enumerate(paths):
            source = ahead or ReadAhead(path)
            ahead = ReadAhead(paths[i + 1], after=source) if i + 1 < len(paths) else None
            yield _read_or_say(path, alone, source)
    finally:
        if ahead is not None:
            ahead.close()


def _shift(path: Path, base: Any) -> int:
    """The file's base time in ns (0 without one): `ts` is relative to it."""
    try:
        shift = int(base) if isinstance(base, (int, str)) and str(base).lstrip("-").isdecimal() else 0
    except ValueError:  # more digits than Python converts
        shift = NS_LIMIT
    if not -NS_LIMIT < shift < NS_LIMIT:
        raise CorruptFileError(
            ErrorCode.DAMAGED_FILE, f"{path}: baseTimeNanoseconds {base!r} is out of range; the trace is damaged"
        )
    return shift


def load_kineto(files: list[Path]) -> Trace:
    """The Kineto trace files (one per rank) as one Trace, ranks ordered into stages."""
    if not files:
        raise UnsupportedInputError(ErrorCode.NO_TRACES, "no Kineto trace files given")
    read: dict[int, _File] = {}
    warnings: list[Notice] = []
    skipped: list[str] = []
    damaged = 0
    paths = sorted(files)
    for path in paths:
        refuse_empty(path)
    workers = _workers(paths)
    if workers == 1:
        outcomes = list(_read_here(paths, len(files) == 1))
    else:
        with processes(workers) as pool:
            outcomes = list(ordered(pool, _read_or_say, [(p, False) for p in paths], workers))
    for i, (path, (data, said)) in enumerate(zip(paths, outcomes, strict=True)):
        if data is None:
            if said is None:
                skipped.append(path.name)  # another JSON file next to the traces (a config, a summary)
            else:  # one damaged file of a job: name it, read the others
                warnings.append(Notice(NoticeCode.DAMAGED_FILE, f"left out a damaged file, read the others: {said}"))
                damaged += 1
            continue
        _refuse_own_export(path, data.top)
        rank, notes = _rank_of(path, data.top, i)
        warnings += notes
        if rank in read:
            raise UnsupportedInputError(
                ErrorCode.DUPLICATE_RANK, f"{path}: rank {rank} appears in two files; give one file per rank"
            )
        read[rank] = data
    if not read:
        folder = Path(files[0]).parent
        raise UnsupportedInputError(
            ErrorCode.NO_TRACES, f"{folder} holds no traces: none of its JSON files has a traceEvents list"
        )
    if skipped:
        text = f"skipped {len(skipped)} JSON file(s) without traceEvents: {', '.join(skipped[:5])}"
        warnings.append(Notice(NoticeCode.SKIPPED_FILES, text))
    keep, notes = one_job({r: JobFacts(d.events.name, d.top, *_extent(d)) for r, d in read.items()})
    warnings += notes
    read = {r: read[r] for r in keep}
    if len(read) > 1:
        warnings.append(CLOCK_NOTE)
    evidence = [(rank, op, t) for rank, data in read.items() for op, t in data.p2p]
    groups, notes = group_placement({r: d.top for r, d in read.items()})
    warnings += notes
    if groups is not None and not set(read) <= set(groups.place):
        text = "some files' ranks are in no pipeline process group: took stages from the traffic instead"
        warnings.append(Notice(NoticeCode.GROUPS_INCOMPLETE, text))
        groups = None
    placed = groups.place if groups is not None else None
    pipeline = read_pipeline({r: PipelineRank(d.events, d.spans, d.gpu) for r, d in read.items()}, evidence, placed)
    if pipeline is not None:
        stage_of, per_rank = pipeline.stage_of, pipeline.spans
        warnings += pipeline.warnings
        explanation = "stages from the pipelining actions"
    elif groups is not None:
        stage_of, explanation = {r: groups.place[r][0] for r in read}, groups.explanation
        per_rank = {r: _plain(d, stage_of[r]) for r, d in read.items()}
    else:
        order = order_stages(read, evidence, {r: r for r in read}, "rank")
        warnings.append(order.notice)
        stage_of, explanation = order.stage_of, order.explanation
        per_rank = {r: _plain(d, stage_of[r]) for r, d in read.items()}
    spans = _all_spans(per_rank, stage_of)
    info: dict[str, Any] = next(
        (d.top["distributedInfo"] for d in read.values() if isinstance(d.top.get("distributedInfo"), dict)), {}
    )
    ranks = [
        RankInfo(rank=r, stage=stage_of[r], device="cuda" if read[r].gpu else "cpu", clock=ClockInfo(method="import"))
        for r in read
    ]
    if groups is not None:  # each rank's replica, and the ranks of the job whose files are not here
        place = groups.place
        ranks = [dataclasses.replace(i, replica=place[i.rank][1]) for i in ranks]
        ranks += [RankInfo(rank=r, stage=s, replica=rep) for r, (s, rep) in place.items() if r not in read]
    meta = RunMeta(
        run_id=Path(files[0]).parent.name if len(files) > 1 else Path(files[0]).name.split(".")[0],
        source="kineto",
        status="finished",
        world_size=groups.world_size if groups else len(read) + damaged,  # a damaged file's rank is missing
        pp_size=len({s for s, _ in groups.place.values()}) if groups else len(read) + damaged,  # a stage a file
        schedule=pipeline.schedule if pipeline else "",
        microbatches=pipeline.microbatches if pipeline else 0,
        chunks=pipeline.chunks if pipeline else 1,
        backend=str(info.get("backend", "")),
        ranks=sorted(ranks, key=lambda r: r.rank),
        config={
            "files": [str(f) for f in files],
            "distributedInfo": info,
            "stage_order": explanation,
            **({"replica_placement": groups.explanation} if groups else {}),
            **({"pipelining": pipeline.config} if pipeline else {}),
        },
    )
    return Trace(spans=spans, meta=meta, warnings=warnings).sorted()


def _extent(data: _File) -> tuple[int, int]:
    """The first start and last end of the file's events (0, 0 when it has none)."""
    starts = [c["start_ns"].min() for c in (data.spans, data.events.operators) if len(c["start_ns"])]
    ends = [c["end_ns"].max() for c in (data.spans, data.events.operators) if len(c["end_ns"])]
    return (int(min(starts)), int(max(ends))) if starts else (0, 0)


def _plain(data: _File, stage: int) -> pd.DataFrame | dict[str, Any]:
    """A rank's spans when the trace shows no pipelining actions: GPU work and ranges as they are, as columns
    (their stage, micro-batch, chunk, phase and peer filled in by `_all_spans`), and on a CPU trace a frame of
    them and its top-level operators as the compute."""
    if data.gpu:
        return data.spans
    spans = spans_frame_of(data.spans).assign(stage=stage, **_PLAIN)
    ops = top_level(data.events.ops)
    cpu = cpu_compute(ops, ops["tid"].mode().iloc[0] if len(ops) else None).drop(columns="tid")
    return pd.concat([spans, cpu.assign(stage=stage, step=-1, **_PLAIN)], ignore_index=True)


_PLAIN: dict[str, Any] = {"mb": -1, "chunk": 0, "phase": "", "peer": -1}
"""The columns of a span that no pipelining action places: none of them known."""


def _all_spans(per_rank: dict[int, pd.DataFrame | dict[str, Any]], stage_of: dict[int, int]) -> pd.DataFrame:
    """The ranks' spans as one frame of the schema in the canonical order (`Trace.sorted`), built once from
    each column's arrays (not a frame per rank and column), sorted before the text becomes pandas' (where a
    take costs most); a column a rank's spans lack is its rank, stage, no tokens or `_PLAIN`'s value."""
    columns: dict[str, Any] = {}
    for c, kind in SPAN_COLUMNS.items():
        kind = object if kind is str else kind
        parts = []
        for r, s in per_rank.items():
            fill = {"rank": r, "stage": stage_of[r], "tokens": 0, **_PLAIN}
            if c not in s:
                parts.append(np.full(len(s["start_ns"]), fill[c], dtype=kind))
            else:
                parts.append(s[c].to_numpy(dtype=kind) if isinstance(s, pd.DataFrame) else np.asarray(s[c], kind))
        columns[c] = np.concatenate(parts) if parts else np.zeros(0, kind)
    order = np.lexsort((columns["end_ns"], columns["rank"], columns["start_ns"]))  # stable, as pandas sorts
    if (order != np.arange(len(order))).any():
        columns = {c: v[order] for c, v in columns.items()}
    return spans_frame(columns)


def _refuse_own_export(path: Path, top: dict[str, Any]) -> None:
    """ppscope's Chrome export is a view for Perfetto; read as a Kineto trace it would hold no spans at all."""
    other = top.get("otherData")
    if isinstance(other, dict) and "ppscope_run_id" in other:
        raise UnsupportedInputError(
            ErrorCode.NOT_A_TRACE,
            f"{path} is ppscope's Chrome/Perfetto export of run {other['ppscope_run_id']}, a view that ppscope "
            "does not read back: analyse the run directory it was exported from",
        )


def _rank_of(path: Path, top: dict[str, Any], index: int) -> tuple[int, list[Notice]]:
    """The rank the file says, in its `distributedInfo` or its name; else `index`, said so."""
    dist = top.get("distributedInfo")
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        return int(dist["rank"]), []
    m = _RANK_RE.search(path.name)
    if m:
        return int(m.group(1)), []
    text = f"{path.name}: no distributedInfo.rank and no rank in the file name; took rank {index}"
    return index, [Notice(NoticeCode.RANK_GUESSED, text)]
