"""Pipeline-level figures: which ranks form each physical stage, imbalance and bottleneck, per-hop traffic.

It knows the span schema and run metadata, not how idle time is attributed (that is `bubbles`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppscope.analysis.bubbles import ROLE_COLLECTIVE, ROLE_COMPUTE, ROLE_RECV, ROLE_SEND, ROLE_WAIT, span_roles
from ppscope.analysis.result import HopStats, StageResult
from ppscope.trace.model import RunMeta, SpanKind, Trace
from ppscope.trace.notices import Notice, NoticeCode

__all__ = [
    "collectives_without_p2p",
    "count_distinct",
    "hop_stats",
    "measured_inflight",
    "message_latencies",
    "pipeline_evidence",
    "stage_imbalance",
    "stage_of_ranks",
]

_COLLECTIVE_OPS = (
    ("allreduce", "all-reduce"),
    ("allgather", "all-gather"),
    ("reducescatter", "reduce-scatter"),
    ("alltoall", "all-to-all"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
)
_NOT_TIMED = "no `recv` span: the transfer, if any, is inside the receive wait (wait ms)"
_NOT_PAIRED = "no message was posted while its receiver waited for it (pairing needs micro-batch ids)"
_NO_SIZES = "no message of the hop records its size: sizes are not in the trace"


def count_distinct(values: npt.NDArray[np.int64]) -> int:
    """Number of distinct values, by sorting (faster than hashing for large int arrays)."""
    if values.shape[0] == 0:
        return 0
    s = np.sort(values)
    return int((s[1:] != s[:-1]).sum()) + 1


def stage_of_ranks(spans: pd.DataFrame, meta: RunMeta) -> tuple[dict[int, int], list[Notice]]:
    """Physical stage of every rank that recorded spans, and what was guessed.

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
        return from_meta, []
    stages = spans["stage"].to_numpy()
    known = stages >= 0
    mins = pd.Series(stages[known]).groupby(spans["rank"].to_numpy()[known]).min()
    from_spans = {int(r): int(s) for r, s in mins.items()}
    mapping = {int(r): from_meta.get(int(r), from_spans.get(int(r), -1)) for r in ranks}
    if all(s >= 0 for s in mapping.values()):
        return mapping, []
    said = []
    if any(s >= 0 for s in mapping.values()):
        text = "some ranks carry no stage number; numbered every rank's stage by rank order instead"
        said.append(Notice(NoticeCode.STAGES_BY_RANK, text))
    return {int(r): i for i, r in enumerate(ranks)}, said


