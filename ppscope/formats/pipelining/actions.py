"""torch.distributed.pipelining's actions: their names in a trace, where stages sit, and the schedule their
order makes.

torch's runtime schedules (interleaved 1F1B, looped BFS, zero bubble, ZBV, DualPipeV) wrap every action in a
profiler range `PP:{stage}{type}{mb}` (`PP:2F0`, `PP:3RECV_B1`, `PP:0REDUCE_GRAD`), DualPipeV's paired actions
in `PP:(0F3;3B1)OVERLAP_F_B`; ScheduleGPipe writes `Forward i` / `Backward i`; Schedule1F1B writes none. This
module reads those names as `ppscope.trace.actions.Action`s (torch's text form after `PP:`), tells the
placement of stages on ranks (loop: stage s on rank s mod P; V: rank r holds stages r and 2P-1-r) and names
the schedule from the order of compute actions of one step on each rank. It knows nothing about file
formats; the Kineto importer and the recording hook both use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ppscope.errors import InvalidConfigError
from ppscope.trace.actions import PASSES, Action, ActionType
from ppscope.trace.schedules import Schedule

__all__ = ["is_action_range", "name_schedule", "parse_action", "placement_name"]

_PREFIX = "PP:"
_SINGLE = re.compile(r"^(Forward|Backward) (\d+)$")
_F, _B = ActionType.FORWARD, ActionType.FULL_BACKWARD


def is_action_range(name: str) -> bool:
    """A range torch.distributed.pipelining writes around an action, whether or not `parse_action` reads it."""
    return name.startswith(_PREFIX) or _SINGLE.match(name) is not None


def parse_action(name: str) -> Action | None:
    """The action a profiler range names (`stage` -1 for a single-stage schedule's `Forward i`); None for a
    range of anything else, and for a `PP:` range this ppscope cannot read (a newer torch's action type)."""
    if name.startswith(_PREFIX):
        try:
            return Action.parse(name[len(_PREFIX) :])
        except InvalidConfigError:
            return None
    m = _SINGLE.match(name)
    if m:
        return Action(-1, _F if m.group(1) == "Forward" else _B, int(m.group(2)))
    return None


def placement_name(stages_of_rank: Mapping[int, Sequence[int]]) -> str:
    """`single` (one stage per rank), `loop` (stage s on the rank at position s mod P), `v` (two stages per
    rank, the rank at position r holding r and 2P-1-r), or `other`. Ranks are taken in order."""
    ranks = sorted(stages_of_rank)
    p = len(ranks)
    held = [sorted(stages_of_rank[r]) for r in ranks]
    if all(len(h) == 1 for h in held):
        return "single"
    if p > 1 and all(h == sorted({i, 2 * p - 1 - i}) for i, h in enumerate(held)):
        return "v"
    v = len(held[0])
    if all(h == [i + c * p for c in range(v)] for i, h in enumerate(held)):
        return "loop"
    return "other"


def _flat(actions: Sequence[Action]) -> list[Action]:
    return [p for a in actions for p in (a.parts or (a,)) if p.type in PASSES]


def _forwards_first(actions: Sequence[Action]) -> bool:
    """Every forward of the rank's step runs before its first backward."""
    types = [a.type for a in _flat(actions)]
    return _F not in types[types.index(_B) :] if _B in types else True


def _breadth_first(actions: Sequence[Action]) -> bool:
    """Looped BFS: each local stage runs all its forwards (and all its backwards) in one run."""
    for kind in (_F, _B):
        stages = [a.stage for a in _flat(actions) if a.type == kind]
        runs = [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s]
        if len(runs) != len(set(runs)):
            return False
    return len({a.stage for a in _flat(actions)}) > 1


def name_schedule(order: Mapping[int, Sequence[Action]], placement: str) -> tuple[Schedule | None, str]:
    """(name, why) of the schedule whose ranks ran `order` (one step's compute actions per rank, in order)
    with stages placed as `placement`; name None when the order matches none of torch's schedules
    (`Schedule.of_training`)."""
    actions = [a for acts in order.values() for a in acts]
    if not actions:
        return None, "no compute actions"
    types = {p.type for p in _flat(actions)}
    split = bool(types & {ActionType.BACKWARD_INPUT, ActionType.BACKWARD_WEIGHT})
    if any(a.parts for a in actions):
        return Schedule.DUALPIPEV, "paired forward-backward actions (OVERLAP_F_B)"
    if placement == "v":
        if split:
            return Schedule.ZBV, "two stages per rank in a V, backward split into I and W"
        return None, "two stages per rank in a V without split backward: no schedule ppscope knows"
    if placement == "single":
        if split:
            return Schedule.ZERO_BUBBLE, "one stage per rank, backward split into I and W"
        if all(_forwards_first(acts) for acts in order.values()):
            return Schedule.GPIPE, "every rank runs all its forwards before its backwards"
        return Schedule.ONE_F_ONE_B, "one stage per rank, forwards and backwards alternating"
    if placement == "loop":
        if split:
            return Schedule.ZERO_BUBBLE, "stages looped over the ranks, backward split into I and W (interleaved ZB)"
        if all(_breadth_first(acts) for acts in order.values()):
            return Schedule.LOOPED_BFS, "stages looped over the ranks, each local stage's forwards run together"
        return Schedule.INTERLEAVED_1F1B, "stages looped over the ranks, micro-batches depth first"
    return None, f"stages placed on ranks in no known way ({placement})"
