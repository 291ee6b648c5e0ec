"""What the cost fit, the in-situ costs and the advice's interval read of a run: its timed parts, a rank at a time.

Note (why a table of parts and not the spans): `ppscope rebalance` needs, of all a run's spans, only the
durations of the parts it balances (`forward`, `backward`, `embed`, `head`, `sample` and `layer` spans), when
they started (the advice's time blocks), their stage and phase, and a training run's passes (its compute summed
per stage, step and micro-batch). `RunTimings` holds just that, a few columns of a few kinds (kernels, sends,
receives, marks and names let go), and every figure is computed from it: the means of the fit (`fit.py`), the
medians of the in-situ costs (`insitu.py`) and the block bootstrap (`ppscope.balance.advise.advice`). A run
directory is read one rank file at a time (`run_timings`, in `workers` processes), each reduced to its share and
the shares merged; a `Trace` in memory is reduced the same way, as one share (`RunTimings.of`). The results are the
same to the last digit: means are sums of integer nanoseconds (exact in any order), and medians and quantiles
depend on the values, not on their order.

What is not bounded by one rank: medians and the advice's block edges are order statistics over the whole
run, so the table keeps one row per timed part (~30 B), not a running sum; a training run's passes are one
row each. Both are far smaller than the spans (a pass has one forward span, and many kernels in a Kineto trace).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ppscope.errors import CorruptFileError, ErrorCode, InvalidConfigError
from ppscope.pool import ordered, processes
from ppscope.trace.actions import BACKWARDS, ActionType
from ppscope.trace.layers import layer_indices
from ppscope.trace.model import COMPUTE_KINDS, Lane, Phase, RunMeta, SpanKind, Trace
from ppscope.trace.store import read_rank_spans, run_files

__all__ = ["TIMED_KINDS", "RunTimings", "as_timings", "merge_passes", "partial_passes", "run_timings"]

TIMED_KINDS = tuple(
    str(k)
    for k in (SpanKind.FORWARD, SpanKind.BACKWARD, SpanKind.EMBED, SpanKind.HEAD, SpanKind.SAMPLE, SpanKind.LAYER)
)
"""The kinds whose spans the costs and the advice read one by one."""
BACKWARD_PHASES = (*BACKWARDS, Phase.BACKWARD)
"""Phases of backward compute: the hook's and the importer's action types, and the schema's `backward`."""
_FORWARD = ActionType.FORWARD
_EXTRAS = {str(SpanKind.EMBED): "embed_ns", str(SpanKind.HEAD): "head_ns", str(SpanKind.SAMPLE): "sample_ns"}
PASS_KEYS = ["stage", "step", "mb"]
_RANK_PASS_KEYS = ["rank", *PASS_KEYS]
"""A pass is summed per rank: ranks that run one stage (data-parallel replicas, tensor-parallel ranks) each
run the stage's pass on the same step and micro-batch ids, and their times are not added together."""
PASS_SUMS = ["forward_ns", "backward_ns", *_EXTRAS.values()]
_COLUMNS = ["rank", "stage", "kind", "phase", "compute", "start_ns", "ns", "layer"]


