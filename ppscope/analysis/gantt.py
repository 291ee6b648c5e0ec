"""The pipeline Gantt chart: spans in, a plotly Figure out, no Streamlit, no analysis.

The dashboard and the HTML report both draw it from here.

It draws one horizontal bar per span (`go.Bar(base=start, x=duration, orientation="h")`)
on a linear ms axis: `plotly.express.timeline` would turn numbers into dates and round widths to whole
milliseconds, so sub-millisecond spans would vanish. When a window holds more spans than a browser draws
quickly, each row is aggregated into time bins coloured by the share of each it computes (waits and sends
are idle, as the analyzer counts them), and the result says so (`GanttView.note`). Idle gaps come from the
analyzer and are shaded by cause on the compute rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd
import plotly.graph_objects as go

from ppscope.analysis.bubbles import ROLE_COMPUTE, span_roles
from ppscope.trace.model import COMPUTE_KINDS, Lane, SpanKind
from ppscope.trace.recorder import KIND_COLORS

__all__ = [
    "AGGREGATE_BINS",
    "CAUSE_COLORS",
    "CAUSE_DELTA_E",
    "COLOR_MODES",
    "GanttView",
    "gantt_figure",
    "kind_color",
    "overview_figure",
    "picked_window",
    "row_labels",
]

COLOR_MODES = ("micro-batch", "kind")
AGGREGATE_BINS = 1000
"""Time bins per row when a window holds too many spans to draw one bar each (about a pixel each)."""
_MB_PALETTE = (
    "#4C78A8",
    "#F58518",
    "#54A24B",
    "#E45756",
    "#72B7B2",
    "#EECA3B",
    "#B279A2",
    "#FF9DA6",
    "#9D755D",
    "#79706E",
    "#1F77B4",
    "#D62728",
)
_NO_MB = "#BAB0AC"
CAUSE_COLORS: dict[str, str] = {  # hatched on the Gantt, so they read as idle time next to solid work
    # Each at least CAUSE_DELTA_E apart from every other and from busy blue in CIELAB (ΔE*76), so that no
    # two causes read alike even under the hatch; greys for time with no other explanation.
    "fill": "#C8C8C8",
    "drain": "#9ECAE1",
    "upstream": "#FB9A99",
    "dependency": "#BCA9E0",
    "downstream": "#FDBF6F",
    "comm": "#B2DF8A",
    "memcpy": "#66C2A5",
    "dp_sync": "#F4A9D8",
    "optimizer": "#D9C27D",
    "host": "#8C8C8C",
    "unknown": "#FFED6F",
    "no_requests": "#F5F5F5",
}
CAUSE_DELTA_E = 10.0
"""The least CIELAB distance between two causes' colours (side by side, a ΔE of about 2.3 is just noticeable)."""
_LANE_ORDER = {str(Lane.COMPUTE): 0, str(Lane.LAYERS): 1, str(Lane.RECV): 2, str(Lane.SEND): 3, str(Lane.HOST): 4}
_MAX_LEGEND_MB = 32
_HOVER = (
    "%{customdata[0]}<br>%{y}<br>stage %{customdata[1]} · mb %{customdata[2]} · step %{customdata[3]}"
    " · %{customdata[4]}<br>start %{base:,.3f} ms · duration %{customdata[5]:,.3f} ms"
    "<br>bytes %{customdata[6]}<extra></extra>"
)
_BINNED_HOVER = (
    "%{y}<br>around %{x:,.3f} ms: computing %{z:.0%} of the time, %{customdata:,} spans start here<extra></extra>"
)
_GAP_HOVER = "idle: %{customdata[0]}<br>%{y}<br>start %{base:,.3f} ms · length %{x:,.3f} ms<extra></extra>"


def kind_color(kind: str) -> str:
    """`#RRGGBB` of a span kind, the colour Nsight Systems shows for our NVTX ranges."""
    argb = KIND_COLORS.get(kind, 0xFF888888)
    return f"#{argb & 0xFFFFFF:06X}"


