"""Figures specific to the dashboard: device usage over time, request latency, two runs compared.

Pure functions: frames and analyzer results in, plotly Figures or small tables out; no Streamlit. The
numbers come from the run's counters and from `ppscope.analysis`; nothing here computes a bubble.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ppscope.trace.actions import StrEnum
from ppscope.trace.model import Metric

if TYPE_CHECKING:
    from ppscope.analysis import AnalysisResult, RequestLatency
    from ppscope.analysis.replicas import ReplicaAnalysis, StageSpread
    from ppscope.analysis.result import WhatIf

__all__ = [
    "BASIS_NAMES",
    "USAGE_COLUMNS",
    "Unit",
    "UsageView",
    "compare_figure",
    "compare_table",
    "fmt",
    "job_compare_table",
    "latency_figure",
    "shown",
    "shown_spread",
    "split_figure",
    "spread_compare_table",
    "usage_figure",
    "usage_rows",
    "usage_tables",
    "what_if_rows",
]

_GPU_PANELS: tuple[tuple[str, str, float], ...] = (
    (Metric.GPU_UTIL_PCT, "utilisation (%)", 1.0),
    (Metric.GPU_MEM_USED_BYTES, "memory used (GiB)", 1 / 2**30),
    (Metric.GPU_POWER_W, "power (W)", 1.0),
    (Metric.GPU_SM_CLOCK_MHZ, "SM clock (MHz)", 1.0),
)
_CPU_PANELS: tuple[tuple[str, str, float], ...] = (
    (Metric.CPU_UTIL_PCT, "CPU use (%)", 1.0),
    (Metric.RSS_BYTES, "resident memory (GiB)", 1 / 2**30),
)


_LINE_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#9D755D", "#79706E")


@dataclass(kw_only=True)
class UsageView:
    figure: go.Figure
    device: str
    """`gpu` when the run has NVML counters, `cpu` when it falls back to per-rank CPU use."""
    label: str
    """What the page says the figure shows."""


def usage_figure(counters: pd.DataFrame, *, origin_ns: int = 0) -> UsageView | None:
    """GPU utilisation, memory, power and SM clock per device over time; per-rank CPU use without GPU counters.

    Each panel has a legend of its own beside it, naming each line's rank and GPU (plotly hides a legend of one
    line, and one legend at the top names the lines of the first panel alone). None when the run recorded no
    counters at all. x is ms since `origin_ns`.
    """
    panels, gpu = _panels(counters)
    if not panels:
        return None
    fig = make_subplots(
        rows=len(panels), cols=1, shared_xaxes=True, subplot_titles=[p[1] for p in panels], vertical_spacing=0.08
    )
    legends: dict[str, object] = {}
    drawn = counters[counters["metric"].isin([str(p[0]) for p in panels])]
    devices = sorted({(int(r), int(d)) for r, d in zip(drawn["rank"], drawn["device"], strict=True)})
    color = {key: _LINE_COLORS[n % len(_LINE_COLORS)] for n, key in enumerate(devices)}  # one per device, every panel
    for i, (metric, title, scale) in enumerate(panels, start=1):
        legend = "legend" if i == 1 else f"legend{i}"
        part = counters[counters["metric"].to_numpy() == str(metric)]
        for (rank, device), series in part.groupby(["rank", "device"], sort=True):
            series = series.sort_values("ts_ns")
            name = f"rank {rank} · gpu {device}" if gpu else f"rank {rank}"
            fig.add_trace(
                go.Scatter(
                    x=(series["ts_ns"].to_numpy(np.int64) - origin_ns) / 1e6,
                    y=series["value"].to_numpy(np.float64) * scale,
                    mode="lines",
                    name=name,
                    line={"color": color[int(rank), int(device)]},
                    legend=legend,
                    showlegend=True,
                    hovertemplate=f"{name}<br>%{{x:,.1f}} ms: %{{y:,.1f}} {title}<extra></extra>",
                ),
                row=i,
                col=1,
            )
        top = fig.get_subplot(i, 1).yaxis.domain[1]
        what = "rank · GPU" if gpu else "rank"
        legends[legend] = {"x": 1.01, "xanchor": "left", "y": top, "yanchor": "top", "title": {"text": what}}
    # ms since the run's start, as the Gantt's axis and every table (1,500 ms, not 1.5k)
    fig.update_xaxes(exponentformat="none", separatethousands=True)
    fig.update_xaxes(title_text="time since run start (ms)", row=len(panels), col=1)
    fig.update_layout(
        height=180 * len(panels) + 80, margin={"l": 10, "r": 10, "t": 40, "b": 40}, showlegend=True, **legends
    )
    if gpu:
        return UsageView(figure=fig, device="gpu", label="GPU usage per device (NVML counters)")
    return UsageView(
        figure=fig, device="cpu", label="CPU usage per rank: this run recorded no GPU counters (it ran on CPUs)"
    )


def _panels(counters: pd.DataFrame) -> tuple[tuple[tuple[str, str, float], ...], bool]:
    """The panels to draw of these counters (metric, title, scale): the GPU's when there are GPU counters, else
    the CPU's; and whether they are the GPU's."""
    metrics = set(counters["metric"].unique()) if len(counters) else set()
    gpu = tuple(p for p in _GPU_PANELS if p[0] in metrics)
    return gpu or tuple(p for p in _CPU_PANELS if p[0] in metrics), bool(gpu)


USAGE_COLUMNS = ("rank", "device", "metric", "samples", "mean", "high")
"""`usage_rows`'s columns."""


