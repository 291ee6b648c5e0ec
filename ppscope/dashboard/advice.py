"""The Rebalance page: the split `ppscope rebalance RUN` advises, for a run in memory and for a large run.

A run in memory is reduced to its timed parts (`RunTimings.of`) once, and a large run shown a rank at a time
(`RankedRun`) reads them rank file by rank file (`run_timings`, what `ppscope rebalance RUN` reads): the same
table either way, so the page shows the same costs, split, speedup, interval and advice, and the same figures as
`ppscope rebalance --json`. The simulated replay and the measured timeline beside them need every rank's spans,
so a large run's page leaves them out and says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from ppscope.analysis import gantt
from ppscope.dashboard import charts
from ppscope.dashboard.data import LiveTrace
from ppscope.dashboard.ranked import RankedRun
from ppscope.dashboard.safety import md
from ppscope.errors import PPScopeError
from ppscope.trace.model import Trace

if TYPE_CHECKING:
    from ppscope.balance.advise.rebalance import Rebalance
    from ppscope.balance.measured.profile import LayerProfile
    from ppscope.balance.measured.timings import RunTimings
    from ppscope.balance.report import RebalanceReport
    from ppscope.simulate.calibrate import Prediction

__all__ = ["advice_for", "page", "page_ranked"]

_TITLE = "### Rebalance: what if the layers were split differently"


def advice_for(run: Trace | RunTimings, profile: LayerProfile | None) -> tuple[RebalanceReport | None, str]:
    """The answer of `ppscope rebalance RUN` (`ppscope.balance.report.rebalance_runs`): costs timed layer by
    layer inside the run when it has `layer` spans, else its per-layer profile when it has one (decode pass),
    else fitted from the run's stage spans. `run`: a trace in memory (reduced to its timed parts here, once) or
    a run's timings read a rank at a time."""
    from ppscope.balance.measured.timings import as_timings
    from ppscope.balance.report import RebalanceRequest, rebalance_runs

    try:
        report = rebalance_runs([as_timings(run)], RebalanceRequest(), profile=profile)
    except PPScopeError as exc:
        return None, str(exc)
    if isinstance(run, Trace):
        return report, ""  # the page leads it with the replay it also draws (`_replayed`)
    return dataclasses.replace(report, simulated_note=_NO_REPLAY), ""


_NO_REPLAY = "the replay needs every rank's spans: tick 'Load the whole run' in the sidebar for it"


def _cost_source(report: RebalanceReport) -> str:
    """Where the costs came from, in a sentence or two for the page."""
    from ppscope.balance.measured.fit import r_squared_text

    fit, profile = report.fit, report.profile
    if report.insitu is not None:
        sampled = report.insitu.passes
        return (
            f"Costs timed layer by layer inside this run ({report.phase} passes, the median of {min(sampled)}-"
            f"{max(sampled)} sampled passes per layer): {report.mean_layer_ms:.3f} ms per layer, the mean over "
            "layers."
        )
    if profile is not None:
        return (
            f"Costs from the run's per-layer profile (profile.json, {report.phase} pass, timed with {profile.how} "
            f"on {profile.device}): {report.mean_layer_ms:.3f} ms per layer, the mean over layers."
        )
    assert fit is not None  # costs not from a profile are fitted
    passes = "all passes" if fit.phase == "all" else f"the {fit.phase} passes"
    return (
        f"Costs fitted from {passes} of this trace: {fit.uniform_layer_ms:.3f} ms per layer under the uniform fit "
        "of each stage's mean pass, "
        f"{r_squared_text(fit.r_squared)}. " + " ".join(f"Note: {md(n.text)}." for n in (*report.fit_notes, *fit.notes))
    )


def _profile(path: Path, is_run: bool) -> tuple[LayerProfile | None, str]:
    """The run's per-layer profile (profile.json) when it has one, and what is wrong with a damaged one."""
    from ppscope.balance.measured.profile import read_profile

    if not is_run:
        return None, ""
    try:
        return read_profile(path), ""
    except PPScopeError as exc:
        return None, f"{exc}; costs are fitted from the spans instead"