@dataclass(frozen=True)
class RunTimings:
    """A run's timed parts: one row per span of `TIMED_KINDS`, its training passes, and the few facts about
    its other spans that the costs need."""

    meta: RunMeta
    spans: pd.DataFrame
    """`rank`, `stage` (as recorded), `kind`, `phase`, `compute` (on lane compute), `start_ns`, `ns` (its
    duration), `layer` (a `layer` span's layer index, else -1)."""
    passes: pd.DataFrame
    """Compute summed per (`stage`, `step`, `mb`) with a stage and a micro-batch, in the forward (`F`) and
    backward phases or of the embedding, head and sampling kinds: `PASS_SUMS` and the first `start_ns`;
    per rank (`rank` is a column), not yet averaged over the ranks of a stage nor filtered to passes with both a
    forward and a backward (`training_passes` does both)."""
    phases: frozenset[str]
    """The phases of every span."""
    compute_phases: frozenset[str]
    """The phases of the spans on lane compute."""
    training: bool
    """Whether it runs backward passes: `backward` spans, or compute labelled with a backward phase."""
    weight_grads: bool
    """Whether any span is labelled `W` (weight gradients computed apart)."""
    top_stage: int
    """The highest stage of a span with a stage and a micro-batch (-1: none)."""
    ranks: frozenset[int] = frozenset()
    """The ranks that recorded spans of any kind (`RunMeta.ranks_missing` tells which did not)."""

    @classmethod
    def of(cls, trace: Trace) -> RunTimings:
        """The timings of a whole trace in memory: one share."""
        return cls.of_spans(trace.spans, trace.meta)

    @classmethod
    def of_spans(cls, spans: pd.DataFrame, meta: RunMeta) -> RunTimings:
        """The share of these spans (one rank's, or a whole trace's)."""
        kind = spans["kind"]
        timed = spans[kind.isin(TIMED_KINDS)]
        layer = timed["kind"] == str(SpanKind.LAYER)
        index = np.full(len(timed), -1, np.int32)
        if layer.any():
            index[layer.to_numpy()] = layer_indices(timed.loc[layer, "name"]).to_numpy(np.int32)
        table = pd.DataFrame(
            {
                "rank": timed["rank"].to_numpy(np.int32),
                "stage": timed["stage"].to_numpy(np.int32),
                "kind": pd.Categorical(timed["kind"].astype(str), categories=TIMED_KINDS),
                "phase": timed["phase"].astype(str).astype("category"),
                "compute": (timed["lane"] == Lane.COMPUTE).to_numpy(bool),
                "start_ns": timed["start_ns"].to_numpy(np.int64),
                "ns": (timed["end_ns"] - timed["start_ns"]).to_numpy(np.int64),
                "layer": index,
            }
        )
        compute = kind.isin([str(k) for k in COMPUTE_KINDS])
        phase = spans["phase"]
        labelled = spans.loc[(spans["stage"] >= 0) & (spans["mb"] >= 0), "stage"]
        return cls(
            meta=meta,
            spans=table,
            passes=partial_passes(spans),
            phases=frozenset(str(p) for p in phase.unique()),
            compute_phases=frozenset(str(p) for p in phase[spans["lane"] == Lane.COMPUTE].unique()),
            training=bool((kind == str(SpanKind.BACKWARD)).any() or (compute & phase.isin(BACKWARD_PHASES)).any()),
            weight_grads=bool((phase == ActionType.BACKWARD_WEIGHT).any()),
            top_stage=int(labelled.max()) if len(labelled) else -1,
            ranks=frozenset(int(r) for r in spans["rank"].unique()),
        )

    @classmethod
    def merged(cls, shares: Iterable[RunTimings], meta: RunMeta) -> RunTimings:
        """The run's timings from its ranks' shares (in any order: every figure is order-free)."""
        shares = list(shares)
        if not shares:
            return cls.of_spans(Trace().spans, meta)
        phases = sorted(set().union(*(set(s.spans["phase"].cat.categories) for s in shares)))
        tables = [s.spans.assign(phase=s.spans["phase"].cat.set_categories(phases)) for s in shares]
        return cls(
            meta=meta,
            spans=pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0],
            passes=merge_passes([s.passes for s in shares]),
            phases=frozenset().union(*(s.phases for s in shares)),
            compute_phases=frozenset().union(*(s.compute_phases for s in shares)),
            training=any(s.training for s in shares),
            weight_grads=any(s.weight_grads for s in shares),
            top_stage=max(s.top_stage for s in shares),
            ranks=frozenset().union(*(s.ranks for s in shares)),
        )

    def kind(self, kind: str) -> pd.DataFrame:
        """The rows of one kind."""
        return self.spans[self.spans["kind"] == kind]

    @property
    def has_layers(self) -> bool:
        return bool((self.spans["kind"] == str(SpanKind.LAYER)).any())

    def with_meta(self, meta: RunMeta) -> RunTimings:
        return dataclasses.replace(self, meta=meta)


