"""Stage order of imported ranks from the direction of point-to-point traffic, else a fallback key."""

from __future__ import annotations

from ppscope.formats.ordering import order_stages


def test_forward_pipeline_and_token_ring_are_inferred() -> None:
    # ranks 7, 3, 5 form a pipeline 7 -> 3 -> 5, and 5 sends tokens back to 7 (decode ring)
    events = [(7, "send", 0), (3, "recv", 1), (3, "send", 2), (5, "recv", 3), (5, "send", 4), (7, "recv", 5)]
    order = order_stages([3, 5, 7], events, {3: 0, 5: 1, 7: 2}, "device id")
    assert order.inferred and order.stage_of == {7: 0, 3: 1, 5: 2}


def test_symmetric_exchange_falls_back_and_says_why() -> None:
    events = [(0, "send", 0), (1, "send", 0), (0, "recv", 1), (1, "recv", 1)]
    order = order_stages([0, 1], events, {0: 1, 1: 0}, "device id")
    assert not order.inferred and order.stage_of == {1: 0, 0: 1}
    assert "device id" in order.explanation and "2 ranks send before they receive" in order.explanation


def test_no_traffic_or_a_silent_rank_is_not_inferred() -> None:
    assert "no send/recv" in order_stages([0, 1], [], {}, "rank").explanation
    order = order_stages([0, 1, 2], [(0, "send", 0), (1, "recv", 1)], {}, "rank")
    assert not order.inferred and "rank(s) 2 never receive" in order.explanation
    assert order_stages([4], [], {}, "rank").stage_of == {4: 0}