def usage_rows(counters: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, device, metric) of `counters`: how many samples, their mean and their highest value.
    Each row is one rank's alone, so a run read a rank at a time gives these rows rank by rank, the same."""
    if not len(counters):
        return pd.DataFrame(
            {c: pd.Series(dtype=np.float64 if c in ("mean", "high") else np.int64) for c in USAGE_COLUMNS}
        )
    values = counters.groupby(["rank", "device", "metric"], sort=True, observed=True)["value"]
    return values.agg(samples="size", mean="mean", high="max").reset_index()


def usage_tables(
    rows: pd.DataFrame, place: Mapping[int, tuple[int, int]]
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """A job's device usage per stage and per replica, from `usage_rows` and each rank's (stage, replica): for each
    metric drawn, the mean of the devices' means and the highest sample, and the device least used (the lowest
    mean of the first metric: utilisation)."""
    panels, _ = _panels(rows)
    ranks = rows["rank"].to_numpy(np.int64)
    keyed = rows.assign(
        stage=[place.get(int(r), (-1, -1))[0] for r in ranks], replica=[place.get(int(r), (-1, -1))[1] for r in ranks]
    )
    return _usage_by(keyed, "stage", panels), _usage_by(keyed, "replica", panels)


def _usage_by(rows: pd.DataFrame, key: str, panels: Sequence[tuple[str, str, float]]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for value, group in rows.groupby(key, sort=True):
        row: dict[str, object] = {key: int(value), "ranks": int(group["rank"].nunique())}
        for i, (metric, title, scale) in enumerate(panels):
            part = group[group["metric"].to_numpy() == str(metric)]
            means = part["mean"].to_numpy(np.float64) * scale
            row[f"{title}: mean"] = round(float(means.mean()), 3) if len(part) else None
            row[f"{title}: peak"] = round(float(part["high"].max()) * scale, 3) if len(part) else None
            if i == 0 and len(part):
                low = int(np.argmin(means))
                device = int(part["device"].iloc[low])
                where = f"rank {int(part['rank'].iloc[low])}" + (f" · gpu {device}" if device >= 0 else "")
                row["least used"] = f"{where}: {means[low]:.3g}"
        out.append(row)
    return out


def split_figure(current_ms: Sequence[float], proposed_ms: Sequence[float]) -> go.Figure:
    """Predicted time per micro-batch of each stage under the current and the advised split (ms)."""
    fig = go.Figure()
    for name, values, color in (("current split", current_ms, "#9ECAE1"), ("advised split", proposed_ms, "#3182BD")):
        x = [f"stage {i}" for i in range(len(values))]
        fig.add_trace(
            go.Bar(x=x, y=list(values), name=name, marker={"color": color}, hovertemplate="%{x}: %{y:.3f} ms")
        )
    for values, dash in ((current_ms, "dot"), (proposed_ms, "dash")):
        fig.add_hline(y=max(values), line={"dash": dash, "color": "#555", "width": 1})
    fig.update_layout(
        barmode="group",
        yaxis_title="predicted time per micro-batch (ms)",
        height=340,
        margin={"l": 10, "r": 10, "t": 30, "b": 40},
        legend={"orientation": "h", "y": 1.1},
    )
    return fig


def latency_figure(latency: RequestLatency) -> go.Figure | None:
    """Histograms of time to first token and time per output token (ms); None when neither is known."""
    table = latency.table
    series = [
        ("time to first token (ms)", table["ttft_ns"].to_numpy(np.float64)),
        ("time per output token (ms)", table["tpot_ns"].to_numpy(np.float64)),
    ]
    series = [(title, values[values >= 0] / 1e6) for title, values in series]
    series = [(title, values) for title, values in series if values.shape[0]]
    if not series:
        return None
    fig = make_subplots(rows=1, cols=len(series), subplot_titles=[t for t, _ in series])
    for i, (title, values) in enumerate(series, start=1):
        fig.add_trace(
            go.Histogram(x=values, name=title, showlegend=False, hovertemplate="%{x} ms: %{y} requests<extra></extra>"),
            row=1,
            col=i,
        )
        fig.update_xaxes(title_text="ms", row=1, col=i)
        fig.update_yaxes(title_text="requests", row=1, col=i)
    fig.update_layout(height=340, margin={"l": 10, "r": 10, "t": 40, "b": 40})
    return fig


class Unit(StrEnum):
    """What a compared figure counts, and so how the page writes it (`shown`)."""

    SHARE = "share"  # a fraction: 12.3%, a difference in percentage points
    MS = "ms"
    TOKENS_PER_S = "tokens/s"
    FACTOR = "factor"  # a ratio of two times: ×1.234
    COUNT = "count"


_Row = tuple[str, Unit, float | None, float | None]


def compare_table(a: AnalysisResult, b: AnalysisResult) -> pd.DataFrame:
    """Headline numbers of two analyses side by side with B - A and B / A, and each row's `unit` (numbers as
    they are: `shown` writes them for the page)."""
    rows: list[_Row] = [
        ("bubble ratio", Unit.SHARE, a.bubble_ratio, b.bubble_ratio),
        ("imbalance", Unit.SHARE, a.imbalance, b.imbalance),
        ("balance speedup (max/mean)", Unit.FACTOR, a.balance_speedup, b.balance_speedup),
        ("throughput (tokens/s)", Unit.TOKENS_PER_S, a.throughput_tokens_per_s, b.throughput_tokens_per_s),
        (
            "window (ms)",
            Unit.MS,
            _ms(a.window.length_ns if a.window else None),
            _ms(b.window.length_ns if b.window else None),
        ),
        ("slowest stage time per micro-batch (ms)", Unit.MS, _slowest_ms(a), _slowest_ms(b)),
        ("TTFT p50 (ms)", Unit.MS, _ttft(a), _ttft(b)),
    ]
    return _deltas(rows)


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def _slowest_ms(r: AnalysisResult) -> float | None:
    times = [s.time_per_mb_ns for s in r.stages if s.time_per_mb_ns is not None]
    return max(times) / 1e6 if times else None


def _ttft(r: AnalysisResult) -> float | None:
    return r.latency.ttft.p50_ms if r.latency is not None and r.latency.ttft is not None else None


def compare_figure(a: AnalysisResult, b: AnalysisResult, *, names: tuple[str, str] = ("A", "B")) -> go.Figure:
    """Per stage: busy share of the window and time per micro-batch, A beside B."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["busy share of the window", "time per micro-batch (ms)"])
    for result, name, color in ((a, names[0], "#9ECAE1"), (b, names[1], "#3182BD")):
        x = [f"stage {s.stage}" for s in result.stages]
        fig.add_trace(
            go.Bar(x=x, y=[1 - s.bubble_ratio for s in result.stages], name=name, marker={"color": color}),
            row=1,
            col=1,
        )
        per_mb = [None if s.time_per_mb_ns is None else s.time_per_mb_ns / 1e6 for s in result.stages]
        fig.add_trace(go.Bar(x=x, y=per_mb, name=name, marker={"color": color}, showlegend=False), row=1, col=2)
    fig.update_yaxes(tickformat=".0%", range=[0, 1], row=1, col=1)
    fig.update_layout(barmode="group", height=360, margin={"l": 10, "r": 10, "t": 40, "b": 40})
    return fig


BASIS_NAMES = {"time_per_mb": "time per micro-batch", "busy": "busy time"}
"""What each basis of a job's t (`ReplicaAnalysis.basis`) is called on the page."""


@dataclass(frozen=True)
class _Job:
    """A run's figures over all its pipelines; a run of one pipeline is a job of one."""

    pipelines: int
    bubble_ratio: float | None
    bubble_worst: float | None
    basis: str
    slowest_ns: float | None
    slowdown: float | None
    tokens_per_s: float | None


def _job(x: ReplicaAnalysis | AnalysisResult) -> _Job:
    from ppscope.analysis.replicas import ReplicaAnalysis

    if isinstance(x, ReplicaAnalysis):
        rates = [r.throughput_tokens_per_s for r in x.results.values() if r.throughput_tokens_per_s is not None]
        return _Job(
            len(x.replicas),
            x.bubble_ratio,
            x.bubble_worst,
            x.basis,
            x.bottleneck_ns,
            x.bottleneck_slowdown,
            sum(rates) if rates else None,
        )
    basis = "time_per_mb" if x.stages and all(s.time_per_mb_ns is not None for s in x.stages) else "busy"
    times = [float(s.busy_ns if s.time_per_mb_ns is None or basis == "busy" else s.time_per_mb_ns) for s in x.stages]
    slowest = max(times) if times else None
    return _Job(1, x.bubble_ratio, x.bubble_ratio, basis, slowest, 1.0 if slowest else None, x.throughput_tokens_per_s)


def job_compare_table(a: ReplicaAnalysis | AnalysisResult, b: ReplicaAnalysis | AnalysisResult) -> pd.DataFrame:
    """Two jobs' own figures, over all their data-parallel pipelines, side by side with B - A and B / A (a run of
    one pipeline, an AnalysisResult, counts as a job of one). The slowest (stage, pipeline) is given by its time
    per micro-batch, or its busy time for a job whose figures are on that basis (`ReplicaAnalysis.basis`): a row
    per basis, empty for the side on the other one."""
    ja, jb = _job(a), _job(b)
    rows: list[_Row] = [
        ("data-parallel pipelines", Unit.COUNT, ja.pipelines, jb.pipelines),
        ("bubble ratio, all pipelines", Unit.SHARE, ja.bubble_ratio, jb.bubble_ratio),
        ("bubble ratio, worst pipeline", Unit.SHARE, ja.bubble_worst, jb.bubble_worst),
    ]
    for basis in sorted({ja.basis, jb.basis}, reverse=True):
        rows.append(
            (
                f"slowest stage of any pipeline: {BASIS_NAMES.get(basis, basis)} (ms)",
                Unit.MS,
                _ms(ja.slowest_ns) if ja.basis == basis else None,
                _ms(jb.slowest_ns) if jb.basis == basis else None,
            )
        )
    rows += [
        ("slowest stage vs its median over the pipelines", Unit.FACTOR, ja.slowdown, jb.slowdown),
        ("throughput, all pipelines (tokens/s)", Unit.TOKENS_PER_S, ja.tokens_per_s, jb.tokens_per_s),
    ]
    return _deltas(rows)


def spread_compare_table(a: ReplicaAnalysis, b: ReplicaAnalysis) -> pd.DataFrame:
    """Per stage, two jobs' spread across their pipelines side by side: the median and slowest t (ms) with
    B - A, and each job's straggler. A stage only one job has leaves the other's cells empty; when the two are
    on different bases (`ReplicaAnalysis.basis`), B - A is left empty."""
    same = a.basis == b.basis
    sa, sb = {s.stage: s for s in a.stages}, {s.stage: s for s in b.stages}
    rows = []
    for stage in sorted(sa.keys() | sb.keys()):
        x, y = sa.get(stage), sb.get(stage)
        row: dict[str, object] = {"stage": stage}
        for what in ("median", "slowest"):
            va = None if x is None else getattr(x, f"{what}_ns") / 1e6
            vb = None if y is None else getattr(y, f"{what}_ns") / 1e6
            row[f"A {what}"], row[f"B {what}"] = va, vb
            row[f"{what} B - A"] = vb - va if same and va is not None and vb is not None else None
        row["A straggler"], row["B straggler"] = _straggler(x), _straggler(y)
        rows.append(row)
    return pd.DataFrame(rows)


def _straggler(s: StageSpread | None) -> str:
    if s is None:
        return "—"
    if s.slowdown is None or s.slowdown <= 1.0:  # as the report: equal pipelines have no straggler
        return "none"
    return f"rank {s.straggler_rank}, replica {s.straggler_replica}, +{100 * (s.slowdown - 1):.1f}%"


def _deltas(rows: list[_Row]) -> pd.DataFrame:
    out = pd.DataFrame(rows, columns=["measure", "unit", "A", "B"])
    av, bv = out["A"].astype("float64"), out["B"].astype("float64")
    out["B - A"] = bv - av
    out["B / A"] = (bv / av).where(av.abs() > 0)
    return out[["measure", "A", "B", "B - A", "B / A", "unit"]]


_NONE = "—"


def fmt(value: float | None, unit: Unit, *, signed: bool = False) -> str:
    """One figure as the page writes it: its unit, digits that mean something, `—` when not known (None or
    NaN). `signed`: a difference (a share's in percentage points)."""
    if value is None or pd.isna(value):
        return _NONE
    x = float(value)
    sign = "+" if signed else ""
    if unit == Unit.SHARE:
        return f"{100 * x:{sign},.1f} pp" if signed else f"{100 * x:,.1f}%"
    if unit == Unit.MS:
        return f"{x:{sign},.3f} ms"
    if unit == Unit.TOKENS_PER_S:
        return f"{x:{sign},.1f} tokens/s" if abs(x) < 100 else f"{x:{sign},.0f} tokens/s"
    if unit == Unit.FACTOR:
        return f"{x:{sign}.3f}" if signed else f"×{x:.3f}"
    return f"{x:{sign},.0f}"


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """A table of `compare_table` or `job_compare_table` as the page shows it: every number written with its
    unit (`fmt`); B / A as a factor."""
    units = [Unit(u) for u in table["unit"]]
    out = pd.DataFrame({"measure": table["measure"]})
    for column in ("A", "B", "B - A"):
        out[column] = [fmt(v, u, signed=column == "B - A") for v, u in zip(table[column], units, strict=True)]
    out["B / A"] = [fmt(v, Unit.FACTOR) for v in table["B / A"]]
    return out


def shown_spread(table: pd.DataFrame) -> pd.DataFrame:
    """A table of `spread_compare_table` as the page shows it: times in ms with their unit."""
    out = table.copy()
    for column in table.columns:
        if column.endswith(("median", "slowest")) or column.endswith("B - A"):
            out[column] = [fmt(v, Unit.MS, signed=column.endswith("B - A")) for v in table[column]]
    return out


def what_if_rows(w: WhatIf) -> pd.DataFrame:
    """One row per what-if of a training job: its replayed step, its speedup over the replay of the measured
    costs, and what it changes (or why it is not there)."""
    rows: list[dict[str, object]] = [
        {"what-if": "measured costs", "step (ms)": _ms(w.replay_step_ns), "speedup": 1.0, "changes": "nothing"}
    ]
    if w.balanced is not None:
        change = "each replica's forward and backward work spread evenly over its stages"
        rows.append({"what-if": "balanced", **_case(w.balanced.step_ns, w.balanced.speedup), "changes": change})
    if w.no_straggler is not None and w.straggler is not None:
        st = w.straggler
        ranks = ", ".join(map(str, st.ranks))
        change = f"stage {st.stage}, replica {st.replica} (rank(s) {ranks}) at its stage's median"
        rows.append(
            {"what-if": "no straggler", **_case(w.no_straggler.step_ns, w.no_straggler.speedup), "changes": change}
        )
    for case, why in w.reasons.items():
        rows.append({"what-if": case.replace("_", " "), "step (ms)": None, "speedup": None, "changes": str(why)})
    return pd.DataFrame(rows)


def _case(step_ns: float, speedup: float) -> dict[str, float | None]:
    return {"step (ms)": _ms(step_ns), "speedup": round(speedup, 4)}