def stage_imbalance(stages: list[StageResult]) -> tuple[float | None, str, int | None, float | None]:
    """(imbalance, basis, bottleneck stage, balance speedup) from per-micro-batch stage times.

    t_s is the stage's busy time per micro-batch pass; when some stage has no `forward` spans (imports), the
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


def hop_stats(spans: pd.DataFrame, roles: npt.NDArray[np.int8] | None = None) -> list[HopStats]:
    """Messages, bytes, send/transfer/wait time and effective bandwidth per (src rank -> dst rank) hop.

    `roles` are the span roles from `bubbles.span_roles` when the caller has them already.
    """
    role = span_roles(spans["kind"]) if roles is None else roles
    peer = spans["peer"].to_numpy()
    is_send = (role == ROLE_SEND) & (peer >= 0)
    is_recv = (role == ROLE_RECV) & (peer >= 0)
    is_wait = (role == ROLE_WAIT) & (peer >= 0)
    rows = is_send | is_recv | is_wait
    if not rows.any():
        return []
    rank = spans["rank"].to_numpy()[rows].astype(np.int64)
    peer, is_send, is_recv = peer[rows].astype(np.int64), is_send[rows], is_recv[rows]
    src, dst = np.where(is_send, rank, peer), np.where(is_send, peer, rank)
    role_idx = np.select([is_send, is_recv], [0, 1], 2)
    dur = spans["end_ns"].to_numpy()[rows] - spans["start_ns"].to_numpy()[rows]
    nbytes = spans["nbytes"].to_numpy()[rows].astype(np.int64)
    nbytes = np.where(nbytes > 0, nbytes, 0)  # 0 is "not recorded", and a negative size is none either
    # One integer key per (hop, role), from rank numbers shifted to start at 0.
    low = int(min(src.min(), dst.min()))
    width = int(max(src.max(), dst.max())) - low + 1
    flat = (src - low) * width + (dst - low)
    if int(flat.max()) < 1 << 22:  # small rank numbers: count directly, no sort
        hop_keys = np.flatnonzero(np.bincount(flat))
        hop_id = np.searchsorted(hop_keys, flat)
    else:
        hop_keys, hop_id = np.unique(flat, return_inverse=True)
    hops = np.stack([hop_keys // width + low, hop_keys % width + low])
    key = hop_id.reshape(-1) * 3 + role_idx
    size = hops.shape[1] * 3
    count = np.bincount(key, minlength=size).reshape(-1, 3)
    dur_sum = _sum_by_key(key, dur, size).reshape(-1, 3)
    byte_sum = _sum_by_key(key, nbytes, size).reshape(-1, 3)
    sized = np.bincount(key[nbytes > 0], minlength=size).reshape(-1, 3)  # messages whose size is known
    median_ns = _median_by_hop(message_latencies(spans, role))
    out = []
    for h in range(hops.shape[1]):
        send, recv, wait = 0, 1, 2
        src_role = send if count[h, send] else (recv if count[h, recv] else wait)
        timed = bool(count[h, recv])
        transfer_ns = int(dur_sum[h, recv])
        nb = _hop_bytes(byte_sum[h], sized[h], src_role)
        latency_ns = _int_or_none(median_ns.get((int(hops[0, h]), int(hops[1, h]))))
        unmeasured = {} if nb is not None else {"nbytes": _NO_SIZES}
        unmeasured |= {} if timed else {"recv_ns": _NOT_TIMED, "bandwidth_gb_per_s": _NOT_TIMED}
        if timed and nb is None:
            unmeasured["bandwidth_gb_per_s"] = _NO_SIZES
        elif timed and not (transfer_ns > 0 and nb):
            unmeasured["bandwidth_gb_per_s"] = "the timed transfers moved no bytes or took no time"
        if latency_ns is None:
            unmeasured["latency_ns"] = _NOT_PAIRED
        out.append(
            HopStats(
                src_rank=int(hops[0, h]),
                dst_rank=int(hops[1, h]),
                messages=int(count[h, src_role]),
                nbytes=nb,
                send_ns=int(dur_sum[h, send]),
                recv_ns=transfer_ns if timed else None,
                wait_ns=int(dur_sum[h, wait]),
                bandwidth_gb_per_s=nb / transfer_ns if timed and transfer_ns > 0 and nb else None,
                latency_ns=latency_ns,
                unmeasured=unmeasured,
            )
        )
    return out


def _hop_bytes(byte_sum: npt.NDArray[np.int64], sized: npt.NDArray[np.int64], src_role: int) -> int | None:
    """A hop's bytes: the sum over its messages as the sender's spans record them, else as another role's do;
    None when no span of the hop records a size (0 is "not recorded" in the schema, never a size)."""
    for role in (src_role, *(r for r in range(3) if r != src_role)):
        if sized[role]:
            return int(byte_sum[role])
    return None


def collectives_without_p2p(spans: pd.DataFrame, roles: npt.NDArray[np.int8] | None = None) -> list[str]:
    """The collectives (all-reduce, all-gather, ...) of a trace that has no point-to-point traffic at all: no
    send or receive span, no communication kernel or range of a send or receive. Empty when there is
    point-to-point traffic or no collective: a pipeline's stages talk to their neighbours."""
    role = span_roles(spans["kind"], spans["name"]) if roles is None else roles
    if np.isin(role, [ROLE_SEND, ROLE_RECV, ROLE_WAIT]).any():
        return []
    return collective_labels(comm_names(spans, role))


def comm_names(spans: pd.DataFrame, role: npt.NDArray[np.int8]) -> set[str]:
    """The names of the communication kernels and collective ranges, normalised (lower case, no - or _)."""
    comm = (spans["kind"] == SpanKind.NCCL).to_numpy() | (role == ROLE_COLLECTIVE)
    return {str(n).lower().replace("_", "").replace("-", "") for n in pd.unique(spans["name"].to_numpy()[comm])}


def collective_labels(names: set[str]) -> list[str]:
    """The collectives among `comm_names`; none when a send or receive is among them."""
    if any("send" in n or "recv" in n for n in names):
        return []
    return [label for key, label in _COLLECTIVE_OPS if any(key in n for n in names)]


def message_latencies(spans: pd.DataFrame, roles: npt.NDArray[np.int8] | None = None) -> pd.DataFrame:
    """One row (src, dst, latency_ns) per message whose receiver was already waiting for it: from the sender
    posting it (start of its `send` span, peer = dst) to the receiver waking up with it (end of its
    `recv_wait` span, peer = src, same micro-batch, a wait that covers the post). That is the hop's latency
    as the pipeline feels it, including what no transfer span shows (a payload riding in its header, the
    receiver's wake-up). Empty when the trace has no such pairs (imported traces without micro-batch ids)."""
    role = span_roles(spans["kind"]) if roles is None else roles
    col = {c: spans[c].to_numpy(np.int64) for c in ("rank", "peer", "mb", "step", "start_ns", "end_ns")}
    known = (col["peer"] >= 0) & (col["mb"] >= 0)
    at_send, at_wait = np.flatnonzero((role == ROLE_SEND) & known), np.flatnonzero((role == ROLE_WAIT) & known)
    if not len(at_send) or not len(at_wait):
        return pd.DataFrame({"src": [], "dst": [], "latency_ns": []}, dtype=np.int64)
    names = {"rank": "src", "peer": "dst", "mb": "mb", "step": "step", "start_ns": "posted"}
    sends = {new: col[old][at_send] for old, new in names.items()}
    names = {"rank": "dst", "peer": "src", "mb": "mb", "step": "step", "start_ns": "waiting", "end_ns": "woke"}
    waits = {new: col[old][at_wait] for old, new in names.items()}
    # A receiver labels its wait with the message's step (the engine) or with the step it will compute, one
    # later for the tokens that close a step (the simulator): pair both ways, the window below keeps the true one.
    pairs = [_last_post_before_waking(waits, sends), _last_post_before_waking(waits, sends, step=1)]
    pair = {c: np.concatenate([p[c] for p in pairs]) for c in ("src", "dst", "waiting", "woke", "posted")}
    kept = pair["waiting"] <= pair["posted"]
    return pd.DataFrame(
        {"src": pair["src"][kept], "dst": pair["dst"][kept], "latency_ns": (pair["woke"] - pair["posted"])[kept]}
    )


