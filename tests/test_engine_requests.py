"""Generated requests are made as the run takes them, and a serve run takes them in order of arrival."""

from __future__ import annotations

import random

import pytest

from ppscope.engine.requests import Arrivals, GeneratedRequests, Request, generate_requests


def test_generated_requests_are_made_on_first_access_from_one_seeded_stream() -> None:
    reqs = generate_requests(1000, 5, 3, vocab=50, seed=7)
    assert len(reqs) == 1000 and reqs.made == 0
    third = reqs[2]
    assert reqs.made == 3 and reqs[2] is third  # made once: the run fills its outputs in place
    rng = random.Random(7)  # the stream a list made at once draws from, request after request
    eager = [[rng.randrange(50) for _ in range(5)] for _ in range(6)]
    assert [r.prompt_ids for r in reqs[:6]] == eager and [r.id for r in reqs[:6]] == list(range(6))
    assert [r.id for r in reqs[1:6:2]] == [1, 3, 5] and reqs[-1].id == 999 and reqs.made == 1000
    assert all(r.max_new_tokens == 3 for r in reqs) and len(list(reqs)) == 1000
    with pytest.raises(IndexError):
        reqs[1000]


def _reqs(n: int) -> list[Request]:
    return [Request(i, [1], 1) for i in range(n)]


def test_arrivals_take_requests_in_order_and_stamp_them_on_the_common_clock() -> None:
    reqs = _reqs(4)
    waiting = Arrivals(reqs, [0, 10, 10, 30], start_ns=1000)
    assert waiting.due(1000) and waiting.next_ns() == 1000
    assert waiting.pop() is reqs[0] and not waiting.due(1009) and waiting.due(1010)
    assert [waiting.pop().id, waiting.pop().id] == [1, 2]  # FIFO among equal times
    assert reqs[3].arrival_ns == 1030 and waiting.next_ns() == 1030
    assert waiting.pop() is reqs[3] and not waiting and not waiting.due(10**12)


def test_arrivals_out_of_order_are_sorted_stably_and_a_length_mismatch_is_an_error() -> None:
    reqs = _reqs(4)
    waiting = Arrivals(reqs, [30, 0, 30, 5], start_ns=0)
    assert [waiting.pop().id for _ in range(4)] == [1, 3, 0, 2]
    with pytest.raises(ValueError):  # its one refusal: a count of arrival times unlike the requests
        Arrivals(reqs, [0, 1, 2], start_ns=0)


def test_a_serve_run_makes_generated_requests_only_as_they_arrive() -> None:
    reqs = GeneratedRequests(3, 2, 1, vocab=10, seed=0)
    waiting = Arrivals(reqs, [0, 5, 9], start_ns=0)
    assert reqs.made == 1  # the next one is looked at, no further
    waiting.pop()
    assert reqs.made == 2


def test_poisson_arrivals_are_made_as_they_are_reached_and_in_order() -> None:
    from ppscope.engine.requests import PoissonArrivals

    lazy = PoissonArrivals(100_000_000, 2.0, seed=3)  # a hundred million: nothing is made up front
    first = [lazy[i] for i in range(5)]
    assert first == sorted(first) and first[0] > 0
    again = PoissonArrivals(5, 2.0, seed=3)
    assert again[4] == first[4] and again[0] == first[0] and again[:] == first  # going back makes them again
    assert PoissonArrivals(10**9, 0.0, seed=1)[10**9 - 1] == 0
    with pytest.raises(IndexError):
        PoissonArrivals(3, 1.0, seed=1)[3]
    reqs = GeneratedRequests(100_000_000, 2, 1, vocab=10, seed=0)
    waiting = Arrivals(reqs, lazy, start_ns=0)  # in order by construction: not walked to check
    assert waiting.pop().arrival_ns == first[0] and reqs.made == 2