def _row_label(rank: int, lane: str) -> str:
    return f"rank {rank} · {lane}"


def row_labels(spans: pd.DataFrame) -> list[str]:
    """Gantt rows, top to bottom: ranks in order, each with compute, layers (the layer spans under the
    forwards they time), recv, send, host, then other lanes."""
    pairs = spans[["rank", "lane"]].drop_duplicates()
    keyed = sorted(
        (int(r), _LANE_ORDER.get(str(lane), 9), str(lane)) for r, lane in zip(pairs["rank"], pairs["lane"], strict=True)
    )
    return [_row_label(r, lane) for r, _, lane in keyed]


@dataclass(kw_only=True)
class GanttView:
    """A Gantt figure and what it shows."""

    figure: go.Figure
    spans_in_window: int
    bars: int
    """Bars drawn for spans; when `aggregated`, the (row, bin) cells with work in them."""
    aggregated: bool
    resolution_us: float
    """When aggregated: the width of one time bin."""
    note: str
    """One sentence for the page saying what is drawn (and what was aggregated or left out)."""


def gantt_figure(
    spans: pd.DataFrame,
    *,
    color_by: str = "micro-batch",
    gaps: pd.DataFrame | None = None,
    stage_ranks: Mapping[int, Sequence[int]] | None = None,
    window_ns: tuple[int, int] | None = None,
    origin_ns: int | None = None,
    max_bars: int = 6000,
    title: str = "",
) -> GanttView:
    """The pipeline Gantt of `spans` (SPAN_COLUMNS) within `window_ns` (all when None).

    x is ms since `origin_ns` (default: the first span's start). gaps: idle intervals (stage, start_ns,
    end_ns, cause) shaded on the compute rows of `stage_ranks[stage]`. Marks (zero-length) are not drawn.
    """
    if color_by not in COLOR_MODES:
        raise ValueError(f"unknown colour mode {color_by!r}; valid: {', '.join(COLOR_MODES)}")
    spans = spans[spans["kind"].to_numpy() != str(SpanKind.MARK)]
    origin = int(spans["start_ns"].min()) if origin_ns is None and len(spans) else int(origin_ns or 0)
    rows = row_labels(spans)
    busy_rows = _busy_rows(spans)
    if window_ns is not None:
        lo, hi = window_ns
        keep = (spans["end_ns"].to_numpy() >= lo) & (spans["start_ns"].to_numpy() <= hi)
        spans = spans[keep]
    fig = go.Figure()
    n = len(spans)
    aggregated = n > max_bars
    resolution_us = 0.0
    if aggregated:
        lo_ns = window_ns[0] if window_ns else int(spans["start_ns"].min())
        hi_ns = window_ns[1] if window_ns else int(spans["end_ns"].max())
        resolution_us = (hi_ns - lo_ns) / AGGREGATE_BINS / 1e3
        bars = _add_binned(fig, spans, origin, lo_ns, hi_ns, AGGREGATE_BINS)
        note = (
            f"{n:,} spans in the window, more than the {max_bars:,} bars a browser draws quickly: each row is "
            f"aggregated into {AGGREGATE_BINS:,} bins of {_fmt_ms(resolution_us * 1e3)}, coloured by the share of the "
            "bin it computes: waits and sends count as idle (the colour choice applies when each span is drawn). "
            "Narrow the time window to see each span."
        )
    else:
        bars = _add_spans(fig, spans, origin, color_by)
        note = f"{n:,} spans in the window, one bar each."
    if gaps is not None and stage_ranks and len(gaps):
        # Shading counts towards what the browser draws (bars are SVG; the aggregate is one image).
        budget = max_bars // 8 if aggregated else max(max_bars - bars, max_bars // 4)
        shown, dropped_ns = _add_gaps(
            fig, gaps, stage_ranks, busy_rows, origin, window_ns, min_ns=int(resolution_us * 1e3), limit=budget
        )
        if aggregated and dropped_ns:
            note += f" Idle gaps shorter than {_fmt_ms(max(resolution_us * 1e3, dropped_ns))} are not shaded."
        elif dropped_ns:
            note += f" Only the {shown:,} longest idle gaps are shaded (none shorter than {_fmt_ms(dropped_ns)})."
        # Shading goes under the bars.
        fig.data = tuple(sorted(fig.data, key=lambda t: (t.meta or {}).get("role") != "gap"))
    _layout(fig, rows, origin, window_ns, title)
    return GanttView(
        figure=fig, spans_in_window=n, bars=bars, aggregated=aggregated, resolution_us=resolution_us, note=note
    )


