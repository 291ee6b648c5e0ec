"""Presenting an AnalysisResult: rich text tables for the terminal and a self-contained HTML report.

The HTML file needs no server or network to open: it holds plotly's JavaScript once, gzipped (`_PLOTLY_LOADER`
says how), and each figure as JSON. This module computes nothing: numbers come from `ppscope.analysis`, figures
from `ppscope.analysis.figures`.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
import io
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from ppscope.analysis.result import CAUSES, AnalysisResult
from ppscope.trace.model import Trace
from ppscope.trace.notices import NoticeCode
from ppscope.trace.outputs import atomic_file

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "DENOMINATOR",
    "fit_table",
    "html_report",
    "print_report",
    "render_text",
    "stdout_console",
    "what_if_lines",
    "write_html",
]

DENOMINATOR = "Σ bubble / (P × window): the share of the P stages' wall time spent idle"
NOT_MEASURED = "–"
"""What a figure that was not measured reads (never 0); the table's caption says why."""
_WITHHELD = "the bubble ratio, imbalance, bottleneck, balance speedup and gap to theory need every stage"
"""What an incomplete trace withholds (`AnalysisResult.missing`)."""


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _used_causes(res: AnalysisResult) -> list[str]:
    return [c for c in CAUSES if any(s.causes[c] for s in res.stages)]


def fit_table(table: Table, width: int, drop_order: Sequence[str]) -> Table:
    """Drop the columns named in `drop_order`, in that order, until `table` fits `width` characters, and say
    in its caption which were left out: a number is never broken across lines to make a table fit."""
    measure = Console(width=width, file=io.StringIO())
    dropped: list[str] = []
    for name in drop_order:
        if measure.measure(table, options=measure.options.update_width(1 << 16)).maximum <= width:
            break
        index = next((i for i, c in enumerate(table.columns) if c.header == name), None)
        if index is not None:
            table.columns.pop(index)
            dropped.append(name)
    if dropped:
        table.caption = f"left out to fit {width} columns: {', '.join(dropped)} (see --json or a wider terminal)"
        table.caption_justify = "left"
    return table


# each table's title says which statistic its figures are (docs/GLOSSARY.md)
_STAGE_TITLE = "Stages × causes of idle time (ms, sums over the window; time/mb: busy ÷ passes, a mean per micro-batch)"
_HOP_TITLE = "Per-hop communication (MB and ms: sums over the window; latency µs: the median over messages)"


def stage_table(res: AnalysisResult, width: int | None = None) -> Table:
    causes = _used_causes(res)
    t = Table(title=_STAGE_TITLE, title_justify="left")
    for col in ["stage", "ranks", "busy", "bubble", "bubble %", "time/mb", *causes]:
        t.add_column(col, justify="left" if col == "ranks" else "right", no_wrap=True)
    rows = {
        s.stage: [
            f"{s.stage}{' ◀' if s.stage == res.bottleneck_stage else ''}",
            ",".join(map(str, s.ranks)),
            _ms(s.busy_ns),
            _ms(s.bubble_ns),
            _pct(s.bubble_ratio),
            _ms(s.time_per_mb_ns),
            *(_ms(s.causes[c]) for c in causes),
        ]
        for s in res.stages
    }
    rows.update({stage: [str(stage), *[NOT_MEASURED] * (5 + len(causes))] for stage in res.unknown_stages})
    for stage in sorted(rows):
        t.add_row(*rows[stage])
    if width is not None:
        smallest_first = sorted(causes, key=lambda c: sum(s.causes[c] for s in res.stages))
        t = fit_table(t, width, [*smallest_first, "ranks", "time/mb", "bubble"])
    if res.unknown_stages:
        why = f"{NOT_MEASURED} stage {', '.join(map(str, res.unknown_stages))}: not measured, {res.missing}"
        t.caption = "\n".join(filter(None, [why, str(t.caption or "")]))
        t.caption_justify = "left"
    return t


def incomplete_line(res: AnalysisResult) -> str:
    """What the trace lacks (`AnalysisResult.missing`, in its one sentence) and what that withholds."""
    return f"incomplete: {res.missing}; {_WITHHELD}" if res.missing else ""


