"""Analyzer speed and memory on 1 million spans over 8 ranks (target: <= 1 s, <= 1 GB), as ratios to sorting
the same spans DataFrame by (rank, start) in this process; and HTA against ppscope on the same Kineto files.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

ROUNDS = 3
RANKS = 8
SPANS = 1_000_000
KINETO = Path(__file__).resolve().parents[2] / "shared" / "data" / "kineto" / "trace_filter"


def _best_s(fn: Callable[[], object], rounds: int = ROUNDS) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        fn()
        best = min(best, (time.perf_counter_ns() - t0) / 1e9)
    return best


def synthetic_spans(n_spans: int = SPANS, ranks: int = RANKS, seed: int = 0) -> pd.DataFrame:
    """A GPipe-like run with jitter: per (rank, micro-batch) a recv_wait, a recv, a forward and a send."""
    from ppscope.trace.model import spans_frame

    rng = np.random.default_rng(seed)
    per_kind = n_spans // (4 * ranks)
    rank = np.repeat(np.arange(ranks), per_kind)
    mb = np.tile(np.arange(per_kind), ranks)
    t_fwd = 10_000 + 2_000 * (rank == ranks // 2)  # one slower stage
    slot = (mb + rank) * 13_000 + rng.integers(0, 500, rank.shape[0])
    wait_end = slot + 1_000
    fwd_start = wait_end + 400
    fwd_end = fwd_start + t_fwd + rng.integers(0, 300, rank.shape[0])
    parts = {
        "recv_wait": (slot, wait_end, "recv"),
        "recv": (wait_end, fwd_start, "recv"),
        "forward": (fwd_start, fwd_end, "compute"),
        "send": (fwd_end, fwd_end + 200, "send"),
    }
    frames = []
    for kind, (start, end, lane) in parts.items():
        frames.append(
            pd.DataFrame(
                {
                    "rank": rank,
                    "stage": rank,
                    "lane": lane,
                    "kind": kind,
                    "name": kind,
                    "mb": mb,
                    "step": -1,
                    "chunk": 0,
                    "phase": "",
                    "start_ns": start,
                    "end_ns": end,
                    "nbytes": 4096 * (kind != "forward"),
                    "tokens": 0,
                    "peer": np.where(kind == "send", rank + 1, rank - 1),
                }
            )
        )
    return spans_frame(pd.concat(frames, ignore_index=True).sample(frac=1.0, random_state=seed))


def _peak_mb(fn: Callable[[], object]) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def _synthetic_lines() -> list[str]:
    from ppscope.analysis import analyze
    from ppscope.analysis.gantt import gantt_figure
    from ppscope.trace.model import RunMeta, Trace

    spans = synthetic_spans()
    trace = Trace(spans=spans, meta=RunMeta(pp_size=RANKS, world_size=RANKS, schedule="gpipe"))
    frame_mb = spans.memory_usage(deep=True).sum() / 1e6
    ref = _best_s(lambda: spans.sort_values(["rank", "start_ns"]))
    secs = _best_s(lambda: analyze(trace))
    peak = _peak_mb(lambda: analyze(trace))
    res = analyze(trace)
    stage_ranks = {s.stage: s.ranks for s in res.stages}
    gantt_s = _best_s(lambda: gantt_figure(spans, gaps=res.gaps, stage_ranks=stage_ranks).figure.to_json(), rounds=1)
    return [
        f"analysis: reference = sorting the {len(spans):,}-span DataFrame by (rank, start): {ref:.3f} s",
        f"analysis: analyze() on {len(spans):,} spans over {RANKS} ranks: {secs:.3f} s (target <= 1 s) "
        f"= {secs / ref:.1f}x the sort; bottleneck found: stage {res.bottleneck_stage} (expected {RANKS // 2})",
        f"analysis: peak traced memory of analyze(): {peak:.0f} MB (target <= 1000 MB) "
        f"= {peak / frame_mb:.2f}x the spans DataFrame ({frame_mb:.0f} MB)",
        f"analysis: Gantt figure (aggregated, gaps shaded, serialised) of the same spans: {gantt_s:.2f} s "
        f"= {gantt_s / ref:.1f}x the sort",
    ]


def _hta_lines() -> list[str]:
    if not KINETO.is_dir():
        return [f"analysis vs HTA: skipped, {KINETO.name} traces not found"]
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return ["analysis vs HTA: skipped, holistictraceanalysis is not installed (pip install -e '.[bench]')"]
    from ppscope.analysis import analyze
    from ppscope.formats.sources import open_trace

    logging.disable(logging.INFO)

    def hta() -> object:
        with contextlib.redirect_stdout(io.StringIO()):
            ta = TraceAnalysis(trace_dir=str(KINETO))
            ta.get_temporal_breakdown(visualize=False)
            return ta.get_idle_time_breakdown(visualize=False)

    def ours() -> object:
        return analyze(open_trace(KINETO))

    hta_s = _best_s(hta)
    our_s = _best_s(ours)
    loaded = open_trace(KINETO)
    our_an = _best_s(lambda: analyze(loaded))
    with contextlib.redirect_stdout(io.StringIO()):
        hta_busy = TraceAnalysis(trace_dir=str(KINETO)).get_temporal_breakdown(visualize=False)
    res = analyze(open_trace(KINETO))
    ours_busy = ", ".join(f"rank {s.ranks[0]} {100 * (1 - s.bubble_ratio):.1f}%" for s in res.stages)
    pairs = zip(hta_busy["rank"], hta_busy["compute_time_pctg"], strict=True)
    hta_busy_txt = ", ".join(f"rank {int(r)} {p:.1f}%" for r, p in pairs)
    logging.disable(logging.NOTSET)
    return [
        f"analysis vs HTA on {KINETO.name} (2 Kineto ranks): HTA load + temporal + idle breakdown {hta_s:.3f} s; "
        f"ppscope load + analyze {our_s:.3f} s (analyze alone {our_an:.3f} s) = {hta_s / our_s:.1f}x faster",
        f"analysis vs HTA: compute share of the window, HTA {hta_busy_txt}; ppscope {ours_busy} "
        "(windows differ: HTA per rank, ppscope first-to-last span of any rank)",
    ]


def main() -> list[str]:
    return _synthetic_lines() + _hta_lines()


if __name__ == "__main__":
    for line in main():
        print(line)