def overview_figure(spans: pd.DataFrame, origin_ns: int, height_px: int) -> GanttView:
    """The whole run as a strip of busy shares (the aggregated Gantt), made to pick a window on: a drag across
    it selects a span of time (the full height, whatever rows it starts on), read back by `picked_window`.
    Plotly selects only on traces that hold points, so an invisible point marks every bin along the first row."""
    view = gantt_figure(spans, max_bars=0, origin_ns=origin_ns, title="The whole run: drag across it to pick a window")
    rows = view.figure.layout.yaxis.categoryarray  # the figure's own rows, not worked out a second time
    if rows:
        drawn = spans[spans["kind"].to_numpy() != str(SpanKind.MARK)]
        lo, hi = (int(drawn["start_ns"].min()) - origin_ns) / 1e6, (int(drawn["end_ns"].max()) - origin_ns) / 1e6
        x = np.linspace(lo, hi, AGGREGATE_BINS + 1)
        view.figure.add_trace(
            go.Scatter(
                x=x,
                y=[rows[0]] * len(x),
                mode="markers",
                marker={"opacity": 0, "size": 1},
                hoverinfo="skip",
                showlegend=False,
                meta={"role": "pick"},
            )
        )
    view.figure.update_layout(height=height_px, dragmode="select", selectdirection="h")
    # a strip's plot area is a hundred pixels or so: its colour bar takes all of it, ticks apart
    view.figure.update_traces(colorbar={"len": 1.0, "y": 0.5, "yanchor": "middle"}, selector={"type": "heatmap"})
    return view


def picked_window(selection: Mapping[str, object] | None, origin_ns: int) -> tuple[int, int] | None:
    """The window (start_ns, end_ns) a drag across `overview_figure` picked, from the chart's selection state
    (Streamlit's: `box`, a list of {x: [x0, x1], ...} in ms since `origin_ns`, else the `points` in it); None
    when nothing is selected or the selection is narrower than a µs."""
    if not selection:
        return None
    boxes, points = selection.get("box"), selection.get("points")
    last = boxes[-1] if isinstance(boxes, list) and boxes and isinstance(boxes[-1], Mapping) else {}
    edges = last.get("x")
    xs = [float(v) for v in edges if isinstance(v, int | float)] if isinstance(edges, list) else []
    if len(xs) < 2 and isinstance(points, list):
        xs = [float(p["x"]) for p in points if isinstance(p, Mapping) and isinstance(p.get("x"), int | float)]
    if len(xs) < 2 or max(xs) - min(xs) < 1e-3:
        return None
    return origin_ns + int(min(xs) * 1e6), origin_ns + int(max(xs) * 1e6)


def _fmt_ms(ns: float) -> str:
    """A length in ms, as the axis and every table give it: 1,250 ms, 12.50 ms, 0.044 ms."""
    ms = ns / 1e6
    if ms >= 100:
        return f"{ms:,.0f} ms"
    if ms >= 1:
        return f"{ms:,.2f} ms"
    return f"{np.format_float_positional(ms, precision=3, fractional=False, trim='-')} ms"  # never 1.35e-03


