"""The Stages page of the dashboard, and the analyses other pages share (rebalance in `advice.py`, device usage
and requests in `jobpages.py`, compare in `compare.py`). Streamlit calls only.

Each page takes a `LiveTrace`, asks `ppscope` for numbers (memoised per version of the trace), and shows
them with figures from `ppscope.analysis.figures`. A piece of the library that is not there yet is named on the
page instead of being imitated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from ppscope.analysis import CAUSES, figures
from ppscope.analysis.replicas import rank_list
from ppscope.analysis.report import incomplete_line, replay_line
from ppscope.dashboard.charts import what_if_rows
from ppscope.dashboard.data import LiveTrace
from ppscope.dashboard.safety import md
from ppscope.errors import PPScopeError
from ppscope.trace.model import Trace
from ppscope.trace.notices import NoticeCode, missing_ranks

if TYPE_CHECKING:
    from ppscope.analysis import AnalysisResult
    from ppscope.analysis.placement import Placement
    from ppscope.analysis.replicas import ReplicaAnalysis

__all__ = ["analysis", "replica_summary", "replicas", "stage_page", "stages"]


def _analyze(trace: Trace) -> tuple[AnalysisResult | None, str]:
    from ppscope.analysis import analyze
    from ppscope.simulate.training import is_training, replay_training
    from ppscope.simulate.whatif import what_if

    try:
        result = analyze(trace)
    except PPScopeError as exc:
        return None, str(exc)
    if result.stages and is_training(trace):  # as `ppscope analyze` does
        result.replay, _ = replay_training(trace)
    if result.stages:
        result.what_if, result.what_if_reason = what_if(trace)
    return result, ""


def analysis(live: LiveTrace) -> tuple[AnalysisResult | None, str]:
    """The analyzer's result for the trace as it is now, or None and why not. For a job of several
    data-parallel pipelines: the analysis of the pipeline holding the bottleneck."""
    ra, _ = replicas(live)
    if ra is not None:
        return ra.results.get(ra.shown_replica), "no replica recorded spans"
    return live.memo("analysis", _analyze)


def _replicas(trace: Trace) -> tuple[ReplicaAnalysis | None, Placement | None]:
    from ppscope.analysis.placement import apply_placement, placement_of
    from ppscope.analysis.replicas import analyze_replicas
    from ppscope.simulate.whatif import what_if

    try:
        placement = placement_of(trace)
        if placement is None or len(placement.replicas) < 2:
            return None, None
        placed = apply_placement(trace, placement)
        ra = analyze_replicas(placed, placement, keep_gaps=True)
    except PPScopeError:
        return None, None
    shown = ra.results.get(ra.shown_replica)
    if shown is not None and shown.stages:  # the job's what-ifs, every replica's, as `ppscope analyze` shows them
        shown.what_if, shown.what_if_reason = what_if(placed, placement)
    return ra, placement


def replicas(live: LiveTrace) -> tuple[ReplicaAnalysis | None, Placement | None]:
    """For a job of several data-parallel pipelines (`RankInfo.replica` in its metadata), each analysed on its
    own and compared per stage; (None, None) for one pipeline."""
    return live.memo("replicas", _replicas)


def replica_summary(ra: ReplicaAnalysis) -> None:
    """The job's figures and one row per stage: median, slowest, the straggler (never a row per replica)."""
    st.markdown(f"### {len(ra.replicas)} data-parallel pipelines × {len(ra.stages)} stages")
    cols = st.columns(3)
    bottleneck = "—" if ra.bottleneck is None else "stage {}, replica {}, rank {}".format(*ra.bottleneck)
    cols[0].metric("Bottleneck", bottleneck, help="the (stage, replica) with the largest time per micro-batch")
    cols[1].metric("vs stage median", "—" if ra.bottleneck_slowdown is None else f"×{ra.bottleneck_slowdown:.3f}")
    cols[2].metric("Bubble ratio, all replicas", _pct(ra.bubble_ratio), help="Σ bubble / Σ (P × window)")
    st.caption(f"(stage, replica) from {md(ra.placement)}")
    if ra.missing_ranks:
        st.warning(
            f"Missing: {md(str(missing_ranks(ra.missing_ranks, ra.world_size)))}; "
            f"incomplete replica(s): {md(rank_list(ra.incomplete_replicas) or 'none known')}"
        )
    rows = [
        {
            "stage": s.stage,
            "replicas": s.replicas,
            f"median {s.basis} (ms)": round(s.median_ns / 1e6, 3),
            "slowest (ms)": round(s.slowest_ns / 1e6, 3),
            "straggler": f"replica {s.straggler_replica}, rank {s.straggler_rank}" if (s.slowdown or 0) > 1 else "none",
            "vs median": None if s.slowdown is None else round(s.slowdown, 4),
            "bubble median": round(s.bubble_median, 4),
            "bubble worst": round(s.bubble_worst, 4),
            "worst replica": s.bubble_worst_replica,
        }
        for s in ra.stages
    ]
    st.dataframe(rows, hide_index=True)
    st.caption(f"The figures below are replica {ra.shown_replica}'s, the pipeline holding the bottleneck.")


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def _si(x: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def stages(live: LiveTrace) -> None:
    ra, _ = replicas(live)
    stage_page(ra, *analysis(live))


def stage_page(ra: ReplicaAnalysis | None, result: AnalysisResult | None, problem: str) -> None:
    """The Stages page: the replicas' summary when there are several, then the analysis `result` (of the
    replica holding the bottleneck), or why there is none."""
    if ra is not None:
        replica_summary(ra)
    st.markdown("### Stages: busy time and bubbles")
    if result is None:
        st.error(f"The analyzer could not read this trace: {md(problem)}")
        return
    if not result.stages:
        st.info("No stages to show: " + md("; ".join(map(str, result.warnings))))
        return
    if result.missing is not None:  # said here, where its figures are missing, and not again in the header
        line = incomplete_line(result)
        st.warning(md(line[:1].upper() + line[1:]))
    w = result.window
    cols = st.columns(5)
    cols[0].metric("Bubble ratio", _pct(result.bubble_ratio), help="Σ bubble over stages / (P × window length)")
    cols[1].metric("Imbalance", _pct(result.imbalance), help=f"1 - mean/max of stage time ({result.imbalance_basis})")
    cols[2].metric("Bottleneck", "—" if result.bottleneck_stage is None else f"stage {result.bottleneck_stage}")
    speedup = result.balance_speedup
    cols[3].metric("Balance speedup", "—" if speedup is None else f"×{speedup:.2f}", help="max/mean stage time")
    tp = result.throughput_tokens_per_s
    cols[4].metric("Throughput", "—" if tp is None else _si(tp) + " tok/s", help=result.throughput_basis)
    if w is not None:
        st.caption(f"Window: {w.length_ns / 1e6:,.2f} ms ({w.mode}): {md(w.how)}")
    left, right = st.columns([3, 2])
    left.plotly_chart(figures.stage_breakdown(result), key="stages", config={"displaylogo": False})
    right.plotly_chart(figures.theory_vs_measured(result), key="theory", config={"displaylogo": False})
    theory = result.theory
    measured = _pct(result.bubble_ratio)
    if theory.bubble_ratio is None:
        st.markdown(
            f"**Theory vs measured**: measured {measured}; {md(theory.note or 'no formula for this schedule')}."
        )
    else:
        params = ", ".join(f"{k}={v}" for k, v in theory.params.items())
        st.markdown(
            f"**Theory vs measured**: `{theory.formula}` with {params} predicts {_pct(theory.bubble_ratio)}; "
            f"measured {measured} (Σ bubble / (P × window))." + (f" {md(theory.note)}." if theory.note else "")
        )
    if result.replay is not None:
        st.markdown(f"**Replay**: {md(replay_line(result).removeprefix('replay: '))}")
        if result.replay.note:
            st.caption(md(result.replay.note))
    _what_if(result)
    st.dataframe(_stage_table(result), hide_index=True)
    for warning in result.warnings:
        st.caption(f"⚠ {md(str(warning))}")


def _what_if(result: AnalysisResult) -> None:
    """The job's step replayed with changed costs: one row per what-if, its step and speedup."""
    w = result.what_if
    if w is None:
        why = result.what_if_reason
        if why is not None and why.code != NoticeCode.NO_TRAINING_STEP:
            st.caption(f"What-if: not possible: {md(str(why))}")
        return
    step = "the step" if w.replicas == 1 else f"the job's step ({w.replicas} replicas, the slowest sets it)"
    st.markdown(
        f"**What-if**: {step} "
        f"replayed in its own order with changed costs; with the measured ones {w.replay_step_ns / 1e6:,.3f} ms"
        + ("" if w.measured_step_ns is None else f" (measured {w.measured_step_ns / 1e6:,.3f} ms)")
    )
    st.dataframe(what_if_rows(w), hide_index=True)


def _stage_table(result: AnalysisResult) -> list[dict[str, object]]:
    causes = [c for c in CAUSES if any(s.causes.get(c, 0) for s in result.stages)]
    rows = []
    for s in result.stages:
        row: dict[str, object] = {
            "stage": s.stage,
            "ranks": ", ".join(map(str, s.ranks)),
            "busy (ms)": round(s.busy_ns / 1e6, 3),
            "bubble (ms)": round(s.bubble_ns / 1e6, 3),
            "bubble share": round(s.bubble_ratio, 4),
            "time per micro-batch (ms)": None if s.time_per_mb_ns is None else round(s.time_per_mb_ns / 1e6, 3),
        }
        row.update({f"{cause} (ms)": round(s.causes.get(cause, 0) / 1e6, 3) for cause in causes})
        rows.append(row)
    return rows
