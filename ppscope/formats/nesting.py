"""Helpers the exporters share: interval nesting and lane stacking (output files: `ppscope.trace.outputs`).

Nothing here knows a file format.
"""

from __future__ import annotations

import numpy as np

__all__ = ["nests", "stack_levels"]


def nests(starts: np.ndarray, ends: np.ndarray) -> bool:
    """True when the intervals, taken together, form a proper stack: any two are disjoint or nested."""
    order = np.lexsort((-ends, starts))
    stack: list[int] = []
    for i in order.tolist():
        s, e = starts[i], ends[i]
        while stack and ends[stack[-1]] <= s:
            stack.pop()
        if stack and ends[stack[-1]] < e:
            return False
        stack.append(i)
    return True


def stack_levels(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A level per interval such that the intervals of each level nest (greedy, first level that fits)."""
    order = np.lexsort((-ends, starts))
    levels = np.zeros(len(starts), dtype=np.int64)
    stacks: list[list[int]] = []
    for i in order.tolist():
        s, e = starts[i], ends[i]
        for level, stack in enumerate(stacks):
            while stack and ends[stack[-1]] <= s:
                stack.pop()
            if not stack or ends[stack[-1]] >= e:
                stack.append(i)
                levels[i] = level
                break
        else:
            stacks.append([i])
            levels[i] = len(stacks) - 1
    return levels
