"""Pure plotly figure builders for an analysis: the per-stage cause breakdown and theory vs measured.

Each function takes an AnalysisResult and returns a `plotly.graph_objects.Figure`; none shows, writes or
imports streamlit, so the HTML report, the dashboard and tests all call them alike. The Gantt chart of the
spans themselves is `ppscope.analysis.gantt`.
"""

from __future__ import annotations

import plotly.graph_objects as go

from ppscope.analysis.gantt import CAUSE_COLORS as GANTT_CAUSE_COLORS
from ppscope.analysis.result import CAUSES, AnalysisResult

__all__ = ["CAUSE_COLORS", "stage_breakdown", "theory_vs_measured"]

CAUSE_COLORS: dict[str, str] = {"busy": "#4C78A8", **GANTT_CAUSE_COLORS}
"""Busy time and each idle cause, in the colours the Gantt chart shades them with."""


def stage_breakdown(result: AnalysisResult) -> go.Figure:
    """Stacked bars per stage: busy time and each idle cause in ms; the bottleneck stage is outlined."""
    labels = [f"stage {s.stage}" for s in result.stages]
    outline = [3 if s.stage == result.bottleneck_stage else 0 for s in result.stages]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=labels,
            y=[s.busy_ns / 1e6 for s in result.stages],
            name="busy",
            marker={"color": CAUSE_COLORS["busy"], "line": {"width": outline, "color": "#d62728"}},
        )
    )
    for c in CAUSES:
        ys = [s.causes[c] / 1e6 for s in result.stages]
        if any(ys):
            fig.add_trace(go.Bar(x=labels, y=ys, name=c, marker={"color": CAUSE_COLORS[c]}))
    if result.bottleneck_stage is not None:
        fig.add_annotation(
            x=f"stage {result.bottleneck_stage}", y=1.02, yref="paper", text="bottleneck", showarrow=False
        )
    fig.update_layout(title="Busy time and idle causes per stage", barmode="stack", yaxis_title="ms")
    return fig


def theory_vs_measured(result: AnalysisResult) -> go.Figure:
    """Measured bubble ratio stacked by cause (share of P × window) next to the theoretical one."""
    fig = go.Figure()
    w = result.window
    if w is None or not result.stages or w.length_ns <= 0:
        return fig.update_layout(title="Theory vs measured (nothing measured)")
    total = result.pp_size * w.length_ns
    for c in CAUSES if result.bubble_ratio is not None else ():  # unknown with a stage missing
        share = sum(s.causes[c] for s in result.stages) / total
        if share:
            fig.add_trace(go.Bar(x=["measured"], y=[100 * share], name=c, marker={"color": CAUSE_COLORS[c]}))
    th = result.theory
    if th.bubble_ratio is not None:
        # the formula is long: it goes in the legend and the hover, never a rotated tick label that is cut
        fig.add_trace(
            go.Bar(
                x=["theory"],
                y=[100 * th.bubble_ratio],
                name=f"theory: {th.formula}",
                hovertext=[th.formula],
                marker={"color": "#555"},
            )
        )
    fig.update_layout(
        title={"text": "Bubble ratio: theory vs measured", "automargin": True},
        barmode="stack",
        yaxis_title="% of P × window idle",
        legend={"orientation": "h", "yanchor": "top", "y": -0.15},
    )
    fig.update_xaxes(automargin=True, tickangle=0)
    return fig
