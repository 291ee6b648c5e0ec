"""Advice you can trust: an interval on a predicted speedup from the run's own variability, and the rule that
says "keep your split" when the gain is noise.

The interval is a block bootstrap over time. Each run is cut into consecutive blocks; a resample draws as
many blocks with replacement (the same blocks for every stage, so a machine's slow spell moves all of them
together, as it did in the run) and scales each part of each stage's cost (its layers, the embedding, the LM
head, sampling) by that part's resampled mean time over its mean in the whole run. The speedup of the proposed
split over the current one under those costs, over many resamples, gives the interval. Blocks rather than
single passes keep the drifts of a shared machine inside the resample: passes next to each other are not
independent. It measures how sure the run's own data is, not how far a cost model can be off another way
(a profile taken elsewhere, a changed load); the 3% floor of the keep rule stands for that.

This module knows nothing about how costs were found (profile, fit or given) or how advice is printed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from ppscope.balance.advise.problem import BalanceProblem
from ppscope.balance.advise.rebalance import evaluate
from ppscope.balance.costs import LayerCosts
from ppscope.balance.measured.timings import RunTimings, as_timings
from ppscope.balance.measured.training import training_passes
from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.model import SpanKind, Trace
from ppscope.trace.notices import Notice, NoticeCode

__all__ = [
    "GIVEN_COSTS",
    "KEEP_BELOW_GAIN",
    "MIN_BLOCKS",
    "MODELLED_COSTS",
    "SAME_SPLIT",
    "SINGLE_TRACE",
    "Advice",
    "BlockTimes",
    "Interval",
    "Part",
    "Simulated",
    "SpeedupOf",
    "advise",
    "paired_throughput_ratio",
    "speedup_interval",
    "stage_block_times",
    "too_short",
]

MIN_BLOCKS = 4
"""Fewer time blocks than this cannot say how a run varies."""
KEEP_BELOW_GAIN = 0.03
"""A predicted gain under 3% is kept: runs of one split differ by about that on a shared machine."""
SpeedupOf = Callable[[Sequence[float], Sequence[float]], float]
"""The speedup of the proposed split over the current one, given each one's stage times (ms per pass)."""


@dataclass(frozen=True, kw_only=True)
class Interval:
    """A range the true value lies in with the stated confidence."""

    low: float
    high: float
    level: float = 0.95
    """Share of resamples between `low` and `high`."""
    how: str = ""
    """How it was found, in words."""

    def __contains__(self, value: float) -> bool:
        return self.low <= value <= self.high

    def text(self) -> str:
        return f"×{self.low:.3f}–×{self.high:.3f}"


@dataclass(frozen=True, kw_only=True)
class Simulated:
    """Both splits through the simulator calibrated on the measured run (`ppscope.simulate.advice`): its schedule,
    sizes, hop latency and host gaps. Unlike the slowest stage's ratio, it sees fill, drain and the hops a
    micro-batch waits for once the stages are balanced."""

    speedup: float
    """Simulated time of the current split ÷ that of the proposed one."""
    hop_latency_ns: int
    """The hop latency replayed: the median over messages, as `analyze`'s hops give it."""
    overhead_ms: float
    error: float = 0.0
    """How far the replay of the run with its own split is from the run's measured time (|measured ÷ replayed −
    1|): the replay's own error, which the predicted interval carries."""


@dataclass(frozen=True, kw_only=True)
class Advice:
    """Change to the proposed split, or keep the current one, and why."""

    change: bool
    reason: str
    no_interval: Notice | None = None
    """Why the predicted speedup has no interval, when it has none (a code of `NoticeCode`'s advice cases)."""

    @property
    def word(self) -> str:
        return "change" if self.change else "keep"


