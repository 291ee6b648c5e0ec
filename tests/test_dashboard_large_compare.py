"""The Compare page with a large run on either side: the figures of the whole load, never loading it whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

pytest.importorskip("streamlit")
from replica_helpers import replica_job
from test_dashboard_app import _app, _chart_specs, _decode, _span_bars
from test_dashboard_large import LARGE

from ppscope.simulate.simulator import write_run
from ppscope.trace import store
from ppscope.trace.model import Trace, spans_frame

P = 3
SAMPLE_NS = 2_000


def _sampled(trace: Trace) -> Trace:
    """Each forward of the last stage ends in sampling a token, as the engine records it: a throughput."""
    spans = trace.spans.copy()
    last = (spans["kind"] == "forward") & (spans["stage"] == spans["stage"].max())
    sample = spans[last].copy()
    spans.loc[last, "end_ns"] -= SAMPLE_NS
    sample["kind"], sample["start_ns"], sample["tokens"] = "sample", sample["end_ns"] - SAMPLE_NS, 1
    return Trace(spans=spans_frame(pd.concat([spans, sample], ignore_index=True)), meta=trace.meta).sorted()


def _jobs(folder: Path) -> Path:
    """Four runs in `folder`/jobs: two jobs of 3 stages × 8 pipelines (24 rank files: large under LARGE), before
    and after a change; one pipeline of 3 ranks and a job of 2 stages × 2 pipelines (4 files: loaded whole)."""
    jobs = folder / "jobs"
    for name, trace in (
        ("before", replica_job(P, 8, slow={(1, 6): 1.4})),  # stage 1's straggler: replica 6, rank 14
        ("after", replica_job(P, 8, slow={(1, 6): 1.2, (2, 3): 1.1})),  # and stage 2's: replica 3, rank 19
        ("one", replica_job(P, 1, slow={(0, 0): 1.3})),
        ("pair", replica_job(2, 2, slow={(1, 1): 1.5})),
    ):
        write_run(_sampled(trace), jobs / name)
    return jobs


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same four runs twice: shown whole (no limit) and a rank at a time (LARGE)."""
    tmp = tmp_path_factory.mktemp("compare")
    return _jobs(tmp / "whole"), _jobs(tmp / "large")


def _compare(folder: Path, a: str, b: str, *args: str) -> Any:
    at = _app(*args, folder).run()  # type: ignore[arg-type]
    at.sidebar.selectbox(key="trace").set_value(f"jobs/{a}").run()
    at.sidebar.radio(key="section").set_value("Compare").run()
    at.selectbox(key="compare_with").set_value(f"jobs/{b}").run()
    assert not at.exception, at.exception
    return at


def _table(frame: pd.DataFrame) -> dict[str, list[Any]]:
    """A table's columns, an empty cell as None (NaN would differ from itself)."""
    return frame.astype(object).where(frame.notna(), None).to_dict("list")


def _shown(at: Any) -> dict[str, Any]:
    return {
        "tables": [_table(d.value) for d in at.dataframe],
        "charts": _chart_specs(at),
        "markdown": [m.value for m in at.markdown],
        "errors": [e.value for e in at.error],
    }


def _whole(run: Path) -> Any:
    """The figures of the whole load: the run in memory, its replicas analysed (None for one pipeline)."""
    from ppscope.analysis import analyze
    from ppscope.analysis.placement import apply_placement, placement_of
    from ppscope.analysis.replicas import analyze_replicas

    trace = store.load_run(run)
    placement = placement_of(trace)
    if placement is None or len(placement.replicas) < 2:
        return analyze(trace)
    return analyze_replicas(apply_placement(trace, placement), placement)


def _detailed(x: Any) -> Any:
    return x.results[x.shown_replica] if hasattr(x, "results") else x


@pytest.mark.parametrize(("a", "b"), [("before", "after"), ("before", "pair"), ("one", "after")])
def test_the_compare_page_of_a_large_run_shows_the_figures_of_the_whole_load(
    folders: tuple[Path, Path], a: str, b: str
) -> None:
    from ppscope.dashboard import charts

    whole, large = folders
    got = _shown(_compare(large, a, b, LARGE))
    assert got == _shown(_compare(whole, a, b))
    wa, wb = _whole(whole / a), _whole(whole / b)
    tables = got["tables"]
    both_jobs = hasattr(wa, "results") and hasattr(wb, "results")
    assert len(tables) == (3 if both_jobs else 2)
    assert tables[0] == _table(charts.shown(charts.job_compare_table(wa, wb)))
    assert tables[1] == _table(charts.shown(charts.compare_table(_detailed(wa), _detailed(wb))))
    if both_jobs:
        assert tables[2] == _table(charts.shown_spread(charts.spread_compare_table(wa, wb)))
    job = dict(zip(tables[0]["measure"], zip(tables[0]["A"], tables[0]["B"], strict=True), strict=True))
    assert job["data-parallel pipelines"] == ({"before": "8", "one": "1"}[a], {"after": "8", "pair": "2"}[b])
    rates = [r.throughput_tokens_per_s for r in (wb.results.values() if hasattr(wb, "results") else [wb])]
    summed = charts.fmt(sum(rates), charts.Unit.TOKENS_PER_S)  # summed over B's pipelines
    assert sum(rates) > 0 and job["throughput, all pipelines (tokens/s)"][1] == summed
    detailed = next(m for m in got["markdown"] if m.startswith("**The pipelines detailed**"))
    if a == "before":  # its bottleneck: stage 1, replica 6, 1.4 times the stage's median
        assert "A: replica 6 of 8" in detailed
        assert job["slowest stage vs its median over the pipelines"][0] == "×1.400"
        assert tables[2]["A straggler"][1] == "rank 14, replica 6, +40.0%"
    else:
        assert "A: its one pipeline" in detailed
    if b == "pair":  # 2 stages against 3: stage 2 is A's alone
        assert tables[2]["stage"] == [0, 1, 2] and tables[2]["B median"][2] == "—"
    lanes = [
        {int(y.split(" · ")[0].removeprefix("rank ")) for t in _span_bars(spec) for y in _decode(t["y"])}
        for spec in got["charts"][1:]
    ]
    assert lanes[0] == ({3, 11, 14, 19} if a == "before" else {0, 1, 2})  # A's stage medians and straggler
    assert lanes[1] == ({3, 11, 14, 19, 20} if b == "after" else {0, 2, 3})


