"""Per-stage busy time, bubble time and the cause of every idle instant.

Note (cause precedence): busy = union of compute spans (kinds in COMPUTE_KINDS). Every idle instant gets
exactly one cause. Where the schedule itself leaves the stage idle it is `fill` or `drain`: before the stage's
first compute and after its last, and when every step ends in a flush also at each step boundary and in each
training step's warm-up and cool-down (`ppscope.analysis.steps`), except where the rank is inside one of its
own compute actions (a pipelining F/B/I/W range) with nothing else to explain the gap: that is the rank's own
time, busy on a CPU (its thread is the device) and `host` on a GPU.
Elsewhere the first of these that covers the instant wins:
  1. a `recv` span (the engine timed the transfer itself)          -> comm
  2. a `recv_wait` span                                           -> dependency when it waits for a token to
                                                                     come round the ring (`dependency_waits`);
                                                                     downstream for a backward's gradient (from
                                                                     the next stage); else upstream
  3. a `send` span (blocked until the successor took the data)     -> downstream
  4. an `optimizer` span, or PyTorch's `Optimizer.step#` range      -> optimizer
  5. a `collective`, or a collective's range (`gloo:broadcast`)    -> dp_sync in training, else comm
  6. an imported `nccl` kernel, or a copy between GPUs             -> comm
  7. another imported copy or memset                               -> memcpy
  8. nothing                                                      -> host, or unknown when the source has no
                                                                     recv/send spans at all (imports), since
                                                                     waiting cannot be told from host overhead
`optimizer` and `dp_sync` keep their cause in the fill and drain (the step's data-parallel tail is not the
pipeline's drain). Above all of these and fill/drain, an instant when no request is in the system (serve
with arrivals spread out: every request so far is done, the next has not arrived) is `no_requests`: the
load left the pipeline empty, not the pipeline itself.
Engine wait spans rank above imported comm kernels because an NCCL receive kernel also spins while it waits
for its sender: the engine's span says why the stage is idle. Causes add up to the bubble exactly (ns).
This module knows span kinds and times; it does not choose windows or stage numbers. The definitions around
these rules are in docs/ARCHITECTURE.md, "Definitions".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ppscope.analysis.intervals import Intervals, Segments, clip, label_segments, merge_runs
from ppscope.analysis.result import CAUSES, Cause, StageResult, WindowInfo
from ppscope.analysis.steps import ComputeSpans, Waves, fill_drain
from ppscope.trace.model import COMPUTE_KINDS, SpanKind

__all__ = [
    "ROLE_COLLECTIVE",
    "ROLE_COMPUTE",
    "ROLE_RECV",
    "ROLE_SEND",
    "ROLE_WAIT",
    "StageTimes",
    "TextCodes",
    "compute_spans",
    "dependency_waits",
    "span_roles",
    "stage_bubbles",
]

# Span roles: what a span kind says about its stage.
_OTHER, _COMPUTE, _RECV, _WAIT, _SEND, _KERNEL_COMM, _COLLECTIVE, _COPY, _OPTIMIZER = range(9)
ROLE_COMPUTE, ROLE_RECV, ROLE_WAIT, ROLE_SEND, ROLE_COLLECTIVE = _COMPUTE, _RECV, _WAIT, _SEND, _COLLECTIVE
_ROLE_OF_KIND = {
    **{str(k): _COMPUTE for k in COMPUTE_KINDS},
    str(SpanKind.RECV): _RECV,
    str(SpanKind.RECV_WAIT): _WAIT,
    str(SpanKind.SEND): _SEND,
    str(SpanKind.NCCL): _KERNEL_COMM,
    str(SpanKind.MEMCPY): _COPY,
    str(SpanKind.MEMSET): _COPY,
    str(SpanKind.COLLECTIVE): _COLLECTIVE,
    str(SpanKind.OPTIMIZER): _OPTIMIZER,
}
_COLLECTIVE_RANGE = re.compile(
    r"^(nccl|gloo|mpi|ucc|xccl):_?(all_?reduce|all_?gather|reduce_?scatter|broadcast|all_?to_?all|reduce|gather|"
    r"scatter|barrier)",
    re.IGNORECASE,
)
"""PyTorch's range around a collective (c10d's `<backend>:<op>`): communication, but not between neighbours."""
_OPTIMIZER_RANGE = re.compile(r"^Optimizer\.(step|zero_grad)#")
"""PyTorch's range around an optimizer's step or zero_grad (`Optimizer.step#SGD.step`)."""
_PEER_COPY = "Memcpy PtoP"
"""A copy between two GPUs' memories (nsys names copies by kind): traffic between stages, not a local copy."""
_CODE = {c: i for i, c in enumerate(CAUSES)}
_BUSY = len(CAUSES)


