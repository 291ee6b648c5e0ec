"""The Compare page: two runs side by side, each a trace in memory or a large run read a rank at a time.

A `Side` is what the page shows of one run, however it was read: the analysis of the pipeline it details, the
replicas' comparison when the run is a job of several pipelines, and the lanes of its stage view. A large run
(`RankedRun`) gives them from its rank-at-a-time analysis and the lanes' ranks alone: never loaded whole here.
Streamlit calls only; the tables come from `ppscope.dashboard.charts`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from ppscope.analysis import gantt
from ppscope.analysis.replica_report import stage_lanes
from ppscope.dashboard import charts, views
from ppscope.dashboard.data import LiveTrace
from ppscope.dashboard.ranked import RankedRun
from ppscope.dashboard.safety import Entry, md
from ppscope.errors import PPScopeError
from ppscope.trace.store import DEMO_FILE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from ppscope.analysis import AnalysisResult
    from ppscope.analysis.replicas import ReplicaAnalysis

__all__ = ["MAX_BARS", "Side", "demo_headline", "live_side", "page", "ranked_side"]

MAX_BARS = 3000
"""Each stage view draws at most this many bars; beyond, the Gantt aggregates them."""
_LANES = "Each stage's median replica and its straggler (▲)."


@dataclass(frozen=True)
class Side:
    """One run of the page, as shown: `result` is its one pipeline's analysis or, for a job of several (`job`),
    the analysis of the pipeline holding the job's bottleneck (as on its Stages page and in `ppscope analyze`)."""

    label: str
    result: AnalysisResult | None
    problem: str
    """Why there is no result."""
    job: ReplicaAnalysis | None
    lanes: pd.DataFrame
    """The spans of its stage view: every span of one pipeline, or a job's `stage_lanes`."""
    origin_ns: int
    end_ns: int
    """Its first span's start and last span's end, of any rank: its time axis (0 and 0 without spans)."""
    drawn: str
    """What the stage view draws, and how it was read."""
    warning: str = ""
    folder: Path | None = None
    """The folder its run lies in (None: not known)."""


def live_side(live: LiveTrace, label: str) -> Side:
    """A trace in memory (refreshed by the caller): its figures as its own pages compute them."""
    ra, placement = views.replicas(live)
    result, problem = views.analysis(live)
    spans = live.trace.spans
    origin, end = (int(spans["start_ns"].min()), int(spans["end_ns"].max())) if len(spans) else (0, 0)
    if ra is None or placement is None:
        return Side(label, result, problem, None, spans, origin, end, "", live.error)
    lanes = live.memo("compare_lanes", lambda t: stage_lanes(t.spans, ra, placement))
    return Side(label, result, problem, ra, lanes, origin, end, f"{_LANES} As on its Timeline page.", live.error)


def ranked_side(big: RankedRun, label: str) -> Side:
    """A large run, read a rank at a time (what its own pages read, kept by `big`: a second look reads nothing)."""
    try:
        run = big.replicas()
        lanes = big.stage_spans()
    except PPScopeError as exc:
        return Side(label, None, str(exc), None, pd.DataFrame(), 0, 0, "")
    ra = run.analysis
    if ra is None:  # changed on disk since it was opened
        return Side(label, None, "it is no longer a job of several pipelines", None, pd.DataFrame(), 0, 0, "")
    drawn = f"{_LANES} Read a rank at a time: {len(big.files):,} rank files, these lanes' spans alone in memory."
    result = ra.results.get(ra.shown_replica)
    problem = "" if result is not None else "no replica recorded spans"
    live = " Still being written: as of the last read." if big.live else ""
    return Side(label, result, problem, ra, lanes, run.first_ns, run.last_ns, drawn + live)


