"""torch.distributed.pipelining's action names, the placement of stages on ranks, and the schedule named from
one step's action order: torch 2.13's own `pipeline_order` for 2 ranks and 4 micro-batches (1F1B's as it runs:
torch's IR for its last rank numbers the micro-batches one too high, 1F1 1B0 ... 1F4)."""

from __future__ import annotations

import pytest

from ppscope.formats.pipelining.actions import is_action_range, name_schedule, parse_action, placement_name
from ppscope.trace.actions import Action, ActionType
from ppscope.trace.schedules import Schedule

F, B = ActionType.FORWARD, ActionType.FULL_BACKWARD


def test_action_names_parse() -> None:
    assert parse_action("PP:2F0") == Action(2, F, 0)
    assert parse_action("PP:13RECV_B11") == Action(13, ActionType.RECV_B, 11)
    assert parse_action("PP:0REDUCE_GRAD") == Action(0, ActionType.REDUCE_GRAD, -1)
    assert parse_action("PP:3W7") == Action(3, ActionType.BACKWARD_WEIGHT, 7)
    over = parse_action("PP:(0F3;3B1)OVERLAP_F_B")
    assert over is not None and over.parts == (Action(0, F, 3), Action(3, B, 1)) and over.is_compute
    assert str(over) == "(0F3;3B1)OVERLAP_F_B"
    assert parse_action("Forward 5") == Action(-1, F, 5) and parse_action("Backward 0") == Action(-1, B, 0)
    assert parse_action("gloo:recv") is None and parse_action("ProfilerStep#3") is None
    assert not is_action_range("gloo:recv") and is_action_range("Forward 5") and is_action_range("PP:2F0")
    for unread in ("PP:0FOO1", "PP:(0X1)OVERLAP_F_B"):  # a newer torch's action: a pipelining range, unread
        assert parse_action(unread) is None and is_action_range(unread)


def test_placement() -> None:
    assert placement_name({0: [0], 1: [1]}) == "single"
    assert placement_name({0: [0, 2], 1: [1, 3]}) == "loop"
    assert placement_name({0: [0, 3], 1: [1, 2]}) == "v"
    assert placement_name({0: [0, 1], 1: [2, 3]}) == "other"


def _order(text: str) -> list[Action]:
    out = []
    for word in text.split():
        a = parse_action("PP:" + word)
        assert a is not None, word
        out.append(a)
    return out


ORDERS = {  # rank 0, rank 1: torch's pipeline_order for P=2, M=4 (compute actions only)
    "gpipe": ("0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3", "1F0 1F1 1F2 1F3 1B0 1B1 1B2 1B3", "single"),
    "1f1b": ("0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3", "1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3", "single"),
    "interleaved-1f1b": (
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
        "loop",
    ),
    "looped-bfs": (
        "0F0 0F1 0F2 0F3 2F0 2F1 2F2 2F3 2B3 2B2 2B1 2B0 0B3 0B2 0B1 0B0",
        "1F0 1F1 1F2 1F3 3F0 3F1 3F2 3F3 3B3 3B2 3B1 3B0 1B3 1B2 1B1 1B0",
        "loop",
    ),
    "zero-bubble": (
        "0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3",
        "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3",
        "loop",
    ),
    "zbv": (
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3",
        "v",
    ),
}


@pytest.mark.parametrize("name", ORDERS)
def test_the_schedule_is_named_from_its_action_order(name: str) -> None:
    r0, r1, placement = ORDERS[name]
    order = {0: _order(r0), 1: _order(r1)}
    held = {r: sorted({a.stage for a in acts}) for r, acts in order.items()}
    assert placement_name(held) == placement
    assert name_schedule(order, placement)[0] == name


def test_paired_actions_name_dualpipev() -> None:
    r0 = "0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1)OVERLAP_F_B (3F2;0B0)OVERLAP_F_B 3B2 (3F3;0B1)OVERLAP_F_B 3B3 0I2 0W2"
    r1 = "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0)OVERLAP_F_B (1F3;2B1)OVERLAP_F_B (2F3;1B1)OVERLAP_F_B 2B2 1B2 2I3 1I3"
    order = {0: _order(r0 + " 0I3 0W3"), 1: _order(r1 + " 2W3 1W3")}
    held = {r: sorted({p.stage for a in acts for p in (a.parts or (a,))}) for r, acts in order.items()}
    assert placement_name(held) == "v"
    assert name_schedule(order, "v")[0] is Schedule.DUALPIPEV


def test_orders_that_match_no_schedule_say_so() -> None:
    assert name_schedule({0: [], 1: []}, "single") == (None, "no compute actions")
    name, why = name_schedule({0: _order("0F0 0B0")}, "other")
    assert name is None and "other" in why
    assert name_schedule({0: _order("0F0 3F0 3B0 0B0"), 1: _order("1F0 2F0 2B0 1B0")}, "v")[0] is None