@dataclass(frozen=True)
class StageTimes:
    """Arrays of the spans that matter for bubbles, one entry per span (any order)."""

    group: npt.NDArray[np.int64]
    """Index of the span's physical stage in `stages`."""
    role: npt.NDArray[np.int8]
    dependency: npt.NDArray[np.bool_]
    """A wait for a token to come round the ring (`dependency_waits`)."""
    step: npt.NDArray[np.int64]
    backward: npt.NDArray[np.bool_]
    """Phase `backward`: a training backward pass (B, I or W), or its wait for the next stage's gradient."""
    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]
    forward: npt.NDArray[np.bool_]
    """The span is a `forward` (one micro-batch through one model chunk)."""
    chunk: npt.NDArray[np.int64]
    action: npt.NDArray[np.bool_]
    """A range of the schedule's own around one compute action (a pipelining F, B, I or W): the rank's time
    inside it that nothing else explains is its own, wherever in the step it lies: busy on a CPU (the rank's
    thread is the device), host on a GPU (the device waits for the host)."""
    on_cpu: npt.NDArray[np.bool_] | None = None
    """The span's rank computes on a CPU (None: not known for any)."""


@dataclass(frozen=True)
class TextCodes:
    """A text column factorised once, so that each test of its values is a lookup of codes, not a comparison
    of every row's text."""

    codes: npt.NDArray[np.intp]
    uniques: list[str]

    @classmethod
    def of(cls, column: pd.Series) -> TextCodes:
        codes, uniques = pd.factorize(column, sort=False)
        return cls(codes, [str(u) for u in uniques])

    def among(self, values: list[str]) -> npt.NDArray[np.bool_]:
        """Which rows hold one of `values` (a missing value is none of them)."""
        wanted = set(map(str, values))
        hit = np.array([u in wanted for u in self.uniques] + [False])
        return hit[self.codes]  # code -1 (missing) picks the trailing False


def span_roles(kind: pd.Series, name: pd.Series | None = None) -> npt.NDArray[np.int8]:
    """Role code per span from its kind, via one factorisation (no per-row Python); with `name`, a `range`
    named as a collective (`nccl:all_reduce`) or an optimizer step is that, and a copy between GPUs is
    communication."""
    kinds = TextCodes.of(kind)
    table = np.array([_ROLE_OF_KIND.get(u, _OTHER) for u in kinds.uniques] + [_OTHER], np.int8)
    role = table[kinds.codes]  # code -1 (missing) picks the trailing _OTHER
    if name is not None:
        _name_roles(role, kinds.among([SpanKind.RANGE]), name, _range_role)
        _name_roles(role, kinds.among([SpanKind.MEMCPY]), name, _copy_role)
    return role


def _range_role(name: str) -> int:
    if _COLLECTIVE_RANGE.match(name):
        return _COLLECTIVE
    return _OPTIMIZER if _OPTIMIZER_RANGE.match(name) else _OTHER


def _copy_role(name: str) -> int:
    return _KERNEL_COMM if name.startswith(_PEER_COPY) else _COPY


def _name_roles(
    role: npt.NDArray[np.int8], rows: npt.NDArray[np.bool_], name: pd.Series, role_of: Callable[[str], int]
) -> None:
    """Set the role of `rows` from their names (`role_of` per distinct name), in place."""
    at = np.flatnonzero(rows)
    if at.shape[0]:
        names, unique_names = pd.factorize(name.iloc[at], sort=False)
        table = np.array([role_of(str(u)) for u in unique_names] + [_OTHER], np.int8)
        named = table[names]
        role[at] = np.where(named != _OTHER, named, role[at])