def advise(
    current: Sequence[int],
    proposed: Sequence[int],
    speedup: float,
    interval: Interval | None,
    no_interval: Notice | None = None,
) -> Advice:
    """Keep the current split when it is already the best, when the predicted gain is under 3%, or when the
    interval of the speedup reaches down to ×1 (the run's own variability could erase the gain). `no_interval`
    says why there is no interval, when there is none."""
    if list(current) == list(proposed):
        return Advice(
            change=False,
            reason="the current split is already the best one the cost model finds",
            no_interval=None if interval is not None else SAME_SPLIT,
        )
    why = None if interval is not None else no_interval
    gain = speedup - 1.0
    if gain < KEEP_BELOW_GAIN:
        return Advice(
            change=False,
            reason=f"the predicted gain {gain:+.1%} is under {KEEP_BELOW_GAIN:.0%}: runs of one split differ by "
            "about that",
            no_interval=why,
        )
    if interval is not None and interval.low <= 1.0:
        return Advice(
            change=False,
            reason=f"the {interval.level:.0%} interval of the speedup, {interval.text()}, reaches ×1: the run's own "
            "variability could erase the gain",
        )
    sure = f"{interval.level:.0%} interval {interval.text()}" if interval is not None else f"no interval: {why}"
    return Advice(change=True, reason=f"predicted speedup ×{speedup:.3f} ({sure})", no_interval=why)


SAME_SPLIT = Notice(NoticeCode.SAME_SPLIT, "the proposed split is the current one: no gain to put an interval on")
GIVEN_COSTS = Notice(NoticeCode.GIVEN_COSTS, "costs given without a run")
MODELLED_COSTS = Notice(NoticeCode.MODELLED_COSTS, "costs modelled from the model and the GPU, not measured")
SINGLE_TRACE = Notice(
    NoticeCode.SINGLE_TRACE,
    "the model is calibrated on one trace's busy time per stage: one figure a stage, so how it varies is unknown",
)


def too_short(runs: int) -> Notice:
    """The runs are too short to tell how their stage times vary."""
    what = "the run is too short to tell how it varies" if runs == 1 else "the runs are too short to tell how they vary"
    return Notice(NoticeCode.TOO_SHORT, what)


class Part(IntEnum):
    """The parts of a stage's pass whose costs the rebalancer moves separately: its layers (`forward` spans),
    and the embedding, LM head and sampling that stay on the first or last stage. The value is the part's index
    on the parts axis of `BlockTimes`."""

    LAYERS = 0
    EMBED = 1
    HEAD = 2
    SAMPLE = 3

    @property
    def kind(self) -> SpanKind:
        """The span kind that times this part."""
        return (SpanKind.FORWARD, SpanKind.EMBED, SpanKind.HEAD, SpanKind.SAMPLE)[self]


class BlockTimes(NamedTuple):
    """Each part of each stage in consecutive time blocks, arrays of shape (blocks, parts, stages)."""

    busy_ns: np.ndarray
    """Time the part took in the block."""
    spans: np.ndarray
    """Spans (or a training run's passes) of the part in the block."""


def stage_block_times(trace: Trace | RunTimings, blocks: int = 10) -> BlockTimes | None:
    """Time and spans of each `Part` of each stage in each of `blocks` consecutive time blocks. None when some
    block lacks a `forward` pass of some stage (too short a run to tell its spread). In a training run a stage's
    layers part is each pass's forward plus backward (`ppscope.balance.measured.training`), counted once per
    pass."""
    if blocks < 1:
        return None
    stages = len(trace.meta.split)
    start, part, stage, ns = _part_rows(as_timings(trace))
    keep = (stage >= 0) & (stage < stages)
    start, part, stage, ns = start[keep], part[keep], stage[keep], ns[keep]
    if not len(start):
        return None
    edges = np.quantile(start, np.linspace(0.0, 1.0, blocks + 1)[1:-1])
    where = (np.searchsorted(edges, start, side="right"), part, stage)
    busy = np.zeros((blocks, len(Part), stages))
    count = np.zeros((blocks, len(Part), stages))
    np.add.at(busy, where, ns)
    np.add.at(count, where, 1.0)
    if (count[:, Part.LAYERS, :] == 0).any():
        return None
    return BlockTimes(busy, count)


