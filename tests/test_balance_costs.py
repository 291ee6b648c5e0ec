"""Fitting layer costs from stage spans: exact on clean data, honest about fit quality and what it cannot tell."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from error_helpers import raises_code

from ppscope.balance.costs import LayerCosts, StageCosts
from ppscope.balance.measured.fit import fit_layer_costs, observe_stages, r_squared_text
from ppscope.balance.split import stage_layer_ranges
from ppscope.errors import ErrorCode, InvalidConfigError, UnsupportedInputError
from ppscope.trace.model import RankInfo, RunMeta, Trace
from ppscope.trace.notices import NoticeCode

MS = 1_000_000


def fake_run(
    layer_ms: Sequence[float],
    split: Sequence[int],
    *,
    embed_ms: float = 0.5,
    head_ms: float = 2.0,
    sample_ms: float = 0.25,
    own_spans: bool = True,
    passes: int = 4,
    noise: float = 0.0,
    prefill_factor: float = 0.0,
    unknown_stage: bool = False,
) -> Trace:
    """Compute spans of a run with known costs; without `own_spans` embed/head/sample hide inside `forward`."""
    rng = random.Random(1)
    rows: list[dict] = []
    last = len(split) - 1
    t = 0
    steps = [(s, "decode") for s in range(1, passes + 1)] + ([(0, "prefill")] if prefill_factor else [])
    for stage, (first, end) in enumerate(stage_layer_ranges(split)):
        for step, phase in steps:
            fwd = sum(layer_ms[first:end])
            parts = []
            if stage == 0:
                if own_spans:
                    parts.append(("embed", embed_ms))
                else:
                    fwd += embed_ms
            parts.append(("forward", fwd * (1 + rng.uniform(-noise, noise))))
            if stage == last:
                if own_spans:
                    parts += [("head", head_ms), ("sample", sample_ms)]
                else:
                    parts[-1] = ("forward", parts[-1][1] + head_ms + sample_ms)
            scale = prefill_factor if phase == "prefill" else 1.0
            parts = [(kind, dur * scale) for kind, dur in parts]
            for kind, dur in parts:
                start = t
                t += round(dur * MS)
                rows.append(
                    {
                        "rank": stage,
                        "stage": -1 if unknown_stage else stage,
                        "kind": kind,
                        "mb": 0,
                        "step": step,
                        "phase": phase,
                        "start_ns": start,
                        "end_ns": t,
                    }
                )
    meta = RunMeta(
        pp_size=len(split),
        world_size=len(split),
        split=list(split),
        ranks=[RankInfo(rank=r, stage=r) for r in range(len(split))],
    )
    return Trace.from_records(rows, meta=meta)


def test_one_clean_run_with_own_spans_is_exact() -> None:
    fit = fit_layer_costs([fake_run([1.0] * 12, [4, 3, 3, 2])])
    assert fit.costs.layer_ms == pytest.approx([1.0] * 12)
    assert (fit.costs.embed_ms, fit.costs.head_ms, fit.costs.sample_ms) == pytest.approx((0.5, 2.0, 0.25))
    assert fit.r_squared == pytest.approx(1.0) and fit.rms_residual_ms == pytest.approx(0, abs=1e-9)
    assert fit.extras_measured and fit.phase == "decode"


def test_one_run_gives_each_stage_time_divided_by_its_layers() -> None:
    layer_ms = [1.0, 1.0, 3.0, 3.0, 2.0, 2.0, 2.0, 2.0]
    fit = fit_layer_costs([fake_run(layer_ms, [4, 4])])
    assert fit.costs.layer_ms == pytest.approx([2.0] * 4 + [2.0] * 4)
    assert fit.r_squared is None  # the same layers on every stage: nothing for R² to measure but noise
    assert NoticeCode.SAME_LAYER_COUNTS in {n.code for n in fit.notes}
    assert r_squared_text(fit.r_squared) == "R² – (no spread in layers per stage to explain)"
    fit = fit_layer_costs([fake_run(layer_ms, [2, 2, 4])])
    assert fit.costs.layer_ms == pytest.approx(layer_ms)
    assert fit.uniform_layer_ms == pytest.approx(sum(layer_ms) / 8, rel=0.2)
    assert fit.r_squared is not None and fit.r_squared < 1.0  # one cost does not explain stages of 1+1, 3+3 ms
    assert r_squared_text(fit.r_squared) == f"R² {fit.r_squared:.3f}"
    assert fit.layer_rms_residual_ms == pytest.approx(0.0, abs=1e-9)


def test_two_runs_separate_extras_hidden_in_forward_spans() -> None:
    runs = [fake_run([1.5] * 8, [4, 4], own_spans=False), fake_run([1.5] * 8, [5, 3], own_spans=False)]
    fit = fit_layer_costs(runs)
    assert fit.costs.layer_ms == pytest.approx([1.5] * 8)
    assert fit.costs.embed_ms == pytest.approx(0.5)
    assert fit.costs.head_ms + fit.costs.sample_ms == pytest.approx(2.25)
    assert not fit.extras_measured and {NoticeCode.EMBED_FITTED, NoticeCode.HEAD_FITTED} <= {n.code for n in fit.notes}


def test_one_two_stage_run_without_extra_spans_cannot_tell_and_says_so() -> None:
    with raises_code(UnsupportedInputError, ErrorCode.COSTS_NOT_SEPARABLE):
        fit_layer_costs([fake_run([1.0] * 8, [4, 4], own_spans=False)])


def test_three_stages_without_extra_spans_fit_from_the_middle() -> None:
    fit = fit_layer_costs([fake_run([1.0] * 9, [3, 3, 3], own_spans=False)])
    assert fit.uniform_layer_ms == pytest.approx(1.0)
    assert fit.costs.embed_ms == pytest.approx(0.5) and fit.costs.head_ms == pytest.approx(2.25)


def test_noise_lowers_the_reported_fit_quality() -> None:
    clean = fit_layer_costs([fake_run([1.0] * 16, [5, 4, 4, 3], passes=1)])
    noisy = fit_layer_costs([fake_run([1.0] * 16, [5, 4, 4, 3], passes=1, noise=0.3)])
    assert noisy.rms_residual_ms > clean.rms_residual_ms + 0.01


def test_decode_passes_are_used_and_prefill_ignored_unless_asked() -> None:
    trace = fake_run([1.0] * 8, [4, 4], prefill_factor=10.0)
    assert fit_layer_costs([trace]).costs.layer_ms == pytest.approx([1.0] * 8)
    assert fit_layer_costs([trace], phase="prefill").costs.layer_ms == pytest.approx([10.0] * 8)
    with raises_code(InvalidConfigError, ErrorCode.UNKNOWN_CHOICE):
        fit_layer_costs([trace], phase="warmup")


def test_a_serve_slot_reused_by_later_requests_still_counts_each_pass_once() -> None:
    # Two requests one after the other in slot 0: both have steps 1..4, so (micro-batch, step) repeats.
    first, second = fake_run([1.0] * 6, [3, 3]), fake_run([1.0] * 6, [3, 3])
    shift = int(first.spans["end_ns"].max())
    rows = [
        *first.spans.to_dict("records"),
        *(
            second.spans.assign(
                start_ns=second.spans["start_ns"] + shift, end_ns=second.spans["end_ns"] + shift
            ).to_dict("records")
        ),
    ]
    obs = observe_stages(Trace.from_records(rows, meta=first.meta))
    assert [o.forward_ms for o in obs] == pytest.approx([3.0, 3.0]) and [o.passes for o in obs] == [8, 8]
    assert obs[1].head_ms == pytest.approx(2.0)


def test_stage_from_rank_when_spans_do_not_say() -> None:
    obs = observe_stages(fake_run([1.0] * 6, [3, 3], unknown_stage=True))
    assert [o.forward_ms for o in obs] == pytest.approx([3.0, 3.0])
    assert obs[0].embed_ms == pytest.approx(0.5) and obs[1].head_ms == pytest.approx(2.0)


def test_a_trace_without_split_is_refused() -> None:
    trace = fake_run([1.0] * 4, [2, 2])
    trace.meta.split = []
    with raises_code(UnsupportedInputError, ErrorCode.NO_LAYER_SPLIT):
        fit_layer_costs([trace])


def test_cost_dataclasses_validate() -> None:
    assert LayerCosts.uniform(3, 2.0, head_ms=1.0).last_extra_ms == 1.0
    assert StageCosts(comm_ms=1.0).resolve(1)[1] == [0.0]  # one stage: no hop
    with raises_code(InvalidConfigError, ErrorCode.BAD_VALUE):
        StageCosts(comm_ms=[-1.0, 0.0]).resolve(2)