def summary_lines(res: AnalysisResult) -> list[str]:
    """The headline facts, one per line (shared by the text and HTML reports)."""
    w = res.window
    lines = [incomplete_line(res)] if res.missing else []
    if res.emulated:
        lines.append(f"engine: {res.emulated}: every time below is a wait the cost model set, not compute")
    engine = f"   engine: {res.engine}" if res.engine else ""
    lines.append(f"source: {res.source}{engine}   schedule: {res.schedule or 'unknown'}   stages (P): {res.pp_size}")
    if w is not None:
        lines.append(f"window: {_ms(w.length_ns)} ms — {w.how}")
    lines.append(f"bubble ratio: {_pct(res.bubble_ratio)}   ({DENOMINATOR})")
    th = res.theory
    params = ", ".join(f"{k}={v}" for k, v in th.params.items())
    lines.append(f"theory: {_pct(th.bubble_ratio)}   formula {th.formula}" + (f" with {params}" if params else ""))
    if th.note:
        lines.append(f"        {th.note}")
    if res.replay is not None:
        lines.append(replay_line(res))
        if res.replay.note:
            lines.append(f"        {res.replay.note}")
    lines += what_if_lines(res)
    if res.bubble_ratio is not None and res.window is not None and res.stages:
        total = res.pp_size * res.window.length_ns
        shares = [f"{c} {_pct(sum(s.causes[c] for s in res.stages) / total)}" for c in _used_causes(res)]
        lines.append("measured bubble by cause (share of P × window): " + (", ".join(shares) or "none"))
        unloaded = sum(s.causes["no_requests"] for s in res.stages)
        if unloaded:
            busy = sum(s.busy_ns for s in res.stages)
            lines.append(
                f"no requests in the system for {_pct(unloaded / total)} of it (arrivals too sparse to keep the "
                f"pipeline busy): while requests were in, the bubble ratio was {_pct(1 - busy / (total - unloaded))}"
            )
        if res.theory_gap is not None:
            lines.append(gap_sentence(res))
    if res.bottleneck_stage is not None:
        basis = "busy time per micro-batch" if res.imbalance_basis == "time_per_mb" else "busy time"
        lines.append(
            f"bottleneck: stage {res.bottleneck_stage}   imbalance: {_pct(res.imbalance)} (1 - mean/max of {basis})"
            f"   perfect balance would speed throughput up ×{res.balance_speedup:.3f}"
        )
    if res.throughput_tokens_per_s is not None:
        lines.append(f"throughput: {res.throughput_tokens_per_s:,.1f} tokens/s ({res.throughput_basis})")
    if res.inflight is not None:
        lines.append(f"micro-batches in flight during decode: {res.inflight}")
    return lines


def replay_line(res: AnalysisResult) -> str:
    """The replay of a training run's own action order, beside the measured ratio of the same steps."""
    rp = res.replay
    assert rp is not None
    if rp.bubble_ratio is None:
        return "replay: -   (the run's own action order replayed with its measured per-action costs: not possible)"
    hop = f"hop latency {rp.hop_ns / 1e3:,.1f} µs" + ("" if rp.hop_measured else " (not measured)")
    if rp.link_ns:
        each = [f"{a}→{b} {ns / 1e3:,.1f} µs" for (a, b), ns in sorted(rp.link_ns.items())]
        hop = f"each link's median hop latency ({', '.join(each[:4])}{', …' if len(each) > 4 else ''})"
    steps = ", ".join(map(str, rp.steps)) if len(rp.steps) < 6 else f"{rp.steps[0]}-{rp.steps[-1]}"
    return (
        f"replay: {_pct(rp.bubble_ratio)}   measured {_pct(rp.measured_step_ratio)} over the same steps ({steps}), "
        f"each from its first compute to its last — the run's own action order replayed with its measured "
        f"per-action costs (median F/B/I/W per stage), host time before them (CPU ranks) and {hop}"
    )