def _part_rows(trace: RunTimings) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(start ns, part, stage, time ns) of each timed part: spans of the `Part` kinds, or in a training run
    its passes (layers: forward + backward; the embedding, head and sampling where a pass has them)."""
    if trace.training:
        passes = training_passes(trace)
        layers = (passes["forward_ns"] + passes["backward_ns"]).to_numpy(np.float64)
        cols = [layers, *(passes[c].to_numpy(np.float64) for c in ("embed_ns", "head_ns", "sample_ns"))]
        ns = np.concatenate(cols)
        rows = len(passes)
        part = np.repeat(np.arange(len(Part)), rows)
        has = (ns > 0) | (part == Part.LAYERS)
        start = np.tile(passes["start_ns"].to_numpy(np.int64), len(Part))
        stage = np.tile(passes["stage"].to_numpy(np.int64), len(Part))
        return start[has], part[has], stage[has], ns[has]
    spans = trace.spans
    rows_ = spans[spans["kind"].isin([str(p.kind) for p in Part])]
    part = np.select([(rows_["kind"] == str(p.kind)).to_numpy(bool) for p in Part], [int(p) for p in Part])
    ns = rows_["ns"].to_numpy(np.float64)
    return rows_["start_ns"].to_numpy(np.int64), part, rows_["stage"].to_numpy(np.int64), ns


def speedup_interval(
    runs: Sequence[Trace | RunTimings],
    problem: BalanceProblem,
    current: Sequence[int],
    proposed: Sequence[int],
    *,
    blocks: int = 10,
    resamples: int = 400,
    level: float = 0.95,
    seed: int = 0,
    bound: SpeedupOf | None = None,
) -> Interval | None:
    """The `level` interval of the speedup of `proposed` over `current` under `problem`, from a block
    bootstrap of the runs' stage times (see the module's note); None when the runs are too short to tell.
    `bound`: the speedup of the two splits' stage times (default: slowest stage ÷ slowest stage), evaluated in
    every resample, so a floor made of the stage times (`ppscope.balance.advise.cores`) varies with them too."""
    # Only runs whose split covers the problem's stages and layers tell how its stages' costs vary; the layers'
    # factors are then placed by the split of the last of them, the one that ran them.
    traces = [as_timings(r) for r in runs]
    fits = [t for t in traces if len(t.meta.split) == problem.stages and sum(t.meta.split) == problem.costs.layers]
    parts = [stage_block_times(t, _blocks(t, blocks)) for t in fits]
    if not parts or any(p is None for p in parts):
        return None
    busy = np.concatenate([p.busy_ns for p in parts if p is not None])  # (all blocks, parts, stages)
    count = np.concatenate([p.spans for p in parts if p is not None])
    measured = fits[-1].meta.split
    with np.errstate(invalid="ignore", divide="ignore"):
        whole = busy.sum(axis=0) / count.sum(axis=0)
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, len(busy), size=(resamples, len(busy)))
        factors = (busy[picks].sum(axis=1) / count[picks].sum(axis=1)) / whole  # (resamples, parts, stages)
    factors = np.where(np.isfinite(factors), factors, 1.0)  # a part a stage never runs keeps its cost
    speedups = [_speedup(problem, measured, current, proposed, f, bound or _slowest) for f in factors]
    low, high = np.quantile(speedups, [(1 - level) / 2, (1 + level) / 2])
    if not (math.isfinite(low) and math.isfinite(high)):
        return None
    how = f"block bootstrap: {len(busy)} time blocks of {len(parts)} run(s), {resamples} resamples"
    return Interval(low=float(low), high=float(high), level=level, how=how)


def paired_throughput_ratio(
    pairs: Sequence[tuple[Trace, Trace]],
    *,
    blocks: int = 10,
    resamples: int = 400,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[tuple[float, ...], Interval | None]:
    """Throughput of the `after` run ÷ the `before` run, pair by pair (each pair ran close in time), and the
    `level` interval of their median: a two-level bootstrap that draws the pairs with replacement (two pairs
    that disagree widen it, as the machine's mood between them should) and, within each run, its time blocks
    (its tokens over time, see `_token_blocks`). The point figures and the interval are one statistic, and the
    interval is widened to hold the median where the resampling alone would not. Empty, None when a run is too
    short or records no tokens."""
    rates = [(_token_blocks(b, blocks), _token_blocks(a, blocks)) for b, a in pairs]
    if not rates or any(b is None or a is None for b, a in rates):
        return (), None
    known = [(b, a) for b, a in rates if b is not None and a is not None]
    ratios = tuple(float(a[0].sum() / a[1].sum() / (b[0].sum() / b[1].sum())) for b, a in known)
    rng = np.random.default_rng(seed)

    def rate(run: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        tokens, ns = run
        picks = rng.integers(0, len(tokens), size=(resamples, len(tokens)))
        return tokens[picks].sum(axis=1) / ns[picks].sum(axis=1)

    per_pair = np.stack([rate(a) / rate(b) for b, a in known])  # (pairs, resamples)
    chosen = rng.integers(0, len(known), size=(resamples, len(known)))
    medians = np.median(per_pair[chosen, np.arange(resamples)[:, None]], axis=1)
    low, high = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])
    how = (
        f"two-level bootstrap: {len(known)} pair(s) drawn with replacement, {blocks} time blocks of each run, "
        f"{resamples} resamples"
    )
    centre = float(np.median(ratios))
    return ratios, Interval(low=min(float(low), centre), high=max(float(high), centre), level=level, how=how)


def _token_blocks(trace: Trace, blocks: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(tokens, ns) of each of `blocks` equal time blocks between the run's first and last token."""
    spans = trace.spans
    sample = spans[(spans["kind"] == str(SpanKind.SAMPLE)) & (spans["tokens"] > 0)]
    if len(sample) < blocks * MIN_BLOCKS:
        return None
    end = sample["end_ns"].to_numpy(np.int64)
    edges = np.linspace(float(end.min()), float(end.max()), blocks + 1)
    block = np.clip(np.searchsorted(edges, end, side="right") - 1, 0, blocks - 1)
    tokens = np.bincount(block, weights=sample["tokens"].to_numpy(np.float64), minlength=blocks)
    if edges[-1] <= edges[0]:
        return None
    return tokens, np.diff(edges)


def _blocks(trace: RunTimings, most: int) -> int:
    """As many blocks as `most`, fewer for a short run: at least 3 passes of each stage in each (0: too short)."""
    forward = training_passes(trace) if trace.training else trace.kind(str(SpanKind.FORWARD))
    per_stage = forward.groupby("stage").size()
    fewest = int(per_stage.min()) if len(per_stage) == len(trace.meta.split) else 0
    blocks = min(most, fewest // 3)
    return blocks if blocks >= MIN_BLOCKS else 0


def _speedup(
    problem: BalanceProblem,
    measured: Sequence[int],
    current: Sequence[int],
    proposed: Sequence[int],
    factor: np.ndarray,
    bound: SpeedupOf,
) -> float:
    """Speedup of `proposed` over `current` with each cost scaled by its part's factor (`factor[part, stage]`):
    a layer's by the `forward` factor of the stage that ran it (split `measured`), the embedding's by the
    first stage's embed factor, the head's and sampling's by the last stage's."""
    costs = problem.costs
    scale = np.repeat(factor[Part.LAYERS], measured)  # each layer's factor, that of the stage that ran it
    if len(scale) != costs.layers:
        raise InvalidConfigError(
            ErrorCode.COUNT_MISMATCH, f"the split {list(measured)} holds {len(scale)} layers, the costs {costs.layers}"
        )
    scaled = LayerCosts(
        layer_ms=tuple(float(x) for x in np.asarray(costs.layer_ms) * scale),
        embed_ms=costs.embed_ms * float(factor[Part.EMBED, 0]),
        head_ms=costs.head_ms * float(factor[Part.HEAD, -1]),
        sample_ms=costs.sample_ms * float(factor[Part.SAMPLE, -1]),
    )
    resampled = BalanceProblem(
        costs=scaled, stages=problem.stages, stage_costs=problem.stage_costs, memory=None, objective="throughput"
    )
    return bound(evaluate(resampled, current).stage_ms, evaluate(resampled, proposed).stage_ms)


def _slowest(current_ms: Sequence[float], proposed_ms: Sequence[float]) -> float:
    return max(current_ms) / max(proposed_ms) if max(proposed_ms) > 0 else 1.0
