"""Read AMD Primus' pipeline dumps (its `--dump_pp_data` option, the input of its pp_vis tool) as a Trace.

A dump is a folder of `pp_rank_N.json` files, one per pipeline stage (data-parallel rank 0 only), and a
`config.json` with the job's sizes (`pp_size`, `vp_size`, `num_mbs`, ...). Each rank file maps an iteration
number to that iteration's `fwd_start` / `fwd_end`, `bwd_start` / `bwd_end` and, with zero-bubble schedules,
`wgrad_start` / `wgrad_end` lists: ms since the rank's own iteration start (CUDA events), with
`*_minibatch` and `*_chunk` lists in newer Primus versions, and the iteration's `total` ms. The files are
small (a few numbers per micro-batch) and read whole. The dump times compute only: no send, receive or
optimizer, so idle time is `unknown` to the analysis.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from ppscope.errors import CorruptFileError, ErrorCode, UnsupportedInputError
from ppscope.trace.actions import ActionType
from ppscope.trace.model import ClockInfo, RankInfo, RunMeta, SpanKind, Trace, spans_frame
from ppscope.trace.notices import Notice, NoticeCode

__all__ = ["CONFIG_NAME", "RANK_FILE", "load_primus"]

RANK_FILE = re.compile(r"^pp_rank_(\d+)\.json$")
CONFIG_NAME = "config.json"
_PASSES = (
    ("fwd", SpanKind.FORWARD, ActionType.FORWARD.value),
    ("bwd", SpanKind.BACKWARD, ActionType.FULL_BACKWARD.value),
    ("wgrad", SpanKind.BACKWARD, ActionType.BACKWARD_WEIGHT.value),
)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(ErrorCode.NOT_JSON, f"{path}: not readable JSON ({exc}); copy the dump again") from None


def load_primus(files: list[Path]) -> Trace:
    """The dump's rank files (and its `config.json`, when among them or beside them) as one Trace."""
    ranks = {int(m.group(1)): f for f in files if (m := RANK_FILE.match(f.name))}
    if not ranks:
        raise UnsupportedInputError(
            ErrorCode.NOT_A_TRACE, f"{files[0]}: no pp_rank_N.json file: not a Primus pipeline dump"
        )
    config_path = next((f for f in files if f.name == CONFIG_NAME), ranks[min(ranks)].parent / CONFIG_NAME)
    config = _read_json(config_path) if config_path.is_file() else {}
    config = config if isinstance(config, dict) else {}
    dumps = {r: _read_json(f) for r, f in sorted(ranks.items())}
    stages = max(_size(config, "pp_size", max(ranks) + 1), max(ranks) + 1)
    chunks = _size(config, "vp_size", 1)
    offsets = _iteration_offsets(dumps)
    rows: dict[str, list[Any]] = {c: [] for c in ("rank", "stage", "kind", "mb", "step", "chunk", "phase")}
    times: list[tuple[float, float]] = []
    guessed = False
    for rank, dump in dumps.items():
        if not isinstance(dump, dict):
            raise CorruptFileError(
                ErrorCode.DAMAGED_FILE, f"{ranks[rank]}: not an object of iterations; not a Primus pipeline dump"
            )
        for key, it in dump.items():
            step = _step(key)
            if step is None or not isinstance(it, dict):
                continue
            try:
                guessed |= _one_iteration(rows, times, it, (rank, step, offsets[step]), (stages, chunks))
            except (TypeError, ValueError, OverflowError) as exc:
                raise CorruptFileError(
                    ErrorCode.DAMAGED_FILE,
                    f"{ranks[rank]}: iteration {key} holds a value that is no time or id ({exc}); "
                    "not a Primus pipeline dump, or a damaged one",
                ) from None
    if not times:
        raise UnsupportedInputError(
            ErrorCode.NO_SPANS, f"{ranks[min(ranks)].parent}: the Primus dump holds no timed pass"
        )
    ms = np.array(times, np.float64)
    if not (np.isfinite(ms).all() and (np.abs(ms) < 1e11).all() and (ms[:, 1] >= ms[:, 0]).all()):
        raise CorruptFileError(
            ErrorCode.DAMAGED_FILE,
            f"{ranks[min(ranks)].parent}: the Primus dump holds pass times that are not finite ms, or end before "
            "they start; copy the dump again",
        )
    return Trace(
        spans=_frame(rows, times),
        meta=_meta(ranks, config, (stages, chunks), rows, times),
        warnings=_notes(guessed),
    ).sorted()


def _size(config: dict[str, Any], key: str, default: int) -> int:
    """A positive size from `config.json`, `default` where it says none (or nonsense)."""
    value = config.get(key)
    return value if type(value) is int and 0 < value < 1 << 20 else default


def _step(key: Any) -> int | None:
    return int(key) if isinstance(key, str) and key.isdigit() else None


def _iteration_offsets(dumps: dict[int, Any]) -> dict[int, float]:
    """Each iteration's start in ms: each rank times from its own iteration start, so iterations are laid
    end to end, each as long as its longest rank's `total`."""
    totals: dict[int, float] = {}
    for dump in dumps.values():
        for key, it in dump.items() if isinstance(dump, dict) else []:
            step = _step(key)
            total: Any = it.get("total") if isinstance(it, dict) else None
            if step is not None and type(total) in (int, float) and abs(total) < 1e12:
                totals[step] = max(totals.get(step, 0.0), float(total))
    steps = sorted({s for d in dumps.values() if isinstance(d, dict) for k in d if (s := _step(k)) is not None})
    offsets, at = {}, 0.0
    for s in steps:
        offsets[s] = at
        at += totals.get(s, 0.0)
    return offsets