def what_if_lines(res: AnalysisResult) -> list[str]:
    """The job's step replayed with changed costs: what an ideal split and replacing the straggler would buy;
    nothing for a trace that is not a training one."""
    w = res.what_if
    if w is None:
        why = res.what_if_reason
        return [] if why is None or why.code == NoticeCode.NO_TRAINING_STEP else [f"what-if: -   ({why})"]
    steps = ", ".join(map(str, w.steps)) if len(w.steps) < 6 else f"{w.steps[0]}-{w.steps[-1]}"
    step = "the step" if w.replicas == 1 else f"the job's step ({w.replicas} replicas, the slowest sets it)"
    lines = [
        f"what-if: {step} replayed in its own order: {_ms(w.replay_step_ns)} ms with the measured costs "
        f"(measured {_ms(w.measured_step_ns)} ms, steps {steps})"
        + (f"; replica(s) {', '.join(map(str, w.left_out))} left out: no complete step" if w.left_out else "")
    ]
    cases = []
    if w.balanced is not None:
        cases.append(f"balanced stages {_ms(w.balanced.step_ns)} ms ×{w.balanced.speedup:.3f}")
    if w.no_straggler is not None and w.straggler is not None:
        st = w.straggler
        vs = "" if st.vs_median is None else f", ×{st.vs_median:.2f} its stage's median"
        who = f"stage {st.stage}, replica {st.replica}, rank(s) {', '.join(map(str, st.ranks))}{vs}"
        cases.append(f"without the straggler ({who}) {_ms(w.no_straggler.step_ns)} ms ×{w.no_straggler.speedup:.3f}")
    cases += [f"{case.replace('_', ' ')}: - ({why})" for case, why in w.reasons.items()]
    lines.append("         " + ";   ".join(cases))
    return lines


def gap_sentence(res: AnalysisResult) -> str:
    """The gap to theory in signed parts that add up to it, as printed (each rounded so that they do)."""
    gap, th = res.theory_gap, res.theory
    assert gap is not None and th.bubble_ratio is not None
    names = list(gap.parts)
    tenths = _tenths_summing([gap.parts[n] for n in names], gap.ratio)
    total = sum(tenths)
    own, measured = names[0], gap.parts[names[0]] + th.bubble_ratio
    terms = [
        f"{own.replace('+', '/')} {tenths[0] / 10:+.1f} (measured {100 * measured:.1f} against the formula's "
        f"{100 * th.bubble_ratio:.1f})"
    ]
    terms += [f"{n} {t / 10:+.1f}" for n, t in zip(names[1:], tenths[1:], strict=True)]
    return f"gap to theory: {total / 10:+.1f} points = " + " + ".join(terms)


def _tenths_summing(values: list[float], total: float) -> list[int]:
    """`values` (shares) in tenths of a point, rounded so that they add up to `total` rounded the same way: the
    parts that rounding moved furthest from their value take the difference."""
    raw = [1000 * v for v in values]
    out = [round(x) for x in raw]
    diff = round(1000 * total) - sum(out)
    step = 1 if diff > 0 else -1
    for i in sorted(range(len(raw)), key=lambda i: step * (raw[i] - out[i]), reverse=True)[: abs(diff)]:
        out[i] += step
    return out


_HOP_COLUMNS = {"nbytes": "MB", "recv_ns": "transfer ms", "bandwidth_gb_per_s": "GB/s", "latency_ns": "latency µs"}


def hop_table(res: AnalysisResult, width: int | None = None) -> Table:
    t = Table(title=_HOP_TITLE, title_justify="left")
    for col in ["hop", "messages", "MB", "send ms", "transfer ms", "wait ms", "GB/s", "latency µs"]:
        t.add_column(col, justify="right", no_wrap=True)
    for h in res.hops:
        t.add_row(
            f"{h.src_rank}→{h.dst_rank}",
            str(h.messages),
            NOT_MEASURED if h.nbytes is None else f"{h.nbytes / 1e6:,.3f}",
            _ms(h.send_ns),
            NOT_MEASURED if h.recv_ns is None else _ms(h.recv_ns),
            _ms(h.wait_ns),
            NOT_MEASURED if h.bandwidth_gb_per_s is None else f"{h.bandwidth_gb_per_s:.2f}",
            NOT_MEASURED if h.latency_ns is None else f"{h.latency_ns / 1e3:,.0f}",
        )
    why = _unmeasured_caption(res)
    fitted = t if width is None else fit_table(t, width, ["send ms", "MB", "messages", "transfer ms"])
    if why:
        fitted.caption = "\n".join(filter(None, [why, str(fitted.caption or "")]))
        fitted.caption_justify = "left"
    return fitted