def _labels(spans: pd.DataFrame) -> npt.NDArray[np.object_]:
    ranks = spans["rank"].to_numpy()
    lanes = spans["lane"].to_numpy()
    return np.array([_row_label(int(r), str(lane)) for r, lane in zip(ranks, lanes, strict=True)], dtype=object)


def _add_spans(fig: go.Figure, spans: pd.DataFrame, origin_ns: int, color_by: str) -> int:
    if not len(spans):
        return 0
    start_ms = (spans["start_ns"].to_numpy(np.int64) - origin_ns) / 1e6
    dur_ms = (spans["end_ns"].to_numpy(np.int64) - spans["start_ns"].to_numpy(np.int64)) / 1e6
    custom = np.empty((len(spans), 7), dtype=object)
    custom[:, 0] = spans["name"].to_numpy()
    custom[:, 1] = spans["stage"].to_numpy()
    custom[:, 2] = spans["mb"].to_numpy()
    custom[:, 3] = spans["step"].to_numpy()
    custom[:, 4] = spans["phase"].to_numpy()
    custom[:, 5] = dur_ms
    custom[:, 6] = _sizes(spans["nbytes"].to_numpy())
    labels = _labels(spans)
    mbs = spans["mb"].to_numpy()
    if color_by == "kind":
        keys = spans["kind"].to_numpy().astype(str)
        groups = [(str(k), keys == k, kind_color(str(k))) for k in sorted(set(keys))]
    elif len(np.unique(mbs)) <= _MAX_LEGEND_MB:
        groups = [(f"mb {m}" if m >= 0 else "no mb", mbs == m, _mb_color(int(m))) for m in np.unique(mbs)]
    else:  # too many micro-batches for a legend: one trace, colour per bar
        colors = np.array([_mb_color(int(m)) for m in mbs], dtype=object)
        fig.add_trace(_bar("spans", labels, start_ms, dur_ms, custom, colors, _HOVER, showlegend=False))
        return len(spans)
    for name, mask, color in groups:
        fig.add_trace(_bar(name, labels[mask], start_ms[mask], dur_ms[mask], custom[mask], color, _HOVER))
    return len(spans)


def _sizes(nbytes: npt.NDArray[np.int64]) -> npt.NDArray[np.object_]:
    """Each span's size as the hover reads it: `1,024`, or `–` where the trace records none (0 in the schema
    is not a size)."""
    out = np.full(len(nbytes), "–", dtype=object)
    known = nbytes > 0
    out[known] = [f"{int(n):,}" for n in nbytes[known]]
    return out


def _mb_color(mb: int) -> str:
    return _MB_PALETTE[mb % len(_MB_PALETTE)] if mb >= 0 else _NO_MB


def _bar(
    name: str,
    y: npt.NDArray[np.object_],
    base_ms: npt.NDArray[np.float64],
    width_ms: npt.NDArray[np.float64],
    custom: npt.NDArray[np.object_],
    color: str | npt.NDArray[np.object_],
    hover: str,
    *,
    role: str = "spans",
    opacity: float = 1.0,
    showlegend: bool = True,
    pattern: str = "",
) -> go.Bar:
    return go.Bar(
        name=name,
        y=y,
        base=base_ms,
        x=width_ms,
        orientation="h",
        customdata=custom,
        hovertemplate=hover,
        marker={
            "color": color,
            "line": {"width": 0},
            "pattern": {"shape": pattern, "fillmode": "overlay", "fgcolor": "#FFFFFF", "fgopacity": 0.7},
        },
        opacity=opacity,
        showlegend=showlegend,
        meta={"role": role},
    )


