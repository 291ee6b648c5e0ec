"""torch.distributed.pipelining's actions: their names in a trace, where stages sit, and the schedule their
order makes.

torch's runtime schedules (interleaved 1F1B, looped BFS, zero bubble, ZBV, DualPipeV) wrap every action in a
profiler range `PP:{stage}{type}{mb}` (`PP:2F0`, `PP:3RECV_B1`, `PP:0REDUCE_GRAD`), DualPipeV's paired actions
in `PP:(0F3;3B1)OVERLAP_F_B`; ScheduleGPipe writes `Forward i` / `Backward i`; Schedule1F1B writes none. This
module parses those names, tells the placement of stages on ranks (loop: stage s on rank s mod P; V: rank r
holds stages r and 2P-1-r) and names the schedule from the order of compute actions of one step on each rank.
It knows nothing about file formats; the Kineto importer and the recording hook both use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "COMPUTE",
    "SCHEDULE_NAMES",
    "UNKNOWN",
    "Action",
    "name_schedule",
    "parse_action",
    "placement_of",
]

COMPUTE = frozenset({"F", "B", "I", "W"})
"""Forward, full backward, backward for inputs, backward for weights."""
_TYPES = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD", "F", "B", "I", "W")
_PP = re.compile(r"^(\d+)(" + "|".join(_TYPES) + r")(\d*)$")
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")
_SINGLE = re.compile(r"^(Forward|Backward) (\d+)$")
SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zero-bubble", "zbv", "dualpipev")


@dataclass(frozen=True)
class Action:
    """One action of a schedule: `stage` -1 when the name does not say (single-stage `Forward i`), `mb` -1
    for actions of no micro-batch (`REDUCE_GRAD`); `parts` are the sub-actions of an `OVERLAP_F_B`, in the
    order they run."""

    stage: int
    type: str
    mb: int = -1
    parts: tuple[Action, ...] = ()

    @property
    def is_compute(self) -> bool:
        return self.type in COMPUTE or bool(self.parts)

    @property
    def label(self) -> str:
        """torch's own text of the action (`2F0`), `F0` when the stage is not known."""
        if self.parts:
            return "(" + ";".join(p.label for p in self.parts) + ")OVERLAP_F_B"
        return f"{self.stage if self.stage >= 0 else ''}{self.type}{self.mb if self.mb >= 0 else ''}"


UNKNOWN = Action(stage=-1, type="?")
"""What `parse_action` returns for a `PP:` range whose action it cannot read."""


def _one(text: str) -> Action | None:
    m = _PP.match(text.strip())
    if m is None:
        return None
    return Action(int(m.group(1)), m.group(2), int(m.group(3)) if m.group(3) else -1)


def parse_action(name: str) -> Action | None:
    """The action a profiler range names; None for a range of anything else, `UNKNOWN` for a `PP:` range
    this ppscope cannot read (a newer torch's action type)."""
    if name.startswith("PP:"):
        body = name[3:]
        over = _OVERLAP.match(body)
        if over:
            parts = [_one(p) for p in over.group(1).split(";") if p.strip()]
            if not parts or any(p is None or p.type not in COMPUTE for p in parts):
                return UNKNOWN
            return Action(stage=-1, type="OVERLAP_F_B", parts=tuple(p for p in parts if p is not None))
        return _one(body) or UNKNOWN
    m = _SINGLE.match(name)
    if m:
        return Action(stage=-1, type="F" if m.group(1) == "Forward" else "B", mb=int(m.group(2)))
    return None


def placement_of(stages_of_rank: Mapping[int, Sequence[int]]) -> str:
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
    return [p for a in actions for p in (a.parts or (a,)) if p.type in COMPUTE]


def _forwards_first(actions: Sequence[Action]) -> bool:
    """Every forward of the rank's step runs before its first backward."""
    types = [a.type for a in _flat(actions)]
    return "F" not in types[types.index("B") :] if "B" in types else True


def _breadth_first(actions: Sequence[Action]) -> bool:
    """Looped BFS: each local stage runs all its forwards (and all its backwards) in one run."""
    for kind in ("F", "B"):
        stages = [a.stage for a in _flat(actions) if a.type == kind]
        runs = [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s]
        if len(runs) != len(set(runs)):
            return False
    return len({a.stage for a in _flat(actions)}) > 1


def name_schedule(order: Mapping[int, Sequence[Action]], placement: str) -> tuple[str, str]:
    """(name, why) of the schedule whose ranks ran `order` (one step's compute actions per rank, in order)
    with stages placed as `placement`; name "" when the order matches none of `SCHEDULE_NAMES`."""
    actions = [a for acts in order.values() for a in acts]
    if not actions:
        return "", "no compute actions"
    types = {p.type for p in _flat(actions)}
    split = bool(types & {"I", "W"})
    if any(a.parts for a in actions):
        return "dualpipev", "paired forward-backward actions (OVERLAP_F_B)"
    if placement == "v":
        if split:
            return "zbv", "two stages per rank in a V, backward split into I and W"
        return "", "two stages per rank in a V without split backward: no schedule ppscope knows"
    if placement == "single":
        if split:
            return "zero-bubble", "one stage per rank, backward split into I and W"
        if all(_forwards_first(acts) for acts in order.values()):
            return "gpipe", "every rank runs all its forwards before its backwards"
        return "1f1b", "one stage per rank, forwards and backwards alternating"
    if placement == "loop":
        if split:
            return "zero-bubble", "stages looped over the ranks, backward split into I and W (interleaved ZB)"
        if all(_breadth_first(acts) for acts in order.values()):
            return "looped-bfs", "stages looped over the ranks, each local stage's forwards run together"
        return "interleaved-1f1b", "stages looped over the ranks, micro-batches depth first"
    return "", f"stages placed on ranks in no known way ({placement})"