def _reads(monkeypatch: pytest.MonkeyPatch, large: set[Path]) -> dict[str, list[list[int]]]:
    """The ranks of each read of spans, by run; loading a run of `large` whole raises."""
    from ppscope.dashboard import app

    reads: dict[str, list[list[int]]] = {}
    read_ranks, live_trace = store.read_ranks, app.live_trace

    def counting(files: dict[int, Path], *args: Any) -> Any:
        runs = {p.parent.name for p in files.values()}
        assert len(runs) == 1
        reads.setdefault(runs.pop(), []).append(sorted(files))
        return read_ranks(files, *args)

    def whole(entry: Any) -> Any:
        if entry.path in large:
            raise AssertionError(f"{entry.label} loaded whole")
        return live_trace(entry)

    monkeypatch.setattr(store, "read_ranks", counting)
    monkeypatch.setattr(app, "live_trace", whole)
    return reads


@pytest.mark.slow
def test_a_large_side_is_read_a_rank_at_a_time_and_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = _jobs(tmp_path)
    reads = _reads(monkeypatch, {(jobs / name).resolve() for name in ("before", "after")})
    each_alone_twice = sorted([[r] for r in range(24)] * 2)  # the digest, then its stage
    at = _app(Path(LARGE), jobs).run()
    at.sidebar.selectbox(key="trace").set_value("jobs/one").run()
    at.sidebar.radio(key="section").set_value("Compare").run()
    assert at.selectbox(key="compare_with").value == "jobs/pair"  # the newest: small, loaded whole
    assert "after" not in reads
    at.selectbox(key="compare_with").set_value("jobs/after").run()  # a small A, a large B
    assert not at.exception, at.exception
    drawn = {
        int(y.split(" · ")[0].removeprefix("rank ")) for t in _span_bars(_chart_specs(at)[2]) for y in _decode(t["y"])
    }
    assert drawn == {3, 11, 14, 19, 20}  # 3 stages' medians + 2 stragglers (stage 1's rank 14, stage 2's 19)
    assert sorted(r for r in reads["after"] if len(r) == 1) == each_alone_twice
    assert [r for r in reads["after"] if len(r) > 1] == [sorted(drawn)]  # then the lanes' ranks: never the 24
    reads.clear()
    at.selectbox(key="compare_with").set_value("jobs/pair").run()
    at.selectbox(key="compare_with").set_value("jobs/after").run()
    assert not at.exception, at.exception
    assert "after" not in reads  # B seen before: not read again
    at.sidebar.selectbox(key="trace").set_value("jobs/before").run()  # large against large
    at.selectbox(key="compare_with").set_value("jobs/after").run()
    assert not at.exception, at.exception
    assert "after" not in reads and sorted(r for r in reads["before"] if len(r) == 1) == each_alone_twice
    assert [r for r in reads["before"] if len(r) > 1] == [[3, 11, 14, 19]]  # 3 stages' medians + the straggler
    assert len(at.dataframe) == 3 and any("Compare two runs" in m.value for m in at.markdown)


@pytest.mark.browser
@pytest.mark.slow
def test_chromium_draws_the_compare_page_of_two_large_runs(tmp_path: Path) -> None:
    import os

    from test_dashboard_browser import dashboard_page

    jobs = tmp_path / "jobs"
    write_run(_sampled(replica_job(P, 8, slow={(1, 6): 1.4})), jobs / "before")
    after = write_run(_sampled(replica_job(P, 8, slow={(1, 6): 1.2, (2, 3): 1.1})), jobs / "after")
    os.utime(after, (after.stat().st_atime, after.stat().st_mtime + 10))  # the newest: the sidebar's A
    with dashboard_page(jobs, height=2600, ranks_in_memory=8) as page:
        page.get_by_text("Compare", exact=True).click()
        page.get_by_text("Each stage across the pipelines").first.wait_for(timeout=60_000)
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length === 3", timeout=60_000)
        page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)
        text = page.inner_text("body")
    assert "B: jobs/before" in text and "rank 14 · stage 1: ▲ straggler, replica 6 +40.0%" in text  # B's lanes
    assert "rank 19 · stage 2: ▲ straggler, replica 3 +10.0%" in text  # A's
    assert text.count("Read a rank at a time: 24 rank files") == 2
    assert (tmp_path / "compare.png").stat().st_size > 10_000
