"""`run_costs`: a run's profile when it has one that fits, else a fit of its spans, and one set of errors."""

from __future__ import annotations

import dataclasses

import pytest
from error_helpers import raises_code

from ppscope.balance.costs import LayerCosts
from ppscope.balance.measured.choose import run_costs
from ppscope.balance.measured.profile import LayerProfile, PhaseCosts
from ppscope.errors import ErrorCode, InvalidConfigError, UnsupportedInputError
from ppscope.simulate.simulator import SimConfig, simulate
from ppscope.trace.model import Trace
from ppscope.trace.notices import NoticeCode

# 3 stages of 2 layers: stage times 1.5 + 2, 2, 2 + 3 ms, from 1 ms layers, a 0.5 ms embedding and a 3 ms head
TRUE = LayerCosts(layer_ms=(1.0,) * 6, embed_ms=0.5, head_ms=3.0)


def run(costs: LayerCosts = TRUE, stages: int = 3, **kw: int) -> Trace:
    return simulate(SimConfig(schedule="gpipe", stages=stages, microbatches=2, costs=costs, **kw))


def profile(layer_ms: tuple[float, ...]) -> LayerProfile:
    decode = PhaseCosts(layer_ms=layer_ms, embed_ms=0.1, head_ms=0.2, sample_ms=0.0, tokens=1)
    prefill = dataclasses.replace(decode, layer_ms=tuple(4 * c for c in layer_ms))
    return LayerProfile(
        model="m", device="cpu", dtype="float32", method="perf_counter", repeats=3, prefill=prefill, decode=decode
    )


def test_without_a_profile_the_costs_are_the_fit_of_the_spans() -> None:
    got = run_costs([run()], None)
    assert got.source == "fit" and got.profile is None and got.fit is not None and got.phase == "all"
    assert got.costs.layer_ms == pytest.approx(TRUE.layer_ms)
    assert (got.costs.embed_ms, got.costs.head_ms) == pytest.approx((0.5, 3.0))


def test_a_profile_that_covers_the_layers_wins_and_the_fit_stands_beside_it() -> None:
    prof = profile((2.0, 1.0, 1.0, 1.0, 1.0, 1.0))
    got = run_costs([run()], prof)
    assert got.source == "profile" and got.profile is prof and got.phase == "decode"
    assert got.costs == LayerCosts(layer_ms=(2.0, 1.0, 1.0, 1.0, 1.0, 1.0), embed_ms=0.1, head_ms=0.2)
    assert got.fit is not None and got.fit.costs.layer_ms == pytest.approx(TRUE.layer_ms)
    assert run_costs([run()], prof, phase="prefill").costs.layer_ms == (8.0, 4.0, 4.0, 4.0, 4.0, 4.0)
    assert run_costs([run()], prof, choice="fit").source == "fit"


def test_a_profile_needs_no_fit_when_the_spans_cannot_give_one() -> None:
    # two stages and no embed/head cost: every stage is a first or a last one, the extras are not separable
    trace = run(LayerCosts.uniform(6, 1.0), stages=2)
    got = run_costs([trace], profile((1.0,) * 6))
    assert got.source == "profile" and got.fit is None
    with raises_code(UnsupportedInputError, ErrorCode.COSTS_NOT_SEPARABLE):
        run_costs([trace], None)


def test_a_profile_of_another_model_is_left_aside_or_refused() -> None:
    other = profile((1.0,) * 4)
    got = run_costs([run()], other, where="runs/r1")
    assert got.source == "fit" and [n.code for n in got.notes] == [NoticeCode.PROFILE_SET_ASIDE]
    assert "runs/r1's profile.json times 4 layers, the run has 6" in got.notes[0].text  # the file, both counts
    with raises_code(UnsupportedInputError, ErrorCode.PROFILE_MISMATCH):
        run_costs([run()], other, choice="profile")


def test_errors_are_named() -> None:
    with raises_code(UnsupportedInputError, ErrorCode.NO_PROFILE) as err:
        run_costs([run()], None, choice="profile", where="runs/r1")
    assert "runs/r1" in str(err.value)
    with raises_code(UnsupportedInputError, ErrorCode.PHASE_NOT_AVAILABLE):
        run_costs([run()], profile((1.0,) * 6), phase="all")
    with raises_code(InvalidConfigError, ErrorCode.UNSUPPORTED_SCHEDULE):
        run_costs([simulate(SimConfig(schedule="interleaved", stages=2, microbatches=2, chunks=2, costs=TRUE))], None)
    unsplit = run()
    unsplit.meta = dataclasses.replace(unsplit.meta, split=[])
    with raises_code(UnsupportedInputError, ErrorCode.NO_LAYER_SPLIT):
        run_costs([unsplit], None)
    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CHOICE):
        run_costs([run()], None, choice="best")
