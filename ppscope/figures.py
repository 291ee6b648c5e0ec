"""Pure plotly figure builders for a trace and its analysis: Gantt chart, stage breakdown, theory vs measured.

Each function takes a Trace and/or an AnalysisResult and returns a `plotly.graph_objects.Figure`; none
shows, writes or imports streamlit, so the HTML report, the dashboard and tests all call them alike.
The Gantt chart uses horizontal bars on a linear µs axis (`Bar(base=start_us, x=dur_us)`), one row per
rank and lane; above `max_bars` spans it merges neighbours on a row (see `aggregate_bars`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ppscope.analysis import CAUSES, AnalysisResult
from ppscope.errors import InvalidConfigError
from ppscope.trace import Trace

__all__ = [
    "CAUSE_COLORS",
    "KIND_COLORS",
    "aggregate_bars",
    "gantt",
    "gantt_rows",
    "stage_breakdown",
    "theory_vs_measured",
]

KIND_COLORS: dict[str, str] = {
    "forward": "#1f77b4",
    "embed": "#17becf",
    "head": "#9467bd",
    "sample": "#e377c2",
    "kernel": "#1f77b4",
    "send": "#ff7f0e",
    "recv": "#2ca02c",
    "recv_wait": "#bcbd22",
    "nccl": "#2ca02c",
    "memcpy": "#8c564b",
    "memset": "#8c564b",
    "step": "#c7c7c7",
    "host": "#7f7f7f",
    "range": "#dbdbdb",
    "mark": "#000000",
}
CAUSE_COLORS: dict[str, str] = {
    "busy": "#1f77b4",
    "fill": "#aec7e8",
    "drain": "#c5b0d5",
    "upstream": "#ffbb78",
    "dependency": "#f7b6d2",
    "downstream": "#ff9896",
    "comm": "#98df8a",
    "host": "#c7c7c7",
    "unknown": "#e0e0e0",
}
_MB_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]
_LANE_ORDER = {"compute": 0, "recv": 1, "send": 2, "host": 3}


def gantt_rows(spans: pd.DataFrame) -> pd.Series:
    """Row label per span, `rank r · lane`; compute first, then recv, send, host, then GPU streams."""
    return "rank " + spans["rank"].astype(str) + " · " + spans["lane"].astype(str)


def _row_keys(spans: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """The distinct (rank, lane) rows in display order with their labels, and each span's row index."""
    lane_code, lane_names = pd.factorize(spans["lane"])
    width = max(len(lane_names), 1)
    pair = spans["rank"].to_numpy(np.int64) * width + lane_code
    uniq, inverse = np.unique(pair, return_inverse=True)
    keys = pd.DataFrame({"rank": uniq // width, "lane": np.asarray(lane_names, dtype=object)[uniq % width]})
    keys["label"] = gantt_rows(keys)
    keys["o"] = keys["lane"].map(_LANE_ORDER).fillna(9)
    order = keys.sort_values(["rank", "o", "lane"]).index.to_numpy()
    return keys.loc[order].reset_index(drop=True), np.argsort(order)[inverse.reshape(-1)]


def aggregate_bars(bars: pd.DataFrame, max_bars: int, span_ns: int) -> pd.DataFrame:
    """At most `max_bars` bars: neighbours on a row with the same colour key and a gap under a resolution
    step are merged (column `n` counts the spans in a bar); if still too many, the longest are kept.

    `bars` needs columns row, key, start_ns, end_ns; other columns keep the first span's value.
    """
    if max_bars < 1:
        raise InvalidConfigError(f"max_bars must be >= 1, got {max_bars}")
    bars = bars.assign(n=1)
    if len(bars) <= max_bars:
        return bars
    row_code, row_names = pd.factorize(bars["row"])
    key_code, key_names = pd.factorize(bars["key"])
    start = bars["start_ns"].to_numpy(np.int64)
    end = bars["end_ns"].to_numpy(np.int64)
    tol = max(span_ns // max(max_bars // max(len(row_names), 1), 1), 1)
    group = row_code.astype(np.int64) * max(len(key_names), 1) + key_code
    order = np.lexsort((start, group))
    g, s, e = group[order], start[order], end[order]
    # Running max of ends within each (row, key) group in one pass: offsetting each group by more than the
    # whole time range keeps earlier groups from leaking into later ones.
    t0 = int(s.min())
    step = int(e.max()) - t0 + 2
    if int(g.max()) * step < 2**62:
        offset = g * step
        run_end = np.maximum.accumulate(e - t0 + offset) - offset + t0
    else:  # pragma: no cover - absurd time ranges; exact but slower
        run_end = pd.Series(e).groupby(g).cummax().to_numpy()
    new = np.ones(len(g), np.bool_)
    new[1:] = (g[1:] != g[:-1]) | (s[1:] > run_end[:-1] + tol)
    first = np.flatnonzero(new)
    merged = bars.iloc[order[first]].copy()
    merged["start_ns"] = s[first]
    merged["end_ns"] = np.maximum.reduceat(e, first)
    merged["n"] = np.diff(np.append(first, len(g)))
    if len(merged) > max_bars:
        merged = merged.assign(_d=merged["end_ns"] - merged["start_ns"]).nlargest(max_bars, "_d").drop(columns="_d")
    return merged.reset_index(drop=True)


def gantt(
    trace: Trace,
    result: AnalysisResult | None = None,
    *,
    color_by: str = "kind",
    max_bars: int = 20_000,
    window_ns: tuple[int, int] | None = None,
    show_gaps: bool = True,
) -> go.Figure:
    """Pipeline timeline: one row per rank and lane, bars coloured by `kind` or micro-batch (`mb`), idle
    gaps of each stage (from `result`) shaded by cause on its ranks' compute rows. Times in µs from the
    start of the trace (or of `window_ns`). At most `max_bars` span bars (see `aggregate_bars`) plus at most
    `max_bars` idle-gap bars (the longest)."""
    if color_by not in ("kind", "mb"):
        raise InvalidConfigError(f"color_by must be 'kind' or 'mb', got {color_by!r}")
    spans = trace.spans
    fig = go.Figure()
    if len(spans) == 0:
        return _layout(fig, "Pipeline timeline (no spans)", [])
    t0 = int(spans["start_ns"].min()) if window_ns is None else window_ns[0]
    t1 = int(spans["end_ns"].max()) if window_ns is None else window_ns[1]
    if window_ns is not None:
        spans = spans[(spans["end_ns"] > t0) & (spans["start_ns"] < t1)]
    keys, row = _row_keys(spans)
    labels = keys["label"].to_numpy()
    mb = spans["mb"].to_numpy()
    slot = np.where(mb >= 0, mb % len(_MB_PALETTE), -1)  # micro-batches sharing a colour may merge
    bars = spans.assign(row=row, key=spans["kind"] if color_by == "kind" else slot)
    bars = aggregate_bars(bars, max_bars, max(t1 - t0, 1))
    bars["row"] = labels[bars["row"].to_numpy()]
    if show_gaps and result is not None and len(result.gaps):
        _add_gaps(fig, result, keys, t0, t1, max_bars)
    if color_by == "kind":
        for key, part in bars.groupby("key", sort=True):
            fig.add_trace(_bar(part, t0, str(key), KIND_COLORS.get(str(key), "#999999")))
    else:  # one trace per palette colour, not per micro-batch: thousands of traces would stall the browser
        for k, part in bars.groupby("key", sort=True):
            name = "no mb" if k < 0 else f"mb ≡ {k} (mod {len(_MB_PALETTE)})"
            fig.add_trace(_bar(part, t0, name, "#999999" if k < 0 else _MB_PALETTE[int(k)]))
    return _layout(fig, "Pipeline timeline", list(labels))


def _bar(part: pd.DataFrame, t0: int, name: str, color: str) -> go.Bar:
    dur = part["end_ns"].to_numpy() - part["start_ns"].to_numpy()
    custom = np.stack(
        [
            part["kind"].astype(str).to_numpy(),
            part["stage"].to_numpy(),
            part["mb"].to_numpy(),
            part["step"].to_numpy(),
            part["phase"].astype(str).to_numpy(),
            dur / 1e3,
            part["nbytes"].to_numpy(),
            part["n"].to_numpy(),
            part["name"].astype(str).to_numpy(),
        ],
        axis=1,
    )
    return go.Bar(
        base=(part["start_ns"].to_numpy() - t0) / 1e3,
        x=dur / 1e3,
        y=part["row"],
        orientation="h",
        name=name,
        marker={"color": color, "line": {"width": 0}},
        customdata=custom,
        hovertemplate=(
            "%{customdata[8]}<br>kind %{customdata[0]} · stage %{customdata[1]} · mb %{customdata[2]}"
            " · step %{customdata[3]} · %{customdata[4]}<br>start %{base:.1f} µs · %{customdata[5]:.1f} µs"
            "<br>%{customdata[6]} bytes · %{customdata[7]} span(s)<extra></extra>"
        ),
    )


def _add_gaps(fig: go.Figure, result: AnalysisResult, keys: pd.DataFrame, t0: int, t1: int, max_bars: int) -> None:
    gaps = result.gaps[(result.gaps["end_ns"] > t0) & (result.gaps["start_ns"] < t1)]
    if len(gaps) > max_bars:
        gaps = gaps.assign(_d=gaps["end_ns"] - gaps["start_ns"]).nlargest(max_bars, "_d")
    lanes = keys.groupby("rank")["lane"].agg(list).to_dict()
    for cause, part in gaps.groupby("cause", sort=False):
        pieces = []
        for st in result.stages:
            sub = part[part["stage"] == st.stage]
            for r in st.ranks:
                on_rank = lanes.get(r, [])
                lane = "compute" if "compute" in on_rank else (on_rank[0] if on_rank else None)
                if lane is not None and len(sub):
                    pieces.append(sub.assign(row=f"rank {r} · {lane}"))
        if not pieces:
            continue
        g = pd.concat(pieces)
        fig.add_trace(
            go.Bar(
                base=(g["start_ns"].to_numpy() - t0) / 1e3,
                x=(g["end_ns"] - g["start_ns"]).to_numpy() / 1e3,
                y=g["row"],
                orientation="h",
                name=f"idle: {cause}",
                opacity=0.45,
                marker={"color": CAUSE_COLORS.get(str(cause), "#dddddd"), "line": {"width": 0}},
                hovertemplate=f"idle ({cause})<br>start %{{base:.1f}} µs · %{{x:.1f}} µs<extra></extra>",
            )
        )


def _layout(fig: go.Figure, title: str, rows: list[str]) -> go.Figure:
    fig.update_layout(
        title=title,
        barmode="overlay",
        xaxis={"title": "time (µs)", "type": "linear"},
        yaxis={"categoryorder": "array", "categoryarray": rows[::-1], "type": "category"},
        height=max(300, 40 * len(rows) + 150),
        legend={"orientation": "h", "y": -0.2},
        bargap=0.2,
    )
    return fig


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
    for c in CAUSES:
        share = sum(s.causes[c] for s in result.stages) / total
        if share:
            fig.add_trace(go.Bar(x=["measured"], y=[100 * share], name=c, marker={"color": CAUSE_COLORS[c]}))
    th = result.theory
    if th.bubble_ratio is not None:
        fig.add_trace(
            go.Bar(x=[f"theory: {th.formula}"], y=[100 * th.bubble_ratio], name="theory", marker={"color": "#555"})
        )
    fig.update_layout(
        title="Bubble ratio: theory vs measured (Σ bubble / (P × window))",
        barmode="stack",
        yaxis_title="% of wall time",
    )
    return fig
