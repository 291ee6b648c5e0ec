"""The exact search behind `ppscope.balance.advise.rebalance`: stage times from prefix sums, feasibility probes, and
the searches over the slowest-stage time and the KV capacity. See `ppscope.balance.advise.rebalance` for the note on
exactness.

Callers build a `CostModel` from a `BalanceProblem`; this module knows nothing about engines or output.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ppscope.balance.advise.problem import UNLIMITED_TOKENS, BalanceProblem

__all__ = ["CostModel", "evenest", "max_kv", "min_time", "probe"]


class CostModel:
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


def probe(model: CostModel, limit_ms: float, kv_tokens: int, *, even: bool = False) -> list[int] | None:
    """A split whose every stage takes <= limit_ms and holds >= kv_tokens tokens of KV cache, or None.

    With `even`, among the splits that qualify prefer one that spreads the cost evenly (slower to build).
    """
    nmax = model.max_layers(kv_tokens)
    if min(nmax) < 1 or limit_ms < model.lower_bound_ms:
        return None
    found = _probe_greedy(model, limit_ms, nmax, even=even)
    return _probe_sets(model, limit_ms, nmax, even=even) if found is _NOT_GREEDY else found


_NOT_GREEDY = object()


def _counts(ends: list[int]) -> list[int]:
    """Layer counts from the end positions of each stage."""
    return [e - s for s, e in zip([0, *ends[:-1]], ends, strict=True)]


def _probe_greedy(model: CostModel, limit_ms: float, nmax: list[int], *, even: bool) -> Any:
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
            last = min(last, max(first, _even_start(model, s, e)))
        ends.append(last)
    ends.reverse()
    return _counts(ends)


def _even_start(model: CostModel, s: int, e: int) -> int:
    """Where stage s, ending at e, would start if the layer cost before e were shared out evenly by stages
    0..s: the evenness rule of `probe(even=True)`, applied from the last stage back."""
    return bisect.bisect_left(model.prefix, model.prefix[e] * s / (s + 1))


def _first_start(model: CostModel, s: int, e: int, limit_ms: float) -> int:
    """The smallest i with time(s, i, e) <= limit_ms (time falls as i grows)."""
    lo, hi = 0, e - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if model.time(s, mid, e) <= limit_ms:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _probe_sets(model: CostModel, limit_ms: float, nmax: list[int], *, even: bool = False) -> list[int] | None:
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
        valid = starts[(starts < e) & (hi >= e)]  # every one is reached by stages < s and reaches e
        if even:  # the valid start nearest the even one (the later of two as near)
            target = _even_start(model, s, e)
            ends.append(int(valid[np.lexsort((-valid, np.abs(valid - target)))[0]]))
        else:
            ends.append(int(valid.max()))
    ends.reverse()
    return _counts(ends)


def min_time(model: CostModel, kv_tokens: int) -> list[int] | None:
    """The split with the smallest slowest stage among those keeping kv_tokens per stage (None: none)."""
    split = probe(model, math.inf, kv_tokens)
    if split is None:
        return None
    hi = max(model.split_times(split))
    lo = math.nextafter(model.lower_bound_ms, -math.inf)  # known infeasible
    while True:
        mid = lo + (hi - lo) / 2 if hi - lo > 1e-9 * abs(hi) else math.nextafter(hi, -math.inf)
        if mid <= lo or mid >= hi:
            return split
        found = probe(model, mid, kv_tokens)
        if found is None:
            lo = mid
        else:
            split, hi = found, max(model.split_times(found))


def max_kv(model: CostModel, limit_ms: float) -> int:
    """The most KV tokens every stage can keep with all stages within limit_ms (-1: nothing fits)."""
    mem = model.memory
    assert mem is not None
    found = probe(model, limit_ms, mem.min_kv_tokens)
    if found is None:
        return -1
    if mem.kv_bytes_per_token_per_layer == 0:
        return UNLIMITED_TOKENS

    def capacity(split: list[int]) -> int:
        return min(mem.kv_tokens(s, model.stages, n) for s, n in enumerate(split))

    lo = capacity(found)  # achieved, so feasible
    # Some stage of every split holds at least ceil(L/P) layers, which caps the pipeline's capacity.
    most = -(-model.layers // model.stages)
    hi = max(mem.kv_tokens(s, model.stages, most) for s in range(model.stages)) + 1  # never feasible
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = probe(model, limit_ms, mid)
        if found is None:
            hi = mid
        else:
            lo = capacity(found)
    return lo


def evenest(model: CostModel, split: list[int], kv_tokens: int) -> list[int]:
    """The evenest split as fast as `split` keeping kv_tokens per stage."""
    best = probe(model, max(model.split_times(split)), kv_tokens, even=True)
    assert best is not None, "a limit met by one split is met by the probe"
    return best
