"""The bare rings the engine benchmark measures itself against: they run, and what they return is an
efficiency (measured ÷ ideal) of a pipeline that only sleeps and passes messages."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from benchmarks.ring_reference import gpipe_efficiency, ring_efficiency


@pytest.mark.parametrize("transport", ["pipe", "gloo"])
def test_a_bare_ring_reaches_most_of_its_ideal(transport: str) -> None:
    eff = ring_efficiency(transport, stages=2, stage_ms=2.0, passes=60)
    # a hop costs tens of microseconds against 2 ms holds; a broken ring (a hold skipped, a message lost)
    # would be far off one way or the other, or hang and fail
    assert 0.5 < eff < 1.05


def test_a_bare_gpipe_pipeline_reaches_most_of_its_ideal() -> None:
    assert 0.5 < gpipe_efficiency(stages=2, microbatches=3, steps=3, stage_ms=2.0) < 1.05


def test_an_unknown_transport_is_named() -> None:
    with pytest.raises(ValueError, match="unknown transport 'shm'; valid: gloo, pipe"):
        ring_efficiency("shm")
