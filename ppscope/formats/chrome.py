"""Write a Trace as Chrome trace-event JSON for Perfetto and chrome://tracing.

One process per rank named `rank r / stage s` (sorted by stage), one thread per lane. Slices on one
thread must nest, so a lane whose spans overlap without nesting is split into `lane`, `lane #2`, ...
Each send gets a flow arrow to its matching receive (`ph` s/f, same id, cat and name, `bp: "e"`), and
counters become counter tracks (`ph` C). Times are µs relative to the first span with ns precision.
The file is gzipped when its name ends in `.gz`. This module does not read Chrome traces.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ppscope.formats._util import stack_levels
from ppscope.trace.model import SpanKind, Trace
from ppscope.trace.outputs import atomic_file

__all__ = ["chrome_events", "export_chrome", "match_flows"]

_LANE_ORDER = {"compute": 0, "recv": 1, "send": 2, "host": 3}
_RECV_KINDS = (str(SpanKind.RECV), str(SpanKind.RECV_WAIT))


def export_chrome(trace: Trace, out: str | Path, *, force: bool = False) -> Path:
    """Write `trace` to `out` (gzip when it ends in `.gz`). Refuses an existing file unless `force`."""
    out = Path(out)
    doc = {"traceEvents": chrome_events(trace), "displayTimeUnit": "ns", "otherData": _other(trace)}
    with atomic_file(out, force=force) as tmp:
        data = json.dumps(doc, separators=(",", ":")).encode()
        if out.name.endswith(".gz"):
            with gzip.open(tmp, "wb", compresslevel=6) as f:
                f.write(data)
        else:
            tmp.write_bytes(data)
    return out


def _other(trace: Trace) -> dict[str, Any]:
    meta = trace.meta
    return {"ppscope_run_id": meta.run_id, "source": meta.source, "schedule": meta.schedule, "split": meta.split}


def _us(ns: np.ndarray | int, t0: int) -> Any:
    return np.round((np.asarray(ns, dtype=np.int64) - t0) / 1000.0, 3)


def chrome_events(trace: Trace) -> list[dict[str, Any]]:
    """The trace-event list: metadata, slices, flows and counters."""
    spans = trace.spans
    counters = trace.counters
    starts = [int(spans["start_ns"].min())] if len(spans) else []
    if len(counters):
        starts.append(int(counters["ts_ns"].min()))
    t0 = min(starts) if starts else 0
    events: list[dict[str, Any]] = []
    stage_of = _stage_of_rank(trace)
    ranks = sorted(set(stage_of) | {int(r) for r in counters["rank"].unique()})
    tids: dict[tuple[int, str], int] = {}
    for rank in ranks:
        stage = stage_of.get(rank, -1)
        label = f"rank {rank} / stage {stage}" if stage >= 0 else f"rank {rank}"
        events.append(_meta("process_name", rank, 0, {"name": label}))
        events.append(_meta("process_sort_index", rank, 0, {"sort_index": stage if stage >= 0 else 10_000 + rank}))
    if len(spans):
        spans = _with_levels(spans)
        events += _slices(spans, t0, tids)
        events += _flows(spans, t0, tids)
    events += _counters(counters, t0)
    return events


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def _stage_of_rank(trace: Trace) -> dict[int, int]:
    out = {info.rank: info.stage for info in trace.meta.ranks}
    if len(trace.spans):
        first = trace.spans.groupby("rank")["stage"].agg(lambda s: int(s[s >= 0].min()) if (s >= 0).any() else -1)
        for rank, stage in first.items():
            if out.get(int(rank), -1) < 0:
                out[int(rank)] = int(stage)
    return out


def _with_levels(spans: pd.DataFrame) -> pd.DataFrame:
    """Spans with `lvl`: the sub-thread of their lane on which they nest."""
    levels = np.zeros(len(spans), dtype=np.int64)
    for _, rows in spans.groupby(["rank", "lane"], sort=False).indices.items():
        levels[rows] = stack_levels(spans["start_ns"].to_numpy()[rows], spans["end_ns"].to_numpy()[rows])
    return spans.reset_index(drop=True).assign(lvl=levels)


def _thread_key(rank: int, lane: str, level: int) -> tuple[int, str]:
    return rank, f"{lane}\0{level}"


def _slices(spans: pd.DataFrame, t0: int, tids: dict[tuple[int, str], int]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    threads = spans[["rank", "lane", "lvl"]].drop_duplicates()
    threads = threads.assign(order=threads["lane"].map(lambda n: _LANE_ORDER.get(n, 4)))
    threads = threads.sort_values(["rank", "order", "lane", "lvl"])
    for i, t in enumerate(threads.itertuples(index=False)):
        rank, lane, level = int(t.rank), str(t.lane), int(t.lvl)
        tid = i + 1
        tids[_thread_key(rank, lane, level)] = tid
        name = lane if level == 0 else f"{lane} #{level + 1}"
        events.append(_meta("thread_name", rank, tid, {"name": name}))
        events.append(_meta("thread_sort_index", rank, tid, {"sort_index": tid}))
    ts = _us(spans["start_ns"].to_numpy(), t0)
    dur = np.round((spans["end_ns"].to_numpy() - spans["start_ns"].to_numpy()) / 1000.0, 3)
    for s, t, d in zip(spans.itertuples(index=False), ts.tolist(), dur.tolist(), strict=True):
        tid = tids[_thread_key(int(s.rank), str(s.lane), int(s.lvl))]
        args = {"stage": int(s.stage), "mb": int(s.mb), "step": int(s.step), "chunk": int(s.chunk)}
        if s.phase:
            args["phase"] = s.phase
        for key in ("nbytes", "tokens"):
            if getattr(s, key):
                args[key] = int(getattr(s, key))
        if s.peer >= 0:
            args["peer"] = int(s.peer)
        if s.kind == SpanKind.MARK:
            events.append({"ph": "i", "s": "t", "name": s.name, "cat": s.kind, "pid": int(s.rank), "tid": tid, "ts": t})
        else:
            events.append(
                {
                    "ph": "X",
                    "name": s.name,
                    "cat": s.kind,
                    "pid": int(s.rank),
                    "tid": tid,
                    "ts": t,
                    "dur": d,
                    "args": args,
                }
            )
    return events


def match_flows(spans: pd.DataFrame) -> list[tuple[int, int]]:
    """(send index, recv index) pairs: the n-th send from a to b for (mb, step, chunk) meets the n-th
    receive on b from a for the same key. Spans without a peer are not matched."""
    sends = spans[(spans["kind"] == SpanKind.SEND) & (spans["peer"] >= 0)]
    recvs = spans[spans["kind"].isin(_RECV_KINDS) & (spans["peer"] >= 0)]
    if not len(sends) or not len(recvs):
        return []
    # A receive may be split into waiting + moving; the arrow goes to the first of them.
    recvs = recvs.sort_values(["start_ns"], kind="stable")
    keys = ["src", "dst", "mb", "step", "chunk"]
    s = sends.assign(src=sends["rank"], dst=sends["peer"]).sort_values("start_ns", kind="stable")
    r = recvs.assign(src=recvs["peer"], dst=recvs["rank"])
    s = s.assign(_n=s.groupby(keys).cumcount()).reset_index()
    r = r.assign(_n=r.groupby(keys).cumcount()).reset_index()
    pairs = s.merge(r, on=[*keys, "_n"], suffixes=("_s", "_r"))
    return list(zip(pairs["index_s"].tolist(), pairs["index_r"].tolist(), strict=True))


def _flows(spans: pd.DataFrame, t0: int, tids: dict[tuple[int, str], int]) -> Iterator[dict[str, Any]]:
    for flow_id, (si, ri) in enumerate(match_flows(spans), start=1):
        send, recv = spans.loc[si], spans.loc[ri]
        common = {"cat": "p2p", "name": "send", "id": flow_id}
        yield {
            **common,
            "ph": "s",
            "pid": int(send["rank"]),
            "tid": tids[_thread_key(int(send["rank"]), str(send["lane"]), int(send["lvl"]))],
            "ts": float(_us(int(send["start_ns"]), t0)),
        }
        yield {
            **common,
            "ph": "f",
            "bp": "e",
            "pid": int(recv["rank"]),
            "tid": tids[_thread_key(int(recv["rank"]), str(recv["lane"]), int(recv["lvl"]))],
            # at the receive's last ns: when the data had arrived, still inside the slice `bp: e` binds to
            "ts": float(_us(max(int(recv["start_ns"]), int(recv["end_ns"]) - 1), t0)),
        }


def _counters(counters: pd.DataFrame, t0: int) -> list[dict[str, Any]]:
    if not len(counters):
        return []
    ts = _us(counters["ts_ns"].to_numpy(), t0).tolist()
    out = []
    for c, t in zip(counters.itertuples(index=False), ts, strict=True):
        name = str(c.metric) if c.device < 0 else f"{c.metric} gpu{int(c.device)}"
        out.append({"ph": "C", "name": name, "pid": int(c.rank), "ts": t, "args": {str(c.metric): float(c.value)}})
    return out