def dependency_waits(
    role: npt.NDArray[np.int8],
    stage: npt.NDArray[np.int64],
    prefill: npt.NDArray[np.bool_],
    decode: npt.NDArray[np.bool_],
    *,
    ring_bound: bool,
) -> npt.NDArray[np.bool_]:
    """The `recv_wait` spans that wait for a token to come round the ring: those of the first virtual stage in
    inference (stage 0 waits for the token of the micro-batch it runs next, in every schedule), and, when fewer
    micro-batches are in flight than stages (`ring_bound`), every decode wait, since each stage then waits for a
    micro-batch held up by its own token."""
    wait = role == _WAIT
    token = wait & (stage == 0) & (prefill | decode)
    return token | (wait & decode) if ring_bound else token


def compute_spans(times: StageTimes) -> ComputeSpans:
    """The compute spans among `times`."""
    c = times.role == _COMPUTE
    return ComputeSpans(times.group[c], times.step[c], times.backward[c], times.start_ns[c], times.end_ns[c])


def stage_bubbles(
    times: StageTimes,
    stages: list[tuple[int, list[int]]],
    window: WindowInfo,
    *,
    flush: bool,
    has_waits: bool,
    no_requests: Intervals | None = None,
    waves: Waves | None = None,
) -> tuple[list[StageResult], pd.DataFrame]:
    """Busy, bubble and causes for each (stage, ranks) in `stages`, plus the merged idle intervals.
    `flush`: every step ends in a flush (fill and drain per step); `no_requests`: when no request was in the
    system (disjoint intervals); `waves`: the whole trace's, when `times` holds only some of its stages."""
    training = bool(times.backward.any())
    positions = fill_drain(compute_spans(times), len(stages), window.start_ns, window.end_ns, flush=flush, waves=waves)
    order = np.argsort(times.group, kind="stable")
    cuts = np.searchsorted(times.group[order], np.arange(len(stages) + 1))
    results: list[StageResult] = []
    gaps: list[_Gaps] = []
    for gi, (stage, ranks) in enumerate(stages):
        idx = order[cuts[gi] : cuts[gi + 1]]
        res, gap = _one_stage(
            times,
            idx,
            stage,
            ranks,
            window,
            positions[gi],
            has_waits=has_waits,
            no_requests=no_requests or Intervals.empty(),
            training=training,
        )
        results.append(res)
        gaps.append(gap)
    return results, _gap_frame(gaps)


