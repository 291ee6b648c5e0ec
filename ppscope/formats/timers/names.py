"""What each operation a Megatron-style timer trace names is, as a span: its kind, lane, phase and peer.

Production training jobs time each pipeline operation with CUDA events and dump the records as a Chrome trace
(`forward-compute`, `backward-recv`, `grads-reduce-scatter`, ...). This table is the one place that knows
those names; the reader only applies it.
"""

from __future__ import annotations

from typing import NamedTuple

from ppscope.trace.actions import ActionType
from ppscope.trace.model import SpanKind

__all__ = ["PIPELINE_NAMES", "TIMER_OPS", "TimerOp", "op_of"]


class TimerOp(NamedTuple):
    """A timed operation as a span: `peer` is the direction of the stage it talks to (+1 the next stage, -1
    the previous one, 0 none)."""

    kind: SpanKind
    lane: str
    phase: str
    peer: int


_F, _B = ActionType.FORWARD.value, ActionType.FULL_BACKWARD.value
_SEND_F, _SEND_B = ActionType.SEND_F.value, ActionType.SEND_B.value

TIMER_OPS: dict[str, TimerOp] = {
    "forward-compute": TimerOp(SpanKind.FORWARD, "compute", _F, 0),
    "backward-compute": TimerOp(SpanKind.BACKWARD, "compute", _B, 0),
    # a receive waits for the previous stage's activation (forward) or the next stage's gradient (backward)
    "forward-recv": TimerOp(SpanKind.RECV_WAIT, "recv", _F, -1),
    "backward-recv": TimerOp(SpanKind.RECV_WAIT, "recv", _B, +1),
    "forward-send": TimerOp(SpanKind.SEND, "send", _SEND_F, +1),
    "backward-send": TimerOp(SpanKind.SEND, "send", _SEND_B, -1),
    # 1F1B's steady state pairs a send with the receive it then waits for: the wait is what holds the stage
    "forward-send-backward-recv": TimerOp(SpanKind.RECV_WAIT, "recv", _B, +1),
    "backward-send-forward-recv": TimerOp(SpanKind.RECV_WAIT, "recv", _F, -1),
    # the data-parallel tail of a step: collectives across replicas, then the optimizer
    "grads-reduce-scatter": TimerOp(SpanKind.COLLECTIVE, "dp-comm", "", 0),
    "params-all-gather": TimerOp(SpanKind.COLLECTIVE, "dp-comm", "", 0),
    "all-grads-sync": TimerOp(SpanKind.COLLECTIVE, "dp-comm", "", 0),
    "embedding-grads-all-reduce": TimerOp(SpanKind.COLLECTIVE, "dp-comm", "", 0),
    "layernorm-grads-all-reduce": TimerOp(SpanKind.COLLECTIVE, "dp-comm", "", 0),
    "optimizer": TimerOp(SpanKind.OPTIMIZER, "optimizer", "", 0),
    "optimizer-clip-main-grad": TimerOp(SpanKind.OPTIMIZER, "optimizer", "", 0),
    "optimizer-copy-to-main-grad": TimerOp(SpanKind.OPTIMIZER, "optimizer", "", 0),
    "optimizer-inner-step": TimerOp(SpanKind.OPTIMIZER, "optimizer", "", 0),
    "optimizer-copy-main-to-model-params": TimerOp(SpanKind.OPTIMIZER, "optimizer", "", 0),
    "optimizer-count-zeros": TimerOp(SpanKind.OPTIMIZER, "optimizer", "", 0),
    "gc": TimerOp(SpanKind.HOST, "host", "", 0),
    "batch-generator": TimerOp(SpanKind.HOST, "host", "", 0),
}
"""Megatron's timer names. Any other name is a `range` on the host lane (no role in the analysis)."""

PIPELINE_NAMES = frozenset(n for n, op in TIMER_OPS.items() if op.kind in (SpanKind.FORWARD, SpanKind.BACKWARD))
"""A trace without an event of these names is not a trace of pipeline operations."""

_OTHER = TimerOp(SpanKind.RANGE, "host", "", 0)


def op_of(name: str) -> TimerOp:
    """The span an event of this name makes (`range` for a name the table does not hold)."""
    return TIMER_OPS.get(name, _OTHER)
