"""A link opens the dashboard where it says (`?section=Compare&trace=A&compare_with=B`), as `ppscope demo`'s does
on the comparison of its two splits; a name the dashboard does not offer is ignored."""

from __future__ import annotations

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest
from test_dashboard_app import _decode
from test_dashboard_runs import record_gpipe_run, span_count

from ppscope.cli.commands.demo import _headline_toml
from ppscope.dashboard.compare import demo_headline
from ppscope.trace.store import DEMO_FILE

TIMEOUT_S = 60


def _app(folder: Path, **query: str) -> AppTest:
    def script(argv: list[str]) -> None:
        from ppscope.dashboard.app import main

        main(argv)

    at = AppTest.from_function(script, args=([str(folder)],), default_timeout=TIMEOUT_S)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def test_a_link_opens_compare_on_run_1_against_run_2(tmp_path: Path) -> None:
    folder = tmp_path / "demo-1"
    for name in ("1-before", "2-after", "3-after"):  # the newest run is listed first: not what the link opens
        record_gpipe_run(folder / name, p=2, m=2)
    at = _app(folder, section="Compare", trace="demo-1/1-before", compare_with="demo-1/2-after")
    assert not at.exception, at.exception
    assert at.sidebar.selectbox(key="trace").value == "demo-1/1-before"
    assert at.sidebar.radio(key="section").value == "Compare"
    assert at.selectbox(key="compare_with").value == "demo-1/2-after"
    assert any("Compare two runs" in m.value for m in at.markdown)


def test_a_link_naming_what_is_not_offered_opens_the_default_page(tmp_path: Path) -> None:
    folder = tmp_path / "demo-1"
    record_gpipe_run(folder / "1-before", p=2, m=2)
    at = _app(folder, section="Secrets", trace="/etc/passwd")
    assert not at.exception, at.exception
    assert at.sidebar.radio(key="section").value == "Timeline"
    assert at.sidebar.selectbox(key="trace").value == "demo-1/1-before"


def test_the_timeline_opens_on_a_few_steps_with_each_span_drawn_under_the_whole_run(tmp_path: Path) -> None:
    # 12 steps of 2 micro-batches: more than a few steps, so the first view is the newest few, each span a bar,
    # with the whole run as a heatmap strip above it
    run = record_gpipe_run(tmp_path / "demo-1" / "1-before", p=2, m=2, steps=12)
    at = _app(tmp_path / "demo-1")
    assert not at.exception, at.exception
    assert at.radio(key="window_mode").value == "A few steps"
    overview, window = (json.loads(c.proto.spec) for c in at.get("plotly_chart"))
    assert [t["type"] for t in overview["data"] if t.get("type") == "heatmap"]
    bars = [t for t in window["data"] if t.get("type") == "bar" and (t.get("meta") or {}).get("role") == "spans"]
    drawn = sum(len(_decode(t["base"])) for t in bars)
    assert 0 < drawn < span_count(2, 2) * 12 and "one bar each" in at.caption[-1].value
    assert run.is_dir()


def test_compare_of_two_demo_runs_leads_with_the_predicted_and_measured_speedup(tmp_path: Path) -> None:
    folder = tmp_path / "demo-1"
    for name in ("1-before", "2-after"):
        record_gpipe_run(folder / name, p=2, m=2)
    answer = {
        "predicted_speedup": 1.158,
        "measured_speedup": 1.161,
        "measured_interval": [1.13, 1.19],
        "advice": "change",
    }
    (folder / DEMO_FILE).write_text(_headline_toml(answer))
    at = _app(folder, section="Compare", trace="demo-1/1-before", compare_with="demo-1/2-after")
    assert not at.exception, at.exception
    said = "The demo predicted ×1.158 for the advised split and measured ×1.161 (95% interval ×1.130–×1.190)"
    assert any(said in m.value for m in at.markdown)
    assert demo_headline(tmp_path) == ""  # no demo there
    (folder / DEMO_FILE).write_text(_headline_toml({**answer, "measured_speedup": None, "advice": "keep"}))
    assert demo_headline(folder).endswith("advised keeping the given one: the advised split was not run.")
