"""The dashboard on a job of data-parallel pipelines: one lane per stage with its straggler, a rank on demand."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from replica_helpers import replica_job
from test_dashboard_app import _app, _chart_specs, _decode, _span_bars

from ppscope.dashboard.safety import md
from ppscope.simulate.simulator import write_run
from ppscope.trace.notices import missing_ranks


def _rows(at) -> set[str]:  # type: ignore[no-untyped-def]
    return {y for t in _span_bars(_chart_specs(at)[0]) for y in _decode(t["y"])}


def test_timeline_shows_a_lane_per_stage_and_a_rank_on_demand(tmp_path: Path) -> None:
    trace = replica_job(3, 8, slow={(1, 6): 1.4})  # 24 ranks; rank 1 * 8 + 6 = 14 is the straggler
    run = write_run(trace, tmp_path / "job")
    at = _app(run).run()
    assert not at.exception, at.exception
    rows = _rows(at)
    assert len(rows) == 4, rows  # 3 stages' median replicas + the one straggler, not 24 ranks
    assert "rank 14 · stage 1: ▲ straggler, replica 6 +40.0%" in rows
    assert any("8 data-parallel pipelines" in c.value for c in at.caption)
    at.radio(key="lanes").set_value("One rank").run()
    at.selectbox(key="lane_rank").set_value(14).run()
    assert not at.exception, at.exception
    bars = _span_bars(_chart_specs(at)[0])
    mine = trace.spans[trace.spans["rank"] == 14]
    assert sum(len(_decode(t["base"])) for t in bars) == len(mine)
    assert {y.split(" · ")[0] for y in _rows(at)} == {"rank 14"}


def test_stages_page_has_one_row_per_stage_and_names_the_bottleneck(tmp_path: Path) -> None:
    run = write_run(replica_job(3, 8, slow={(1, 6): 1.4}), tmp_path / "job")
    (run / "rank-00003.sqlite").unlink()
    at = _app(run)
    at.run()
    at.sidebar.radio(key="section").set_value("Stages").run()
    assert not at.exception, at.exception
    assert any("8 data-parallel pipelines × 3 stages" in m.value for m in at.markdown)
    assert at.metric[0].value == "stage 1, replica 6, rank 14"
    assert len(at.dataframe[0].value) == 3
    named = md(missing_ranks([3], 24).text)  # the sentence every command names a missing rank in
    assert any(named in w.value and w.value.endswith(": 3") for w in at.warning)  # and the replica it leaves short


_ROWS_JS = """() => {
  const gd = document.querySelector('.js-plotly-plot');
  if (!gd || !gd.data) return null;
  const rows = new Set();
  gd.data.filter(t => t.type === 'bar' && (t.meta || {}).role === 'spans').forEach(t => t.y.forEach(y => rows.add(y)));
  return Array.from(rows);
}"""


@pytest.mark.browser
@pytest.mark.slow
def test_chromium_draws_one_lane_per_stage_of_many_replicas(tmp_path: Path) -> None:
    from test_dashboard_browser import _ALL_BARS_DRAWN, dashboard_page

    run = write_run(replica_job(4, 16, slow={(2, 9): 1.25}), tmp_path / "job")  # 64 ranks
    with dashboard_page(run) as page:
        page.wait_for_function(_ALL_BARS_DRAWN, timeout=60_000)
        rows = page.evaluate(_ROWS_JS)
        text = page.inner_text("body")
    assert len(rows) == 5, rows  # 4 stages + 1 straggler, of 64 ranks
    assert "rank 41 · stage 2: ▲ straggler, replica 9 +25.0%" in rows
    assert "16 data-parallel pipelines" in text


def test_stages_page_shows_a_training_jobs_what_ifs(tmp_path: Path) -> None:
    from training_jobs import training_job

    from ppscope.simulate.whatif import what_if

    trace = training_job(4, 2, m=8, slow={(1, 1): 2.0})  # rank 3 is stage 1, replica 1: 2× slower
    w, _ = what_if(trace)
    assert w is not None and w.no_straggler is not None and w.balanced is not None
    at = _app(write_run(trace, tmp_path / "job"))
    at.run()
    at.sidebar.radio(key="section").set_value("Stages").run()
    assert not at.exception, at.exception
    assert any(m.value.startswith("**What-if**") and "2 replicas" in m.value for m in at.markdown)
    table = next(d.value for d in at.dataframe if "what-if" in d.value.columns)
    rows = table.set_index("what-if")
    assert list(rows.index) == ["measured costs", "balanced", "no straggler"]
    assert rows.loc["no straggler", "speedup"] == pytest.approx(w.no_straggler.speedup, abs=1e-4)
    assert rows.loc["balanced", "speedup"] == pytest.approx(w.balanced.speedup, abs=1e-4)
    assert "stage 1, replica 1 (rank(s) 3)" in rows.loc["no straggler", "changes"]