def as_timings(run: Trace | RunTimings) -> RunTimings:
    """`run` as timings: a trace in memory is reduced, timings are taken as they are."""
    return run if isinstance(run, RunTimings) else RunTimings.of(run)


def partial_passes(spans: pd.DataFrame) -> pd.DataFrame:
    """`RunTimings.passes` of these spans: sums per (rank, stage, step, mb), index-sorted, one row per key."""
    rows = spans[spans["kind"].isin([str(k) for k in COMPUTE_KINDS]) & (spans["stage"] >= 0) & (spans["mb"] >= 0)]
    rows = rows[(rows["phase"] == _FORWARD) | rows["phase"].isin(BACKWARD_PHASES) | rows["kind"].isin(list(_EXTRAS))]
    ns = (rows["end_ns"] - rows["start_ns"]).to_numpy(np.int64)
    extra = rows["kind"].map(_EXTRAS)
    column = extra.where(extra.notna(), rows["phase"].map(lambda p: "forward_ns" if p == _FORWARD else "backward_ns"))
    frame = pd.DataFrame({k: rows[k].to_numpy() for k in _RANK_PASS_KEYS})
    for name in PASS_SUMS:
        frame[name] = np.where((column == name).to_numpy(bool), ns, 0)
    frame["start_ns"] = rows["start_ns"].to_numpy(np.int64)
    return _sum_passes(frame)


def merge_passes(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Partial pass tables merged: sums added, the first start kept, per (rank, stage, step, mb)."""
    parts = [p for p in parts if len(p)]
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return _sum_passes(pd.DataFrame(columns=[*_RANK_PASS_KEYS, *PASS_SUMS, "start_ns"]))
    return _sum_passes(pd.concat(parts, ignore_index=True))


def _sum_passes(frame: pd.DataFrame) -> pd.DataFrame:
    agg = {**dict.fromkeys(PASS_SUMS, "sum"), "start_ns": "min"}
    out = frame.groupby(_RANK_PASS_KEYS, sort=True).agg(agg).reset_index()
    return out.astype({c: "int64" for c in [*PASS_SUMS, "start_ns"]})


def run_timings(run_dir: str | Path, *, workers: int = 1) -> RunTimings:
    """The timings of a run directory, read one rank file at a time in `workers` processes (1: in this one):
    memory holds one rank's spans per worker and the merged table, never the run's spans. A damaged rank file
    is left out, as `load_run` leaves it out; with no rank left, its error is raised."""
    if workers < 1:
        raise InvalidConfigError(ErrorCode.BAD_VALUE, f"--workers must be >= 1, got {workers}")
    meta, files, _ = run_files(run_dir)
    jobs = [({r: files[r]}, _rank_meta(meta, r), r) for r in sorted(files)]
    shares: list[RunTimings] = []
    damaged: list[CorruptFileError] = []
    with processes(workers) as pool:
        for share in ordered(pool, _rank_share, jobs, workers):
            if isinstance(share, CorruptFileError):
                damaged.append(share)
            else:
                shares.append(share)
    if damaged and not shares:  # nothing else to read: the error, as `load_run` raises it
        raise damaged[0]
    return RunTimings.merged(shares, meta)


def _rank_meta(meta: RunMeta, rank: int) -> RunMeta:
    """The metadata a rank's task needs: its own rank's clock only."""
    return dataclasses.replace(meta, ranks=[i for i in meta.ranks if i.rank == rank])


def _rank_share(files: dict[int, Path], meta: RunMeta, rank: int) -> RunTimings | CorruptFileError:
    """One rank file's share, or why the file cannot be read."""
    try:
        spans, _, _ = read_rank_spans(files, [rank], meta)
    except CorruptFileError as exc:
        return exc
    return RunTimings.of_spans(spans, meta)
