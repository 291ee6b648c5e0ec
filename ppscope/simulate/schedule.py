"""Pipeline schedules as data: which action each rank runs, in which order, and what each action waits for.

A `Plan` holds one ordered list of `Action`s per rank (forward-only: this is inference). The engine walks
its rank's list; the simulator replays all lists with real costs; tests read the rank x step grid that
`unit_grid` produces with unit-time actions. Schedules:

- `gpipe`: M micro-batches go through the P stages; every decode step is a flush (fill, then drain) — the
  first stage starts step t+1 only when every micro-batch's token of step t is back.
- `interleaved`: each rank holds V chunks, chunk c on rank r is virtual stage c*P + r (Megatron-style);
  micro-batches go round the ring V times, in groups of P, and every step is a flush as in gpipe.
- `serve`: continuous batching. The order is decided at run time (requests arrive and finish), so the schedule
  only describes the steady state: `max_inflight` micro-batch slots circulate, and a slot's next pass on
  the first stage waits for its own token from the last stage, never for the other slots (no flush).

This module knows nothing about tensors, time or processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.trace.actions import Action, ActionType
from ppscope.trace.schedules import Schedule

__all__ = [
    "Plan",
    "ServePolicy",
    "check_schedule",
    "dependencies",
    "gpipe",
    "interleaved",
    "make_schedule",
    "render_grid",
    "serve",
    "unit_grid",
]

FORWARD = ActionType.FORWARD


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Ordered actions per rank for a pipeline of `ranks` ranks with `chunks` chunks per rank."""

    name: Schedule
    ranks: int
    """Physical stages (one per rank)."""
    chunks: int = 1
    """Model chunks per rank (V); virtual stages = ranks x chunks."""
    microbatches: int
    """Micro-batches (gpipe/interleaved) or in-flight slots (serve)."""
    steps: int = 1
    """Passes per micro-batch: 1 for a prefill, 1 + decode steps for a whole generation."""
    actions: tuple[tuple[Action, ...], ...] = field(default_factory=tuple)

    @property
    def flush(self) -> bool:
        """A step starts on the first stage only when every micro-batch has finished the previous step."""
        return self.name.flushed

    @property
    def virtual_stages(self) -> int:
        return self.ranks * self.chunks

    def rank_of(self, stage: int) -> int:
        return stage % self.ranks

    def chunk_of(self, stage: int) -> int:
        """The chunk of its rank that virtual stage `stage` is: stage // ranks."""
        return stage // self.ranks

    def for_rank(self, rank: int) -> tuple[Action, ...]:
        return self.actions[rank]

    def step_actions(self, rank: int, step: int) -> list[Action]:
        return [a for a in self.actions[rank] if a.step == step]


@dataclass(frozen=True, kw_only=True)
class ServePolicy:
    """The run-time rules of `serve`, for the engine to follow and the simulator to imitate."""

    max_inflight: int
    """Micro-batch slots circulating at once (default: one per stage)."""
    max_batch: int = 1
    """Requests per micro-batch slot."""
    admission: str = "fifo"
    """Waiting requests take free places in arrival order."""
    prefill_joins_decode: bool = True
    """A finished request frees its place in its micro-batch at once, and a new request's prefill joins the
    others' decode in the micro-batch's next pass (False: a micro-batch takes new requests only when empty)."""

    def __post_init__(self) -> None:
        if self.max_inflight < 1 or self.max_batch < 1:
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE,
                f"serve needs max_inflight >= 1 and max_batch >= 1, got {self.max_inflight} and {self.max_batch}",
            )
        if self.admission != "fifo":
            raise InvalidConfigError(
                ErrorCode.UNKNOWN_CHOICE, f"unknown admission policy {self.admission!r}; valid: fifo"
            )


