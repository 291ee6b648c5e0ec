"""Schedules as data: action text form, grids, and the invariants every plan must keep."""

from __future__ import annotations

import dataclasses

from error_helpers import raises_code
from hypothesis import given
from hypothesis import strategies as st

from ppscope.errors import ErrorCode, InvalidConfigError
from ppscope.simulate.schedule import (
    ServePolicy,
    check_schedule,
    dependencies,
    gpipe,
    interleaved,
    make_schedule,
    render_grid,
    serve,
    unit_grid,
)
from ppscope.trace.actions import Action, ActionType

F = ActionType.FORWARD


def test_action_text_round_trip() -> None:
    a = Action(5, F, 3, 2)
    assert str(a) == "5F3@2"
    assert Action.parse("5F3@2") == a
    assert str(Action(2, F, 0)) == "2F0"
    with raises_code(InvalidConfigError, ErrorCode.BAD_ACTION):
        Action.parse("2X0")


def test_gpipe_grid_is_fill_then_drain() -> None:
    grid = unit_grid(gpipe(3, 2))
    assert render_grid(grid) == "\n".join(
        ["rank 0 | 0F0 0F1   .   .", "rank 1 |   . 1F0 1F1   .", "rank 2 |   .   . 2F0 2F1"]
    )
    # M + P - 1 unit steps per step of the batch: the GPipe makespan.
    assert len(unit_grid(gpipe(4, 8))[0]) == 11


def test_gpipe_flushes_between_steps() -> None:
    grid = unit_grid(gpipe(2, 2, steps=2))
    assert [str(a) if a else "." for a in grid[0]] == ["0F0", "0F1", ".", "0F0@1", "0F1@1", "."]


def test_interleaved_places_chunks_megatron_style() -> None:
    plan = interleaved(4, 4, 2)
    assert [str(a) for a in plan.for_rank(1)] == ["1F0", "1F1", "1F2", "1F3", "5F0", "5F1", "5F2", "5F3"]
    assert [plan.chunk_of(a.stage) for a in plan.for_rank(1)] == [0] * 4 + [1] * 4
    # V*M + P - 1 chunk-steps: the interleaved makespan, shorter than gpipe's with chunks half as long.
    assert len(unit_grid(plan)[0]) == 2 * 4 + 4 - 1


def test_serve_waits_only_for_own_token() -> None:
    plan = serve(4, 2, steps=2)
    assert dependencies(plan, Action(0, F, 1, 1)) == [Action(3, F, 1, 0)]
    assert dependencies(gpipe(4, 2, 2), Action(0, F, 1, 1)) == [Action(3, F, m, 0) for m in range(2)]
    grid = unit_grid(plan)
    # With 2 of 4 slots in flight, rank 0 idles 2 of every 4 steps: the dependency bubble 1 - m/P.
    assert [a is None for a in grid[0][:8]] == [False, False, True, True, False, False, True, True]


@given(st.integers(1, 5), st.integers(1, 9), st.integers(1, 3), st.integers(1, 3))
def test_every_plan_keeps_the_invariants(ranks: int, mbs: int, chunks: int, steps: int) -> None:
    for plan in (gpipe(ranks, mbs, steps), interleaved(ranks, mbs, chunks, steps), serve(ranks, mbs, steps)):
        check_schedule(plan)
        grid = unit_grid(plan)
        busy = sum(a is not None for row in grid for a in row)
        assert busy == plan.virtual_stages * mbs * steps


def test_check_plan_catches_broken_plans() -> None:
    plan = interleaved(2, 2, 2)
    swapped = (tuple(reversed(plan.actions[0])), plan.actions[1])
    with raises_code(InvalidConfigError, ErrorCode.SCHEDULE_DEADLOCK):
        check_schedule(dataclasses.replace(plan, actions=swapped))
    doubled = (plan.actions[0] + plan.actions[0][:1], plan.actions[1])
    with raises_code(InvalidConfigError, ErrorCode.BAD_SCHEDULE):
        check_schedule(dataclasses.replace(plan, actions=doubled))
    misplaced = (plan.actions[1], plan.actions[0])
    with raises_code(InvalidConfigError, ErrorCode.BAD_SCHEDULE):
        check_schedule(dataclasses.replace(plan, actions=misplaced))


def test_make_plan_names_valid_options() -> None:
    assert make_schedule("gpipe", 2, 3).name == "gpipe"
    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CHOICE):
        make_schedule("1f1b", 2, 3)
    with raises_code(InvalidConfigError, ErrorCode.CONFLICTING_OPTIONS):
        make_schedule("gpipe", 2, 3, chunks=2)
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        ServePolicy(max_inflight=0)