def _unmeasured_caption(res: AnalysisResult) -> str:
    """One line per reason the analysis gave for unmeasured cells: which columns, on which hops."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for field, column in _HOP_COLUMNS.items():
        by_reason: dict[str, list[str]] = {}
        for h in res.hops:
            if field in h.unmeasured:
                by_reason.setdefault(h.unmeasured[field], []).append(f"{h.src_rank}→{h.dst_rank}")
        for reason, hops in by_reason.items():
            groups.setdefault((reason, tuple(hops)), []).append(column)
    return "\n".join(
        f"{NOT_MEASURED} {', '.join(cols)} on {', '.join(hops)}: not measured, {reason}"
        for (reason, hops), cols in groups.items()
    )


def latency_table(res: AnalysisResult, width: int | None = None) -> Table | None:
    lat = res.latency
    if lat is None:
        return None
    t = Table(
        title=f"Requests: {lat.finished}/{lat.requests} finished, {lat.output_tokens} output tokens",
        title_justify="left",
    )
    for col in ["measure", "n", "mean ms", "p50 ms", "p90 ms", "p99 ms", "max ms"]:
        t.add_column(col, justify="right", no_wrap=True)
    for name, st in (("TTFT", lat.ttft), ("TPOT", lat.tpot), ("end to end", lat.e2e)):
        if st is not None:
            t.add_row(name, str(st.n), *(f"{v:,.3f}" for v in (st.mean_ms, st.p50_ms, st.p90_ms, st.p99_ms, st.max_ms)))
    return t if width is None else fit_table(t, width, ["n", "p90 ms", "mean ms"])


def print_report(res: AnalysisResult, console: Console) -> None:
    """Sentences wrap at words on a terminal and not at all when piped; tables fit the console's width."""
    wrap = console.is_terminal
    for line in summary_lines(res):
        console.print(line, highlight=False, markup=False, soft_wrap=not wrap)
    width = console.width
    if res.stages:
        console.print(stage_table(res, width))
    if res.hops:
        console.print(hop_table(res, width))
    lat = latency_table(res, width)
    if lat is not None:
        console.print(lat)
    for w in res.warnings:
        console.print(f"warning: {w}", style="yellow", highlight=False, markup=False, soft_wrap=not wrap)


def stdout_console() -> Console:
    """The console reports print to: the terminal's own width, or $COLUMNS (else unbounded) when piped."""
    if sys.stdout.isatty():
        return Console()
    columns = os.environ.get("COLUMNS", "")
    return Console(width=int(columns) if columns.isdigit() and int(columns) > 0 else 1 << 12)


def render_text(res: AnalysisResult, *, width: int = 120) -> str:
    """The terminal report as plain text."""
    buf = io.StringIO()
    print_report(res, Console(file=buf, width=width, no_color=True, color_system=None))
    return buf.getvalue()


def _table_html(t: Table) -> str:
    heads = "".join(f"<th>{html.escape(str(c.header))}</th>" for c in t.columns)
    cells = [list(c.cells) for c in t.columns]
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(col[i]))}</td>" for col in cells) + "</tr>" for i in range(t.row_count)
    )
    caption = "".join(f"<p class='note'>{html.escape(line)}</p>" for line in str(t.caption or "").splitlines())
    return f"<h3>{html.escape(str(t.title or ''))}</h3><table><tr>{heads}</tr>{rows}</table>{caption}"


_GANTT = "Pipeline timeline: compute, receive and send per rank; idle time hatched by cause"
_CSS = (
    "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0}"
    "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#f3f3f3}"
    ".warn{color:#a15c00}.note{color:#555;margin:.2em 0}pre{white-space:pre-wrap}"
)


