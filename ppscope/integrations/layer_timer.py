"""Each decoder layer of a torch.distributed.pipelining stage timed, forward and backward, as `layer` spans.

In every K-th micro-batch of each stage (step × M + micro-batch divisible by K), a layer's forward is timed
from its forward pre-hook to its forward hook, and its backward from the moment the gradient of its output
arrives (a hook on the output tensor) to the moment the gradient of its input is computed (a hook on the
input tensor): hooks on tensors, not the module's full backward hooks, so a model that works on its outputs
in place still runs. The spans are named `layer N` (`layer_span_name`, N in the model's numbering: the
stage's first layer from the split, plus the layer's place in the stage's `layers`) with the phase of the
action they ran in (F, B or I). A recomputed forward (activation checkpointing) inside a backward is not
timed again. On a CPU the recorder's clock times them; on a GPU, CUDA events on the current stream, resolved
to that clock at each step's end against an anchor event recorded when the step began (one synchronisation
at each end of a step). Weight gradients computed apart (zero-bubble's W) are not in any layer's span.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from ppscope.trace.actions import ActionType
from ppscope.trace.layers import layer_span_name
from ppscope.trace.model import SpanKind

__all__ = ["LayerTimer", "layer_modules"]


def layer_modules(module: Any) -> list[Any] | None:
    """The decoder layers of a stage's module, in order: the children of its shallowest submodule named
    `layers` that is a ModuleList or ModuleDict (pruned entries, None, left out); None without one."""
    found = [
        (name.count("."), m)
        for name, m in module.named_modules()
        if name.rsplit(".", 1)[-1] == "layers" and isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict))
    ]
    if not found:
        return None
    container = min(found, key=lambda f: f[0])[1]
    children = container.values() if isinstance(container, torch.nn.ModuleDict) else list(container)
    return [c for c in children if c is not None]


class LayerTimer:
    """Hooks on every stage's layers, recording `layer` spans through the pipeline recorder `owner`."""

    def __init__(self, owner: Any, every: int) -> None:
        self.owner, self.every = owner, every
        self.current: tuple[int, int, ActionType, bool] | None = None  # (stage, mb, phase, sampled) while one computes
        self.handles: list[Any] = []
        self.cuda = torch.device(owner.stages[0].device).type == "cuda"
        self.pending: list[tuple[Any, Any, dict[str, Any]]] = []  # CUDA: (start, end, fields) to resolve
        self.anchor: tuple[Any, int] | None = None
        self.timed: list[int] = []
        self._forward: dict[int, Any] = {}  # layer -> when its forward began
        self._backward: dict[tuple[int, int], Any] = {}  # (layer, mb) -> when its backward began
        first = [sum(owner.split[:i]) for i in range(len(owner.split))]
        for stage in owner.stages:
            mods = layer_modules(stage.submod)
            if mods is None or len(mods) != owner.split[stage.stage_index]:
                continue  # a split given that does not match the module: its layers cannot be named
            self.timed.append(stage.stage_index)
            for i, m in enumerate(mods):
                index = first[stage.stage_index] + i
                self.handles.append(m.register_forward_pre_hook(functools.partial(self._before, index)))
                self.handles.append(m.register_forward_hook(functools.partial(self._after, index)))

    @contextlib.contextmanager
    def running(self, stage: int, mb: int, phase: ActionType) -> Iterator[None]:
        before = self.current
        sampled = (self.owner.step_no * int(self.owner.schedule._n_microbatches) + mb) % self.every == 0
        self.current = (stage, mb, phase, sampled)
        try:
            yield
        finally:
            self.current = before

    # ------------------------------------------------------------ forward, and the backward's tensor hooks

    def _before(self, index: int, module: Any, args: tuple[Any, ...]) -> None:
        cur = self.current
        if cur is None or not cur[3] or cur[2] is not ActionType.FORWARD:
            return
        self._forward[index] = self._now()
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.requires_grad:  # its gradient ends this layer's backward
            x.register_hook(functools.partial(self._backward_done, index, cur[1]))

    def _after(self, index: int, module: Any, args: tuple[Any, ...], output: Any) -> None:
        cur = self.current
        start = self._forward.pop(index, None)
        if cur is None or start is None or cur[2] is not ActionType.FORWARD:
            return
        self._record(index, cur[0], cur[1], ActionType.FORWARD, start, self._now())
        if isinstance(output, torch.Tensor) and output.requires_grad:  # its gradient starts the backward
            output.register_hook(functools.partial(self._backward_starts, index, cur[1]))

    def _backward_starts(self, index: int, mb: int, grad: Any) -> None:
        self._backward[(index, mb)] = self._now()

    def _backward_done(self, index: int, mb: int, grad: Any) -> None:
        cur = self.current
        start = self._backward.pop((index, mb), None)
        if cur is None or start is None:
            return
        self._record(index, cur[0], mb, cur[2], start, self._now())

    # ------------------------------------------------------------ clocks

    def _now(self) -> Any:
        if not self.cuda:
            return self.owner.recorder.now_ns()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _record(self, index: int, stage: int, mb: int, phase: ActionType, start: Any, end: Any) -> None:
        fields = dict(
            stage=stage,
            mb=mb,
            step=self.owner.step_no,
            chunk=self.owner.chunk[stage],
            phase=phase,
            name=layer_span_name(index),
        )
        if self.cuda:
            self.pending.append((start, end, fields))
        else:
            self.owner.recorder.record(SpanKind.LAYER, start, end, **fields)

    def begin_step(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            anchor = torch.cuda.Event(enable_timing=True)
            anchor.record()
            self.anchor = (anchor, self.owner.recorder.now_ns())

    def end_step(self) -> None:
        """On a GPU, every layer of the step on the recorder's clock: the anchor's host time plus the events'
        distance from it (the queue was empty when the anchor was recorded)."""
        if not (self.cuda and self.pending and self.anchor):
            self.pending.clear()
            return
        torch.cuda.synchronize()
        anchor, at = self.anchor
        for start, end, fields in self.pending:
            t0 = at + int(anchor.elapsed_time(start) * 1e6)
            t1 = at + int(anchor.elapsed_time(end) * 1e6)
            self.owner.recorder.record(SpanKind.LAYER, t0, max(t0, t1), **fields)
        self.pending.clear()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
