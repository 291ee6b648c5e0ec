"""The actions of a pipeline, named as torch.distributed.pipelining names them: one type per kind of work, and
one action (a stage's work of one type on one micro-batch) with torch's text form; and the phase of a pass.

`ActionType` is torch's `_ComputationType`: a forward `F`, a full backward `B`, the backward for inputs `I`
and for weights `W`, the point-to-point `SEND_F` / `RECV_F` (activations, downstream) and `SEND_B` /
`RECV_B` (gradients, upstream), FSDP's `UNSHARD` / `RESHARD` / `REDUCE_GRAD`, and DualPipeV's paired
`OVERLAP_F_B`. An `Action` is torch's `_Action` with the step ppscope's schedules add: `2F0` is stage 2's
forward of micro-batch 0, `2F0@3` the same at decode step 3, `0REDUCE_GRAD` one with no micro-batch and
`(0F3;3B1)OVERLAP_F_B` a pair of actions run as one. `Action.parse` reads that text and `str` writes it.
`Phase` is what a span's `phase` column says of an inference pass (prefill or decode) or a training backward;
a pipelining import or hook writes the action's type there instead. The trace model, the simulator, the
training replay, the Kineto reader, the recording hook and the engine all speak this vocabulary; this module
knows nothing about where an action ran or how long it took, and imports nothing heavier than `re`.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from ppscope.errors import ErrorCode, InvalidConfigError

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10
    import enum

    class StrEnum(str, enum.Enum):
        def __str__(self) -> str:
            return str(self.value)


__all__ = ["BACKWARDS", "PASSES", "Action", "ActionType", "Phase"]


class Phase(StrEnum):
    """The phase of a pass, as the span schema's `phase` column holds it."""

    PREFILL = "prefill"
    DECODE = "decode"
    BACKWARD = "backward"  # training: a backward pass (B, I or W); a training forward has no phase
    NONE = ""


class ActionType(StrEnum):
    """What an action does, by torch's name for it (the value)."""

    FORWARD = "F"
    FULL_BACKWARD = "B"
    """The backward for inputs and weights at once."""
    BACKWARD_INPUT = "I"
    """The backward for the inputs alone (the zero-bubble schedules' B)."""
    BACKWARD_WEIGHT = "W"
    """The backward for the weights alone, once its I has run."""
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    UNSHARD = "UNSHARD"
    RESHARD = "RESHARD"
    REDUCE_GRAD = "REDUCE_GRAD"
    OVERLAP_F_B = "OVERLAP_F_B"
    """A forward and a backward run as one (DualPipeV): the action's parts say which."""

    @property
    def is_compute(self) -> bool:
        """The work of the model itself: a pass (`PASSES`) or a pair of them."""
        return self in PASSES or self is ActionType.OVERLAP_F_B

    @property
    def is_backward(self) -> bool:
        """A backward pass: full, for inputs or for weights."""
        return self in BACKWARDS

    @property
    def is_send(self) -> bool:
        return self in (ActionType.SEND_F, ActionType.SEND_B)

    @property
    def is_recv(self) -> bool:
        return self in (ActionType.RECV_F, ActionType.RECV_B)

    @property
    def direction(self) -> ActionType | None:
        """Which way the data of this action moves between stages: FORWARD (activations, to the next stage) or
        FULL_BACKWARD (gradients, to the previous one). A send or receive moves its own; a forward takes its
        input from upstream, a full backward or one for inputs from downstream. None for the rest (W, FSDP's)."""
        if self in (ActionType.SEND_F, ActionType.RECV_F, ActionType.FORWARD):
            return ActionType.FORWARD
        if self in (ActionType.SEND_B, ActionType.RECV_B, ActionType.FULL_BACKWARD, ActionType.BACKWARD_INPUT):
            return ActionType.FULL_BACKWARD
        return None

    @classmethod
    def send(cls, direction: ActionType) -> ActionType:
        """The send of data going `direction` (FORWARD or FULL_BACKWARD): SEND_F or SEND_B."""
        return cls.SEND_F if direction is cls.FORWARD else cls.SEND_B

    @classmethod
    def recv(cls, direction: ActionType) -> ActionType:
        """The receive of data going `direction` (FORWARD or FULL_BACKWARD): RECV_F or RECV_B."""
        return cls.RECV_F if direction is cls.FORWARD else cls.RECV_B


PASSES: tuple[ActionType, ...] = (
    ActionType.FORWARD,
    ActionType.FULL_BACKWARD,
    ActionType.BACKWARD_INPUT,
    ActionType.BACKWARD_WEIGHT,
)
"""A stage's compute on one micro-batch: F, B, I and W."""
BACKWARDS: tuple[ActionType, ...] = (ActionType.FULL_BACKWARD, ActionType.BACKWARD_INPUT, ActionType.BACKWARD_WEIGHT)
"""The backward passes: B, I and W."""

_TYPES = "|".join(sorted((re.escape(t.value) for t in ActionType if t is not ActionType.OVERLAP_F_B), key=len)[::-1])
_ONE = re.compile(r"(\d*)(" + _TYPES + r")(\d*)(?:@(\d+))?")
_PAIRED = re.compile(r"\((.*)\)" + ActionType.OVERLAP_F_B.value)


@dataclass(frozen=True, repr=False)
class Action:
    """One action: virtual stage `stage` runs `type` on micro-batch `mb` at `step` (a decode step, or a
    training step). `stage` -1 where it is not known (a trace's `Forward 3`), `mb` -1 for an action of no
    micro-batch (`REDUCE_GRAD`); `parts` are an `OVERLAP_F_B`'s actions, in the order they run (its own stage
    and micro-batch are -1). Its text is torch's: `2F0`, `2F0@3` at a step other than 0."""

    stage: int
    type: ActionType
    mb: int = -1
    step: int = 0
    parts: tuple[Action, ...] = ()

    def __str__(self) -> str:
        if self.parts:
            return "(" + ";".join(str(p) for p in self.parts) + ")" + self.type.value
        stage = str(self.stage) if self.stage >= 0 else ""
        mb = str(self.mb) if self.mb >= 0 else ""
        return f"{stage}{self.type.value}{mb}" + (f"@{self.step}" if self.step else "")

    __repr__ = __str__

    @property
    def is_compute(self) -> bool:
        return self.type.is_compute

    @classmethod
    def parse(cls, text: str) -> Action:
        """The action `text` writes (`str` of an action, torch's `_Action` text); InvalidConfigError for
        text of no action."""
        body = text.strip()
        paired = _PAIRED.fullmatch(body)
        if paired:
            parts = tuple(cls.parse(p) for p in paired.group(1).split(";") if p.strip())
            if not parts or not all(p.type in PASSES for p in parts):
                raise InvalidConfigError(
                    ErrorCode.BAD_ACTION, f"action {text!r}: an OVERLAP_F_B pairs compute actions (F, B, I, W)"
                )
            return cls(-1, ActionType.OVERLAP_F_B, parts=parts)
        m = _ONE.fullmatch(body)
        if m is None:
            raise InvalidConfigError(
                ErrorCode.BAD_ACTION,
                f"action {text!r} is not of the form <stage><type><mb>[@<step>], e.g. 2F0 "
                f"(types: {', '.join(t.value for t in ActionType)})",
            )
        stage, kind, mb, step = m.groups()
        return cls(int(stage) if stage else -1, ActionType(kind), int(mb) if mb else -1, int(step or 0))
