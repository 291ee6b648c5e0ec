"""Pipeline-level figures: which ranks form each physical stage, imbalance and bottleneck, per-hop traffic.

It knows the span schema and run metadata, not how idle time is attributed (that is `bubbles`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppscope.analysis.result import HopStats, StageResult
from ppscope.trace import RunMeta, SpanKind

__all__ = ["balance", "hop_stats", "measured_inflight", "stage_of_ranks"]


def stage_of_ranks(spans: pd.DataFrame, meta: RunMeta, warnings: list[str]) -> dict[int, int]:
    """Physical stage of every rank that recorded spans.

    From `meta.ranks[i].stage` when set; else the lowest non-negative span `stage` of the rank (chunk 0 of
    an interleaved rank runs virtual stage r); else rank order (imports: one process/GPU is one stage).
    Ranks that share a stage (tensor parallel inside a stage) are analysed together as that stage.
    """
    ranks = np.unique(spans["rank"].to_numpy())
    from_meta = {}
    for r in ranks:
        info = meta.rank_info(int(r))
        if info is not None and info.stage >= 0:
            from_meta[int(r)] = info.stage
    if len(from_meta) == len(ranks):
        return from_meta
    stages = spans["stage"].to_numpy()
    known = stages >= 0
    mins = pd.Series(stages[known]).groupby(spans["rank"].to_numpy()[known]).min()
    from_spans = {int(r): int(s) for r, s in mins.items()}
    mapping = {int(r): from_meta.get(int(r), from_spans.get(int(r), -1)) for r in ranks}
    if all(s >= 0 for s in mapping.values()):
        return mapping
    if any(s >= 0 for s in mapping.values()):
        warnings.append("some ranks carry no stage number; numbered every rank's stage by rank order instead")
    return {int(r): i for i, r in enumerate(ranks)}


def balance(stages: list[StageResult]) -> tuple[float | None, str, int | None, float | None]:
    """(imbalance, basis, bottleneck stage, balance gain) from per-micro-batch stage times.

    t_s is the stage's busy time per (micro-batch, step) unit; when some stage has no micro-batch ids, the
    busy times themselves are compared (basis `busy`), which is the same ratio when every stage processes
    the same micro-batches.
    """
    if not stages:
        return None, "none", None, None
    if all(s.time_per_mb_ns is not None for s in stages):
        t = np.array([s.time_per_mb_ns for s in stages], np.float64)
        basis = "time_per_mb"
    else:
        t = np.array([s.busy_ns for s in stages], np.float64)
        basis = "busy"
    worst = int(np.argmax(t))
    if t[worst] <= 0:
        return None, basis, None, None
    mean = float(t.mean())
    return 1.0 - mean / float(t[worst]), basis, stages[worst].stage, float(t[worst]) / mean


def hop_stats(spans: pd.DataFrame) -> list[HopStats]:
    """Messages, bytes, send/transfer/wait time and effective bandwidth per (src rank -> dst rank) hop."""
    kind = spans["kind"]
    peer = spans["peer"].to_numpy()
    is_send = (kind == SpanKind.SEND).to_numpy() & (peer >= 0)
    is_recv = (kind == SpanKind.RECV).to_numpy() & (peer >= 0)
    is_wait = (kind == SpanKind.RECV_WAIT).to_numpy() & (peer >= 0)
    rows = is_send | is_recv | is_wait
    if not rows.any():
        return []
    rank = spans["rank"].to_numpy()
    frame = pd.DataFrame(
        {
            "src": np.where(is_send, rank, peer)[rows],
            "dst": np.where(is_send, peer, rank)[rows],
            "role": np.select([is_send, is_recv], ["send", "recv"], "wait")[rows],
            "dur": (spans["end_ns"].to_numpy() - spans["start_ns"].to_numpy())[rows],
            "nbytes": spans["nbytes"].to_numpy()[rows],
        }
    )
    agg = frame.groupby(["src", "dst", "role"]).agg(n=("dur", "size"), dur=("dur", "sum"), nbytes=("nbytes", "sum"))
    out = []
    for src, dst in sorted({(int(s), int(d)) for s, d, _ in agg.index}):

        def get(role: str, col: str, src: int = src, dst: int = dst) -> int:
            key = (src, dst, role)
            return int(agg.loc[key, col]) if key in agg.index else 0

        has_send = get("send", "n") > 0
        messages = get("send", "n") if has_send else get("recv", "n") or get("wait", "n")
        nbytes = get("send", "nbytes") if has_send else get("recv", "nbytes") or get("wait", "nbytes")
        send_ns, recv_ns, wait_ns = get("send", "dur"), get("recv", "dur"), get("wait", "dur")
        transfer_ns = recv_ns or send_ns
        out.append(
            HopStats(
                src_rank=src,
                dst_rank=dst,
                messages=messages,
                nbytes=nbytes,
                send_ns=send_ns,
                recv_ns=recv_ns,
                wait_ns=wait_ns,
                bandwidth_gbps=nbytes / transfer_ns if transfer_ns > 0 and nbytes > 0 else None,
            )
        )
    return out


def measured_inflight(
    mb: npt.NDArray[np.int32], decode_compute: npt.NDArray[np.bool_], meta: RunMeta
) -> tuple[int | None, str]:
    """Micro-batches in flight during decode: config `max_inflight`, else distinct decode micro-batch ids."""
    configured = meta.config.get("max_inflight")
    if isinstance(configured, int) and not isinstance(configured, bool) and configured > 0:
        return configured, "config max_inflight"
    ids = mb[decode_compute & (mb >= 0)]
    if ids.shape[0] == 0:
        return None, "no decode spans"
    return int(np.unique(ids).shape[0]), "distinct decode micro-batch ids"