def _add_binned(fig: go.Figure, spans: pd.DataFrame, origin_ns: int, lo_ns: int, hi_ns: int, bins: int) -> int:
    """A heatmap over (row, time bin): the share of each bin the row computes; empty where it records nothing.

    Busy is what the analyzer calls busy: compute spans (`span_roles`), and the `layer` spans timed inside a
    forward. A row's waits, sends and copies are idle time, so a bin it spends waiting is drawn at 0%, not as
    work. A heatmap is one image for the browser, so this costs the same for ten bins or ten thousand.
    Busy time up to x is B(x) = Σ clamp(x - start, 0, duration) = Σ_{start<x} (x - start) - Σ_{end<x} (x - end),
    evaluated at every bin edge from sorted starts and ends with prefix sums; B(edge[i+1]) - B(edge[i]) is
    the busy time in bin i. Overlapping spans of one row count twice, so the share is capped at 1.
    Returns the number of bins with spans in them.
    """
    edges = np.linspace(lo_ns, hi_ns, bins + 1)
    width_ns = (hi_ns - lo_ns) / bins
    codes, names = pd.factorize(pd.Series(_labels(spans)))
    starts_all = spans["start_ns"].to_numpy(np.int64)
    ends_all = spans["end_ns"].to_numpy(np.int64)
    computing = _computing(spans)
    share = np.full((len(names), bins), np.nan)
    starting = np.zeros((len(names), bins), dtype=np.int64)
    for code in range(len(names)):
        sel = codes == code
        starts = np.sort(starts_all[sel])
        ends = np.sort(ends_all[sel])
        # a zero-length span still marks its bin as recorded (and idle)
        recorded = (np.diff(_busy_before(starts, ends, edges)) > 0) | (np.diff(np.searchsorted(starts, edges)) > 0)
        busy = sel & computing
        per_bin = np.diff(_busy_before(np.sort(starts_all[busy]), np.sort(ends_all[busy]), edges))
        share[code, recorded] = 0.0
        share[code, per_bin > 0] = np.minimum(per_bin[per_bin > 0] / max(width_ns, 1e-9), 1.0)
        starting[code] = np.diff(np.searchsorted(starts, edges, side="left"))
    fig.add_trace(
        go.Heatmap(
            name="computing",
            z=share,
            y=list(names),
            x0=(lo_ns - origin_ns + width_ns / 2) / 1e6,
            dx=width_ns / 1e6,
            customdata=starting,
            hovertemplate=_BINNED_HOVER,
            colorscale="Blues",
            zmin=0.0,
            zmax=1.0,
            # under the legend, both beside the plot: never over the bars
            colorbar={
                "title": {"text": "computing"},
                "tickformat": ".0%",
                "len": 0.45,
                "x": 1.02,
                "xanchor": "left",
                "y": 0,
                "yanchor": "bottom",
            },
            hoverongaps=False,
            ygap=4,
            meta={"role": "binned"},
        )
    )
    return int(np.isfinite(share).sum())


def _computing(spans: pd.DataFrame) -> npt.NDArray[np.bool_]:
    """Which spans are work: the analyzer's compute role, or a `layer` timed inside a forward."""
    roles = span_roles(spans["kind"], spans["name"])
    return (roles == ROLE_COMPUTE) | (spans["kind"].to_numpy() == str(SpanKind.LAYER))


