"""The names of pipeline schedules, and what each name says about the schedule.

Two families share the names: ppscope's own forward-only schedules, which the engine runs and the simulator
replays (`gpipe`, `interleaved`, `serve`), and torch.distributed.pipelining's training schedules, which the
Kineto importer and the recording hook name from their action order (`gpipe`, `1f1b`, `interleaved-1f1b`,
`looped-bfs`, `zero-bubble`, `zbv`, `dualpipev`). A run's metadata keeps the name as its value; the theory's
formulas, the simulator's plans and the engine's loops are keyed by the member. This module knows nothing
about how a schedule orders its actions.
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10
    from ppscope.trace.actions import StrEnum

__all__ = ["Engine", "Schedule"]


class Schedule(StrEnum):
    """A pipeline schedule's name (the value, as runs, JSON and the command line write it)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    LOOPED_BFS = "looped-bfs"
    ZERO_BUBBLE = "zero-bubble"
    ZBV = "zbv"
    DUALPIPEV = "dualpipev"
    INTERLEAVED = "interleaved"
    SERVE = "serve"

    @property
    def inference(self) -> bool:
        """ppscope's engine runs it and its simulator replays it (forward passes only): gpipe, interleaved,
        serve."""
        return self in (Schedule.GPIPE, Schedule.INTERLEAVED, Schedule.SERVE)

    @property
    def training(self) -> bool:
        """A torch.distributed.pipelining training schedule, named from a run's action order."""
        return self.pipelining_class is not None

    @property
    def flushed(self) -> bool:
        """Every step ends in a flush (fill, then drain): all but `serve`, whose micro-batches circulate."""
        return self is not Schedule.SERVE

    @property
    def chunked(self) -> bool:
        """An inference schedule that runs several model chunks per rank (`--chunks`)."""
        return self is Schedule.INTERLEAVED

    @property
    def pipelining_class(self) -> str | None:
        """The class of torch.distributed.pipelining that runs it, None for ppscope's own."""
        return _CLASSES.get(self)

    @classmethod
    def named(cls, name: str) -> Schedule | None:
        """The schedule of `name`, None for a name ppscope does not know (or none: "")."""
        try:
            return cls(name)
        except ValueError:
            return None

    @classmethod
    def of_inference(cls) -> tuple[Schedule, ...]:
        """The schedules the engine runs, in the order the command line lists them."""
        return tuple(s for s in cls if s.inference)

    @classmethod
    def of_training(cls) -> tuple[Schedule, ...]:
        """torch.distributed.pipelining's schedules ppscope names, in the order it lists them."""
        return tuple(s for s in cls if s.training)


_CLASSES: dict[Schedule, str] = {
    Schedule.GPIPE: "ScheduleGPipe",
    Schedule.ONE_F_ONE_B: "Schedule1F1B",
    Schedule.INTERLEAVED_1F1B: "ScheduleInterleaved1F1B",
    Schedule.LOOPED_BFS: "ScheduleLoopedBFS",
    Schedule.ZERO_BUBBLE: "ScheduleInterleavedZeroBubble",
    Schedule.ZBV: "ScheduleZBVZeroBubble",
    Schedule.DUALPIPEV: "ScheduleDualPipeV",
}


class Engine(StrEnum):
    """The pipeline engine whose actions a Kineto trace shows (`meta.config["pipelining"]["engine"]`): its
    value, as the metadata and `analyze --json` write it."""

    TORCH = "torch.pipelining"
    """torch.distributed.pipelining: its action ranges, or receives posted while its sends are in flight
    (its P2P operations go out in batches)."""
    DEEPSPEED = "DeepSpeed"
    """DeepSpeed's PipelineEngine: no action ranges, blocking sends and receives, and the loss broadcast to
    every stage at the end of each step."""
    UNKNOWN = "unknown"
    """A pipeline whose actions were inferred from operators that match neither."""