def page(live: LiveTrace) -> None:
    """The page of a trace in memory: the advice, then the run replayed by the simulator with both splits."""
    from ppscope.simulate.advice import with_replay

    st.markdown(_TITLE)
    profile, profile_problem = _profile(live.path, live.is_run)
    if profile_problem:
        st.warning(md(profile_problem))
    got, problem = live.memo(f"advice-{profile is not None}", lambda t: advice_for(t, profile))
    if got is None:
        show_advice(None, problem)
        return
    # both splits through the simulator once: the advice's headline and the timeline drawn beside it
    sim, why_not = live.memo(f"simulated-{profile is not None}", lambda t: _simulate_advised(t, got))
    pair = None if sim is None else (sim.current, sim.advised)
    show_advice(live.memo(f"replayed-{profile is not None}", lambda t: with_replay(got, t, replayed=pair)), "")
    if sim is None:
        st.warning(f"No simulated timeline for this trace: {md(why_not)}")
    else:
        now, new_ms = sim.current, sim.advised.predicted_ms
        st.markdown(
            f"**Simulated replay** (the run's schedule and sizes, the advice's costs, measured hops): "
            f"current split {now.predicted_ms:,.3f} ms against {now.measured_ms:,.3f} ms measured "
            f"({now.throughput_error:+.1%} simulator error); advised split {new_ms:,.3f} ms, "
            f"×{now.predicted_ms / new_ms if new_ms else 1.0:.3f}."
        )
    left, right = st.columns(2)
    with left:
        st.markdown("**Measured timeline (current split)**")
        view = gantt.gantt_figure(live.trace.spans, color_by="kind", max_bars=3000)
        st.plotly_chart(view.figure, key="measured_gantt", config={"displaylogo": False})
        st.caption(view.note)
    with right:
        st.markdown("**Simulated timeline (advised split)**")
        if sim is not None:
            view = gantt.gantt_figure(sim.advised.trace.spans, color_by="kind", max_bars=3000)
            st.plotly_chart(view.figure, key="simulated_gantt", config={"displaylogo": False})
            st.caption(view.note + " Predicted by ppscope.simulate.simulator, not measured.")


def page_ranked(big: RankedRun) -> None:
    """The page of a large run: the advice from its timed parts, read a rank file at a time (as `ppscope
    rebalance RUN` reads them); not its spans, which the replay and the timelines would need."""
    st.markdown(_TITLE)
    profile, profile_problem = _profile(big.path, True)
    if profile_problem:
        st.warning(md(profile_problem))
    try:
        got, problem = big.memo(f"advice-{profile is not None}", lambda: advice_for(big.timings(), profile))
    except PPScopeError as exc:
        got, problem = None, str(exc)
    if show_advice(got, problem) is None:
        return
    st.info(
        f"Costs read a rank at a time from {len(big.files):,} rank files, as `ppscope rebalance RUN` reads them. "
        "The simulated replay and the measured timeline need every rank's spans: tick 'Load the whole run' in the "
        "sidebar for them."
    )


def show_advice(got: RebalanceReport | None, problem: str) -> Rebalance | None:
    """The advice: the splits, the predicted speedup and its interval, keep or change, where the costs came
    from, each stage's predicted time and the lines to paste; the rebalancer's answer, or None (then why not)."""
    if got is None:
        st.error(f"No advice for this trace: {md(problem)}")
        return None
    advice, interval, decision = got.split, got.interval, got.decision
    cur, new = advice.current, advice.proposed
    cols = st.columns(4)
    cols[0].metric("Current split", ",".join(map(str, cur.split)))
    cols[1].metric("Proposed split", ",".join(map(str, new.split)))
    lead = (
        f"both splits replayed on the run's schedule, its fill, drain and hops included (the run replayed as it "
        f"is: {got.simulated.error:.1%} off its measured time); the slowest stage alone says "
        f"×{advice.predicted_speedup:.3f}"
        if got.simulated is not None
        else "slowest stage now / proposed"
        + (f" (no schedule replay: {got.simulated_note})" if got.simulated_note else "")
    )
    cols[2].metric(
        "Predicted speedup",
        f"×{got.predicted_speedup:.3f}",
        help=lead + (f"; {interval.level:.0%} interval {interval.text()} ({interval.how})" if interval else ""),
    )
    change = new.max_ms - cur.max_ms
    cols[3].metric(
        "Slowest stage",
        f"{new.max_ms:.3f} ms",
        delta=f"{change:+.3f} ms" if abs(change) >= 5e-4 else None,
        delta_color="inverse",
        help="predicted time per micro-batch of the slowest stage with the advised split (change from now)",
    )
    st.caption(_cost_source(got))
    if decision.change:
        st.success(f"Advice: change the split. {md(decision.reason)}.")
    else:
        st.info(f"Advice: keep the current split: {md(decision.reason)}.")
    st.plotly_chart(charts.split_figure(cur.stage_ms, new.stage_ms), key="split", config={"displaylogo": False})
    lines = advice.lines
    if decision.change:
        st.markdown(f"**Ready to paste** ({advice.job} job)")
        shell = [lines[k] for k in ("vllm_env", "sglang_env", "ppscope_run") if k in lines]
        if shell:
            st.code("\n".join(shell), language="bash")
        if "megatron_args" in lines:
            st.caption(f"Megatron-LM: {lines['megatron_args'] or '(one stage: no flags needed)'}")
        if "torchtitan_args" in lines:
            st.caption(f"torchtitan: {lines['torchtitan_args']}")
    return advice


@dataclass(kw_only=True)
class _Replay:
    current: Prediction
    """The run replayed with its own split."""
    advised: Prediction


def _simulate_advised(trace: Trace, report: RebalanceReport) -> tuple[_Replay | None, str]:
    """The run replayed with the simulator, as it is and with the advised split, on the costs the advice was made
    with (`replay_splits`); None and why where it cannot be replayed."""
    from ppscope.simulate.advice import replay_splits

    try:
        current, advised = replay_splits(trace, report.costs, report.split.current.split, report.split.proposed.split)
    except PPScopeError as exc:
        return None, str(exc)
    return _Replay(current=current, advised=advised), ""