def _busy_before(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], x: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Σ clamp(x - start, 0, end - start) over spans, for each x (starts and ends sorted)."""
    ps = np.concatenate([[0], np.cumsum(starts, dtype=np.float64)])
    pe = np.concatenate([[0], np.cumsum(ends, dtype=np.float64)])
    ns = np.searchsorted(starts, x, side="left")
    ne = np.searchsorted(ends, x, side="left")
    xf = x.astype(np.float64)
    return (ns * xf - ps[ns]) - (ne * xf - pe[ne])


def _busy_rows(spans: pd.DataFrame) -> dict[int, str]:
    """Per rank with compute spans, the row its idle gaps are shaded on: the `compute` lane, else the lane
    holding most of its compute spans (imports put kernels on GPU stream lanes)."""
    compute = spans[spans["kind"].isin(list(COMPUTE_KINDS))]
    counts = compute.groupby(["rank", "lane"], sort=True).size().reset_index(name="n")
    counts["preferred"] = counts["lane"] == str(Lane.COMPUTE)
    first = counts.sort_values(["rank", "preferred", "n"], ascending=[True, False, False]).drop_duplicates("rank")
    return {int(r): _row_label(int(r), str(lane)) for r, lane in zip(first["rank"], first["lane"], strict=True)}


def _add_gaps(
    fig: go.Figure,
    gaps: pd.DataFrame,
    stage_ranks: Mapping[int, Sequence[int]],
    busy_rows: Mapping[int, str],
    origin_ns: int,
    window_ns: tuple[int, int] | None,
    *,
    min_ns: int,
    limit: int,
) -> tuple[int, int]:
    """Shade gaps at least `min_ns` long, at most `limit` of them (the longest); returns how many bars were
    drawn and the length of the shortest gap drawn when some were left out (0 when none were)."""
    g_start = gaps["start_ns"].to_numpy(np.int64)
    g_end = gaps["end_ns"].to_numpy(np.int64)
    inside = np.ones(len(gaps), dtype=bool)
    if window_ns is not None:
        inside = (g_end >= window_ns[0]) & (g_start <= window_ns[1])
    keep = inside & ((g_end - g_start) >= max(min_ns, 1))
    if keep.sum() > limit:
        length = np.where(keep, g_end - g_start, -1)
        keep = np.zeros(len(gaps), dtype=bool)
        keep[np.argsort(-length, kind="stable")[:limit]] = True
    dropped = bool((inside & ~keep).any())
    gaps = gaps[keep]
    shortest = 0
    if dropped:
        shortest = int((gaps["end_ns"] - gaps["start_ns"]).min()) if len(gaps) else max(min_ns, 1)
    shown = 0
    for cause in [c for c in CAUSE_COLORS if c in set(gaps["cause"])]:
        sel = gaps[gaps["cause"].to_numpy() == cause]
        rows: list[str] = []
        starts: list[npt.NDArray[np.int64]] = []
        ends: list[npt.NDArray[np.int64]] = []
        for stage, part in sel.groupby("stage", sort=True):
            for rank in stage_ranks.get(int(stage), ()):
                if int(rank) not in busy_rows:
                    continue  # a rank without compute spans has no row to shade
                rows += [busy_rows[int(rank)]] * len(part)
                starts.append(part["start_ns"].to_numpy(np.int64))
                ends.append(part["end_ns"].to_numpy(np.int64))
        if not rows:
            continue
        s, e = np.concatenate(starts), np.concatenate(ends)
        custom = np.full((len(rows), 1), cause, dtype=object)
        fig.add_trace(
            _bar(
                f"idle: {cause}",
                np.array(rows, dtype=object),
                (s - origin_ns) / 1e6,
                (e - s) / 1e6,
                custom,
                CAUSE_COLORS[cause],
                _GAP_HOVER,
                role="gap",
                pattern="/",
            )
        )
        shown += len(rows)
    return shown, shortest


def _layout(fig: go.Figure, rows: list[str], origin_ns: int, window_ns: tuple[int, int] | None, title: str) -> None:
    xaxis: dict[str, object] = {
        "title": "time since run start (ms)",
        "type": "linear",
        "zeroline": False,
        "exponentformat": "none",  # 1,500 ms, not 1.5k ms
        "separatethousands": True,
    }
    if window_ns is not None:
        xaxis["range"] = [(window_ns[0] - origin_ns) / 1e6, (window_ns[1] - origin_ns) / 1e6]
    fig.update_layout(
        title=title or None,
        barmode="overlay",
        bargap=0.25,
        height=max(260, 90 + 26 * len(rows)),
        margin={"l": 10, "r": 10, "t": 40 if title else 10, "b": 40},
        xaxis=xaxis,
        yaxis={"categoryorder": "array", "categoryarray": rows, "autorange": "reversed", "type": "category"},
        # beside the plot, top down: a legend above it wrapped onto the title and the first rows
        legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top"},
        hoverlabel={"namelength": -1},
    )
