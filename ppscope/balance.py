"""The rebalancer: the contiguous layer split that minimises the slowest stage, exactly.

Stage s holding layers [i, j) takes
    t_s = (embed if s is first + Σ layer costs + head and sample if s is last + overhead_s) / speed_s + hop_s
and, with a memory model, holds weights plus KV cache within its limit; the pipeline's KV capacity is the
minimum over stages. `balance` returns the split with the smallest max_s t_s, ties going to the largest KV
capacity (objective `throughput`), or the largest KV capacity, ties going to the fastest (`memory`).
It knows nothing about where costs come from (`ppscope.costs`) or how engines run a split.

Note on exactness: every stage time is computed by one formula from prefix sums (`_Model.time`).
Floating-point rounding is monotone, so "stage s can take layers [i, j) within T" is monotone in i, j and T,
and a search over T that always snaps to the slowest stage of a split it found ends on an achieved value
with the next smaller double infeasible: the optimum itself, not an approximation of it. The probe "is there
a split within T keeping C tokens of KV cache per stage" is a greedy O(P log L) reach while every stage can
hold each single layer it might start at (checked with a range-maximum table), else an exact O(P·L) pass
over every reachable stage end. KV capacity is an integer, searched the same way.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ppscope.costs import LayerCosts, StageCosts
from ppscope.errors import InvalidConfigError
from ppscope.split import format_split, validate_split, vllm_default_split

__all__ = [
    "OBJECTIVES",
    "BalanceProblem",
    "MemoryModel",
    "Rebalance",
    "SplitEval",
    "balance",
    "engine_lines",
    "evaluate",
    "megatron_args",
    "rebalance",
]

OBJECTIVES = ("throughput", "memory")
_UNLIMITED = 1 << 62  # KV capacity of a stage without a memory model, or with no KV cache


@dataclass(frozen=True, kw_only=True)
class MemoryModel:
    """What each stage must hold: weights of its layers (+ embedding / LM head at the ends) and KV cache."""

    limit_bytes: tuple[int, ...]
    """Memory each stage may use for weights, KV cache and reserve (already times the utilisation)."""
    layer_bytes: int
    """Weights of one decoder layer."""
    kv_bytes_per_token_per_layer: int
    embed_bytes: int = 0
    """Weights of the embedding, on the first stage."""
    head_bytes: int = 0
    """Weights of the final norm and LM head plus the logits buffer, on the last stage."""
    reserve_bytes: int = 0
    """Per stage: activations, workspace and runtime that are neither weights nor KV cache."""
    min_kv_tokens: int = 0
    """Every stage must hold at least this many tokens of KV cache."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit_bytes", tuple(int(b) for b in self.limit_bytes))
        for name in ("layer_bytes", "kv_bytes_per_token_per_layer", "embed_bytes", "head_bytes", "reserve_bytes"):
            if getattr(self, name) < 0:
                raise InvalidConfigError(f"memory model: {name} must be >= 0, got {getattr(self, name)}")
        if any(b < 0 for b in self.limit_bytes):
            raise InvalidConfigError(f"memory model: stage limits must be >= 0 bytes, got {self.limit_bytes}")
        if self.min_kv_tokens < 0:
            raise InvalidConfigError(f"memory model: min_kv_tokens must be >= 0, got {self.min_kv_tokens}")

    def free_bytes(self, stage: int, stages: int) -> int:
        """What stage `stage` has for its decoder layers and their KV cache."""
        fixed = self.reserve_bytes + (self.embed_bytes if stage == 0 else 0)
        fixed += self.head_bytes if stage == stages - 1 else 0
        return self.limit_bytes[stage] - fixed

    def kv_tokens(self, stage: int, stages: int, layers: int) -> int:
        """Tokens of KV cache the stage holds with `layers` layers; negative when its weights do not fit."""
        left = self.free_bytes(stage, stages) - layers * self.layer_bytes
        if left < 0:
            return -1
        per_token = layers * self.kv_bytes_per_token_per_layer
        return left // per_token if per_token else _UNLIMITED

    def max_layers(self, stage: int, stages: int, kv_tokens: int) -> int:
        """Most layers the stage can hold and still keep `kv_tokens` tokens of KV cache."""
        free = self.free_bytes(stage, stages)
        if free < 0:
            return 0
        per_layer = self.layer_bytes + self.kv_bytes_per_token_per_layer * kv_tokens
        return free // per_layer if per_layer else _UNLIMITED