def demo_headline(folder: Path) -> str:
    """The predicted and measured speedup of the demo whose runs `folder` holds, in one line ("" without one).
    Only numbers and a fixed word are taken from the file: nothing in it reaches the page as text."""
    try:
        found = tomllib.loads((folder / DEMO_FILE).read_text(encoding="utf-8"))
        predicted, measured = float(found["predicted_speedup"]), found.get("measured_speedup")
        change = found["advice"] == "change"
        low_high = found.get("measured_interval")
    except (OSError, ValueError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return ""
    line = f"The demo predicted ×{predicted:.3f} for the advised split"
    if measured is None:
        return f"{line} and advised keeping the given one: the advised split was not run."
    line += f" and measured ×{float(measured):.3f}"
    if isinstance(low_high, list) and len(low_high) == 2:
        line += f" (95% interval ×{float(low_high[0]):.3f}–×{float(low_high[1]):.3f})"
    return f"{line}; advice: {'change' if change else 'keep'}."


def page(a: Side, others: Sequence[Entry], opener: Callable[[Entry], Side], headline: str = "") -> None:
    """A (the sidebar's run) against B, picked among `others` and opened by `opener`: the jobs' figures, the
    detailed pipelines' headline figures, the stages' spread when both are jobs, and the two stage views.
    `headline`: what the demo whose runs A is among found (`demo_headline`), shown above when B is one too."""
    st.markdown("### Compare two runs")
    if not others:
        st.info(
            "Only one trace is open. Start the dashboard on two runs (`ppscope dashboard RUN_A RUN_B`) or on a "
            "folder of runs to compare them."
        )
        return
    label = st.selectbox("Compare with (B)", [e.label for e in others], key="compare_with")
    b_entry = next(e for e in others if e.label == label)
    if headline and a.folder is not None and b_entry.path.parent == a.folder:
        st.markdown(f"**{headline}**")
    b = opener(b_entry)
    if b.warning:
        st.warning(md(b.warning))
    if a.result is None or b.result is None:
        which, why = ("A", a.problem) if a.result is None else ("B", b.problem)
        st.error(f"The analyzer could not read {which}: {md(why)}")
        return
    st.caption("A is the trace picked in the sidebar, B the one chosen here; deltas are B - A.")
    if a.job is not None or b.job is not None:
        st.markdown("**The jobs**, over all their data-parallel pipelines")
        st.dataframe(charts.shown(charts.job_compare_table(a.job or a.result, b.job or b.result)), hide_index=True)
        st.caption(
            "Bubble ratio of all pipelines: Σ bubble / Σ (P × window). Throughput: the sum of each pipeline's "
            "tokens/s over its own window. A run of one pipeline counts as a job of one."
        )
        st.markdown(f"**The pipelines detailed**: A: {_detailed(a)} · B: {_detailed(b)}")
    st.dataframe(charts.shown(charts.compare_table(a.result, b.result)), hide_index=True)
    if a.job is not None and b.job is not None:
        _spread(a.job, b.job)
    names = (f"A: {_short(a.label)}", f"B: {_short(b.label)}")
    if a.job is not None or b.job is not None:
        st.caption("The pipelines detailed, stage by stage:")
    st.plotly_chart(
        charts.compare_figure(a.result, b.result, names=names), key="compare", config={"displaylogo": False}
    )
    length_ns = max(a.end_ns - a.origin_ns, b.end_ns - b.origin_ns)
    st.caption("Both stage views on one time scale, each from its run's first span to the longer run's length.")
    for column, name, side, key in zip(st.columns(2), names, (a, b), ("gantt_a", "gantt_b"), strict=True):
        with column:
            st.markdown(f"**{md(name)}**")
            if not len(side.lanes):
                st.info("No spans to draw.")
                continue
            window = (side.origin_ns, side.origin_ns + length_ns)  # holds every span of the run: none left out
            view = gantt.gantt_figure(
                side.lanes, color_by="kind", max_bars=MAX_BARS, window_ns=window, origin_ns=side.origin_ns
            )
            st.plotly_chart(view.figure, key=key, config={"displaylogo": False})
            st.caption(f"{side.drawn} {view.note}".strip())


def _detailed(side: Side) -> str:
    if side.job is None:
        return "its one pipeline"
    return f"replica {side.job.shown_replica} of {len(side.job.replicas)} (the one holding its bottleneck)"


def _spread(a: ReplicaAnalysis, b: ReplicaAnalysis) -> None:
    """Per stage: each job's median and slowest pipeline, and its straggler."""
    basis = charts.BASIS_NAMES
    what = basis.get(a.basis, a.basis) if a.basis == b.basis else None
    st.markdown(f"**Each stage across the pipelines**: {what or 'A and B timed differently'} (ms)")
    st.dataframe(charts.shown_spread(charts.spread_compare_table(a, b)), hide_index=True)
    if what is None:
        st.caption(
            f"A's stages are timed by {md(basis.get(a.basis, a.basis))}, B's by {md(basis.get(b.basis, b.basis))} "
            "(some stage has no forward spans): B - A is left out."
        )


def _short(text: str, limit: int = 28) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]
