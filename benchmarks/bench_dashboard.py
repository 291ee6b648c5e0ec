"""Dashboard speed on a 100k-span run: the Gantt figure (built and serialised as Streamlit sends it), a live
refresh that reads only new rows, and the whole timeline page, each next to a reference measured here.

References: the same Gantt for 1k spans, and `load_run` of the whole run (what a page that re-read the run
on every refresh would pay). Times are best of a few rounds; the figures that matter are the ratios.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.record import Figure

P = 4
_DRAWN = ".js-plotly-plot g.barlayer g.point path, .js-plotly-plot g.hm image"  # bars, or the aggregate
N_SPANS = 100_000
_BROWSER = "browser render of the 100k-span run's timeline (Chromium, page load to Gantt bars drawn)"
ROUNDS = 3


def _spans(n: int, p: int = P, t0: int = 0) -> pd.DataFrame:
    """n spans of a steady pipeline: per rank a forward of 80 µs and a send of 10 µs every 100 µs."""
    from ppscope.trace.model import spans_frame

    per_rank = n // (2 * p)
    i = np.arange(per_rank, dtype=np.int64)
    parts = []
    for rank in range(p):
        start = t0 + i * 100_000 + rank * 20_000
        for lane, kind, offset, dur in (("compute", "forward", 0, 80_000), ("send", "send", 80_000, 10_000)):
            parts.append(
                pd.DataFrame(
                    {
                        "rank": rank,
                        "stage": rank,
                        "lane": lane,
                        "kind": kind,
                        "name": kind,
                        "mb": i % 8,
                        "step": i // 8,
                        "chunk": 0,
                        "phase": "decode",
                        "start_ns": start + offset,
                        "end_ns": start + offset + dur,
                        "nbytes": 4096 if kind == "send" else 0,
                        "tokens": 8,
                        "peer": (rank + 1) % p if kind == "send" else -1,
                    }
                )
            )
    return spans_frame(pd.concat(parts, ignore_index=True))


def _write_run(path: Path, spans: pd.DataFrame, status: str) -> None:
    from ppscope.trace.model import RankInfo, RunMeta
    from ppscope.trace.store import RankWriter, create_run

    meta = RunMeta(  # an engine run's, as the dashboard sees one being written
        source="ppscope",
        status=status,
        world_size=P,
        pp_size=P,
        schedule="serve",
        ranks=[RankInfo(rank=r, stage=r) for r in range(P)],
    )
    create_run(path, meta)
    for rank in range(P):
        writer = RankWriter(path, rank)
        rows = spans[spans["rank"] == rank].itertuples(index=False, name=None)
        writer.write(list(rows))
        writer.close()


def _best_s(fn: Callable[[], Any], rounds: int = ROUNDS) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _gantt_json(spans: pd.DataFrame, **kw: Any) -> None:
    from ppscope.analysis.gantt import gantt_figure

    gantt_figure(spans, **kw).figure.to_json()


def _append_and_refresh(path: Path, live: Any, t0: int) -> None:
    """Append 1k new spans to rank 0's file, as a live run would, then refresh."""
    import sqlite3

    from ppscope.trace.store import rank_file

    new = _spans(1_000 * P, t0=t0)
    new = new[new["rank"] == 0].head(1_000)
    cols = ", ".join(new.columns)
    db = sqlite3.connect(rank_file(path, 0))
    with db:
        db.executemany(f"INSERT INTO spans ({cols}) VALUES ({', '.join('?' * len(new.columns))})", new.values.tolist())
    db.close()
    live.refresh()


def _gantt_figures(big: pd.DataFrame, small: pd.DataFrame) -> list[Figure]:
    """The Gantt figure of 100k spans built and serialised, whole and a narrow window, against 1k spans."""
    from ppscope.analysis.gantt import gantt_figure

    ref_small = _best_s(lambda: _gantt_json(small))
    t_big = _best_s(lambda: _gantt_json(big))
    mid = int(big["start_ns"].median())
    narrow = (mid, mid + 25 * 100_000)  # ~1k spans in the window
    t_narrow = _best_s(lambda: _gantt_json(big, window_ns=narrow))
    view = gantt_figure(big)
    one_bar_each = "the same Gantt of 1k spans, one bar each"
    return [
        Figure(
            f"Gantt figure, built + serialised, 100k spans, whole run ({view.bars:,} busy-share bins, aggregated)",
            t_big * 1e3,
            "ms",
            one_bar_each,
            ref_small * 1e3,
        ),
        Figure(
            "Gantt figure, built + serialised, 100k spans, a 2.5 ms window",
            t_narrow * 1e3,
            "ms",
            one_bar_each,
            ref_small * 1e3,
        ),
    ]