@dataclass(frozen=True, kw_only=True)
class BalanceProblem:
    """Everything the rebalancer needs: costs, the number of stages, per-stage terms, memory, objective."""

    costs: LayerCosts
    stages: int
    stage_costs: StageCosts = field(default_factory=StageCosts)
    memory: MemoryModel | None = None
    objective: str = "throughput"

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise InvalidConfigError(f"the pipeline needs at least 1 stage, got {self.stages}")
        if self.costs.layers < self.stages:
            raise InvalidConfigError(
                f"{self.costs.layers} layer cost(s) cannot fill {self.stages} stages (each needs at least one "
                f"layer): give one cost per decoder layer or use at most {self.costs.layers} stages"
            )
        if self.objective not in OBJECTIVES:
            raise InvalidConfigError(f"unknown objective {self.objective!r}; valid: {', '.join(OBJECTIVES)}")
        if self.memory is not None and len(self.memory.limit_bytes) != self.stages:
            raise InvalidConfigError(
                f"memory model has {len(self.memory.limit_bytes)} stage limit(s) but the pipeline has {self.stages}"
            )
        self.stage_costs.resolve(self.stages)  # validates lengths and values now, not mid-search


@dataclass(frozen=True, kw_only=True)
class SplitEval:
    """A split and what the cost model predicts for it."""

    split: tuple[int, ...]
    stage_ms: tuple[float, ...]
    """Predicted time of each stage per micro-batch."""
    kv_tokens: tuple[int, ...] | None
    """KV cache tokens each stage holds (None without a memory model; -1: weights do not fit)."""

    @property
    def max_ms(self) -> float:
        return max(self.stage_ms)

    @property
    def bottleneck(self) -> int:
        return self.stage_ms.index(self.max_ms)

    @property
    def kv_capacity(self) -> int | None:
        """Tokens the whole pipeline holds: the minimum over stages."""
        return None if self.kv_tokens is None else min(self.kv_tokens)

    @property
    def fits(self) -> bool:
        return self.kv_tokens is None or min(self.kv_tokens) >= 0


