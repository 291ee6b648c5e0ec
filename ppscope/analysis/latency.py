"""Per-request latency (TTFT, TPOT, end to end) and output tokens/s from the requests table.

TTFT = first_token - arrival; TPOT = (finish - first_token) / (output_len - 1) for requests with more than
one output token; e2e = finish - arrival. Times of -1 mean unknown and leave that measure out.
This module knows the requests columns only, not spans.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppscope.analysis.result import LatencyStats, RequestLatency

__all__ = ["request_latency"]


def _stats(values_ns: npt.NDArray[np.float64]) -> LatencyStats | None:
    if values_ns.shape[0] == 0:
        return None
    ms = values_ns / 1e6
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return LatencyStats(
        n=int(ms.shape[0]),
        mean_ms=float(ms.mean()),
        p50_ms=float(p50),
        p90_ms=float(p90),
        p99_ms=float(p99),
        max_ms=float(ms.max()),
    )


def request_latency(requests: pd.DataFrame, asked: int = 0) -> RequestLatency | None:
    """Latency summary of `requests` (REQUEST_COLUMNS). `asked`: how many the run was given, when it says (an
    interrupted run logs only those it finished, perhaps none). None when there are no requests at all."""
    if requests is None or (len(requests) == 0 and asked <= 0):
        return None
    arrival = requests["arrival_ns"].to_numpy(np.int64)
    first = requests["first_token_ns"].to_numpy(np.int64)
    finish = requests["finish_ns"].to_numpy(np.int64)
    out_len = requests["output_len"].to_numpy(np.int64)
    has_first = (arrival >= 0) & (first >= arrival)
    done = finish >= 0
    has_e2e = done & (arrival >= 0) & (finish >= arrival)
    has_tpot = done & (first >= 0) & (finish >= first) & (out_len > 1)
    ttft = np.where(has_first, first - arrival, -1)
    e2e = np.where(has_e2e, finish - arrival, -1)
    tpot = np.where(has_tpot, (finish - first) / np.maximum(out_len - 1, 1), -1.0)
    tokens = int(out_len[done & (out_len > 0)].sum())
    tokens_per_s = None
    if done.any() and (arrival >= 0).any():
        span_ns = int(finish[done].max() - arrival[arrival >= 0].min())
        tokens_per_s = tokens / (span_ns / 1e9) if span_ns > 0 else None
    table = pd.DataFrame({"id": requests["id"].to_numpy(), "ttft_ns": ttft, "tpot_ns": tpot, "e2e_ns": e2e})
    return RequestLatency(
        requests=max(len(requests), asked),
        finished=int(done.sum()),
        output_tokens=tokens,
        ttft=_stats(ttft[has_first].astype(np.float64)),
        tpot=_stats(tpot[has_tpot].astype(np.float64)),
        e2e=_stats(e2e[has_e2e].astype(np.float64)),
        tokens_per_s=tokens_per_s,
        table=table,
    )