def _check_sizes(ranks: int, microbatches: int, chunks: int, steps: int) -> None:
    for name, value in (("stages", ranks), ("micro-batches", microbatches), ("chunks", chunks), ("steps", steps)):
        if value < 1:
            raise InvalidConfigError(ErrorCode.BAD_VALUE, f"a schedule needs at least 1 of {name}, got {value}")


def gpipe(ranks: int, microbatches: int, steps: int = 1) -> Plan:
    """Every rank runs micro-batches 0..M-1 in order, step after step, with a flush between steps."""
    _check_sizes(ranks, microbatches, 1, steps)
    actions = tuple(
        tuple(Action(r, FORWARD, m, t) for t in range(steps) for m in range(microbatches)) for r in range(ranks)
    )
    return Plan(name=Schedule.GPIPE, ranks=ranks, microbatches=microbatches, steps=steps, actions=actions)


def interleaved(ranks: int, microbatches: int, chunks: int, steps: int = 1) -> Plan:
    """Megatron's forward order: groups of P micro-batches run chunk 0, then chunk 1, ... on every rank.

    With groups of P, a micro-batch leaving the last rank in chunk c arrives at rank 0 exactly when rank 0
    has finished chunk c of the group, so the ring stays busy after the fill.
    """
    _check_sizes(ranks, microbatches, chunks, steps)
    per_rank = []
    for r in range(ranks):
        order: list[Action] = []
        for t in range(steps):
            for start in range(0, microbatches, ranks):
                group = range(start, min(start + ranks, microbatches))
                order += [Action(c * ranks + r, FORWARD, m, t) for c in range(chunks) for m in group]
        per_rank.append(tuple(order))
    return Plan(
        name=Schedule.INTERLEAVED,
        ranks=ranks,
        chunks=chunks,
        microbatches=microbatches,
        steps=steps,
        actions=tuple(per_rank),
    )


def serve(ranks: int, max_inflight: int, steps: int = 1) -> Plan:
    """Steady state of continuous batching: slots 0..k-1 circulate; each waits only for its own token."""
    _check_sizes(ranks, max_inflight, 1, steps)
    actions = tuple(
        tuple(Action(r, FORWARD, m, t) for t in range(steps) for m in range(max_inflight)) for r in range(ranks)
    )
    return Plan(name=Schedule.SERVE, ranks=ranks, microbatches=max_inflight, steps=steps, actions=actions)


def make_schedule(name: str, ranks: int, microbatches: int, chunks: int = 1, steps: int = 1) -> Plan:
    """The plan of schedule `name` (one the engine runs); `microbatches` is the number of in-flight slots for
    serve."""
    if name == Schedule.GPIPE:
        if chunks != 1:
            raise InvalidConfigError(
                ErrorCode.CONFLICTING_OPTIONS,
                f"gpipe runs one chunk per rank, got --chunks {chunks}: use --schedule interleaved",
            )
        return gpipe(ranks, microbatches, steps)
    if name == Schedule.INTERLEAVED:
        return interleaved(ranks, microbatches, chunks, steps)
    if name == Schedule.SERVE:
        return serve(ranks, microbatches, steps)
    valid = ", ".join(Schedule.of_inference())
    raise InvalidConfigError(ErrorCode.UNKNOWN_CHOICE, f"unknown schedule {str(name)!r}; valid schedules: {valid}")


def dependencies(schedule: Plan, action: Action) -> list[Action]:
    """What `action` waits for besides its rank's previous action.

    Stage s > 0 waits for stage s-1 on the same micro-batch and step. Stage 0 at step t > 0 waits for the
    token of step t-1 from the last stage: of its own micro-batch, or of every micro-batch when the schedule
    flushes between steps.
    """
    last = schedule.virtual_stages - 1
    if action.stage > 0:
        prev = action.stage - 1
        return [Action(prev, action.type, action.mb, action.step)]
    if action.step == 0:
        return []
    mbs = range(schedule.microbatches) if schedule.flush else (action.mb,)
    return [Action(last, action.type, m, action.step - 1) for m in mbs]