class _Model:
    """The problem flattened into lists for the search's inner loops."""

    def __init__(self, problem: BalanceProblem) -> None:
        p = self.stages = problem.stages
        self.layers = problem.costs.layers
        self.prefix = [0.0, *itertools.accumulate(problem.costs.layer_ms)]
        self.prefix_array = np.asarray(self.prefix)
        self.overhead, self.comm, self.speed = problem.stage_costs.resolve(p)
        self.extra = [0.0] * p
        self.extra[0] += problem.costs.embed_ms
        self.extra[-1] += problem.costs.last_extra_ms
        self.memory = problem.memory

    def time(self, s: int, i: int, j: int) -> float:
        """The one formula for a stage's time (see the module note on exactness)."""
        return (self.extra[s] + (self.prefix[j] - self.prefix[i]) + self.overhead[s]) / self.speed[s] + self.comm[s]

    def split_times(self, split: Sequence[int]) -> list[float]:
        out, i = [], 0
        for s, n in enumerate(split):
            out.append(self.time(s, i, i + n))
            i += n
        return out

    def kv_tokens(self, split: Sequence[int]) -> list[int] | None:
        if self.memory is None:
            return None
        return [self.memory.kv_tokens(s, self.stages, n) for s, n in enumerate(split)]

    def max_layers(self, kv_tokens: int) -> list[int]:
        if self.memory is None:
            return [self.layers] * self.stages
        return [min(self.layers, self.memory.max_layers(s, self.stages, kv_tokens)) for s in range(self.stages)]

    def far(self, s: int, i: int, limit_ms: float) -> int:
        """The largest j with time(s, i, j) <= limit_ms (i when not even one layer fits)."""
        if limit_ms == math.inf:
            return self.layers
        target = (limit_ms - self.comm[s]) * self.speed[s] - self.extra[s] - self.overhead[s]
        j = max(i, bisect.bisect_right(self.prefix, self.prefix[i] + target, i, self.layers + 1) - 1)
        while j < self.layers and self.time(s, i, j + 1) <= limit_ms:  # the guess may be off by rounding
            j += 1
        while j > i and self.time(s, i, j) > limit_ms:
            j -= 1
        return j

    def times(self, s: int, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """`time` for many segments at once; numpy float64 rounds exactly as Python floats do."""
        pre = self.prefix_array
        return (self.extra[s] + (pre[j] - pre[i]) + self.overhead[s]) / self.speed[s] + self.comm[s]

    def far_many(self, s: int, starts: np.ndarray, limit_ms: float) -> np.ndarray:
        """`far` for many starts at once."""
        n = self.layers
        if limit_ms == math.inf:
            return np.full(len(starts), n, dtype=np.int64)
        pre = self.prefix_array
        target = (limit_ms - self.comm[s]) * self.speed[s] - self.extra[s] - self.overhead[s]
        j = np.clip(np.searchsorted(pre, pre[starts] + target, side="right") - 1, starts, n).astype(np.int64)
        while True:  # the guess may be off by rounding: step until exact
            up = (j < n) & (self.times(s, starts, np.minimum(j + 1, n)) <= limit_ms)
            if not up.any():
                break
            j += up
        while True:
            down = (j > starts) & (self.times(s, starts, j) > limit_ms)
            if not down.any():
                break
            j -= down
        return j

    def prepare_search(self) -> None:
        """Single-layer times, a lower bound on any split's slowest stage, and a range-maximum table."""
        p, n = self.stages, self.layers
        pre = self.prefix_array
        seg = pre[1:] - pre[:-1]
        # Stage s can only hold layers s .. n-p+s; the layer's best stage bounds every split from below.
        best = np.full(n, math.inf)
        for s in range(p):
            t = (self.extra[s] + seg[s : n - p + s + 1] + self.overhead[s]) / self.speed[s] + self.comm[s]
            best[s : n - p + s + 1] = np.minimum(best[s : n - p + s + 1], t)
        self.lower_bound_ms = float(best.max())
        self._table = [seg]  # _table[k][i] = max(seg[i : i + 2**k])
        while 2 ** len(self._table) <= n:
            prev, half = self._table[-1], 2 ** (len(self._table) - 1)
            self._table.append(np.maximum(prev[:-half], prev[half:]))

    def single_max_ms(self, s: int, first: int, last: int) -> float:
        """The slowest single layer of first..last (inclusive) on stage s: rounding is monotone, so it is the
        stage time of the largest layer cost there."""
        k = (last - first + 1).bit_length() - 1
        seg = max(self._table[k][first], self._table[k][last - 2**k + 1])
        return (self.extra[s] + seg + self.overhead[s]) / self.speed[s] + self.comm[s]


def _probe(model: _Model, limit_ms: float, kv_tokens: int, *, even: bool = False) -> list[int] | None:
    """A split whose every stage takes <= limit_ms and holds >= kv_tokens tokens of KV cache, or None.

    With `even`, among the splits that qualify prefer one that spreads the cost evenly (slower to build).
    """
    nmax = model.max_layers(kv_tokens)
    if min(nmax) < 1 or limit_ms < model.lower_bound_ms:
        return None
    found = _probe_greedy(model, limit_ms, nmax, even=even)
    return _probe_sets(model, limit_ms, nmax) if found is _NOT_GREEDY else found


_NOT_GREEDY = object()


def _counts(ends: list[int]) -> list[int]:
    """Layer counts from the end positions of each stage."""
    return [e - s for s, e in zip([0, *ends[:-1]], ends, strict=True)]


def _probe_greedy(model: _Model, limit_ms: float, nmax: list[int], *, even: bool) -> Any:
    # While stage s can hold each single layer it might start at (layers s .. b_{s-1}), the ends reachable
    # after it form the interval [s+1, b_s] with b_s the farthest end from b_{s-1}: the greedy reach decides
    # feasibility. Otherwise the reachable ends may have gaps, and the caller tracks them as sets.
    p, n = model.stages, model.layers
    reach, b = [], 0
    for s in range(p):
        if model.single_max_ms(s, s, b) > limit_ms:
            return _NOT_GREEDY
        b = min(model.far(s, b, limit_ms), b + nmax[s], n - (p - 1 - s))
        reach.append(b)
    if reach[-1] != n:
        return None
    ends = [n]
    for s in range(p - 1, 0, -1):
        # Stage s may start anywhere in [first, last]: every such start is reachable and fits.
        e = ends[-1]
        last = min(reach[s - 1], e - 1)
        first = last
        if even:
            first = max(s, e - nmax[s], _first_start(model, s, e, limit_ms))
            share = model.prefix[e] * s / (s + 1)  # the cost left for stages < s, shared out evenly
            last = min(last, max(first, bisect.bisect_left(model.prefix, share)))
        ends.append(last)
    ends.reverse()
    return _counts(ends)


def _first_start(model: _Model, s: int, e: int, limit_ms: float) -> int:
    """The smallest i with time(s, i, e) <= limit_ms (time falls as i grows)."""
    lo, hi = 0, e - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if model.time(s, mid, e) <= limit_ms:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _probe_sets(model: _Model, limit_ms: float, nmax: list[int]) -> list[int] | None:
    # General case (a single layer may not fit on some stage): track every reachable end explicitly.
    p, n = model.stages, model.layers
    pos = np.arange(n + 1)
    reach = np.zeros(n + 1, dtype=bool)
    reach[0] = True
    history = []
    for s in range(p):
        starts = np.flatnonzero(reach)
        hi = np.minimum(model.far_many(s, starts, limit_ms), starts + nmax[s])
        diff = np.zeros(n + 2, dtype=np.int64)
        ok = hi > starts
        np.add.at(diff, starts[ok] + 1, 1)
        np.add.at(diff, hi[ok] + 1, -1)
        history.append((starts, hi))
        reach = np.cumsum(diff)[: n + 1] > 0
        reach &= pos <= n - (p - 1 - s)
        if not reach.any():
            return None
    if not reach[n]:
        return None
    ends = [n]
    for s in range(p - 1, 0, -1):
        starts, hi = history[s]
        e = ends[-1]
        ok = (starts < e) & (hi >= e)
        ends.append(int(starts[ok].max()))
    ends.reverse()
    return _counts(ends)


def _min_time(model: _Model, kv_tokens: int) -> list[int] | None:
    """The split with the smallest slowest stage among those keeping kv_tokens per stage (None: none)."""
    split = _probe(model, math.inf, kv_tokens)
    if split is None:
        return None
    hi = max(model.split_times(split))
    lo = math.nextafter(model.lower_bound_ms, -math.inf)  # known infeasible
    while True:
        mid = lo + (hi - lo) / 2 if hi - lo > 1e-9 * abs(hi) else math.nextafter(hi, -math.inf)
        if mid <= lo or mid >= hi:
            return split
        found = _probe(model, mid, kv_tokens)
        if found is None:
            lo = mid
        else:
            split, hi = found, max(model.split_times(found))


def _max_kv(model: _Model, limit_ms: float) -> int:
    """The most KV tokens every stage can keep with all stages within limit_ms (-1: nothing fits)."""
    mem = model.memory
    assert mem is not None
    found = _probe(model, limit_ms, mem.min_kv_tokens)
    if found is None:
        return -1
    if mem.kv_bytes_per_token_per_layer == 0:
        return _UNLIMITED

    def capacity(split: list[int]) -> int:
        return min(mem.kv_tokens(s, model.stages, n) for s, n in enumerate(split))

    lo = capacity(found)  # achieved, so feasible
    # Some stage of every split holds at least ceil(L/P) layers, which caps the pipeline's capacity.
    most = -(-model.layers // model.stages)
    hi = max(mem.kv_tokens(s, model.stages, most) for s in range(model.stages)) + 1  # never feasible
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = _probe(model, limit_ms, mid)
        if found is None:
            hi = mid
        else:
            lo = capacity(found)
    return lo


def _no_fit_error(model: _Model) -> InvalidConfigError:
    mem = model.memory
    assert mem is not None
    need = [
        f"stage {s}: {mem.free_bytes(s, model.stages) / 2**30:.2f} GiB free for layers of "
        f"{mem.layer_bytes / 2**30:.2f} GiB"
        for s in range(model.stages)
    ]
    return InvalidConfigError(
        f"no split of {model.layers} layers over {model.stages} stages fits the memory limits "
        f"(with {mem.min_kv_tokens} KV tokens per stage; {'; '.join(need)}): use more stages, more memory per "
        "GPU, or a smaller dtype"
    )


def balance(problem: BalanceProblem) -> list[int]:
    """The optimal split (layer counts per stage) for `problem`; see the module docstring."""
    model = _Model(problem)
    model.prepare_search()
    if model.memory is None:
        split = _min_time(model, 0)
        assert split is not None  # without memory limits every split is feasible
        return _final(model, split, 0)
    if problem.objective == "throughput":
        split = _min_time(model, model.memory.min_kv_tokens)
        if split is None:
            raise _no_fit_error(model)
        kv = _max_kv(model, max(model.split_times(split)))
    else:
        kv = _max_kv(model, math.inf)
        if kv < 0:
            raise _no_fit_error(model)
        split = _min_time(model, kv)
        assert split is not None
    return _final(model, split, kv)


def _final(model: _Model, split: list[int], kv_tokens: int) -> list[int]:
    """The evenest split as fast as `split` keeping kv_tokens per stage."""
    best = _probe(model, max(model.split_times(split)), kv_tokens, even=True)
    assert best is not None, "a limit met by one split is met by the probe"
    return best


def evaluate(problem: BalanceProblem, split: Sequence[int]) -> SplitEval:
    """Predicted stage times and KV capacity of `split` under `problem`'s cost model."""
    validate_split(split, problem.costs.layers, problem.stages)
    model = _Model(problem)
    kv = model.kv_tokens(split)
    return SplitEval(
        split=tuple(split), stage_ms=tuple(model.split_times(split)), kv_tokens=None if kv is None else tuple(kv)
    )


@dataclass(frozen=True, kw_only=True)
class Rebalance:
    """Advice: the current split, the proposed one, and what the cost model predicts for both."""

    current: SplitEval
    proposed: SplitEval
    objective: str

    @property
    def predicted_speedup(self) -> float:
        """Throughput gain: slowest stage before ÷ after (1.0: no gain)."""
        return self.current.max_ms / self.proposed.max_ms if self.proposed.max_ms > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        """The advice as JSON-ready data (keys documented in the README)."""
        both = {"current": self.current, "proposed": self.proposed}
        return {
            "objective": self.objective,
            "current_split": list(self.current.split),
            "proposed_split": list(self.proposed.split),
            "stage_times_ms": {k: list(v.stage_ms) for k, v in both.items()},
            "bottleneck_stage": {k: v.bottleneck for k, v in both.items()},
            "max_stage_ms": {k: v.max_ms for k, v in both.items()},
            "predicted_speedup": self.predicted_speedup,
            "kv_tokens": {k: None if v.kv_tokens is None else list(v.kv_tokens) for k, v in both.items()},
            "kv_capacity_tokens": {k: v.kv_capacity for k, v in both.items()},
            **engine_lines(self.proposed.split),
        }


def rebalance(problem: BalanceProblem, current: Sequence[int] | None = None) -> Rebalance:
    """Advise a split; `current` defaults to vLLM's default rule."""
    cur = list(current) if current is not None else vllm_default_split(problem.costs.layers, problem.stages)
    return Rebalance(
        current=evaluate(problem, cur), proposed=evaluate(problem, balance(problem)), objective=problem.objective
    )


def megatron_args(split: Sequence[int]) -> str | None:
    """Megatron-LM flags for `split`, or None when its form (equal middle stages) cannot express it."""
    if len(split) == 1:
        return ""
    middle = split[1:-1]
    if len(set(middle)) > 1:
        return None
    return f"--decoder-first-pipeline-num-layers {split[0]} --decoder-last-pipeline-num-layers {split[-1]}"


def engine_lines(split: Sequence[int]) -> dict[str, str]:
    """The split written the way each engine takes it."""
    text = format_split(split)
    megatron = megatron_args(split)
    return {
        "vllm_env": f"VLLM_PP_LAYER_PARTITION={text}",
        "sglang_env": f"SGLANG_PP_LAYER_PARTITION={text}",
        "megatron_args": megatron
        if megatron is not None
        else "(not expressible: Megatron's first/last form needs equal middle stages)",
        "ppscope_run": f"ppscope run --split {text}",
    }