_PLOTLY_LOADER = """
const ppscopePlotly = (async () => {
  const packed = Uint8Array.from(atob(document.getElementById('plotly-js-gz').textContent), c => c.charCodeAt(0));
  const unpacked = new Blob([packed]).stream().pipeThrough(new DecompressionStream('gzip'));
  const code = document.createElement('script');
  code.text = await new Response(unpacked).text();
  document.head.appendChild(code);  // runs now: window.Plotly
  for (const div of document.querySelectorAll('div.ppscope-figure')) {
    const spec = JSON.parse(document.getElementById(div.id + '-spec').textContent);
    await Plotly.newPlot(div, spec.data, spec.layout, {responsive: true, displaylogo: false});
  }
})().catch(err => {
  document.getElementById('no-charts').hidden = false;
  document.getElementById('no-charts').textContent += ' (' + err + ')';
});
"""
"""Unpacks plotly.js with the browser's own gzip (DecompressionStream: every current browser) and draws each
figure from its JSON. plotly.min.js is 4.8 MB, 99% of a small run's report; gzipped and in base64 it is 2.0 MB.
A browser without DecompressionStream says so instead of drawing."""


@functools.cache
def _plotly_js_gz_b64() -> str:
    """plotly.js, as the installed plotly ships it, gzipped (no time stamp: the same report twice is the same
    bytes) and in base64."""
    import plotly.offline

    packed = gzip.compress(plotly.offline.get_plotlyjs().encode("utf-8"), compresslevel=9, mtime=0)
    return base64.b64encode(packed).decode("ascii")


def _figure_html(fig: go.Figure, n: int) -> str:
    """A figure's place and its JSON, drawn by `_PLOTLY_LOADER` (`</` written `<\\/` so that no text in it can
    end the script element)."""
    spec = fig.to_json().replace("</", "<\\/")
    return (
        f"<div id='figure-{n}' class='ppscope-figure'></div>"
        f"<script type='application/json' id='figure-{n}-spec'>{spec}</script>"
    )


def html_report(res: AnalysisResult, trace: Trace | None = None, *, max_bars: int = 20_000) -> str:
    """A self-contained HTML page: summary, tables, Gantt chart, cause breakdown, theory vs measured."""
    from ppscope.analysis import figures
    from ppscope.analysis.gantt import gantt_figure

    figs = []
    if trace is not None and len(trace.spans):
        stage_ranks = {s.stage: s.ranks for s in res.stages}
        view = gantt_figure(trace.spans, gaps=res.gaps, stage_ranks=stage_ranks, max_bars=max_bars, title=_GANTT)
        figs.append(view.figure)
    if res.stages:
        figs += [figures.stage_breakdown(res), figures.theory_vs_measured(res)]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>ppscope analysis</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>ppscope analysis</h1>",
        "<pre>" + html.escape("\n".join(summary_lines(res))) + "</pre>",
    ]
    parts += [f"<p class='warn'>warning: {html.escape(str(w))}</p>" for w in res.warnings]
    tables = [stage_table(res)] if res.stages else []
    tables += [hop_table(res)] if res.hops else []
    lat = latency_table(res)
    tables += [lat] if lat is not None else []
    parts += [_table_html(t) for t in tables]
    if figs:
        parts.append(
            "<p class='warn' id='no-charts' hidden>This browser cannot unpack the charts (it lacks "
            "DecompressionStream): open the report in a current Chrome, Edge, Firefox or Safari.</p>"
        )
        parts += [_figure_html(f, n) for n, f in enumerate(figs)]
        parts.append(f"<script type='application/octet-stream' id='plotly-js-gz'>{_plotly_js_gz_b64()}</script>")
        parts.append(f"<script>{_PLOTLY_LOADER}</script>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(
    res: AnalysisResult,
    path: str | os.PathLike[str],
    trace: Trace | None = None,
    *,
    max_bars: int = 20_000,
    force: bool = False,
) -> Path:
    """Write `html_report` to `path`, a new file (replaced only with `force`) outside any run, in one rename
    (`ppscope.trace.outputs.atomic_file`: a failed write leaves nothing)."""
    page = html_report(res, trace, max_bars=max_bars)
    with atomic_file(path, option="--html", force=force) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return Path(path)