def _one_iteration(
    rows: dict[str, list[Any]],
    times: list[tuple[float, float]],
    it: dict[str, Any],
    where: tuple[int, int, float],
    sizes: tuple[int, int],
) -> bool:
    """Add one rank's iteration's passes; True when micro-batch ids were not in the dump (taken in order)."""
    rank, step, offset = where
    stages, chunks = sizes
    guessed = False
    for prefix, kind, phase in _PASSES:
        starts, ends, mbs, chunk_of = (_list(it, f"{prefix}_{k}") for k in ("start", "end", "minibatch", "chunk"))
        guessed |= bool(starts) and len(mbs) < len(starts)
        for i, (a, b) in enumerate(zip(starts, ends, strict=False)):
            chunk = _id(chunk_of[i]) if i < len(chunk_of) else 0
            rows["rank"].append(rank)
            rows["stage"].append(chunk * stages + rank if chunks > 1 else rank)
            rows["kind"].append(str(kind))
            rows["mb"].append(_id(mbs[i]) if i < len(mbs) else i)
            rows["step"].append(step)
            rows["chunk"].append(chunk)
            rows["phase"].append(phase if prefix != "bwd" or not it.get("wgrad_start") else "I")
            times.append((offset + float(a), offset + float(b)))
    return guessed


def _list(it: dict[str, Any], key: str) -> list[Any]:
    """A list the iteration holds under `key`; none where it holds something else."""
    value = it.get(key)
    return value if isinstance(value, list) else []


def _id(value: Any) -> int:
    """A micro-batch or chunk id; ValueError for anything but a whole number in int32's range."""
    if type(value) not in (int, float) or value != int(value) or not -(1 << 31) < value < 1 << 31:
        raise ValueError(f"{value!r} is no id")
    return int(value)


def _frame(rows: dict[str, list[Any]], times: list[tuple[float, float]]) -> Any:
    ms = np.array(times, np.float64).reshape(-1, 2)
    ns = np.rint(ms * 1e6).astype(np.int64)
    n = len(ns)
    columns: dict[str, Any] = {
        **{c: np.array(rows[c], np.int64) for c in ("rank", "stage", "mb", "step", "chunk")},
        "kind": rows["kind"],
        "phase": rows["phase"],
        "name": [f"{k} {p}" for k, p in zip(rows["kind"], rows["phase"], strict=True)],
        "lane": ["compute"] * n,
        "start_ns": ns[:, 0],
        "end_ns": ns[:, 1],
        "nbytes": np.zeros(n, np.int64),
        "tokens": np.zeros(n, np.int64),
        "peer": np.full(n, -1, np.int64),
    }
    return spans_frame(columns)


def _meta(
    ranks: dict[int, Path],
    config: dict[str, Any],
    sizes: tuple[int, int],
    rows: dict[str, Any],
    times: list[tuple[float, float]],
) -> RunMeta:
    stages, chunks = sizes
    keys = zip(*(rows[k] for k in ("rank", "step", "chunk", "mb", "kind")), strict=True)
    counts: dict[tuple[int, int, int], int] = {}
    for r, s, c, _ in {(r, s, c, m) for r, s, c, m, k in keys if k == str(SpanKind.FORWARD)}:
        counts[(r, s, c)] = counts.get((r, s, c), 0) + 1
    clock = ClockInfo(method="import")
    return RunMeta(
        run_id=ranks[min(ranks)].parent.name,
        source="primus",
        status="finished",
        world_size=stages,
        pp_size=stages,
        schedule=_schedule(rows, times, chunks),
        microbatches=int(config.get("num_mbs") or 0) or max(counts.values(), default=0),
        chunks=chunks,
        ranks=[RankInfo(rank=r, stage=r, device="cuda", clock=clock) for r in range(stages)],
        config={"files": [str(f) for f in ranks.values()], "primus": config},
    )


def _schedule(rows: dict[str, Any], times: list[tuple[float, float]], chunks: int) -> str:
    """`interleaved-1f1b` with several chunks; `1f1b` where a rank starts a backward before its step's last
    forward; else `gpipe`."""
    if chunks > 1:
        return "interleaved-1f1b"
    first_b: dict[tuple[int, int], float] = {}
    last_f: dict[tuple[int, int], float] = {}
    for r, s, k, (start, _) in zip(rows["rank"], rows["step"], rows["kind"], times, strict=True):
        if k == str(SpanKind.FORWARD):
            last_f[(r, s)] = max(last_f.get((r, s), start), start)
        else:
            first_b[(r, s)] = min(first_b.get((r, s), start), start)
    return "1f1b" if any(first_b.get(key, t) < t for key, t in last_f.items()) else "gpipe"


def _notes(guessed: bool) -> list[Notice]:
    text = (
        "each rank's times are from its own iteration start (Primus' CUDA events): iterations are laid end to "
        "end, each as long as its longest rank's total, and ranks line up only at iteration starts"
    )
    notes = [Notice(NoticeCode.IMPORT_CLOCKS, text)]
    if guessed:
        text = "the dump has no *_minibatch lists (an older Primus): micro-batches numbered in each pass's order"
        notes.append(Notice(NoticeCode.PRIMUS_MICROBATCHES_GUESSED, text))
    return notes