def _one_stage(
    t: StageTimes,
    idx: npt.NDArray[np.intp],
    stage: int,
    ranks: list[int],
    window: WindowInfo,
    positions: tuple[Intervals, Intervals],
    *,
    has_waits: bool,
    no_requests: Intervals,
    training: bool,
) -> tuple[StageResult, _Gaps]:
    lo, hi = window.start_ns, window.end_ns
    role, start, end = t.role[idx], t.start_ns[idx], t.end_ns[idx]

    def pick(mask: npt.NDArray[np.bool_]) -> Intervals:
        return clip(Intervals(start[mask], end[mask]), lo, hi)

    is_compute = role == _COMPUTE
    compute = pick(is_compute)
    is_wait = role == _WAIT
    dep = is_wait & t.dependency[idx]
    gradient = is_wait & t.backward[idx] & ~dep
    levels = [
        (_CODE[Cause.NO_REQUESTS], clip(no_requests, lo, hi)),
        (_CODE[Cause.COMM], pick(role == _RECV)),
        (_CODE[Cause.UPSTREAM], pick(is_wait & ~dep & ~gradient)),
        (_CODE[Cause.DEPENDENCY], pick(dep)),
        (_CODE[Cause.DOWNSTREAM], pick((role == _SEND) | gradient)),
        (_CODE[Cause.OPTIMIZER], pick(role == _OPTIMIZER)),
        (_CODE[Cause.DP_SYNC if training else Cause.COMM], pick(role == _COLLECTIVE)),
        (_CODE[Cause.COMM], pick(role == _KERNEL_COMM)),
        (_CODE[Cause.MEMCPY], pick(role == _COPY)),
    ]
    fill, drain = positions
    seg = Segments.of(lo, hi, compute, *(iv for _, iv in levels), fill=fill, drain=drain, action=pick(t.action[idx]))
    codes = [_BUSY, *(code for code, _ in levels)]
    labels = label_segments(seg, codes, _CODE[Cause.HOST if has_waits else Cause.UNKNOWN])
    # Positional causes, placed by the schedule (`steps.fill_drain`), relative to the stage's compute in the
    # whole run, not the window's; except the rank's own time inside one of its compute actions (between the
    # operators of a forward, say), which is host even in a training step's warm-up or cool-down.
    own = (labels == _CODE[Cause.HOST]) & seg.covers("action")
    if t.on_cpu is not None and idx.shape[0] and t.on_cpu[idx].all():
        # on a CPU the rank's thread is the device: its time inside its own compute action (the Python between
        # the operators of a forward) is the stage at work, as a recording hook's forward span counts it
        labels[own] = _BUSY
        own[:] = False
    step_tail = (labels == _CODE[Cause.OPTIMIZER]) | (labels == _CODE[Cause.DP_SYNC])  # its own cause, not drain
    idle = (labels != _BUSY) & (labels != _CODE[Cause.NO_REQUESTS]) & ~own & ~step_tail
    labels[idle & seg.covers("fill")] = _CODE[Cause.FILL]
    labels[idle & seg.covers("drain")] = _CODE[Cause.DRAIN]
    lengths = seg.length_ns
    causes = {c: int(lengths[labels == _CODE[c]].sum()) for c in CAUSES}
    busy = int(lengths[labels == _BUSY].sum())
    length = hi - lo
    bubble = length - busy
    fwd = t.forward[idx]
    units = _passes(start[fwd], end[fwd], t.chunk[idx][fwd], lo, hi)
    result = StageResult(
        stage=stage,
        ranks=ranks,
        busy_ns=busy,
        bubble_ns=bubble,
        bubble_ratio=bubble / length if length > 0 else 0.0,
        causes=causes,
        units=units,
        time_per_mb_ns=busy / units if units else None,
    )
    g_start, g_end, g_label = merge_runs(seg, labels)
    keep = g_label != _BUSY
    return result, (stage, g_start[keep], g_end[keep], g_label[keep])


def _passes(
    start: npt.NDArray[np.int64], end: npt.NDArray[np.int64], chunk: npt.NDArray[np.int64], lo: int, hi: int
) -> float:
    """Micro-batch passes through the stage inside [lo, hi): forward spans / model chunks on the stage.

    A forward cut by the window counts for the part inside it, so time per pass stays right for any window.
    """
    dur = end - start
    inside = np.minimum(end, hi) - np.maximum(start, lo)
    point = (dur == 0) & (start >= lo) & (start < hi)
    frac = np.where(dur > 0, np.clip(inside, 0, None) / np.maximum(dur, 1), point.astype(np.float64))
    used = frac > 0
    if not used.any():
        return 0.0
    chunks = np.unique(chunk[used]).shape[0]
    return float(np.sort(frac).sum()) / chunks  # sorted: the same sum whatever the span order


_Gaps = tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int16]]
"""A stage's idle intervals: (stage, start_ns, end_ns, cause code)."""


def _gap_frame(gaps: list[_Gaps]) -> pd.DataFrame:
    """The stages' idle intervals as one frame (stage, start_ns, end_ns, cause), made once from their arrays."""

    def joined(i: int, dtype: type) -> npt.NDArray[Any]:
        return np.concatenate([g[i] for g in gaps]).astype(dtype) if gaps else np.empty(0, dtype)

    stage = np.concatenate([np.full(len(g[1]), g[0], np.int32) for g in gaps]) if gaps else np.empty(0, np.int32)
    return pd.DataFrame(
        {
            "stage": stage,
            "start_ns": joined(1, np.int64),
            "end_ns": joined(2, np.int64),
            "cause": pd.Categorical.from_codes(joined(3, np.int16), dtype=_CAUSE_DTYPE),
        },
        copy=False,
    )


_CAUSE_DTYPE = pd.CategoricalDtype(list(CAUSES))