def unit_grid(schedule: Plan) -> list[list[Action | None]]:
    """Run the schedule with every action taking one time unit and free transfers: rank x step, None = idle.

    Raises InvalidConfigError when the schedule deadlocks (some rank's next action can never start).
    """
    done_at: dict[Action, int] = {}
    pos = [0] * schedule.ranks
    grid: list[list[Action | None]] = [[] for _ in range(schedule.ranks)]
    total = sum(len(a) for a in schedule.actions)
    t = 0
    while len(done_at) < total:
        progressed = False
        finished_now = []
        for r in range(schedule.ranks):
            acts = schedule.actions[r]
            if pos[r] < len(acts):
                act = acts[pos[r]]
                if all(done_at.get(d, t + 1) <= t for d in dependencies(schedule, act)):
                    grid[r].append(act)
                    finished_now.append(act)
                    pos[r] += 1
                    progressed = True
                    continue
            grid[r].append(None)
        for act in finished_now:
            done_at[act] = t + 1
        if not progressed:  # nothing finished in this step either, so nothing ever will
            stuck = ", ".join(
                f"rank {r}: {schedule.actions[r][pos[r]]}"
                for r in range(schedule.ranks)
                if pos[r] < len(schedule.actions[r])
            )
            raise InvalidConfigError(
                ErrorCode.SCHEDULE_DEADLOCK, f"schedule {schedule.name} deadlocks: nothing can run ({stuck})"
            )
        t += 1
    width = max((len(row) for row in grid), default=0)
    for row in grid:
        while row and row[-1] is None:
            row.pop()
        row += [None] * (width - len(row))
    return grid


def render_grid(grid: Sequence[Sequence[Action | None]], *, idle: str = ".") -> str:
    """Rank x time-step text, one row per rank, e.g. `rank 1 |  .  1F0 1F1`."""
    cells = [[str(a) if a is not None else idle for a in row] for row in grid]
    width = max((len(c) for row in cells for c in row), default=1)
    return "\n".join(f"rank {r} | " + " ".join(c.rjust(width) for c in row) for r, row in enumerate(cells))


def check_schedule(schedule: Plan) -> None:
    """Raise InvalidConfigError unless the schedule runs every (virtual stage, micro-batch, step) exactly once,
    on the rank that holds that stage, and never runs a micro-batch on stage s+1 before stage s."""
    if len(schedule.actions) != schedule.ranks:
        raise InvalidConfigError(
            ErrorCode.BAD_SCHEDULE,
            f"schedule {schedule.name} has {len(schedule.actions)} rank lists for {schedule.ranks} ranks",
        )
    seen: set[tuple[int, int, int]] = set()
    for r, acts in enumerate(schedule.actions):
        for a in acts:
            if schedule.rank_of(a.stage) != r:
                raise InvalidConfigError(
                    ErrorCode.BAD_SCHEDULE, f"schedule {schedule.name}: action {a} placed on rank {r}"
                )
            key = (a.stage, a.mb, a.step)
            if key in seen:
                raise InvalidConfigError(ErrorCode.BAD_SCHEDULE, f"schedule {schedule.name}: action {a} appears twice")
            seen.add(key)
    expected = schedule.virtual_stages * schedule.microbatches * schedule.steps
    if len(seen) != expected:
        raise InvalidConfigError(
            ErrorCode.BAD_SCHEDULE, f"schedule {schedule.name} has {len(seen)} distinct actions, expected {expected}"
        )
    finish: dict[Action, int] = {}
    for row in unit_grid(schedule):
        for t, cell in enumerate(row):
            if cell is not None:
                finish[cell] = t + 1
    for act, end in finish.items():
        for dep in dependencies(schedule, act):
            if finish[dep] > end - 1:
                raise InvalidConfigError(
                    ErrorCode.BAD_SCHEDULE, f"schedule {schedule.name}: {act} runs before {dep} has finished"
                )
