"""One vocabulary for a pipeline's actions and schedules: torch's action types and text form, and the schedule
names with what each says."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppscope.errors import InvalidConfigError
from ppscope.trace.actions import BACKWARDS, PASSES, Action, ActionType
from ppscope.trace.schedules import Schedule

F, B = ActionType.FORWARD, ActionType.FULL_BACKWARD


def test_action_types_are_torchs_names() -> None:
    assert [t.value for t in PASSES] == ["F", "B", "I", "W"]
    assert [t.value for t in BACKWARDS] == ["B", "I", "W"]
    assert {t for t in ActionType if t.is_compute} == {*PASSES, ActionType.OVERLAP_F_B}
    assert ActionType.SEND_F.is_send and ActionType.RECV_B.is_recv and not ActionType.FORWARD.is_send
    assert ActionType("RECV_F") is ActionType.RECV_F and ActionType.RECV_F == "RECV_F"


def test_an_actions_direction_is_its_datas() -> None:
    for t in (ActionType.FORWARD, ActionType.SEND_F, ActionType.RECV_F):
        assert t.direction is F
    for t in (ActionType.FULL_BACKWARD, ActionType.BACKWARD_INPUT, ActionType.SEND_B, ActionType.RECV_B):
        assert t.direction is B
    assert ActionType.BACKWARD_WEIGHT.direction is None and ActionType.REDUCE_GRAD.direction is None
    assert (ActionType.send(F), ActionType.recv(F)) == (ActionType.SEND_F, ActionType.RECV_F)
    assert (ActionType.send(B), ActionType.recv(B)) == (ActionType.SEND_B, ActionType.RECV_B)


def test_action_text_is_torchs() -> None:
    assert Action.parse("2F0") == Action(2, F, 0) and str(Action(2, F, 0)) == "2F0"
    assert Action.parse("13RECV_B11") == Action(13, ActionType.RECV_B, 11)
    assert Action.parse("0REDUCE_GRAD") == Action(0, ActionType.REDUCE_GRAD) and str(Action(0, ActionType.REDUCE_GRAD))
    assert Action.parse("5F3@2") == Action(5, F, 3, step=2) and str(Action(5, F, 3, step=2)) == "5F3@2"
    assert str(Action(-1, F, 5)) == "F5" and repr(Action(3, ActionType.BACKWARD_WEIGHT, 7)) == "3W7"
    paired = Action.parse("(0F3;3B1)OVERLAP_F_B")
    assert paired.type is ActionType.OVERLAP_F_B and paired.parts == (Action(0, F, 3), Action(3, B, 1))
    assert paired.is_compute and str(paired) == "(0F3;3B1)OVERLAP_F_B"
    for bad in ("2X0", "2F0;", "", "(0SEND_F1)OVERLAP_F_B", "()OVERLAP_F_B", "2F0@"):
        with pytest.raises(InvalidConfigError):
            Action.parse(bad)


@given(
    st.integers(-1, 99),
    st.sampled_from([t for t in ActionType if t is not ActionType.OVERLAP_F_B]),
    st.integers(-1, 99),
    st.integers(0, 9),
)
def test_text_round_trips(stage: int, kind: ActionType, mb: int, step: int) -> None:
    a = Action(stage, kind, mb, step)
    assert Action.parse(str(a)) == a


def test_schedule_names_keep_their_values() -> None:
    assert [s.value for s in Schedule.of_inference()] == ["gpipe", "interleaved", "serve"]
    assert [s.value for s in Schedule.of_training()] == [
        "gpipe",
        "1f1b",
        "interleaved-1f1b",
        "looped-bfs",
        "zero-bubble",
        "zbv",
        "dualpipev",
    ]
    assert Schedule("zbv") is Schedule.ZBV and Schedule.SERVE == "serve" and f"{Schedule.ONE_F_ONE_B}" == "1f1b"


def test_what_a_schedule_name_says() -> None:
    assert [s for s in Schedule if not s.flushed] == [Schedule.SERVE]
    assert Schedule.GPIPE.inference and Schedule.GPIPE.training
    assert not Schedule.SERVE.training and not Schedule.DUALPIPEV.inference
    assert [s for s in Schedule if s.chunked] == [Schedule.INTERLEAVED]
    assert Schedule.ZBV.pipelining_class == "ScheduleZBVZeroBubble" and Schedule.INTERLEAVED.pipelining_class is None
    assert Schedule.named("zbv") is Schedule.ZBV and Schedule.named("") is None and Schedule.named("dualpipe") is None