_WHOLE = "load_run of the whole run"


def _live_figures(run: Path, big: pd.DataFrame, t_load: float) -> list[Figure]:
    """The live view's refreshes of the 100k-span run at `run` against reading it whole (`t_load` s)."""
    from ppscope.dashboard.data import LiveTrace

    live = LiveTrace(run, is_run=True)
    t_first = _best_s(live.refresh, rounds=1)
    end = int(big["end_ns"].max())
    t_poll = _best_s(lambda: _append_and_refresh(run, live, t0=end + 1_000_000), rounds=1)
    t_idle = _best_s(live.refresh)
    return [
        Figure("live refresh of a 100k-span run: first read", t_first * 1e3, "ms", _WHOLE, t_load * 1e3),
        Figure("live refresh of a 100k-span run: after 1k new spans", t_poll * 1e3, "ms", _WHOLE, t_load * 1e3),
        Figure("live refresh of a 100k-span run: nothing new", t_idle * 1e3, "ms", _WHOLE, t_load * 1e3),
    ]


def _page_figures(run: Path, t_load: float) -> list[Figure]:
    """The timeline page of the run at `run` in Streamlit's AppTest, a first visit and later ones."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    def script(argv: list[str]) -> None:
        from ppscope.dashboard.app import main

        main(argv)

    def page() -> None:
        at = AppTest.from_function(script, args=([str(run)],), default_timeout=120).run()
        assert not at.exception, at.exception

    def cold_page() -> None:
        st.cache_resource.clear()  # a first visit: read the run, analyse it, draw
        page()

    page()  # import everything once
    t_cold = _best_s(cold_page, rounds=2)
    t_warm = _best_s(page, rounds=2)
    timeline = "timeline page of the 100k-span run (read, analysis, gap shading, Gantt)"
    return [
        Figure(f"{timeline}: first visit", t_cold, "s", _WHOLE, t_load, target="<= 3 s", met=t_cold <= 3),
        Figure(f"{timeline}: later visits", t_warm, "s", _WHOLE, t_load, target="<= 3 s", met=t_warm <= 3),
    ]


def main() -> list[Figure]:
    from ppscope.trace.store import load_run

    big = _spans(N_SPANS)
    figures = _gantt_figures(big, _spans(1_000))
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        _write_run(run, big, status="running")
        t_load = _best_s(lambda: load_run(run))
        figures += _live_figures(run, big, t_load)
        figures += _page_figures(run, t_load)
        figures.append(_browser_figure(run, Path(tmp)))
    return figures


def _browser_figure(big_run: Path, tmp: Path) -> Figure:
    """Seconds from opening the page to the Gantt's bars on screen in Chromium, 100k spans vs 1k."""
    import shutil

    chromium = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return Figure(_BROWSER, "skipped: playwright is not installed")
    if chromium is None:
        return Figure(_BROWSER, "skipped: no Chromium found (apt-get install chromium)")
    from ppscope.cli.commands.dashboard import start_dashboard

    small_run = tmp / "small"
    _write_run(small_run, _spans(1_000), status="finished")
    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
    times = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=[*args, "--disable-sync", "--no-first-run"])
        try:
            for name, run in (("1k", small_run), ("100k", big_run)):
                board = start_dashboard([run], port=0, quiet=True)
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 1000})
                    page.goto(board.url, timeout=120_000)  # the first visit reads and analyses the run
                    page.wait_for_selector(_DRAWN, timeout=120_000)
                    best = float("inf")
                    for _ in range(2):  # later visits: the server has the run cached, as in use
                        t0 = time.perf_counter()
                        page.reload()
                        page.wait_for_selector(_DRAWN, timeout=120_000)
                        best = min(best, time.perf_counter() - t0)
                    times[name] = best
                    page.close()
                finally:
                    board.stop()
        finally:
            browser.close()
    return Figure(
        _BROWSER,
        times["100k"],
        "s",
        "the same page of a 1k-span run",
        times["1k"],
        target="<= 3 s",
        met=times["100k"] <= 3,
    )


if __name__ == "__main__":
    for figure in main():
        print(figure)