def _last_post_before_waking(
    waits: dict[str, npt.NDArray[np.int64]], sends: dict[str, npt.NDArray[np.int64]], step: int = 0
) -> dict[str, npt.NDArray[np.int64]]:
    """Each wait beside the last send of its key (hop, micro-batch, step + `step`) posted before it woke. A key
    can recur thousands of times in one trace (an imported one, or a serve run's many requests), so this is a
    sorted as-of join, never the product of all sends and waits of a key: waits and sends sorted together by
    key, then time (a wait before a send posted at the instant it woke: only earlier posts count), each wait
    takes the last send before it when that send has its key."""
    keys = ["src", "dst", "mb", "step"]
    w = waits
    s = {**sends, "step": sends["step"] + step}
    key = {c: np.concatenate([w[c], s[c]]) for c in keys}
    is_send = np.concatenate([np.zeros(len(w["woke"]), bool), np.ones(len(s["posted"]), bool)])
    t = np.concatenate([w["woke"], s["posted"]])
    order = np.lexsort((is_send, t, key["step"], key["mb"], key["dst"], key["src"]))
    sent = is_send[order]
    last = np.maximum.accumulate(np.where(sent, np.arange(len(order)), -1))  # the last send at or before
    at = np.flatnonzero(~sent)
    before = last[at]
    found = before >= 0
    at, before = at[found], before[found]
    same = np.ones(len(at), bool)
    for c in keys:
        same &= key[c][order[at]] == key[c][order[before]]
    wi, si = order[at[same]], order[before[same]] - len(w["woke"])
    columns = {c: w[c][wi] for c in ("src", "dst", "waiting", "woke")}
    return {**columns, "posted": s["posted"][si]}


def _median_by_hop(latency: pd.DataFrame) -> dict[tuple[int, int], float]:
    """The median latency of each (src, dst) hop (the mean of the middle two of an even count), by one sort
    rather than a groupby: a pipeline's few hops cost a groupby's fixed overhead, paid once per replica."""
    src, dst, ns = (latency[c].to_numpy(np.int64) for c in ("src", "dst", "latency_ns"))
    order = np.lexsort((ns, dst, src))
    src, dst, ns = src[order], dst[order], ns[order]
    cuts = np.flatnonzero((src[1:] != src[:-1]) | (dst[1:] != dst[:-1])) + 1
    out = {}
    for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(ns)].tolist(), strict=True):
        if hi > lo:
            mid = (lo + hi - 1) / 2
            out[(int(src[lo]), int(dst[lo]))] = (float(ns[int(np.floor(mid))]) + float(ns[int(np.ceil(mid))])) / 2
    return out


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


_INT64_RANGE = (-(2.0**63), float(np.nextafter(2.0**63, 0)))  # as floats that convert back without overflow


def _sum_by_key(key: npt.NDArray[np.int64], values: npt.NDArray[np.int64], size: int) -> npt.NDArray[np.int64]:
    """Sums of `values` per key, as integers. The float sums are exact below 2**53 (104 days of ns, 9 PB), far
    beyond one trace; absurd values from a damaged file (bytes near the int64 limit) saturate at the int64
    limits rather than overflow."""
    sums = np.rint(np.bincount(key, weights=values, minlength=size))
    return np.clip(sums, *_INT64_RANGE).astype(np.int64)


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
    return count_distinct(ids.astype(np.int64)), "distinct decode micro-batch ids"


def pipeline_evidence(trace: Trace) -> Notice | None:
    """What is missing for `trace` to show a pipeline, or None when nothing is: its ranks exchange no message
    (no send, receive or receive-wait span: they may as well be independent jobs, or data-parallel replicas),
    or it holds no compute to time a pass by. ppscope's own runs and one-rank traces always pass."""
    spans = trace.spans
    ranks = trace.ranks
    if trace.meta.source == "ppscope" or len(ranks) < 2:
        return None
    role = span_roles(spans["kind"], spans["name"])
    if not (role == ROLE_COMPUTE).any():
        return Notice(NoticeCode.NO_PIPELINE_EVIDENCE, "it holds no compute span: there is no pass to time")
    if not np.isin(role, [ROLE_SEND, ROLE_RECV, ROLE_WAIT]).any():
        return Notice(
            NoticeCode.NO_PIPELINE_EVIDENCE,
            f"its {len(ranks)} ranks exchange no message (no send or receive between them): nothing shows they "
            "are stages of one pipeline rather than independent jobs or data-parallel replicas",
        )
    return None
