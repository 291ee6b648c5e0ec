"""`ppscope dashboard` in a real browser: start the server on a recorded run, open it in Chromium, count bars.

Skipped only when no Chromium can be found (CI installs Debian's `chromium`); the reason is printed.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_dashboard_runs import record_gpipe_run, span_count

from ppscope.cli.commands.dashboard import start_dashboard

pytest.importorskip("streamlit")

_CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Bar traces of the Gantt, as plotly holds them on the chart's div: per trace its role and number of bars.
_BAR_TRACES_JS = """() => {
  const gd = document.querySelector('.js-plotly-plot');
  if (!gd || !gd.data) return null;
  return gd.data.filter(t => t.type === 'bar')
    .map(t => ({role: (t.meta || {}).role || '', n: (t.base || []).length}));
}"""

# True once every bar of the figure is drawn as an SVG path.
_ALL_BARS_DRAWN = """() => {
  const gd = document.querySelector('.js-plotly-plot');
  if (!gd || !gd.data) return false;
  const n = gd.data.filter(t => t.type === 'bar').reduce((acc, t) => acc + (t.base || []).length, 0);
  return n > 0 && gd.querySelectorAll('g.barlayer g.point path').length === n;
}"""

# True once the Gantt on the page holds exactly n span bars (gap shading excluded).
_SPAN_BARS_ARE = """() => {{
  const gd = document.querySelector('.js-plotly-plot');
  if (!gd || !gd.data) return false;
  const n = gd.data.filter(t => t.type === 'bar' && (t.meta || {{}}).role === 'spans')
    .reduce((acc, t) => acc + (t.base || []).length, 0);
  return n === {n};
}}"""


# The Gantt's legend and plot area as (left, top, right, bottom).
_LEGEND_AND_PLOT_JS = """() => ['g.legend', '.nsewdrag'].map(sel => {
  const r = document.querySelector('.js-plotly-plot ' + sel).getBoundingClientRect();
  return [r.left, r.top, r.right, r.bottom];
})"""


def _chromium() -> str | None:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def _browser_or_skip() -> tuple[Any, str]:
    """Playwright's sync API and the Chromium to drive, or a skip that says what is missing."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    executable = _chromium()
    if executable is None:
        reason = "no Chromium found (/usr/bin/chromium, chromium, chromium-browser): apt-get install chromium"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return sync_api, executable


_BARS = ".js-plotly-plot g.barlayer g.point path"


@contextlib.contextmanager
def dashboard_page(run: Path, height: int = 1000, ranks_in_memory: int | None = None) -> Iterator[Any]:
    """A Chromium page on a dashboard of `run`, once its Gantt chart has begun to draw (skips without
    Chromium or playwright); the browser and the dashboard stop on the way out."""
    sync_api, executable = _browser_or_skip()
    board = start_dashboard([run], port=0, quiet=True, ranks_in_memory=ranks_in_memory)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, args=_CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": height})
                page.goto(board.url, wait_until="domcontentloaded", timeout=60_000)
                page.wait_for_selector(_BARS, timeout=60_000)
                yield page
            finally:
                browser.close()
    finally:
        board.stop()


@pytest.mark.browser
@pytest.mark.slow
def test_dashboard_draws_the_gantt_in_chromium(tmp_path: Path) -> None:
    run = record_gpipe_run(tmp_path / "run", p=3, m=4)
    with dashboard_page(run) as page:
        # plotly draws trace by trace: wait until every bar of the figure has its SVG path
        page.wait_for_function(_ALL_BARS_DRAWN, timeout=60_000)
        traces = page.evaluate(_BAR_TRACES_JS)
        drawn = page.locator(_BARS).count()
        legend, plot = page.evaluate(_LEGEND_AND_PLOT_JS)
        page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        text = page.inner_text("body")
    assert traces, "the Gantt chart holds no bar traces"
    assert legend[0] >= plot[2], "the legend stands beside the plot, never over the bars"
    assert sum(t["n"] for t in traces if t["role"] == "spans") == span_count(3, 4)
    assert drawn == sum(t["n"] for t in traces), "every bar in the figure is drawn as an SVG path"
    assert "Pipeline timeline" in text and "one bar each" in text
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000


@pytest.mark.browser
@pytest.mark.slow
def test_live_run_refreshes_until_it_finishes(tmp_path: Path) -> None:
    from test_dashboard_runs import gpipe_spans

    from ppscope.trace.model import RunMeta
    from ppscope.trace.store import RankWriter, create_run, read_meta, write_meta

    run = tmp_path / "live"
    create_run(run, RunMeta(world_size=1, pp_size=1, status="running", schedule="gpipe", microbatches=4))
    writer = RankWriter(run, 0)
    writer.write(gpipe_spans(0, 1, 4))
    with dashboard_page(run, height=900) as page:
        page.wait_for_function(_SPAN_BARS_ARE.format(n=4), timeout=30_000)
        assert "Live: refreshing" in page.inner_text("body")
        writer.write(gpipe_spans(0, 1, 3, step=1, t0=10_000_000))  # the run goes on: no reload
        page.wait_for_function(_SPAN_BARS_ARE.format(n=7), timeout=30_000)
        writer.close()
        write_meta(run, RunMeta(**{**vars(read_meta(run)), "status": "finished"}))
        page.wait_for_function(
            "!document.body.innerText.includes('Live: refreshing')", timeout=30_000
        )  # finished: the timer stops
        assert "status finished" in page.inner_text("body")
        page.screenshot(path=str(tmp_path / "live.png"), full_page=True)


# Per plot on the page: whether it holds a heatmap, and its span bars in the figure and drawn as SVG paths.
_PLOTS_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
  heatmap: (gd.data || []).some(t => t.type === 'heatmap'),
  spans: (gd.data || []).filter(t => t.type === 'bar' && (t.meta || {}).role === 'spans')
    .reduce((acc, t) => acc + (t.base || []).length, 0),
  drawn: gd.querySelectorAll('g.barlayer g.point path').length,
}))"""


@contextlib.contextmanager
def _demo_run_page(tmp_path: Path) -> Iterator[Any]:
    """A page on a run of 12 steps, as a demo's, once its Timeline shows the overview strip and the Gantt."""
    run = record_gpipe_run(tmp_path / "demo-1" / "1-before", p=2, m=2, steps=12)
    with dashboard_page(run) as page:
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 2", timeout=60_000)
        yield page


@pytest.mark.browser
@pytest.mark.slow
def test_the_timeline_s_first_view_of_a_demo_run_draws_each_span(tmp_path: Path) -> None:
    # a demo's run holds many steps: the first view is its newest few, each span a bar, under the whole run's
    # heatmap strip, not the heatmap alone
    with _demo_run_page(tmp_path) as page:
        page.wait_for_function(
            _ALL_BARS_DRAWN.replace("querySelector('.js-plotly-plot')", "querySelectorAll('.js-plotly-plot')[1]"),
            timeout=60_000,
        )
        overview, window = page.evaluate(_PLOTS_JS)[:2]
        text = page.inner_text("body")
    assert overview["heatmap"] and not window["heatmap"]
    assert 0 < window["spans"] < span_count(2, 2) * 12 and window["drawn"] >= window["spans"]
    assert "one bar each" in text and "the newest few steps" in text


# The x range of each plot on the page, in ms.
_X_RANGES_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot'))
  .map(gd => gd._fullLayout ? gd._fullLayout.xaxis.range.slice() : null)"""


@pytest.mark.browser
@pytest.mark.slow
def test_a_drag_across_the_overview_strip_picks_the_gantts_window(tmp_path: Path) -> None:
    with _demo_run_page(tmp_path) as page:
        (lo_all, hi_all), (lo_few, _) = page.evaluate(_X_RANGES_JS)[:2]
        assert lo_few > lo_all + 0.5 * (hi_all - lo_all)  # the newest few steps, at the run's end
        box = page.locator(".js-plotly-plot").first.locator(".nsewdrag").first.bounding_box()
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + 0.1 * box["width"], y)
        page.mouse.down()
        page.mouse.move(box["x"] + 0.2 * box["width"], y, steps=5)
        page.mouse.move(box["x"] + 0.3 * box["width"], y, steps=5)
        page.mouse.up()
        picked = "() => document.body.innerText.includes('the window picked on the strip')"
        page.wait_for_function(picked, timeout=30_000)
        page.wait_for_function(
            f"() => {{ const r = ({_X_RANGES_JS})()[1]; return r && r[0] < {lo_few}; }}", timeout=30_000
        )
        lo, hi = page.evaluate(_X_RANGES_JS)[1]
        text = page.inner_text("body")
        page.screenshot(path=str(tmp_path / "picked.png"), full_page=True)
    span = hi_all - lo_all
    # the strip's axis runs from the run's first to its last span: the picked window is about its 10 to 30%
    assert lo == pytest.approx(lo_all + 0.1 * span, abs=0.03 * span)
    assert hi == pytest.approx(lo_all + 0.3 * span, abs=0.03 * span)
    assert "the window picked on the strip" in text
